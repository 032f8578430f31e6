/* nvml: GPU telemetry from NVIDIA's management library, loaded at run time
 * with dlopen("libnvidia-ml.so.1"), so loom builds and runs without it.
 * LOOM_NVML_LIB names another file to load (a stand-in in the tests, a
 * driver installed somewhere unusual).
 *
 * Units are converted once, here: NVML's milliwatts to W, millijoules to
 * J, MHz and percent as they come. A quantity the device cannot report is
 * NaN with the reason in the reading, never 0: NVML reports no
 * utilisation for a MIG instance, and power, energy, clocks and
 * temperature of a MIG instance are those of its whole GPU. */
#ifndef LOOM_NVML_H
#define LOOM_NVML_H

#include "core/core.h"

typedef struct loom_nvml loom_nvml_t;

typedef struct {
    char name[96];        /* "NVIDIA A100-SXM4-40GB" or "... MIG 1g.5gb" */
    char uuid[96];        /* "GPU-..." or "MIG-..." */
    char mig_profile[32]; /* "1g.5gb" for a MIG instance, "" for a whole GPU */
    int index;            /* NVML index of the (parent) GPU, -1 if not reported */
    int gpu_instance_id;  /* MIG: the GPU instance id (DCGM's GPU_I_ID); -1 for a whole GPU */
    char pci_bus_id[32];  /* "00000000:07:00.0" of the (parent) GPU, "" if not reported */
    int is_mig;           /* the handle is a MIG instance */
    int mig_mode;         /* MIG mode of the (parent) GPU: 1 on, 0 off, -1 not reported */
    double power_w;       /* power draw, W (the whole GPU for a MIG instance) */
    double energy_j;      /* energy since the driver loaded, J */
    double gpu_util_pct;  /* % of time a kernel ran, last sample period */
    double mem_util_pct;  /* % of time device memory was read or written */
    double mem_used_bytes, mem_total_bytes;
    double sm_clock_mhz;
    double temp_c;
    char why_util[96];    /* why utilisation is NaN ("" when it was read) */
    char why_power[96];   /* why power/energy is NaN */
} loom_nvml_reading_t;

/* Load the library and initialise NVML. LOOM_EUNAVAIL with the reason
 * (library not found, driver/library mismatch, no permission) when it
 * cannot; the caller logs it once and carries on without telemetry. */
loom_status loom_nvml_open(loom_nvml_t **out);
/* Shut NVML down and unload. NULL is fine. */
void loom_nvml_close(loom_nvml_t *nv);

/* Number of GPUs NVML sees (whole GPUs, not MIG instances). */
int loom_nvml_count(loom_nvml_t *nv);
/* The driver version text ("550.54.15"), or "unknown". */
const char *loom_nvml_driver(loom_nvml_t *nv);

/* Read everything about one device. `which` is an NVML index ("0") or a
 * GPU-/MIG- UUID. LOOM_EINVAL when no such device. */
loom_status loom_nvml_read(loom_nvml_t *nv, const char *which, loom_nvml_reading_t *out);
/* Only the energy counter (J) of `which`; NaN when it has none. Cheap
 * enough to call every step. */
double loom_nvml_energy_j(loom_nvml_t *nv, const char *which);

/* Watch `which`'s GPU (a MIG instance's parent) for critical XID errors
 * (NVML events). LOOM_EUNAVAIL with the reason when this NVML cannot. */
loom_status loom_nvml_watch_xid(loom_nvml_t *nv, const char *which);
/* The XID codes reported since the last call (at most cap; never waits). */
int loom_nvml_poll_xid(loom_nvml_t *nv, unsigned long long *codes, int cap);

/* The NVML selector of CUDA device `ordinal` as this process sees it:
 * the ordinal-th entry of CUDA_VISIBLE_DEVICES when set (an index or a
 * UUID), else the ordinal itself. NVML numbers GPUs in PCI order; set
 * CUDA_DEVICE_ORDER=PCI_BUS_ID for CUDA to use the same order. */
void loom_nvml_select_cuda(int ordinal, char *buf, size_t cap);

#endif
