/* train_metrics: a training run's numbers as Prometheus metrics, served
 * with the live dashboard on `loom train --metrics-port` (each rank on the
 * port plus its local rank), and the run's energy per token. Every metric
 * carries a rank label; docs/observability.md lists them with their units.
 *
 * The trainer calls loom_train_metrics_step after each optimizer step
 * (the metrics exporter observer in src/train/exporter.c does); the HTTP server and
 * the dashboard's sampler read the registry from their own threads. */
#ifndef LOOM_TRAIN_METRICS_H
#define LOOM_TRAIN_METRICS_H

#include "obs/metrics.h"
#include "obs/telemetry.h"

typedef struct loom_train_metrics loom_train_metrics_t;

typedef struct {
    const char *host;   /* listen address (NULL = 127.0.0.1) */
    int port;           /* base port; this rank listens on port + local_rank; 0 = any free port; < 0 = no server */
    int rank, local_rank, world_size;
    int local_world;    /* ranks on this machine (they share its CPU packages' RAPL energy); 0 = world_size */
    const char *device; /* "cpu", "cuda", "cuda:N", for loom_train_info */
    int gpu;            /* CUDA ordinal telemetry is read from; -1 = the CPU */
    const char *model, *dtype, *run; /* for loom_train_info and the page title */
    long long steps;    /* planned steps */
    double period_s;    /* dashboard sampling period (0 = 1 s) */
} loom_train_metrics_opts_t;

/* One optimizer step, as the exporter records it. */
typedef struct {
    long long step;
    double loss, grad_norm, lr; /* grad_norm inf/nan: a skipped fp16 step */
    double tokens;              /* global tokens of the step */
    double tokens_per_s;        /* global */
    double flops_per_s;         /* achieved model FLOP/s on this rank */
    double mfu;                 /* 0..1, < 0 when unknown */
    double step_s, comm_wait_s, data_s; /* wall time, of which waiting for peers; batch loading before it */
    double comm_tp_s;           /* of comm_wait_s, on the tensor-parallel group */
    double loss_scale;          /* fp16 dynamic loss scale, 0 without */
    double peak_flops;          /* FLOP/s per rank MFU is relative to, 0 when unknown */
    int skipped;
} loom_train_metrics_step_t;

/* Declare the metrics, open telemetry for o->device (its status is logged
 * once) and, when o->port >= 0, start the server with /metrics and the
 * dashboard. Fails only when the server cannot listen (the message names
 * the address and what to do). */
loom_status loom_train_metrics_start(loom_train_metrics_t **out, const loom_train_metrics_opts_t *o);
/* The registry (to add metrics) and the telemetry in use. */
loom_metrics_t *loom_train_metrics_registry(loom_train_metrics_t *tm);
loom_telemetry_t *loom_train_metrics_telemetry(loom_train_metrics_t *tm);

/* Record a step, a validation loss, a checkpoint write. Lock-free. */
void loom_train_metrics_step(loom_train_metrics_t *tm, const loom_train_metrics_step_t *s);
void loom_train_metrics_eval(loom_train_metrics_t *tm, double val_loss);
void loom_train_metrics_checkpoint(loom_train_metrics_t *tm, double write_s);

/* The run is over: set loom_train_state to `state` ("finished",
 * "stopped" or "failed"). */
void loom_train_metrics_end(loom_train_metrics_t *tm, const char *state);
/* After loom_train_metrics_end: keep serving until /metrics has been
 * scraped once more and that answer sent in full (Prometheus sees the
 * last step and the state), at most linger_s seconds. Returns at once
 * without a server. */
void loom_train_metrics_linger(loom_train_metrics_t *tm, double linger_s);

/* Joules per trained token since start: this rank's GPU energy over this
 * rank's tokens (the job's figure when ranks draw alike), or on the CPU
 * the machine's package energy over the tokens of the ranks on it. NaN
 * without an energy counter or before the first step. */
double loom_train_metrics_joules_per_token(loom_train_metrics_t *tm);
/* Energy (J) this rank's device used since start; NaN without a counter. */
double loom_train_metrics_energy_j(loom_train_metrics_t *tm);

/* Stop the server and the sampler, free everything. NULL is fine. */
void loom_train_metrics_stop(loom_train_metrics_t *tm);

#endif
