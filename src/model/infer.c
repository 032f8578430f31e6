#include "infer.h"

#include "quant.h"
#include "backend/qblock.h"
#include "sparse24.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Without the batch's prefill flags, a sequence with at least this many
 * rows in a batch is prefilled: its rows go through the backend's packed
 * GEMM (matmul_forward, the one training uses), which packs the weights
 * once per call and reaches the CPU's compute rate from a few tens of rows.
 * Fewer rows (decode, a short tail of a prompt, a few drafted tokens) take
 * matmul_forward_rows, which streams each weight once per step and
 * computes every row alone, so decode stays bitwise the same in any batch.
 * Measured on gpt2-small's fc (768 -> 3072, one thread, AVX-512): the GEMM
 * takes 1.5x the row kernel's time at 4 rows, 0.8x at 8, 0.3x from 32
 * (docs/perf.md). */
#define PREFILL_GEMM_ROWS 8

struct loom_infer {
    loom_gpt_t *m;
    const loom_backend_t *be;
    int max_tokens, max_seqs, max_logits, max_blocks;
    loom_tensor_t *layers;   /* (L) views into cache: (num_blocks*2*KV, block_size*hs) each */
    int NH, KV, block_size;
    void *cache;             /* one backend allocation: per layer K then V */
    /* Activations, backend memory, one buffer each reused by every layer. */
    float *x;      /* (N, C) residual stream */
    float *ln;     /* (N, C) LayerNorm output */
    float *mean, *rstd; /* (N) */
    float *qkv;    /* (N, QR): q, k, v heads (loom_gpt_qkv_rows) */
    float *atty;   /* (N, C) */
    float *proj;   /* (N, C) attproj, then fcproj */
    float *res2;   /* (N, C) residual after attention */
    float *fch;    /* (N, H) the MLP's activation: gelu(fc), or silu(gate) * up */
    float *fcpre;  /* (N, 2H) gate and up before SwiGLU; (N, H) fc before the GELU (the fused
                      GEMM's other output, prefill rows) */
    float *rows;   /* (R, C) lnf rows that want logits */
    float *logits; /* (R, Vp) */
    int *d_tokens, *d_pos, *d_seq, *d_slot; /* (N) */
    int *d_tables; /* (S, max_blocks) */
    int *d_rows;   /* (R) */
    /* host, one allocation (at h_slot): */
    int *h_slot;   /* (N) */
    int *h_count;  /* (S): rows of each sequence in this batch */
    int *seg_start, *seg_gemm, n_seg; /* (N + 1): runs of rows, prefill (GEMM) or not */
    const loom_quant_t *quant; /* int8 linear weights, or NULL */
    const loom_sparse24_t *s24; /* 2:4 compressed linear weights, or NULL */
    float *s24_dense;  /* host: one linear weight decompressed for a long prefill run, once
                          the model's dense copy is gone (NULL until needed) */
    int s24_key;       /* which weight it holds: l * LOOM_QLIN_COUNT + which + 1, 0 none */
};

/* Prefill runs this long take the GEMM on a weight decompressed for it
 * when the dense weights are gone (the decompression, one write of the
 * weight, is then small beside the run's arithmetic); shorter ones the
 * compressed kernel. */
#define S24_GEMM_ROWS 32

/* Key/value heads of a config, 0 read as n_head (an unfinished config). */
static int kv_heads(const loom_gpt_config_t *c) { return c->n_kv_heads ? c->n_kv_heads : c->n_head; }

size_t loom_infer_block_bytes(const loom_gpt_config_t *cfg, int block_size, loom_dtype dtype) {
    size_t kvc = (size_t)kv_heads(cfg) * (cfg->channels / cfg->n_head); /* a token's K (or V) width */
    size_t per = (size_t)cfg->n_layer * 2 * (size_t)block_size * kvc * loom_dtype_size(dtype);
    if (dtype == LOOM_INT8) per += (size_t)cfg->n_layer * 2 * kv_heads(cfg) * sizeof(float); /* row scales */
    return per;
}

int loom_infer_max_blocks(const loom_infer_t *inf) { return inf->max_blocks; }

