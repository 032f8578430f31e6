/* cpu_int8: int8-weight matrix products for inference (decode and
 * prefill) and the int8 paged KV cache's write and copy.
 *
 * W8A32 (matmul_forward_w8) is the fp32 row kernel of cpu_paged.c with
 * each weight widened and scaled in registers.
 *
 * W8A8 (matmul_forward_w8a8): each input row is quantized per token (with
 * per-block weight scales, per block of the weight's size instead, as
 * llama.cpp's Q8_0 x Q8_0: docs/quantization.md says why), then
 * a tile of I8_TM input rows x I8_TJ weight rows is computed per pass, so
 * each weight byte is loaded once per I8_TM rows (at decode: once per step
 * for every sequence of the batch), and the threads split the weight rows
 * (cpu_team.h: its team at decode, OpenMP's above). The
 * int8 x int8 -> int32 dot product, by instruction set (runtime dispatch on
 * cpuid, whatever -march says):
 *   - AVX-512 VNNI: vpdpbusd on (x + 128) as unsigned times w signed, then
 *     128 * sum(w) subtracted (vpdpbusd on 128s): exact, no saturation;
 *   - AVX-VNNI: the same with 256-bit vpdpbusd;
 *   - AVX2: the sign trick: |x| (unsigned) times w with x's sign
 *     (vpsignb), vpmaddubsw to int16 pairs (|.| <= 2 * 127 * 127 < 2^15:
 *     quantized values are within +-127, so it never saturates), vpmaddwd
 *     with ones to int32;
 *   - portable C otherwise.
 * With one scale per weight row the whole row's int32 sum is exact and the
 * result is the same on every path; with per-block scales (w->block, 32 as
 * llama.cpp's Q8_0) each block's int32 sum is converted and multiplied by
 * its weight scale times its activation block's scale, in a fixed order per
 * path. Results do not depend on N or on the threads. */
#include "cpu_int8.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_paged.h"
#include "cpu_isa.h"
#include "cpu_kquant_gemm.h"
#include "cpu_team.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define I8_TM 2    /* input rows per tile */
#define I8_TJ 4    /* weight rows per tile */
#define I8_PASS 64 /* input rows per pass over the weights (L2-resident) */

enum { ISA_PORTABLE, ISA_AVX2, ISA_AVXVNNI, ISA_AVX512VNNI, ISA_COUNT };
static const char *const isa_names[ISA_COUNT] = {"portable", "avx2", "avxvnni", "avx512vnni"};

static int isa_supported(int isa) {
    static const unsigned need[ISA_COUNT] = {0, LOOM_ISA_AVX2, LOOM_ISA_AVXVNNI, LOOM_ISA_AVX512VNNI};
    return loom_cpu_has(need[isa]);
}

static int isa_now = -1;

/* The best this CPU has; LOOM_NO_VNNI=1 stops at AVX2. */
static int isa_pick(void) {
    if (isa_now < 0) {
        int best = ISA_PORTABLE;
        for (int i = ISA_AVX2; i < ISA_COUNT; i++)
            if (isa_supported(i) && (i == ISA_AVX2 || !getenv("LOOM_NO_VNNI"))) best = i;
        isa_now = best;
    }
    return isa_now;
}

const char *loom_cpu_int8_isa(void) { return isa_names[isa_pick()]; }

int loom_cpu_int8_use(const char *name) { return loom_cpu_isa_use(isa_names, ISA_COUNT, isa_supported, &isa_now, name); }

/* One row: its scale, then q = round(x / s), ties away from zero (as
 * roundf), clamped to +-127. */
static void quantize_row(const float *r, int C, int8_t *q, float *s) {
    float mx = 0.0f;
    for (int c = 0; c < C; c++) mx = fmaxf(mx, fabsf(r[c]));
    float sc = mx > 0.0f ? mx / 127.0f : 1.0f, inv = 1.0f / sc;
    *s = sc;
    for (int c = 0; c < C; c++) {
        float v = roundf(r[c] * inv);
        q[c] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
    }
}

