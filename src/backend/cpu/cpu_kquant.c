/* cpu_kquant: matrix products on llama.cpp's block formats as stored, for
 * few input rows (decode: one row per sequence).
 *
 * Every path computes, per weight block and input row, the exact integers
 * of qblock.h's form (I: the values times the int8 activations, scaled
 * per group; M: the mins times the activations' sums per 16) and then the
 * shared float work of cpu_kquant.h, so all give the same bits.
 *
 * The x86 paths work on the packed block in registers, never through
 * memory: a block is unpacked once per pass (for every input row of the
 * pass) into vectors of 32 unsigned values, and each input row's dot is
 * - 256-value formats (q4_K, q5_K, q6_K): per 32 values, vpmaddubsw (u
 *   unsigned x xq signed, pairs to int16: at most 2 * 63 * 127 = 16002,
 *   never saturating) then the group scales as int16 by vpmaddwd + add
 *   (AVX2) or VNNI's vpdpwssd; one horizontal sum of I and M per block;
 * - 32-value formats (q4_0 ... q5_1): 8 blocks at a time, per block one
 *   vpdpbusd (VNNI; AVX2: vpmaddubsw + vpmaddwd by ones) into int32, the 8
 *   blocks' sums reduced together and their float work done as one vector
 *   (lane j = block j: the part[b % 8] of cpu_kquant.h).
 * The AVX-512 paths use 256-bit vectors (Zen 4 splits 512-bit work into
 * two halves, and a 256-value block is 8 vectors of 32): "avx512" is the
 * AVX2 code with the AVX-512 register file, "avx512vnni" adds the VNNI
 * dot products (AVX512-VL encodings). The block's integer sum is at most
 * 256 * 63 * 127 * 128 < 2^31: exact on every path. */
#include "cpu_kquant.h"
#include "cpu_kquant_gemm.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qblock.h"
#include "backend/qblock_impl.h"
#include "cpu_math.h"
#include "cpu_team.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KQ_PASS 64 /* input rows per pass over the weights */
#define KQ_GROUP 8 /* 32-value blocks per step of their x86 kernel, and partial sums */

enum { KQ_PORTABLE, KQ_AVX2, KQ_AVX512, KQ_AVX512VNNI, KQ_COUNT };
static const char *const kq_names[KQ_COUNT] = {"portable", "avx2", "avx512", "avx512vnni"};

static int kq_supported(int isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    if (isa == KQ_AVX2) return avx2;
    if (isa == KQ_AVX512) return avx512;
    if (isa == KQ_AVX512VNNI) return avx512 && __builtin_cpu_supports("avx512vnni");
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

#if defined(__x86_64__)
/* The scale and values of one block of n (a multiple of 32) activations,
 * 8 at a time: the same max (exact in any order), product and rounding to
 * nearest as the portable loop, so the same bytes. */
__attribute__((target("avx2,fma"))) static float quantize_block_avx2(const float *r, int n, int8_t *q) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(r + i), abs));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float mx = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h))), inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    for (int i = 0; i < n; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i + 8 * k), iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])); /* lanes interleaved */
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    return mx;
}
#endif

void loom_cpu_kq_quantize_act(const float *x, int C, int blk, float *xd, int8_t *xq, int16_t *xs) {
    for (int b = 0; b < C / blk; b++) {
        const float *r = x + (size_t)b * blk;
        int8_t *q = xq + (size_t)b * blk;
        float mx = 0.0f;
#if defined(__x86_64__)
        if (kq_pick() != KQ_PORTABLE) {
            xd[b] = quantize_block_avx2(r, blk, q) / 127.0f;
            continue;
        }
#endif
        for (int i = 0; i < blk; i++) mx = fmaxf(mx, fabsf(r[i]));
        float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        xd[b] = mx / 127.0f;
        for (int i = 0; i < blk; i++) q[i] = (int8_t)rintf(r[i] * inv); /* |.| <= 127 */
    }
    for (int g = 0; g < C / 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += xq[16 * g + i];
        xs[g] = (int16_t)s;
    }
}

/* The quantized input rows. Each row's arrays are padded with zeros to a
 * whole number of KQ_GROUP blocks, so the 32-value kernel reads 8 blocks'
 * activations at once; zero activations add exactly +0 (cpu_kquant.h). */
typedef struct {
    const int8_t *xq;  /* (N, sq) */
    const float *xd;   /* (N, sd) */
    const int16_t *xs; /* (N, ss) */
    int C, blk, nb;
    size_t sq, sd, ss; /* row strides */
} kq_act_t;

/* Where a pass's outputs go: y (N, OC), plus bias, then GELU if gelu. */
typedef struct {
    float *y;
    const float *bias;
    int OC, gelu;
} kq_out_t;

static inline void kq_put(const kq_out_t *out, int n, int o, float v) {
    v += out->bias ? out->bias[o] : 0.0f;
    out->y[(size_t)n * out->OC + o] = out->gelu ? loom_gelu(v) : v;
}

/* Output rows o0..o1-1 of input rows r0..r1-1 (one function per format
 * and instruction set). */
typedef void (*kq_rows_fn)(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, const kq_out_t *out);

/* ---- portable C: qblock.h's form, block after block ---- */

static void row_portable(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, float *acc) {
    float part[KQ_PASS][KQ_GROUP];
    memset(part, 0, sizeof part[0] * (size_t)(r1 - r0));
    uint8_t u[256], tmp[256];
    loom_qblock_scales_t s;
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk = loom_qblock_at(w, o, b, tmp);
        loom_qblock_scales(w->dtype, blk, &s);
        loom_qblock_values(w->dtype, blk, u);
        for (int n = r0; n < r1; n++) {
            const int8_t *x = a->xq + n * a->sq + (size_t)b * a->blk;
            const int16_t *xs = a->xs + n * a->ss + (size_t)b * a->blk / 16;
            int32_t isum = 0, msum = 0;
            for (int g = 0; g < a->blk / 16; g++) {
                int32_t t = 0;
                for (int i = 16 * g; i < 16 * g + 16; i++) t += (int32_t)u[i] * x[i];
                isum += s.sc[g] * t, msum += s.mn[g] * xs[g];
            }
            loom_cpu_kq_accum(part[n - r0], b, a->xd[n * a->sd + b], s.d, s.dmin, isum, msum);
        }
    }
    for (int n = r0; n < r1; n++) acc[n - r0] = loom_cpu_kq_total(part[n - r0]);
}

static void rows_portable(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, const kq_out_t *out) {
    float acc[KQ_PASS];
    for (int o = o0; o < o1; o++) {
        row_portable(w, o, a, r0, r1, acc);
        for (int n = r0; n < r1; n++) kq_put(out, n, o, acc[n - r0]);
    }
}