void loom_infer_free(loom_infer_t *inf) {
    if (!inf) return;
    const loom_backend_t *be = inf->be;
    void *bufs[] = {inf->cache, inf->x, inf->ln, inf->mean, inf->rstd, inf->qkv, inf->atty, inf->proj,
                    inf->res2, inf->fch, inf->fcpre, inf->rows, inf->logits, inf->d_tokens, inf->d_pos, inf->d_seq,
                    inf->d_slot, inf->d_tables, inf->d_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    free(inf->layers);
    free(inf->h_slot);
    free(inf->s24_dense);
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
    int C = c->channels, L = c->n_layer, NH = c->n_head, KV = c->n_kv_heads, fail = 0;
    size_t N = (size_t)max_tokens, R = (size_t)max_logits, f = sizeof(float);
    size_t per_layer = 2 * (size_t)num_blocks * block_size * KV * (C / NH); /* elements of K and V per layer */
    inf->NH = NH;
    inf->KV = KV;
    inf->block_size = block_size;
    size_t rows = (size_t)num_blocks * 2 * KV, nsc = dtype == LOOM_INT8 ? rows * L : 0; /* int8: a scale per row */
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
    inf->qkv = buf(be, N * loom_gpt_qkv_rows(c), f, &fail);
    inf->atty = buf(be, N * C, f, &fail);
    inf->proj = buf(be, N * C, f, &fail);
    inf->res2 = buf(be, N * C, f, &fail);
    inf->fch = buf(be, N * c->ffn_hidden, f, &fail);
    inf->fcpre = buf(be, N * loom_gpt_fc_rows(c), f, &fail);
    inf->rows = buf(be, R * C, f, &fail);
    inf->logits = buf(be, R * c->padded_vocab_size, f, &fail);
    inf->d_tokens = buf(be, N, sizeof(int), &fail);
    inf->d_pos = buf(be, N, sizeof(int), &fail);
    inf->d_seq = buf(be, N, sizeof(int), &fail);
    inf->d_slot = buf(be, N, sizeof(int), &fail);
    inf->d_tables = buf(be, (size_t)max_seqs * inf->max_blocks, sizeof(int), &fail);
    inf->d_rows = buf(be, R, sizeof(int), &fail);
    inf->h_slot = loom_malloc((N + (size_t)max_seqs + 2 * (N + 1)) * sizeof(int));
    inf->h_count = inf->h_slot + N;
    inf->seg_start = inf->h_count + max_seqs;
    inf->seg_gemm = inf->seg_start + N + 1;
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
    int bs = inf->block_size, nb = (int)(inf->layers[0].rows / (2 * inf->KV));
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

/* Split the batch into runs of rows of one kind: GEMM rows (the batch's
 * prefill flags, else the rows of sequences with at least
 * PREFILL_GEMM_ROWS rows) and the others (row kernel). */
static void segment(loom_infer_t *inf, const loom_infer_batch_t *b) {
    memset(inf->h_count, 0, (size_t)b->n_seqs * sizeof(int));
    for (int i = 0; i < b->n_tokens; i++) inf->h_count[b->seq[i]]++;
    inf->n_seg = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        int g = b->prefill ? b->prefill[i] != 0 : inf->h_count[b->seq[i]] >= PREFILL_GEMM_ROWS;
        if (inf->n_seg == 0 || inf->seg_gemm[inf->n_seg - 1] != g) {
            inf->seg_start[inf->n_seg] = i;
            inf->seg_gemm[inf->n_seg++] = g;
        }
    }
    inf->seg_start[inf->n_seg] = b->n_tokens;
}

void loom_infer_set_quant(loom_infer_t *inf, const loom_quant_t *q) { inf->quant = q; }
void loom_infer_set_sparse24(loom_infer_t *inf, const loom_sparse24_t *s) { inf->s24 = s; }

void loom_infer_weights_free(loom_infer_weights_t *w) {
    loom_quant_free(w->quant);
    loom_sparse24_free(w->s24);
    *w = (loom_infer_weights_t){0};
}

/* The embedding (k 0) or head (k 1) as the model's file stored it (gpt.h
 * file_q), when the model is in host memory; else NULL. */
static const loom_tensor_t *file_end(const loom_gpt_t *m, int k) {
    if (!m->file_q || (m->be->caps & LOOM_CAP_DEVICE_MEMORY)) return NULL;
    const loom_tensor_t *t = &m->file_q[(size_t)m->cfg.n_layer * LOOM_QLIN_COUNT + (size_t)k];
    return t->data && (k == 1 || m->cfg.pos == LOOM_POS_ROPE) ? t : NULL; /* a position embedding is added on the fp32 path */
}

/* Layer l's linear weight `qlin` as the model's file stored it (gpt.h
 * file_q), when the model is in host memory (a device model keeps a Q8_0
 * file's int8 on the host for --quant's upload only); else NULL. */
static const loom_tensor_t *file_lin(const loom_gpt_t *m, int l, int qlin) {
    if (!m->file_q || (m->be->caps & LOOM_CAP_DEVICE_MEMORY)) return NULL;
    return &m->file_q[(size_t)l * LOOM_QLIN_COUNT + (size_t)qlin];
}

/* 1 when the backend runs stored weight t (a block format, or int8). */
static int runs_stored(const loom_backend_t *be, const loom_tensor_t *t) {
    return t && t->data && (t->dtype == LOOM_INT8 ? be->matmul_forward_w8a8 != NULL : be->matmul_forward_kq != NULL);
}

/* The part slots of linear weight `qlin` of layer l (gpt.h file_q) and
 * how many parts it has there that the backend runs (0: none, or one it
 * cannot run). */
static int file_parts(const loom_gpt_t *m, int l, int qlin, const loom_tensor_t **out) {
    if (!m->file_q || (m->be->caps & LOOM_CAP_DEVICE_MEMORY)) return 0;
    size_t nq = (size_t)m->cfg.n_layer * LOOM_QLIN_COUNT;
    const loom_tensor_t *p = &m->file_q[nq + 2 + ((size_t)l * LOOM_QLIN_COUNT + (size_t)qlin) * LOOM_FILE_Q_PARTS];
    int k = 0;
    while (k < LOOM_FILE_Q_PARTS && p[k].data)
        if (!runs_stored(m->be, &p[k++])) return 0;
    *out = p;
    return k;
}

/* 1 when nothing reads parameter `param` as fp32 on the inference path:
 * each layer's copy is int8 (w) or the file's own (file_q), or, for the
 * embedding and the head, the file's own rows. */
static int fp32_unused(const loom_gpt_t *m, const loom_infer_weights_t *w, int param, int qlin) {
    if (param == LOOM_WTE || param == LOOM_LMHEAD) {
        int head = runs_stored(m->be, file_end(m, 1)), tied = param == LOOM_WTE && !m->cfg.untied_head;
        return param == LOOM_LMHEAD ? head : file_end(m, 0) != NULL && (!tied || head);
    }
    int every = 1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const loom_tensor_t *f = file_lin(m, l, qlin), *parts;
        every &= (w && w->quant && loom_quant_weight(w->quant, qlin, l) != NULL) || runs_stored(m->be, f) || file_parts(m, l, qlin, &parts) > 0;
    }
    return every;
}