#if defined(__x86_64__)
/* The same 8 at a time (a decode step quantizes ~50 rows; roundf is a
 * libm call): t = trunc(v), and t + sign(v) where |v - t| >= 1/2 (v - t is
 * exact), which is roundf's result for every float. */
__attribute__((target("avx2,fma"))) static void quantize_row_avx2(const float *r, int C, int8_t *q, float *s) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), half = _mm256_set1_ps(0.5f);
    __m256 vmx = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= C; c += 8) vmx = _mm256_max_ps(vmx, _mm256_and_ps(_mm256_loadu_ps(r + c), absmask));
    float lanes[8], mx = 0.0f;
    _mm256_storeu_ps(lanes, vmx);
    for (int i = 0; i < 8; i++) mx = fmaxf(mx, lanes[i]);
    for (int k = c; k < C; k++) mx = fmaxf(mx, fabsf(r[k]));
    float sc = mx > 0.0f ? mx / 127.0f : 1.0f, inv = 1.0f / sc;
    *s = sc;
    const __m256 vinv = _mm256_set1_ps(inv), lim = _mm256_set1_ps(127.0f), one = _mm256_set1_ps(1.0f);
    for (c = 0; c + 8 <= C; c += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(r + c), vinv);
        __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        __m256 away = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), absmask), half, _CMP_GE_OQ);
        __m256 sgn = _mm256_or_ps(_mm256_andnot_ps(absmask, v), one); /* +-1 with v's sign */
        t = _mm256_add_ps(t, _mm256_and_ps(away, sgn));
        t = _mm256_max_ps(_mm256_min_ps(t, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
        __m256i i32 = _mm256_cvtps_epi32(t);
        __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64((__m128i *)(q + c), _mm_packs_epi16(p16, p16));
    }
    for (; c < C; c++) {
        float v = roundf(r[c] * inv);
        q[c] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
    }
}
#endif

void loom_cpu_quantize_rows(const float *x, int N, int C, signed char *q, float *s) {
    int avx2 = isa_pick() >= ISA_AVX2;
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 18)
    for (int n = 0; n < N; n++) {
#if defined(__x86_64__)
        if (avx2) {
            quantize_row_avx2(x + (size_t)n * C, C, (int8_t *)q + (size_t)n * C, s + n);
            continue;
        }
#endif
        quantize_row(x + (size_t)n * C, C, (int8_t *)q + (size_t)n * C, s + n);
    }
    (void)avx2;
}

void loom_cpu_matmul_forward_w8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu) {
    loom_cpu_matmul_forward_rows_i8(out, inp, w, bias, N, C, OC, gelu);
}

/* ---- W8A8 tiles ---- */

/* A tile's operands: x (mr, K) and w (jr, K) int8 rows; per-block scales
 * ws[j * nb + (k >> sh)] and xs[m * nb + (k >> sh)] when nb > 0 (from the
 * tile's first weight and input row), none (nb 0) when the scales are per
 * row. */
typedef struct {
    const int8_t *x, *w;
    const float *ws, *xs;
    int K, nb, sh;
} i8args_t;

/* A tile's results: the exact int32 sums (per-row scales) or the fp32
 * sums of each block's int32 sum times its two scales (per-block). */
typedef struct {
    int32_t i[I8_TM][I8_TJ];
    float f[I8_TM][I8_TJ];
} i8out_t;

