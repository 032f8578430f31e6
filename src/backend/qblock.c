/* qblock: the block formats' sizes, their reference dequantization and
 * their expansion into the kernels' form (qblock.h). */
#include "qblock.h"
#include "qblock_impl.h"

#include <stdlib.h>
#include <string.h>

/* Fused multiply-adds would round once where gguf-py rounds twice. */
#pragma GCC optimize("fp-contract=off")

static const loom_qblock_info_t infos[] = {
    [LOOM_Q4_0 - LOOM_Q4_0] = {"q4_0", 2, 32, 18},   [LOOM_Q4_1 - LOOM_Q4_0] = {"q4_1", 3, 32, 20},
    [LOOM_Q5_0 - LOOM_Q4_0] = {"q5_0", 6, 32, 22},   [LOOM_Q5_1 - LOOM_Q4_0] = {"q5_1", 7, 32, 24},
    [LOOM_Q4_K - LOOM_Q4_0] = {"q4_K", 12, 256, 144}, [LOOM_Q5_K - LOOM_Q4_0] = {"q5_K", 13, 256, 176},
    [LOOM_Q6_K - LOOM_Q4_0] = {"q6_K", 14, 256, 210},
};

const loom_qblock_info_t *loom_qblock_info(loom_dtype d) {
    return d >= LOOM_Q4_0 && d <= LOOM_Q6_K ? &infos[d - LOOM_Q4_0] : NULL;
}

int loom_qblock_of_ggml(uint32_t ggml) {
    for (int d = LOOM_Q4_0; d <= LOOM_Q6_K; d++)
        if (infos[d - LOOM_Q4_0].ggml == ggml) return d;
    return -1;
}

size_t loom_qblock_row_bytes(loom_dtype d, long long cols) {
    const loom_qblock_info_t *q = loom_qblock_info(d);
    return q ? (size_t)(cols / q->block) * (size_t)q->bytes : 0;
}

/* Value j of a 32-block's nibbles qs[16] (and fifth bits qh, or none). */
static int nib32(const uint8_t *qs, uint32_t qh, int j) {
    int lo = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
    return lo | (int)((qh >> j) & 1) << 4;
}

void loom_qblock_values(loom_dtype d, const void *blk, uint8_t *u) {
    const uint8_t *b = blk;
    uint32_t qh = 0;
    switch (d) {
    case LOOM_Q4_0: for (int j = 0; j < 32; j++) u[j] = (uint8_t)nib32(b + 2, 0, j); break;
    case LOOM_Q4_1: for (int j = 0; j < 32; j++) u[j] = (uint8_t)nib32(b + 4, 0, j); break;
    case LOOM_Q5_0: memcpy(&qh, b + 2, 4); for (int j = 0; j < 32; j++) u[j] = (uint8_t)nib32(b + 6, qh, j); break;
    case LOOM_Q5_1: memcpy(&qh, b + 4, 4); for (int j = 0; j < 32; j++) u[j] = (uint8_t)nib32(b + 8, qh, j); break;
    case LOOM_Q4_K:
    case LOOM_Q5_K: {
        const uint8_t *h = b + 16, *qs = d == LOOM_Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 256; j++) {
            int c = j / 64, l = j % 32, hi = (j / 32) & 1;
            int v = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
            if (d == LOOM_Q5_K) v |= ((h[l] >> (j / 32)) & 1) << 4;
            u[j] = (uint8_t)v;
        }
        break;
    }
    case LOOM_Q6_K:
        for (int j = 0; j < 256; j++) {
            int half = j / 128, k = (j % 128) / 32, l = j % 32;
            const uint8_t *ql = b + 64 * half, *qh6 = b + 128 + 32 * half;
            int lo = k & 1 ? ql[l + 32] : ql[l];
            lo = k >= 2 ? lo >> 4 : lo & 0xF;
            u[j] = (uint8_t)(lo | ((qh6[l] >> (2 * k)) & 3) << 4);
        }
        break;
    default: break;
    }
}

