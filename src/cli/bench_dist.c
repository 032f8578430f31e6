/* loom bench dist: distributed training layouts on this machine. For each
 * layout of --layout (a comma list: dp = data parallel at --zero, zero3 =
 * fully sharded), the same global batch runs as 1 rank x C threads and as
 * C ranks x 1 thread (ranks joined over TCP on 127.0.0.1, the --nproc
 * path), with communication overlapped with compute (gradient buckets
 * during backward; ZeRO-3 also prefetches the next block's weights) and
 * without. Prints the scaling efficiency (time of 1 rank / time of C
 * ranks, same work), the share of step time spent blocked on
 * communication and the peak resident memory per rank. Each configuration
 * runs in fresh processes so thread pools and sockets do not carry over. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/mem.h"
#include "parallel/dist.h"
#include "parallel/launch.h"
#include "model/gpt.h"
#include "train/step.h"
#include "cli/bench_dist.h"
#include "cli/bench_pp.h"

/* The layouts --layout names, parsed in one place (parse_layouts). zero:
 * the ZeRO stage, -1 = --zero's; tp: tensor-parallel ranks (0 = none); pp:
 * pipeline stages (0 = none; cli/bench_pp.h). */
typedef struct {
    const char *name, *what;
    int zero, tp, pp;
} bench_layout_t;
static const bench_layout_t layouts[] = {
    {"dp", "data parallel at --zero", -1, 0, 0},
    {"zero3", "fully sharded data parallel (ZeRO-3)", 3, 0, 0},
    {"tp2", "tensor parallel over 2 ranks", -1, 2, 0},
    {"tp4", "tensor parallel over 4 ranks", -1, 4, 0},
    {"pp2", "a pipeline of 2 stages (1F1B over --micro-batches)", -1, 0, 2},
    {"pp4", "a pipeline of 4 stages (1F1B over --micro-batches)", -1, 0, 4},
};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))
#define MAX_LAYOUTS 8

/* "zero3,dp" -> indices into layouts[]; an unknown name is an error that lists the known ones. */
static loom_status parse_layouts(const char *list, int *out, int *n) {
    char buf[256], known[256] = "";
    snprintf(buf, sizeof buf, "%s", list);
    for (int i = 0, k = 0; i < N_LAYOUTS; i++) k += snprintf(known + k, sizeof known - (size_t)k, "%s%s", i ? ", " : "", layouts[i].name);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < N_LAYOUTS && strcmp(layouts[i].name, t) != 0) i++;
        if (i == N_LAYOUTS) return loom_error(LOOM_EINVAL, "--layout %s: unknown layout '%s'; known: %s", list, t, known);
        if (*n == MAX_LAYOUTS) return loom_error(LOOM_EINVAL, "--layout %s: at most %d layouts", list, MAX_LAYOUTS);
        out[(*n)++] = i;
    }
    if (!*n) return loom_error(LOOM_EINVAL, "--layout '%s': name at least one layout (%s)", list, known);
    return LOOM_OK;
}

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
    else res = (bench_result_t){tsum / c->steps, wsum / c->steps, loss, loom_mem_peak_rss(), 0, 1};
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
    if (a->c->tp) {
        bench_result_t res = loom_bench_dist_tp_rank(a->c, a->threads);
        if (write(a->fd, &res, sizeof res) != (ssize_t)sizeof res) res.ok = 0;
        return res.ok ? 0 : 1;
    }
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
        if (x.rss > r0.rss) r0.rss = x.rss;
        r0.wait_s += x.wait_s / world;
        r0.loss = x.loss;
        if (x.state_mb > r0.state_mb) r0.state_mb = x.state_mb;
    }
    close(p[0]);
    r0.ok = ok;
    return r0;
}

/* --layout tpN: N ranks, one tensor-parallel group, every rank the whole
 * global batch (ranks x --batch, as the dp table's), against 1 rank x N
 * threads; the fastest of the rounds. */
static int bench_tp(bench_cfg_t c, int n, int ranks, int rounds) {
    bench_result_t one = {0}, tp = {0};
    if (c.heads % n) {
        fprintf(stderr, "loom bench dist: --layout tp%d: --heads %d does not split over %d ranks\n", n, c.heads, n);
        return 1;
    }
    c.batch *= ranks;
    c.tp = n;
    for (int k = 0; k < rounds; k++) {
        bench_result_t x = run_config(&c, 1, n, 0), y = run_config(&c, n, 1, 0);
        if (!x.ok || !y.ok) {
            fprintf(stderr, "loom bench dist: a tp%d run failed (see above)\n", n);
            return 1;
        }
        if (k == 0 || x.step_s < one.step_s) one = x;
        if (k == 0 || y.step_s < tp.step_s) tp = y;
    }
    double tok = (double)c.batch * c.seq;
    printf("%-26s %9s %11s %10s %14s %12s %9s\n", "tp (same global batch)", "step ms", "tokens/s", "tp wait", "state MB/rank",
           "peak RSS MB", "loss");
    printf("1 rank x %d threads %7s %9.1f %11.0f %10s %14.1f %12.1f %9.5f\n", n, "", 1e3 * one.step_s, tok / one.step_s, "-",
           one.state_mb, one.rss / 1e6, one.loss);
    printf("tp%d: %d ranks x 1 thread %3s %9.1f %11.0f %9.1f%% %14.1f %12.1f %9.5f\n", n, n, "", 1e3 * tp.step_s,
           tok / tp.step_s, 100 * tp.wait_s / tp.step_s, tp.state_mb, tp.rss / 1e6, tp.loss);
    printf("tp%d: step time %.2fx one rank's; %.1f ms of each step waiting on the tp group's all-reduces\n", n,
           tp.step_s / one.step_s, 1e3 * tp.wait_s);
    return 0;
}

