/* The per-step prefill budget (serve/step_budget.h) against a cost model
 * the test controls (no clock): a step of d decode and p prefill rows takes
 * a + b*d + c*p seconds. The budget must settle where a step with prompt
 * rows takes about twice a decode-only step (p = a / c for ratio 1), follow
 * a change of c, keep min_rows when rows are dear, give the whole cap when
 * nothing decodes or nothing is learned, and ignore non-positive times. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "serve/step_budget.h"

typedef struct {
    double a, b, c;
} cost_t;

static double cost(const cost_t *m, int d, int p) { return m->a + m->b * d + m->c * p; }

/* n steps of d decodes with as many prompt rows as the budget allows. */
static int run(loom_step_budget_t *bg, const cost_t *m, int d, int n) {
    int p = 0;
    for (int i = 0; i < n; i++) {
        loom_step_budget_observe(bg, d, 0, cost(m, d, 0));
        p = loom_step_budget_prefill(bg, d);
        loom_step_budget_observe(bg, d, p, cost(m, d, p));
    }
    return p;
}

static void settles_at_one_decode_step(void) {
    loom_step_budget_t bg;
    loom_step_budget_init(&bg, 512);
    CHECK(loom_step_budget_prefill(&bg, 4) == 508, "nothing learned: %d rows, want the cap less the decodes (508)",
          loom_step_budget_prefill(&bg, 4));
    cost_t m = {0.010, 0.0001, 0.0002};
    int p = run(&bg, &m, 4, 40);
    double want = cost(&m, 4, 0) / m.c; /* 52 rows: what one decode step's time buys */
    CHECK(fabs(p - want) <= 1.0, "settled at %d prefill rows, want %.1f", p, want);
    double ratio = cost(&m, 4, p) / cost(&m, 4, 0);
    CHECK(ratio <= 2.02, "a step with prompt rows takes %.2fx a decode-only step, want at most 2", ratio);
}

static void follows_a_slower_machine(void) {
    loom_step_budget_t bg;
    loom_step_budget_init(&bg, 512);
    cost_t m = {0.010, 0.0001, 0.0002};
    int before = run(&bg, &m, 4, 40);
    m.c = 0.0004; /* prompt rows now cost twice as much */
    int after = run(&bg, &m, 4, 12);
    CHECK(abs(after - before / 2) <= 2, "%d rows before, %d after prompt rows got twice as dear (want about %d)", before,
          after, before / 2);
}

static void bounds(void) {
    loom_step_budget_t bg;
    loom_step_budget_init(&bg, 512);
    cost_t dear = {0.010, 0.0001, 0.01};
    CHECK(run(&bg, &dear, 4, 20) == 8, "dear rows: %d, want min_rows 8", loom_step_budget_prefill(&bg, 4));
    CHECK(loom_step_budget_prefill(&bg, 0) == 512, "nothing decoding: %d rows, want the cap 512", loom_step_budget_prefill(&bg, 0));
    CHECK(loom_step_budget_prefill(&bg, 500) == 8, "500 decodes: %d rows, want min_rows 8", loom_step_budget_prefill(&bg, 500));
    CHECK(loom_step_budget_prefill(&bg, 507) == 5, "507 decodes: %d rows, want what is left (5)", loom_step_budget_prefill(&bg, 507));
    CHECK(loom_step_budget_prefill(&bg, 512) == 0, "512 decodes: %d rows, want 0", loom_step_budget_prefill(&bg, 512));
    cost_t cheap = {0.010, 0.0001, 1e-7};
    CHECK(run(&bg, &cheap, 4, 40) == 508, "cheap rows: %d, want the cap less the decodes (508)", loom_step_budget_prefill(&bg, 4));
    loom_step_budget_t small;
    loom_step_budget_init(&small, 5);
    CHECK(small.min_rows == 5, "min_rows %d with a cap of 5", small.min_rows);
    double t = bg.t_decode, c = bg.c_prefill;
    loom_step_budget_observe(&bg, 4, 10, 0);
    loom_step_budget_observe(&bg, 4, 0, -1);
    CHECK(bg.t_decode == t && bg.c_prefill == c, "a step of 0 or -1 s changed what was learned");
}

/* ratio 4 buys four decode steps' time; ratio 0 (--prefill-ratio 0) lifts
 * the limit: the cap less the decodes whatever was learned. */
static void ratio_scales_and_zero_lifts(void) {
    loom_step_budget_t bg;
    loom_step_budget_init(&bg, 512);
    bg.ratio = 4;
    cost_t m = {0.010, 0.0001, 0.0002};
    int p = run(&bg, &m, 4, 40);
    double want = 4 * cost(&m, 4, 0) / m.c; /* 208 rows */
    CHECK(fabs(p - want) <= 2.0, "ratio 4 settled at %d prefill rows, want %.1f", p, want);
    bg.ratio = 0;
    CHECK(loom_step_budget_prefill(&bg, 4) == 508, "ratio 0: %d rows, want the cap less the decodes (508)",
          loom_step_budget_prefill(&bg, 4));
    CHECK(run(&bg, &m, 100, 10) == 412, "ratio 0 with 100 decodes: %d rows, want 412", loom_step_budget_prefill(&bg, 100));
}

int main(void) {
    RUN(settles_at_one_decode_step);
    RUN(ratio_scales_and_zero_lifts);
    RUN(follows_a_slower_machine);
    RUN(bounds);
    return check_main_end();
}
