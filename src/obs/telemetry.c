/* telemetry: NVML or RAPL readings into the metrics registry (see telemetry.h). */
#define _GNU_SOURCE
#include "obs/telemetry.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/nvml.h"
#include "obs/process.h"
#include "obs/rapl.h"

#define MIB (1024.0 * 1024.0)

/* The DCGM exporter fields loom fills, in DCGM's units. */
enum { G_POWER, G_ENERGY, G_UTIL, G_MEM_UTIL, G_FB_USED, G_FB_FREE, G_FB_TOTAL, G_SM_CLOCK, G_TEMP, G_MIG_MODE, G_XID, G_N };

struct loom_telemetry {
    pthread_mutex_t lock;
    loom_metrics_t *reg;
    loom_nvml_t *nv;
    loom_rapl_t *rapl;
    loom_process_metrics_t *proc;
    char which[96];   /* NVML selector */
    char status[512];
    double energy0;   /* the energy counter at open (NVML: J since driver load) */
    double reported;  /* energy already added to the counter */
    int xid;          /* XID events are watched */
    loom_metric_t *gpu[G_N];
    loom_metric_t *energy_total, *unsupported_util, *xid_total;
};

/* The labels of every GPU series: DCGM exporter's (gpu = NVML index, UUID,
 * pci_bus_id, device, Hostname, GPU_I_PROFILE, GPU_I_ID) with two changes
 * (docs/observability.md, "GPU telemetry"): the model is gpu_model, not
 * DCGM's camelCase modelName that promtool refuses, and loom's rank. */
typedef struct {
    char gpu[16], device[24], instance[16], host[256];
} gpu_labels_t;

static void gpu_labels(gpu_labels_t *l, const loom_nvml_reading_t *rd) {
    snprintf(l->gpu, sizeof l->gpu, "%d", rd->index >= 0 ? rd->index : 0);
    snprintf(l->device, sizeof l->device, "nvidia%s", l->gpu);
    if (rd->gpu_instance_id >= 0) snprintf(l->instance, sizeof l->instance, "%d", rd->gpu_instance_id);
    if (gethostname(l->host, sizeof l->host - 1) != 0) snprintf(l->host, sizeof l->host, "unknown");
}

#define GPU_LABELS(l, rd, rank)                                                                                        \
    "gpu", (l).gpu, "UUID", (rd)->uuid, "pci_bus_id", (rd)->pci_bus_id, "device", (l).device, "gpu_model", (rd)->name,  \
        "Hostname", (l).host, "GPU_I_PROFILE", (rd)->mig_profile, "GPU_I_ID", (l).instance, rank ? "rank" : NULL, rank, NULL

