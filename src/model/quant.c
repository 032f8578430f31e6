#include "quant.h"
#include "backend/qblock.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct loom_quant {
    const loom_gpt_t *m;
    loom_quant_mode mode;
    int L, logits;
    loom_tensor_t *w; /* (L * LOOM_QLIN_COUNT + 1): the linear weights, then the logits' (data NULL if fp32) */
    void *mem;        /* one backend allocation: every int8 matrix then every scale */
    size_t bytes;
};

const char *loom_quant_name(loom_quant_mode q) {
    return q == LOOM_QUANT_W8A32 ? "w8a32" : q == LOOM_QUANT_W8A8 ? "w8a8" : "none";
}

void loom_quant_rows(const float *w, long long rows, long long cols, signed char *q, float *s) {
    for (long long r = 0; r < rows; r++) {
        const float *x = w + r * cols;
        float mx = 0.0f;
        for (long long c = 0; c < cols; c++) mx = fmaxf(mx, fabsf(x[c]));
        float sc = mx > 0.0f ? mx / 127.0f : 1.0f;
        s[r] = sc;
        for (long long c = 0; c < cols; c++) {
            float v = roundf(x[c] / sc);
            q[r * cols + c] = (signed char)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
}

void loom_quant_rows_q8_0(const float *w, long long rows, long long cols, signed char *q, float *s) {
    for (long long b = 0; b < rows * cols / 32; b++) {
        const float *x = w + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        s[b] = (float)(_Float16)d; /* round to nearest even, as the GGUF's fp16 */
        for (int i = 0; i < 32; i++) q[b * 32 + i] = (signed char)roundf(x[i] * id);
    }
}

loom_quant_opts_t loom_quant_opts_default(void) { return (loom_quant_opts_t){.block = 0, .logits = 1}; }

/* Layer l's weight `which` (LOOM_QLIN_COUNT: the logits' head, wte or an
 * untied lm_head): its fp32 view, OC and C, as the parameter table says
 * (qkv rows C + 2*KV*hs, fc rows H or 2H for SwiGLU's gate and up). */
static const float *lin(const loom_gpt_t *m, int which, int l, int *OC, int *C) {
    if (which == LOOM_QLIN_COUNT) {
        *OC = m->cfg.padded_vocab_size, *C = m->cfg.channels;
        return m->param[loom_gpt_head_param(&m->cfg)];
    }
    int p = which == LOOM_QLIN_QKV ? LOOM_QKVW : which == LOOM_QLIN_ATTPROJ ? LOOM_ATTPROJW
          : which == LOOM_QLIN_FC ? LOOM_FCW : LOOM_FCPROJW;
    *OC = m->ptable[p].shape[1], *C = m->ptable[p].shape[2];
    return loom_gpt_slice(m, m->param, p, l);
}

/* The floats of the largest linear weight of a block (*big) and the most
 * rows of one (*rows); the logits' head counts when `head`. */
static void lin_largest(const loom_gpt_t *m, int head, size_t *big, size_t *rows) {
    *big = head ? (size_t)m->cfg.padded_vocab_size * m->cfg.channels : 0;
    *rows = head ? (size_t)m->cfg.padded_vocab_size : 0;
    for (int w = 0; w < LOOM_QLIN_COUNT; w++) {
        int OC, C;
        lin(m, w, 0, &OC, &C);
        *big = (size_t)OC * C > *big ? (size_t)OC * C : *big;
        *rows = (size_t)OC > *rows ? (size_t)OC : *rows;
    }
}

/* Slot i of q->w: (which, layer). */
static void slot_of(const loom_quant_t *q, int i, int *which, int *l) {
    *which = i == q->L * LOOM_QLIN_COUNT ? LOOM_QLIN_COUNT : i % LOOM_QLIN_COUNT;
    *l = i == q->L * LOOM_QLIN_COUNT ? 0 : i / LOOM_QLIN_COUNT;
}

/* Slot i as the model's file stored it: a Q8_0 GGUF's int8 linear
 * weight, or its head when q8_0 of the padded vocabulary's rows, on a
 * backend in host memory; else NULL (a device backend gets an uploaded
 * copy instead: loom_quant_create_opts). */
static const loom_tensor_t *file_tensor(const loom_quant_t *q, int i) {
    const loom_tensor_t *f = loom_quant_file_int8(q->m);
    if (!f || (q->m->be->caps & LOOM_CAP_DEVICE_MEMORY)) return NULL;
    int nq = q->L * LOOM_QLIN_COUNT;
    if (i < nq) return &f[i];
    const loom_tensor_t *h = &f[nq + 1]; /* gpt.h file_q: the head after the embedding */
    int fit = h->data && h->dtype == LOOM_INT8 && h->block == 32 && h->rows == q->m->cfg.padded_vocab_size;
    return fit && h->cols == q->m->cfg.channels ? h : NULL;
}

/* file_tensor(q, i) when it is used in place (no copy): W8A32's kernel
 * (cpu_paged.c) reads dense rows only, so an interleaved one (qblock.h, the
 * CPU's layout for W8A8) gets a dense copy of its int8 values and scales
 * instead (loom_quant_create_opts). */
static const loom_tensor_t *file_slot(const loom_quant_t *q, int i) {
    const loom_tensor_t *t = file_tensor(q, i);
    return t && (t->layout == LOOM_LAYOUT_DENSE || q->mode == LOOM_QUANT_W8A8) ? t : NULL;
}

/* Lay out q->w's tensors in `mem` (NULL: shapes only): every int8 matrix,
 * then (64-byte aligned) every scale; a slot used in place (file_slot)
 * takes no room. Returns the bytes needed. */
static size_t layout(loom_quant_t *q, int block, char *mem) {
    size_t n = (size_t)q->L * LOOM_QLIN_COUNT + (q->logits ? 1 : 0), vals = 0, at = 0, sat = 0;
    int which, l, OC, C;
    for (size_t i = 0; i < n; i++) {
        slot_of(q, (int)i, &which, &l);
        lin(q->m, which, l, &OC, &C);
        vals += file_slot(q, (int)i) ? 0 : (size_t)OC * C;
    }
    vals = (vals + 63) / 64 * 64;
    for (size_t i = 0; i < n; i++) {
        const loom_tensor_t *f = file_slot(q, (int)i);
        slot_of(q, (int)i, &which, &l);
        lin(q->m, which, l, &OC, &C);
        if (f) {
            q->w[i] = *f;
            continue;
        }
        q->w[i] = (loom_tensor_t){.data = mem ? mem + at : NULL, .dtype = LOOM_INT8, .rows = OC, .cols = C,
                                  .scales = mem ? (const float *)(mem + vals) + sat : NULL, .block = block};
        at += (size_t)OC * C, sat += block ? (size_t)OC * (C / block) : (size_t)OC;
    }
    return vals + sat * sizeof(float);
}

/* Quantize slot i from m's fp32 weights (host copies in hw, hq, hs). */
static void quantize_slot(loom_quant_t *q, int i, float *hw, signed char *hq, float *hs) {
    int which, l, OC, C;
    slot_of(q, i, &which, &l);
    const float *w = lin(q->m, which, l, &OC, &C);
    q->m->be->download(hw, w, (size_t)OC * C * sizeof(float));
    if (q->w[i].block) loom_quant_rows_q8_0(hw, OC, C, hq, hs);
    else loom_quant_rows(hw, OC, C, hq, hs);
    loom_quant_set(q, which, l, hq, hs);
}

loom_status loom_quant_create_opts(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode,
                                   const loom_quant_opts_t *opts) {
    loom_quant_opts_t o = opts ? *opts : loom_quant_opts_default();
    const loom_tensor_t *file = loom_quant_file_int8(m);
    if (file) o.block = 32; /* a Q8_0 GGUF: its own blocks, used in place or uploaded below */
    int C0 = m->cfg.channels;
    if (o.block != 0 && o.block != 32)
        return loom_error(LOOM_EINVAL, "int8 weights in blocks of %d: 0 (per output channel) or 32 (Q8_0)", o.block);
    if (o.block && (C0 % o.block || m->cfg.ffn_hidden % o.block))
        return loom_error(LOOM_EINVAL, "int8 weights in blocks of %d need the model width (%d) and MLP width (%d) to be multiples of it; "
                          "use per-channel scales", o.block, C0, m->cfg.ffn_hidden);
    loom_quant_t *q = loom_calloc(1, sizeof *q);
    q->m = m, q->mode = mode, q->L = m->cfg.n_layer, q->logits = o.logits != 0;
    int n = q->L * LOOM_QLIN_COUNT + q->logits;
    q->w = loom_calloc((size_t)q->L * LOOM_QLIN_COUNT + 1, sizeof *q->w);
    q->bytes = layout(q, o.block, NULL);
    q->mem = q->bytes ? m->be->alloc(q->bytes) : NULL;
    if (q->bytes && !q->mem) {
        size_t bytes = q->bytes;
        loom_quant_free(q);
        return loom_error(LOOM_ENOMEM, "cannot allocate %zu bytes of int8 weights on %s", bytes, m->be->name);
    }
    layout(q, o.block, q->mem);
    size_t big, rows; /* the largest matrix, and the most rows */
    lin_largest(m, 1, &big, &rows);
    float *hw = loom_malloc(big * sizeof(float)), *hs = loom_malloc((big / 32 + rows) * sizeof(float));
    signed char *hq = loom_malloc(big);
    for (int i = 0; i < n; i++) {
        const loom_tensor_t *f = file && i < q->L * LOOM_QLIN_COUNT ? &file[i] : NULL, *ft = file_tensor(q, i);
        int which, l;
        slot_of(q, i, &which, &l);
        if (file_slot(q, i)) continue; /* used in place */
        if (ft && ft->layout == LOOM_LAYOUT_ROWS8) { /* no second rounding: its values and scales, dense again */
            loom_tensor_rows8_dense(ft, (int8_t *)hq, hs);
            loom_quant_set(q, which, l, hq, hs);
        } else if (f) {
            loom_quant_set(q, which, l, f->data, f->scales); /* no second rounding */
        } else {
            quantize_slot(q, i, hw, hq, hs);
        }
    }
    free(hw), free(hq), free(hs);
    *out = q;
    return LOOM_OK;
}

loom_status loom_quant_create(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode) {
    return loom_quant_create_opts(out, m, mode, NULL);
}

loom_status loom_quant_set(loom_quant_t *q, int which, int l, const signed char *vals, const float *scales) {
    int logits = which == LOOM_QLIN_COUNT;
    if (which < 0 || which > LOOM_QLIN_COUNT || l < 0 || l >= q->L || (logits && (l || !q->logits)))
        return loom_error(LOOM_EINVAL, "int8 weight %d of layer %d: not in this copy (%d layers, logits %s)", which, l,
                          q->L, q->logits ? "int8" : "fp32");
    const loom_tensor_t *t = logits ? q->w + (size_t)q->L * LOOM_QLIN_COUNT : q->w + (size_t)l * LOOM_QLIN_COUNT + which;
    if (file_slot(q, (int)(t - q->w)))
        return loom_error(LOOM_EINVAL, "int8 weight %d of layer %d: the model file's own bytes, used in place (read-only here)", which, l);
    size_t n = (size_t)t->rows * t->cols, ns = t->block ? n / t->block : (size_t)t->rows;
    q->m->be->upload(t->data, vals, n);
    q->m->be->upload((void *)t->scales, scales, ns * sizeof(float));
    return LOOM_OK;
}

void loom_linear_copy_release(const loom_gpt_t *m, loom_tensor_t *w, void *mem) {
    if (mem) m->be->free(mem);
    free(w);
}

void loom_quant_free(loom_quant_t *q) {
    if (!q) return;
    loom_linear_copy_release(q->m, q->w, q->mem);
    free(q);
}

const loom_tensor_t *loom_quant_file_int8(const loom_gpt_t *m) {
    int nq = m->cfg.n_layer * LOOM_QLIN_COUNT, all = m->file_q != NULL;
    for (int i = 0; all && i < nq; i++) all = m->file_q[i].data && m->file_q[i].dtype == LOOM_INT8;
    return all ? m->file_q : NULL;
}

loom_quant_mode loom_quant_mode_of(const loom_quant_t *q) { return q ? q->mode : LOOM_QUANT_NONE; }

const loom_tensor_t *loom_quant_weight(const loom_quant_t *q, int which, int l) {
    return &q->w[l * LOOM_QLIN_COUNT + which];
}

const loom_tensor_t *loom_quant_logits(const loom_quant_t *q) {
    return q && q->logits ? &q->w[q->L * LOOM_QLIN_COUNT] : NULL;
}

size_t loom_quant_decode_bytes(const loom_gpt_config_t *c, loom_quant_mode mode, const loom_quant_opts_t *o) {
    loom_quant_opts_t d = o ? *o : loom_quant_opts_default();
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t total, lin = 0, lin_rows = 0, C = (size_t)c->channels;
    loom_gpt_param_table(c, t, &total);
    static const int mats[] = {LOOM_QKVW, LOOM_ATTPROJW, LOOM_FCW, LOOM_FCPROJW};
    for (int i = 0; i < 4; i++) lin += t[mats[i]].numel, lin_rows += (size_t)t[mats[i]].shape[0] * t[mats[i]].shape[1];
    size_t head = (size_t)c->vocab_size * C, wpe = loom_gpt_has_param(c, LOOM_WPE) ? (size_t)c->max_seq_len * C : 0;
    /* norms and biases; an untied model's embedding table is read a row per token, like wpe */
    size_t rest = loom_gpt_num_params(c) - wpe - lin - head * (c->untied_head ? 2 : 1);
    if (mode == LOOM_QUANT_NONE) return 4 * (rest + lin + head);
    size_t lin_sc = d.block ? lin / d.block : lin_rows, head_sc = d.block ? head / d.block : (size_t)c->vocab_size;
    size_t logits = d.logits ? head + 4 * head_sc : 4 * head;
    return 4 * rest + lin + 4 * lin_sc + logits;
}

/* ---- 2:4 structured sparsity ---- */

void loom_prune24_rows(float *w, long long rows, long long cols) {
    for (long long g = 0; g < rows * (cols / 4); g++) {
        float *x = w + g * 4, a[4];
        for (int i = 0; i < 4; i++) a[i] = fabsf(x[i]);
        for (int i = 0; i < 4; i++) { /* rank among the 4, equal magnitudes: the later one ranks lower */
            int rank = 0;
            for (int j = 0; j < 4; j++) rank += a[j] < a[i] || (a[j] == a[i] && j > i);
            if (rank < 2) x[i] = 0.0f;
        }
    }
}

long long loom_prune24_violations(const float *w, long long rows, long long cols) {
    long long bad = 0;
    for (long long g = 0; g < rows * (cols / 4); g++) {
        int zeros = 0;
        for (int i = 0; i < 4; i++) zeros += w[g * 4 + i] == 0.0f;
        bad += zeros < 2;
    }
    return bad;
}

/* Call fn on a host copy of every linear weight of m; write it back when
 * `write`. */
static void each_linear(loom_gpt_t *m, int write, void (*fn)(float *w, int OC, int C, void *ctx), void *ctx) {
    size_t big, rows;
    lin_largest(m, 0, &big, &rows);
    float *host = loom_malloc(big * sizeof(float));
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
            int OC, C;
            float *w = (float *)lin(m, k, l, &OC, &C);
            size_t n = (size_t)OC * C * sizeof(float);
            m->be->download(host, w, n);
            fn(host, OC, C, ctx);
            if (write) m->be->upload(w, host, n);
        }
    free(host);
}

static void prune_fn(float *w, int OC, int C, void *ctx) { loom_prune24_rows(w, OC, C); }

loom_status loom_prune24_model(loom_gpt_t *m) {
    if (m->cfg.channels % 4 || m->cfg.ffn_hidden % 4)
        return loom_error(LOOM_EINVAL, "2:4 sparsity needs the model width (%d) and MLP width (%d) to be multiples of 4",
                          m->cfg.channels, m->cfg.ffn_hidden);
    each_linear(m, 1, prune_fn, NULL);
    return LOOM_OK;
}

struct loom_sparsity_mask {
    unsigned char *zero; /* one byte per linear weight element, in each_linear's order */
    size_t n, at, masked;
};

static void take_fn(float *w, int OC, int C, void *ctx) {
    loom_sparsity_mask_t *k = ctx;
    for (size_t i = 0; i < (size_t)OC * C; i++) {
        k->zero[k->at + i] = w[i] == 0.0f;
        k->masked += w[i] == 0.0f;
    }
    k->at += (size_t)OC * C;
}

loom_sparsity_mask_t *loom_sparsity_mask_take(const loom_gpt_t *m) {
    loom_sparsity_mask_t *k = loom_calloc(1, sizeof *k);
    static const int mats[] = {LOOM_QKVW, LOOM_ATTPROJW, LOOM_FCW, LOOM_FCPROJW};
    for (int i = 0; i < 4; i++) k->n += m->ptable[mats[i]].numel; /* every linear weight element */
    k->zero = loom_malloc(k->n);
    each_linear((loom_gpt_t *)m, 0, take_fn, k);
    return k;
}

typedef struct {
    const loom_sparsity_mask_t *k;
    size_t at;
    long long revived;
} apply_ctx_t;

static void apply_fn(float *w, int OC, int C, void *ctx) {
    apply_ctx_t *a = ctx;
    for (size_t i = 0; i < (size_t)OC * C; i++)
        if (a->k->zero[a->at + i]) {
            a->revived += w[i] != 0.0f;
            w[i] = 0.0f;
        }
    a->at += (size_t)OC * C;
}

long long loom_sparsity_mask_apply(const loom_sparsity_mask_t *k, loom_gpt_t *m) {
    apply_ctx_t a = {k, 0, 0};
    each_linear(m, 1, apply_fn, &a);
    return a.revived;
}

double loom_sparsity_mask_share(const loom_sparsity_mask_t *k) { return k->n ? (double)k->masked / k->n : 0; }

void loom_sparsity_mask_free(loom_sparsity_mask_t *k) {
    if (!k) return;
    free(k->zero);
    free(k);
}