static void tile_portable(const i8args_t *a, int mr, int jr, i8out_t *t) {
    int K = a->K, blk = a->nb ? K / a->nb : K;
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) {
            const int8_t *x = a->x + (size_t)m * K, *w = a->w + (size_t)j * K;
            int32_t isum = 0;
            float fsum = 0.0f;
            for (int b = 0; b < K / blk; b++) {
                int32_t d = 0;
                for (int k = b * blk; k < (b + 1) * blk; k++) d += (int32_t)x[k] * w[k];
                if (a->nb) fsum += (float)d * (a->ws[(size_t)j * a->nb + b] * a->xs[(size_t)m * a->nb + b]);
                else isum += d;
            }
            t->i[m][j] = isum, t->f[m][j] = fsum;
        }
}

#if defined(__x86_64__)
/* The int32 sums of x[m] . w[j] for the k columns a step left over
 * (per-row scales only: a per-block K is a multiple of the step). */
static inline void tail_i32(const i8args_t *a, int k, int mr, int jr, i8out_t *t) {
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++)
            for (int kk = k; kk < a->K; kk++) t->i[m][j] += (int32_t)a->x[(size_t)m * a->K + kk] * a->w[(size_t)j * a->K + kk];
}

/* AVX2, 32 columns a step: x . w = |x| . (w with x's sign). Always inlined
 * with constant mr, jr and nb != 0 (blk) so that the accumulators stay in
 * registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void tile_avx2(const i8args_t *a, int mr, int jr,
                                                                               int blk, i8out_t *t) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[I8_TM][I8_TJ];
    __m256 facc[I8_TM][I8_TJ];
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) acc[m][j] = _mm256_setzero_si256(), facc[m][j] = _mm256_setzero_ps();
    int K = a->K, k = 0;
    for (; k + 32 <= K; k += 32) {
        __m256i xv[I8_TM], ax[I8_TM];
        __m256 xsc[I8_TM];
        for (int m = 0; m < mr; m++) {
            xv[m] = _mm256_loadu_si256((const __m256i *)(a->x + (size_t)m * K + k));
            ax[m] = _mm256_abs_epi8(xv[m]);
            xsc[m] = blk ? _mm256_broadcast_ss(a->xs + (size_t)m * a->nb + (k >> a->sh)) : _mm256_setzero_ps();
        }
        if (jr == 1) { /* one row (decode): its own bytes 1 KB ahead, a line every 64 columns */
            if (!(k & 32)) _mm_prefetch((const char *)(a->w + k + 1024), _MM_HINT_T0);
        } else { /* the next tile's rows (contiguous after these), in order, as fast as this one is
                  * read: short rows train the hardware prefetcher too late */
            _mm_prefetch((const char *)(a->w + (size_t)I8_TJ * K + k * I8_TJ), _MM_HINT_T0);
            _mm_prefetch((const char *)(a->w + (size_t)I8_TJ * K + k * I8_TJ + 64), _MM_HINT_T0);
        }
        for (int j = 0; j < jr; j++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(a->w + (size_t)j * K + k));
            __m256 sc = blk ? _mm256_broadcast_ss(a->ws + (size_t)j * a->nb + (k >> a->sh)) : _mm256_setzero_ps();
            for (int m = 0; m < mr; m++) {
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax[m], _mm256_sign_epi8(wv, xv[m])), ones);
                if (blk) facc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sc, xsc[m]), facc[m][j]);
                else acc[m][j] = _mm256_add_epi32(acc[m][j], p);
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) t->i[m][j] = loom_hsum_i32x8(acc[m][j]), t->f[m][j] = loom_hsum8(facc[m][j]);
    if (!blk) tail_i32(a, k, mr, jr, t);
}

/* AVX-VNNI, 32 columns a step: vpdpbusd of (x + 128) and w, less
 * 128 * sum(w) (vpdpbusd of 128s and w). */
