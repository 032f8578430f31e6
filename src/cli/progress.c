#include "cli/progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int tty;
    loom_train_observer_t self;
} progress_t;

void loom_progress_fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

static loom_status progress_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    progress_t *p = ctx;
    const loom_train_opts_t *o = run->o;
    int evaluated = r->val_loss >= 0;
    int print = p->tty || r->step % o->log_every == 0 || r->step == run->first_step || r->step == o->steps || evaluated;
    if (!print || !run->lead) return LOOM_OK;
    char mfu[32] = "n/a", eta[32];
    if (r->mfu >= 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100 * r->mfu);
    loom_progress_fmt_eta(r->eta_s, eta, sizeof eta);
    fprintf(stderr, "%sstep %lld/%lld | loss %.4f", p->tty ? "\r\033[K" : "", r->step, o->steps, r->loss);
    if (evaluated) fprintf(stderr, " | val %.4f", r->val_loss);
    fprintf(stderr, " | lr %.2e | norm %.2f | %.0f tok/s | MFU %s | ETA %s", r->lr, r->grad_norm, r->tokens_per_s, mfu, eta);
    if (run->multi && run->dp) fprintf(stderr, " | dp comm %.1f ms", 1e3 * r->comm_wait_s);
    if (run->tp) fprintf(stderr, " | tp comm %.1f ms", 1e3 * r->comm_tp_s);
    if (run->pp) fprintf(stderr, " | pp comm %.1f ms, bubble %.0f%%", 1e3 * r->comm_pp_s, 100 * r->bubble_s / r->step_s);
    if (!p->tty || evaluated || r->step == o->steps) fputc('\n', stderr);
    return LOOM_OK;
}

/* The summary, when the run ended well after at least one step. */
static void progress_end(void *ctx, loom_train_run_t *run, loom_status s) {
    if (s != LOOM_OK || run->step < run->first_step) return;
    const loom_train_opts_t *o = run->o;
    long long ran = run->step - run->first_step + 1;
    char val[32] = "n/a"; /* no validation split, or no evaluation yet */
    if (run->last_val >= 0) snprintf(val, sizeof val, "%.4f", run->last_val);
    loom_info("loom train: done: %lld steps in %.1fs, %.0f tokens/s; final train loss %.4f, val loss %s; checkpoint in %s/checkpoints",
              ran, loom_now() - run->t_start, (double)run->tokens_per_step * (double)ran / run->train_time, run->last_loss,
              val, o->out);
    if (isfinite(run->energy_j_per_token))
        loom_info("loom train: energy: %.4g J per trained token", run->energy_j_per_token);
    if (run->multi && run->dp_size > 1)
        loom_info("loom train: %d ranks: %.1f%% of step time waiting for data-parallel communication (%.2fs of %.2fs)", o->world_size,
                  100 * run->comm_wait / run->train_time, run->comm_wait, run->train_time);
    if (run->tp)
        loom_info("loom train: tensor parallel (--tp %d): %.1f%% of step time waiting on the tp group (%.2fs)", o->tp,
                  100 * run->comm_tp / run->train_time, run->comm_tp);
    if (run->pp) { /* rank 0's stage; (N-1)/(M+N-1) is the ideal 1F1B schedule's */
        double n = o->pp, m = o->grad_accum;
        loom_info("loom train: pipeline bubble (stage 0): %.2fs, %.1f%% of step time; the 1F1B formula (N-1)/(M+N-1) = %.1f%%",
                  run->bubble_time, 100 * run->bubble_time / run->train_time, 100 * (n - 1) / (m + n - 1));
    }
}

static void progress_free(void *ctx) { free(ctx); }

loom_train_observer_t *loom_progress_observer(const loom_train_opts_t *o) {
    progress_t *p = loom_calloc(1, sizeof *p);
    p->tty = isatty(2);
    p->self = (loom_train_observer_t){.name = "progress", .ctx = p, .after_step = progress_after_step,
                                      .on_end = progress_end, .free = progress_free};
    return &p->self;
}

void loom_progress_bar_init(loom_progress_bar_t *p, int quiet) {
    *p = (loom_progress_bar_t){.tty = isatty(2), .quiet = quiet};
}

static void fmt_eta_clock(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) snprintf(buf, n, "?");
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

void loom_progress_bar_show(void *ctx, const char *stage, double done, double total, const char *unit, const char *extra,
                            int final) {
    loom_progress_bar_t *p = ctx;
    if (p->quiet) return;
    double now = loom_now();
    if (strcmp(p->stage, stage)) {
        snprintf(p->stage, sizeof p->stage, "%s", stage);
        p->start = p->last = now;
    }
    if (!final && now - p->last < (p->tty ? 0.1 : 10.0)) return;
    p->last = now;
    double el = now - p->start, rate = el > 0 ? done / el : 0;
    char eta[32];
    fmt_eta_clock(eta, sizeof eta, rate > 0 ? (total - done) / rate : -1);
    double pct = total > 0 ? 100.0 * done / total : 100.0;
    int bar = (int)(pct / 5);
    char b[21];
    for (int i = 0; i < 20; i++) b[i] = i < bar ? '#' : '.';
    b[20] = 0;
    int prec = strcmp(unit, "MB") ? 0 : 1;
    fprintf(stderr, "%s%-9s [%s] %3.0f%% %.*f/%.*f %s, %.*f %s/s%s, ETA %s%s", p->tty ? "\r" : "", stage, b, pct, prec, done,
            prec, total, unit, prec, rate, unit, extra ? extra : "", final ? "0:00" : eta, final || !p->tty ? "\n" : "");
    fflush(stderr);
}