/* The fp32 parameters a linear weight (qlin) or the embedding and head
 * (-1) have. */
static const int fp32_lin[6][2] = {{LOOM_QKVW, LOOM_QLIN_QKV}, {LOOM_ATTPROJW, LOOM_QLIN_ATTPROJ}, {LOOM_FCW, LOOM_QLIN_FC},
                                   {LOOM_FCPROJW, LOOM_QLIN_FCPROJ}, {LOOM_WTE, -1}, {LOOM_LMHEAD, -1}};

loom_status loom_infer_weights_create(loom_infer_weights_t *w, const loom_gpt_t *m, const loom_infer_weights_opts_t *o) {
    *w = (loom_infer_weights_t){0};
    if (o->quant == LOOM_QUANT_NONE) {
        /* every linear weight run from the file's own blocks (a k-quant
         * GGUF): their fp32 copies are zeros nothing reads, trivially
         * "2:4 sparse"; compressing them cost a 1B model 2 GB and seconds */
        int from_file = 1;
        for (int i = 0; i < 4; i++) from_file &= fp32_unused(m, NULL, fp32_lin[i][0], fp32_lin[i][1]);
        return from_file ? LOOM_OK : loom_sparse24_auto(&w->s24, m, o->sparse);
    }
    loom_quant_opts_t qo = {.block = o->block, .logits = !o->fp32_logits};
    return loom_quant_create_opts(&w->quant, m, (loom_quant_mode)o->quant, &qo);
}

