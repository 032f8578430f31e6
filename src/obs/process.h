/* process: the process_* series every Prometheus client library exports
 * (client_golang's process collector: CPU time, memory, file descriptors,
 * start time), read from /proc at each scrape. */
#ifndef LOOM_PROCESS_H
#define LOOM_PROCESS_H

#include "obs/metrics.h"

typedef struct loom_process_metrics loom_process_metrics_t;

/* Declare the series in `reg`, each with the label pair (label, value)
 * when label is not NULL (training: rank), and read them at each collect. */
loom_process_metrics_t *loom_process_metrics_open(loom_metrics_t *reg, const char *label, const char *value);
/* Stop reading (before the registry is freed). NULL is fine. */
void loom_process_metrics_close(loom_process_metrics_t *p);

/* Resident memory of this process in bytes (from /proc/self/statm). */
double loom_process_rss_bytes(void);

#endif
