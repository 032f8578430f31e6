#include "infer.h"

#include "quant.h"
#include "sparse24.h"

#include <stdlib.h>
#include <string.h>

struct loom_infer {
    loom_gpt_t *m;
    const loom_backend_t *be;
    int max_tokens, max_seqs, max_logits, max_blocks;
    loom_tensor_t *layers;   /* (L) views into cache: (num_blocks*2*NH, block_size*hs) each */
    int NH, block_size;
    void *cache;             /* one backend allocation: per layer K then V */
    /* Activations, backend memory, one buffer each reused by every layer. */
    float *x;      /* (N, C) residual stream */
    float *ln;     /* (N, C) LayerNorm output */
    float *mean, *rstd; /* (N) */
    float *qkv;    /* (N, 3C) */
    float *atty;   /* (N, C) */
    float *proj;   /* (N, C) attproj, then fcproj */
    float *res2;   /* (N, C) residual after attention */
    float *fch;    /* (N, 4C) gelu(fc) */
    float *rows;   /* (R, C) lnf rows that want logits */
    float *logits; /* (R, Vp) */
    int *d_tokens, *d_pos, *d_seq, *d_slot; /* (N) */
    int *d_tables; /* (S, max_blocks) */
    int *d_rows;   /* (R) */
    int *h_slot;   /* (N) host */
    const loom_quant_t *quant; /* int8 linear weights, or NULL */
    const loom_sparse24_t *s24; /* 2:4 compressed linear weights, or NULL */
};

size_t loom_infer_block_bytes(const loom_gpt_config_t *cfg, int block_size, loom_dtype dtype) {
    size_t per = (size_t)cfg->n_layer * 2 * (size_t)block_size * cfg->channels * loom_dtype_size(dtype);
    if (dtype == LOOM_INT8) per += (size_t)cfg->n_layer * 2 * cfg->n_head * sizeof(float); /* row scales */
    return per;
}

int loom_infer_max_blocks(const loom_infer_t *inf) { return inf->max_blocks; }

