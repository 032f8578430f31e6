#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/infer.h"

typedef struct {
    float e; /* exp(z - max) */
    int id;
} cand_t;

static int by_weight_desc(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->e != y->e) return (x->e < y->e) - (x->e > y->e);
    return (x->id > y->id) - (x->id < y->id);
}

/* The likeliest tokens into c, sorted: every token with weight >= a
 * threshold that is lowered until the set holds k tokens (k > 0) or mass
 * `need`. Returns how many. */
static int top_candidates(const float *e, int V, int k, double need, cand_t *c) {
    float thr = 1e-2f;
    for (;;) {
        int n = 0;
        double mass = 0;
        for (int i = 0; i < V; i++)
            if (e[i] >= thr) {
                c[n++] = (cand_t){e[i], i};
                mass += e[i];
            }
        if ((k > 0 ? n >= k : mass >= need) || thr == 0.0f) {
            qsort(c, (size_t)n, sizeof *c, by_weight_desc);
            return n;
        }
        thr = thr < 1e-30f ? 0.0f : thr * 1e-3f;
    }
}

/* The distribution a sampled (temperature > 0) draw comes from: the kept
 * tokens into c[0..n) with weights exp((z - max) / T) (every token in id
 * order when neither top_k nor top_p filters; else the likeliest first),
 * their total into *mass. e: V floats of scratch. Returns n. */
static int kept(const float *logits, int V, const loom_sampling_t *s, float *e, cand_t *c, double *mass) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    float mx = logits[best], inv_t = 1.0f / s->temperature;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        e[i] = expf((logits[i] - mx) * inv_t);
        sum += e[i];
    }
    int k = s->top_k > 0 && s->top_k < V ? s->top_k : 0;
    if (!k && s->top_p >= 1.0f) { /* plain softmax: no sort needed */
        for (int i = 0; i < V; i++) c[i] = (cand_t){e[i], i};
        *mass = sum;
        return V;
    }
    int n = top_candidates(e, V, k, s->top_p * sum, c);
    if (k && k < n) n = k;
    double m = 0;
    for (int i = 0; i < n; i++) m += c[i].e;
    /* top_p is a share of the whole distribution after top_k: without
     * top_k that is every token's mass, not only the candidates' (which
     * leave out the tokens below the threshold) */
    double whole = k ? m : sum;
    if (s->top_p < 1.0f) { /* smallest prefix with mass >= top_p of it */
        double acc = 0;
        int keep = 0;
        while (keep < n) {
            acc += c[keep++].e;
            if (acc >= s->top_p * whole) break;
        }
        n = keep;
        m = acc;
    }
    *mass = m;
    return n;
}

/* The kept token where r (in [0, mass)) falls, skipping `skip` (-1: none). */
static int draw(const cand_t *c, int n, double r, int skip) {
    double acc = 0;
    int tok = c[n - 1].id == skip && n > 1 ? c[n - 2].id : c[n - 1].id;
    for (int i = 0; i < n; i++) {
        if (c[i].id == skip) continue;
        acc += c[i].e;
        if (r < acc) return c[i].id;
    }
    return tok;
}