#if defined(__x86_64__)
#define KQ_AVX __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define KQ_VNNI_TGT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
/* How far ahead of the block being read the row kernels ask for weights
 * (bytes): at one input row the weights stream from memory once per
 * token, and the two threads' alternating 64 KB tasks (cpu_team.h) and 4 KiB
 * pages each restart the hardware prefetcher's stream. */
#define KQ_AHEAD 1024

static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* acc + the int16 pair sums p times the int16 scales s, pairwise summed
 * into int32 (a vpmaddwd): AVX2 and VNNI forms. */
typedef __m256i (*kq_madd_fn)(__m256i acc, __m256i p, __m256i s);
/* acc + the sums of 4 products of u (unsigned) and x (signed) bytes. */
typedef __m256i (*kq_dot4_fn)(__m256i acc, __m256i u, __m256i x);

KQ_AVX __m256i madd_avx2(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
KQ_AVX __m256i dot4_avx2(__m256i acc, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
__attribute__((target(KQ_VNNI_TGT), always_inline)) static inline __m256i madd_vnni(__m256i acc, __m256i p, __m256i s) {
    return _mm256_dpwssd_epi32(acc, p, s);
}
__attribute__((target(KQ_VNNI_TGT), always_inline)) static inline __m256i dot4_vnni(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(acc, u, x);
}

/* Eight vectors of 8 int32 partial sums to one vector of their 8 totals. */
KQ_AVX __m256i hsum8(const __m256i *s) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* ---- 256-value formats ---- */

/* A k-quant block in registers: u[j] the values 32j .. 32j + 31; the
 * int16 scale vector of those 32 values is vpshufb(S[j / 4], pick[j]);
 * mn the 16 int16 mins (per 16 values) for M. */
typedef struct {
    __m256i u[8], S[2], mn;
    float d, dmin;
} kq_kblk_t;

/* Bit j of every byte of h, moved to bit 4 (q5_K's fifth bit of the
 * values 32j .. 32j + 31). */
KQ_AVX __m256i bit_to_4(__m256i h, int j) {
    __m256i v = j < 4 ? _mm256_slli_epi16(h, 4 - j) : _mm256_srli_epi16(h, j - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* q4_K / q5_K: the 8 6-bit scales and mins from their 12 bytes q (the
 * layout of qblock_scale_min_k4) in vector registers: bytes 0-3 of the
 * result are scales 0-3 (q[0..3] & 63), 4-7 scales 4-7 (q[8..11] & 15,
 * the top 2 bits of q[0..3] above), 8-15 the mins likewise (q[4..7],
 * q[8..11] >> 4, the top 2 bits of q[4..7]); as int16. Reads q[12..15]
 * (inside the block) without using them. */
KQ_AVX void unpack_k45_scales(const uint8_t *q, kq_kblk_t *k) {
    const __m128i lo_at = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
    const __m128i hi_at = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7);
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    __m128i v = _mm_loadu_si128((const __m128i *)q), a = _mm_shuffle_epi8(v, lo_at);
    a = _mm_and_si128(_mm_blend_epi32(a, _mm_srli_epi16(a, 4), 8), keep);
    __m128i h = _mm_and_si128(_mm_srli_epi16(_mm_shuffle_epi8(v, hi_at), 2), _mm_set1_epi8(0x30));
    __m128i sm = _mm_or_si128(a, h);
    k->S[0] = k->S[1] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    k->mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm)); /* the min of 32 values, for both groups of 16 */
}

KQ_AVX void unpack_k45(loom_dtype d, const uint8_t *b, kq_kblk_t *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *qs = b + (d == LOOM_Q4_K ? 16 : 48);
    k->d = _cvtsh_ss(ld16(b)), k->dmin = _cvtsh_ss(ld16(b + 2));
    unpack_k45_scales(b + 4, k);
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        k->u[2 * c] = _mm256_and_si256(q, m4);
        k->u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    if (d == LOOM_Q5_K) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int j = 0; j < 8; j++) k->u[j] = _mm256_or_si256(k->u[j], bit_to_4(h, j));
    }
}

/* q6_K: 4 low bits (ql) and 2 high bits (qh) per value; chunk k of half h
 * takes ql[64h + 32(k&1)] (low nibbles for k < 2, high for k >= 2) and
 * bits 2k, 2k+1 of qh[32h ..]. Its 16 int8 scales, as int16, half h's 8
 * in both lanes of S[h]; the mins are 32 times the scales. */
KQ_AVX void unpack_q6k(const uint8_t *b, kq_kblk_t *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        k->u[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        k->u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        k->u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
        k->u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
    }
    __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    k->S[0] = _mm256_permute2x128_si256(sc, sc, 0x00);
    k->S[1] = _mm256_permute2x128_si256(sc, sc, 0x11);
    k->mn = _mm256_slli_epi16(sc, 5); /* |32 sc| <= 4096 */
    k->d = k->dmin = _cvtsh_ss(ld16(b + 208));
}

/* The vpshufb control that spreads int16 lane i (lane0) and i2 (lane1) over 8 lanes each. */
#define KQ_PICK(i, i2)                                                                                          \
    {(char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i)), (char)(2 * (i) + 1), \
     (char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i)), (char)(2 * (i) + 1), \
     (char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i)), (char)(2 * (i) + 1), (char)(2 * (i2)), (char)(2 * (i2) + 1), \
     (char)(2 * (i2)), (char)(2 * (i2) + 1), (char)(2 * (i2)), (char)(2 * (i2) + 1), (char)(2 * (i2)), (char)(2 * (i2) + 1), \
     (char)(2 * (i2)), (char)(2 * (i2) + 1), (char)(2 * (i2)), (char)(2 * (i2) + 1), (char)(2 * (i2)), (char)(2 * (i2) + 1), \
     (char)(2 * (i2)), (char)(2 * (i2) + 1)}
/* q4_K/q5_K: 32 values j share scale j; q6_K: each 16 of chunk j = 4h + k
 * has its own, 2k and 2k + 1 of half h. */
static const char kq_pick45[8][32] __attribute__((aligned(32))) = {KQ_PICK(0, 0), KQ_PICK(1, 1), KQ_PICK(2, 2), KQ_PICK(3, 3),
                                                                   KQ_PICK(4, 4), KQ_PICK(5, 5), KQ_PICK(6, 6), KQ_PICK(7, 7)};
static const char kq_pick6[8][32] __attribute__((aligned(32))) = {KQ_PICK(0, 1), KQ_PICK(2, 3), KQ_PICK(4, 5), KQ_PICK(6, 7),
                                                                  KQ_PICK(0, 1), KQ_PICK(2, 3), KQ_PICK(4, 5), KQ_PICK(6, 7)};

/* *I and *M: the horizontal sums of the 8 int32 of i and of m. */
KQ_AVX void hsum2(__m256i i, __m256i m, int32_t *isum, int32_t *msum) {
    __m256i h = _mm256_hadd_epi32(i, m); /* i01 i23 m01 m23 | i45 i67 m45 m67 */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s);
    *isum = _mm_cvtsi128_si32(s), *msum = _mm_extract_epi32(s, 1);
}

