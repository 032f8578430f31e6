/* bench_pp: `loom bench dist --layout ppN`: a pipeline of N ranks against
 * one process on the same global batch (the same micro-batches). */
#ifndef LOOM_BENCH_PP_H
#define LOOM_BENCH_PP_H

typedef struct {
    int layers, channels, heads, seq, batch, vocab, steps, warmup;
    int micro;  /* micro-batches per step (M) */
    int stages; /* N */
    int rounds; /* alternating rounds; the fastest of each configuration counts */
} loom_bench_pp_t;

/* Runs the comparison and prints its table; 0 on success, 1 when a run failed. */
int loom_bench_pp(const loom_bench_pp_t *c);

#endif
