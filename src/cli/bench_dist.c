/* loom bench dist: data-parallel scaling on this machine. The same global
 * batch runs as 1 rank x C threads and as C ranks x 1 thread (ranks joined
 * over TCP on 127.0.0.1, the --nproc path), with gradient reduction
 * overlapped with backward and after it. Prints the scaling efficiency
 * (time of 1 rank / time of C ranks, same work) and the share of step time
 * spent blocked on communication. Each configuration runs in fresh
 * processes so thread pools and sockets do not carry over. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/bench_pp.h"
#include "cli/commands.h"
#include "parallel/dist.h"
#include "parallel/launch.h"
#include "model/gpt.h"
#include "train/step.h"

typedef struct {
    int layers, channels, heads, seq, batch, vocab, steps, warmup, zero;
    int grad_dtype; /* loom_dist_dtype */
} bench_cfg_t;

typedef struct {
    double step_s, wait_s, loss;
    int ok;
} bench_result_t;

/* One rank's part, in a rank the launcher forked (its RANK/WORLD_SIZE
 * environment set); the result goes back through `fd`. */
static int run_rank(const bench_cfg_t *c, int rank, int world, int threads, int overlap, int fd) {
    bench_result_t res = {0};
    loom_log_quiet(1);
    loom_dist_t *d = NULL;
    const loom_backend_t *be;
    loom_gpt_t *m = NULL;
    loom_dp_t *dp = NULL;
    loom_dist_opts_t dopt = {.transport = world > 1 ? "tcp" : "single", .timeout_s = 120};
    loom_gpt_config_t cfg = {.max_seq_len = c->seq, .vocab_size = c->vocab, .n_layer = c->layers, .n_head = c->heads, .channels = c->channels};
    int B = c->batch, T = c->seq;
    loom_dp_opts_t dpo = {.zero = c->zero, .overlap = overlap,
                          .grad_dtype = (loom_dist_dtype)c->grad_dtype};
    if (loom_dist_init(&d, &dopt) != LOOM_OK || loom_backend_cpu_init(&be, threads) != LOOM_OK ||
        loom_gpt_config_finish(&cfg) != LOOM_OK || loom_gpt_init(&m, &cfg, be, 7) != LOOM_OK ||
        loom_gpt_alloc_acts(m, B, T) != LOOM_OK || (world > 1 && loom_dp_init(&dp, m, d, &dpo) != LOOM_OK)) {
        fprintf(stderr, "loom bench dist: rank %d: %s\n", rank, loom_errmsg());
        goto out;
    }
    /* The global batch: world*B sequences from one seeded stream; this
     * rank takes its contiguous slice. */
    size_t gtok = (size_t)c->batch * (world > 1 ? (size_t)world : 1) * T + 1;
    int *all = loom_malloc(gtok * sizeof(int));
    loom_rng_t rng;
    loom_rng_seed(&rng, 11);
    for (size_t i = 0; i < gtok; i++) all[i] = (int)(loom_rng_u64(&rng) % (uint64_t)c->vocab);
    const int *in = all + (size_t)rank * B * T, *tg = in + 1;
    loom_optim_t opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};
    double tsum = 0, wsum = 0;
    float loss = 0, norm;
    int s;
    for (s = 0; s < c->warmup + c->steps; s++) {
        double t0 = loom_now();
        if (loom_train_step_dp(m, dp, in, tg, B, T, 1, &opt, 1e-4f, s + 1, &loss, &norm) != LOOM_OK) break;
        if (s >= c->warmup) {
            tsum += loom_now() - t0;
            wsum += loom_dp_last_wait(dp);
        }
    }
    free(all);
    if (s < c->warmup + c->steps) fprintf(stderr, "loom bench dist: rank %d: %s\n", rank, loom_errmsg());
    else res = (bench_result_t){tsum / c->steps, wsum / c->steps, loss, 1};
out:
    if (write(fd, &res, sizeof res) != (ssize_t)sizeof res) res.ok = 0;
    loom_dp_free(dp);
    loom_gpt_free(m);
    if (res.ok) loom_dist_free(d);
    return res.ok ? 0 : 1;
}