/* The fixed tree of loom_cpu_kq_total on a vector (vhaddps adds the
 * same pairs): ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). */
KQ_AVX float total8(__m256 p) {
    __m256 h = _mm256_hadd_ps(p, p);
    h = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* The unreduced sums of a k-quant block against one input row's block:
 * *I (8 int32 adding up to the block's I) and *M (likewise M). */
KQ_AVX void dotk(const kq_kblk_t *k, const int8_t *x, const int16_t *xs, loom_dtype d, kq_madd_fn madd, __m256i *I, __m256i *M) {
    const char(*pick)[32] = d == LOOM_Q6_K ? kq_pick6 : kq_pick45;
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* two chains of 4 */
    for (int j = 0; j < 8; j++) {
        __m256i p = _mm256_maddubs_epi16(k->u[j], _mm256_loadu_si256((const __m256i *)(x + 32 * j)));
        s[j & 1] = madd(s[j & 1], p, _mm256_shuffle_epi8(k->S[j / 4], _mm256_load_si256((const __m256i *)pick[j])));
    }
    *I = _mm256_add_epi32(s[0], s[1]);
    *M = _mm256_madd_epi16(k->mn, _mm256_loadu_si256((const __m256i *)xs));
}

KQ_AVX void unpack_k(loom_dtype d, const uint8_t *b, kq_kblk_t *k) {
    if (d == LOOM_Q6_K) unpack_q6k(b, k);
    else unpack_k45(d, b, k);
}

/* d and dmin of blocks 0..k-1 of the 8 from g (bytes apart) as floats,
 * 0 for the others: one gather of the 32 bits holding both (q6_K: its d is
 * the high half of the 32 bits at 206, so nothing past a block is read). */
KQ_AVX void f16_pairs8(const uint8_t *g, loom_dtype d, int k, __m256 *dd, __m256 *dmin) {
    const int bytes = d == LOOM_Q4_K ? 144 : d == LOOM_Q5_K ? 176 : 210;
    const __m256i at = _mm256_setr_epi32(0, bytes, 2 * bytes, 3 * bytes, 4 * bytes, 5 * bytes, 6 * bytes, 7 * bytes);
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6,
                                           7, 10, 11, 14, 15);
    __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(g + (d == LOOM_Q6_K ? 206 : 0)), at, live, 1);
    v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, split), 0xD8); /* low halves of all 8, then high halves */
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
    *dd = d == LOOM_Q6_K ? hi : lo;
    *dmin = hi;
}

/* One weight row of a k-quant against one input row n: 8 blocks at a
 * time, their I and M reduced together and their float work done as one
 * vector (lane j: block b0 + j, partial sum j); a last group of k < 8
 * blocks has zeros in lanes k..7 (zero integers, d, dmin and activation
 * scale: each such lane adds exactly +0). The same operations as the
 * general path below, in registers to the end. */
KQ_AVX float rowk1(const uint8_t *row, const kq_act_t *a, int n, loom_dtype d, kq_madd_fn madd) {
    const int bytes = d == LOOM_Q4_K ? 144 : d == LOOM_Q5_K ? 176 : 210;
    const int8_t *x = a->xq + n * a->sq;
    const int16_t *xs = a->xs + n * a->ss;
    __m256 part = _mm256_setzero_ps();
    for (int b0 = 0; b0 < a->nb; b0 += KQ_GROUP) {
        int k = a->nb - b0 < KQ_GROUP ? a->nb - b0 : KQ_GROUP;
        __m256i I[KQ_GROUP], M[KQ_GROUP];
        for (int j = 0; j < KQ_GROUP; j++) {
            I[j] = M[j] = _mm256_setzero_si256();
            if (j >= k) continue;
            kq_kblk_t kb;
            const char *ahead = (const char *)row + (size_t)(b0 + j) * bytes + KQ_AHEAD;
            for (int l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
            unpack_k(d, row + (size_t)(b0 + j) * bytes, &kb);
            dotk(&kb, x + (size_t)(b0 + j) * 256, xs + (size_t)(b0 + j) * 16, d, madd, &I[j], &M[j]);
        }
        __m256 dd, dmin;
        f16_pairs8(row + (size_t)b0 * bytes, d, k, &dd, &dmin);
        __m256 f = _mm256_fmsub_ps(dd, _mm256_cvtepi32_ps(hsum8(I)), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(hsum8(M))));
        part = _mm256_fmadd_ps(_mm256_loadu_ps(a->xd + n * a->sd + b0), f, part);
    }
    return total8(part);
}

/* One weight row of a k-quant against input rows r0..r1-1, block after
 * block (each unpacked once for all the rows). */
KQ_AVX void rowk(const loom_tensor_t *w, int o, const kq_act_t *a, int r0, int r1, float *acc, loom_dtype d, kq_madd_fn madd) {
    const int bytes = d == LOOM_Q4_K ? 144 : d == LOOM_Q5_K ? 176 : 210;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * a->nb * bytes;
    if (r1 - r0 == 1) {
        acc[0] = rowk1(row, a, r0, d, madd);
        return;
    }
    float part[KQ_PASS][KQ_GROUP] __attribute__((aligned(32)));
    memset(part, 0, sizeof part[0] * (size_t)(r1 - r0));
    for (int b = 0; b < a->nb; b++) {
        kq_kblk_t k;
        unpack_k(d, row + (size_t)b * bytes, &k);
        for (int n = r0; n < r1; n++) {
            __m256i I, M;
            int32_t isum, msum;
            dotk(&k, a->xq + n * a->sq + (size_t)b * 256, a->xs + n * a->ss + (size_t)b * 16, d, madd, &I, &M);
            hsum2(I, M, &isum, &msum);
            loom_cpu_kq_accum(part[n - r0], b, a->xd[n * a->sd + b], k.d, k.dmin, isum, msum);
        }
    }
    for (int n = r0; n < r1; n++) acc[n - r0] = total8(_mm256_load_ps(part[n - r0]));
}

KQ_AVX void rowsk(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, const kq_out_t *out, loom_dtype d,
                  kq_madd_fn madd) {
    float acc[KQ_PASS];
    for (int o = o0; o < o1; o++) {
        rowk(w, o, a, r0, r1, acc, d, madd);
        for (int n = r0; n < r1; n++) kq_put(out, n, o, acc[n - r0]);
    }
}

/* ---- 8 rows interleaved (qblock.h): q4_K, q6_K and the 32-value formats ---- */

/* Qword q of bytes (8 rows' bytes of one sub-block) in every qword, byte
 * r as the int16 pair (b, b) of int32 lane r: the 8 rows' scales for one
 * vpmaddwd. */