void loom_qblock_scales(loom_dtype d, const void *blk, loom_qblock_scales_t *s) { loom_qblock_scales_inline(d, blk, s); }

size_t loom_qblock_tensor_bytes(const loom_tensor_t *t) {
    size_t n = (size_t)t->rows * (size_t)t->cols;
    if (loom_qblock_info(t->dtype)) return loom_qblock_row_bytes(t->dtype, t->cols) * (size_t)t->rows;
    if (t->dtype == LOOM_INT8) return n + 4 * (t->block ? n / (size_t)t->block : (size_t)t->rows);
    return n * loom_dtype_size(t->dtype);
}

/* One block as gguf-py computes it: its float operations in its order. */
static void dequantize_block(loom_dtype d, const uint8_t *b, float *out) {
    uint8_t u[256];
    loom_qblock_values(d, b, u);
    switch (d) {
    case LOOM_Q4_0: case LOOM_Q5_0: {
        float s = qblock_f16(b);
        int off = d == LOOM_Q4_0 ? 8 : 16;
        for (int j = 0; j < 32; j++) out[j] = s * (float)(u[j] - off);
        break;
    }
    case LOOM_Q4_1: case LOOM_Q5_1: {
        float s = qblock_f16(b), m = qblock_f16(b + 2);
        for (int j = 0; j < 32; j++) out[j] = s * (float)u[j] + m;
        break;
    }
    case LOOM_Q4_K: case LOOM_Q5_K: {
        float s = qblock_f16(b), smin = qblock_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            qblock_scale_min_k4(j, b + 4, &sc, &m);
            float dl = s * (float)sc, ml = smin * (float)m;
            for (int l = 0; l < 32; l++) out[32 * j + l] = dl * (float)u[32 * j + l] - ml;
        }
        break;
    }
    case LOOM_Q6_K: {
        float s = qblock_f16(b + 208);
        for (int g = 0; g < 16; g++) {
            float dl = s * (float)(int8_t)b[192 + g];
            for (int l = 0; l < 16; l++) out[16 * g + l] = dl * (float)(u[16 * g + l] - 32);
        }
        break;
    }
    default: break;
    }
}

void loom_qblock_dequantize(loom_dtype d, const void *src, size_t n, float *out) {
    const loom_qblock_info_t *q = loom_qblock_info(d);
    if (!q) return;
    for (size_t b = 0; b < n / (size_t)q->block; b++)
        dequantize_block(d, (const uint8_t *)src + b * (size_t)q->bytes, out + b * (size_t)q->block);
}

/* ---- 8 rows interleaved ---- */

/* Row r's dense block blk and its fields' places in group block g
 * (qblock.h), copied into g (into != 0) or back out into blk: the one
 * statement of the layout. */
static void rows8_copy(loom_dtype d, uint8_t *g, int r, uint8_t *blk, int into) {
#define R8_PIECE(at_g, at_b, n) (into ? memcpy(g + (at_g), blk + (at_b), n) : memcpy(blk + (at_b), g + (at_g), n))
    if (d == LOOM_Q6_K) {
        for (int p = 0; p < 48; p++) R8_PIECE(144 + 32 * p + 4 * r, 4 * p, 4); /* ql, then qh: 4 bytes a piece */
        for (int s = 0; s < 16; s++) R8_PIECE(16 + 8 * s + r, 192 + s, 1);    /* scales */
        R8_PIECE(2 * r, 208, 2);                                               /* d */
        return;
    }
    if (d == LOOM_Q4_K) {
        R8_PIECE(2 * r, 0, 2), R8_PIECE(16 + 2 * r, 2, 2);                        /* d, dmin */
        for (int k = 0; k < 12; k++) R8_PIECE(32 + 8 * k + r, 4 + k, 1);          /* scales */
        for (int p = 0; p < 32; p++) R8_PIECE(128 + 32 * p + 4 * r, 16 + 4 * p, 4); /* qs: piece p = 8c + i at 256c + 32i */
        return;
    }
    int hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1, five = d == LOOM_Q5_0 || d == LOOM_Q5_1, at = 16;
    R8_PIECE(2 * r, 0, 2);                          /* d */
    if (hasmin) R8_PIECE(at + 2 * r, 2, 2), at += 16; /* m */
    if (five) R8_PIECE(at + 4 * r, 2 + 2 * hasmin, 4), at += 32; /* qh */
    for (int p = 0; p < 4; p++) R8_PIECE(at + 32 * p + 4 * r, 2 + 2 * hasmin + 4 * five + 4 * p, 4); /* qs */
#undef R8_PIECE
}

