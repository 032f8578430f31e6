/* cpu_kquant: matrix products on llama.cpp's block formats as stored.
 *
 * One kernel for every format: a weight block is brought into the form of
 * qblock.h (unsigned values u in 0..63, an integer scale and min per 16
 * values, two fp32 factors), then each input row's matching block of int8
 * activations is dotted with it in integers:
 *   - AVX2: vpmaddubsw (u unsigned x xq signed, pairs to int16: at most
 *     2 * 63 * 127 = 16002, never saturating), then vpmaddwd with the
 *     scales per 16 values (int16) to int32; 32 values a step;
 *   - AVX-512 (BW): the same 64 values a step; with VNNI, vpdpwssd fuses
 *     the vpmaddwd and the add;
 *   - portable C otherwise.
 * The block's integer sum is at most 16 * 16 * 63 * 127 * 127 < 2^31 and
 * exact, so every path gives the same int32 and the float work after it
 * is one shared function: results are the same bits on every instruction
 * set. The weight block is unpacked once per pass of up to KQ_PASS input
 * rows (at decode: once per token for the whole batch). */
#include "cpu_kquant.h"
#include "cpu_kquant_gemm.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qblock.h"
#include "backend/qblock_impl.h"
#include "cpu_math.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KQ_PASS 64 /* input rows per pass over the weights */

enum { KQ_PORTABLE, KQ_AVX2, KQ_AVX512, KQ_AVX512VNNI, KQ_COUNT };
static const char *const kq_names[KQ_COUNT] = {"portable", "avx2", "avx512", "avx512vnni"};

static int kq_supported(int isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2"), avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (isa == KQ_AVX2) return avx2;
    if (isa == KQ_AVX512) return avx2 && avx512;
    if (isa == KQ_AVX512VNNI) return avx2 && avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#endif
    return isa == KQ_PORTABLE;
}

static int kq_isa_now = -1;

static int kq_pick(void) {
    if (kq_isa_now < 0) {
        int best = KQ_PORTABLE;
        for (int i = KQ_AVX2; i < KQ_COUNT; i++)
            if (kq_supported(i)) best = i;
        kq_isa_now = best;
    }
    return kq_isa_now;
}

const char *loom_cpu_kq_isa(void) { return kq_names[kq_pick()]; }

int loom_cpu_kq_use(const char *name) { return loom_cpu_isa_use(kq_names, KQ_COUNT, kq_supported, &kq_isa_now, name); }

void loom_cpu_kq_quantize_act(const float *x, int C, int blk, float *xd, int8_t *xq, int16_t *xs) {
    for (int b = 0; b < C / blk; b++) {
        const float *r = x + (size_t)b * blk;
        float mx = 0.0f;
        for (int i = 0; i < blk; i++) mx = fmaxf(mx, fabsf(r[i]));
        float d = mx / 127.0f, inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        xd[b] = d;
        for (int i = 0; i < blk; i++) xq[(size_t)b * blk + i] = (int8_t)rintf(r[i] * inv); /* |.| <= 127 */
    }
    for (int g = 0; g < C / 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += xq[16 * g + i];
        xs[g] = (int16_t)s;
    }
}

/* ---- integer dot products: sum_g sc[g] * (u . x over group g of 16) ---- */

typedef int32_t (*kq_dot_fn)(const uint8_t *u, const int8_t *x, const int16_t *sc, int n);
typedef void (*kq_unpack_fn)(loom_dtype d, const void *blk, uint8_t *u);

static int32_t dot_portable(const uint8_t *u, const int8_t *x, const int16_t *sc, int n) {
    int32_t s = 0;
    for (int g = 0; g < n / 16; g++) {
        int32_t t = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) t += (int32_t)u[i] * x[i];
        s += sc[g] * t;
    }
    return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static inline int32_t dot_avx2(const uint8_t *u, const int8_t *x, const int16_t *sc, int n) {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < n; k += 32) {
        __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + k)),
                                         _mm256_loadu_si256((const __m256i *)(x + k)));
        __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[k / 16 + 1]), _mm_set1_epi16(sc[k / 16]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
    }
    return loom_hsum_i32x8(acc);
}

/* AVX-512, 64 values a step; the scales of 4 groups spread over the 32
 * int16 pair sums (pair i belongs to group i / 8). VNNI fuses madd + add. */
