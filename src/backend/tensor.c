/* tensor: typed tensors (loom_tensor_t), their checks and their reference
 * meaning in fp32. Host code: the CPU reference and the tests use it. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "qblock.h"

loom_status loom_tensor_check(const loom_tensor_t *t, const char *what) {
    if (!t || !t->data) return loom_error(LOOM_EINVAL, "%s: no data", what);
    if ((unsigned)t->dtype >= LOOM_DTYPE_COUNT || t->dtype == LOOM_TF32 || t->dtype == LOOM_INT32)
        return loom_error(LOOM_EINVAL, "%s: element type %s cannot be a typed tensor (use fp32, bf16, fp16 or int8)",
                          what, loom_dtype_name(t->dtype));
    if (t->rows < 1 || t->cols < 1) return loom_error(LOOM_EINVAL, "%s: shape %lld x %lld", what, t->rows, t->cols);
    const loom_qblock_info_t *qb = loom_qblock_info(t->dtype);
    int rows8 = t->layout == LOOM_LAYOUT_ROWS8 && loom_qblock_rows8_ok(t->dtype, t->rows);
    if (qb && (t->cols % qb->block || t->scales || t->block || (t->layout != LOOM_LAYOUT_DENSE && !rows8)))
        return loom_error(LOOM_EINVAL,
                          "%s: %s needs rows of whole %d-value blocks (%lld columns), dense (or 8 rows interleaved where the format "
                          "has that layout, rows a multiple of 8), its scales inside the blocks",
                          what, qb->name, qb->block, t->cols);
    if (qb) return LOOM_OK;
    if (t->dtype == LOOM_INT8) {
        if (!t->scales) return loom_error(LOOM_EINVAL, "%s: int8 without scales", what);
        if (t->block < 0 || (t->block > 0 && t->cols % t->block))
            return loom_error(LOOM_EINVAL, "%s: block %d does not divide %lld columns", what, t->block, t->cols);
    } else if (t->scales || t->block) {
        return loom_error(LOOM_EINVAL, "%s: %s has no scales (they are for int8)", what, loom_dtype_name(t->dtype));
    }
    if (t->dtype == LOOM_INT8 && t->layout == LOOM_LAYOUT_ROWS8) {
        if (!loom_tensor_rows8_ok(t) || t->meta)
            return loom_error(LOOM_EINVAL, "%s: int8 8 rows interleaved needs blocks of 32 and a multiple of 8 rows (%lld x %lld, block %d)",
                              what, t->rows, t->cols, t->block);
    } else if (t->layout == LOOM_LAYOUT_SPARSE24) {
        if (t->cols % 4 || !t->meta)
            return loom_error(LOOM_EINVAL, "%s: 2:4 sparse needs a multiple of 4 columns (%lld) and its index bytes", what, t->cols);
    } else if (t->layout != LOOM_LAYOUT_DENSE || t->meta) {
        return loom_error(LOOM_EINVAL, "%s: unknown layout %d", what, (int)t->layout);
    }
    return LOOM_OK;
}

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Stored element i (of the kept values for 2:4) as fp32, before scales. */
static float stored(const loom_tensor_t *t, size_t i) {
    switch (t->dtype) {
    case LOOM_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)t->data)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case LOOM_FP16: return half_to_float(((const uint16_t *)t->data)[i]);
    case LOOM_INT8: return (float)((const int8_t *)t->data)[i];
    default: return ((const float *)t->data)[i];
    }
}

static float scale_at(const loom_tensor_t *t, long long r, long long c) {
    if (t->dtype != LOOM_INT8) return 1.0f;
    return t->block ? t->scales[r * (t->cols / t->block) + c / t->block] : t->scales[r];
}

void loom_tensor_dequantize(const loom_tensor_t *t, float *out) {
    if (loom_qblock_info(t->dtype) || t->layout == LOOM_LAYOUT_ROWS8) {
        for (long long r = 0; r < t->rows; r++) loom_qblock_row_values(t, r, out + r * t->cols);
        return;
    }
    for (long long r = 0; r < t->rows; r++) {
        float *o = out + r * t->cols;
        if (t->layout == LOOM_LAYOUT_DENSE) {
            for (long long c = 0; c < t->cols; c++) o[c] = stored(t, (size_t)(r * t->cols + c)) * scale_at(t, r, c);
            continue;
        }
        memset(o, 0, (size_t)t->cols * sizeof(float));
        for (long long g = 0; g < t->cols / 4; g++) {
            unsigned char m = (unsigned char)(t->meta[r * ((t->cols + 7) / 8) + g / 2] >> (g % 2 * 4));
            size_t k = (size_t)(r * (t->cols / 2) + 2 * g);
            long long c0 = 4 * g + (m & 3), c1 = 4 * g + ((m >> 2) & 3);
            o[c0] = stored(t, k) * scale_at(t, r, c0);
            o[c1] = stored(t, k + 1) * scale_at(t, r, c1);
        }
    }
}

static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                      /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* Round to nearest even, subnormals included; beyond 65504 (after
 * rounding) it is inf, as __float2half does. */
static uint16_t float_to_half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) /* subnormal: units of 2^-24, rint rounds half to even */
        return (uint16_t)(sign | (uint16_t)rintf(a * 16777216.0f));
    int e;
    float m = frexpf(a, &e);                          /* a = m * 2^e, m in [0.5, 1) */
    uint32_t mant = (uint32_t)rintf(m * 2048.0f);     /* 11 significant bits */
    if (mant == 2048) mant = 1024, e++;
    return (uint16_t)(sign | (uint16_t)((uint32_t)(e + 14) << 10) | (mant & 1023u));
}

void loom_dtype_to_f32(float *dst, const void *src, loom_dtype d, size_t n) {
    loom_tensor_t t = {.data = (void *)src, .dtype = d};
    for (size_t i = 0; i < n; i++) dst[i] = stored(&t, i);
}

void loom_dtype_from_f32(void *dst, const float *src, loom_dtype d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (d == LOOM_BF16) ((uint16_t *)dst)[i] = float_to_bf16(src[i]);
        else if (d == LOOM_FP16) ((uint16_t *)dst)[i] = float_to_half(src[i]);
        else ((float *)dst)[i] = src[i];
    }
}