KQ_AVX __m256i r8_scales(__m256i bytes, int q) {
    const __m256i dup = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1,
                                         7, -1, 7, -1);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(2 * q, 2 * q + 1, 2 * q, 2 * q + 1, 2 * q, 2 * q + 1,
                                                                                    2 * q, 2 * q + 1)),
                               dup);
}

/* Group block G (8 rows' block b) against one input row's block (x, xs):
 * *I and *M the 8 rows' integer sums, lane r row r. The 6-bit scales
 * come out as bytes [sub-block][row] (Q[k] = byte k of the 8 rows, 8
 * bytes); 8 values a row are multiplied per register (maddubs: pairs of
 * values in int16), 8 registers of a sub-block summed in int16 (|.| <=
 * 8 * 2 * 15 * 127 < 2^15), then one vpmaddwd by the 8 rows' scales. */
KQ_AVX void r8_block(const uint8_t *G, const int8_t *x, const int16_t *xs, kq_madd_fn madd, __m256i *I, __m256i *M) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m6 = _mm256_set1_epi8(63), hi2 = _mm256_set1_epi8(0x30);
    __m256i q03 = _mm256_loadu_si256((const __m256i *)(G + 32)), q47 = _mm256_loadu_si256((const __m256i *)(G + 64));
    __m256i q8b = _mm256_loadu_si256((const __m256i *)(G + 96));
    __m256i sc[2] = {_mm256_and_si256(q03, m6), _mm256_or_si256(_mm256_and_si256(q8b, m4), _mm256_and_si256(_mm256_srli_epi16(q03, 2), hi2))};
    __m256i mn[2] = {_mm256_and_si256(q47, m6),
                     _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q8b, 4), m4), _mm256_and_si256(_mm256_srli_epi16(q47, 2), hi2))};
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = G + 128 + 256 * c;
        const int8_t *xl = x + 64 * c, *xh = xl + 32;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int i = 0; i < 8; i++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
            int32_t a, b;
            memcpy(&a, xl + 4 * i, 4), memcpy(&b, xh + 4 * i, 4);
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_set1_epi32(a)));
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_set1_epi32(b)));
        }
        /* sub-blocks 2c and 2c + 1: qwords 2c % 4 and 2c % 4 + 1 of sc[c / 2] */
        acc = madd(madd(acc, lo, r8_scales(sc[c / 2], 2 * c % 4)), hi, r8_scales(sc[c / 2], 2 * c % 4 + 1));
    }
    *I = acc;
    /* mins: lane r of pair p = (mn[2p][r], mn[2p + 1][r]) as int16 against
     * the broadcast pair of 32-value activation sums (x32[2p], x32[2p + 1]) */
    __m256i x32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xs), _mm256_set1_epi16(1)); /* 8 sums of 32 */
    x32 = _mm256_packs_epi32(x32, x32);                                                                 /* |.| <= 4064 */
    __m256i m = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i pr = _mm256_unpacklo_epi8(mn[h], _mm256_srli_si256(mn[h], 8)); /* lane 0: pair 2h, lane 1: pair 2h + 1 */
        __m256i p0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(pr)), p1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(pr, 1));
        m = madd(m, p0, _mm256_permutevar8x32_epi32(x32, _mm256_set1_epi32(4 * h)));     /* pair 2h: int32 0 or 4 */
        m = madd(m, p1, _mm256_permutevar8x32_epi32(x32, _mm256_set1_epi32(4 * h + 1))); /* pair 2h + 1 */
    }
    *M = m;
}

/* The same for q6_K (1680-byte group blocks): values 128h + 32k + l from
 * quarter 2h + (k & 1) of ql (low nibbles for k < 2, high after) and
 * bits 2k, 2k + 1 of half h of qh; 16 int8 scales of 16 values. Each
 * 32 bytes of the two quarters and of qh are read once for the 4 chunks
 * they hold (no branch on k: the chunk's shifts are constants), 2
 * registers (8 values a row each) summed in int16 per scale (|.| <= 2 *
 * 2 * 63 * 127 < 2^15) before its vpmaddwd; M = 32 sum sc xs. */
KQ_AVX void r8_block_q6(const uint8_t *G, const int8_t *x, const int16_t *xs, kq_madd_fn madd, __m256i *I, __m256i *M) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256i acc = _mm256_setzero_si256(), m = _mm256_setzero_si256(); /* one chain: two kept both on the stack */
    for (int h = 0; h < 2; h++) {
        /* S[2k + e]: lane r = (sc, sc) of group g = 8h + 2k + e, row r */
        __m256i S[8];
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(G + 16 + 16 * (4 * h + k)))); /* lane 0: g, lane 1: g + 1 */
            __m256i lo = _mm256_unpacklo_epi16(v, v), hi = _mm256_unpackhi_epi16(v, v);
            S[2 * k] = _mm256_permute2x128_si256(lo, hi, 0x20), S[2 * k + 1] = _mm256_permute2x128_si256(lo, hi, 0x31);
            /* mins: lane r = (sc[g][r], sc[g + 1][r]) against (xs[g], xs[g + 1]) */
            __m256i pair = _mm256_unpacklo_epi16(_mm256_permute4x64_epi64(v, 0xD8), _mm256_permute4x64_epi64(v, 0x72));
            int32_t xp;
            memcpy(&xp, xs + 8 * h + 2 * k, 4);
            m = madd(m, pair, _mm256_set1_epi32(xp));
        }
        const uint8_t *q0 = G + 144 + 512 * h, *q1 = q0 + 256, *qh = G + 1168 + 256 * h;
        const int8_t *xv = x + 128 * h;
        for (int i = 0; i < 8; i += 2) {
            __m256i p[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int e = 0; e < 2; e++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * (i + e)));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * (i + e)));
                __m256i b = _mm256_loadu_si256((const __m256i *)(qh + 32 * (i + e)));
                __m256i u[4] = {_mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(b, 4), m2)),
                                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(b, 2), m2)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(b, m2)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(b, 2), m2))};
                for (int k = 0; k < 4; k++) {
                    int32_t a;
                    memcpy(&a, xv + 32 * k + 4 * (i + e), 4);
                    p[k] = _mm256_add_epi16(p[k], _mm256_maddubs_epi16(u[k], _mm256_set1_epi32(a)));
                }
            }
            acc = madd(madd(acc, p[0], S[i >= 4]), p[1], S[2 + (i >= 4)]);
            acc = madd(madd(acc, p[2], S[4 + (i >= 4)]), p[3], S[6 + (i >= 4)]);
        }
    }
    *I = acc;
    *M = _mm256_slli_epi32(m, 5);
}

/* acc + the sums of 4 products of u[i] (unsigned, <= 31) and x[i]
 * (signed) bytes over i = 0..3: AVX2 sums the 4 vpmaddubsw in int16 (|.|
 * <= 4 * 2 * 31 * 127 < 2^15) before one vpmaddwd by ones; VNNI chains 4
 * vpdpbusd. */