void loom_infer_free(loom_infer_t *inf) {
    if (!inf) return;
    const loom_backend_t *be = inf->be;
    void *bufs[] = {inf->cache, inf->x, inf->ln, inf->mean, inf->rstd, inf->qkv, inf->atty, inf->proj,
                    inf->res2, inf->fch, inf->rows, inf->logits, inf->d_tokens, inf->d_pos, inf->d_seq,
                    inf->d_slot, inf->d_tables, inf->d_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    free(inf->layers);
    free(inf->h_slot);
    free(inf);
}

/* One backend buffer of n elements of `size` bytes, counted into *fail. */
static void *buf(const loom_backend_t *be, size_t n, size_t size, int *fail) {
    void *p = be->alloc(n * size);
    if (!p) *fail = 1;
    return p;
}

loom_status loom_infer_create(loom_infer_t **out, loom_gpt_t *m, int num_blocks, int block_size,
                              loom_dtype dtype, int max_tokens, int max_seqs, int max_logits) {
    const loom_backend_t *be = m->be;
    const loom_gpt_config_t *c = &m->cfg;
    if (block_size < 1 || block_size > 256)
        return loom_error(LOOM_EINVAL, "--block-size %d: expected 1 to 256 tokens", block_size);
    if (num_blocks < 1 || max_tokens < 1 || max_seqs < 1 || max_logits < 1)
        return loom_error(LOOM_EINVAL, "inference context: %d blocks, %d tokens, %d sequences, %d logit rows: each must be at least 1",
                          num_blocks, max_tokens, max_seqs, max_logits);
    if (dtype != LOOM_FP32 && dtype != LOOM_INT8)
        return loom_error(LOOM_EINVAL, "KV cache of %s: fp32 or int8", loom_dtype_name(dtype));
    if (dtype == LOOM_INT8 && !(be->dtypes & LOOM_DTYPE_BIT(LOOM_INT8)))
        return loom_error(LOOM_EUNAVAIL, "--kv-dtype int8: the %s backend has no int8 cache ops; use fp32", be->name);
    loom_infer_t *inf = loom_calloc(1, sizeof *inf);
    inf->m = m;
    inf->be = be;
    inf->max_tokens = max_tokens;
    inf->max_seqs = max_seqs;
    inf->max_logits = max_logits;
    inf->max_blocks = (c->max_seq_len + block_size - 1) / block_size;
    int C = c->channels, L = c->n_layer, NH = c->n_head, fail = 0;
    size_t N = (size_t)max_tokens, R = (size_t)max_logits, f = sizeof(float);
    size_t per_layer = 2 * (size_t)num_blocks * block_size * C; /* elements of K and V per layer */
    inf->NH = NH;
    inf->block_size = block_size;
    size_t rows = (size_t)num_blocks * 2 * NH, nsc = dtype == LOOM_INT8 ? rows * L : 0; /* int8: a scale per row */
    inf->cache = buf(be, per_layer * L * loom_dtype_size(dtype) + nsc * sizeof(float), 1, &fail);
    float *scales = inf->cache ? (float *)((char *)inf->cache + per_layer * L * loom_dtype_size(dtype)) : NULL;
    if (nsc && inf->cache) be->zero(scales, nsc * sizeof(float));
    inf->layers = loom_calloc((size_t)L, sizeof *inf->layers);
    for (int l = 0; l < L && inf->cache; l++)
        inf->layers[l] = (loom_tensor_t){.data = (char *)inf->cache + per_layer * l * loom_dtype_size(dtype),
                                         .dtype = dtype, .rows = (long long)rows,
                                         .cols = (long long)block_size * (C / NH),
                                         .scales = nsc ? scales + rows * l : NULL};
    inf->x = buf(be, N * C, f, &fail);
    inf->ln = buf(be, N * C, f, &fail);
    inf->mean = buf(be, N, f, &fail);
    inf->rstd = buf(be, N, f, &fail);
    inf->qkv = buf(be, N * 3 * C, f, &fail);
    inf->atty = buf(be, N * C, f, &fail);
    inf->proj = buf(be, N * C, f, &fail);
    inf->res2 = buf(be, N * C, f, &fail);
    inf->fch = buf(be, N * 4 * C, f, &fail);
    inf->rows = buf(be, R * C, f, &fail);
    inf->logits = buf(be, R * c->padded_vocab_size, f, &fail);
    inf->d_tokens = buf(be, N, sizeof(int), &fail);
    inf->d_pos = buf(be, N, sizeof(int), &fail);
    inf->d_seq = buf(be, N, sizeof(int), &fail);
    inf->d_slot = buf(be, N, sizeof(int), &fail);
    inf->d_tables = buf(be, (size_t)max_seqs * inf->max_blocks, sizeof(int), &fail);
    inf->d_rows = buf(be, R, sizeof(int), &fail);
    inf->h_slot = loom_malloc(N * sizeof(int));
    if (fail || !inf->cache) {
        loom_infer_free(inf);
        return loom_error(LOOM_ENOMEM, "cannot allocate the KV cache (%d blocks of %zu bytes) and activations for %d tokens on %s",
                          num_blocks, loom_infer_block_bytes(c, block_size, dtype), max_tokens, be->name);
    }
    *out = inf;
    return LOOM_OK;
}

/* Check the batch against the model and the cache; fill h_slot. */
static loom_status check_batch(loom_infer_t *inf, const loom_infer_batch_t *b) {
    const loom_gpt_config_t *c = &inf->m->cfg;
    int bs = inf->block_size, nb = (int)(inf->layers[0].rows / (2 * inf->NH));
    if (b->n_tokens < 1 || b->n_tokens > inf->max_tokens || b->n_seqs < 1 || b->n_seqs > inf->max_seqs ||
        b->n_logits < 0 || b->n_logits > inf->max_logits)
        return loom_error(LOOM_EINVAL, "batch of %d tokens, %d sequences, %d logit rows: this context takes 1..%d, 1..%d, 0..%d",
                          b->n_tokens, b->n_seqs, b->n_logits, inf->max_tokens, inf->max_seqs, inf->max_logits);
    for (int i = 0; i < b->n_tokens; i++) {
        int t = b->tokens[i], p = b->pos[i], s = b->seq[i];
        if (t < 0 || t >= c->vocab_size)
            return loom_error(LOOM_EINVAL, "token %d (row %d) is outside the model's vocabulary (%d)", t, i, c->vocab_size);
        if (p < 0 || p >= c->max_seq_len)
            return loom_error(LOOM_EINVAL, "position %d (row %d) is outside the model's context (%d)", p, i, c->max_seq_len);
        if (s < 0 || s >= b->n_seqs) return loom_error(LOOM_EINVAL, "row %d names sequence %d of %d", i, s, b->n_seqs);
        const int *table = b->block_tables + (size_t)s * inf->max_blocks;
        for (int k = 0; k <= p / bs; k++)
            if (table[k] < 0 || table[k] >= nb)
                return loom_error(LOOM_EINVAL, "sequence %d: block %d at table entry %d is outside the cache (%d blocks)", s, table[k], k, nb);
        inf->h_slot[i] = table[p / bs] * bs + p % bs;
    }
    for (int r = 0; r < b->n_logits; r++)
        if (b->logit_rows[r] < 0 || b->logit_rows[r] >= b->n_tokens)
            return loom_error(LOOM_EINVAL, "logit row %d is outside the batch (%d rows)", b->logit_rows[r], b->n_tokens);
    return LOOM_OK;
}

void loom_infer_set_quant(loom_infer_t *inf, const loom_quant_t *q) { inf->quant = q; }
void loom_infer_set_sparse24(loom_infer_t *inf, const loom_sparse24_t *s) { inf->s24 = s; }

/* out (N, OC) = inp (N, C) @ w^T + bias: on qw (int8) when a quantized
 * copy is set and the backend has the op (W8A8, else W8A32), else fp32
 * matmul_forward_rows on w. */
static void matmul(loom_infer_t *inf, const loom_tensor_t *qw, float *out, const float *inp, const float *w,
                   const float *bias, int N, int C, int OC, int gelu) {
    const loom_backend_t *be = inf->be;
    loom_quant_mode q = qw ? loom_quant_mode_of(inf->quant) : LOOM_QUANT_NONE;
    if (q == LOOM_QUANT_W8A8 && be->matmul_forward_w8a8)
        be->matmul_forward_w8a8(out, inp, qw, bias, N, C, OC, gelu);
    else if (q != LOOM_QUANT_NONE && be->matmul_forward_w8)
        be->matmul_forward_w8(out, inp, qw, bias, N, C, OC, gelu);
    else
        be->matmul_forward_rows(out, inp, w, bias, N, C, OC, gelu);
}

int loom_infer_file_weight(const loom_backend_t *be, const loom_tensor_t *w, float *out, const float *inp,
                           const float *bias, int N, int C, int OC, int gelu) {
    if (w->dtype == LOOM_INT8 && be->matmul_forward_w8a8) be->matmul_forward_w8a8(out, inp, w, bias, N, C, OC, gelu);
    else if (w->dtype != LOOM_INT8 && be->matmul_forward_kq) be->matmul_forward_kq(out, inp, w, bias, N, C, OC, gelu);
    else return 0;
    return 1;
}

/* Linear layer `which` (LOOM_QLIN_*) of block l: the file's own blocks
 * when the model has them (gpt.h file_q) and the backend their op, else
 * int8 when a quantized
 * copy is set, else compressed 2:4 when a sparse copy is set and the batch
 * has at most LOOM_SPARSE24_MAX_ROWS rows, else fp32. */
static void linear(loom_infer_t *inf, int which, int l, float *out, const float *inp, const float *w,
                   const float *bias, int N, int C, int OC, int gelu) {
    const loom_tensor_t *fq = inf->m->file_q ? &inf->m->file_q[(size_t)l * LOOM_QLIN_COUNT + which] : NULL;
    if (fq && fq->data && loom_infer_file_weight(inf->be, fq, out, inp, bias, N, C, OC, gelu)) return;
    const loom_tensor_t *qw = inf->quant ? loom_quant_weight(inf->quant, which, l) : NULL;
    if (!qw && inf->s24 && inf->be->matmul_forward_s24 && N <= LOOM_SPARSE24_MAX_ROWS)
        inf->be->matmul_forward_s24(out, inp, loom_sparse24_weight(inf->s24, which, l), bias, N, C, OC, gelu);
    else
        matmul(inf, qw, out, inp, w, bias, N, C, OC, gelu);
}

/* Block l on the rows in inf->x, with its ln1 already in inf->ln; leaves
 * the next block's ln1 (or lnf) in inf->ln. */
static void block(loom_infer_t *inf, int N, int l) {
    const loom_backend_t *be = inf->be;
    int C = inf->m->cfg.channels, L = inf->m->cfg.n_layer;
    size_t lc = (size_t)l * C;
    float *const *p = inf->m->param;
    linear(inf, LOOM_QLIN_QKV, l, inf->qkv, inf->ln, p[LOOM_QKVW] + lc * 3 * C, p[LOOM_QKVB] + 3 * lc, N, C, 3 * C, 0);
    be->kv_write(&inf->layers[l], inf->qkv, inf->d_slot, N, inf->NH, inf->block_size);
    be->paged_attention(inf->atty, inf->qkv, &inf->layers[l], inf->d_pos, inf->d_seq, inf->d_tables,
                        inf->max_blocks, N, inf->NH, inf->block_size);
    linear(inf, LOOM_QLIN_ATTPROJ, l, inf->proj, inf->atty, p[LOOM_ATTPROJW] + lc * C, p[LOOM_ATTPROJB] + lc, N, C, C, 0);
    loom_gpt_residual_layernorm(be, inf->res2, inf->ln, inf->mean, inf->rstd, inf->x, inf->proj, p[LOOM_LN2W] + lc,
                  p[LOOM_LN2B] + lc, N, C);
    linear(inf, LOOM_QLIN_FC, l, inf->fch, inf->ln, p[LOOM_FCW] + lc * 4 * C, p[LOOM_FCB] + 4 * lc, N, C, 4 * C, 1);
    linear(inf, LOOM_QLIN_FCPROJ, l, inf->proj, inf->fch, p[LOOM_FCPROJW] + lc * 4 * C, p[LOOM_FCPROJB] + lc, N, 4 * C, C, 0);
    const float *w = l + 1 < L ? p[LOOM_LN1W] + lc + C : p[LOOM_LNFW];
    const float *bb = l + 1 < L ? p[LOOM_LN1B] + lc + C : p[LOOM_LNFB];
    loom_gpt_residual_layernorm(be, inf->x, inf->ln, inf->mean, inf->rstd, inf->res2, inf->proj, w, bb, N, C);
}

loom_status loom_infer_forward(loom_infer_t *inf, const loom_infer_batch_t *b, float *logits) {
    LOOM_TRY(check_batch(inf, b));
    const loom_backend_t *be = inf->be;
    const loom_gpt_config_t *c = &inf->m->cfg;
    int N = b->n_tokens, C = c->channels, Vp = c->padded_vocab_size;
    size_t ni = (size_t)N * sizeof(int);
    be->upload(inf->d_tokens, b->tokens, ni);
    be->upload(inf->d_pos, b->pos, ni);
    be->upload(inf->d_seq, b->seq, ni);
    be->upload(inf->d_slot, inf->h_slot, ni);
    be->upload(inf->d_tables, b->block_tables, (size_t)b->n_seqs * inf->max_blocks * sizeof(int));
    if (b->n_logits) be->upload(inf->d_rows, b->logit_rows, (size_t)b->n_logits * sizeof(int));
    float *const *p = inf->m->param;
    be->embed_positions(inf->x, inf->d_tokens, inf->d_pos, p[LOOM_WTE], p[LOOM_WPE], N, C);
    be->layernorm_forward(inf->ln, inf->mean, inf->rstd, inf->x, p[LOOM_LN1W], p[LOOM_LN1B], N, C);
    for (int l = 0; l < c->n_layer; l++) block(inf, N, l);
    if (b->n_logits) {
        be->gather_rows(inf->rows, inf->ln, inf->d_rows, b->n_logits, C);
        matmul(inf, loom_quant_logits(inf->quant), inf->logits, inf->rows, p[LOOM_WTE], NULL, b->n_logits, C, Vp, 0);
        loom_backend_download_act(be, logits, inf->logits, (size_t)b->n_logits * Vp); /* ACT: bf16 on CUDA at --dtype bf16 */
    }
    return LOOM_OK;
}

void loom_infer_copy_block(loom_infer_t *inf, int src, int dst) {
    for (int l = 0; l < inf->m->cfg.n_layer; l++) inf->be->kv_copy_block(&inf->layers[l], src, dst, inf->NH);
}