__attribute__((target("avx2,fma,avxvnni"), always_inline)) static inline void
tile_avxvnni(const i8args_t *a, int mr, int jr, int blk, i8out_t *t) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i acc[I8_TM][I8_TJ], corr[I8_TJ];
    __m256 facc[I8_TM][I8_TJ];
    for (int j = 0; j < jr; j++) corr[j] = _mm256_setzero_si256();
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) acc[m][j] = _mm256_setzero_si256(), facc[m][j] = _mm256_setzero_ps();
    int K = a->K, k = 0;
    for (; k + 32 <= K; k += 32) {
        __m256i xu[I8_TM];
        __m256 xsc[I8_TM];
        for (int m = 0; m < mr; m++) {
            xu[m] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a->x + (size_t)m * K + k)), flip);
            xsc[m] = blk ? _mm256_broadcast_ss(a->xs + (size_t)m * a->nb + (k >> a->sh)) : _mm256_setzero_ps();
        }
        _mm_prefetch((const char *)(a->w + (size_t)I8_TJ * K + k * I8_TJ), _MM_HINT_T0); /* as tile_avx2 */
        _mm_prefetch((const char *)(a->w + (size_t)I8_TJ * K + k * I8_TJ + 64), _MM_HINT_T0);
        for (int j = 0; j < jr; j++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(a->w + (size_t)j * K + k));
            if (!blk) {
                corr[j] = _mm256_dpbusd_avx_epi32(corr[j], flip, wv);
                for (int m = 0; m < mr; m++) acc[m][j] = _mm256_dpbusd_avx_epi32(acc[m][j], xu[m], wv);
                continue;
            }
            __m256i c = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), flip, wv);
            __m256 sc = _mm256_broadcast_ss(a->ws + (size_t)j * a->nb + (k >> a->sh));
            for (int m = 0; m < mr; m++) {
                __m256i d = _mm256_sub_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), xu[m], wv), c);
                facc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sc, xsc[m]), facc[m][j]);
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++)
            t->i[m][j] = loom_hsum_i32x8(acc[m][j]) - loom_hsum_i32x8(corr[j]), t->f[m][j] = loom_hsum8(facc[m][j]);
    if (!blk) tail_i32(a, k, mr, jr, t);
}

/* AVX-512 VNNI, 64 columns a step, the last one masked (masked-off bytes
 * load as 0: w = 0 adds nothing). Per-block scales of 32 columns: the
 * step's low 8 lanes hold one block, the high 8 the next. */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) static inline void
tile_avx512vnni(const i8args_t *a, int mr, int jr, int blk, i8out_t *t) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i acc[I8_TM][I8_TJ], corr[I8_TJ];
    __m512 facc[I8_TM][I8_TJ];
    for (int j = 0; j < jr; j++) corr[j] = _mm512_setzero_si512();
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) acc[m][j] = _mm512_setzero_si512(), facc[m][j] = _mm512_setzero_ps();
    int K = a->K;
    for (int k = 0; k < K; k += 64) {
        __mmask64 msk = K - k >= 64 ? ~0ULL : (1ULL << (K - k)) - 1;
        __m512i xu[I8_TM];
        __m512 xsc[I8_TM];
        for (int m = 0; m < mr; m++) {
            xu[m] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(msk, a->x + (size_t)m * K + k), flip);
            xsc[m] = _mm512_setzero_ps();
            if (!blk) continue;
            const float *xs = a->xs + (size_t)m * a->nb;
            float x0 = xs[k >> a->sh], x1 = k + 32 < K ? xs[(k + 32) >> a->sh] : x0;
            xsc[m] = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(x0), _mm512_set1_ps(x1));
        }
        for (int p = 0; p < 4; p++) /* as tile_avx2: the next tile, 4 lines a step */
            _mm_prefetch((const char *)(a->w + (size_t)I8_TJ * K + (size_t)k * I8_TJ + 64 * p), _MM_HINT_T0);
        for (int j = 0; j < jr; j++) {
            __m512i wv = _mm512_maskz_loadu_epi8(msk, a->w + (size_t)j * K + k);
            if (!blk) {
                corr[j] = _mm512_dpbusd_epi32(corr[j], flip, wv);
                for (int m = 0; m < mr; m++) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], xu[m], wv);
                continue;
            }
            const float *s = a->ws + (size_t)j * a->nb;
            float s0 = s[k >> a->sh], s1 = k + 32 < K ? s[(k + 32) >> a->sh] : s0;
            __m512 sc = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
            __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, wv);
            for (int m = 0; m < mr; m++) {
                __m512i d = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xu[m], wv), c);
                facc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sc, xsc[m]), facc[m][j]);
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++)
            t->i[m][j] = _mm512_reduce_add_epi32(acc[m][j]) - _mm512_reduce_add_epi32(corr[j]),
            t->f[m][j] = _mm512_reduce_add_ps(facc[m][j]);
}

