/* bench_pp: the pipeline (N ranks x 1 thread, TCP on 127.0.0.1) against
 * one process with N threads on the same global batch, M micro-batches of
 * B x T each; the measured bubble (each stage's idle time on its
 * neighbours over its schedule's time, averaged over stages) beside the
 * 1F1B formula (N-1)/(M+N-1); memory per rank (model state by formula and
 * the peak resident set). Fresh processes per configuration. */
#define _GNU_SOURCE
#include "cli/bench_dist.h"
#include "cli/bench_pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/mem.h"
#include "parallel/dist.h"
#include "parallel/launch.h"
#include "train/pipeline.h"

typedef struct {
    double step_s, bubble, comm_s, state_mb, rss_mb, loss;
    int ok, rank;
} pp_result_t;

typedef struct {
    const loom_bench_pp_t *c;
    int world, fd;
} pp_args_t;

/* The global batch: M micro-batches from one seeded stream, the same in every rank. */
static int *make_batch(const loom_bench_pp_t *c) {
    size_t n = (size_t)c->micro * c->batch * c->seq + 1;
    int *all = loom_malloc(n * sizeof(int));
    loom_rng_t rng;
    loom_rng_seed(&rng, 11);
    for (size_t i = 0; i < n; i++) all[i] = (int)(loom_rng_u64(&rng) % (uint64_t)c->vocab);
    return all;
}

/* Step c->warmup + c->steps times; the timed steps' means into *r. */
static loom_status time_steps(const loom_bench_pp_t *c, loom_pp_t *pp, loom_gpt_t *m, pp_result_t *r) {
    int *all = make_batch(c);
    loom_optim_t opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};
    float loss = 0, norm;
    loom_status s = LOOM_OK;
    for (int k = 0; k < c->warmup + c->steps && s == LOOM_OK; k++) {
        double t0 = loom_now(), comm, bub, sched;
        s = pp ? loom_pp_step(pp, all, all + 1, &opt, 1e-4f, k + 1, &loss, &norm)
               : loom_train_step(m, all, all + 1, c->batch, c->seq, c->micro, &opt, 1e-4f, k + 1, &loss, &norm);
        if (s != LOOM_OK || k < c->warmup) continue;
        r->step_s += (loom_now() - t0) / c->steps;
        loom_pp_last_times(pp, &comm, &bub, &sched);
        r->comm_s += comm / c->steps;
        r->bubble += (sched > 0 ? bub / sched : 0) / c->steps;
    }
    free(all);
    r->loss = loss;
    return s;
}

/* The ranks of the pipeline: stages x tensor-parallel width. */
static int ranks_of(const loom_bench_pp_t *c) { return c->stages * (c->tp > 1 ? c->tp : 1); }

static int rank_main(int rank, void *ctx) {
    const pp_args_t *a = ctx;
    const loom_bench_pp_t *c = a->c;
    pp_result_t r = {.rank = rank};
    loom_log_quiet(1);
    loom_dist_t *d = NULL;
    const loom_backend_t *be;
    loom_gpt_t *m = NULL;
    loom_pp_t *pp = NULL;
    loom_dist_opts_t dopt = {.transport = a->world > 1 ? "tcp" : "single", .timeout_s = 120};
    loom_gpt_config_t cfg = {.max_seq_len = c->seq, .vocab_size = c->vocab, .n_layer = c->layers, .n_head = c->heads, .channels = c->channels};
    loom_pp_opts_t po = {.stages = c->stages, .tp = c->tp, .B = c->batch, .T = c->seq, .micro = c->micro, .seed = 7};
    loom_status s = loom_dist_init(&d, &dopt);
    if (s == LOOM_OK) s = loom_backend_cpu_init(&be, a->world > 1 ? 1 : ranks_of(c));
    if (s == LOOM_OK && a->world > 1) s = loom_pp_init(&pp, d, &cfg, be, &po, &m);
    if (s == LOOM_OK && a->world == 1 && (s = loom_gpt_init(&m, &cfg, be, 7)) == LOOM_OK) s = loom_gpt_alloc_train(m);
    if (s == LOOM_OK) s = time_steps(c, pp, m, &r);
    if (s == LOOM_OK) {
        size_t acts = pp ? (size_t)(c->stages - loom_pp_stage(pp) < c->micro ? c->stages - loom_pp_stage(pp) : c->micro) : 1;
        r.state_mb = (16.0 * (double)m->num_params + (double)acts * (double)m->act_bytes) / 1e6; /* params, grads, m, v + acts */
        r.rss_mb = loom_mem_peak_rss() / 1e6;
        r.ok = 1;
    } else {
        fprintf(stderr, "loom bench dist: pp rank %d: %s\n", rank, loom_errmsg());
    }
    if (write(a->fd, &r, sizeof r) != (ssize_t)sizeof r) r.ok = 0;
    if (pp) loom_pp_free(pp);
    else loom_gpt_free(m);
    if (r.ok) loom_dist_free(d);
    return r.ok ? 0 : 1;
}