size_t loom_infer_weights_release_fp32(loom_gpt_t *m, const loom_infer_weights_t *w) {
    if (m->be->caps & LOOM_CAP_DEVICE_MEMORY) return 0;
    const int (*lin)[2] = fp32_lin;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t given = 0;
    int s24 = w && !w->quant && w->s24; /* every linear weight has its 2:4 copy */
    for (int i = 0; i < 6; i++) {
        if (!m->param[lin[i][0]] || !m->ptable[lin[i][0]].numel) continue;
        if (!(s24 && lin[i][1] >= 0) && !fp32_unused(m, w, lin[i][0], lin[i][1])) continue;
        uintptr_t a = (uintptr_t)m->param[lin[i][0]], b = a + m->ptable[lin[i][0]].numel * sizeof(float);
        a = (a + page - 1) & ~(page - 1), b &= ~(page - 1); /* whole pages inside the tensor only */
        if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0) given += b - a;
    }
    if (s24) loom_sparse24_set_dense_gone(w->s24);
    return given;
}

void loom_infer_set_weights(loom_infer_t *inf, const loom_infer_weights_t *w) {
    inf->quant = w ? w->quant : NULL;
    inf->s24 = w ? w->s24 : NULL;
}

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

/* The packed GEMM on fp32 w for prefill rows; `pre` (N, OC) takes the
 * product before the GELU when the fused entry needs it. */
static void gemm(const loom_backend_t *be, float *out, float *pre, const float *inp, const float *w,
                 const float *bias, int N, int C, int OC, int gelu) {
    if (!gelu) be->matmul_forward(out, inp, w, bias, N, C, OC);
    else if (be->matmul_forward_gelu) be->matmul_forward_gelu(out, pre, inp, w, bias, N, C, OC);
    else {
        be->matmul_forward(pre, inp, w, bias, N, C, OC);
        be->gelu_forward(out, pre, (size_t)N * OC);
    }
}

/* A fused weight run part by part on the file's blocks (file_parts): each
 * part's product into scratch, then into its columns of out. 0 when it has
 * no parts there. */
static int linear_parts(loom_infer_t *inf, int which, int l, float *out, const float *inp, const float *bias, int N, int C, int OC,
                        int gelu) {
    const loom_tensor_t *p;
    int k = gelu ? 0 : file_parts(inf->m, l, which, &p), rows = 0, most = 0;
    for (int q = 0; q < k; q++) rows += (int)p[q].rows, most = (int)p[q].rows > most ? (int)p[q].rows : most;
    if (!k || rows != OC) return 0;
    float *tmp = loom_malloc((size_t)N * (size_t)most * sizeof(float));
    for (int q = 0, off = 0; q < k; off += (int)p[q].rows, q++) {
        int R = (int)p[q].rows;
        loom_infer_file_weight(inf->be, &p[q], tmp, inp, bias ? bias + off : NULL, N, C, R, 0);
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC + off, tmp + (size_t)n * R, (size_t)R * sizeof(float));
    }
    free(tmp);
    return 1;
}

/* Layer l's linear weight `which`, decompressed from the 2:4 copy (the
 * dense one is gone) into inf's buffer, kept until another is needed. */
static const float *s24_dense(loom_infer_t *inf, int which, int l) {
    const loom_tensor_t *w = loom_sparse24_weight(inf->s24, which, l);
    if (!inf->s24_dense) {
        const loom_gpt_config_t *c = &inf->m->cfg;
        size_t most = (size_t)c->channels * (size_t)(loom_gpt_qkv_rows(c) > loom_gpt_fc_rows(c) ? loom_gpt_qkv_rows(c) : loom_gpt_fc_rows(c));
        if ((size_t)c->ffn_hidden * c->channels > most) most = (size_t)c->ffn_hidden * c->channels;
        inf->s24_dense = loom_malloc(most * sizeof(float));
    }
    int key = l * LOOM_QLIN_COUNT + which + 1;
    if (inf->s24_key != key) loom_sparse24_decompress(w, inf->s24_dense);
    inf->s24_key = key;
    return inf->s24_dense;
}

