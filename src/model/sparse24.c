#include "sparse24.h"

#include "quant.h"

#include <stdlib.h>
#include <string.h>

struct loom_sparse24 {
    const loom_gpt_t *m;
    int L;
    loom_tensor_t *w; /* (L, LOOM_QLIN_COUNT) */
    void *mem;        /* one backend allocation: every weight's values, then every weight's index bytes */
    size_t bytes;
    int dense_gone;   /* the model's dense linear weights were given back (loom_sparse24_dense_gone) */
};

/* The linear weights of a block: parameter, and its name in messages
 * (GPT-2's Hugging Face module; the Llama family's q/k/v and gate/up are
 * fused in loom, so loom's tensor name there). */
static const struct {
    int param;
    const char *gpt2, *llama;
} lin_table[LOOM_QLIN_COUNT] = {
    [LOOM_QLIN_QKV] = {LOOM_QKVW, "attn.c_attn", "self_attn.qkv (q_proj, k_proj, v_proj)"},
    [LOOM_QLIN_ATTPROJ] = {LOOM_ATTPROJW, "attn.c_proj", "self_attn.o_proj"},
    [LOOM_QLIN_FC] = {LOOM_FCW, "mlp.c_fc", "mlp.gate_up (gate_proj, up_proj)"},
    [LOOM_QLIN_FCPROJ] = {LOOM_FCPROJW, "mlp.c_proj", "mlp.down_proj"},
};

/* Layer l's weight `which` in m's memory, (OC, C) as the parameter table says. */
static const float *weight_at(const loom_gpt_t *m, int which, int l, int *OC, int *C) {
    const loom_tensor_info_t *t = &m->ptable[lin_table[which].param];
    *OC = t->shape[1], *C = t->shape[2];
    return loom_gpt_slice(m, m->param, lin_table[which].param, l);
}

/* Floats of the largest linear weight of a block. */
static size_t largest(const loom_gpt_t *m) {
    size_t big = 0;
    for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
        int OC, C;
        weight_at(m, k, 0, &OC, &C);
        big = (size_t)OC * C > big ? (size_t)OC * C : big;
    }
    return big;
}

void loom_sparse24_compress(const float *w, long long rows, long long cols, float *values, unsigned char *meta) {
    long long ms = (cols + 7) / 8;
    memset(meta, 0, (size_t)(rows * ms));
    for (long long r = 0; r < rows; r++)
        for (long long g = 0; g < cols / 4; g++) {
            const float *x = w + r * cols + 4 * g;
            int pos[2], k = 0;
            for (int i = 0; i < 4 && k < 2; i++) /* the non-zeros, then zeros to make two */
                if (x[i] != 0.0f) pos[k++] = i;
            for (int i = 0; i < 4 && k < 2; i++)
                if (x[i] == 0.0f) pos[k++] = i;
            if (pos[0] > pos[1]) {
                int t = pos[0];
                pos[0] = pos[1], pos[1] = t;
            }
            values[r * (cols / 2) + 2 * g] = x[pos[0]];
            values[r * (cols / 2) + 2 * g + 1] = x[pos[1]];
            meta[r * ms + g / 2] |= (unsigned char)((pos[0] | pos[1] << 2) << (g % 2 * 4));
        }
}

void loom_sparse24_decompress(const loom_tensor_t *w, float *out) {
    long long rows = w->rows, cols = w->cols, ms = (cols + 7) / 8;
    const float *v = w->data;
    memset(out, 0, (size_t)(rows * cols) * sizeof *out);
    for (long long r = 0; r < rows; r++)
        for (long long g = 0; g < cols / 4; g++) {
            int bits = w->meta[r * ms + g / 2] >> (g % 2 * 4);
            float *x = out + r * cols + 4 * g;
            x[bits & 3] = v[r * (cols / 2) + 2 * g];
            x[bits >> 2 & 3] = v[r * (cols / 2) + 2 * g + 1];
        }
}

/* LOOM_OK when every linear weight of m is 2:4 (host copies in `host`,
 * largest(m) floats); else LOOM_EINVAL naming the first that is not. */
static loom_status check_24(const loom_gpt_t *m, float *host) {
    if (m->cfg.channels % 4 || m->cfg.ffn_hidden % 4)
        return loom_error(LOOM_EINVAL, "2:4 sparsity needs the model width (%d) and MLP width (%d) to be multiples of 4",
                          m->cfg.channels, m->cfg.ffn_hidden);
    int gpt2 = !strcmp(loom_gpt_family(&m->cfg), "gpt2");
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
            int OC, C;
            const float *w = weight_at(m, k, l, &OC, &C);
            m->be->download(host, w, (size_t)OC * C * sizeof(float));
            long long bad = loom_prune24_violations(host, OC, C);
            if (bad)
                return loom_error(LOOM_EINVAL, "%s.%d.%s.weight: %lld of %d groups of 4 have more than 2 non-zero weights, so it is not 2:4 sparse (loom prune --sparsity 2:4 makes it so)",
                                  gpt2 ? "h" : "model.layers", l, gpt2 ? lin_table[k].gpt2 : lin_table[k].llama, bad, OC * C / 4);
        }
    return LOOM_OK;
}

