/* metrics_log: a run's metrics.jsonl, one JSON object per optimizer step:
 *
 *   {"step":12,"loss":4.123456,"val_loss":4.2,"comm_wait_s":0.01,
 *    "loss_scale":65536,"skipped":false,"lr":6.0e-05,"grad_norm":1.23,
 *    "tokens_per_s":1234.5,"mfu":0.1234,"step_s":0.2,"elapsed_s":2.5}
 *
 * val_loss only on steps that measured it, comm_wait_s and comm_dp_s (the
 * same data-parallel wait under the per-dimension name shared with
 * comm_tp_s / comm_pp_s, docs/dist.md) only with more than one rank;
 * comm_tp_s only under --tp (the tensor-parallel group's wait);
 * peak_rss_mb: the writing rank's peak resident memory so far (VmHWM); loss_scale and skipped only under fp16 loss scaling,
 * energy_j_per_token (J per trained token since the loop started) only
 * where an energy counter is read (docs/observability.md), bubble_s and
 * comm_pp_s (rank 0's pipeline idle and send/receive time) only under
 * --pp; grad_norm
 * is null for a skipped step (JSON has no inf). Every line is flushed as it
 * is written, so a crash loses at most the step in flight. */
#ifndef LOOM_METRICS_LOG_H
#define LOOM_METRICS_LOG_H

#include "core/core.h"

typedef struct {
    long long step;
    double loss, val_loss;    /* val_loss < 0: not measured */
    int has_comm_wait;        /* write comm_wait_s and comm_dp_s */
    double comm_wait_s;
    int has_comm_tp;          /* write comm_tp_s (tensor parallel: the tp group's wait, apart from comm_wait_s) */
    double comm_tp_s;
    double peak_rss_mb;       /* > 0: write peak_rss_mb */
    int has_loss_scale;       /* write loss_scale and skipped */
    double loss_scale;
    int skipped;
    double lr, grad_norm, tokens_per_s, mfu, step_s, elapsed_s;
    int has_energy;           /* write energy_j_per_token */
    double energy_j_per_token;
    int has_pp;               /* pipeline parallel: write bubble_s and comm_pp_s */
    double bubble_s, comm_pp_s;
} loom_metrics_row_t;

typedef struct loom_metrics_log loom_metrics_log_t;

/* Open `path` for writing. keep_upto < 0 starts a new log; otherwise the
 * log is a resumed run's: the lines of steps 1..keep_upto are kept (a crash
 * may have logged steps past the checkpoint), the file is rewritten
 * atomically and new lines are appended. A missing file starts a new log. */
loom_status loom_metrics_log_open(loom_metrics_log_t **out, const char *path, long long keep_upto);
/* Append one step's line. */
loom_status loom_metrics_log_write(loom_metrics_log_t *log, const loom_metrics_row_t *row);
void loom_metrics_log_close(loom_metrics_log_t *log);

/* The one reader of the log: call row(ctx, r) for each complete line of
 * the log at `path`, in file order. A number the line lacks is NAN in r
 * (val_loss when not measured, mfu in an older log) and its has_ flag 0.
 * A missing file has no rows. */
loom_status loom_metrics_log_scan(const char *path, void (*row)(void *ctx, const loom_metrics_row_t *r), void *ctx);

#endif
