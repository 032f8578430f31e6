/* train_metrics: the training exporter (see train_metrics.h). */
#define _GNU_SOURCE
#include "obs/train_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "obs/dashboard.h"
#include "obs/http.h"

/* The training series, in the order they are declared (and exposed). */
enum {
    M_STEP, M_STEPS, M_LOSS, M_VAL, M_LR, M_GNORM, M_TOKS, M_TOK_TOTAL, M_FLOPS, M_MFU, M_COMPUTE, M_COMM, M_COMM_TOTAL,
    M_DATA, M_DATA_TOTAL, M_SKIPPED, M_SCALE, M_JPT, M_PEAK, M_WORLD, M_RSS, M_N
};

/* loom_train_state's values: one series each, 1 for the current one. */
static const char *const states[] = {"running", "finished", "stopped", "failed"};
#define N_STATES 4

struct loom_train_metrics {
    loom_metrics_t *reg;
    loom_telemetry_t *tel;
    loom_dashboard_t *dash;
    loom_http_t *http;
    loom_metric_t *m[M_N], *step_hist, *ckpt_hist, *state[N_STATES];
    loom_metric_t *comm_tp; /* loom_train_comm_seconds_total{dim="tp"} */
    loom_metric_t *comm_dp; /* loom_train_comm_seconds_total{dim="dp"} */
    loom_http_route_t metrics_route; /* the registry's /metrics, which scraped() wraps */
    pthread_mutex_t mu;
    pthread_cond_t scraped_cv;
    int ended, scrapes_after_end;
    int world, local_world, cpu_energy;
    double energy0;     /* telemetry energy at start (NaN: no counter) */
    double tokens;      /* this rank's tokens since then */
    char title[512], gpu_why[512], energy_why[600]; /* the dashboard's texts (it keeps pointers) */
};

/* Ten buckets per decade (each about 1.26x the last), 1 ms .. 320 s: an
 * interpolated quantile is off by at most one bucket's width (28% at most), and
 * usually far less; coarser buckets put CPU steps' p90/p99 10-50% high. */
static const double step_buckets[] = {
    0.001, 0.00125, 0.0016, 0.002, 0.0025, 0.0032, 0.004, 0.005, 0.0063, 0.008, 0.01, 0.0125, 0.016, 0.02, 0.025, 0.032, 0.04, 0.05, 0.063,
    0.08,  0.1,     0.125,  0.16,  0.2,    0.25,   0.32,  0.4,   0.5,    0.63,  0.8,  1,      1.25,  1.6,  2,     2.5,   3.2,  4,    5,
    6.3,   8,       10,     12.5,  16,     20,     25,    32,    40,     50,    63,   80,     100,   125,  160,   200,   250,  320};
static const double ckpt_buckets[] = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1200};