/* Compress every linear weight into s->mem (values first, then index bytes). */
static void fill(loom_sparse24_t *s, float *host, float *hv, unsigned char *hm, size_t value_bytes) {
    const loom_gpt_t *m = s->m;
    char *values = s->mem, *meta = (char *)s->mem + value_bytes;
    for (int l = 0; l < s->L; l++)
        for (int k = 0; k < LOOM_QLIN_COUNT; k++) {
            int OC, C;
            const float *w = weight_at(m, k, l, &OC, &C);
            size_t nv = (size_t)OC * (C / 2) * sizeof(float), nm = (size_t)OC * ((C + 7) / 8);
            m->be->download(host, w, (size_t)OC * C * sizeof(float));
            loom_sparse24_compress(host, OC, C, hv, hm);
            m->be->upload(values, hv, nv);
            m->be->upload(meta, hm, nm);
            s->w[l * LOOM_QLIN_COUNT + k] = (loom_tensor_t){.data = values, .dtype = LOOM_FP32, .rows = OC, .cols = C,
                                                            .layout = LOOM_LAYOUT_SPARSE24,
                                                            .meta = (const unsigned char *)meta};
            values += nv;
            meta += nm;
        }
}

loom_status loom_sparse24_create(loom_sparse24_t **out, const loom_gpt_t *m) {
    const loom_backend_t *be = m->be;
    int L = m->cfg.n_layer;
    size_t big = largest(m), value_bytes = 0, meta_bytes = 0, meta_most = 0;
    float *host = loom_malloc(big * sizeof(float));
    loom_status st = check_24(m, host);
    if (st != LOOM_OK) {
        free(host);
        return st;
    }
    for (int k = 0; k < LOOM_QLIN_COUNT; k++) { /* half the values, and a byte per 8 columns of positions */
        int OC, C;
        weight_at(m, k, 0, &OC, &C);
        value_bytes += (size_t)L * OC * (C / 2) * sizeof(float);
        meta_bytes += (size_t)L * OC * ((C + 7) / 8);
        meta_most = (size_t)OC * ((C + 7) / 8) > meta_most ? (size_t)OC * ((C + 7) / 8) : meta_most;
    }
    loom_sparse24_t *s = loom_calloc(1, sizeof *s);
    s->m = m, s->L = L, s->bytes = value_bytes + meta_bytes;
    s->w = loom_calloc((size_t)L * LOOM_QLIN_COUNT, sizeof *s->w);
    s->mem = be->alloc(s->bytes);
    if (!s->mem) {
        free(host);
        loom_sparse24_free(s);
        return loom_error(LOOM_ENOMEM, "cannot allocate %zu bytes of compressed 2:4 weights on %s", value_bytes + meta_bytes, be->name);
    }
    float *hv = loom_malloc(big / 2 * sizeof(float));
    unsigned char *hm = loom_malloc(meta_most);
    fill(s, host, hv, hm, value_bytes);
    free(host), free(hv), free(hm);
    *out = s;
    return LOOM_OK;
}

loom_status loom_sparse24_auto(loom_sparse24_t **out, const loom_gpt_t *m, int mode) {
    *out = NULL;
    if (mode == LOOM_SPARSE_OFF) return LOOM_OK;
    float *host = loom_malloc(largest(m) * sizeof(float));
    loom_status st = check_24(m, host);
    free(host);
    if (st != LOOM_OK) return LOOM_OK; /* dense weights: nothing to compress */
    if (!m->be->matmul_forward_s24) {
        loom_warn("the linear weights are 2:4 sparse, but the %s backend has no compressed 2:4 kernel (matmul_forward_s24): they run dense (fp32 matmul_forward_rows)",
                  m->be->name);
        return LOOM_OK;
    }
    LOOM_TRY(loom_sparse24_create(out, m));
    double dense = 0;
    for (int k = 0; k < LOOM_QLIN_COUNT; k++) dense += (double)m->ptable[lin_table[k].param].numel * sizeof(float);
    loom_info("2:4 sparse linear weights run compressed: %.1f MB of values and positions instead of %.1f MB (--sparse off runs them dense)",
              (*out)->bytes / 1e6, dense / 1e6);
    return LOOM_OK;
}

void loom_sparse24_free(loom_sparse24_t *s) {
    if (!s) return;
    loom_linear_copy_release(s->m, s->w, s->mem);
    free(s);
}

const loom_tensor_t *loom_sparse24_weight(const loom_sparse24_t *s, int which, int l) {
    return &s->w[l * LOOM_QLIN_COUNT + which];
}

size_t loom_sparse24_bytes(const loom_sparse24_t *s) { return s->bytes; }

void loom_sparse24_set_dense_gone(loom_sparse24_t *s) { s->dense_gone = 1; }

int loom_sparse24_dense_gone(const loom_sparse24_t *s) { return s && s->dense_gone; }