typedef struct {
    const bench_cfg_t *c;
    int world, threads, overlap, fd;
} rank_args_t;

static int rank_main(int rank, void *ctx) {
    const rank_args_t *a = ctx;
    return run_rank(a->c, rank, a->world, a->threads, a->overlap, a->fd);
}

/* Run one configuration in fresh processes (parallel/launch.h); the slowest
 * rank's step time (it sets the pace) and the mean communication wait. */
static bench_result_t run_config(const bench_cfg_t *c, int world, int threads, int overlap) {
    int p[2];
    bench_result_t r0 = {0};
    if (pipe(p) != 0) return r0;
    rank_args_t a = {c, world, threads, overlap, p[1]};
    loom_launch_t l = {.what = "loom bench dist", .nproc = world, .kill_after_s = 130, .run = rank_main, .ctx = &a};
    int code;
    loom_status s = loom_launch_local(&l, &code);
    close(p[1]);
    if (s != LOOM_OK) fprintf(stderr, "loom bench dist: %s\n", loom_errmsg());
    int ok = s == LOOM_OK && code == 0;
    /* Every rank wrote its result before it exited; the pipe holds them. */
    for (int r = 0; r < world; r++) {
        bench_result_t x;
        if (read(p[0], &x, sizeof x) != (ssize_t)sizeof x || !x.ok) {
            ok = 0;
            continue;
        }
        if (x.step_s > r0.step_s) r0.step_s = x.step_s;
        r0.wait_s += x.wait_s / world;
        r0.loss = x.loss;
    }
    close(p[0]);
    r0.ok = ok;
    return r0;
}

/* --layout ppN: the pipeline comparison (cli/bench_pp.h) on the same model flags. */
static int bench_layout_pp(const bench_cfg_t *c, const char *name, int micro, int rounds) {
    char *end;
    long n = strtol(name + 2, &end, 10);
    if (*end || n < 2 || n > 64 || n > c->layers) {
        fprintf(stderr, "loom bench dist: --layout %s: ppN takes 2 <= N <= 64 stages and at most --layers (%d)\n", name, c->layers);
        return 2;
    }
    loom_bench_pp_t p = {.layers = c->layers, .channels = c->channels, .heads = c->heads, .seq = c->seq, .batch = c->batch,
                         .vocab = c->vocab, .steps = c->steps, .warmup = c->warmup, .micro = micro, .stages = (int)n, .rounds = rounds};
    return loom_bench_pp(&p);
}