static void declare(loom_train_metrics_t *tm, const char *rank) {
    static const loom_metric_def_t d[M_N] = {
        [M_STEP] = {0, "loom_train_step", "Last completed optimizer step."},
        [M_STEPS] = {0, "loom_train_steps_planned", "Optimizer steps the run is asked to take (--steps)."},
        [M_LOSS] = {0, "loom_train_loss", "Training loss (mean cross-entropy, nats per token) of the last step."},
        [M_VAL] = {0, "loom_train_val_loss", "Last validation loss (nats per token)."},
        [M_LR] = {0, "loom_train_learning_rate", "Learning rate of the last step."},
        [M_GNORM] = {0, "loom_train_grad_norm", "Global gradient norm before clipping, last step (absent after a skipped fp16 step)."},
        [M_TOKS] = {0, "loom_train_tokens_per_second", "Global training throughput of the last step, tokens/s (all ranks together)."},
        [M_TOK_TOTAL] = {1, "loom_train_tokens_total", "Tokens this rank trained on."},
        [M_FLOPS] = {0, "loom_train_flops_per_second", "Achieved model FLOP/s of this rank in the last step (6N + attention per token)."},
        [M_MFU] = {0, "loom_train_mfu_ratio", "Model FLOPs utilization of the last step, 0..1 (achieved over peak FLOP/s)."},
        [M_COMPUTE] = {0, "loom_train_compute_seconds", "Last step's time not spent waiting for other ranks, s."},
        [M_COMM] = {0, "loom_train_comm_wait_seconds", "Last step's time blocked on gradient communication, s."},
        [M_COMM_TOTAL] = {1, "loom_train_comm_wait_seconds_total", "Time blocked on gradient communication, s."},
        [M_DATA] = {0, "loom_train_data_wait_seconds", "Time the last step waited for its batches from the data loader, s."},
        [M_DATA_TOTAL] = {1, "loom_train_data_wait_seconds_total", "Time waiting for batches, s."},
        [M_SKIPPED] = {1, "loom_train_skipped_steps_total", "Steps skipped for inf/nan gradients under fp16 loss scaling."},
        [M_SCALE] = {0, "loom_train_loss_scale", "fp16 dynamic loss scale (absent without loss scaling)."},
        [M_JPT] = {0, "loom_train_energy_joules_per_token", "Energy per trained token since the first step, J (GPU: NVML; CPU: RAPL)."},
        [M_PEAK] = {0, "loom_train_peak_flops_per_second", "Peak FLOP/s per rank that MFU is relative to (GPU table, or rank 0's measured GEMM rate on the CPU)."},
        [M_WORLD] = {0, "loom_train_world_size", "Ranks in the job."},
        [M_RSS] = {0, "loom_train_peak_resident_bytes", "Peak resident memory of this rank's process so far (VmHWM), bytes."},
    };
    loom_metrics_declare(tm->reg, d, M_N, "rank", rank, tm->m);
    /* Communication per parallel dimension (docs/dist.md); the data-parallel
     * wait is also loom_train_comm_wait_seconds_total, its older name. */
    tm->comm_dp = loom_metrics_counter(tm->reg, "loom_train_comm_seconds_total", "Time blocked on communication per parallel dimension, s.",
                                       "rank", rank, "dim", "dp", NULL);
    tm->step_hist = loom_metrics_histogram(tm->reg, "loom_train_step_seconds", "Wall time of optimizer steps, s.", step_buckets,
                                           (int)(sizeof step_buckets / sizeof step_buckets[0]), "rank", rank, NULL);
    for (int i = 0; i < N_STATES; i++)
        tm->state[i] = loom_metrics_gauge(tm->reg, "loom_train_state", "1 for the run's state: running, finished, stopped (signal) or failed.",
                                          "rank", rank, "state", states[i], NULL);
    tm->ckpt_hist = loom_metrics_histogram(tm->reg, "loom_train_checkpoint_write_seconds", "Time to write a checkpoint, s (this rank's view).",
                                           ckpt_buckets, (int)(sizeof ckpt_buckets / sizeof ckpt_buckets[0]), "rank", rank, NULL);
}

static loom_status start_dashboard(loom_train_metrics_t *tm, const loom_train_metrics_opts_t *o) {
    const char *why = loom_telemetry_status(tm->tel);
    char gpu_why[512];
    snprintf(gpu_why, sizeof gpu_why, "%.*s", (int)strcspn(why, ";"), why); /* the GPU part of the status */
    snprintf(tm->gpu_why, sizeof tm->gpu_why, "%s", gpu_why);
    const char *rest = strstr(why, "; "); /* the CPU part of a CPU run's status */
    snprintf(tm->energy_why, sizeof tm->energy_why, "no energy counter: %s", rest && tm->cpu_energy ? rest + 2 : why);
    loom_metric_t *power = loom_telemetry_power_metric(tm->tel), *mem = loom_telemetry_memory_metric(tm->tel);
    const loom_dashboard_line_t lines[] = {
        {"loss", "train", tm->m[M_LOSS], LOOM_LINE_VALUE, 0, 0, NULL},
        {"loss", "validation", tm->m[M_VAL], LOOM_LINE_VALUE, 0, 0, NULL},
        {"tokens/s", "tokens/s", tm->m[M_TOKS], LOOM_LINE_VALUE, 0, 0, NULL},
        {"MFU (%)", "MFU", tm->m[M_MFU], LOOM_LINE_VALUE, 0, 100, NULL},
        {"step time (s)", "compute", tm->m[M_COMPUTE], LOOM_LINE_VALUE, 0, 0, NULL},
        {"step time (s)", "comm wait", tm->m[M_COMM], LOOM_LINE_VALUE, 0, 0, NULL},
        {"step time (s)", "data wait", tm->m[M_DATA], LOOM_LINE_VALUE, 0, 0, NULL},
        {"GPU power (W)", "power", power, LOOM_LINE_VALUE, 0, 0, tm->gpu_why},
        {"GPU memory used (MiB)", "used", mem, LOOM_LINE_VALUE, 0, 0, tm->gpu_why},
        {"energy per token (J)", "J/token", isfinite(tm->energy0) ? tm->m[M_JPT] : NULL, LOOM_LINE_VALUE, 0, 0, tm->energy_why},
    };
    snprintf(tm->title, sizeof tm->title, "loom train %s: %s (%s, %s), rank %d of %d", o->run ? o->run : "", o->model ? o->model : "",
             o->device ? o->device : "cpu", o->dtype ? o->dtype : "", o->rank, o->world_size);
    LOOM_TRY(loom_dashboard_start(&tm->dash, tm->title, tm->reg, lines, (int)(sizeof lines / sizeof lines[0]), o->period_s));
    loom_dashboard_note(tm->dash, why);
    return LOOM_OK;
}

