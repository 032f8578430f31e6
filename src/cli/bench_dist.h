/* bench_dist: what `loom bench dist`'s layouts share (cli/bench_dist.c
 * runs them; cli/bench_dist_tp.c is a tensor-parallel rank). */
#ifndef LOOM_BENCH_DIST_H
#define LOOM_BENCH_DIST_H

typedef struct {
    int layers, channels, heads, seq, batch, vocab, steps, warmup, zero;
    int grad_dtype; /* loom_dist_dtype */
    int tp;         /* > 0: every rank is a rank of one tensor-parallel group (or the 1-rank baseline) */
    int micro;      /* ppN: micro-batches per step */
} bench_cfg_t;

/* One rank's measure, sent to the launcher through a pipe. */
typedef struct {
    double step_s, wait_s, loss, rss; /* rss: the largest rank's peak resident bytes */
    double state_mb;                  /* model state held (params, grads, AdamW), MB; 0 = not measured */
    int ok;
} bench_result_t;

/* A rank of --layout tpN: the world (launched by bench_dist.c) as one tp
 * group, or one rank with c->... threads: the global batch c->batch. */
bench_result_t loom_bench_dist_tp_rank(const bench_cfg_t *c, int threads);

#endif