#define KQ_DOT512(NAME, TGT, MADD_ADD)                                                                         \
    __attribute__((target(TGT))) static inline int32_t NAME(const uint8_t *u, const int8_t *x, const int16_t *sc, int n) { \
        if (n % 64) return dot_avx2(u, x, sc, n);                                                              \
        const __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, \
                                             1, 1, 0, 0, 0, 0, 0, 0, 0, 0);                                    \
        __m512i acc = _mm512_setzero_si512();                                                                  \
        for (int k = 0; k < n; k += 64) {                                                                      \
            __m512i p = _mm512_maddubs_epi16(_mm512_loadu_si512(u + k), _mm512_loadu_si512(x + k));            \
            __m512i s = _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(sc + k / 16)))); \
            acc = MADD_ADD;                                                                                    \
        }                                                                                                      \
        return _mm512_reduce_add_epi32(acc);                                                                   \
    }
KQ_DOT512(dot_avx512, "avx2,avx512f,avx512bw", _mm512_add_epi32(acc, _mm512_madd_epi16(p, s)))
KQ_DOT512(dot_avx512vnni, "avx2,avx512f,avx512bw,avx512vnni", _mm512_dpwssd_epi32(acc, p, s))

/* 32 bytes: 0x10 where bit j of qh is set (the fifth bit of q5_0/q5_1). */
__attribute__((target("avx2"))) static inline __m256i bits32(uint32_t qh) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Bits 2k..2k+1 (or bit k with mask 1) of every byte of v, moved to bits 4-5. */
__attribute__((target("avx2"))) static inline __m256i high_bits(__m256i v, int shift, int mask) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask)), 4);
}

__attribute__((target("avx2"))) static inline void unpack_k_avx2(loom_dtype d, const uint8_t *b, uint8_t *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (d == LOOM_Q6_K) {
        for (int h = 0; h < 2; h++) {
            __m256i q0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h)), q1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            __m256i *o = (__m256i *)(u + 128 * h);
            _mm256_storeu_si256(o, _mm256_or_si256(_mm256_and_si256(q0, m4), high_bits(qh, 0, 3)));
            _mm256_storeu_si256(o + 1, _mm256_or_si256(_mm256_and_si256(q1, m4), high_bits(qh, 2, 3)));
            _mm256_storeu_si256(o + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), high_bits(qh, 4, 3)));
            _mm256_storeu_si256(o + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4), high_bits(qh, 6, 3)));
        }
        return;
    }
    const uint8_t *qs = b + (d == LOOM_Q4_K ? 16 : 48);
    __m256i qh = d == LOOM_Q5_K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (d == LOOM_Q5_K) lo = _mm256_or_si256(lo, high_bits(qh, 2 * c, 1)), hi = _mm256_or_si256(hi, high_bits(qh, 2 * c + 1, 1));
        _mm256_storeu_si256((__m256i *)(u + 64 * c), lo);
        _mm256_storeu_si256((__m256i *)(u + 64 * c + 32), hi);
    }
}

/* The 32 unsigned values of a 32-value block (q4_0 ... q5_1). */
__attribute__((target("avx2"))) static inline __m256i unpack32_avx2(loom_dtype d, const uint8_t *b) {
    int off = d == LOOM_Q4_0 ? 2 : d == LOOM_Q4_1 ? 4 : d == LOOM_Q5_0 ? 6 : 8;
    __m128i q = _mm_loadu_si128((const __m128i *)(b + off));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    if (d == LOOM_Q5_0 || d == LOOM_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + off - 4, 4);
        v = _mm256_or_si256(v, bits32(qh));
    }
    return v;
}

__attribute__((target("avx2"))) static inline void unpack_avx2(loom_dtype d, const void *blk, uint8_t *u) {
    const uint8_t *b = blk;
    if (d >= LOOM_Q4_K) {
        unpack_k_avx2(d, b, u);
        return;
    }
    _mm256_storeu_si256((__m256i *)u, unpack32_avx2(d, b));
}

/* Eight vectors of 8 int32 partial sums to one vector of their 8 totals. */
__attribute__((target("avx2"))) static inline __m256i hsum8_i32x8(const __m256i *s) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
#endif

/* ---- the product ---- */