/* One tile on `isa`: full tiles get constant-shape copies; an edge of
 * fewer than I8_TJ weight rows goes one row at a time (the same operations
 * per element). ROW1: one input row (decode) of rows of I8_ROW1_K bytes or
 * more goes one weight row at a time too, so one stream of weights comes
 * from memory instead of I8_TJ streams a row apart: on AVX2 (Zen 4) the
 * hardware prefetcher served those at 12.5 against 18.2 GB/s
 * (bench/kquant-decode.sh q8_0, 16384 x 4096, one thread); shorter rows'
 * 4 are one stream already (smollm2's 576 and 1536). The VNNI tiles, not
 * measured so, keep the 4 rows. */
#define I8_ROW1_K 2048
#define I8_SHAPES(FN, TGT, ROW1)                                                                             \
    __attribute__((target(TGT))) static void FN##_tile(const i8args_t *a, int mr, int jr, i8out_t *t) {      \
        int blk = a->nb != 0;                                                                              \
        if (jr == I8_TJ && !(ROW1 && mr == 1 && a->K >= I8_ROW1_K)) {                                      \
            if (mr == 2) blk ? FN(a, 2, I8_TJ, 1, t) : FN(a, 2, I8_TJ, 0, t);                              \
            else blk ? FN(a, 1, I8_TJ, 1, t) : FN(a, 1, I8_TJ, 0, t);                                      \
            return;                                                                                        \
        }                                                                                                  \
        for (int j = 0; j < jr; j++) {                                                                     \
            i8args_t b = *a;                                                                               \
            i8out_t u;                                                                                     \
            b.w += (size_t)j * a->K, b.ws = a->nb ? a->ws + (size_t)j * a->nb : NULL;                      \
            if (mr == 2) blk ? FN(&b, 2, 1, 1, &u) : FN(&b, 2, 1, 0, &u);                                  \
            else blk ? FN(&b, 1, 1, 1, &u) : FN(&b, 1, 1, 0, &u);                                          \
            for (int m = 0; m < mr; m++) t->i[m][j] = u.i[m][0], t->f[m][j] = u.f[m][0];                   \
        }                                                                                                  \
    }
I8_SHAPES(tile_avx2, "avx2,fma", 1)
I8_SHAPES(tile_avxvnni, "avx2,fma,avxvnni", 0)
I8_SHAPES(tile_avx512vnni, "avx512f,avx512bw,avx512vnni", 0)
#endif

typedef void (*i8tile_fn)(const i8args_t *a, int mr, int jr, i8out_t *t);

/* The tile function for `isa` and the weight's block size (the SIMD tiles
 * take per-row scales or power-of-two blocks of at least their step). */
static i8tile_fn tile_for(int isa, int blk) {
    int pow2 = blk && (blk & (blk - 1)) == 0;
#if defined(__x86_64__)
    if (isa == ISA_AVX512VNNI && (!blk || (pow2 && blk >= 32))) return tile_avx512vnni_tile;
    if (isa == ISA_AVXVNNI && (!blk || (pow2 && blk >= 32))) return tile_avxvnni_tile;
    if (isa >= ISA_AVX2 && (!blk || (pow2 && blk >= 32))) return tile_avx2_tile;
#endif
    (void)isa, (void)pow2;
    return tile_portable;
}