typedef __m256i (*kq_dot16_fn)(__m256i acc, const __m256i *u, const __m256i *x);
KQ_AVX __m256i dot16_avx2(__m256i acc, const __m256i *u, const __m256i *x) {
    __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[0], x[0]), _mm256_maddubs_epi16(u[1], x[1])),
                                 _mm256_add_epi16(_mm256_maddubs_epi16(u[2], x[2]), _mm256_maddubs_epi16(u[3], x[3])));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
}
__attribute__((target(KQ_VNNI_TGT), always_inline)) static inline __m256i dot16_vnni(__m256i acc, const __m256i *u, const __m256i *x) {
    for (int i = 0; i < 4; i++) acc = _mm256_dpbusd_epi32(acc, u[i], x[i]);
    return acc;
}

/* The same for a 32-value format (q4_0 ... q5_1; 144 to 192-byte group
 * blocks): qs piece p (values 4p .. 4p + 3 in the low nibbles, 16 + 4p ..
 * in the high) of the 8 rows is 32 bytes; q5's fifth bits come from the 8
 * rows' qh (lane r): byte i of a lane takes the byte of qh holding bit
 * 4p + i (or 16 + 4p + i) by vpshufb, with that nibble moved to the
 * byte's high half (qh << 4 for even p), keeps bit 4 + i and turns it into
 * 0x10 by an unsigned min. *M is the block's M of qblock.h (8 or 16 times
 * the activations' sum, or the sum for q4_1 / q5_1), the same for the 8
 * rows. */
KQ_AVX void r8_block32(const uint8_t *G, loom_dtype d, const int8_t *x, const int16_t *xs, kq_dot16_fn dot16, __m256i *I,
                       __m256i *M) {
    const int hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1, five = d == LOOM_Q5_0 || d == LOOM_Q5_1;
    const int mmul = d == LOOM_Q4_0 ? 8 : d == LOOM_Q5_0 ? 16 : 1;
    const uint8_t *qs = G + 16 + 16 * hasmin + 32 * five;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i u[8], xb[8];
    for (int p = 0; p < 4; p++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        u[p] = _mm256_and_si256(v, m4), u[4 + p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        int32_t lo, hi;
        memcpy(&lo, x + 4 * p, 4), memcpy(&hi, x + 16 + 4 * p, 4);
        xb[p] = _mm256_set1_epi32(lo), xb[4 + p] = _mm256_set1_epi32(hi);
    }
    if (five) {
        const __m256i at = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12,
                                            12, 12, 12);
        const __m256i bit = _mm256_set1_epi32((int)0x80402010), b4 = _mm256_set1_epi8(0x10);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(G + 16 + 16 * hasmin)), qh4 = _mm256_slli_epi32(qh, 4);
        for (int p = 0; p < 4; p++)
            for (int half = 0; half < 2; half++) { /* qh byte 2 half + p / 2, nibble p % 2 */
                __m256i b = _mm256_shuffle_epi8(p & 1 ? qh : qh4, _mm256_add_epi8(at, _mm256_set1_epi8((char)(2 * half + p / 2))));
                u[4 * half + p] = _mm256_or_si256(u[4 * half + p], _mm256_min_epu8(_mm256_and_si256(b, bit), b4));
            }
    }
    *I = dot16(dot16(_mm256_setzero_si256(), u, xb), u + 4, xb + 4);
    *M = _mm256_set1_epi32(((int32_t)xs[0] + xs[1]) * mmul);
}

/* Output rows o0..o1-1 (multiples of 8) of an 8-rows-interleaved q4_K,
 * q6_K or 32-value format against input rows r0..r1-1, one input row at
 * a time (the group's bytes from cache after the first). Each group
 * block's lines are all asked for before it is read, so its misses
 * overlap: without, the q6_K kernel's order (ql quarters and qh halves,
 * 1 KB apart) got 6 GB/s from memory, one thread; with, 21.6 (q4_K
 * 24.7); asking for the next group block instead got 11-12.5, and for
 * blocks 1-4 ahead besides the current one less than the current alone
 * at 2 threads (bench/kquant-decode.sh KQ_BENCH_ROWS8=1, AVX2 Zen 4). Per
 * row the same float operations in the same order as rowk1 and row32_one
 * (8 partial sums by block, the fixed tree): the same bits as the dense
 * layout's kernels. */
KQ_AVX void rows_r8(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, const kq_out_t *out, loom_dtype d,
                    kq_madd_fn madd, kq_dot16_fn dot16) {
    const int q6 = d == LOOM_Q6_K, q4k = d == LOOM_Q4_K, blk = loom_qblock_info(d)->block, gbytes = 8 * loom_qblock_info(d)->bytes;
    const int negmin = d == LOOM_Q4_1 || d == LOOM_Q5_1; /* dmin = -m (as unpack_g32) */
    const size_t gb = (size_t)a->nb * gbytes;
    for (int o = o0; o < o1; o += 8) {
        const uint8_t *g = (const uint8_t *)w->data + (size_t)(o / 8) * gb;
        for (int n = r0; n < r1; n++) {
            __m256 part[KQ_GROUP];
            for (int j = 0; j < KQ_GROUP; j++) part[j] = _mm256_setzero_ps();
            for (int b = 0; b < a->nb; b++) {
                const uint8_t *G = g + (size_t)b * gbytes;
                for (int l = 0; n == r0 && l < gbytes; l += 64) /* all its lines asked at once; later input rows find them in cache */
                    _mm_prefetch((const char *)G + l, _MM_HINT_T0);
                __m256i I, M;
                const int8_t *x = a->xq + n * a->sq + (size_t)b * blk;
                const int16_t *xs = a->xs + n * a->ss + (size_t)b * blk / 16;
                if (q6) r8_block_q6(G, x, xs, madd, &I, &M);
                else if (q4k) r8_block(G, x, xs, madd, &I, &M);
                else r8_block32(G, d, x, xs, dot16, &I, &M);
                __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)G)), dmin = dd;
                if (q4k || negmin) dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(G + 16)));
                if (negmin) dmin = _mm256_xor_ps(dmin, _mm256_set1_ps(-0.0f));
                __m256 f = _mm256_fmsub_ps(dd, _mm256_cvtepi32_ps(I), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(M)));
                part[b & 7] = _mm256_fmadd_ps(_mm256_set1_ps(a->xd[n * a->sd + b]), f, part[b & 7]);
            }
            __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(part[0], part[1]), _mm256_add_ps(part[2], part[3])),
                                     _mm256_add_ps(_mm256_add_ps(part[4], part[5]), _mm256_add_ps(part[6], part[7])));
            float y[8];
            _mm256_storeu_ps(y, t);
            for (int r = 0; r < 8; r++) kq_put(out, n, o + r, y[r]);
        }
    }
}