/* Linear layer `which` (LOOM_QLIN_*) of block l: the file's own blocks
 * for all rows at once when the model has them (gpt.h file_q) and the
 * backend their op; else by runs of rows (segment): int8 when a quantized copy is set; else compressed 2:4 for a
 * run of at most LOOM_SPARSE24_MAX_ROWS rows when a sparse copy is set;
 * else fp32, the packed GEMM for prefill rows, the row kernel otherwise. */
static void linear(loom_infer_t *inf, int which, int l, float *out, const float *inp, const float *w,
                   const float *bias, int C, int OC, int gelu) {
    const loom_backend_t *be = inf->be;
    const loom_tensor_t *fq = file_lin(inf->m, l, which);
    const loom_tensor_t *qw = inf->quant ? loom_quant_weight(inf->quant, which, l) : NULL;
    if (fq && fq->data && !(qw && fq->dtype == LOOM_INT8) && /* --quant runs a q8_0 file's int8 (model/quant.h) its way */
        loom_infer_file_weight(be, fq, out, inp, bias, inf->seg_start[inf->n_seg], C, OC, gelu))
        return;
    if (fq && !fq->data && !qw && linear_parts(inf, which, l, out, inp, bias, inf->seg_start[inf->n_seg], C, OC, gelu)) return;
    for (int k = 0; k < inf->n_seg; k++) {
        int r0 = inf->seg_start[k], n = inf->seg_start[k + 1] - r0;
        float *o = out + (size_t)r0 * OC;
        const float *x = inp + (size_t)r0 * C;
        int gone = !qw && loom_sparse24_dense_gone(inf->s24), long_gemm = inf->seg_gemm[k] && n >= S24_GEMM_ROWS;
        if (!qw && inf->s24 && be->matmul_forward_s24 && (n <= LOOM_SPARSE24_MAX_ROWS || (gone && !long_gemm)))
            be->matmul_forward_s24(o, x, loom_sparse24_weight(inf->s24, which, l), bias, n, C, OC, gelu);
        else if (!qw && inf->seg_gemm[k])
            gemm(be, o, inf->fcpre + (size_t)r0 * OC, x, gone ? s24_dense(inf, which, l) : w, bias, n, C, OC, gelu);
        else
            matmul(inf, qw, o, x, w, bias, n, C, OC, gelu);
    }
}

/* Block l on the rows in inf->x, with its ln1 already in inf->ln; leaves
 * the next block's ln1 (or lnf) in inf->ln. */
static void block(loom_infer_t *inf, int N, int l) {
    const loom_backend_t *be = inf->be;
    const loom_gpt_t *m = inf->m;
    const loom_gpt_config_t *c = &m->cfg;
    int C = c->channels, L = c->n_layer, H = c->ffn_hidden;
    float *const *p = m->param;
#define W(i, layer) loom_gpt_slice(m, p, i, layer)
    linear(inf, LOOM_QLIN_QKV, l, inf->qkv, inf->ln, W(LOOM_QKVW, l), W(LOOM_QKVB, l), C, loom_gpt_qkv_rows(c), 0);
    if (c->pos == LOOM_POS_ROPE) be->rope_forward(inf->qkv, inf->d_pos, m->rope_freq, N, inf->NH, inf->KV, C / inf->NH);
    be->kv_write(&inf->layers[l], inf->qkv, inf->d_slot, N, inf->NH, inf->KV, inf->block_size);
    be->paged_attention(inf->atty, inf->qkv, &inf->layers[l], inf->d_pos, inf->d_seq, inf->d_tables,
                        inf->max_blocks, N, inf->NH, inf->KV, inf->block_size);
    linear(inf, LOOM_QLIN_ATTPROJ, l, inf->proj, inf->atty, W(LOOM_ATTPROJW, l), W(LOOM_ATTPROJB, l), C, C, 0);
    loom_gpt_residual_norm(c, be, inf->res2, inf->ln, inf->mean, inf->rstd, inf->x, inf->proj, W(LOOM_LN2W, l),
                           W(LOOM_LN2B, l), N);
    if (c->mlp == LOOM_MLP_SWIGLU) {
        linear(inf, LOOM_QLIN_FC, l, inf->fcpre, inf->ln, W(LOOM_FCW, l), W(LOOM_FCB, l), C, 2 * H, 0);
        be->swiglu_forward(inf->fch, inf->fcpre, N, H);
    } else {
        linear(inf, LOOM_QLIN_FC, l, inf->fch, inf->ln, W(LOOM_FCW, l), W(LOOM_FCB, l), C, H, 1);
    }
    linear(inf, LOOM_QLIN_FCPROJ, l, inf->proj, inf->fch, W(LOOM_FCPROJW, l), W(LOOM_FCPROJB, l), H, C, 0);
    int last = l + 1 == L;
    loom_gpt_residual_norm(c, be, inf->x, inf->ln, inf->mean, inf->rstd, inf->res2, inf->proj,
                           last ? W(LOOM_LNFW, 0) : W(LOOM_LN1W, l + 1), last ? W(LOOM_LNFB, 0) : W(LOOM_LN1B, l + 1), N);
#undef W
}

