/* step_budget: how many prompt (prefill) rows one engine step may take so
 * that running sequences keep their decode pace while prompts arrive.
 *
 * A decode-only step costs about the same whatever arrives (reading the
 * weights once); every prefill row adds compute. The budget learns both
 * from the steps it is shown (exponential moving averages: the seconds of
 * a decode-only step, and the seconds one prefill row adds to a step) and
 * allows each step as many prefill rows as fit in `ratio` decode steps'
 * time, so a step with prompt work takes at most about (1 + ratio) times a
 * decode-only step and the inter-token latency stays steady. A long prompt
 * is thereby spread over several steps. It always allows min_rows (a
 * prompt makes progress, at the GEMM's crossover size), and the whole
 * step cap when nothing is decoding (nobody to keep waiting).
 *
 * Time comes in as numbers (observe's `seconds`), never read here: the
 * engine measures its steps, tests feed a cost model of their own. */
#ifndef LOOM_STEP_BUDGET_H
#define LOOM_STEP_BUDGET_H

typedef struct {
    int max_rows;     /* rows per step at most (the engine's max_batch_tokens) */
    int min_rows;     /* prefill rows a step may always take (default 8) */
    double ratio;     /* prefill time per step in decode-only steps (default 1; 0 = no limit) */
    double t_decode;  /* seconds of a decode-only step (moving average; 0 = none seen) */
    double c_prefill; /* seconds one prefill row adds to a step (moving average; 0 = none seen) */
} loom_step_budget_t;

/* Defaults: min_rows 8 (at most max_rows), ratio 1, nothing learned. */
void loom_step_budget_init(loom_step_budget_t *b, int max_rows);
/* A step of decode_rows single-row sequences and prefill_rows prompt rows
 * took `seconds`. */
void loom_step_budget_observe(loom_step_budget_t *b, int decode_rows, int prefill_rows, double seconds);
/* Prefill rows the next step may take beside decode_rows decode rows:
 * max_rows - decode_rows when nothing decodes, ratio is 0 or nothing is
 * learned yet,
 * else ratio * t_decode / c_prefill within [min_rows, max_rows - decode_rows]
 * (never below 0). */
int loom_step_budget_prefill(const loom_step_budget_t *b, int decode_rows);

#endif
