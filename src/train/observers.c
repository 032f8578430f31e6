/* observers: the built-in training observers -- signals, the metrics log,
 * text samples and the loss plot (checkpoints are in checkpoint.c, the
 * progress line in cli/progress.c). Each is a small state struct and the
 * hooks it needs; train.h says when the loop calls them. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "model/generate.h"
#include "obs/metrics_log.h"
#include "obs/plot.h"
#include "train/train.h"
#include "train/train_impl.h"

/* Each observer's state struct starts with the observer itself, so one
 * allocation holds both and ctx points at it. */
static void *observer_alloc(size_t size, const loom_train_observer_t *hooks) {
    loom_train_observer_t *ob = loom_calloc(1, size);
    *ob = *hooks;
    ob->ctx = ob;
    return ob;
}

/* ---- signals: SIGINT/SIGTERM stop the run after the step in flight ---- */

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

typedef struct {
    loom_train_observer_t ob;
} signals_t;

/* Installed by loom_train before setup, so a signal during a long setup
 * (the rendezvous, loading and verifying a checkpoint) stops the run
 * before its first step, on every rank, instead of killing one rank. */
static struct sigaction old_int, old_term;
static int installed;

void loom_train_signals_install(void) {
    struct sigaction sa = {.sa_handler = on_signal};
    stop_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    installed = 1;
}

void loom_train_signals_restore(void) {
    if (!installed) return;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    installed = 0;
}

/* LOOM_TEST_HOLD_AFTER_STEP=N: a run that started from step 1 waits
 * after step N until a signal asks it to stop, and says so on stderr; a
 * test interrupts a run there on any machine, instead of hoping that its
 * signal lands before a fast machine has finished every step. A resumed
 * run (the same command after the interruption) does not wait. */
long long loom_train_test_hold_step(const loom_train_run_t *run) {
    const char *v = getenv("LOOM_TEST_HOLD_AFTER_STEP");
    return v && *v && run->first_step == 1 ? atoll(v) : -1;
}

static void hold_for_test(const loom_train_run_t *run, long long step) {
    const char *v = getenv("LOOM_TEST_HOLD_AFTER_STEP");
    if (loom_train_test_hold_step(run) + 1 != step) return;
    loom_info("loom train: LOOM_TEST_HOLD_AFTER_STEP=%s: holding after step %lld until a signal", v, step - 1);
    while (!stop_signal) usleep(10000);
}

static loom_status signals_before_step(void *ctx, loom_train_run_t *run, long long step) {
    hold_for_test(run, step);
    if (stop_signal) loom_train_request_stop(run, stop_signal);
    return LOOM_OK;
}

/* A signal during the last step counts too. After one, a second signal
 * while the final checkpoint is written acts as it would without loom;
 * without one, loom's handler stays until loom_train has passed the last
 * barrier: a first signal there would kill this rank and make its peers
 * exit 3 ("rank N died") although the run is complete. */
static loom_status signals_stop(void *ctx, loom_train_run_t *run, loom_status s) {
    if (stop_signal) {
        loom_train_signals_restore();
        loom_train_request_stop(run, stop_signal);
    }
    if (s == LOOM_OK && run->stop_signal && run->step >= run->first_step)
        loom_info("\nloom train: stopped by signal %d after step %lld; writing a checkpoint", run->stop_signal, run->step);
    return LOOM_OK;
}

static void signals_free(void *ctx) { free(ctx); } /* loom_train restores the handlers last */

loom_train_observer_t *loom_train_observer_signals(void) {
    return observer_alloc(sizeof(signals_t), &(loom_train_observer_t){.name = "signals", .before_step = signals_before_step,
                                                                     .on_stop = signals_stop, .free = signals_free});
}

/* ---- the metrics log (src/obs/metrics_log.h), on the lead rank ---- */

typedef struct {
    loom_train_observer_t ob;
    loom_metrics_log_t *log;
} mlog_t;

static loom_status mlog_start(void *ctx, loom_train_run_t *run) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run->o->out);
    return loom_metrics_log_open(&((mlog_t *)ctx)->log, path, run->resumed_from ? run->resumed_step : -1);
}

static loom_status mlog_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    mlog_t *g = ctx;
    loom_metrics_row_t row = {.step = r->step, .loss = r->loss, .val_loss = r->val_loss, .has_comm_wait = run->multi,
                              .comm_wait_s = r->comm_wait_s, .has_comm_tp = run->tp != NULL || run->o->tp > 1, .comm_tp_s = r->comm_tp_s, .has_loss_scale = run->loss_scaling, .loss_scale = r->loss_scale,
                              .skipped = r->skipped, .lr = r->lr, .grad_norm = r->grad_norm, .tokens_per_s = r->tokens_per_s,
                              .mfu = r->mfu, .step_s = r->step_s, .elapsed_s = r->elapsed_s,
                              .has_energy = isfinite(run->energy_j_per_token), .energy_j_per_token = run->energy_j_per_token,
                              .peak_rss_mb = loom_mem_peak_rss() / 1e6,
                              .has_pp = run->pp != NULL, .bubble_s = r->bubble_s, .comm_pp_s = r->comm_pp_s};
    return loom_metrics_log_write(g->log, &row);
}

