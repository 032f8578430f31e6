/* telemetry: what the hardware in use reports, as metrics. For a CUDA
 * device, NVML (nvml.h) under DCGM exporter's names and units, so that
 * existing DCGM dashboards work; for the CPU, package energy from RAPL
 * (rapl.h). Both also give loom_energy_joules_total, the energy used since
 * telemetry started, which energy per token divides. Values are read when
 * the registry is collected (each scrape, each dashboard sample).
 *
 * Opening never fails: what cannot be read is left out of the metrics and
 * said once, in the status line (logged by the caller). */
#ifndef LOOM_TELEMETRY_H
#define LOOM_TELEMETRY_H

#include "obs/metrics.h"

typedef struct loom_telemetry loom_telemetry_t;

/* Telemetry of CUDA device `gpu` (-1: the CPU) for this rank, its
 * metrics declared in `reg` with a rank label (rank < 0: none, as for
 * `loom serve`); GPU ones also with DCGM exporter's labels (gpu as NVML's
 * index, UUID, pci_bus_id, device, Hostname, GPU_I_PROFILE, GPU_I_ID) and
 * gpu_model for DCGM's modelName. The environment's LOOM_NVML_DEVICE (an
 * NVML index or UUID) names the device to read instead, on any device.
 * Also the process_* series (process.h). */
loom_telemetry_t *loom_telemetry_open(loom_metrics_t *reg, int gpu, int rank);
/* One line saying what is read and from where, or why nothing is. */
const char *loom_telemetry_status(const loom_telemetry_t *t);
/* 1 when GPU telemetry (NVML) is read. */
int loom_telemetry_has_gpu(const loom_telemetry_t *t);
/* Joules used since open (NVML's energy counter, or RAPL's); NaN when no
 * energy counter can be read. Reads the counter now. */
double loom_telemetry_energy_j(loom_telemetry_t *t);
/* GPU power (W) and memory used (MiB) series, for the dashboard; NULL
 * without GPU telemetry. */
loom_metric_t *loom_telemetry_power_metric(const loom_telemetry_t *t);
loom_metric_t *loom_telemetry_memory_metric(const loom_telemetry_t *t);
/* NULL is fine. */
void loom_telemetry_close(loom_telemetry_t *t);

#endif
