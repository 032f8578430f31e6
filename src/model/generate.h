/* generate: autoregressive sampling from a model. Each new token runs the
 * forward pass over the window of the last max_seq_len tokens (no KV cache
 * yet: the server issue adds one). */
#ifndef LOOM_GENERATE_H
#define LOOM_GENERATE_H

#include <stdint.h>

#include "model/gpt.h"

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
} loom_sampling_t;

/* Choose a token from logits (V). scratch: 2*V floats. */
int loom_sample_logits(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng,
                       float *scratch);

/* Generate `n` tokens after `prompt` (np >= 1 ids), calling emit(token, ctx)
 * for each; stops early when emit returns non-zero. */
loom_status loom_gpt_generate(loom_gpt_t *m, const uint32_t *prompt, size_t np, int n,
                              const loom_sampling_t *s, loom_rng_t *rng,
                              int (*emit)(int token, void *ctx), void *ctx);

#endif
