#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *sort_keys; /* for qsort over indices; generation is single-threaded */
static int by_logit_desc(const void *a, const void *b) {
    float x = sort_keys[*(const int *)a], y = sort_keys[*(const int *)b];
    return (x < y) - (x > y);
}

int loom_sample_logits(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng,
                       float *scratch) {
    if (s->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float *z = scratch;
    int *idx = (int *)(scratch + V);
    for (int i = 0; i < V; i++) {
        z[i] = logits[i] / s->temperature;
        idx[i] = i;
    }
    int k = V;
    if ((s->top_k > 0 && s->top_k < V) || s->top_p < 1.0f) {
        sort_keys = z;
        qsort(idx, (size_t)V, sizeof *idx, by_logit_desc);
        if (s->top_k > 0 && s->top_k < V) k = s->top_k;
    }
    float mx = z[idx[0]];
    for (int i = 1; i < k; i++)
        if (z[idx[i]] > mx) mx = z[idx[i]];
    double sum = 0;
    for (int i = 0; i < k; i++) sum += exp(z[idx[i]] - mx);
    if (s->top_p < 1.0f) { /* smallest prefix (in descending order) with mass >= top_p */
        double acc = 0;
        int keep = 0;
        while (keep < k) {
            acc += exp(z[idx[keep]] - mx) / sum;
            keep++;
            if (acc >= s->top_p) break;
        }
        k = keep;
        sum = 0;
        for (int i = 0; i < k; i++) sum += exp(z[idx[i]] - mx);
    }
    double r = loom_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += exp(z[idx[i]] - mx);
        if (r < acc) return idx[i];
    }
    return idx[k - 1];
}

loom_status loom_gpt_generate(loom_gpt_t *m, const uint32_t *prompt, size_t np, int n,
                              const loom_sampling_t *s, loom_rng_t *rng,
                              int (*emit)(int token, void *ctx), void *ctx) {
    if (np == 0) return loom_error(LOOM_EINVAL, "generation needs at least one prompt token");
    int maxT = m->cfg.max_seq_len, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    size_t cap = np + (size_t)n;
    int *seq = loom_malloc(cap * sizeof(int));
    for (size_t i = 0; i < np; i++) {
        if (prompt[i] >= (uint32_t)V) {
            free(seq);
            return loom_error(LOOM_EINVAL, "prompt token %u at position %zu is outside the model's vocabulary (%d)", prompt[i], i, V);
        }
        seq[i] = (int)prompt[i];
    }
    float *row = loom_malloc((size_t)Vp * sizeof(float));
    float *scratch = loom_malloc(2 * (size_t)V * sizeof(float));
    size_t len = np;
    loom_status st = LOOM_OK;
    for (int i = 0; i < n; i++) {
        int T = len < (size_t)maxT ? (int)len : maxT;
        const int *window = seq + len - (size_t)T;
        if ((st = loom_gpt_forward(m, window, NULL, 1, T, 0.0f, NULL)) != LOOM_OK) break;
        loom_gpt_logits_row(m, row, 1, T, (size_t)T - 1);
        int tok = loom_sample_logits(row, V, s, rng, scratch);
        seq[len++] = tok;
        if (emit(tok, ctx)) break;
    }
    free(scratch);
    free(row);
    free(seq);
    return st;
}