/* ---- 32-value formats ---- */

/* The fifth bits of q5_0/q5_1 (bit j of qh for value j) as 0x10 bytes:
 * AVX2 spreads qh over the bytes and compares; AVX-512 uses it as a mask. */
typedef __m256i (*kq_hi5_fn)(uint32_t qh);
KQ_AVX __m256i hi5_avx2(uint32_t qh) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
                                          3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(0x10));
}
__attribute__((target("avx2,avx512f,avx512bw,avx512vl"), always_inline)) static inline __m256i hi5_avx512(uint32_t qh) {
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
}

/* The 32 values of a 32-value block as bytes (low nibbles of qs, then
 * high, plus the fifth bits of q5_0/q5_1). */
KQ_AVX __m256i unpack32(loom_dtype d, const uint8_t *b, kq_hi5_fn hi5) {
    int off = d == LOOM_Q4_0 ? 2 : d == LOOM_Q4_1 ? 4 : d == LOOM_Q5_0 ? 6 : 8;
    __m128i q = _mm_loadu_si128((const __m128i *)(b + off));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    if (d == LOOM_Q5_0 || d == LOOM_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + off - 4, 4);
        v = _mm256_or_si256(v, hi5(qh));
    }
    return v;
}

/* Eight 32-value blocks in registers: their values, d and dmin (q4_1 and
 * q5_1: value = d u + m, so dmin = -m; else dmin = d and the min is a
 * constant 8 or 16 times the activations' sum, a shift). */
typedef struct {
    __m256i u[KQ_GROUP];
    __m256 d, dmin;
} kq_g32_t;

/* Blocks 0..k-1 of the 8 from g; the others zero values, d and dmin. */
KQ_AVX void unpack_g32(loom_dtype d, const uint8_t *g, int k, kq_g32_t *G, kq_hi5_fn hi5) {
    const int bytes = d == LOOM_Q4_0 ? 18 : d == LOOM_Q4_1 ? 20 : d == LOOM_Q5_0 ? 22 : 24;
    for (int l = 0; l < KQ_GROUP * bytes; l += 64) _mm_prefetch((const char *)g + KQ_AHEAD + l, _MM_HINT_T0);
    for (int j = 0; j < KQ_GROUP; j++) G->u[j] = j < k ? unpack32(d, g + j * bytes, hi5) : _mm256_setzero_si256();
#define KQ_H(j, at) (short)((j) < k ? ld16(g + (j) * bytes + (at)) : 0)
    G->d = _mm256_cvtph_ps(_mm_setr_epi16(KQ_H(0, 0), KQ_H(1, 0), KQ_H(2, 0), KQ_H(3, 0), KQ_H(4, 0), KQ_H(5, 0), KQ_H(6, 0), KQ_H(7, 0)));
    G->dmin = G->d;
    if (d == LOOM_Q4_1 || d == LOOM_Q5_1) {
        __m256 m = _mm256_cvtph_ps(_mm_setr_epi16(KQ_H(0, 2), KQ_H(1, 2), KQ_H(2, 2), KQ_H(3, 2), KQ_H(4, 2), KQ_H(5, 2), KQ_H(6, 2), KQ_H(7, 2)));
        G->dmin = _mm256_xor_ps(m, _mm256_set1_ps(-0.0f)); /* exactly -m, as the portable path */
    }
#undef KQ_H
}

/* Two rows' last groups of t <= 4 blocks as one group: lanes 0..t-1 the
 * blocks of row A from ga, lanes 4..4 + t - 1 the same blocks of row B
 * from gb, the other lanes zero values, d and dmin. */
KQ_AVX void unpack_g32_pair(loom_dtype d, const uint8_t *ga, const uint8_t *gb, int t, kq_g32_t *G, kq_hi5_fn hi5) {
    kq_g32_t A, B;
    unpack_g32(d, ga, t, &A, hi5);
    unpack_g32(d, gb, t, &B, hi5);
    for (int j = 0; j < 4; j++) G->u[j] = A.u[j], G->u[4 + j] = B.u[j];
    G->d = _mm256_permute2f128_ps(A.d, B.d, 0x20), G->dmin = _mm256_permute2f128_ps(A.dmin, B.dmin, 0x20);
}

/* The 8 lanes' d I - dmin M of G against input row n's blocks b0 ..
 * b0 + 7; pair: G from unpack_g32_pair, lanes 4..7 against blocks b0 ..
 * b0 + 3 again. */
KQ_AVX __m256 f32_group(const kq_g32_t *G, const kq_act_t *a, int n, int b0, loom_dtype d, kq_dot4_fn dot4, int pair) {
    const int mshift = d == LOOM_Q4_0 ? 3 : d == LOOM_Q5_0 ? 4 : 0;
    const int8_t *x = a->xq + n * a->sq + (size_t)b0 * 32;
    __m256i p[KQ_GROUP];
    for (int j = 0; j < KQ_GROUP; j++)
        p[j] = dot4(_mm256_setzero_si256(), G->u[j], _mm256_loadu_si256((const __m256i *)(x + 32 * (pair ? j & 3 : j))));
    __m256i xs = _mm256_loadu_si256((const __m256i *)(a->xs + n * a->ss + (size_t)b0 * 2));
    __m256i M = _mm256_slli_epi32(_mm256_madd_epi16(xs, _mm256_set1_epi16(1)), mshift);
    if (pair) M = _mm256_permute2x128_si256(M, M, 0x00);
    return _mm256_fmsub_ps(G->d, _mm256_cvtepi32_ps(hsum8(p)), _mm256_mul_ps(G->dmin, _mm256_cvtepi32_ps(M)));
}

KQ_AVX __m256 step32(const kq_g32_t *G, const kq_act_t *a, int n, int b0, __m256 part, loom_dtype d, kq_dot4_fn dot4) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(a->xd + n * a->sd + b0), f32_group(G, a, n, b0, d, dot4, 0), part);
}

/* One weight row of a 32-value format against one input row n, 8 blocks
 * at a time with the 8 partial sums in a register (a last group of k < 8
 * blocks: lanes k..7 zero, adding exactly +0). One row at a time: two
 * rows interleaved filled the short rows' dependency chains in cache but
 * made two streams that the hardware prefetcher served at 2.4x the time
 * per block from memory (bench/kquant-decode.sh, q4_0 16384 x 4096). */
KQ_AVX float row32_one(const uint8_t *row, const kq_act_t *a, int n, loom_dtype d, kq_dot4_fn dot4, kq_hi5_fn hi5) {
    const int bytes = d == LOOM_Q4_0 ? 18 : d == LOOM_Q4_1 ? 20 : d == LOOM_Q5_0 ? 22 : 24;
    __m256 p = _mm256_setzero_ps();
    for (int b0 = 0; b0 < a->nb; b0 += KQ_GROUP) {
        kq_g32_t G;
        unpack_g32(d, row + (size_t)b0 * bytes, a->nb - b0 < KQ_GROUP ? a->nb - b0 : KQ_GROUP, &G, hi5);
        p = step32(&G, a, n, b0, p, d, dot4);
    }
    return total8(p);
}

