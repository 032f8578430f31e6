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
#include <math.h>
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
    int zero, tp, pp, dp; /* dp: data-parallel replicas of a tp layout (0 = none) */
} bench_layout_t;
static const bench_layout_t layouts[] = {
    {"dp", "data parallel at --zero", -1, 0, 0, 0},
    {"zero3", "fully sharded data parallel (ZeRO-3)", 3, 0, 0, 0},
    {"tp2", "tensor parallel over 2 ranks", -1, 2, 0, 0},
    {"tp4", "tensor parallel over 4 ranks", -1, 4, 0, 0},
    {"tp2xdp2", "two data-parallel replicas of a tensor-parallel group of 2 ranks (4 ranks)", -1, 2, 0, 2},
    {"pp2", "a pipeline of 2 stages (1F1B over --micro-batches)", -1, 0, 2, 0},
    {"pp4", "a pipeline of 4 stages (1F1B over --micro-batches)", -1, 0, 4, 0},
    {"pp2xtp2", "a pipeline of 2 stages, each a tensor-parallel group of 2 ranks (4 ranks)", -1, 2, 2, 0},
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
static int bench_tp(bench_cfg_t c, int n, int dp, int ranks, int rounds) {
    bench_result_t one = {0}, tp = {0};
    int w = n * (dp > 1 ? dp : 1); /* the ranks; the baseline has as many threads */
    if (c.heads % n) {
        fprintf(stderr, "loom bench dist: --layout tp%d: --heads %d does not split over %d ranks\n", n, c.heads, n);
        return 1;
    }
    c.batch *= ranks * (dp > 1 ? dp : 1);
    c.tp = n;
    c.dp = dp;
    for (int k = 0; k < rounds; k++) {
        bench_result_t x = run_config(&c, 1, w, 0), y = run_config(&c, w, 1, 0);
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
    printf("1 rank x %d threads %7s %9.1f %11.0f %10s %14.1f %12.1f %9.5f\n", w, "", 1e3 * one.step_s, tok / one.step_s, "-",
           one.state_mb, one.rss / 1e6, one.loss);
    char nm[32];
    snprintf(nm, sizeof nm, dp > 1 ? "tp%dxdp%d" : "tp%d", n, dp);
    printf("%s: %d ranks x 1 thread %3s %9.1f %11.0f %9.1f%% %14.1f %12.1f %9.5f\n", nm, w, "", 1e3 * tp.step_s,
           tok / tp.step_s, 100 * tp.wait_s / tp.step_s, tp.state_mb, tp.rss / 1e6, tp.loss);
    printf("%s: step time %.2fx one rank's; %.1f ms of each step waiting on the tp group's all-reduces%s\n", nm,
           tp.step_s / one.step_s, 1e3 * tp.wait_s, dp > 1 ? " and the dp group's gradient average" : "");
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void loom_bench_median(const double *x, int n, double *med, double *lo, double *hi) {
    double s[n > 0 ? n : 1];
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    *lo = s[0];
    *hi = s[n - 1];
}

void loom_bench_print_load(const char *when) {
    double l[3] = {0};
    if (getloadavg(l, 3) == 3)
        printf("load average %s: %.2f %.2f %.2f on %ld cores%s\n", when, l[0], l[1], l[2], sysconf(_SC_NPROCESSORS_ONLN),
               l[0] > (double)sysconf(_SC_NPROCESSORS_ONLN) ? " (LOADED: other processes share the cores; the ratios below are not this code's)" : "");
    fflush(stdout);
}

/* Median (min-max) of the per-round ratios, printed. */
static void print_ratio(const char *what, const double *r, int n) {
    double med, lo, hi;
    loom_bench_median(r, n, &med, &lo, &hi);
    printf(" %s %.3f (%.3f-%.3f)", what, med, lo, hi);
}

/* Scaling efficiency (docs/dist.md, "Measuring scaling"): step time of one
 * process with all `ranks` cores on the global batch / step time of
 * `ranks` ranks x 1 thread on the same global batch -- the same work on
 * the same cores, so 1.0 is perfect scaling and what is lost is the cost
 * of distributing it. Each round runs the three configurations back to
 * back and gives one ratio per side pair; the median of the rounds is the
 * figure, their range beside it. */
static void print_efficiency(const double *one, const double *ov, const double *no, int rounds, int ranks, int zero3,
                             const char *ovname, const char *noname) {
    double ro[rounds], rn[rounds];
    for (int k = 0; k < rounds; k++) ro[k] = one[k] / ov[k], rn[k] = one[k] / no[k];
    printf("scaling efficiency (1 rank x %d threads / %d ranks x 1 thread, same global batch; median (min-max) of %d alternating rounds):", ranks,
           ranks, rounds);
    print_ratio(ovname, ro, rounds);
    print_ratio(noname, rn, rounds);
    printf(" (target >= %s)\n", zero3 ? "0.85 with prefetch" : "0.9");
}

/* One layout: alternating rounds of 1 rank x `ranks` threads, `ranks`
 * ranks overlapped and not; the table shows each configuration's median
 * round (min-max beside the step time), the efficiency the per-round
 * ratios' median. */
static int bench_layout(bench_cfg_t c, const bench_layout_t *lay, int ranks, int rounds) {
    if (lay->tp && !lay->pp) return bench_tp(c, lay->tp, lay->dp, ranks, rounds);
    if (lay->pp) {
        if (lay->pp > c.layers) {
            fprintf(stderr, "loom bench dist: --layout %s: %d stages need at least %d layers (--layers %d)\n", lay->name, lay->pp, lay->pp, c.layers);
            return 1;
        }
        loom_bench_pp_t p = {.layers = c.layers, .channels = c.channels, .heads = c.heads, .seq = c.seq, .batch = c.batch,
                             .vocab = c.vocab, .steps = c.steps, .warmup = c.warmup, .micro = c.micro, .stages = lay->pp, .tp = lay->tp, .rounds = rounds};
        printf("\nlayout %s: %s\n", lay->name, lay->what);
        return loom_bench_pp(&p);
    }
    if (lay->zero >= 0) c.zero = lay->zero;
    int B = c.batch;
    bench_result_t r[3][rounds];
    double t[3][rounds];
    const char *ovname = c.zero == 3 ? "prefetch" : "overlapped", *noname = c.zero == 3 ? "no prefetch" : "after backward";
    printf("\nlayout %s: %s, ZeRO-%d\n", lay->name, lay->what, c.zero);
    loom_bench_print_load("before");
    for (int k = 0; k < rounds; k++) { /* the sides alternate within each round, in turn first */
        for (int j = 0; j < 3; j++) {
            int q = (j + k) % 3;
            c.batch = q == 0 ? ranks * B : B;
            r[q][k] = run_config(&c, q == 0 ? 1 : ranks, q == 0 ? ranks : 1, q != 2);
            if (!r[q][k].ok) {
                fprintf(stderr, "loom bench dist: a run of layout %s failed (see above)\n", lay->name);
                return 1;
            }
            t[q][k] = r[q][k].step_s;
        }
    }
    loom_bench_print_load("after");
    double tok = (double)ranks * B * c.seq;
    const char *name[3] = {"", ovname, noname};
    printf("%-36s %9s %17s %11s %10s %12s %9s\n", "configuration (median round)", "step ms", "(min-max)", "tokens/s", "comm wait", "peak RSS MB", "loss");
    for (int q = 0; q < 3; q++) {
        double med, lo, hi;
        loom_bench_median(t[q], rounds, &med, &lo, &hi);
        int at = 0; /* the round whose step is the median's (or nearest) */
        for (int k = 1; k < rounds; k++) at = fabs(t[q][k] - med) < fabs(t[q][at] - med) ? k : at;
        const bench_result_t *x = &r[q][at];
        char conf[64], wait[16] = "-";
        if (q == 0) snprintf(conf, sizeof conf, "1 rank x %d threads", ranks);
        else snprintf(conf, sizeof conf, "%d ranks x 1 thread, %s", ranks, name[q]);
        if (q) snprintf(wait, sizeof wait, "%.1f%%", 100 * x->wait_s / x->step_s);
        printf("%-36s %9.1f %8.1f-%-8.1f %11.0f %10s %12.1f %9.5f\n", conf, 1e3 * med, 1e3 * lo, 1e3 * hi, tok / med, wait, x->rss / 1e6, x->loss);
    }
    print_efficiency(t[0], t[1], t[2], rounds, ranks, c.zero == 3, ovname, noname);
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
        {"rounds", ARG_INT, &rounds, "3", 1, 100, "rounds, the configurations alternating (each side first in turn); medians and min-max are printed"},
        loom_flag(LOOM_FLAG_ZERO, &c.zero),
        loom_flag(LOOM_FLAG_GRAD_DTYPE, &c.grad_dtype),
        {"layout", ARG_STR, &layout_list, "dp", 0, 0, "layouts to measure, a comma list: dp (data parallel at --zero), zero3, tp2, tp4 (tensor parallel), tp2xdp2, pp2, pp4 (pipeline), pp2xtp2 (pipeline stages of tp groups)"},
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