static void set_state(loom_train_metrics_t *tm, const char *state) {
    for (int i = 0; i < N_STATES; i++) loom_gauge_set(tm->state[i], !strcmp(states[i], state));
}

/* A scrape of the final state, sent as a stream so that its end (when
 * libmicrohttpd frees it, the whole body sent) is what the linger waits
 * for: stopping the server on the handler's return could cut the body. */
typedef struct {
    loom_train_metrics_t *tm;
    char *body;
    size_t len, pos;
} final_scrape_t;

static long final_read(void *ctx, char *buf, size_t max) {
    final_scrape_t *f = ctx;
    size_t n = f->len - f->pos < max ? f->len - f->pos : max;
    if (n == 0) return -1;
    memcpy(buf, f->body + f->pos, n);
    f->pos += n;
    return (long)n;
}

static void final_sent(void *ctx) {
    final_scrape_t *f = ctx;
    pthread_mutex_lock(&f->tm->mu);
    f->tm->scrapes_after_end++;
    pthread_cond_broadcast(&f->tm->scraped_cv);
    pthread_mutex_unlock(&f->tm->mu);
    free(f->body);
    free(f);
}

/* GET /metrics; once the run has ended, each scrape ends the linger. */
static void scraped(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_train_metrics_t *tm = ctx;
    pthread_mutex_lock(&tm->mu);
    int ended = tm->ended;
    pthread_mutex_unlock(&tm->mu);
    tm->metrics_route.fn(req, resp, tm->metrics_route.ctx);
    if (!ended || resp->stream) return;
    final_scrape_t *f = loom_calloc(1, sizeof *f);
    *f = (final_scrape_t){tm, resp->body, resp->body_len, 0};
    resp->body = NULL, resp->body_len = 0;
    resp->stream = final_read, resp->stream_free = final_sent, resp->sctx = f;
}

void loom_train_metrics_end(loom_train_metrics_t *tm, const char *state) {
    if (!tm) return;
    set_state(tm, state);
    pthread_mutex_lock(&tm->mu);
    tm->ended = 1;
    pthread_mutex_unlock(&tm->mu);
}

