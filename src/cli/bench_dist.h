/* bench_dist: what `loom bench dist`'s layouts share (cli/bench_dist.c
 * runs them; cli/bench_dist_tp.c is a tensor-parallel rank). */
#ifndef LOOM_BENCH_DIST_H
#define LOOM_BENCH_DIST_H

typedef struct {
    int layers, channels, heads, seq, batch, vocab, steps, warmup, zero;
    int grad_dtype; /* loom_dist_dtype */
    int tp;         /* > 0: every rank is a rank of a tensor-parallel group of tp (or the 1-rank baseline) */
    int dp;         /* with tp, > 1: the world is dp such groups, data-parallel replicas (rank = dp index x tp + tp index) */
    int micro;      /* ppN: micro-batches per step */
} bench_cfg_t;

/* One rank's measure, sent to the launcher through a pipe. */
typedef struct {
    double step_s, wait_s, loss, rss; /* rss: the largest rank's peak resident bytes */
    double state_mb;                  /* model state held (params, grads, AdamW), MB; 0 = not measured */
    int ok;
} bench_result_t;

/* The median and the range of n values (the per-round figures of a
 * shared machine: alternating rounds, the median read, the range shown). */
void loom_bench_median(const double *x, int n, double *med, double *lo, double *hi);
/* One line: the 1-, 5- and 15-minute load averages against the cores, so
 * a figure measured on a loaded machine says so. */
void loom_bench_print_load(const char *when);

/* A rank of --layout tpN: the world (launched by bench_dist.c) as one tp
 * group, or one rank with c->... threads: the global batch c->batch. */
bench_result_t loom_bench_dist_tp_rank(const bench_cfg_t *c, int threads);

#endif
