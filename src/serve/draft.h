/* draft: a small model of the target's tokenizer that proposes the tokens
 * speculative decoding verifies (`loom serve --draft-run RUN`,
 * docs/serving.md "Speculative decoding").
 *
 * The engine (serve/engine.h) asks for up to k tokens to follow a
 * sequence's tokens; the draft model runs them one row at a time on its own
 * paged KV cache and returns them, greedy for a greedy request, else each
 * drawn from the draft's distribution under the request's sampling
 * settings, which it writes out so the target can accept each with
 * min(1, p/q). The cache has a few slots, one sequence each; the engine
 * does not say which sequence asks, so a call takes the slot holding the
 * longest prefix of its tokens (the same sequence one step later: its
 * accepted drafts are cached already, rejected ones are overwritten), else
 * the least recently used one, and runs only the tokens after that prefix. */
#ifndef LOOM_DRAFT_H
#define LOOM_DRAFT_H

#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/infer.h"

typedef struct loom_draft loom_draft_t;

/* A draft on model m (with its int8 or 2:4 copies w, NULL: fp32), for a
 * target of vocabulary `target_vocab`: cache slots for `slots` sequences of
 * m's whole context. m must outlive it. LOOM_EINVAL when the vocabularies
 * differ; LOOM_ENOMEM when the cache does not fit. */
loom_status loom_draft_create(loom_draft_t **out, loom_gpt_t *m, const loom_infer_weights_t *w, int target_vocab,
                              int slots);
void loom_draft_free(loom_draft_t *d);

/* The engine's draft callback (loom_engine_config_t.draft, with
 * draft_sampled = 1): ctx is a loom_draft_t. Returns 0 when tokens do not
 * fit the draft's context or its forward fails. */
int loom_draft_propose(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                       loom_rng_t *rng, float *q);

/* LOOM_OK when the two tokenizers give the same ids (loom_tokenizer_hash
 * and vocabulary size equal; both absent counts as equal when the
 * vocabulary sizes are); else LOOM_EINVAL naming both sources, as a
 * draft of another tokenizer would propose tokens that mean other text. */
loom_status loom_draft_check_tokenizer(const loom_tokenizer_t *draft, int draft_vocab, const char *draft_name,
                                       const loom_tokenizer_t *target, int target_vocab, const char *target_name);

#endif