int loom_qblock_rows8_ok(loom_dtype d, long long rows) {
    return (d == LOOM_Q4_K || d == LOOM_Q6_K || d == LOOM_Q4_0 || d == LOOM_Q4_1 || d == LOOM_Q5_0 || d == LOOM_Q5_1) && rows % 8 == 0;
}

loom_status loom_qblock_rows8(loom_dtype d, void *data, long long rows, long long cols) {
    const loom_qblock_info_t *q = loom_qblock_info(d);
    const size_t bytes = (size_t)q->bytes, nb = (size_t)cols / (size_t)q->block, group = nb * 8 * bytes;
    uint8_t *tmp = malloc(group), *base = data;
    if (!tmp) return loom_error(LOOM_ENOMEM, "%s rows interleaved: no memory for %zu bytes", q->name, group);
    for (long long g = 0; g < rows / 8; g++) {
        uint8_t *p = base + (size_t)g * group;
        memcpy(tmp, p, group);
        for (int r = 0; r < 8; r++)
            for (size_t b = 0; b < nb; b++) rows8_copy(d, p + b * 8 * bytes, r, tmp + ((size_t)r * nb + b) * bytes, 1);
    }
    free(tmp);
    return LOOM_OK;
}

void loom_qblock_rows8_block(loom_dtype d, const void *g, int r, void *blk) {
    rows8_copy(d, (uint8_t *)g, r, blk, 0); /* g only read */
}

/* q8_0 as loom holds it (int8 in blocks of 32, fp32 scales): block b of
 * rows 8g .. 8g + 7 is 256 bytes at 8 g C + 256 b, 4 values of each row a
 * piece (value 4p + i of row r at 32p + 4r + i); its 8 scales at
 * 8 g nb + 8 b + r. Row r's block b (32 values v, scale *s) copied into
 * group gw / gs (into != 0) or back out: the one statement of the layout. */
static void q8_rows8_copy(int8_t *gw, float *gs, int r, size_t b, int8_t *v, float *s, int into) {
    for (size_t p = 0; p < 8; p++) {
        int8_t *at = gw + 256 * b + 32 * p + 4 * (size_t)r;
        into ? memcpy(at, v + 4 * p, 4) : memcpy(v + 4 * p, at, 4);
    }
    into ? (void)(gs[8 * b + (size_t)r] = *s) : (void)(*s = gs[8 * b + (size_t)r]);
}

int loom_tensor_rows8_ok(const loom_tensor_t *t) {
    if (t->dtype == LOOM_INT8) return t->block == 32 && t->cols % 32 == 0 && t->rows % 8 == 0;
    return loom_qblock_rows8_ok(t->dtype, t->rows) && t->cols % loom_qblock_info(t->dtype)->block == 0;
}

