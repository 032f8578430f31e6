/* generate: token sampling, and autoregressive generation of one prompt on
 * the KV-cached inference path (model/infer.h): the prompt is prefilled
 * once, then each new token runs one row through the model. Many prompts
 * at once go through the engine (src/serve/engine.h). */
#ifndef LOOM_GENERATE_H
#define LOOM_GENERATE_H

#include <stdint.h>

#include "model/gpt.h"

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
} loom_sampling_t;

/* Choose a token from logits (V): greedy (argmax, lowest id on ties) at
 * temperature 0, else softmax(logits / temperature) restricted to the
 * top_k likeliest tokens, then to the smallest prefix of those (in
 * descending order) whose mass reaches top_p, drawn with one uniform from
 * rng. The same logits, settings and rng state give the same token.
 * Thread-safe. scratch: 2*V floats. */
int loom_sample_logits(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng,
                       float *scratch);
/* Verify a drafted token (speculative decoding): a token drawn so that
 * it follows exactly the distribution loom_sample_logits draws from. Greedy
 * (or draft < 0): loom_sample_logits' token. Sampled: the draft with its
 * probability p(draft) under that distribution (the draft was proposed
 * with certainty), else a draw from the distribution without the draft,
 * renormalized (one or two uniforms from rng). The token equals draft iff
 * the draft is accepted. scratch: V floats. */
int loom_sample_verify(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                       int draft);

/* loom_sample_logits' token, and (sampled only, q not NULL) the
 * distribution it was drawn from into q (V probabilities, 0 for tokens
 * top_k / top_p drop):
 * what a draft model proposes with (speculative decoding). scratch: 2*V
 * floats. */
int loom_sample_probs(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                      float *q);
/* Verify a draft drawn from distribution q (V probabilities, as
 * loom_sample_probs writes; NULL: a draft proposed with certainty, as
 * loom_sample_verify): sampled, the draft with probability
 * min(1, p(draft) / q(draft)), else a draw from max(0, p - q)
 * renormalized, so the token follows p exactly. Greedy (or draft < 0): as
 * loom_sample_verify. The token equals draft iff the draft is accepted.
 * scratch: V floats. */
int loom_sample_verify_q(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                         int draft, const float *q);

/* Generate `n` tokens after `prompt` (np >= 1 ids), calling emit(token, ctx)
 * for each; stops early when emit returns non-zero. Past the model's
 * context the window slides: the newest half is prefilled again. */
loom_status loom_gpt_generate(loom_gpt_t *m, const uint32_t *prompt, size_t np, int n,
                              const loom_sampling_t *s, loom_rng_t *rng,
                              int (*emit)(int token, void *ctx), void *ctx);
struct loom_quant;
struct loom_sparse24;
/* The same with the linear layers on q's int8 weights (model/quant.h;
 * NULL: fp32), else on sp's 2:4 compressed weights (model/sparse24.h;
 * NULL: dense), and a KV cache of kv_dtype. */
loom_status loom_gpt_generate_with(loom_gpt_t *m, const struct loom_quant *q, const struct loom_sparse24 *sp,
                                   loom_dtype kv_dtype,
                                   const uint32_t *prompt, size_t np, int n, const loom_sampling_t *s,
                                   loom_rng_t *rng, int (*emit)(int token, void *ctx), void *ctx);

#endif