/* Outputs j0..j0+jr-1 of rows r0..r1-1: tiles, then scales, bias, GELU. */
static void w8a8_block(float *out, const int8_t *xq, const float *sx, const loom_tensor_t *w, const float *bias,
                       int r0, int r1, int C, int OC, int gelu, int j0, int jr, i8tile_fn tile) {
    int blk = w->block, nb = blk ? C / blk : 0, sh = 0;
    while (blk && (1 << sh) < blk) sh++;
    i8args_t a = {.w = (const int8_t *)w->data + (size_t)j0 * C, .ws = nb ? w->scales + (size_t)j0 * nb : NULL,
                  .K = C, .nb = nb, .sh = sh};
    for (int m0 = r0; m0 < r1; m0 += I8_TM) {
        int mr = r1 - m0 < I8_TM ? r1 - m0 : I8_TM;
        i8out_t t;
        a.x = xq + (size_t)m0 * C, a.xs = nb ? sx + (size_t)m0 * nb : NULL;
        tile(&a, mr, jr, &t);
        for (int m = 0; m < mr; m++)
            for (int j = 0; j < jr; j++) {
                int n = m0 + m, o = j0 + j;
                float v = nb ? t.f[m][j] : (float)t.i[m][j] * (sx[n] * w->scales[o]);
                v += bias ? bias[o] : 0.0f;
                out[(size_t)n * OC + o] = gelu ? loom_gelu(v) : v;
            }
    }
}

/* One matrix product's tasks on the team: task t is the tiles of weight
 * rows t * rows_per_task .. (blocks of I8_TJ) against input rows pass * I8_PASS
 * .. (the pass's). */
typedef struct {
    float *out;
    const int8_t *xq;
    const float *sx, *bias;
    const loom_tensor_t *w;
    i8tile_fn tile;
    int N, C, OC, gelu, rows_per_task, tasks_per_pass;
} i8job_t;

static void w8a8_task(void *ctx, int t) {
    const i8job_t *j = ctx;
    int r0 = t / j->tasks_per_pass * I8_PASS, r1 = r0 + I8_PASS < j->N ? r0 + I8_PASS : j->N;
    int o0 = t % j->tasks_per_pass * j->rows_per_task, o1 = o0 + j->rows_per_task < j->OC ? o0 + j->rows_per_task : j->OC;
    for (int j0 = o0; j0 < o1; j0 += I8_TJ)
        w8a8_block(j->out, j->xq, j->sx, j->w, j->bias, r0, r1, j->C, j->OC, j->gelu, j0, o1 - j0 < I8_TJ ? o1 - j0 : I8_TJ, j->tile);
}

/* ---- q8_0 8 rows interleaved (qblock.h: LOOM_LAYOUT_ROWS8) ----
 *
 * A block of 8 rows is 8 pieces of 32 bytes (4 values of each row) and the
 * 8 rows' scales. Per piece, the AVX2 tile's operations with the roles of
 * its lanes turned: |x| of the piece's 4 activations broadcast times the
 * weights with x's sign (vpsignb), vpmaddubsw, vpmaddwd by ones: lane r is
 * row r's sum of those 4 values, the tile's lane p of that row. Piece p's
 * register of partial sums takes it times the 8 rows' scale times the
 * activations' (one multiply a block) by one FMA, as the tile's lane p,
 * and the 8 registers end in loom_hsum8's tree: the same bits as the AVX2
 * tile on the dense layout, whatever N. One stream of weights per thread
 * (and the scales' at an eighth of the rate), the 8 rows' outputs in one
 * register. */
#define I8_R8_AHEAD 1024 /* bytes of weights asked for ahead of the block being read */

