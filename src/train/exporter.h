/* exporter: the training observer behind `loom train --metrics-port`
 * (src/obs/train_metrics.h): Prometheus metrics and the live dashboard
 * per rank, GPU/CPU telemetry, and energy per token for every run (in
 * metrics.jsonl and the summary even without a port). It is a recorder:
 * it runs before the metrics log, so that a step's energy per token is in
 * that step's line. */
#ifndef LOOM_TRAIN_EXPORTER_H
#define LOOM_TRAIN_EXPORTER_H

#include "train/train.h"

/* The observer for options `o` (metrics_port < 0: no server, telemetry
 * and energy per token only). Never NULL. */
loom_train_observer_t *loom_train_observer_exporter(const loom_train_opts_t *o);

#endif
