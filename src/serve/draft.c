/* The draft model of speculative decoding (draft.h). */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#define DRAFT_BLOCK 16  /* tokens per block of the draft's own cache */
#define DRAFT_CHUNK 128 /* prompt rows per forward when a slot catches up */

typedef struct {
    int *tokens;       /* the tokens whose K, V the slot's cache holds */
    int n_cached;
    long long used;    /* the call that last used it (least recently used goes first) */
} slot_t;

struct loom_draft {
    loom_gpt_t *m;
    loom_infer_t *inf;
    int n_slots, max_blocks, V, Vp, maxT;
    slot_t *slot;
    int *tables;       /* n_slots x max_blocks: slot i owns blocks i*max_blocks .. */
    int pos[DRAFT_CHUNK], zeros[DRAFT_CHUNK];
    float *logits, *scratch;
    long long clock;
};

loom_status loom_draft_create(loom_draft_t **out, loom_gpt_t *m, const loom_infer_weights_t *w, int target_vocab,
                              int slots) {
    *out = NULL;
    if (m->cfg.vocab_size != target_vocab)
        return loom_error(LOOM_EINVAL, "draft model: vocabulary of %d ids, the target's has %d: a draft must share the target's tokenizer",
                          m->cfg.vocab_size, target_vocab);
    int nb = (m->cfg.max_seq_len + DRAFT_BLOCK - 1) / DRAFT_BLOCK;
    loom_draft_t *d = loom_calloc(1, sizeof *d);
    loom_status st = loom_infer_create(&d->inf, m, nb * slots, DRAFT_BLOCK, LOOM_FP32, DRAFT_CHUNK, 1, 1);
    if (st != LOOM_OK) {
        free(d);
        return st;
    }
    loom_infer_set_weights(d->inf, w);
    d->m = m, d->n_slots = slots, d->max_blocks = loom_infer_max_blocks(d->inf);
    d->V = m->cfg.vocab_size, d->Vp = m->cfg.padded_vocab_size, d->maxT = m->cfg.max_seq_len;
    d->slot = loom_calloc((size_t)slots, sizeof *d->slot);
    d->tables = loom_malloc((size_t)slots * (size_t)d->max_blocks * sizeof(int));
    for (int i = 0; i < slots; i++) {
        d->slot[i].tokens = loom_malloc((size_t)d->maxT * sizeof(int));
        for (int b = 0; b < d->max_blocks; b++) d->tables[(size_t)i * d->max_blocks + b] = i * nb + (b < nb ? b : nb - 1);
    }
    d->logits = loom_malloc((size_t)d->Vp * sizeof(float));
    d->scratch = loom_malloc(2 * (size_t)d->V * sizeof(float));
    *out = d;
    return LOOM_OK;
}

void loom_draft_free(loom_draft_t *d) {
    if (!d) return;
    for (int i = 0; i < d->n_slots; i++) free(d->slot[i].tokens);
    free(d->slot), free(d->tables), free(d->logits), free(d->scratch);
    loom_infer_free(d->inf);
    free(d);
}

/* The slot holding the longest prefix of tokens[0..len), else the least
 * recently used; its common prefix length into *common. */
static int pick_slot(const loom_draft_t *d, const int *tokens, int len, int *common) {
    int best = 0, best_n = -1;
    for (int i = 0; i < d->n_slots; i++) {
        const slot_t *s = &d->slot[i];
        int n = 0, lim = s->n_cached < len ? s->n_cached : len;
        while (n < lim && s->tokens[n] == tokens[n]) n++;
        if (n > best_n || (n == best_n && s->used < d->slot[best].used)) best = i, best_n = n;
    }
    *common = best_n;
    return best;
}

/* Run tokens[from..to) of slot i at their positions; logits of the last row. */
static loom_status run_rows(loom_draft_t *d, int i, const int *tokens, int from, int to) {
    for (int s0 = from; s0 < to; s0 += DRAFT_CHUNK) {
        int n = to - s0 < DRAFT_CHUNK ? to - s0 : DRAFT_CHUNK, last = n - 1;
        for (int r = 0; r < n; r++) d->pos[r] = s0 + r, d->zeros[r] = 0;
        loom_infer_batch_t b = {.n_tokens = n, .tokens = tokens + s0, .pos = d->pos, .seq = d->zeros, .n_seqs = 1,
                                .block_tables = d->tables + (size_t)i * d->max_blocks, .n_logits = s0 + n == to,
                                .logit_rows = &last};
        LOOM_TRY(loom_infer_forward(d->inf, &b, d->logits));
    }
    return LOOM_OK;
}

int loom_draft_propose(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                       loom_rng_t *rng, float *q) {
    loom_draft_t *d = ctx;
    if (len + max > d->maxT) max = d->maxT - len; /* the draft's context may be shorter than the target's */
    if (len < 1 || max <= 0) return 0;
    int common, i = pick_slot(d, tokens, len, &common);
    slot_t *s = &d->slot[i];
    if (common == len) common = len - 1; /* rerun the last token: its logits are needed */
    s->used = ++d->clock;
    s->n_cached = common; /* rows after the common prefix are overwritten below */
    memcpy(s->tokens + common, tokens + common, (size_t)(len - common) * sizeof(int));
    if (run_rows(d, i, s->tokens, common, len) != LOOM_OK) return 0;
    s->n_cached = len;
    int n = 0;
    for (;;) {
        out[n] = q ? loom_sample_probs(d->logits, d->V, sp, rng, d->scratch, q + (size_t)n * d->V)
                   : loom_sample_logits(d->logits, d->V, sp, rng, d->scratch);
        if (++n == max) break;
        s->tokens[len + n - 1] = out[n - 1];
        if (run_rows(d, i, s->tokens, len + n - 1, len + n) != LOOM_OK) break;
        s->n_cached = len + n;
    }
    return n;
}

loom_status loom_draft_check_tokenizer(const loom_tokenizer_t *draft, int draft_vocab, const char *draft_name,
                                       const loom_tokenizer_t *target, int target_vocab, const char *target_name) {
    uint64_t hd = draft ? loom_tokenizer_hash(draft) : 0, ht = target ? loom_tokenizer_hash(target) : 0;
    if (draft_vocab == target_vocab && hd == ht && !draft == !target) return LOOM_OK;
    return loom_error(LOOM_EINVAL,
                      "--draft-run %s: its tokenizer (%d ids, %s %016llx) differs from the target %s's (%d ids, %s %016llx): "
                      "a draft model must use the target's tokenizer (train it with the target's tokenizer.json)",
                      draft_name, draft_vocab, draft ? "hash" : "none,", (unsigned long long)hd, target_name, target_vocab,
                      target ? "hash" : "none,", (unsigned long long)ht);
}