/* Input row x (its scales xs) against group g's blocks (gw, gs): y[0..7].
 * Portable: the 8 rows made dense in `dense` (8 C bytes, then 8 nb
 * scales) and run by tile_portable, the dense layout's own code. */
static void r8_portable(const int8_t *gw, const float *gs, const int8_t *x, const float *xs, int nb, float *y, int8_t *dense) {
    const int C = 32 * nb;
    float *ds = (float *)(dense + 8 * (size_t)C);
    for (int r = 0; r < 8; r++)
        for (int b = 0; b < nb; b++) {
            ds[(size_t)r * nb + b] = gs[8 * b + r];
            for (int k = 0; k < 8; k++) memcpy(dense + (size_t)r * C + 32 * b + 4 * k, gw + 256 * b + 32 * k + 4 * r, 4);
        }
    for (int h = 0; h < 2; h++) {
        i8args_t a = {.x = x, .w = dense + (size_t)h * 4 * C, .ws = ds + (size_t)h * 4 * nb, .xs = xs, .K = C, .nb = nb, .sh = 5};
        i8out_t t;
        tile_portable(&a, 1, I8_TJ, &t);
        for (int j = 0; j < I8_TJ; j++) y[4 * h + j] = t.f[0][j];
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void r8_avx2(const int8_t *gw, const float *gs, const int8_t *x, const float *xs, int nb,
                                                      float *y) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 F[8];
    for (int p = 0; p < 8; p++) F[p] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int8_t *w = gw + 256 * b;
        for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)w + I8_R8_AHEAD + l, _MM_HINT_T0);
        if (!(b & 1)) _mm_prefetch((const char *)(gs + 8 * b) + I8_R8_AHEAD / 8, _MM_HINT_T0);
        __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(gs + 8 * b), _mm256_set1_ps(xs[b]));
        for (int p = 0; p < 8; p++) {
            int32_t a;
            memcpy(&a, x + 32 * b + 4 * p, 4);
            __m256i xv = _mm256_set1_epi32(a), wv = _mm256_loadu_si256((const __m256i *)(w + 32 * p));
            __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(wv, xv)), ones);
            F[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, F[p]);
        }
    }
    __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(F[0], F[4]), _mm256_add_ps(F[2], F[6])),
                             _mm256_add_ps(_mm256_add_ps(F[1], F[5]), _mm256_add_ps(F[3], F[7])));
    _mm256_storeu_ps(y, t);
}
#endif

/* Task t: groups of 8 weight rows t * rows_per_task .. against input rows
 * pass * I8_PASS .. (the pass's), one input row at a time (the group's
 * bytes from cache after the first). */
static void w8a8_r8_task(void *ctx, int t) {
    const i8job_t *j = ctx;
    int r0 = t / j->tasks_per_pass * I8_PASS, r1 = r0 + I8_PASS < j->N ? r0 + I8_PASS : j->N;
    int o0 = t % j->tasks_per_pass * j->rows_per_task, o1 = o0 + j->rows_per_task < j->OC ? o0 + j->rows_per_task : j->OC;
    int C = j->C, nb = C / 32, avx2 = isa_pick() >= ISA_AVX2;
    int8_t *dense = avx2 ? NULL : loom_cpu_scratch(2, 8 * (size_t)C + 8 * (size_t)nb * sizeof(float));
    for (int o = o0; o < o1; o += 8) {
        const int8_t *gw = (const int8_t *)j->w->data + (size_t)o * C;
        const float *gs = j->w->scales + (size_t)o * nb;
        for (int n = r0; n < r1; n++) {
            float y[8];
            const int8_t *x = j->xq + (size_t)n * C;
            const float *xs = j->sx + (size_t)n * nb;
#if defined(__x86_64__)
            if (avx2) r8_avx2(gw, gs, x, xs, nb, y);
            else
#endif
                r8_portable(gw, gs, x, xs, nb, y, dense);
            for (int r = 0; r < 8; r++) {
                float v = y[r] + (j->bias ? j->bias[o + r] : 0.0f);
                j->out[(size_t)n * j->OC + o + r] = j->gelu ? loom_gelu(v) : v;
            }
        }
    }
}