loom_status loom_tensor_rows8(loom_tensor_t *t) {
    if (t->dtype != LOOM_INT8) {
        LOOM_TRY(loom_qblock_rows8(t->dtype, t->data, t->rows, t->cols));
        t->layout = LOOM_LAYOUT_ROWS8;
        return LOOM_OK;
    }
    const size_t C = (size_t)t->cols, nb = C / 32;
    int8_t *tmp = malloc(8 * C);
    float *stmp = malloc(8 * nb * sizeof(float));
    if (!tmp || !stmp) {
        free(tmp), free(stmp);
        return loom_error(LOOM_ENOMEM, "q8_0 rows interleaved: no memory for %zu bytes", 8 * C + 32 * nb);
    }
    for (long long g = 0; g < t->rows / 8; g++) {
        int8_t *p = (int8_t *)t->data + (size_t)g * 8 * C;
        float *sc = (float *)t->scales + (size_t)g * 8 * nb;
        memcpy(tmp, p, 8 * C), memcpy(stmp, sc, 8 * nb * sizeof(float));
        for (int r = 0; r < 8; r++)
            for (size_t b = 0; b < nb; b++) q8_rows8_copy(p, sc, r, b, tmp + (size_t)r * C + 32 * b, stmp + (size_t)r * nb + b, 1);
    }
    free(tmp), free(stmp);
    t->layout = LOOM_LAYOUT_ROWS8;
    return LOOM_OK;
}

void loom_tensor_rows8_dense(const loom_tensor_t *t, int8_t *q, float *scales) {
    const size_t C = (size_t)t->cols, nb = C / 32;
    for (long long row = 0; row < t->rows; row++) {
        int8_t *gw = (int8_t *)t->data + (size_t)(row / 8) * 8 * C; /* only read */
        float *gs = (float *)t->scales + (size_t)(row / 8) * 8 * nb;
        for (size_t b = 0; b < nb; b++) q8_rows8_copy(gw, gs, (int)(row % 8), b, q + (size_t)row * C + 32 * b, scales + (size_t)row * nb + b, 0);
    }
}

const uint8_t *loom_qblock_at(const loom_tensor_t *t, long long r, long long b, uint8_t *tmp) {
    size_t rb = loom_qblock_row_bytes(t->dtype, t->cols), bytes = (size_t)loom_qblock_info(t->dtype)->bytes;
    if (t->layout != LOOM_LAYOUT_ROWS8) return (const uint8_t *)t->data + (size_t)r * rb + (size_t)b * bytes;
    loom_qblock_rows8_block(t->dtype, (const uint8_t *)t->data + (size_t)(r / 8) * 8 * rb + (size_t)b * 8 * bytes, (int)(r % 8), tmp);
    return tmp;
}

void loom_qblock_row_values(const loom_tensor_t *t, long long r, float *out) {
    if (t->dtype == LOOM_INT8) { /* value times its block's (or row's) scale */
        const size_t C = (size_t)t->cols, blk = t->block ? (size_t)t->block : C, nb = C / blk;
        const int8_t *q = (const int8_t *)t->data + (size_t)r * C;
        const float *sc = t->scales + (size_t)r * nb;
        if (t->layout != LOOM_LAYOUT_ROWS8) {
            for (size_t i = 0; i < C; i++) out[i] = (float)q[i] * sc[i / blk];
            return;
        }
        int8_t *gw = (int8_t *)t->data + (size_t)(r / 8) * 8 * C, v[32]; /* only read */
        float *gs = (float *)t->scales + (size_t)(r / 8) * 8 * nb, s;
        for (size_t b = 0; b < nb; b++) {
            q8_rows8_copy(gw, gs, (int)(r % 8), b, v, &s, 0);
            for (int i = 0; i < 32; i++) out[32 * b + (size_t)i] = (float)v[i] * s;
        }
        return;
    }
    const loom_qblock_info_t *q = loom_qblock_info(t->dtype);
    if (t->layout != LOOM_LAYOUT_ROWS8) {
        loom_qblock_dequantize(t->dtype, loom_qblock_at(t, r, 0, NULL), (size_t)t->cols, out);
        return;
    }
    uint8_t blk[256];
    for (long long b = 0; b < t->cols / q->block; b++)
        loom_qblock_dequantize(t->dtype, loom_qblock_at(t, r, b, blk), (size_t)q->block, out + b * q->block);
}