int cmd_bench_dist(int argc, char **argv) {
    bench_cfg_t c;
    int ranks = 0, rounds = 3, micro = 8;
    const char *layout = "dp";
    const loom_arg_t args[] = {
        {"layout", ARG_STR, &layout, "dp", 0, 0, "comma-separated layouts to measure: dp (data parallel over --ranks), ppN (a pipeline of N stages, --micro-batches)"},
        {"micro-batches", ARG_INT, &micro, "8", 1, 4096, "micro-batches per step for ppN (the pipeline's M)"},
        {"ranks", ARG_INT, &ranks, "0", 0, 64, "ranks to compare against one rank with as many threads (0 = the core count)"},
        {"layers", ARG_INT, &c.layers, "4", 1, 64, "model layers"},
        {"channels", ARG_INT, &c.channels, "256", 16, 8192, "model width"},
        {"heads", ARG_INT, &c.heads, "4", 1, 64, "attention heads"},
        loom_flag_default(LOOM_FLAG_SEQ, &c.seq, "128"),
        loom_flag(LOOM_FLAG_BATCH, &c.batch), /* per rank; the 1-rank run takes ranks x this */
        {"vocab", ARG_INT, &c.vocab, "4096", 64, 1 << 20, "vocabulary size"},
        {"steps", ARG_INT, &c.steps, "3", 1, 100000, "timed steps per round"},
        {"warmup", ARG_INT, &c.warmup, "1", 0, 1000, "untimed steps first"},
        {"rounds", ARG_INT, &rounds, "3", 1, 100, "rounds, the configurations alternating; the fastest round of each counts"},
        loom_flag(LOOM_FLAG_ZERO, &c.zero),
        loom_flag(LOOM_FLAG_GRAD_DTYPE, &c.grad_dtype),
    };
    LOOM_ARGS_PARSE_OR_RETURN("bench dist", "loom bench dist [--ranks N] [model flags]", args, argc, argv);
    if (ranks == 0) ranks = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ranks < 2) ranks = 2;
    if (c.seq < 1) {
        fprintf(stderr, "loom bench dist: --seq 0: the benchmark's model has no preset context; give a length, e.g. --seq 128\n");
        return 2;
    }
    if (c.channels % c.heads) {
        fprintf(stderr, "loom bench dist: --channels %d is not a multiple of --heads %d\n", c.channels, c.heads);
        return 2;
    }
    loom_gpt_config_t cfg = {.max_seq_len = c.seq, .vocab_size = c.vocab, .n_layer = c.layers, .n_head = c.heads, .channels = c.channels};
    loom_gpt_config_finish(&cfg);
    char list[256];
    snprintf(list, sizeof list, "%s", layout);
    int rc = 0, dp = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save)) {
        if (!strcmp(name, "dp")) dp = 1;
        else if (!strncmp(name, "pp", 2)) rc = bench_layout_pp(&c, name, micro, rounds);
        else rc = (fprintf(stderr, "loom bench dist: --layout %s: unknown; use dp or ppN (e.g. pp2)\n", name), 2);
    }
    if (rc || !dp) return rc;
    printf("loom bench dist: %d layers x %d channels (%.1fM parameters), seq %d, global batch %d x %d tokens, %d timed steps; ranks over TCP on 127.0.0.1\n",
           c.layers, c.channels, loom_gpt_num_params(&cfg) / 1e6, c.seq, ranks * c.batch, c.seq, c.steps);
    fflush(stdout);
    int B = c.batch;
    bench_result_t one = {0}, ov = {0}, no = {0};
    /* Alternating rounds, fastest of each: other load on a shared machine
     * only ever slows a round down. */
    for (int k = 0; k < rounds; k++) {
        c.batch = ranks * B;
        bench_result_t x = run_config(&c, 1, ranks, 1);
        c.batch = B;
        bench_result_t y = run_config(&c, ranks, 1, 1);
        bench_result_t z = run_config(&c, ranks, 1, 0);
        if (!x.ok || !y.ok || !z.ok) {
            fprintf(stderr, "loom bench dist: a run failed (see above)\n");
            return 1;
        }
        if (k == 0 || x.step_s < one.step_s) one = x;
        if (k == 0 || y.step_s < ov.step_s) ov = y;
        if (k == 0 || z.step_s < no.step_s) no = z;
    }
    double tok = (double)ranks * B * c.seq;
    printf("%-34s %9s %11s %10s %9s\n", "configuration", "step ms", "tokens/s", "comm wait", "loss");
    printf("1 rank x %d threads %15s %9.1f %11.0f %10s %9.5f\n", ranks, "", 1e3 * one.step_s, tok / one.step_s, "-", one.loss);
    printf("%d ranks x 1 thread, overlapped %4s %9.1f %11.0f %9.1f%% %9.5f\n", ranks, "", 1e3 * ov.step_s, tok / ov.step_s, 100 * ov.wait_s / ov.step_s, ov.loss);
    printf("%d ranks x 1 thread, after backward %9.1f %11.0f %9.1f%% %9.5f\n", ranks, 1e3 * no.step_s, tok / no.step_s, 100 * no.wait_s / no.step_s, no.loss);
    printf("scaling efficiency (1-rank time / %d-rank time, same global batch): overlapped %.3f, after backward %.3f (target >= 0.9)\n",
           ranks, one.step_s / ov.step_s, one.step_s / no.step_s);
    printf("communication wait share of step time: overlapped %.1f%%, after backward %.1f%% (target < 5%% overlapped)\n",
           100 * ov.wait_s / ov.step_s, 100 * no.wait_s / no.step_s);
    return 0;
}