void loom_train_metrics_linger(loom_train_metrics_t *tm, double linger_s) {
    if (!tm) return;
    pthread_mutex_lock(&tm->mu);
    const char *state = "running";
    for (int i = 0; i < N_STATES; i++)
        if (loom_metric_value(tm->state[i]) == 1) state = states[i];
    if (tm->ended && tm->http && linger_s > 0) {
        loom_info("loom train: run %s; /metrics stays up until it is scraped once more (at most %g s, --metrics-linger)", state, linger_s);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (time_t)linger_s;
        until.tv_nsec += (long)((linger_s - floor(linger_s)) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (tm->scrapes_after_end == 0 && pthread_cond_timedwait(&tm->scraped_cv, &tm->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&tm->mu);
}

static loom_status start_server(loom_train_metrics_t *tm, const loom_train_metrics_opts_t *o) {
    loom_http_route_t routes[8];
    tm->metrics_route = loom_dashboard_metrics_route(tm->reg);
    routes[0] = (loom_http_route_t){"GET", "/metrics", scraped, tm};
    int n = 1 + loom_dashboard_routes(tm->dash, routes + 1);
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    int port = o->port > 0 ? o->port + o->local_rank : 0;
    loom_status s = loom_http_start(&tm->http, host, port, routes, n);
    if (s != LOOM_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_errmsg()); /* loom_error writes where loom_errmsg reads */
        return loom_error(s, "--metrics-port: %s", why);
    }
    loom_info("loom train: metrics on http://%s:%d/metrics, live dashboard on http://%s:%d/ (rank %d)", host,
              loom_http_port(tm->http), host, loom_http_port(tm->http), o->rank);
    return LOOM_OK;
}

loom_status loom_train_metrics_start(loom_train_metrics_t **out, const loom_train_metrics_opts_t *o) {
    *out = NULL;
    loom_train_metrics_t *tm = loom_calloc(1, sizeof *tm);
    tm->reg = loom_metrics_new();
    pthread_mutex_init(&tm->mu, NULL);
    pthread_cond_init(&tm->scraped_cv, NULL);
    tm->world = o->world_size > 0 ? o->world_size : 1;
    tm->local_world = o->local_world > 0 ? o->local_world : tm->world;
    char rank[16];
    snprintf(rank, sizeof rank, "%d", o->rank);
    declare(tm, rank);
    tm->comm_tp = loom_metrics_counter(tm->reg, "loom_train_comm_seconds_total",
                                       "Time blocked on communication per parallel dimension (tp, pp, dp), s.", "rank", rank, "dim", "tp", NULL);
    char world[16];
    snprintf(world, sizeof world, "%d", tm->world);
    loom_gauge_set(loom_metrics_gauge(tm->reg, "loom_train_info", "The run's settings (value 1).", "rank", rank, "model",
                                      o->model ? o->model : "", "device", o->device ? o->device : "cpu", "dtype",
                                      o->dtype ? o->dtype : "", "world_size", world, NULL),
                   1);
    loom_gauge_set(tm->m[M_STEPS], (double)o->steps);
    loom_gauge_set(tm->m[M_WORLD], tm->world);
    set_state(tm, "running");
    tm->tel = loom_telemetry_open(tm->reg, o->gpu, o->rank);
    tm->cpu_energy = !loom_telemetry_has_gpu(tm->tel);
    tm->energy0 = loom_telemetry_energy_j(tm->tel); /* call start when the loop starts */
    loom_info("loom train: %s", loom_telemetry_status(tm->tel));
    loom_status s = LOOM_OK;
    if (o->port >= 0 && (s = start_dashboard(tm, o)) == LOOM_OK) s = start_server(tm, o);
    if (s != LOOM_OK) {
        loom_train_metrics_stop(tm);
        return s;
    }
    *out = tm;
    return LOOM_OK;
}

loom_metrics_t *loom_train_metrics_registry(loom_train_metrics_t *tm) { return tm ? tm->reg : NULL; }
loom_telemetry_t *loom_train_metrics_telemetry(loom_train_metrics_t *tm) { return tm ? tm->tel : NULL; }
double loom_train_metrics_energy_j(loom_train_metrics_t *tm) {
    if (!tm) return NAN;
    double e = loom_telemetry_energy_j(tm->tel);
    return isfinite(tm->energy0) ? e - tm->energy0 : NAN;
}

double loom_train_metrics_joules_per_token(loom_train_metrics_t *tm) {
    double e = loom_train_metrics_energy_j(tm);
    if (!isfinite(e) || tm->tokens <= 0) return NAN;
    /* RAPL measures the whole machine: its energy is shared by the ranks on it. */
    return e / (tm->tokens * (tm->cpu_energy ? tm->local_world : 1));
}

void loom_train_metrics_step(loom_train_metrics_t *tm, const loom_train_metrics_step_t *s) {
    if (!tm) return;
    loom_metric_t **m = tm->m;
    double mine = s->tokens / tm->world;
    tm->tokens += mine;
    loom_gauge_set(m[M_STEP], (double)s->step);
    loom_gauge_set(m[M_LOSS], s->loss);
    loom_gauge_set(m[M_LR], s->lr);
    if (isfinite(s->grad_norm)) loom_gauge_set(m[M_GNORM], s->grad_norm);
    else loom_gauge_unset(m[M_GNORM]);
    loom_gauge_set(m[M_TOKS], s->tokens_per_s);
    loom_counter_add(m[M_TOK_TOTAL], mine);
    loom_gauge_set(m[M_FLOPS], s->flops_per_s);
    if (s->mfu >= 0) loom_gauge_set(m[M_MFU], s->mfu);
    if (s->peak_flops > 0) loom_gauge_set(m[M_PEAK], s->peak_flops);
    loom_gauge_set(m[M_COMPUTE], s->step_s - s->comm_wait_s);
    loom_gauge_set(m[M_COMM], s->comm_wait_s);
    loom_counter_add(m[M_COMM_TOTAL], s->comm_wait_s);
    loom_counter_add(tm->comm_tp, s->comm_tp_s);
    loom_counter_add(tm->comm_dp, s->comm_wait_s);
    loom_gauge_set(m[M_RSS], loom_mem_peak_rss());
    loom_gauge_set(m[M_DATA], s->data_s);
    loom_counter_add(m[M_DATA_TOTAL], s->data_s);
    if (s->skipped) loom_counter_add(m[M_SKIPPED], 1);
    if (s->loss_scale > 0) loom_gauge_set(m[M_SCALE], s->loss_scale);
    loom_histogram_observe(tm->step_hist, s->step_s);
    double jpt = loom_train_metrics_joules_per_token(tm);
    if (isfinite(jpt)) loom_gauge_set(m[M_JPT], jpt);
}

void loom_train_metrics_eval(loom_train_metrics_t *tm, double val_loss) {
    if (tm && val_loss >= 0) loom_gauge_set(tm->m[M_VAL], val_loss);
}

void loom_train_metrics_checkpoint(loom_train_metrics_t *tm, double write_s) {
    if (tm) loom_histogram_observe(tm->ckpt_hist, write_s);
}

void loom_train_metrics_stop(loom_train_metrics_t *tm) {
    if (!tm) return;
    loom_http_stop(tm->http);
    loom_dashboard_stop(tm->dash);
    loom_telemetry_close(tm->tel);
    loom_metrics_free(tm->reg);
    pthread_mutex_destroy(&tm->mu);
    pthread_cond_destroy(&tm->scraped_cv);
    free(tm);
}