typedef struct {
    const int8_t *xq;  /* (N, C) */
    const float *xd;   /* (N, nb) */
    const int16_t *xs; /* (N, C / 16) */
    int C, blk, nb;
} kq_act_t;

/* acc[n - r0] = output o of input rows r0..r1-1 (before bias). Always
 * inlined into one function per instruction set with its dot and unpack
 * (constants there), so the block loop makes no calls. Block b + 1 is
 * unpacked before block b is used: the dot's wide loads then read stores
 * that have left the store buffer (a load spanning several recent
 * narrower stores waits for them, which cost a fifth of the time). */
/* The float work after a block's exact integers, one function for every
 * path so that all give the same bits. */
__attribute__((always_inline)) static inline void kq_update(float *acc, float xd, float d, float dmin, int32_t I, int32_t M) {
    *acc += xd * (d * (float)I - dmin * (float)M);
}

__attribute__((always_inline)) static inline void kq_row(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1,
                                                         float *acc, kq_dot_fn dot, kq_unpack_fn unpack) {
    const loom_qblock_info_t *qi = loom_qblock_info(w->dtype);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * a->nb * qi->bytes;
    uint8_t u[2][256] __attribute__((aligned(64)));
    loom_qblock_scales_t s[2];
    int ng = a->blk / 16;
    for (int n = r0; n < r1; n++) acc[n - r0] = 0.0f;
    loom_qblock_scales_inline(w->dtype, row, &s[0]);
    unpack(w->dtype, row, u[0]);
    for (int b = 0; b < a->nb; b++) {
        const loom_qblock_scales_t *sb = &s[b & 1];
        if (b + 1 < a->nb) {
            const uint8_t *next = row + (size_t)(b + 1) * qi->bytes;
            loom_qblock_scales_inline(w->dtype, next, &s[(b + 1) & 1]);
            unpack(w->dtype, next, u[(b + 1) & 1]);
        }
        for (int n = r0; n < r1; n++) {
            size_t at = (size_t)n * a->C + (size_t)b * a->blk;
            const int16_t *xs = a->xs + at / 16;
            int32_t I = dot(u[b & 1], a->xq + at, sb->sc, a->blk), M = 0;
            for (int g = 0; g < ng; g++) M += sb->mn[g] * xs[g];
            kq_update(&acc[n - r0], a->xd[(size_t)n * a->nb + b], sb->d, sb->dmin, I, M);
        }
    }
}

#if defined(__x86_64__)
/* The 32-value formats (q4_0 ... q5_1), whose per-block work (an fp16
 * scale, a horizontal sum, a float update per 32 values) outweighs the
 * dot itself: KQ32 blocks at a time are unpacked into registers, each
 * input row's KQ32 dots (vpmaddubsw + vpmaddwd, or VNNI's vpdpbusd: u
 * unsigned times xq signed, four products to int32) summed horizontally
 * together (hsum8_i32x8), then the same integers and kq_update as kq_row,
 * block after block: the same bits. */
#define KQ32 8
#define KQ_ROW32(NAME, TGT, DOT)                                                                                  \
    __attribute__((target(TGT))) static void NAME(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, \
                                                  float *acc) {                                                   \
        const int bytes = loom_qblock_info(w->dtype)->bytes;                                                      \
        const uint8_t *row = (const uint8_t *)w->data + (size_t)o * a->nb * bytes;                               \
        const __m256i ones = _mm256_set1_epi16(1);                                                                \
        (void)ones;                                                                                               \
        for (int n = r0; n < r1; n++) acc[n - r0] = 0.0f;                                                         \
        for (int b0 = 0; b0 < a->nb; b0 += KQ32) {                                                                \
            int k = a->nb - b0 < KQ32 ? a->nb - b0 : KQ32;                                                        \
            __m256i u[KQ32], p[KQ32];                                                                             \
            loom_qblock_scales_t sc[KQ32];                                                                        \
            for (int j = 0; j < k; j++) {                                                                         \
                loom_qblock_scales_inline(w->dtype, row + (size_t)(b0 + j) * bytes, &sc[j]);                      \
                u[j] = unpack32_avx2(w->dtype, row + (size_t)(b0 + j) * bytes);                                   \
            }                                                                                                     \
            for (int j = k; j < KQ32; j++) p[j] = _mm256_setzero_si256();                                         \
            for (int n = r0; n < r1; n++) {                                                                       \
                const int8_t *x = a->xq + (size_t)n * a->C + (size_t)b0 * 32;                                     \
                const int16_t *xs = a->xs + ((size_t)n * a->C + (size_t)b0 * 32) / 16;                            \
                for (int j = 0; j < k; j++) p[j] = DOT;                                                           \
                int32_t I[KQ32];                                                                                  \
                _mm256_storeu_si256((__m256i *)I, hsum8_i32x8(p));                                                \
                for (int j = 0; j < k; j++)                                                                       \
                    kq_update(&acc[n - r0], a->xd[(size_t)n * a->nb + b0 + j], sc[j].d, sc[j].dmin, I[j],         \
                              sc[j].mn[0] * (xs[2 * j] + xs[2 * j + 1]));                                          \
            }                                                                                                     \
        }                                                                                                         \
    }