static void mlog_free(void *ctx) {
    mlog_t *g = ctx;
    loom_metrics_log_close(g->log);
    free(g);
}

loom_train_observer_t *loom_train_observer_metrics_log(const loom_train_opts_t *o) {
    if (o->rank != 0) return NULL;
    return observer_alloc(sizeof(mlog_t), &(loom_train_observer_t){.name = "metrics log", .on_start = mlog_start,
                                                                  .after_step = mlog_after_step, .free = mlog_free});
}

/* ---- text samples: every --sample-every steps and at the end ---- */

static void print_sample(loom_train_run_t *run, unsigned long long seed) {
    int ntok = run->o->sample_tokens;
    if (!run->tok || ntok <= 0) return;
    int eot = loom_tokenizer_eot(run->tok);
    uint32_t start = eot >= 0 ? (uint32_t)eot : (uint32_t)'\n';
    loom_sampling_t s = {.temperature = 1.0f, .top_k = 40, .top_p = 1.0f};
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    loom_text_sink_t sink = {run->tok, stderr};
    fprintf(stderr, "---- sample ----\n");
    loom_gpt_generate(run->model, &start, 1, ntok, &s, &rng, loom_text_sink_emit, &sink);
    fprintf(stderr, "\n----------------\n");
}

static loom_status sampler_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    const loom_train_opts_t *o = run->o;
    if (o->sample_every > 0 && r->step % o->sample_every == 0 && r->step != o->steps)
        print_sample(run, (unsigned long long)o->seed + (unsigned long long)r->step);
    return LOOM_OK;
}

static void sampler_end(void *ctx, loom_train_run_t *run, loom_status s) {
    if (s == LOOM_OK && run->step >= run->first_step) print_sample(run, (unsigned long long)run->o->seed);
}

loom_train_observer_t *loom_train_observer_sampler(const loom_train_opts_t *o) {
    /* ZeRO-3: no rank holds the weights to sample from alone (a forward on
     * one rank would wait for the others' gathers); setup says so. */
    if (o->rank != 0 || o->zero == 3) return NULL;
    return observer_alloc(sizeof(loom_train_observer_t), &(loom_train_observer_t){.name = "sampler", .after_step = sampler_after_step,
                                                                                 .on_end = sampler_end, .free = free});
}

/* ---- the loss plot: loss.svg, written when the loop ends ---- */

typedef struct {
    loom_train_observer_t ob;
    long long nsteps;
    double *steps, *loss;   /* (nsteps): step i+1 and its loss (NAN: not logged, not drawn) */
    double *vsteps, *vloss; /* (nsteps + 2) validation points */
    int nv;
    double buf[]; /* the four arrays above, in the same allocation (so .free is plain free) */
} plot_t;

static void plot_add_val(plot_t *g, long long step, double val) {
    if (g->nv >= g->nsteps + 2) return;
    g->vsteps[g->nv] = (double)step;
    g->vloss[g->nv++] = val;
}

/* A resumed run's history, read back from its (trimmed) metrics log. */
static void plot_row(void *ctx, const loom_metrics_row_t *r) {
    plot_t *g = ctx;
    if (r->step < 1 || r->step > g->nsteps) return;
    g->loss[r->step - 1] = r->loss;
    if (!isnan(r->val_loss)) plot_add_val(g, r->step, r->val_loss);
}

static loom_status plot_start(void *ctx, loom_train_run_t *run) {
    plot_t *g = ctx;
    if (!run->resumed_from) return LOOM_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run->o->out);
    return loom_metrics_log_scan(path, plot_row, g);
}

static loom_status plot_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    plot_t *g = ctx;
    g->loss[r->step - 1] = r->loss;
    return LOOM_OK;
}

static loom_status plot_eval(void *ctx, loom_train_run_t *run, long long step, double val) {
    plot_add_val(ctx, step, val);
    return LOOM_OK;
}

static loom_status plot_stop(void *ctx, loom_train_run_t *run, loom_status s) {
    plot_t *g = ctx;
    if (run->step <= 0) return LOOM_OK;
    const loom_train_opts_t *o = run->o;
    char path[4200], title[256];
    snprintf(path, sizeof path, "%s/loss.svg", o->out);
    snprintf(title, sizeof title, "%s: %s on %s", o->out, o->model, o->data);
    return loom_plot_loss_svg(path, title, g->steps, g->loss, (int)run->step, g->vsteps, g->vloss, g->nv);
}

loom_train_observer_t *loom_train_observer_plot(const loom_train_opts_t *o) {
    if (o->rank != 0) return NULL;
    size_t n = (size_t)o->steps;
    plot_t *g = observer_alloc(sizeof(plot_t) + (4 * n + 4) * sizeof(double),
                               &(loom_train_observer_t){.name = "plot", .on_start = plot_start, .after_step = plot_after_step,
                                                        .on_eval = plot_eval, .on_stop = plot_stop, .free = free});
    g->nsteps = o->steps;
    g->steps = g->buf;
    g->loss = g->steps + n;
    g->vsteps = g->loss + n;
    g->vloss = g->vsteps + n + 2;
    for (long long i = 0; i < o->steps; i++) {
        g->steps[i] = (double)(i + 1);
        g->loss[i] = NAN;
    }
    return &g->ob;
}
