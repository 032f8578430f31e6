#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct loom_quant {
    const loom_gpt_t *m;
    loom_quant_mode mode;
    int L;
    loom_tensor_t *w; /* (L, LOOM_QLIN_COUNT) */
    void *mem;        /* one backend allocation: every int8 matrix then every scale */
    size_t bytes;
};

int loom_quant_parse(const char *s) {
    if (!strcmp(s, "none") || !strcmp(s, "fp32")) return LOOM_QUANT_NONE;
    if (!strcmp(s, "w8a32") || !strcmp(s, "w8a16")) return LOOM_QUANT_W8A32;
    if (!strcmp(s, "int8") || !strcmp(s, "w8a8")) return LOOM_QUANT_W8A8;
    return -1;
}

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

/* Layer l's weight `which`: its fp32 view, OC and C. */
static const float *lin(const loom_gpt_t *m, int which, int l, int *OC, int *C) {
    int c = m->cfg.channels;
    *C = which == LOOM_QLIN_FCPROJ ? 4 * c : c;
    *OC = which == LOOM_QLIN_QKV ? 3 * c : which == LOOM_QLIN_FC ? 4 * c : c;
    int p = which == LOOM_QLIN_QKV ? LOOM_QKVW : which == LOOM_QLIN_ATTPROJ ? LOOM_ATTPROJW
          : which == LOOM_QLIN_FC ? LOOM_FCW : LOOM_FCPROJW;
    return m->param[p] + (size_t)l * *OC * *C;
}

/* Layer l's weight `which` as a file stored it in int8 (m->file_int8, a
 * Q8_0 GGUF: blocks of 32), or NULL: quantize the fp32 copy per row. */
static const loom_tensor_t *file_weight(const loom_gpt_t *m, int which, int l) {
    const loom_tensor_t *t = m->file_int8 ? &m->file_int8[l * LOOM_QLIN_COUNT + which] : NULL;
    return t && t->data ? t : NULL;
}

/* Scales of layer l's weight `which`: per block of the file's, else per row. */
static size_t scale_count(const loom_gpt_t *m, int which, int l) {
    int OC, C;
    lin(m, which, l, &OC, &C);
    const loom_tensor_t *f = file_weight(m, which, l);
    return f ? (size_t)OC * C / f->block : (size_t)OC;
}

loom_status loom_quant_create(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode) {
    const loom_backend_t *be = m->be;
    int L = m->cfg.n_layer, C0 = m->cfg.channels;
    size_t per_layer = 12 * (size_t)C0 * C0, nscales = 0;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) nscales += scale_count(m, k, l);
    size_t bytes = per_layer * L + nscales * sizeof(float);
    loom_quant_t *q = loom_calloc(1, sizeof *q);
    q->m = m, q->mode = mode, q->L = L, q->bytes = bytes;
    q->w = loom_calloc((size_t)L * LOOM_QLIN_COUNT, sizeof *q->w);
    q->mem = be->alloc(bytes);
    if (!q->mem) {
        loom_quant_free(q);
        return loom_error(LOOM_ENOMEM, "cannot allocate %zu bytes of int8 weights on %s", bytes, be->name);
    }
    signed char *data = q->mem;
    float *scales = (float *)((char *)q->mem + per_layer * L);
    float *host = loom_malloc(4 * (size_t)C0 * C0 * sizeof(float));
    signed char *hq = loom_malloc(4 * (size_t)C0 * C0);
    float *hs = loom_malloc(4 * (size_t)C0 * sizeof(float));
    for (int l = 0; l < L; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
            int OC, C;
            const float *w = lin(m, k, l, &OC, &C);
            size_t n = (size_t)OC * C;
            const loom_tensor_t *f = file_weight(m, k, l);
            size_t ns = scale_count(m, k, l);
            if (!f) {
                be->download(host, w, n * sizeof(float));
                loom_quant_rows(host, OC, C, hq, hs);
            }
            be->upload(data, f ? f->data : hq, n);
            be->upload(scales, f ? f->scales : hs, ns * sizeof(float));
            q->w[l * LOOM_QLIN_COUNT + k] = (loom_tensor_t){.data = data, .dtype = LOOM_INT8, .rows = OC, .cols = C,
                                                            .scales = scales, .block = f ? f->block : 0};
            data += n;
            scales += ns;
        }
    free(host), free(hq), free(hs);
    *out = q;
    return LOOM_OK;
}

void loom_quant_free(loom_quant_t *q) {
    if (!q) return;
    if (q->mem) q->m->be->free(q->mem);
    free(q->w);
    free(q);
}

loom_quant_mode loom_quant_mode_of(const loom_quant_t *q) { return q ? q->mode : LOOM_QUANT_NONE; }

const loom_tensor_t *loom_quant_weight(const loom_quant_t *q, int which, int l) {
    return &q->w[l * LOOM_QLIN_COUNT + which];
}

size_t loom_quant_bytes(const loom_quant_t *q) { return q->bytes; }

void loom_quant_fake(loom_gpt_t *m) {
    int C0 = m->cfg.channels;
    float *host = loom_malloc(4 * (size_t)C0 * C0 * sizeof(float));
    signed char *hq = loom_malloc(4 * (size_t)C0 * C0);
    float *hs = loom_malloc(4 * (size_t)C0 * sizeof(float));
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
            int OC, C;
            float *w = (float *)lin(m, k, l, &OC, &C);
            size_t n = (size_t)OC * C;
            m->be->download(host, w, n * sizeof(float));
            loom_quant_rows(host, OC, C, hq, hs);
            for (size_t i = 0; i < n; i++) host[i] = (float)hq[i] * hs[i / (size_t)C];
            m->be->upload(w, host, n * sizeof(float));
        }
    free(host), free(hq), free(hs);
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
    int C0 = m->cfg.channels;
    float *host = loom_malloc(4 * (size_t)C0 * C0 * sizeof(float));
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
    if (m->cfg.channels % 4)
        return loom_error(LOOM_EINVAL, "2:4 sparsity needs the model width to be a multiple of 4 (it is %d)", m->cfg.channels);
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
    k->n = (size_t)m->cfg.n_layer * 12 * (size_t)m->cfg.channels * m->cfg.channels;
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