KQ_ROW32(row32_avx2, "avx2",
         _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], _mm256_loadu_si256((const __m256i *)(x + 32 * j))), ones))
KQ_ROW32(row32_vnni, "avx2,avx512f,avx512bw,avx512vl,avx512vnni",
         _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[j], _mm256_loadu_si256((const __m256i *)(x + 32 * j))))
#endif

typedef void (*kq_row_fn)(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, float *acc);

static void row_portable(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, float *acc) {
    kq_row(w, o, a, r0, r1, acc, dot_portable, loom_qblock_values);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void row_avx2(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, float *acc) {
    kq_row(w, o, a, r0, r1, acc, dot_avx2, unpack_avx2);
}
__attribute__((target("avx2,avx512f,avx512bw"))) static void row_avx512(const loom_tensor_t *w, int o, const kq_act_t *a, int r0,
                                                                          int r1, float *acc) {
    kq_row(w, o, a, r0, r1, acc, dot_avx512, unpack_avx2);
}
__attribute__((target("avx2,avx512f,avx512bw,avx512vnni"))) static void row_avx512vnni(const loom_tensor_t *w, int o, const kq_act_t *a,
                                                                                         int r0, int r1, float *acc) {
    kq_row(w, o, a, r0, r1, acc, dot_avx512vnni, unpack_avx2);
}
#endif

static kq_row_fn kq_row_for_isa(loom_dtype d) {
#if defined(__x86_64__)
    static const kq_row_fn fns[KQ_COUNT] = {row_portable, row_avx2, row_avx512, row_avx512vnni};
    static const kq_row_fn fns32[KQ_COUNT] = {row_portable, row32_avx2, row32_avx2, row32_vnni};
    return (d < LOOM_Q4_K ? fns32 : fns)[kq_pick()];
#else
    (void)d;
    return row_portable;
#endif
}

void loom_cpu_matmul_forward_kq(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu) {
    if (loom_cpu_kq_gemm(out, inp, w, bias, N, C, OC, gelu)) return; /* many rows: the GEMM of cpu_kquant_gemm.c */
    int blk = loom_qblock_info(w->dtype)->block, nb = C / blk;
    int8_t *xq = loom_malloc((size_t)N * C);
    float *xd = loom_malloc((size_t)N * nb * sizeof(float));
    int16_t *xs = loom_malloc((size_t)N * (C / 16) * sizeof(int16_t));
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 16)
    for (int n = 0; n < N; n++)
        loom_cpu_kq_quantize_act(inp + (size_t)n * C, C, blk, xd + (size_t)n * nb, xq + (size_t)n * C, xs + (size_t)n * (C / 16));
    kq_act_t a = {xq, xd, xs, C, blk, nb};
    kq_row_fn row = kq_row_for_isa(w->dtype);
#pragma omp parallel if ((double)N * C * OC > 1 << 18)
    {
        float acc[KQ_PASS];
        for (int r0 = 0; r0 < N; r0 += KQ_PASS) {
            int r1 = r0 + KQ_PASS < N ? r0 + KQ_PASS : N;
#pragma omp for schedule(dynamic, 16) nowait
            for (int o = 0; o < OC; o++) {
                row(w, o, &a, r0, r1, acc);
                for (int n = r0; n < r1; n++) {
                    float v = acc[n - r0] + (bias ? bias[o] : 0.0f);
                    out[(size_t)n * OC + o] = gelu ? loom_gelu(v) : v;
                }
            }
        }
    }
    free(xq), free(xd), free(xs);
}