/* Two weight rows A and B against input row n when their last group has
 * t = nb % 8 <= 4 blocks: the full groups of each as row32_one, then both
 * rows' last groups as one (unpack_g32_pair), its lanes 0..3 going to A's
 * partial sums and 4..7 to B's: the same operations per lane, so the same
 * bits, and one group's work instead of two nearly empty ones (smollm2's
 * 18-block rows: 3 groups a row became 2.5; 1.7 against 1.3 ns a block
 * for 576- against 4096-wide rows before). */
KQ_AVX void row32_two(const uint8_t *ra, const uint8_t *rb, const kq_act_t *a, int n, loom_dtype d, kq_dot4_fn dot4, kq_hi5_fn hi5,
                      float *ya, float *yb) {
    const int bytes = d == LOOM_Q4_0 ? 18 : d == LOOM_Q4_1 ? 20 : d == LOOM_Q5_0 ? 22 : 24;
    const int full = a->nb / KQ_GROUP * KQ_GROUP;
    __m256 pa = _mm256_setzero_ps(), pb = _mm256_setzero_ps();
    for (int b0 = 0; b0 < full; b0 += KQ_GROUP) {
        kq_g32_t G;
        unpack_g32(d, ra + (size_t)b0 * bytes, KQ_GROUP, &G, hi5);
        pa = step32(&G, a, n, b0, pa, d, dot4);
    }
    for (int b0 = 0; b0 < full; b0 += KQ_GROUP) {
        kq_g32_t G;
        unpack_g32(d, rb + (size_t)b0 * bytes, KQ_GROUP, &G, hi5);
        pb = step32(&G, a, n, b0, pb, d, dot4);
    }
    kq_g32_t G;
    unpack_g32_pair(d, ra + (size_t)full * bytes, rb + (size_t)full * bytes, a->nb - full, &G, hi5);
    __m256 f = f32_group(&G, a, n, full, d, dot4, 1), xd = _mm256_loadu_ps(a->xd + n * a->sd + full);
    pa = _mm256_fmadd_ps(xd, _mm256_blend_ps(f, _mm256_setzero_ps(), 0xF0), pa);
    pb = _mm256_fmadd_ps(xd, _mm256_permute2f128_ps(f, f, 0x81), pb);
    *ya = total8(pa), *yb = total8(pb);
}

/* Output rows o0..o1-1 of a 32-value format against input rows r0..r1-1:
 * one input row by row32_one; several input rows with each 8 blocks
 * unpacked once for all of them, partial sums in memory. The
 * activations are padded with zeros to whole groups of 8 (kq_act_t). */
KQ_AVX void rows32(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, const kq_out_t *out, loom_dtype d,
                   kq_dot4_fn dot4, kq_hi5_fn hi5) {
    const int bytes = d == LOOM_Q4_0 ? 18 : d == LOOM_Q4_1 ? 20 : d == LOOM_Q5_0 ? 22 : 24;
    const uint8_t *base = (const uint8_t *)w->data;
    const size_t rb = (size_t)a->nb * bytes;
    if (r1 - r0 == 1) {
        int o = o0, t = a->nb % KQ_GROUP;
        for (; t && t <= 4 && o + 1 < o1; o += 2) {
            float ya, yb;
            row32_two(base + (size_t)o * rb, base + (size_t)(o + 1) * rb, a, r0, d, dot4, hi5, &ya, &yb);
            kq_put(out, r0, o, ya), kq_put(out, r0, o + 1, yb);
        }
        for (; o < o1; o++) kq_put(out, r0, o, row32_one(base + (size_t)o * rb, a, r0, d, dot4, hi5));
        return;
    }
    float part[KQ_PASS][KQ_GROUP] __attribute__((aligned(32)));
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = base + (size_t)o * rb;
        for (int n = r0; n < r1; n++) _mm256_store_ps(part[n - r0], _mm256_setzero_ps());
        for (int b0 = 0; b0 < a->nb; b0 += KQ_GROUP) {
            kq_g32_t G;
            unpack_g32(d, row + (size_t)b0 * bytes, a->nb - b0 < KQ_GROUP ? a->nb - b0 : KQ_GROUP, &G, hi5);
            for (int n = r0; n < r1; n++) _mm256_store_ps(part[n - r0], step32(&G, a, n, b0, _mm256_load_ps(part[n - r0]), d, dot4));
        }
        for (int n = r0; n < r1; n++) kq_put(out, n, o, total8(_mm256_load_ps(part[n - r0])));
    }
}

/* One function per format and instruction set, the kernel and its dot
 * products inlined (constants there). */
#define KQ_ROWS_FN(NAME, TGT, BODY)                                                                                   \
    __attribute__((target(TGT))) static void NAME(const loom_tensor_t *w, const kq_act_t *a, int o0, int o1, int r0, int r1, \
                                                  const kq_out_t *out) {                                              \
        BODY;                                                                                                         \
    }
