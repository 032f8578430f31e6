/* cpu_int8: int8-weight matrix products for inference (decode and
 * prefill). Each output element is computed from its own weight row in a
 * fixed order, so results depend neither on N nor on the threads. */
#include "cpu_int8.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

int loom_cpu_int8_vnni(void) {
#if defined(__x86_64__)
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vnni");
        if (getenv("LOOM_NO_VNNI")) v = 0;
    }
    return v;
#else
    return 0;
#endif
}

void loom_cpu_quantize_rows(const float *x, int N, int C, signed char *q, float *s) {
    for (int n = 0; n < N; n++) {
        const float *r = x + (size_t)n * C;
        float mx = 0.0f;
        for (int c = 0; c < C; c++) mx = fmaxf(mx, fabsf(r[c]));
        float sc = mx > 0.0f ? mx / 127.0f : 1.0f, inv = 1.0f / sc;
        s[n] = sc;
        for (int c = 0; c < C; c++) {
            float v = roundf(r[c] * inv);
            q[(size_t)n * C + c] = (signed char)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
}

static inline float finish(float v, const float *bias, int o, int gelu) {
    v += bias ? bias[o] : 0.0f;
    return gelu ? loom_gelu(v) : v;
}

/* Weight row o against every input row, fp32 sums per scale block. */
static void w8_row(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC,
                   int gelu, int o) {
    const int8_t *wr = (const int8_t *)w->data + (size_t)o * C;
    int blk = w->block ? w->block : C, nb = C / blk;
    const float *sc = w->block ? w->scales + (size_t)o * nb : w->scales + o;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int c = b * blk; c < (b + 1) * blk; c++) part += x[c] * (float)wr[c];
            acc += part * sc[w->block ? b : 0];
        }
        out[(size_t)n * OC + o] = finish(acc, bias, o, gelu);
    }
}

void loom_cpu_matmul_forward_w8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu) {
#pragma omp parallel for schedule(dynamic, 16) if ((double)N * C * OC > 1 << 18)
    for (int o = 0; o < OC; o++) w8_row(out, inp, w, bias, N, C, OC, gelu, o);
}

/* Portable int32 dot product of two int8 rows. */
static int32_t dot_i8(const int8_t *a, const int8_t *b, int C) {
    int32_t acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int c = 0; c < C; c++) acc += (int32_t)a[c] * (int32_t)b[c];
    return acc;
}

#if defined(__x86_64__)
/* VNNI: dpbusd multiplies unsigned by signed bytes, so the activations go
 * in shifted by +128 (xu = xq + 128, precomputed) and 128 * sum(w) comes
 * off afterwards: exact in int32. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int32_t dot_u8s8_vnni(const uint8_t *xu,
                                                                                    const int8_t *w, int C,
                                                                                    int32_t wsum) {
    __m512i acc = _mm512_setzero_si512();
    int c = 0;
    for (; c + 64 <= C; c += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(xu + c), _mm512_loadu_si512(w + c));
    int32_t s = _mm512_reduce_add_epi32(acc);
    for (; c < C; c++) s += (int32_t)xu[c] * (int32_t)w[c];
    return s - 128 * wsum;
}
#endif

static void w8a8_row(float *out, const int8_t *xq, const uint8_t *xu, const float *sx, const loom_tensor_t *w,
                     const float *bias, int N, int C, int OC, int gelu, int o) {
    const int8_t *wr = (const int8_t *)w->data + (size_t)o * C;
    float sw = w->scales[o];
#if defined(__x86_64__)
    if (xu) {
        int32_t wsum = 0;
        for (int c = 0; c < C; c++) wsum += wr[c];
        for (int n = 0; n < N; n++)
            out[(size_t)n * OC + o] =
                finish((float)dot_u8s8_vnni(xu + (size_t)n * C, wr, C, wsum) * (sx[n] * sw), bias, o, gelu);
        return;
    }
#endif
    (void)xu;
    for (int n = 0; n < N; n++)
        out[(size_t)n * OC + o] = finish((float)dot_i8(xq + (size_t)n * C, wr, C) * (sx[n] * sw), bias, o, gelu);
}

void loom_cpu_matmul_forward_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                  int N, int C, int OC, int gelu) {
    if (w->block) {
        loom_cpu_matmul_forward_w8(out, inp, w, bias, N, C, OC, gelu);
        return;
    }
    int8_t *xq = malloc((size_t)N * C);
    float *sx = malloc((size_t)N * sizeof(float));
    uint8_t *xu = NULL;
    loom_cpu_quantize_rows(inp, N, C, (signed char *)xq, sx);
    if (loom_cpu_int8_vnni()) {
        xu = malloc((size_t)N * C);
        for (size_t i = 0; i < (size_t)N * C; i++) xu[i] = (uint8_t)(xq[i] + 128);
    }
#pragma omp parallel for schedule(dynamic, 16) if ((double)N * C * OC > 1 << 18)
    for (int o = 0; o < OC; o++) w8a8_row(out, xq, xu, sx, w, bias, N, C, OC, gelu, o);
    free(xq);
    free(sx);
    free(xu);
}

/* ---- int8 paged KV cache ---- */