/* One layout: alternating rounds of 1 rank x `ranks` threads, `ranks`
 * ranks overlapped and not, the fastest round of each counted (other load
 * on a shared machine only ever slows a round down); then its table. */
static int bench_layout(bench_cfg_t c, const bench_layout_t *lay, int ranks, int rounds) {
    if (lay->tp) return bench_tp(c, lay->tp, ranks, rounds);
    if (lay->pp) {
        if (lay->pp > c.layers) {
            fprintf(stderr, "loom bench dist: --layout %s: %d stages need at least %d layers (--layers %d)\n", lay->name, lay->pp, lay->pp, c.layers);
            return 1;
        }
        loom_bench_pp_t p = {.layers = c.layers, .channels = c.channels, .heads = c.heads, .seq = c.seq, .batch = c.batch,
                             .vocab = c.vocab, .steps = c.steps, .warmup = c.warmup, .micro = c.micro, .stages = lay->pp, .rounds = rounds};
        printf("\nlayout %s: %s\n", lay->name, lay->what);
        return loom_bench_pp(&p);
    }
    if (lay->zero >= 0) c.zero = lay->zero;
    int B = c.batch;
    bench_result_t one = {0}, ov = {0}, no = {0};
    for (int k = 0; k < rounds; k++) {
        c.batch = ranks * B;
        bench_result_t x = run_config(&c, 1, ranks, 1);
        c.batch = B;
        bench_result_t y = run_config(&c, ranks, 1, 1);
        bench_result_t z = run_config(&c, ranks, 1, 0);
        if (!x.ok || !y.ok || !z.ok) {
            fprintf(stderr, "loom bench dist: a run of layout %s failed (see above)\n", lay->name);
            return 1;
        }
        if (k == 0 || x.step_s < one.step_s) one = x;
        if (k == 0 || y.step_s < ov.step_s) ov = y;
        if (k == 0 || z.step_s < no.step_s) no = z;
    }
    double tok = (double)ranks * B * c.seq;
    const char *ovname = c.zero == 3 ? "prefetch" : "overlapped", *noname = c.zero == 3 ? "no prefetch" : "after backward";
    printf("\nlayout %s: %s, ZeRO-%d\n", lay->name, lay->what, c.zero);
    printf("%-36s %9s %11s %10s %12s %9s\n", "configuration", "step ms", "tokens/s", "comm wait", "peak RSS MB", "loss");
    printf("1 rank x %d threads %17s %9.1f %11.0f %10s %12.1f %9.5f\n", ranks, "", 1e3 * one.step_s, tok / one.step_s, "-", one.rss / 1e6, one.loss);
    printf("%d ranks x 1 thread, %-15s %9.1f %11.0f %9.1f%% %12.1f %9.5f\n", ranks, ovname, 1e3 * ov.step_s, tok / ov.step_s,
           100 * ov.wait_s / ov.step_s, ov.rss / 1e6, ov.loss);
    printf("%d ranks x 1 thread, %-15s %9.1f %11.0f %9.1f%% %12.1f %9.5f\n", ranks, noname, 1e3 * no.step_s, tok / no.step_s,
           100 * no.wait_s / no.step_s, no.rss / 1e6, no.loss);
    printf("scaling efficiency (1-rank time / %d-rank time, same global batch): %s %.3f, %s %.3f (target >= %s)\n", ranks, ovname,
           one.step_s / ov.step_s, noname, one.step_s / no.step_s, c.zero == 3 ? "0.85 with prefetch" : "0.9");
    printf("communication wait share of step time: %s %.1f%%, %s %.1f%%\n", ovname, 100 * ov.wait_s / ov.step_s, noname,
           100 * no.wait_s / no.step_s);
    fflush(stdout);
    return 0;
}

int cmd_bench_dist(int argc, char **argv) {
    bench_cfg_t c = {0};
    int ranks = 0, rounds = 3, which[MAX_LAYOUTS], nl = 0;
    const char *layout_list = "dp";
    const loom_arg_t args[] = {
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
        {"layout", ARG_STR, &layout_list, "dp", 0, 0, "layouts to measure, a comma list: dp (data parallel at --zero), zero3, tp2, tp4 (tensor parallel), pp2, pp4 (pipeline)"},
        {"micro-batches", ARG_INT, &c.micro, "8", 1, 4096, "micro-batches per step of the ppN layouts (the pipeline's M; --batch each)"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("bench dist", "loom bench dist [--ranks N] [model flags]", args, argc, argv);
    if (ranks == 0) ranks = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ranks < 2) ranks = 2;
    if (parse_layouts(layout_list, which, &nl) != LOOM_OK) {
        fprintf(stderr, "loom bench dist: %s\n", loom_errmsg());
        return 2;
    }
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
    printf("loom bench dist: %d layers x %d channels (%.1fM parameters), seq %d, global batch %d x %d tokens, %d timed steps; ranks over TCP on 127.0.0.1\n",
           c.layers, c.channels, loom_gpt_num_params(&cfg) / 1e6, c.seq, ranks * c.batch, c.seq, c.steps);
    fflush(stdout);
    for (int i = 0; i < nl; i++)
        if (bench_layout(c, &layouts[which[i]], ranks, rounds)) return 1;
    return 0;
}
