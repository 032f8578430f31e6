#include "train/eval.h"

#include <math.h>
#include <stdlib.h>

#include "model/infer.h"

loom_status loom_eval_plan(const loom_dataset_t *ds, int *B, int *T, int max_batches, int *nb) {
    size_t nval = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL);
    if (nval < 2) return loom_error(LOOM_EINVAL, "no validation tokens to score (the validation split holds %zu)", nval);
    size_t per = (size_t)*B * *T;
    if (nval - 1 < per) { /* shrink to what the split holds */
        *B = 1;
        if ((size_t)*T > nval - 1) *T = (int)(nval - 1);
        per = (size_t)*T;
    }
    *nb = (int)((nval - 1) / per);
    if (max_batches > 0 && max_batches < *nb) *nb = max_batches;
    return LOOM_OK;
}

loom_status loom_eval_batches(const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_score_fn score, void *ctx,
                              loom_eval_result_t *out) {
    int nb = 0;
    LOOM_TRY(loom_eval_plan(ds, &B, &T, max_batches, &nb));
    size_t per = (size_t)B * T;
    int *in = loom_malloc(per * sizeof(int)), *tg = loom_malloc(per * sizeof(int));
    double sum = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < nb && s == LOOM_OK; i++) {
        float l = 0;
        loom_dataset_batch(ds, LOOM_SPLIT_VAL, (size_t)i * per, B, T, in, tg);
        s = score(ctx, in, tg, B, T, &l);
        sum += l;
    }
    free(in);
    free(tg);
    *out = (loom_eval_result_t){sum / nb, nb, B, T};
    return s;
}

static loom_status score_forward(void *m, const int *in, const int *tg, int B, int T, float *loss) {
    return loom_gpt_forward(m, in, tg, B, T, 0.0f, loss);
}

loom_status loom_eval_loss(loom_gpt_t *m, const loom_dataset_t *ds, int B, int T, int max_batches,
                           loom_eval_result_t *out) {
    return loom_eval_batches(ds, B, T, max_batches, score_forward, m, out);
}

/* Sum over T rows of -log softmax(logits row)[target], over the V real ids. */
static double cross_entropy(const float *logits, const int *tg, int T, int V, int Vp) {
    double sum = 0;
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * Vp;
        double mx = z[0], e = 0;
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < V; v++) e += exp(z[v] - mx);
        sum += mx + log(e) - z[tg[t]];
    }
    return sum;
}

/* One sequence of T tokens through the paged-cache forward: positions
 * 0..T-1 in blocks 0, 1, ... of the cache; every row's logits. */
static loom_status infer_sequence(loom_infer_t *inf, const int *in, int T, float *logits) {
    int nb = loom_infer_max_blocks(inf);
    int *pos = loom_malloc((size_t)T * sizeof(int)), *seq = loom_calloc((size_t)T, sizeof(int)), *table = loom_malloc((size_t)nb * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int k = 0; k < nb; k++) table[k] = k;
    loom_infer_batch_t b = {.n_tokens = T, .tokens = in, .pos = pos, .seq = seq, .n_seqs = 1,
                            .block_tables = table, .n_logits = T, .logit_rows = pos};
    loom_status s = loom_infer_forward(inf, &b, logits);
    free(pos), free(seq), free(table);
    return s;
}

loom_status loom_eval_loss_infer(loom_gpt_t *m, const struct loom_quant *q, loom_dtype kv_dtype, const loom_dataset_t *ds,
                                 int B, int T, int max_batches, loom_eval_result_t *out) {
    int nb = 0, bs = 16, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    LOOM_TRY(loom_eval_plan(ds, &B, &T, max_batches, &nb));
    loom_infer_t *inf;
    LOOM_TRY(loom_infer_create(&inf, m, (T + bs - 1) / bs, bs, kv_dtype, T, 1, T));
    loom_infer_set_quant(inf, q);
    size_t per = (size_t)B * T;
    int *in = loom_malloc(per * sizeof(int)), *tg = loom_malloc(per * sizeof(int));
    float *logits = loom_malloc((size_t)T * Vp * sizeof(float));
    double sum = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < nb && s == LOOM_OK; i++) {
        loom_dataset_batch(ds, LOOM_SPLIT_VAL, (size_t)i * per, B, T, in, tg);
        for (int b = 0; b < B && s == LOOM_OK; b++) {
            s = infer_sequence(inf, in + (size_t)b * T, T, logits);
            if (s == LOOM_OK) sum += cross_entropy(logits, tg + (size_t)b * T, T, V, Vp) / (double)per;
        }
    }
    free(in), free(tg), free(logits);
    loom_infer_free(inf);
    *out = (loom_eval_result_t){sum / nb, nb, B, T};
    return s;
}