/* One configuration in fresh processes: each rank's result, in rank order. */
static int run_config(const loom_bench_pp_t *c, int world, pp_result_t *out) {
    int p[2], code;
    if (pipe(p) != 0) return 0;
    pp_args_t a = {c, world, p[1]};
    loom_launch_t l = {.what = "loom bench dist", .nproc = world, .kill_after_s = 130, .run = rank_main, .ctx = &a};
    loom_status s = loom_launch_local(&l, &code);
    close(p[1]);
    int ok = s == LOOM_OK && code == 0;
    for (int r = 0; r < world; r++) { /* in the order the ranks finished: placed by rank (= stage) */
        pp_result_t x;
        if (read(p[0], &x, sizeof x) != (ssize_t)sizeof x || !x.ok || x.rank < 0 || x.rank >= world) ok = 0;
        else out[x.rank] = x;
    }
    close(p[0]);
    return ok;
}

/* One row of the table per rank: its stage (and tp index). */
static void print_ranks(const loom_bench_pp_t *c, const pp_result_t *best, int n, double tok) {
    int T = c->tp > 1 ? c->tp : 1;
    for (int r = 0; r < n; r++) {
        char who[32];
        if (T > 1) snprintf(who, sizeof who, "stage %d tp %d", r / T, r % T);
        else snprintf(who, sizeof who, "stage %d", r);
        printf("pp%d %-12s (1 thread) %2s %9.1f %11.0f %8.1f%% %8.1f%% %10.1f %9.1f\n", c->stages, who, "", 1e3 * best[r].step_s,
               tok / best[r].step_s, 100 * best[r].bubble, 100 * best[r].comm_s / best[r].step_s, best[r].state_mb, best[r].rss_mb);
    }
}

int loom_bench_pp(const loom_bench_pp_t *c) {
    int n = ranks_of(c);
    pp_result_t one = {0}, best[64] = {{0}}, x[64], y;
    double bub[c->rounds], rel[c->rounds], formula = loom_pp_bubble_formula(c->stages, c->micro);
    loom_bench_print_load("before");
    for (int k = 0; k < c->rounds; k++) { /* the two sides alternate, each first in turn */
        int ok = k % 2 ? run_config(c, n, x) && run_config(c, 1, &y) : run_config(c, 1, &y) && run_config(c, n, x);
        if (!ok) {
            fprintf(stderr, "loom bench dist: a pipeline run failed (see above)\n");
            return 1;
        }
        double tx = 0, tb = 0;
        bub[k] = 0;
        for (int r = 0; r < n; r++) bub[k] += x[r].bubble / n;
        rel[k] = (bub[k] - formula) / formula;
        for (int r = 0; r < n; r++) tx = x[r].step_s > tx ? x[r].step_s : tx;
        for (int r = 0; r < n; r++) tb = best[r].step_s > tb ? best[r].step_s : tb;
        if (k == 0 || y.step_s < one.step_s) one = y;
        if (k == 0 || tx < tb)
            for (int r = 0; r < n; r++) best[r] = x[r];
    }
    loom_bench_print_load("after");
    double step = 0, bubble, blo, bhi, rmed, rlo, rhi;
    for (int r = 0; r < n; r++) step = best[r].step_s > step ? best[r].step_s : step;
    loom_bench_median(bub, c->rounds, &bubble, &blo, &bhi);
    loom_bench_median(rel, c->rounds, &rmed, &rlo, &rhi);
    double tok = (double)c->micro * c->batch * c->seq;
    printf("pp%d: %d micro-batches of %d x %d, %d stages over %d layers, %d rank(s) per stage\n", c->stages, c->micro, c->batch, c->seq, c->stages,
           c->layers, n / c->stages);
    printf("%-28s %9s %11s %9s %9s %10s %9s\n", "configuration", "step ms", "tokens/s", "bubble", "comm pp", "state MB", "peak MB");
    printf("1 process x %d threads %6s %9.1f %11.0f %9s %9s %10.1f %9.1f\n", n, "", 1e3 * one.step_s, tok / one.step_s, "-", "-", one.state_mb,
           one.rss_mb);
    print_ranks(c, best, n, tok);
    printf("pp%d: speed-up over one process %.3f (fastest rounds, same global batch; loss %.5f vs %.5f); measured bubble %.1f%% (mean over stages; "
           "median of %d rounds, %.1f-%.1f%%) vs the 1F1B formula (N-1)/(M+N-1) = %.1f%%: %+.1f%% relative (%+.1f to %+.1f%%; goal within 10%%)\n",
           c->stages, one.step_s / step, best[n - 1].loss, one.loss, 100 * bubble, c->rounds, 100 * blo, 100 * bhi, 100 * formula, 100 * rmed,
           100 * rlo, 100 * rhi);
    return 0;
}
