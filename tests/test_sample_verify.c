/* Speculative sampling's verify rule (loom_sample_verify, model/generate.h)
 * keeps the target distribution: for fixed logits and a drafted token,
 * 20000 draws are tested with a chi-squared test (p = 0.001, fixed seeds,
 * so the result is the same on every run) against the distribution
 * computed here independently in double precision (softmax at the
 * temperature, then top-k, then the top-p prefix, renormalized), with the
 * draft the likeliest token, a middling one, an unlikely one and one
 * outside the kept set (never returned). Greedy returns the argmax
 * whatever the draft. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/generate.h"

#define V 8
static const float logits[V] = {1.0f, 2.0f, 0.5f, 1.5f, 0.0f, -0.5f, -1.0f, -3.0f};

/* The target distribution, independently: p (V). */
static void target(const loom_sampling_t *s, double *p) {
    int order[V];
    double mass = 0;
    for (int i = 0; i < V; i++) p[i] = exp((double)logits[i] / s->temperature), order[i] = i;
    for (int i = 0; i < V; i++) /* descending by probability */
        for (int j = i + 1; j < V; j++)
            if (p[order[j]] > p[order[i]]) {
                int t = order[i];
                order[i] = order[j], order[j] = t;
            }
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    for (int i = 0; i < keep; i++) mass += p[order[i]];
    if (s->top_p < 1) {
        double acc = 0;
        int n = 0;
        while (n < keep && acc < s->top_p * mass) acc += p[order[n++]];
        keep = n, mass = acc;
    }
    double q[V] = {0};
    for (int i = 0; i < keep; i++) q[order[i]] = p[order[i]] / mass;
    memcpy(p, q, sizeof q);
}

/* chi-squared critical values at p = 0.001 for 1..7 degrees of freedom */
static const double crit[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

static void check_case(const char *what, loom_sampling_t s, int draft, uint64_t seed) {
    double p[V];
    target(&s, p);
    int count[V] = {0}, N = 20000;
    float scratch[V];
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    for (int n = 0; n < N; n++) count[loom_sample_verify(logits, V, &s, &rng, scratch, draft)]++;
    double chi2 = 0;
    int cells = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            CHECK(count[i] == 0, "%s: token %d has probability 0 but was drawn %d times", what, i, count[i]);
            continue;
        }
        double want = p[i] * N;
        chi2 += (count[i] - want) * (count[i] - want) / want;
        cells++;
    }
    CHECK(cells >= 2 && chi2 < crit[cells - 1], "%s (draft %d): chi-squared %.2f over %d cells, critical %.2f", what, draft,
          chi2, cells, crit[cells - 1]);
}

static void plain_softmax(void) {
    loom_sampling_t s = {0.9f, 0, 1.0f};
    check_case("softmax, likeliest drafted", s, 1, 1);
    check_case("softmax, middling drafted", s, 2, 2);
    check_case("softmax, unlikely drafted", s, 7, 3);
}

static void top_k_and_top_p(void) {
    loom_sampling_t k = {1.0f, 4, 1.0f};
    check_case("top_k 4, kept drafted", k, 0, 4);
    check_case("top_k 4, dropped drafted", k, 6, 5);
    loom_sampling_t pp = {1.0f, 0, 0.8f};
    check_case("top_p 0.8, kept drafted", pp, 3, 6);
    check_case("top_p 0.8, dropped drafted", pp, 7, 7);
}

static void greedy_ignores_draft(void) {
    loom_sampling_t s = {0, 0, 1.0f};
    float scratch[V];
    loom_rng_t rng;
    loom_rng_seed(&rng, 9);
    for (int d = -1; d < V; d++)
        CHECK(loom_sample_verify(logits, V, &s, &rng, scratch, d) == 1, "greedy with draft %d: not the argmax", d);
}

int main(void) {
    RUN(plain_softmax);
    RUN(top_k_and_top_p);
    RUN(greedy_ignores_draft);
    return check_main_end();
}