#define KQ_ROWS(SFX, TGT, MADD, DOT4, HI5)                                                       \
    KQ_ROWS_FN(q4_0_##SFX, TGT, rows32(w, a, o0, o1, r0, r1, out, LOOM_Q4_0, DOT4, HI5))         \
    KQ_ROWS_FN(q4_1_##SFX, TGT, rows32(w, a, o0, o1, r0, r1, out, LOOM_Q4_1, DOT4, HI5))         \
    KQ_ROWS_FN(q5_0_##SFX, TGT, rows32(w, a, o0, o1, r0, r1, out, LOOM_Q5_0, DOT4, HI5))         \
    KQ_ROWS_FN(q5_1_##SFX, TGT, rows32(w, a, o0, o1, r0, r1, out, LOOM_Q5_1, DOT4, HI5))         \
    KQ_ROWS_FN(q4_K_##SFX, TGT, rowsk(w, a, o0, o1, r0, r1, out, LOOM_Q4_K, MADD))               \
    KQ_ROWS_FN(q5_K_##SFX, TGT, rowsk(w, a, o0, o1, r0, r1, out, LOOM_Q5_K, MADD))               \
    KQ_ROWS_FN(q6_K_##SFX, TGT, rowsk(w, a, o0, o1, r0, r1, out, LOOM_Q6_K, MADD))
KQ_ROWS(avx2, "avx2,fma,f16c", madd_avx2, dot4_avx2, hi5_avx2)
KQ_ROWS(avx512, "avx2,fma,f16c,avx512f,avx512bw,avx512vl", madd_avx2, dot4_avx2, hi5_avx512)
KQ_ROWS(vnni, KQ_VNNI_TGT, madd_vnni, dot4_vnni, hi5_avx512)
#endif

#if defined(__x86_64__)
#define KQ_R8(SFX, TGT, MADD, DOT16)                                                           \
    KQ_ROWS_FN(q4_0_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q4_0, MADD, DOT16)) \
    KQ_ROWS_FN(q4_1_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q4_1, MADD, DOT16)) \
    KQ_ROWS_FN(q5_0_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q5_0, MADD, DOT16)) \
    KQ_ROWS_FN(q5_1_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q5_1, MADD, DOT16)) \
    KQ_ROWS_FN(q4_K_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q4_K, MADD, DOT16)) \
    KQ_ROWS_FN(q6_K_r8_##SFX, TGT, rows_r8(w, a, o0, o1, r0, r1, out, LOOM_Q6_K, MADD, DOT16))
KQ_R8(avx2, "avx2,fma,f16c", madd_avx2, dot16_avx2)
KQ_R8(vnni, KQ_VNNI_TGT, madd_vnni, dot16_vnni)
#endif

/* The row kernel of an 8-rows-interleaved weight (loom_qblock_rows8_ok). */
static kq_rows_fn kq_rows_r8(loom_dtype d) {
#if defined(__x86_64__)
#define KQ_R8_FMTS(SFX) {q4_0_r8_##SFX, q4_1_r8_##SFX, q5_0_r8_##SFX, q5_1_r8_##SFX, q4_K_r8_##SFX, NULL, q6_K_r8_##SFX}
    static const kq_rows_fn fns[2][7] = {KQ_R8_FMTS(avx2), KQ_R8_FMTS(vnni)};
#undef KQ_R8_FMTS
    int isa = kq_pick();
    if (isa != KQ_PORTABLE && fns[isa == KQ_AVX512VNNI][d - LOOM_Q4_0]) return fns[isa == KQ_AVX512VNNI][d - LOOM_Q4_0];
#endif
    (void)d;
    return rows_portable;
}

static kq_rows_fn kq_rows_for_isa(loom_dtype d) {
#if defined(__x86_64__)
#define KQ_FMTS(SFX) {q4_0_##SFX, q4_1_##SFX, q5_0_##SFX, q5_1_##SFX, q4_K_##SFX, q5_K_##SFX, q6_K_##SFX}
    static const kq_rows_fn fns[KQ_COUNT - 1][7] = {KQ_FMTS(avx2), KQ_FMTS(avx512), KQ_FMTS(vnni)};
#undef KQ_FMTS
    int isa = kq_pick();
    if (isa != KQ_PORTABLE) return fns[isa - 1][d - LOOM_Q4_0];
#endif
    (void)d;
    return rows_portable;
}

#define KQ_CHUNK 16 /* output rows per task, at least (cpu_team.h) */

/* One matrix product's tasks on the team: task t is output rows
 * o0 .. o0 + rows - 1 of input rows pass * KQ_PASS .. (the pass's). */
typedef struct {
    const loom_tensor_t *w;
    const kq_act_t *a;
    kq_out_t y;
    kq_rows_fn rows;
    int N, OC, rows_per_task, tasks_per_pass;
} kq_job_t;

static void kq_task(void *ctx, int t) {
    const kq_job_t *j = ctx;
    int r0 = t / j->tasks_per_pass * KQ_PASS, o0 = t % j->tasks_per_pass * j->rows_per_task;
    int r1 = r0 + KQ_PASS < j->N ? r0 + KQ_PASS : j->N, o1 = o0 + j->rows_per_task < j->OC ? o0 + j->rows_per_task : j->OC;
    j->rows(j->w, j->a, o0, o1, r0, r1, &j->y);
}

/* Activation quantization of a row range on the team (many rows). */
typedef struct {
    const float *inp;
    const kq_act_t *a;
    int N, per;
} kq_qjob_t;

static void kq_quantize_task(void *ctx, int t) {
    const kq_qjob_t *j = ctx;
    const kq_act_t *a = j->a;
    for (int n = t * j->per; n < j->N && n < (t + 1) * j->per; n++)
        loom_cpu_kq_quantize_act(j->inp + (size_t)n * a->C, a->C, a->blk, (float *)a->xd + n * a->sd, (int8_t *)a->xq + n * a->sq,
                                 (int16_t *)a->xs + n * a->ss);
}

/* Quantize the N input rows into the caller's scratch (slots 0-2), each
 * row's padding (kq_act_t) zero. */
static void kq_quantize_all(const float *inp, int N, kq_act_t *a) {
    size_t used = (size_t)a->nb * a->blk;
    int8_t *xq = loom_cpu_scratch(0, (size_t)N * a->sq);
    float *xd = loom_cpu_scratch(1, (size_t)N * a->sd * sizeof(float));
    int16_t *xs = loom_cpu_scratch(2, (size_t)N * a->ss * sizeof(int16_t));
    for (int n = 0; n < N; n++) {
        memset(xq + n * a->sq + used, 0, a->sq - used);
        memset(xd + n * a->sd + a->nb, 0, (a->sd - (size_t)a->nb) * sizeof(float));
        memset(xs + n * a->ss + used / 16, 0, (a->ss - used / 16) * sizeof(int16_t));
    }
    a->xq = xq, a->xd = xd, a->xs = xs;
    kq_qjob_t q = {inp, a, N, (1 << 16) / a->C > 1 ? (1 << 16) / a->C : 1}; /* ~64K values a task: one for a decode step */
    loom_cpu_team_or_omp(kq_quantize_task, &q, (N + q.per - 1) / q.per, N);
}

void loom_cpu_matmul_forward_kq(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu) {
    if (loom_cpu_kq_gemm(out, inp, w, bias, N, C, OC, gelu)) return; /* many rows: the GEMM of cpu_kquant_gemm.c */
    int blk = loom_qblock_info(w->dtype)->block, nb = C / blk, nbp = (nb + KQ_GROUP - 1) / KQ_GROUP * KQ_GROUP;
    kq_act_t a = {NULL, NULL, NULL, C, blk, nb, (size_t)nbp * blk, (size_t)nbp, (size_t)nbp * blk / 16};
    kq_quantize_all(inp, N, &a);
    int passes = (N + KQ_PASS - 1) / KQ_PASS;
    int per = loom_cpu_team_rows_per_task(OC, KQ_CHUNK, (size_t)OC * loom_qblock_row_bytes(w->dtype, C), passes);
    kq_job_t j = {w, &a, {out, bias, OC, gelu}, w->layout == LOOM_LAYOUT_ROWS8 ? kq_rows_r8(w->dtype) : kq_rows_for_isa(w->dtype), N, OC, per,
                  (OC + per - 1) / per};
    loom_cpu_team_or_omp(kq_task, &j, passes * j.tasks_per_pass, N);
}