static int argmax(const float *logits, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int loom_sample_logits(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng,
                       float *scratch) {
    return loom_sample_probs(logits, V, s, rng, scratch, NULL);
}

int loom_sample_verify(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                       int draft) {
    if (s->temperature <= 0 || draft < 0) return loom_sample_logits(logits, V, s, rng, scratch);
    cand_t *c = loom_malloc((size_t)V * sizeof *c);
    double mass, wd = 0;
    int n = kept(logits, V, s, scratch, c, &mass), tok = draft;
    for (int i = 0; i < n; i++)
        if (c[i].id == draft) wd = c[i].e;
    /* accept with probability p(draft) (the draft's own probability is 1);
     * else draw from p without the draft, renormalized */
    if (!(loom_rng_uniform(rng) * mass < wd)) tok = draw(c, n, loom_rng_uniform(rng) * (mass - wd), draft);
    free(c);
    return tok;
}

int loom_sample_probs(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                      float *q) {
    if (s->temperature <= 0) return argmax(logits, V);
    cand_t *c = loom_malloc((size_t)V * sizeof *c);
    double mass;
    int n = kept(logits, V, s, scratch, c, &mass);
    int tok = draw(c, n, loom_rng_uniform(rng) * mass, -1);
    if (q) memset(q, 0, (size_t)V * sizeof *q);
    for (int i = 0; q && i < n; i++) q[c[i].id] = (float)(c[i].e / mass);
    free(c);
    return tok;
}

int loom_sample_verify_q(const float *logits, int V, const loom_sampling_t *s, loom_rng_t *rng, float *scratch,
                         int draft, const float *q) {
    if (s->temperature <= 0 || draft < 0 || !q) return loom_sample_verify(logits, V, s, rng, scratch, draft);
    cand_t *c = loom_malloc((size_t)V * sizeof *c);
    double mass, pd = 0;
    int n = kept(logits, V, s, scratch, c, &mass), tok = draft;
    for (int i = 0; i < n; i++)
        if (c[i].id == draft) pd = c[i].e / mass;
    /* accept with probability min(1, p(draft) / q(draft)); else draw from
     * max(0, p - q), renormalized: together exactly p (Leviathan et al.
     * 2023, Chen et al. 2023) */
    if (!(loom_rng_uniform(rng) * q[draft] < pd)) {
        double left = 0;
        for (int i = 0; i < n; i++) {
            double r = c[i].e / mass - q[c[i].id];
            c[i].e = r > 0 ? (float)r : 0.0f;
            left += c[i].e;
        }
        /* p <= q everywhere only by rounding (a rejection means p < q at the draft): then p itself */
        tok = left > 0 ? draw(c, n, loom_rng_uniform(rng) * left, -1) : loom_sample_logits(logits, V, s, rng, scratch);
    }
    free(c);
    return tok;
}

/* Prefill seq[0..len) at positions 0..len-1 through the one-sequence cache,
 * in chunks of at most `chunk` rows; logits of the last row into `row`. */
static loom_status prefill(loom_infer_t *inf, const int *seq, int len, int chunk, const int *table,
                           int *pos, int *zeros, float *row) {
    for (int s0 = 0; s0 < len; s0 += chunk) {
        int n = len - s0 < chunk ? len - s0 : chunk, last = n - 1;
        for (int i = 0; i < n; i++) pos[i] = s0 + i;
        loom_infer_batch_t b = {.n_tokens = n, .tokens = seq + s0, .pos = pos, .seq = zeros, .n_seqs = 1,
                                .block_tables = table, .n_logits = s0 + n == len, .logit_rows = &last};
        LOOM_TRY(loom_infer_forward(inf, &b, row));
    }
    return LOOM_OK;
}

loom_status loom_gpt_generate(loom_gpt_t *m, const uint32_t *prompt, size_t np, int n,
                              const loom_sampling_t *s, loom_rng_t *rng,
                              int (*emit)(int token, void *ctx), void *ctx) {
    return loom_gpt_generate_with(m, NULL, NULL, LOOM_FP32, prompt, np, n, s, rng, emit, ctx);
}

loom_status loom_gpt_generate_with(loom_gpt_t *m, const struct loom_quant *q, const struct loom_sparse24 *sp,
                                   loom_dtype kv_dtype,
                                   const uint32_t *prompt, size_t np, int n, const loom_sampling_t *s,
                                   loom_rng_t *rng, int (*emit)(int token, void *ctx), void *ctx) {
    if (np == 0) return loom_error(LOOM_EINVAL, "generation needs at least one prompt token");
    int maxT = m->cfg.max_seq_len, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    const int bs = 16, chunk = maxT < 256 ? maxT : 256, nb = (maxT + bs - 1) / bs;
    loom_infer_t *inf;
    LOOM_TRY(loom_infer_create(&inf, m, nb, bs, kv_dtype, chunk, 1, 1));
    loom_infer_set_quant(inf, q);
    loom_infer_set_sparse24(inf, sp);
    int *seq = loom_malloc((np + (size_t)n + 1) * sizeof(int)), *table = loom_malloc((size_t)nb * sizeof(int));
    int *pos = loom_malloc((size_t)chunk * sizeof(int)), *zeros = loom_calloc((size_t)chunk, sizeof(int));
    float *row = loom_malloc((size_t)Vp * sizeof(float)), *scratch = loom_malloc(2 * (size_t)V * sizeof(float));
    for (int i = 0; i < nb; i++) table[i] = i;
    /* The window: the last maxT tokens of the prompt. */
    size_t start = np > (size_t)maxT ? np - (size_t)maxT : 0;
    int len = (int)(np - start);
    for (int i = 0; i < len; i++) seq[i] = (int)prompt[start + (size_t)i];
    loom_status st = prefill(inf, seq, len, chunk, table, pos, zeros, row);
    for (int i = 0; i < n && st == LOOM_OK; i++) {
        int tok = loom_sample_logits(row, V, s, rng, scratch);
        if (emit(tok, ctx) || i + 1 == n) break;
        if (len == maxT) { /* context full: keep the newest half and prefill it again */
            int keep = maxT / 2;
            memmove(seq, seq + len - keep, (size_t)keep * sizeof(int));
            len = keep;
            seq[len++] = tok;
            st = prefill(inf, seq, len, chunk, table, pos, zeros, row);
            continue;
        }
        seq[len] = tok;
        int p = len++, zero = 0;
        loom_infer_batch_t b = {.n_tokens = 1, .tokens = &seq[p], .pos = &p, .seq = zeros, .n_seqs = 1,
                                .block_tables = table, .n_logits = 1, .logit_rows = &zero};
        st = loom_infer_forward(inf, &b, row);
    }
    free(scratch);
    free(row);
    free(zeros);
    free(pos);
    free(table);
    free(seq);
    loom_infer_free(inf);
    return st;
}
