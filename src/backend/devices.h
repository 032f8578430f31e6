/* devices: the GPUs this build and machine offer, seen from the backend
 * layer without opening a backend, for `loom devices`, the benches and
 * the tests. The CUDA runtime lives in the plugin (backend/plugin.h); this
 * module looks its functions up once and turns their answers into plain
 * structs, so nothing above the backend names a CUDA header or symbol. */
#ifndef LOOM_DEVICES_H
#define LOOM_DEVICES_H

#include <stddef.h>

#include "backend/backend.h"

typedef struct {
    char name[256];         /* CUDA device name, e.g. "NVIDIA A100-SXM4-80GB" */
    int cc_major, cc_minor; /* compute capability */
    int sms;                /* streaming multiprocessors (of the slice, under MIG) */
    int clock_khz;          /* peak SM clock */
    size_t memory_bytes;    /* total device memory (of the slice, under MIG) */
    int is_mig;             /* a MIG instance */
    int pci_domain, pci_bus, pci_device;
    char uuid[48];          /* "GPU-xxxxxxxx-..." as nvidia-smi prints it */
    loom_dtype peak_dtype;  /* the 16-bit matrix precision it trains at: bf16 from sm_80, else fp16 */
    double peak_flops;      /* dense FLOP/s at peak_dtype (backend/cuda/cuda_peak.h), 0 = unknown */
    char peak_source[320];  /* how peak_flops was found */
} loom_gpu_t;

/* Number of GPUs, or -1 when none can be used (a build without CUDA, the
 * plugin or a library it needs missing, no driver, no GPU): then `why`
 * says which. A count of 0 fills `why` too. */
int loom_gpu_count(char *why, size_t why_size);
/* GPU `index`: 0 with *out filled, or -1 with `why`. */
int loom_gpu_get(int index, loom_gpu_t *out, char *why, size_t why_size);
/* CUDA driver and runtime versions as 1000*major + 10*minor (0 = none). */
void loom_gpu_versions(int *driver, int *runtime);
/* Peak bytes loom has allocated on GPUs in this process (the CUDA backend
 * counts them), 0 when unknown or none. */
size_t loom_gpu_peak_bytes(void);

#endif
