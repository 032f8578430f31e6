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

loom_status loom_quant_create(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode) {
    const loom_backend_t *be = m->be;
    int L = m->cfg.n_layer, C0 = m->cfg.channels;
    size_t per_layer = 12 * (size_t)C0 * C0, rows_per_layer = 3 * C0 + C0 + 4 * C0 + C0;
    size_t bytes = per_layer * L + rows_per_layer * L * sizeof(float);
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
            be->download(host, w, n * sizeof(float));
            loom_quant_rows(host, OC, C, hq, hs);
            be->upload(data, hq, n);
            be->upload(scales, hs, (size_t)OC * sizeof(float));
            q->w[l * LOOM_QLIN_COUNT + k] = (loom_tensor_t){.data = data, .dtype = LOOM_INT8, .rows = OC, .cols = C,
                                                            .scales = scales};
            data += n;
            scales += OC;
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