static void declare_gpu(loom_telemetry_t *t, loom_metrics_t *reg, const loom_nvml_reading_t *rd, const char *rank) {
    static const struct {
        const char *name, *help;
    } f[G_N] = {
        [G_POWER] = {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W); the whole GPU for a MIG instance."},
        [G_ENERGY] = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since the driver loaded (in mJ); a counter, as in DCGM exporter."},
        [G_UTIL] = {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %); absent on MIG instances, which NVML does not report."},
        [G_MEM_UTIL] = {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %); absent on MIG instances."},
        [G_FB_USED] = {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."},
        [G_FB_FREE] = {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."},
        [G_FB_TOTAL] = {"DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB)."},
        [G_SM_CLOCK] = {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."},
        [G_TEMP] = {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."},
        [G_MIG_MODE] = {"DCGM_FI_DEV_MIG_MODE", "MIG mode of the GPU (1 enabled, 0 disabled)."},
        [G_XID] = {"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none since loom started)."},
    };
    gpu_labels_t l = {0};
    gpu_labels(&l, rd);
    for (int i = 0; i < G_N; i++)
        t->gpu[i] = (i == G_ENERGY ? loom_metrics_untyped : loom_metrics_gauge)(reg, f[i].name, f[i].help, GPU_LABELS(l, rd, rank));
    if (t->xid) {
        loom_gauge_set(t->gpu[G_XID], 0);
        t->xid_total = loom_metrics_counter(reg, "loom_gpu_xid_errors_total", "Critical XID errors NVML reported since loom started.",
                                            GPU_LABELS(l, rd, rank));
    }
    if (rd->why_util[0])
        t->unsupported_util = loom_metrics_gauge(reg, "loom_gpu_telemetry_unsupported", "1 for a DCGM field this device cannot report, with the reason.",
                                                 "gpu", l.gpu, "field", "DCGM_FI_DEV_GPU_UTIL", "reason", rd->why_util, rank ? "rank" : NULL, rank, NULL);
    loom_gauge_set(t->unsupported_util, 1);
}

static void set_if(loom_metric_t *m, double v) {
    if (isfinite(v)) loom_gauge_set(m, v);
}

/* XID errors since the last collect: the last code into DCGM's gauge. */
static void collect_xid(loom_telemetry_t *t) {
    unsigned long long codes[16];
    int n = loom_nvml_poll_xid(t->nv, codes, 16);
    if (n == 0) return;
    loom_gauge_set(t->gpu[G_XID], (double)codes[n - 1]);
    loom_counter_add(t->xid_total, n);
}

/* The collect hook: one NVML reading into the gauges, the energy counter. */
static void collect(void *ctx) {
    loom_telemetry_t *t = ctx;
    if (t->nv) {
        loom_nvml_reading_t rd;
        pthread_mutex_lock(&t->lock);
        loom_status s = loom_nvml_read(t->nv, t->which, &rd);
        if (s == LOOM_OK && t->xid) collect_xid(t);
        pthread_mutex_unlock(&t->lock);
        if (s != LOOM_OK) return;
        set_if(t->gpu[G_POWER], rd.power_w);
        set_if(t->gpu[G_ENERGY], rd.energy_j * 1000.0);
        set_if(t->gpu[G_UTIL], rd.gpu_util_pct);
        set_if(t->gpu[G_MEM_UTIL], rd.mem_util_pct);
        set_if(t->gpu[G_FB_USED], rd.mem_used_bytes / MIB);
        set_if(t->gpu[G_FB_FREE], (rd.mem_total_bytes - rd.mem_used_bytes) / MIB);
        set_if(t->gpu[G_FB_TOTAL], rd.mem_total_bytes / MIB);
        set_if(t->gpu[G_SM_CLOCK], rd.sm_clock_mhz);
        set_if(t->gpu[G_TEMP], rd.temp_c);
        if (rd.mig_mode >= 0) loom_gauge_set(t->gpu[G_MIG_MODE], rd.mig_mode);
    }
    loom_telemetry_energy_j(t);
}

/* NVML device `which` (an index or UUID; `what` names it for the log). */
static void open_gpu(loom_telemetry_t *t, loom_metrics_t *reg, const char *what, const char *rank) {
    if (loom_nvml_open(&t->nv) != LOOM_OK) {
        snprintf(t->status, sizeof t->status, "no GPU telemetry: %s", loom_errmsg());
        return;
    }
    loom_nvml_reading_t rd;
    if (loom_nvml_read(t->nv, t->which, &rd) != LOOM_OK) {
        snprintf(t->status, sizeof t->status, "no GPU telemetry: %s (%s is %s)", loom_errmsg(), t->which, what);
        loom_nvml_close(t->nv);
        t->nv = NULL;
        return;
    }
    char xid_why[256] = "";
    t->xid = loom_nvml_watch_xid(t->nv, t->which) == LOOM_OK;
    if (!t->xid) snprintf(xid_why, sizeof xid_why, "; %s", loom_errmsg());
    declare_gpu(t, reg, &rd, rank);
    t->energy0 = rd.energy_j;
    snprintf(t->status, sizeof t->status, "GPU telemetry: NVML (driver %s) on %s: %s%s%s%s%s%s", loom_nvml_driver(t->nv), what, rd.name,
             rd.is_mig ? " (MIG instance; power and energy are its whole GPU's)" : "",
             rd.why_util[0] ? "; utilisation: " : "", rd.why_util, isfinite(rd.energy_j) ? "" : "; no energy counter, so no energy per token",
             xid_why);
    if (isfinite(rd.energy_j))
        t->energy_total = loom_metrics_counter(reg, "loom_energy_joules_total", "Energy used since loom started reading it (GPU: NVML; CPU: RAPL), J.",
                                               rank ? "rank" : NULL, rank, "source", "nvml", NULL);
}

loom_telemetry_t *loom_telemetry_open(loom_metrics_t *reg, int gpu, int rank) {
    loom_telemetry_t *t = loom_calloc(1, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    char rs[16], what[160];
    snprintf(rs, sizeof rs, "%d", rank);
    const char *rl = rank >= 0 ? rs : NULL;
    t->proc = loom_process_metrics_open(reg, rank >= 0 ? "rank" : NULL, rs);
    const char *forced = getenv("LOOM_NVML_DEVICE");
    if (forced && *forced) {
        snprintf(t->which, sizeof t->which, "%s", forced);
        snprintf(what, sizeof what, "NVML device %s (LOOM_NVML_DEVICE)", forced);
        open_gpu(t, reg, what, rl);
    } else if (gpu >= 0) {
        loom_nvml_select_cuda(gpu, t->which, sizeof t->which);
        snprintf(what, sizeof what, "CUDA device %d", gpu);
        open_gpu(t, reg, what, rl);
    } else if (loom_rapl_open(&t->rapl) == LOOM_OK) {
        snprintf(t->status, sizeof t->status, "no GPU telemetry: running on the CPU; CPU energy from RAPL (%d package%s)",
                 loom_rapl_domains(t->rapl), loom_rapl_domains(t->rapl) == 1 ? "" : "s");
        t->energy_total = loom_metrics_counter(reg, "loom_energy_joules_total", "Energy used since loom started reading it (GPU: NVML; CPU: RAPL), J.",
                                               rl ? "rank" : NULL, rl, "source", "rapl", NULL);
    } else {
        snprintf(t->status, sizeof t->status, "no GPU telemetry: running on the CPU; %s", loom_errmsg());
    }
    t->reg = reg;
    if (reg) loom_metrics_on_collect(reg, collect, t);
    return t;
}

double loom_telemetry_energy_j(loom_telemetry_t *t) {
    if (!t || (!t->nv && !t->rapl)) return NAN;
    pthread_mutex_lock(&t->lock);
    double e = t->rapl ? loom_rapl_energy_j(t->rapl) : loom_nvml_energy_j(t->nv, t->which) - t->energy0;
    if (isfinite(e) && e > t->reported) {
        loom_counter_add(t->energy_total, e - t->reported);
        t->reported = e;
    }
    pthread_mutex_unlock(&t->lock);
    return e;
}

const char *loom_telemetry_status(const loom_telemetry_t *t) { return t ? t->status : "no telemetry"; }
int loom_telemetry_has_gpu(const loom_telemetry_t *t) { return t && t->nv; }
loom_metric_t *loom_telemetry_power_metric(const loom_telemetry_t *t) { return t ? t->gpu[G_POWER] : NULL; }
loom_metric_t *loom_telemetry_memory_metric(const loom_telemetry_t *t) { return t ? t->gpu[G_FB_USED] : NULL; }

void loom_telemetry_close(loom_telemetry_t *t) {
    if (!t) return;
    loom_metrics_off_collect(t->reg, collect, t);
    loom_process_metrics_close(t->proc);
    loom_nvml_close(t->nv);
    loom_rapl_close(t->rapl);
    pthread_mutex_destroy(&t->lock);
    free(t);
}
