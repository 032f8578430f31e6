/* Speculative sampling's verify rule (loom_sample_verify, model/generate.h)
 * keeps the target distribution: for fixed logits and a drafted token,
 * 20000 draws are tested with a chi-squared test (p = 0.001, fixed seeds,
 * so the result is the same on every run) against the distribution
 * computed here independently in double precision (softmax at the
 * temperature, then top-k, then the top-p prefix, renormalized), with the
 * draft the likeliest token, a middling one, an unlikely one and one
 * outside the kept set (never returned); and drafts drawn from a
 * distribution q of their own (a draft model's: loom_sample_verify_q, the
 * min(1, p/q) rule). Greedy returns the argmax whatever the draft. */
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

/* Pearson's statistic of N draws (count) against p over the cells p gives
 * mass to (their number in *cells); a draw where p is 0 fails at once. */
static double chi_squared(const char *what, const double *p, const int *count, int N, int *cells) {
    double chi2 = 0;
    *cells = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            CHECK(count[i] == 0, "%s: token %d has probability 0 but was drawn %d times", what, i, count[i]);
            continue;
        }
        double want = p[i] * N;
        chi2 += (count[i] - want) * (count[i] - want) / want;
        (*cells)++;
    }
    return chi2;
}

static void check_case(const char *what, loom_sampling_t s, int draft, uint64_t seed) {
    double p[V];
    target(&s, p);
    int count[V] = {0}, N = 20000;
    float scratch[V];
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    for (int n = 0; n < N; n++) count[loom_sample_verify(logits, V, &s, &rng, scratch, draft)]++;
    int cells = 0;
    double chi2 = chi_squared(what, p, count, N, &cells);
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

/* Drafts drawn from a distribution q of their own (a draft model's):
 * loom_sample_verify_q accepts with min(1, p/q), else draws from
 * max(0, p - q); the returned tokens follow p. q puts mass on tokens the
 * target drops (top_k) and misses some it keeps. */
static void check_case_q(const char *what, loom_sampling_t s, const double *qd, uint64_t seed) {
    double p[V];
    target(&s, p);
    float q[V], scratch[V];
    for (int i = 0; i < V; i++) q[i] = (float)qd[i];
    int count[V] = {0}, N = 20000, accepted = 0;
    loom_rng_t rng, drng;
    loom_rng_seed(&rng, seed);
    loom_rng_seed(&drng, seed + 100);
    for (int n = 0; n < N; n++) {
        double u = loom_rng_uniform(&drng), acc = 0;
        int d = 0;
        while (d < V - 1 && u >= (acc += qd[d])) d++;
        int tok = loom_sample_verify_q(logits, V, &s, &rng, scratch, d, q);
        count[tok]++, accepted += tok == d;
    }
    int cells = 0;
    double chi2 = chi_squared(what, p, count, N, &cells);
    double want_acc = 0; /* sum of min(p, q): the accept rate */
    for (int i = 0; i < V; i++) want_acc += fmin(p[i], qd[i]);
    printf("  %s: accepted %.3f (sum of min(p, q) %.3f), chi-squared %.2f over %d cells\n", what, (double)accepted / N,
           want_acc, chi2, cells);
    CHECK(cells >= 2 && chi2 < crit[cells - 1], "%s: chi-squared %.2f over %d cells, critical %.2f", what, chi2, cells,
          crit[cells - 1]);
    /* the accept rate is a binomial proportion around sum min(p, q): within 5 standard errors */
    double se = sqrt(want_acc * (1 - want_acc) / N);
    CHECK(fabs((double)accepted / N - want_acc) <= 5 * se + 1e-9, "%s: accepted %.4f, sum of min(p, q) %.4f (5 standard errors %.4f)",
          what, (double)accepted / N, want_acc, 5 * se);
}

static void drafts_from_q(void) {
    static const double q1[V] = {0.05, 0.10, 0.30, 0.05, 0.20, 0.10, 0.15, 0.05};
    static const double q2[V] = {0.00, 0.60, 0.00, 0.00, 0.00, 0.00, 0.40, 0.00};
    loom_sampling_t s = {0.9f, 0, 1.0f}, k = {1.0f, 4, 1.0f};
    check_case_q("softmax, q spread", s, q1, 11);
    check_case_q("top_k 4, q spread", k, q1, 12);
    check_case_q("top_k 4, q on the likeliest and a dropped token", k, q2, 13);
    /* loom_sample_probs writes the distribution it draws from: p itself */
    double p[V];
    target(&k, p);
    float q[V], scratch[2 * V];
    loom_rng_t rng;
    loom_rng_seed(&rng, 5);
    int tok = loom_sample_probs(logits, V, &k, &rng, scratch, q);
    double err = 0;
    for (int i = 0; i < V; i++) err = fmax(err, fabs(q[i] - p[i]));
    CHECK(err < 1e-6 && p[tok] > 0, "loom_sample_probs: distribution off by %.3g, token %d", err, tok);
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
    RUN(drafts_from_q);
    RUN(greedy_ignores_draft);
    return check_main_end();
}