/* The logits of n rows on the file's own head w (V rows), computed (n, V)
 * then spread to the padded vocabulary's stride, the padding zero (the
 * fp32 head's padded rows are zero). 0 when the backend cannot run it. */
static int head_on_file(loom_infer_t *inf, const loom_tensor_t *w, int n) {
    int C = inf->m->cfg.channels, V = (int)w->rows, Vp = inf->m->cfg.padded_vocab_size;
    if (!loom_infer_file_weight(inf->be, w, inf->logits, inf->rows, NULL, n, C, V, 0)) return 0;
    for (int r = n - 1; r >= 0; r--) { /* last row first: each moves to a higher address */
        memmove(inf->logits + (size_t)r * Vp, inf->logits + (size_t)r * V, (size_t)V * sizeof(float));
        memset(inf->logits + (size_t)r * Vp + V, 0, (size_t)(Vp - V) * sizeof(float));
    }
    return 1;
}

loom_status loom_infer_forward(loom_infer_t *inf, const loom_infer_batch_t *b, float *logits) {
    LOOM_TRY(check_batch(inf, b));
    segment(inf, b);
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
    const loom_gpt_t *m = inf->m;
    float *const *p = m->param;
    const loom_tensor_t *fe = file_end(m, 0), *fh = file_end(m, 1);
    if (fe) /* the file's own rows, one token at a time */
        for (int i = 0; i < N; i++) loom_qblock_row_values(fe, b->tokens[i], inf->x + (size_t)i * C);
    else
        be->embed_positions(inf->x, inf->d_tokens, inf->d_pos, p[LOOM_WTE], loom_gpt_slice(m, p, LOOM_WPE, 0), N, C);
    loom_gpt_norm(c, be, inf->ln, inf->mean, inf->rstd, inf->x, p[LOOM_LN1W], loom_gpt_slice(m, p, LOOM_LN1B, 0), N);
    for (int l = 0; l < c->n_layer; l++) block(inf, N, l);
    if (b->n_logits) {
        be->gather_rows(inf->rows, inf->ln, inf->d_rows, b->n_logits, C);
        if (!fh || (inf->quant && fh->dtype == LOOM_INT8) || !head_on_file(inf, fh, b->n_logits))
            matmul(inf, loom_quant_logits(inf->quant), inf->logits, inf->rows, p[loom_gpt_head_param(c)], NULL, b->n_logits, C, Vp, 0);
        loom_backend_download_act(be, logits, inf->logits, (size_t)b->n_logits * Vp); /* ACT: bf16 on CUDA at --dtype bf16 */
    }
    return LOOM_OK;
}

void loom_infer_copy_block(loom_infer_t *inf, int src, int dst) {
    for (int l = 0; l < inf->m->cfg.n_layer; l++) inf->be->kv_copy_block(&inf->layers[l], src, dst, inf->KV);
}
