/* step_budget: the per-step prefill budget (see step_budget.h). */
#include "step_budget.h"

/* Weight of the newest step in the moving averages: a few steps follow a
 * change of load, one slow step (a descheduled thread) moves little. */
#define EMA 0.25

void loom_step_budget_init(loom_step_budget_t *b, int max_rows) {
    *b = (loom_step_budget_t){.max_rows = max_rows, .min_rows = max_rows < 8 ? max_rows : 8, .ratio = 1.0};
}

static void ema(double *avg, double x) { *avg = *avg > 0 ? (1 - EMA) * *avg + EMA * x : x; }

void loom_step_budget_observe(loom_step_budget_t *b, int decode_rows, int prefill_rows, double seconds) {
    if (seconds <= 0 || decode_rows + prefill_rows <= 0) return;
    if (prefill_rows == 0) {
        ema(&b->t_decode, seconds);
        return;
    }
    /* what the prefill rows added over the decode step beside them; alone,
     * they carry the step's fixed cost too (an overestimate, so a safe one) */
    double extra = decode_rows > 0 && b->t_decode > 0 ? seconds - b->t_decode : seconds;
    if (extra < 0) extra = 0;
    ema(&b->c_prefill, extra / prefill_rows);
}

int loom_step_budget_prefill(const loom_step_budget_t *b, int decode_rows) {
    int room = b->max_rows - decode_rows;
    if (room <= 0) return 0;
    if (decode_rows == 0 || b->ratio <= 0 || b->t_decode <= 0 || b->c_prefill <= 0) return room; /* ratio 0: no limit */
    double rows = b->ratio * b->t_decode / b->c_prefill;
    int n = rows >= room ? room : (int)rows;
    if (n < b->min_rows) n = b->min_rows < room ? b->min_rows : room;
    return n;
}