#define MAX_BLOCK 256 /* the largest block_size the engine accepts */

/* Token `off` of cache row `r` (block, K/V, head) gets v (hs). */
static void kv_put(const loom_tensor_t *kv, size_t r, int off, int hs, const float *v) {
    int8_t *row = (int8_t *)kv->data + r * (size_t)kv->cols;
    float *sc = (float *)kv->scales + r, mx = 0.0f;
    for (int e = 0; e < hs; e++) mx = fmaxf(mx, fabsf(v[e]));
    if (off == 0) {
        *sc = mx > 0.0f ? mx / 127.0f : 1.0f;
    } else if (mx > 127.0f * *sc) { /* raise the row's scale: requantize tokens 0..off-1 */
        float ns = mx / 127.0f, k = *sc / ns;
        for (int i = 0; i < off * hs; i++) row[i] = (int8_t)lroundf((float)row[i] * k);
        *sc = ns;
    }
    float inv = 1.0f / *sc;
    for (int e = 0; e < hs; e++) {
        float q = roundf(v[e] * inv);
        row[(size_t)off * hs + e] = (int8_t)(q > 127.0f ? 127 : q < -127.0f ? -127 : q);
    }
}

void loom_cpu_kv_write_int8(const loom_tensor_t *kv, const float *qkv, const int *slots, int N, int NH, int bs) {
    int hs = (int)(kv->cols / bs), C = NH * hs;
    /* one task per (K or V, head): rows of one block are written in batch
     * order, so a prefill chunk's tokens raise the scale in turn */
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 16)
    for (int task = 0; task < 2 * NH; task++) {
        int which = task / NH, h = task % NH;
        for (int i = 0; i < N; i++) {
            int blk = slots[i] / bs, off = slots[i] % bs;
            size_t r = ((size_t)blk * 2 + which) * NH + h;
            kv_put(kv, r, off, hs, qkv + (size_t)i * 3 * C + (size_t)(1 + which) * C + h * hs);
        }
    }
}

/* One (row, head) over an int8 cache: o (hs) = softmax(q K^T / sqrt(hs)) V,
 * online softmax block by block as the fp32 kernel. */
static void attend_row_int8(float *o, const float *q, const loom_tensor_t *kv, int NH, int bs, const int *table,
                            int pos, int h) {
    int hs = (int)(kv->cols / bs);
    float scale = 1.0f / sqrtf((float)hs), mx = -INFINITY, sum = 0, s[MAX_BLOCK];
    for (int e = 0; e < hs; e++) o[e] = 0.0f;
    for (int t0 = 0; t0 <= pos; t0 += bs) {
        int n = pos + 1 - t0 < bs ? pos + 1 - t0 : bs, blk = table[t0 / bs];
        size_t rk = ((size_t)blk * 2) * NH + h, rv = ((size_t)blk * 2 + 1) * NH + h;
        const int8_t *K = (const int8_t *)kv->data + rk * (size_t)kv->cols;
        const int8_t *V = (const int8_t *)kv->data + rv * (size_t)kv->cols;
        float sk = kv->scales[rk] * scale, sv = kv->scales[rv], bmx = mx;
        for (int j = 0; j < n; j++) {
            float d = 0;
#pragma omp simd reduction(+ : d)
            for (int e = 0; e < hs; e++) d += q[e] * (float)K[(size_t)j * hs + e];
            s[j] = d * sk;
            bmx = s[j] > bmx ? s[j] : bmx;
        }
        float corr = loom_expf(mx - bmx);
        sum *= corr;
#pragma omp simd
        for (int e = 0; e < hs; e++) o[e] *= corr;
        for (int j = 0; j < n; j++) {
            float p = loom_expf(s[j] - bmx);
            sum += p;
            p *= sv;
#pragma omp simd
            for (int e = 0; e < hs; e++) o[e] = fmaf(p, (float)V[(size_t)j * hs + e], o[e]);
        }
        mx = bmx;
    }
    float inv = 1.0f / sum;
    for (int e = 0; e < hs; e++) o[e] *= inv;
}

void loom_cpu_paged_attention_int8(float *out, const float *qkv, const loom_tensor_t *kv, const int *pos,
                                   const int *seq, const int *block_tables, int max_blocks, int N, int NH, int bs) {
    int hs = (int)(kv->cols / bs), C = NH * hs, tasks = N * NH;
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * C > 1 << 12)
    for (int task = 0; task < tasks; task++) {
        int i = task / NH, h = task % NH;
        attend_row_int8(out + (size_t)i * C + h * hs, qkv + (size_t)i * 3 * C + h * hs, kv, NH, bs,
                        block_tables + (size_t)seq[i] * max_blocks, pos[i], h);
    }
}

void loom_cpu_kv_copy_block_int8(const loom_tensor_t *kv, int src, int dst, int NH) {
    size_t n = 2 * (size_t)NH * (size_t)kv->cols;
    memcpy((int8_t *)kv->data + (size_t)dst * n, (const int8_t *)kv->data + (size_t)src * n, n);
    memcpy((float *)kv->scales + (size_t)dst * 2 * NH, kv->scales + (size_t)src * 2 * NH, 2 * (size_t)NH * sizeof(float));
}