/* Activation quantization of rows t * per .. on the team (each task under
 * loom_cpu_quantize_rows's own parallel threshold, so it stays on its
 * thread). */
typedef struct {
    const float *x;
    signed char *q;
    float *s;
    int rows, C, per;
} i8qjob_t;

static void quantize_task(void *ctx, int t) {
    const i8qjob_t *j = ctx;
    int r0 = t * j->per, n = j->rows - r0 < j->per ? j->rows - r0 : j->per;
    loom_cpu_quantize_rows(j->x + (size_t)r0 * j->C, n, j->C, j->q + (size_t)r0 * j->C, j->s + r0);
}

void loom_cpu_matmul_forward_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                  int N, int C, int OC, int gelu) {
    if (loom_cpu_kq_gemm(out, inp, w, bias, N, C, OC, gelu)) return; /* prefill on Q8_0's blocks: cpu_kquant_gemm.c */
    int blk = w->block > 0 && C % w->block == 0 ? w->block : 0, nb = blk ? C / blk : 1; /* activation blocks: the weight's */
    int8_t *xq = loom_cpu_scratch(0, (size_t)N * C);
    float *sx = loom_cpu_scratch(1, (size_t)N * (size_t)nb * sizeof(float));
    int qc = blk ? blk : C, rows = blk ? N * nb : N; /* each block a row of its own */
    i8qjob_t q = {inp, (signed char *)xq, sx, rows, qc, (1 << 16) / qc > 1 ? (1 << 16) / qc : 1};
    loom_cpu_team_or_omp(quantize_task, &q, (rows + q.per - 1) / q.per, N);
    int r8 = w->layout == LOOM_LAYOUT_ROWS8, passes = (N + I8_PASS - 1) / I8_PASS;
    int per = loom_cpu_team_rows_per_task(OC, r8 ? 8 : I8_TJ, (size_t)OC * C, passes);
    i8job_t j = {out, xq, sx, bias, w, tile_for(isa_pick(), w->block), N, C, OC, gelu, per, (OC + per - 1) / per};
    loom_cpu_team_or_omp(r8 ? w8a8_r8_task : w8a8_task, &j, passes * j.tasks_per_pass, N);
}

/* ---- int8 paged KV cache ---- */


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

void loom_cpu_kv_write_int8(const loom_tensor_t *kv, const float *qkv, const int *slots, int N, int NH, int NKV, int bs) {
    int hs = (int)(kv->cols / bs), C = NH * hs, KC = NKV * hs;
    size_t QR = (size_t)C + 2 * (size_t)KC; /* qkv's row: NH query heads, NKV keys, NKV values */
    /* one task per (K or V, head): rows of one block are written in batch
     * order, so a prefill chunk's tokens raise the scale in turn */
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 16)
    for (int task = 0; task < 2 * NKV; task++) {
        int which = task / NKV, h = task % NKV;
        for (int i = 0; i < N; i++) {
            int blk = slots[i] / bs, off = slots[i] % bs;
            size_t r = ((size_t)blk * 2 + which) * NKV + h;
            kv_put(kv, r, off, hs, qkv + (size_t)i * QR + C + (size_t)which * KC + h * hs);
        }
    }
}

void loom_cpu_kv_copy_block_int8(const loom_tensor_t *kv, int src, int dst, int NH) {
    size_t n = 2 * (size_t)NH * (size_t)kv->cols;
    memcpy((int8_t *)kv->data + (size_t)dst * n, (const int8_t *)kv->data + (size_t)src * n, n);
    memcpy((float *)kv->scales + (size_t)dst * 2 * NH, kv->scales + (size_t)src * 2 * NH, 2 * (size_t)NH * sizeof(float));
}
