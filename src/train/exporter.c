/* exporter: training metrics and telemetry as an observer (see exporter.h). */
#define _GNU_SOURCE
#include "train/exporter.h"

#include <stdlib.h>
#include <string.h>

#include "obs/train_metrics.h"

typedef struct {
    loom_train_observer_t ob; /* first: the observer's ctx is this struct */
    loom_train_metrics_t *tm;
    double linger_s;
    loom_metric_t *bubble, *comm_pp; /* --pp only */
} exporter_t;

static loom_status exporter_start(void *ctx, loom_train_run_t *run) {
    exporter_t *e = ctx;
    const loom_train_opts_t *o = run->o;
    int local = loom_dist_local_rank(run->dist);
    /* The device this rank trains on, as setup opened it: "cuda" is the
     * local rank's GPU. */
    char device[64];
    loom_backend_rank_device(device, sizeof device, o->device ? o->device : "cpu", run->multi ? local : 0);
    const char *lws = getenv("LOCAL_WORLD_SIZE");
    loom_train_metrics_opts_t mo = {.host = o->metrics_host, .port = o->metrics_port, .rank = o->rank, .local_rank = local,
                                    .world_size = o->world_size, .local_world = lws ? atoi(lws) : 0, .device = device,
                                    .gpu = loom_backend_gpu_ordinal(device),
                                    .model = o->model, .dtype = loom_dtype_name(run->be->dtype), .run = o->out, .steps = o->steps};
    LOOM_TRY(loom_train_metrics_start(&e->tm, &mo));
    if (!run->pp) return LOOM_OK;
    /* Communication per dimension: one family, the dim label says which. */
    char rank[16];
    snprintf(rank, sizeof rank, "%d", o->rank);
    loom_metrics_t *reg = loom_train_metrics_registry(e->tm);
    e->bubble = loom_metrics_counter(reg, "loom_train_pipeline_bubble_seconds_total",
                                     "Time this pipeline stage sat idle waiting on its neighbours (the bubble), s.", "rank", rank, NULL);
    e->comm_pp = loom_metrics_counter(reg, "loom_train_comm_seconds_total", "Time blocked on communication, by parallel dimension, s.",
                                      "rank", rank, "dim", "pp", NULL);
    return e->bubble && e->comm_pp ? LOOM_OK : LOOM_EINTERNAL;
}

static loom_status exporter_eval(void *ctx, loom_train_run_t *run, long long step, double val_loss) {
    loom_train_metrics_eval(((exporter_t *)ctx)->tm, val_loss);
    return LOOM_OK;
}

static loom_status exporter_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    exporter_t *e = ctx;
    loom_train_metrics_step_t s = {
        .step = r->step, .loss = r->loss, .grad_norm = r->grad_norm, .lr = r->lr, .tokens = (double)run->tokens_per_step,
        .tokens_per_s = r->tokens_per_s, .flops_per_s = run->flops_per_token * r->tokens_per_s / run->o->world_size,
        .mfu = r->mfu, .step_s = r->step_s, .comm_wait_s = r->comm_wait_s, .comm_tp_s = r->comm_tp_s, .data_s = r->data_s,
        .loss_scale = run->loss_scaling ? r->loss_scale : 0, .peak_flops = r->peak_flops, .skipped = r->skipped};
    loom_train_metrics_step(e->tm, &s);
    if (e->bubble) loom_counter_add(e->bubble, r->bubble_s);
    if (e->comm_pp) loom_counter_add(e->comm_pp, r->comm_pp_s);
    run->energy_j_per_token = loom_train_metrics_joules_per_token(e->tm);
    return LOOM_OK;
}

static loom_status exporter_checkpoint(void *ctx, loom_train_run_t *run, const loom_ckpt_event_t *ev) {
    loom_train_metrics_checkpoint(((exporter_t *)ctx)->tm, ev->write_s);
    return LOOM_OK;
}

/* The final state; the linger that lets Prometheus see it is in free, after
 * every observer's report (the done line's time does not include it). */
static void exporter_end(void *ctx, loom_train_run_t *run, loom_status s) {
    const char *state = s == LOOM_OK && run->stop_signal ? "stopped" : s == LOOM_OK ? "finished" : "failed";
    loom_train_metrics_end(((exporter_t *)ctx)->tm, state);
}

static void exporter_free(void *ctx) {
    exporter_t *e = ctx;
    loom_train_metrics_linger(e->tm, e->linger_s);
    loom_train_metrics_stop(e->tm);
    free(e);
}

loom_train_observer_t *loom_train_observer_exporter(const loom_train_opts_t *o) {
    exporter_t *e = loom_calloc(1, sizeof *e);
    e->linger_s = o->metrics_linger;
    e->ob = (loom_train_observer_t){.name = "metrics exporter", .ctx = e, .on_start = exporter_start, .on_eval = exporter_eval,
                                    .after_step = exporter_after_step, .on_checkpoint = exporter_checkpoint, .on_end = exporter_end, .free = exporter_free};
    return &e->ob;
}
