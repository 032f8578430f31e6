/* The KV-cached inference path (model/infer.h) against the full forward
 * pass (model/gpt.h, the training path): for every position of random
 * prompts, logits from the paged cache equal the full forward's (normalized
 * error below 1e-5), with blocks scattered over the pool, prompts prefilled
 * in uneven chunks across block boundaries and decode rows of several
 * sequences in one batch. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/generate.h"
#include "model/infer.h"

static loom_gpt_t *tiny_model(int maxT) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    loom_gpt_config_t c = {.max_seq_len = maxT, .vocab_size = 97, .n_layer = 2, .n_head = 4, .channels = 64};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m = NULL;
    if (loom_gpt_init(&m, &c, be, 11) != LOOM_OK) return NULL;
    /* larger weights than GPT-2's init, so attention is far from uniform */
    for (size_t i = 0; i < m->num_params; i++) m->params[i] *= 4.0f;
    return m;
}

static void random_tokens(int *x, int n, int V, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (int)((seed >> 8) % (unsigned)V);
    }
}

/* Three sequences of different lengths; sequence s's tokens run through the
 * cache in chunks of chunk[s] rows, all three in the same batches. */
static void cached_equals_full(void) {
    const int maxT = 48, S = 3, bs = 4, nb = 3 * 12 + 5;
    loom_gpt_t *m = tiny_model(maxT);
    CHECK(m != NULL, "model: %s", loom_errmsg());
    if (!m) return;
    int Vp = m->cfg.padded_vocab_size, len[3] = {48, 17, 33}, chunk[3] = {7, 1, 16};
    loom_infer_t *inf;
    CHECK(loom_infer_create(&inf, m, nb, bs, LOOM_FP32, 64, S, 64) == LOOM_OK, "%s", loom_errmsg());
    int mb = loom_infer_max_blocks(inf);
    int *tables = malloc(sizeof(int) * S * mb), tok[3][48];
    /* blocks handed out in a scrambled order: tables are not contiguous */
    for (int i = 0; i < S * mb; i++) tables[i] = (i * 17 + 5) % nb;
    float *full = malloc(sizeof(float) * maxT * Vp), *cached[3];
    for (int s = 0; s < S; s++) {
        random_tokens(tok[s], len[s], m->cfg.vocab_size, 100u + (unsigned)s);
        cached[s] = malloc(sizeof(float) * len[s] * Vp);
    }
    int done[3] = {0, 0, 0}, btok[64], bpos[64], bseq[64], rows[64];
    float *logits = malloc(sizeof(float) * 64 * Vp);
    for (int step = 0; step < 64; step++) {
        int N = 0;
        for (int s = 0; s < S; s++)
            for (int k = 0; k < chunk[s] && done[s] < len[s]; k++, done[s]++) {
                btok[N] = tok[s][done[s]], bpos[N] = done[s], bseq[N] = s, rows[N] = N;
                N++;
            }
        if (N == 0) break;
        loom_infer_batch_t b = {.n_tokens = N, .tokens = btok, .pos = bpos, .seq = bseq, .n_seqs = S,
                                .block_tables = tables, .n_logits = N, .logit_rows = rows};
        CHECK(loom_infer_forward(inf, &b, logits) == LOOM_OK, "forward: %s", loom_errmsg());
        for (int i = 0; i < N; i++) memcpy(cached[bseq[i]] + (size_t)bpos[i] * Vp, logits + (size_t)i * Vp, sizeof(float) * Vp);
    }
    double worst = 0;
    for (int s = 0; s < S; s++) {
        CHECK(loom_gpt_forward(m, tok[s], NULL, 1, len[s], 0.0f, NULL) == LOOM_OK, "full: %s", loom_errmsg());
        loom_gpt_logits(m, full, 1, len[s]);
        for (int p = 0; p < len[s]; p++) {
            double e = check_rel_err(cached[s] + (size_t)p * Vp, full + (size_t)p * Vp, (size_t)m->cfg.vocab_size);
            if (e > worst) worst = e;
            CHECK(e < 1e-5, "sequence %d position %d (block %d, offset %d): normalized error %.3g", s, p, p / bs, p % bs, e);
        }
        free(cached[s]);
    }
    printf("  worst normalized error over %d positions: %.3g\n", len[0] + len[1] + len[2], worst);
    free(logits);
    free(full);
    free(tables);
    loom_infer_free(inf);
    loom_gpt_free(m);
}

/* A bad batch is refused with a message and changes nothing. */
static void bad_batch(void) {
    loom_gpt_t *m = tiny_model(16);
    if (!m) return;
    loom_infer_t *inf;
    CHECK(loom_infer_create(&inf, m, 4, 4, LOOM_FP32, 8, 2, 8) == LOOM_OK, "%s", loom_errmsg());
    int table[4] = {0, 1, 2, 3}, tok = 500, pos = 0, seq = 0, row = 0;
    float *lg = malloc(sizeof(float) * m->cfg.padded_vocab_size);
    loom_infer_batch_t b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .n_seqs = 1,
                            .block_tables = table, .n_logits = 1, .logit_rows = &row};
    CHECK(loom_infer_forward(inf, &b, lg) == LOOM_EINVAL && strstr(loom_errmsg(), "vocabulary"), "token 500: %s", loom_errmsg());
    tok = 1, pos = 16;
    CHECK(loom_infer_forward(inf, &b, lg) == LOOM_EINVAL && strstr(loom_errmsg(), "context"), "pos 16: %s", loom_errmsg());
    pos = 5, table[1] = 9;
    CHECK(loom_infer_forward(inf, &b, lg) == LOOM_EINVAL && strstr(loom_errmsg(), "outside the cache"), "block 9: %s", loom_errmsg());
    free(lg);
    loom_infer_free(inf);
    loom_gpt_free(m);
}

static int collect(int token, void *ctx) {
    int *v = ctx;
    v[1 + v[0]++] = token;
    return 0;
}

/* loom_gpt_generate (KV cache) greedy equals argmax of the full forward
 * over the growing sequence, including past the context (window slide). */
static void generate_matches_full_forward(void) {
    const int maxT = 16;
    loom_gpt_t *m = tiny_model(maxT);
    if (!m) return;
    uint32_t prompt[5] = {3, 14, 15, 92, 65};
    int got[1 + 12] = {0}, seq[5 + 12];
    loom_sampling_t greedy = {0, 0, 1};
    loom_rng_t rng;
    loom_rng_seed(&rng, 1);
    CHECK(loom_gpt_generate(m, prompt, 5, 12, &greedy, &rng, collect, got) == LOOM_OK, "%s", loom_errmsg());
    CHECK(got[0] == 12, "%d tokens", got[0]);
    int len = 5, Vp = m->cfg.padded_vocab_size, V = m->cfg.vocab_size;
    for (int i = 0; i < 5; i++) seq[i] = (int)prompt[i];
    float *lg = malloc(sizeof(float) * maxT * Vp);
    for (int i = 0; i < 11; i++) { /* the first 11 stay inside the context */
        loom_gpt_forward(m, seq, NULL, 1, len, 0.0f, NULL);
        loom_gpt_logits(m, lg, 1, len);
        const float *r = lg + (size_t)(len - 1) * Vp;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[best]) best = v;
        CHECK(got[1 + i] == best, "token %d: cached %d, full forward %d", i, got[1 + i], best);
        seq[len++] = best;
    }
    free(lg);
    loom_gpt_free(m);
}

int main(void) {
    RUN(cached_equals_full);
    RUN(bad_batch);
    RUN(generate_matches_full_forward);
    return check_main_end();
}
