/* cpu_kquant_gemm: prefill on block formats, a weight panel dequantized
 * to fp32 in cache, then loom's fp32 GEMM (see cpu_kquant_gemm.h).
 *
 * On AVX-512 VNNI and on AVX2 every block format (and Q8_0's int8) takes
 * the int8 tiles below instead (2.5-10x this path, bench/kquant-gemm.sh);
 * this path stays for CPUs without AVX2 and for the tests. Why fp32 first: the weights come out exact (the
 * gguf package's values), the activations are not rounded to 8 bits, and
 * the GEMM's micro-kernel (12 x 32 on AVX-512, 6 x 16 on AVX2) already
 * runs near the fp32 peak; the dequantization is one pass over the weight
 * bytes per call (a few instructions per 16 values), shared by all N input
 * rows, so from a few rows on it costs less than the products. The panel
 * of KG_OCP output rows x kg_slice values (256 KB) stays in L2 while the
 * GEMM packs and uses it.
 *
 * The dequantization is written once with GCC vector types (16 lanes of
 * int32 / float) and compiled three times: AVX-512 F (one register), AVX2
 * (two) and the build's own target (portable), chosen by cpuid. Every
 * copy computes gguf.quants.dequantize's float operations in its order
 * (qblock.c's reference), with fused multiply-adds off, so all three give
 * those values bit for bit; the GEMM then sums each output in k order,
 * whatever the threads, so results depend on neither. */
#include "cpu_kquant_gemm.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qblock.h"
#include "backend/qblock_impl.h"
#include "cpu_gemm.h"
#include "cpu_int8.h"
#include "cpu_isa.h"
#include "cpu_math.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Fused multiply-adds would round once where gguf-py rounds twice: off in
 * the dequantization (not in the int8 tile's epilogue, whose GELU is then
 * the same function as cpu_gemm.c's and the tests'). */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#define KG_OCP 64        /* output rows per panel (two of the AVX-512 kernel's 32 columns) */
#define KG_SLICE 1024    /* values per dequantized slice of a row: KG_OCP x 1024 floats = 256 KB */
/* Floats between the panel's rows beyond the slice: rows 4 KB apart put the
 * GEMM's 16-row transposing loads in one L1 set. */
#define KG_PAD 16
/* From these input rows on the GEMM beats the row kernel (bench/kquant-gemm.sh,
 * docs/quantization.md "Prefill"): the 256-value formats' row kernel is
 * faster per block than the 32-value formats' one. */
#define KG_ROWS_K 24
#define KG_ROWS_32 10
/* The int8 tile beats the block-dot kernel on the k-quants from 4 rows
 * (1.2-1.6x there, 3.4-3.9x at 16; at 2 rows q6_K loses): bench/kquant-gemm.sh. */
#define KI_ROWS 4
/* The same for the 32-value tile (q8_0 and q4_0 .. q5_1) against
 * cpu_int8.c's tile (q8_0) and the block-dot kernel: at 8 rows 1.1-2x
 * them, at 4 rows 0.55-0.9x (q4_0 1.2x), 6 in between (bench/kquant-gemm.sh,
 * one thread, a loaded machine: docs/perf.md). */
#define KB_ROWS 8
/* The AVX2 tiles against the block-dot kernel (and cpu_int8.c's kernel on
 * q8_0): at 8 rows (half a tile) 0.96-1.58x it, at 4 rows 0.55-0.94x
 * (bench/kquant-gemm.sh, one thread, a Zen 4 with AVX2 only:
 * docs/quantization.md). */
#define KA_ROWS 8

/* ---- dequantization ---- */

typedef uint8_t kg_u8 __attribute__((vector_size(16), aligned(1))); /* unaligned, may alias any bytes */
typedef int32_t kg_i32 __attribute__((vector_size(64)));
typedef float kg_f32 __attribute__((vector_size(64)));

/* 16 floats at o: (float)q * a, as gguf's d * q (one rounding). */
#define KG_PUT(o, q, a)                                                                                              \
    do {                                                                                                             \
        kg_f32 f_ = __builtin_convertvector((q), kg_f32) * (a);                                                      \
        memcpy((o), &f_, 64);                                                                                        \
    } while (0)
/* 16 floats at o: (float)q * a + m, as gguf's d * q + m (two roundings). */
#define KG_PUT_MIN(o, q, a, m)                                                                                       \
    do {                                                                                                             \
        kg_f32 f_ = __builtin_convertvector((q), kg_f32) * (a);                                                      \
        f_ = f_ + (m);                                                                                               \
        memcpy((o), &f_, 64);                                                                                        \
    } while (0)

/* `nblocks` consecutive blocks of format d from src into o. */
typedef void (*kg_dequant_fn)(loom_dtype d, const uint8_t *src, int nblocks, float *o);

/* The three block functions and the row dequantization for one target:
 * SFX names them, ATTR is their target attribute, LOAD(p) widens 16 bytes
 * at p to 16 int32 lanes (GCC 12 builds __builtin_convertvector of bytes
 * to int32 lane by lane, so each target gets its own zero-extension). */
#define KG_DEQUANT(SFX, ATTR, LOAD)                                                                                   \
/* A 32-value block: d (q - 8), d (q - 16), d q + m; the fifth bit j of                                               \
 * qh for value j. */                                                                                                 \
ATTR static inline void kg_block32_##SFX(loom_dtype d, const uint8_t *b, float *o) {                                  \
    const kg_i32 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};                                       \
    int hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1, five = d == LOOM_Q5_0 || d == LOOM_Q5_1;                           \
    const uint8_t *qs = b + 2 + 2 * hasmin + 4 * five;                                                                \
    float s = qblock_f16(b);                                                                                          \
    kg_i32 q = LOAD(qs), lo = q & 15, hi = q >> 4;                                                                    \
    if (five) {                                                                                                       \
        uint32_t qh;                                                                                                  \
        memcpy(&qh, b + 2 + 2 * hasmin, 4);                                                                           \
        kg_i32 h = (kg_i32){0} + (int32_t)qh;                                                                         \
        lo |= ((h >> iota) & 1) << 4;                                                                                 \
        hi |= ((h >> (iota + 16)) & 1) << 4;                                                                          \
    }                                                                                                                 \
    if (hasmin) {                                                                                                     \
        float m = qblock_f16(b + 2);                                                                                  \
        KG_PUT_MIN(o, lo, s, m);                                                                                      \
        KG_PUT_MIN(o + 16, hi, s, m);                                                                                 \
    } else {                                                                                                          \
        int off = five ? 16 : 8;                                                                                      \
        KG_PUT(o, lo - off, s);                                                                                       \
        KG_PUT(o + 16, hi - off, s);                                                                                  \
    }                                                                                                                 \
}                                                                                                                     \
                                                                                                                      \
/* q4_K / q5_K: chunk c of 64 values is qs[32c ..] low nibbles (sub-block                                             \
 * 2c) then high nibbles (2c + 1), value d sc q - dmin m per sub-block. */                                            \
ATTR static inline void kg_block_k4_##SFX(loom_dtype d, const uint8_t *b, float *o) {                                 \
    float s = qblock_f16(b), smin = qblock_f16(b + 2);                                                                \
    const uint8_t *qh = b + 16, *qs = d == LOOM_Q4_K ? b + 16 : b + 48;                                               \
    for (int c = 0; c < 4; c++) {                                                                                     \
        float dl[2], ml[2];                                                                                           \
        for (int h = 0; h < 2; h++) {                                                                                 \
            int sc, m;                                                                                                \
            qblock_scale_min_k4(2 * c + h, b + 4, &sc, &m);                                                           \
            dl[h] = s * (float)sc, ml[h] = -(smin * (float)m); /* x - y is x + (-y), exactly */                       \
        }                                                                                                             \
        for (int l0 = 0; l0 < 32; l0 += 16) {                                                                         \
            kg_i32 q = LOAD(qs + 32 * c + l0), lo = q & 15, hi = q >> 4;                                              \
            if (d == LOOM_Q5_K) {                                                                                     \
                kg_i32 h = LOAD(qh + l0);                                                                             \
                lo |= ((h >> (2 * c)) & 1) << 4;                                                                      \
                hi |= ((h >> (2 * c + 1)) & 1) << 4;                                                                  \
            }                                                                                                         \
            KG_PUT_MIN(o + 64 * c + l0, lo, dl[0], ml[0]);                                                            \
            KG_PUT_MIN(o + 64 * c + 32 + l0, hi, dl[1], ml[1]);                                                       \
        }                                                                                                             \
    }                                                                                                                 \
}                                                                                                                     \
                                                                                                                      \
/* q6_K: value 128 h + 32 k + l from ql (low nibble of ql[l], ql[l + 32],                                             \
 * then their high nibbles) and bits 2k of qh[l]; d sc (q - 32) per 16. */                                            \
ATTR static inline void kg_block_q6k_##SFX(const uint8_t *b, float *o) {                                              \
    float s = qblock_f16(b + 208);                                                                                    \
    for (int h = 0; h < 2; h++) {                                                                                     \
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;                                                       \
        for (int l0 = 0; l0 < 32; l0 += 16) {                                                                         \
            kg_i32 a = LOAD(ql + l0), c = LOAD(ql + 32 + l0), hh = LOAD(qh + l0);                                     \
            kg_i32 v[4] = {(a & 15) | ((hh & 3) << 4), (c & 15) | (((hh >> 2) & 3) << 4),                             \
                           (a >> 4) | (((hh >> 4) & 3) << 4), (c >> 4) | ((hh >> 6) << 4)};                           \
            for (int k = 0; k < 4; k++) {                                                                             \
                int j = 128 * h + 32 * k + l0;                                                                        \
                KG_PUT(o + j, v[k] - 32, s * (float)(int8_t)b[192 + j / 16]);                                         \
            }                                                                                                         \
        }                                                                                                             \
    }                                                                                                                 \
}                                                                                                                     \
    ATTR static void dequant_##SFX(loom_dtype d, const uint8_t *src, int nblocks, float *o) {                         \
        const loom_qblock_info_t *qi = loom_qblock_info(d);                                                           \
        for (int b = 0; b < nblocks; b++, src += qi->bytes, o += qi->block) {                                         \
            if (d == LOOM_Q6_K) kg_block_q6k_##SFX(src, o);                                                           \
            else if (d >= LOOM_Q4_K) kg_block_k4_##SFX(d, src, o);                                                    \
            else kg_block32_##SFX(d, src, o);                                                                         \
        }                                                                                                             \
    }                                                                                                                 

#define KG_LOAD_C(p) __builtin_convertvector(*(const kg_u8 *)(p), kg_i32)
KG_DEQUANT(portable, , KG_LOAD_C)
#if defined(__x86_64__)
#define KG_LOAD_AVX2(p)                                                                                              \
    ({                                                                                                               \
        __m128i b_ = _mm_loadu_si128((const __m128i *)(p));                                                         \
        union { __m256i h[2]; kg_i32 v; } u_ = {{_mm256_cvtepu8_epi32(b_), _mm256_cvtepu8_epi32(_mm_srli_si128(b_, 8))}}; \
        u_.v;                                                                                                        \
    })
#define KG_LOAD_AVX512(p) ((kg_i32)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p))))
KG_DEQUANT(avx2, __attribute__((target("avx2,fma"))), KG_LOAD_AVX2)
KG_DEQUANT(avx512, __attribute__((target("avx512f,avx2,fma"))), KG_LOAD_AVX512)
#endif
#pragma GCC pop_options

/* portable, avx2, avx512: the fp32 panel's dequantization; avx2int8 and
 * avx512vnni: the int8 tiles (the best the CPU has is chosen). */
enum { KG_PORTABLE, KG_AVX2, KG_AVX512, KG_AVX2I8, KG_VNNI, KG_COUNT };
static const char *const kg_names[KG_COUNT] = {"portable", "avx2", "avx512", "avx2int8", "avx512vnni"};

static int kg_supported(int isa) {
    static const unsigned need[KG_COUNT] = {0, LOOM_ISA_AVX2, LOOM_ISA_AVX2 | LOOM_ISA_AVX512, LOOM_ISA_AVX2,
                                            LOOM_ISA_AVX2 | LOOM_ISA_AVX512 | LOOM_ISA_AVX512VNNI};
#if !defined(__x86_64__)
    if (isa != KG_PORTABLE) return 0;
#endif
    return loom_cpu_has(need[isa]);
}

static int kg_isa_now = -1;

static int kg_pick(void) {
    if (kg_isa_now < 0) {
        int best = KG_PORTABLE;
        for (int i = KG_AVX2; i < KG_COUNT; i++)
            if (kg_supported(i)) best = i;
        kg_isa_now = best;
    }
    return kg_isa_now;
}

const char *loom_cpu_kq_gemm_isa(void) { return kg_names[kg_pick()]; }

int loom_cpu_kq_gemm_use(const char *name) { return loom_cpu_isa_use(kg_names, KG_COUNT, kg_supported, &kg_isa_now, name); }

static kg_dequant_fn kg_dequant_for_isa(void) {
#if defined(__x86_64__)
    static const kg_dequant_fn fns[KG_COUNT] = {dequant_portable, dequant_avx2, dequant_avx512, dequant_avx2, dequant_avx512};
    return fns[kg_pick()];
#else
    return dequant_portable;
#endif
}

/* ---- the product ---- */

static int kg_slice = KG_SLICE;

void loom_cpu_kq_gemm_slice(int values) { kg_slice = values > 0 && values % 256 == 0 ? values : KG_SLICE; }

int loom_cpu_kq_gemm_rows(loom_dtype d) {
    static int rows = -1;
    if (rows < 0) {
        const char *e = getenv("LOOM_KQ_GEMM_ROWS");
        rows = e && *e && atoi(e) > 0 ? atoi(e) : 0;
    }
    if (rows) return rows;
    if (kg_pick() == KG_VNNI) return d >= LOOM_Q4_K ? KI_ROWS : KB_ROWS;
    if (kg_pick() == KG_AVX2I8) return KA_ROWS;
    return d >= LOOM_Q4_K ? KG_ROWS_K : KG_ROWS_32;
}

typedef struct {
    float *out;
    const float *inp;
    const loom_tensor_t *w;
    const float *bias;
    int N, C, OC, gelu;
    kg_dequant_fn dequant;
} kg_job_t;

/* ---- the int8 tile (AVX-512 VNNI, k-quants) ----
 *
 * Integer products as llama.cpp's Q8_K path computes them: each input row
 * rounded once per call to int8 per 256 values (scale xd = amax / 127),
 * each weight superblock unpacked once per call into unsigned bytes u
 * (q4_K 0..15, q5_K 0..31, q6_K 0..63) and integer scales. One vpdpbusd
 * multiplies 4 consecutive values of 16 input rows (one per lane) by the
 * same 4 weight bytes (broadcast): a tile is 16 input rows x 8 output
 * rows, int32 sums per sub-block (exact: |u q| <= 63 * 127, at most 16
 * values), times the sub-block's integer scale into a superblock sum
 * (|sum| < 2^28), then in float: xd (d sumi - dmin summ), summ the mins
 * times the sub-block sums of q (vpdpwssd). q6_K is d sc (u - 32): its
 * "min" is 32 sc with dmin = d. */
#define KI_R 16 /* input rows per tile: the lanes */
#define KI_O 8  /* output rows per tile */
#define KI_P 32 /* output rows per thread's panel */

/* One input tile's superblock: q[group of 4 values][lane][4], the sums of
 * q per 16 values as int16 pairs (chunks 2p, 2p + 1) per lane, xd per lane. */
typedef struct {
    int8_t q[64][KI_R][4];
    int16_t bs[8][KI_R][2];
    float xd[KI_R];
} ki_act_t;

/* One weight row's superblock: u in value order, scale per sub-block (16
 * or 32 values), the mins as int16 pairs per two 16-value chunks. */
typedef struct {
    uint8_t u[256];
    int32_t sc[16];
    int16_t mn[8][2];
    float d, dmin;
    uint8_t pad_[56]; /* 384 bytes: records 64-byte aligned */
} ki_w_t;

/* One superblock of row `b` (format d) into w, 16 values an operation. */
static void ki_unpack(loom_dtype d, const uint8_t *b, ki_w_t *w) {
    kg_u8 v[4], a, c, h;
    if (d == LOOM_Q6_K) {
        w->d = w->dmin = qblock_f16(b + 208);
        for (int hf = 0; hf < 2; hf++)
            for (int l = 0; l < 32; l += 16) {
                memcpy(&a, b + 64 * hf + l, 16), memcpy(&c, b + 64 * hf + 32 + l, 16), memcpy(&h, b + 128 + 32 * hf + l, 16);
                v[0] = (a & 15) | (h & 3) << 4, v[1] = (c & 15) | ((h >> 2) & 3) << 4;
                v[2] = (a >> 4) | ((h >> 4) & 3) << 4, v[3] = (c >> 4) | (h >> 6) << 4;
                for (int k = 0; k < 4; k++) memcpy(w->u + 128 * hf + 32 * k + l, &v[k], 16);
            }
        for (int j = 0; j < 16; j++) w->sc[j] = (int8_t)b[192 + j], w->mn[j / 2][j % 2] = (int16_t)(32 * (int8_t)b[192 + j]);
        return;
    }
    w->d = qblock_f16(b), w->dmin = qblock_f16(b + 2);
    const uint8_t *qh = b + 16, *qs = d == LOOM_Q4_K ? b + 16 : b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        qblock_scale_min_k4(j, b + 4, &sc, &m);
        w->sc[j] = sc, w->mn[j][0] = w->mn[j][1] = (int16_t)m;
    }
    for (int ch = 0; ch < 4; ch++)
        for (int l = 0; l < 32; l += 16) {
            memcpy(&a, qs + 32 * ch + l, 16);
            v[0] = a & 15, v[1] = a >> 4;
            if (d == LOOM_Q5_K) {
                memcpy(&h, qh + l, 16);
                v[0] |= ((h >> (2 * ch)) & 1) << 4, v[1] |= ((h >> (2 * ch + 1)) & 1) << 4;
            }
            memcpy(w->u + 64 * ch + l, &v[0], 16), memcpy(w->u + 64 * ch + 32 + l, &v[1], 16);
        }
}

/* Output row o's superblocks into w. */
static void ki_unpack_row(const kg_job_t *j, int o, void *dst) {
    uint8_t tmp[256];
    for (int b = 0; b < j->C / 256; b++) ki_unpack(j->w->dtype, loom_qblock_at(j->w, o, b, tmp), (ki_w_t *)dst + b);
}

#if defined(__x86_64__)
#define KI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))
#define KA_TARGET __attribute__((target("avx2,fma")))
/* v[i] lane k to v[k] lane i (8 x 8 32-bit lanes; bits moved, never
 * computed on). */
KA_TARGET static inline __attribute__((always_inline)) void ka_transpose8(__m256 v[8]) {
    __m256 t[8], u[8];
    for (int o = 0; o < 8; o += 2) t[o] = _mm256_unpacklo_ps(v[o], v[o + 1]), t[o + 1] = _mm256_unpackhi_ps(v[o], v[o + 1]);
    for (int q = 0; q < 8; q += 4) /* u[q + k]: lanes q .. q + 3 of rows k and k + 4 */
        u[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44), u[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xee),
        u[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44), u[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xee);
    for (int k = 0; k < 4; k++) v[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20), v[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
}

/* The largest |x[i]| of n (a multiple of 8) floats. */
KA_TARGET static float ka_amax(const float *x, int n) {
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
/* q[0 .. 15] = x[i] * id rounded to nearest even; their sum. */
KA_TARGET static int ka_round16(const float *x, float id, int32_t *q) {
    __m256 v = _mm256_set1_ps(id);
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), v)), b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), v));
    _mm256_storeu_si256((__m256i *)q, a), _mm256_storeu_si256((__m256i *)(q + 8), b);
    __m256i s = _mm256_add_epi32(a, b);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1)));
}
/* Byte i all ones where bit i of bits is set, else zero. */
KA_TARGET static inline __m256i ka_bits(uint32_t bits) {
    const __m256i at = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), at); /* byte i: byte i / 8 of bits */
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}
/* Output rows w[0 .. 7] (nsb records apart) for the 16 input rows of act:
 * f[o] lane r = the product of input row r and output row o. gs: groups of
 * 4 values per sub-block (8: 32 values, 4: 16). */
KI_TARGET static inline __attribute__((always_inline)) void ki_tile(const ki_w_t *w, const ki_act_t *act, int nsb,
                                                                   int gs, __m512 f[KI_O]) {
    for (int o = 0; o < KI_O; o++) f[o] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; b++, act++) {
        __m512i sb[KI_O], mn[KI_O];
        for (int o = 0; o < KI_O; o++) sb[o] = mn[o] = _mm512_setzero_si512();
        for (int j = 0; j < 64 / gs; j++) {
            __m512i s[KI_O];
            for (int o = 0; o < KI_O; o++) s[o] = _mm512_setzero_si512();
            for (int g = j * gs; g < j * gs + gs; g++) {
                __m512i q = _mm512_load_si512(act->q[g]);
                for (int o = 0; o < KI_O; o++) {
                    int32_t u4;
                    memcpy(&u4, w[(size_t)o * nsb + b].u + 4 * g, 4);
                    s[o] = _mm512_dpbusd_epi32(s[o], _mm512_set1_epi32(u4), q);
                }
            }
            for (int o = 0; o < KI_O; o++)
                sb[o] = _mm512_add_epi32(sb[o], _mm512_mullo_epi32(s[o], _mm512_set1_epi32(w[(size_t)o * nsb + b].sc[j])));
        }
        for (int p = 0; p < 8; p++) {
            __m512i bs = _mm512_load_si512(act->bs[p]);
            for (int o = 0; o < KI_O; o++) {
                int32_t m2;
                memcpy(&m2, w[(size_t)o * nsb + b].mn[p], 4);
                mn[o] = _mm512_dpwssd_epi32(mn[o], bs, _mm512_set1_epi32(m2));
            }
        }
        __m512 xd = _mm512_load_ps(act->xd);
        for (int o = 0; o < KI_O; o++) {
            const ki_w_t *wr = w + (size_t)o * nsb + b;
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sb[o]), _mm512_set1_ps(wr->d));
            t = _mm512_sub_ps(t, _mm512_mul_ps(_mm512_cvtepi32_ps(mn[o]), _mm512_set1_ps(wr->dmin)));
            f[o] = _mm512_add_ps(f[o], _mm512_mul_ps(xd, t));
        }
    }
}

/* Row r (C values) into its tile's records (nsb per tile): per 256 values
 * xd = amax / 127 and q = x * (127 / amax) rounded to nearest even (the
 * MXCSR default, as nearbyintf; |q| <= 127), the sums of q per 16 values.
 * AVX2, for both tiles' instruction sets. */
KA_TARGET static void ki_quantize_row(const float *x, int r, int nsb, void *act) {
    ki_act_t *a = (ki_act_t *)act + (size_t)(r / KI_R) * nsb;
    int lane = r % KI_R;
    for (int b = 0; b < nsb; b++, a++, x += 256) {
        float amax = ka_amax(x, 256), id = amax > 0 ? 127.0f / amax : 0.0f;
        a->xd[lane] = amax / 127.0f;
        for (int c = 0; c < 16; c++) {
            int32_t q[16];
            a->bs[c / 2][lane][c % 2] = (int16_t)ka_round16(x + 16 * c, id, q);
            for (int t = 0; t < 4; t++)
                for (int k = 0; k < 4; k++) a->q[4 * c + t][lane][k] = (int8_t)q[4 * t + k];
        }
    }
}

/* The tile for q4_K / q5_K (32-value sub-blocks) or q6_K (16). */
KI_TARGET static void ki_tile_k4(const void *w, const void *act, int nsb, __m512 f[KI_O]) { ki_tile(w, act, nsb, 8, f); }
KI_TARGET static void ki_tile_q6(const void *w, const void *act, int nsb, __m512 f[KI_O]) { ki_tile(w, act, nsb, 4, f); }
#endif

/* ---- the int8 tile on 32-value blocks (AVX-512 VNNI: q8_0, q4_0, q4_1, q5_0, q5_1) ----
 *
 * llama.cpp's Q8_0 arithmetic in the k-quant tile's lanes, with the roles
 * of the operands swapped: each input row rounded once per call to int8
 * per 32 values (xd = amax / 127, to nearest even as above) and stored as
 * unsigned q + 128; each weight block as signed bytes v with value d v
 * (q8_0 as loom holds it, LOOM_INT8 with blocks of 32: v = w, copied;
 * q4_0 v = q - 8; q5_0 v = q - 16) or d v + m (q4_1, q5_1: v = q). Per
 * block and output row, one vpdpbusd per 4 values (the weight's 4 bytes
 * broadcast) sums
 * (q + 128) v over 16 input rows; the chain starts from -128 sum v (kept
 * with the block), so the int32 result is sum q v, exact
 * (|.| <= 127 * 128 * 32 < 2^24). Then one multiply-add in float:
 * xd d s (plus xd sum q m). Compared with cpu_int8.c's tile (2 input x 4
 * output rows, a correction vpdpbusd, a subtraction and blended scales
 * per 64 columns), the float work per block is shared by 16 input rows. */

/* One input tile's block: q + 128 as ki_act_t's q, the sums of q, xd. */
typedef struct {
    uint8_t q[8][KI_R][4];
    int32_t sum[KI_R];
    float xd[KI_R];
} kb_act_t;

/* One weight row's block: v in value order, -128 sum v, d and m (0
 * without a min). */
typedef struct {
    int8_t v[32];
    int32_t corr;
    float d, m;
} kb_w_t;

#if defined(__x86_64__)
/* One weight block's record from its values v (signed bytes), d and m. */
KA_TARGET static inline void kb_record(__m256i v, float d, float m, kb_w_t *w) {
    _mm256_storeu_si256((__m256i *)w->v, v);
    w->d = d, w->m = m;
    /* sum v = sum (v + 128) - 32 * 128, the former by vpsadbw */
    __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    int sum = (int)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
    w->corr = -128 * sum;
}

/* A 32-value block's signed values v: value i < 16 the low nibble of
 * qs[i], i >= 16 the high nibble of qs[i - 16]; bit i of qh the fifth
 * (five); less the format's offset off (8 or 16; 0 with a min). */
KA_TARGET static inline __m256i kb_values(__m128i qs, uint32_t qh, int five, int off) {
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(15));
    if (five) v = _mm256_or_si256(v, _mm256_and_si256(ka_bits(qh), _mm256_set1_epi8(16)));
    return _mm256_sub_epi8(v, _mm256_set1_epi8((char)off));
}

/* Output row o's blocks into w: the tensor's int8 (LOOM_INT8) or its
 * 32-value blocks, 32 bytes an operation (at 16 input rows the unpacking
 * cost as much as the tile when written with 16-byte vectors). */
KA_TARGET static void kb_unpack_row(const kg_job_t *j, int o, void *dst) {
    kb_w_t *w = dst;
    loom_dtype d = j->w->dtype;
    int nb = j->C / 32, hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1, five = d == LOOM_Q5_0 || d == LOOM_Q5_1;
    int bytes = d == LOOM_INT8 ? 32 : loom_qblock_info(d)->bytes, off = hasmin ? 0 : five ? 16 : 8;
    const uint8_t *src = (const uint8_t *)j->w->data + (size_t)o * (d == LOOM_INT8 ? (size_t)j->C : loom_qblock_row_bytes(d, j->C));
    for (int k = 0; k < nb; k++, src += bytes) {
        if (d == LOOM_INT8) {
            kb_record(_mm256_loadu_si256((const __m256i *)src), j->w->scales[(size_t)o * nb + k], 0.0f, w + k);
            continue;
        }
        uint32_t qh = 0;
        if (five) memcpy(&qh, src + 2 + 2 * hasmin, 4);
        kb_record(kb_values(_mm_loadu_si128((const __m128i *)(src + 2 + 2 * hasmin + 4 * five)), qh, five, off), qblock_f16(src),
                  hasmin ? qblock_f16(src + 2) : 0.0f, w + k);
    }
}

/* Output rows o .. o + 7 of an 8-rows-interleaved 32-value format or
 * q8_0 (qblock.h) into their records (row r's at dst + r * stride): per
 * group block, the pieces (4 bytes of each row) transposed to each row's
 * bytes in registers (q8_0: 8 x 8 lanes; else qs's 4 x 8), the 8 rows'
 * d (and m) converted at once. */
KA_TARGET static void kb_unpack8(const kg_job_t *j, int o, void *dst, size_t stride) {
    loom_dtype d = j->w->dtype;
    if (d == LOOM_INT8) {
        int nb = j->C / 32;
        const int8_t *G = (const int8_t *)j->w->data + (size_t)o * j->C;
        const float *S = j->w->scales + (size_t)o * nb;
        for (int k = 0; k < nb; k++, G += 256, S += 8) {
            __m256 v[8];
            for (int p = 0; p < 8; p++) v[p] = _mm256_loadu_ps((const float *)(G + 32 * p));
            ka_transpose8(v); /* v[r]: row r's 32 values */
            for (int r = 0; r < 8; r++) kb_record(_mm256_castps_si256(v[r]), S[r], 0.0f, (kb_w_t *)((char *)dst + (size_t)r * stride) + k);
        }
        return;
    }
    int nb = j->C / 32, hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1, five = d == LOOM_Q5_0 || d == LOOM_Q5_1;
    int gbytes = 8 * loom_qblock_info(d)->bytes, off = hasmin ? 0 : five ? 16 : 8, at_q = 16 + 16 * hasmin + 32 * five;
    const uint8_t *G = (const uint8_t *)j->w->data + (size_t)(o / 8) * loom_qblock_row_bytes(d, j->C) * 8;
    for (int k = 0; k < nb; k++, G += gbytes) {
        float dd[8], mm[8] = {0};
        _mm256_storeu_ps(dd, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)G)));
        if (hasmin) _mm256_storeu_ps(mm, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(G + 16))));
        __m256i c[4], t[4], rw[4];
        for (int p = 0; p < 4; p++) c[p] = _mm256_loadu_si256((const __m256i *)(G + at_q + 32 * p));
        t[0] = _mm256_unpacklo_epi32(c[0], c[1]), t[1] = _mm256_unpackhi_epi32(c[0], c[1]);
        t[2] = _mm256_unpacklo_epi32(c[2], c[3]), t[3] = _mm256_unpackhi_epi32(c[2], c[3]);
        rw[0] = _mm256_unpacklo_epi64(t[0], t[2]), rw[1] = _mm256_unpackhi_epi64(t[0], t[2]); /* rows 0, 1 | 4, 5 */
        rw[2] = _mm256_unpacklo_epi64(t[1], t[3]), rw[3] = _mm256_unpackhi_epi64(t[1], t[3]); /* rows 2, 3 | 6, 7 */
        for (int r = 0; r < 8; r++) {
            __m128i qs = r < 4 ? _mm256_castsi256_si128(rw[r]) : _mm256_extracti128_si256(rw[r - 4], 1);
            uint32_t qh = 0;
            if (five) memcpy(&qh, G + 16 + 16 * hasmin + 4 * r, 4);
            kb_record(kb_values(qs, qh, five, off), dd[r], mm[r], (kb_w_t *)((char *)dst + (size_t)r * stride) + k);
        }
    }
}

/* Row r (C values) into its tile's records (nb per tile), per 32 values
 * (q + 128 as unsigned bytes). AVX2, for both tiles' instruction sets. */
KA_TARGET static void kb_quantize_row(const float *x, int r, int nb, void *dst) {
    kb_act_t *a = (kb_act_t *)dst + (size_t)(r / KI_R) * nb;
    int lane = r % KI_R;
    for (int b = 0; b < nb; b++, a++, x += 32) {
        float amax = ka_amax(x, 32), id = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t q[32];
        a->sum[lane] = ka_round16(x, id, q) + ka_round16(x + 16, id, q + 16);
        for (int g = 0; g < 8; g++)
            for (int k = 0; k < 4; k++) a->q[g][lane][k] = (uint8_t)(q[4 * g + k] + 128);
        a->xd[lane] = amax / 127.0f;
    }
}

/* Output rows w[0 .. 7] (nb records apart) for the 16 input rows of act;
 * hasmin constant per format (above). */
KI_TARGET static inline __attribute__((always_inline)) void kb_tile(const kb_w_t *w, const kb_act_t *act, int nb,
                                                                   int hasmin, __m512 f[KI_O]) {
    for (int o = 0; o < KI_O; o++) f[o] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, act++, w++) {
        __m512i s[KI_O];
        for (int o = 0; o < KI_O; o++) s[o] = _mm512_set1_epi32(w[(size_t)o * nb].corr);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            __m512i q = _mm512_load_si512(act->q[g]);
#pragma GCC unroll 8
            for (int o = 0; o < KI_O; o++) {
                int32_t v4;
                memcpy(&v4, w[(size_t)o * nb].v + 4 * g, 4);
                s[o] = _mm512_dpbusd_epi32(s[o], q, _mm512_set1_epi32(v4));
            }
        }
        __m512 xd = _mm512_load_ps(act->xd), xm = _mm512_mul_ps(xd, _mm512_cvtepi32_ps(_mm512_load_si512(act->sum)));
        for (int o = 0; o < KI_O; o++) {
            f[o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[o]), _mm512_mul_ps(xd, _mm512_set1_ps(w[(size_t)o * nb].d)), f[o]);
            if (hasmin) f[o] = _mm512_fmadd_ps(xm, _mm512_set1_ps(w[(size_t)o * nb].m), f[o]);
        }
    }
}

KI_TARGET static void kb_tile_sym(const void *w, const void *act, int nb, __m512 f[KI_O]) { kb_tile(w, act, nb, 0, f); }
KI_TARGET static void kb_tile_min(const void *w, const void *act, int nb, __m512 f[KI_O]) { kb_tile(w, act, nb, 1, f); }

/* ---- the same tiles on AVX2 (no VNNI) ----
 *
 * The same records and the same integer sums, by vpmaddubsw (unsigned by
 * signed bytes, pairs added into int16) where VNNI has vpdpbusd: `per`
 * groups of 4 values are added in int16, then one vpmaddwd widens them to
 * int32 (times the sub-block's scale on the k-quants, times 1 on the
 * 32-value formats). per is the most groups whose int16 sum cannot pass
 * 32767: a group's pair is at most 2 * 15 * 127 on q4_K (so 8 groups),
 * 2 * 31 * 127 on q5_K (4), 2 * 63 * 127 on q6_K (2); with the
 * activations' q + 128 as the unsigned side, 2 * 255 * 8 on q4_0 (8),
 * 2 * 255 * 16 on q5_0 and 2 * 255 * 15 on q4_1 (4), 2 * 255 * 31 on q5_1
 * (2). LOOM_INT8 (q8_0: |v| up to 127) could pass it in one pair: it
 * takes signed activations and the sign trick below. A 16 x 8 tile is
 * four sub-tiles of 8 input rows (the lanes) x 4 output rows, one
 * superblock or block at a time (its records stay in L1 for all four),
 * sums in f. */
#define KA_R 8 /* input rows of a sub-tile */
#define KA_O 4 /* output rows of a sub-tile */

/* The k-quant tile on the first `lanes` (8 or 16) input rows: gs groups
 * of 4 values a sub-block (8 or 4), per as above. */
KA_TARGET static inline __attribute__((always_inline)) void ka_tile_k(const ki_w_t *w, const ki_act_t *act, int nsb, int lanes,
                                                                     int gs, int per, float f[KI_O][KI_R]) {
    memset(f, 0, sizeof(float) * KI_O * KI_R);
    for (int b = 0; b < nsb; b++, act++)
        for (int h = 0; h < lanes; h += KA_R)
            for (int o0 = 0; o0 < KI_O; o0 += KA_O) {
                const ki_w_t *wr[KA_O];
                __m256i sb[KA_O], mn[KA_O];
                for (int o = 0; o < KA_O; o++) wr[o] = w + (size_t)(o0 + o) * nsb + b, sb[o] = mn[o] = _mm256_setzero_si256();
                for (int j = 0; j < 64 / gs; j++)
                    for (int g0 = j * gs; g0 < j * gs + gs; g0 += per) {
                        __m256i s[KA_O];
                        for (int o = 0; o < KA_O; o++) s[o] = _mm256_setzero_si256();
#pragma GCC unroll 1
                        for (int g = g0; g < g0 + per; g++) { /* unrolled, GCC loads every q first and spills the products */
                            __m256i q = _mm256_load_si256((const __m256i *)act->q[g][h]);
                            for (int o = 0; o < KA_O; o++) {
                                int32_t u4;
                                memcpy(&u4, wr[o]->u + 4 * g, 4);
                                s[o] = _mm256_add_epi16(s[o], _mm256_maddubs_epi16(_mm256_set1_epi32(u4), q));
                            }
                        }
                        for (int o = 0; o < KA_O; o++)
                            sb[o] = _mm256_add_epi32(sb[o], _mm256_madd_epi16(s[o], _mm256_set1_epi16((int16_t)wr[o]->sc[j])));
                    }
                for (int p = 0; p < 8; p++) {
                    __m256i bs = _mm256_load_si256((const __m256i *)act->bs[p][h]);
                    for (int o = 0; o < KA_O; o++) {
                        int32_t m2;
                        memcpy(&m2, wr[o]->mn[p], 4);
                        mn[o] = _mm256_add_epi32(mn[o], _mm256_madd_epi16(bs, _mm256_set1_epi32(m2)));
                    }
                }
                __m256 xd = _mm256_load_ps(act->xd + h);
                for (int o = 0; o < KA_O; o++) {
                    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(sb[o]), _mm256_set1_ps(wr[o]->d));
                    t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_cvtepi32_ps(mn[o]), _mm256_set1_ps(wr[o]->dmin)));
                    _mm256_store_ps(f[o0 + o] + h, _mm256_add_ps(_mm256_load_ps(f[o0 + o] + h), _mm256_mul_ps(xd, t)));
                }
            }
}

/* Q8_0 (LOOM_INT8 in blocks of 32) on the first `lanes` input rows: the
 * signed activations (q + 128 flipped back) times v as |q| times v with
 * q's sign (|q| once for 4 output rows), so that a pair is at most
 * 2 * 127 * 127, widened every group; no correction term. */
KA_TARGET static inline __attribute__((always_inline)) void ka_tile_q8(const kb_w_t *w, const kb_act_t *act, int nb, int lanes,
                                                                      float f[KI_O][KI_R]) {
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    memset(f, 0, sizeof(float) * KI_O * KI_R);
    for (int b = 0; b < nb; b++, act++)
        for (int h = 0; h < lanes; h += KA_R) {
            __m256 xd = _mm256_load_ps(act->xd + h);
            for (int o0 = 0; o0 < KI_O; o0 += KA_O) {
                const kb_w_t *wr[KA_O];
                __m256i s[KA_O];
                for (int o = 0; o < KA_O; o++) wr[o] = w + (size_t)(o0 + o) * nb + b, s[o] = _mm256_setzero_si256();
#pragma GCC unroll 1
                for (int g = 0; g < 8; g++) {
                    __m256i q = _mm256_xor_si256(_mm256_load_si256((const __m256i *)act->q[g][h]), flip), aq = _mm256_abs_epi8(q);
                    for (int o = 0; o < KA_O; o++) {
                        int32_t v4;
                        memcpy(&v4, wr[o]->v + 4 * g, 4);
                        __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(v4), q));
                        s[o] = _mm256_add_epi32(s[o], _mm256_madd_epi16(p, ones));
                    }
                }
                for (int o = 0; o < KA_O; o++)
                    _mm256_store_ps(f[o0 + o] + h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[o]), _mm256_mul_ps(xd, _mm256_set1_ps(wr[o]->d)),
                                                                   _mm256_load_ps(f[o0 + o] + h)));
            }
        }
}

/* ka_tile_q8 straight from q8_0 held 8 rows interleaved (qblock.h): the
 * tile's 8 output rows are one group, whose block b holds each row's 4
 * bytes of group g side by side at G + 256 b + 32 g + 4 r and the 8 rows'
 * scales at S + 8 b + r. The same products in the same order as on the
 * unpacked records (bit for bit), without unpacking: at 16 input rows the
 * records' transposition and copy cost 40% of the tile's time (smollm2's
 * 16-in-flight decode). */
KA_TARGET static inline __attribute__((always_inline)) void ka_tile_q8i(const int8_t *G, const float *S, const kb_act_t *act, int nb,
                                                                       int lanes, float f[KI_O][KI_R]) {
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    memset(f, 0, sizeof(float) * KI_O * KI_R);
    for (int b = 0; b < nb; b++, act++, G += 256, S += 8)
        for (int h = 0; h < lanes; h += KA_R) {
            __m256 xd = _mm256_load_ps(act->xd + h);
            for (int o0 = 0; o0 < KI_O; o0 += KA_O) {
                __m256i s[KA_O];
                for (int o = 0; o < KA_O; o++) s[o] = _mm256_setzero_si256();
#pragma GCC unroll 1
                for (int g = 0; g < 8; g++) {
                    __m256i q = _mm256_xor_si256(_mm256_load_si256((const __m256i *)act->q[g][h]), flip), aq = _mm256_abs_epi8(q);
                    for (int o = 0; o < KA_O; o++) {
                        int32_t v4;
                        memcpy(&v4, G + 32 * g + 4 * (o0 + o), 4);
                        __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(v4), q));
                        s[o] = _mm256_add_epi32(s[o], _mm256_madd_epi16(p, ones));
                    }
                }
                for (int o = 0; o < KA_O; o++)
                    _mm256_store_ps(f[o0 + o] + h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[o]), _mm256_mul_ps(xd, _mm256_set1_ps(S[o0 + o])),
                                                                   _mm256_load_ps(f[o0 + o] + h)));
            }
        }
}

/* The 32-value tile on the first `lanes` input rows: hasmin as kb_tile,
 * per as above. */
KA_TARGET static inline __attribute__((always_inline)) void ka_tile_b(const kb_w_t *w, const kb_act_t *act, int nb, int lanes,
                                                                     int hasmin, int per, float f[KI_O][KI_R]) {
    const __m256i ones = _mm256_set1_epi16(1);
    memset(f, 0, sizeof(float) * KI_O * KI_R);
    for (int b = 0; b < nb; b++, act++)
        for (int h = 0; h < lanes; h += KA_R) {
            __m256 xd = _mm256_load_ps(act->xd + h), xm = _mm256_mul_ps(xd, _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(act->sum + h))));
            for (int o0 = 0; o0 < KI_O; o0 += KA_O) {
                const kb_w_t *wr[KA_O];
                __m256i s[KA_O];
                for (int o = 0; o < KA_O; o++) wr[o] = w + (size_t)(o0 + o) * nb + b, s[o] = _mm256_set1_epi32(wr[o]->corr);
                for (int g0 = 0; g0 < 8; g0 += per) {
                    __m256i t[KA_O];
                    for (int o = 0; o < KA_O; o++) t[o] = _mm256_setzero_si256();
#pragma GCC unroll 1
                    for (int g = g0; g < g0 + per; g++) {
                        __m256i q = _mm256_load_si256((const __m256i *)act->q[g][h]);
                        for (int o = 0; o < KA_O; o++) {
                            int32_t v4;
                            memcpy(&v4, wr[o]->v + 4 * g, 4);
                            t[o] = _mm256_add_epi16(t[o], _mm256_maddubs_epi16(q, _mm256_set1_epi32(v4)));
                        }
                    }
                    for (int o = 0; o < KA_O; o++) s[o] = _mm256_add_epi32(s[o], _mm256_madd_epi16(t[o], ones));
                }
                for (int o = 0; o < KA_O; o++) {
                    __m256 fo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[o]), _mm256_mul_ps(xd, _mm256_set1_ps(wr[o]->d)),
                                                _mm256_load_ps(f[o0 + o] + h));
                    if (hasmin) fo = _mm256_fmadd_ps(xm, _mm256_set1_ps(wr[o]->m), fo);
                    _mm256_store_ps(f[o0 + o] + h, fo);
                }
            }
        }
}
/* ---- both int8 tiles' product ---- */

/* f[o] lane r: input row r of act's tile times output row o of w. */
typedef void (*kx_tile_fn)(const void *w, const void *act, int nrec, __m512 f[KI_O]);

/* A tile kind: values per record, the records' sizes, how input rows are
 * quantized and weight rows unpacked. */
typedef struct {
    int values;
    size_t act_bytes, w_bytes;
    void (*quantize)(const float *x, int r, int nrec, void *act);
    void (*unpack)(const kg_job_t *j, int o, void *w);
    /* rows o .. o + 7 of an 8-rows-interleaved weight, stride bytes apart (NULL: unpack each) */
    void (*unpack8)(const kg_job_t *j, int o, void *w, size_t stride);
} kx_kind_t;

KA_TARGET static void ka_unpack8(const kg_job_t *j, int o, void *dst, size_t stride);
static const kx_kind_t ki_kind = {256, sizeof(ki_act_t), sizeof(ki_w_t), ki_quantize_row, ki_unpack_row, ka_unpack8};
static const kx_kind_t kb_kind = {32, sizeof(kb_act_t), sizeof(kb_w_t), kb_quantize_row, kb_unpack_row, kb_unpack8};

static kx_tile_fn kx_tile_for(loom_dtype d) {
    switch (d) {
    case LOOM_Q4_K: case LOOM_Q5_K: return ki_tile_k4;
    case LOOM_Q6_K: return ki_tile_q6;
    case LOOM_Q4_1: case LOOM_Q5_1: return kb_tile_min;
    default: return kb_tile_sym;
    }
}

/* A whole tile without GELU: f[o] lane r (16 x 8) transposed in registers
 * to 8 floats per input row (the scalar loop below took 15% of the
 * products' time on smollm2), plus the bias: the same additions. Within
 * each 128-bit lane (input rows 4L .. 4L + 3) unpacking and shuffling
 * output rows 0-3 gives rows 4L + k of r[k], 4-7 those of s[k]. */
KI_TARGET static void kx_store_full(const kg_job_t *j, const __m512 f[KI_O], int r0, int o0) {
    __m512 r[4], s[4];
    for (int h = 0; h < 2; h++) {
        const __m512 *g = f + 4 * h;
        __m512 a = _mm512_unpacklo_ps(g[0], g[1]), b = _mm512_unpackhi_ps(g[0], g[1]);
        __m512 c = _mm512_unpacklo_ps(g[2], g[3]), d = _mm512_unpackhi_ps(g[2], g[3]);
        __m512 *x = h ? s : r;
        x[0] = _mm512_shuffle_ps(a, c, 0x44), x[1] = _mm512_shuffle_ps(a, c, 0xee);
        x[2] = _mm512_shuffle_ps(b, d, 0x44), x[3] = _mm512_shuffle_ps(b, d, 0xee);
        if (j->bias) {
            __m512 bv = _mm512_broadcast_f32x4(_mm_loadu_ps(j->bias + o0 + 4 * h));
            for (int k = 0; k < 4; k++) x[k] = _mm512_add_ps(x[k], bv);
        }
    }
    for (int k = 0; k < 4; k++) {
        float *o = j->out + (size_t)(r0 + k) * j->OC + o0;
        size_t step = 4 * (size_t)j->OC; /* 128-bit lane L: input row 4L + k */
        _mm_storeu_ps(o, _mm512_extractf32x4_ps(r[k], 0)), _mm_storeu_ps(o + 4, _mm512_extractf32x4_ps(s[k], 0));
        _mm_storeu_ps(o + step, _mm512_extractf32x4_ps(r[k], 1)), _mm_storeu_ps(o + step + 4, _mm512_extractf32x4_ps(s[k], 1));
        _mm_storeu_ps(o + 2 * step, _mm512_extractf32x4_ps(r[k], 2)), _mm_storeu_ps(o + 2 * step + 4, _mm512_extractf32x4_ps(s[k], 2));
        _mm_storeu_ps(o + 3 * step, _mm512_extractf32x4_ps(r[k], 3)), _mm_storeu_ps(o + 3 * step + 4, _mm512_extractf32x4_ps(s[k], 3));
    }
}

/* A tile's sums t[o][r] (input row r0 + r, output row o0 + o, no <= 8) into
 * out, plus bias, GELU when asked. */
static void kx_put(const kg_job_t *j, float t[KI_O][KI_R], int r0, int o0, int no) {
    int nr = j->N - r0 < KI_R ? j->N - r0 : KI_R;
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < no; o++) {
            float v = t[o][r] + (j->bias ? j->bias[o0 + o] : 0.0f);
            j->out[(size_t)(r0 + r) * j->OC + o0 + o] = j->gelu ? loom_gelu(v) : v;
        }
}

/* One tile's product and store: input rows r0 .. (a tile) by output rows
 * o0 .. o0 + no - 1 (no <= 8) of the unpacked rows w into out. */
typedef void (*kx_block_fn)(const kg_job_t *j, const void *w, const void *act, int nrec, int r0, int o0, int no);

/* The VNNI tile's. */
KI_TARGET static void kx_block_vnni(const kg_job_t *j, const void *w, const void *act, int nrec, int r0, int o0, int no) {
    __m512 f[KI_O];
    kx_tile_for(j->w->dtype)(w, act, nrec, f);
    if (j->N - r0 >= KI_R && no == KI_O && !j->gelu) {
        kx_store_full(j, f, r0, o0);
        return;
    }
    float t[KI_O][KI_R];
    for (int o = 0; o < KI_O; o++) _mm512_storeu_ps(t[o], f[o]);
    kx_put(j, t, r0, o0, no);
}


/* An AVX2 tile's 8 output rows of each input row (no GELU): f transposed
 * 8 x 8 at a time in registers, plus the bias, the same addition as
 * kx_put (its scalar loop was ~7% of smollm2's prefill products). */
KA_TARGET static void ka_store(const kg_job_t *j, float f[KI_O][KI_R], int r0, int o0) {
    int nr = j->N - r0 < KI_R ? j->N - r0 : KI_R;
    __m256 bias = j->bias ? _mm256_loadu_ps(j->bias + o0) : _mm256_setzero_ps();
    for (int h = 0; h < nr; h += KA_R) {
        __m256 c[8];
        for (int o = 0; o < 8; o++) c[o] = _mm256_load_ps(f[o] + h);
        ka_transpose8(c);
        for (int k = 0; k < KA_R && h + k < nr; k++)
            _mm256_storeu_ps(j->out + (size_t)(r0 + h + k) * j->OC + o0, _mm256_add_ps(c[k], bias));
    }
}

/* 16 x 8 bytes, x[i] groups 4i .. 4i + 3 of 8 rows ([group][row]), to
 * out[r] = row r's 16 bytes in group order. */
KA_TARGET static void ka_bytes_by_row(const __m256i x[4], uint8_t out[8][16]) {
    const __m256i pairs = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6,
                                           14, 7, 15);
    __m256i q[4];
    for (int i = 0; i < 4; i++) { /* dword r (rows 0-3 in lane 0, 4-7 in lane 1): groups 4i .. 4i + 3 of row r */
        __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x[i], pairs), 0xD8);
        q[i] = _mm256_unpacklo_epi16(a, _mm256_srli_si256(a, 8));
    }
    __m256i e0 = _mm256_unpacklo_epi32(q[0], q[1]), f0 = _mm256_unpackhi_epi32(q[0], q[1]); /* groups 0-7: rows 0 1 | 4 5, 2 3 | 6 7 */
    __m256i e1 = _mm256_unpacklo_epi32(q[2], q[3]), f1 = _mm256_unpackhi_epi32(q[2], q[3]); /* groups 8-15 */
    __m256i r[4] = {_mm256_unpacklo_epi64(e0, e1), _mm256_unpackhi_epi64(e0, e1), _mm256_unpacklo_epi64(f0, f1),
                    _mm256_unpackhi_epi64(f0, f1)}; /* rows 0 | 4, 1 | 5, 2 | 6, 3 | 7 */
    for (int k = 0; k < 4; k++) {
        _mm_storeu_si128((__m128i *)out[k], _mm256_castsi256_si128(r[k]));
        _mm_storeu_si128((__m128i *)out[k + 4], _mm256_extracti128_si256(r[k], 1));
    }
}

/* Output rows o .. o + 7 of an 8-rows-interleaved q4_K or q6_K (qblock.h)
 * into their records (ki_unpack's), stride bytes apart, straight from the
 * group blocks: 32 value bytes of the 8 rows at a time transposed 8 x 8 in
 * registers, the scale bytes 16 x 8 (the same records as ki_unpack of the
 * dense blocks; the tests compare the products bit for bit). A block
 * gathered dense first cost more than the tile at 16 input rows. */
KA_TARGET static void ka_unpack8(const kg_job_t *j, int o, void *dst, size_t stride) {
    const loom_dtype d = j->w->dtype;
    const int q6 = d == LOOM_Q6_K, bytes = loom_qblock_info(d)->bytes, nb = j->C / 256;
    const uint8_t *g = (const uint8_t *)j->w->data + (size_t)(o / 8) * 8 * nb * bytes;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int b = 0; b < nb; b++) {
        const uint8_t *G = g + (size_t)b * 8 * bytes;
        ki_w_t *w[8];
        for (int r = 0; r < 8; r++) w[r] = (ki_w_t *)((char *)dst + (size_t)r * stride) + b;
        __m256i x[4];
        uint8_t sc[8][16];
        float dd[8], dm[8];
        _mm256_storeu_ps(dd, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)G)));
        if (q6) {
            for (int i = 0; i < 4; i++) x[i] = _mm256_loadu_si256((const __m256i *)(G + 16 + 32 * i));
            ka_bytes_by_row(x, sc);
            for (int r = 0; r < 8; r++) {
                __m128i v = _mm_loadu_si128((const __m128i *)sc[r]);
                _mm256_storeu_si256((__m256i *)w[r]->sc, _mm256_cvtepi8_epi32(v));
                _mm256_storeu_si256((__m256i *)(w[r]->sc + 8), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
                _mm256_storeu_si256((__m256i *)w[r]->mn, _mm256_slli_epi16(_mm256_cvtepi8_epi16(v), 5));
                w[r]->d = w[r]->dmin = dd[r];
            }
            for (int h = 0; h < 2; h++) {
                __m256 t[3][8]; /* ql quarters 2h, 2h + 1 and qh half h of the 8 rows */
                for (int k = 0; k < 3; k++) {
                    const uint8_t *src = G + 144 + 256 * (k < 2 ? 2 * h + k : 4 + h);
                    for (int i = 0; i < 8; i++) t[k][i] = _mm256_loadu_ps((const float *)(src + 32 * i));
                    ka_transpose8(t[k]);
                }
                for (int r = 0; r < 8; r++) {
                    __m256i a = _mm256_castps_si256(t[0][r]), c = _mm256_castps_si256(t[1][r]), hb = _mm256_castps_si256(t[2][r]);
                    uint8_t *u = w[r]->u + 128 * h;
                    _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4)));
                    _mm256_storeu_si256((__m256i *)(u + 32),
                                        _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4)));
                    _mm256_storeu_si256((__m256i *)(u + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4)));
                    _mm256_storeu_si256((__m256i *)(u + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                                                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4)));
                }
            }
            continue;
        }
        _mm256_storeu_ps(dm, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(G + 16))));
        const __m256i m6 = _mm256_set1_epi8(63), hi2 = _mm256_set1_epi8(0x30);
        __m256i q03 = _mm256_loadu_si256((const __m256i *)(G + 32)), q47 = _mm256_loadu_si256((const __m256i *)(G + 64));
        __m256i q8b = _mm256_loadu_si256((const __m256i *)(G + 96));
        x[0] = _mm256_and_si256(q03, m6); /* scales 0-3, 4-7, mins 0-3, 4-7: [sub-block][row] (qblock_scale_min_k4) */
        x[1] = _mm256_or_si256(_mm256_and_si256(q8b, m4), _mm256_and_si256(_mm256_srli_epi16(q03, 2), hi2));
        x[2] = _mm256_and_si256(q47, m6);
        x[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q8b, 4), m4), _mm256_and_si256(_mm256_srli_epi16(q47, 2), hi2));
        ka_bytes_by_row(x, sc);
        for (int r = 0; r < 8; r++) {
            __m128i v = _mm_loadu_si128((const __m128i *)sc[r]), mn = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
            _mm256_storeu_si256((__m256i *)w[r]->sc, _mm256_cvtepu8_epi32(v));
            _mm_storeu_si128((__m128i *)w[r]->mn, _mm_unpacklo_epi16(mn, mn));
            _mm_storeu_si128((__m128i *)w[r]->mn + 1, _mm_unpackhi_epi16(mn, mn));
            w[r]->d = dd[r], w[r]->dmin = dm[r];
        }
        for (int c = 0; c < 4; c++) {
            __m256 t[8];
            for (int i = 0; i < 8; i++) t[i] = _mm256_loadu_ps((const float *)(G + 128 + 256 * c + 32 * i));
            ka_transpose8(t);
            for (int r = 0; r < 8; r++) {
                __m256i v = _mm256_castps_si256(t[r]);
                _mm256_storeu_si256((__m256i *)(w[r]->u + 64 * c), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i *)(w[r]->u + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
        }
    }
}

/* The AVX2 tiles', `per` for each format (above). */
KA_TARGET static void kx_block_avx2(const kg_job_t *j, const void *w, const void *act, int nrec, int r0, int o0, int no) {
    float f[KI_O][KI_R] __attribute__((aligned(32)));
    int l = j->N - r0 > KA_R ? KI_R : KA_R; /* a last tile of up to 8 rows: half the work */
    switch (j->w->dtype) {
    case LOOM_Q4_K: ka_tile_k(w, act, nrec, l, 8, 8, f); break;
    case LOOM_Q5_K: ka_tile_k(w, act, nrec, l, 8, 4, f); break;
    case LOOM_Q6_K: ka_tile_k(w, act, nrec, l, 4, 2, f); break;
    case LOOM_Q4_0: ka_tile_b(w, act, nrec, l, 0, 8, f); break;
    case LOOM_Q5_0: ka_tile_b(w, act, nrec, l, 0, 4, f); break;
    case LOOM_Q4_1: ka_tile_b(w, act, nrec, l, 1, 4, f); break;
    case LOOM_Q5_1: ka_tile_b(w, act, nrec, l, 1, 2, f); break;
    default: /* LOOM_INT8 */
        if (j->w->layout == LOOM_LAYOUT_ROWS8) /* kx_run unpacked nothing (its `direct`) */
            ka_tile_q8i((const int8_t *)j->w->data + (size_t)o0 * j->C, j->w->scales + (size_t)o0 * nrec, act, nrec, l, f);
        else ka_tile_q8(w, act, nrec, l, f);
        break;
    }
    if (no == KI_O && !j->gelu) ka_store(j, f, r0, o0);
    else kx_put(j, f, r0, o0, no);
}
#endif


/* Output rows j0 .. j0 + jr - 1, slice by slice of the depth: the slice's
 * blocks dequantized into `panel` (jr rows of ks floats, ks + KG_PAD
 * apart), then the GEMM on it, adding to the earlier slices' sums; bias
 * with the first slice, GELU after the last. */
static void kg_panel(const kg_job_t *j, int j0, int jr, float *panel, int tid) {
    const loom_qblock_info_t *qi = loom_qblock_info(j->w->dtype);
    size_t row_bytes = loom_qblock_row_bytes(j->w->dtype, j->C);
    for (int k0 = 0; k0 < j->C; k0 += kg_slice) {
        int ks = j->C - k0 < kg_slice ? j->C - k0 : kg_slice;
        const uint8_t *src = (const uint8_t *)j->w->data + (size_t)j0 * row_bytes + (size_t)(k0 / qi->block) * qi->bytes;
        uint8_t tmp[256];
        for (int r = 0; r < jr; r++)
            if (j->w->layout == LOOM_LAYOUT_ROWS8) /* block by block, each gathered */
                for (int b = 0; b < ks / qi->block; b++)
                    j->dequant(j->w->dtype, loom_qblock_at(j->w, j0 + r, k0 / qi->block + b, tmp), 1,
                               panel + (size_t)r * (ks + KG_PAD) + (size_t)b * qi->block);
            else
                j->dequant(j->w->dtype, src + (size_t)r * row_bytes, ks / qi->block, panel + (size_t)r * (ks + KG_PAD));
        loom_gemm_t g = {.a = j->inp + k0, .rsa = j->C, .csa = 1, .b = panel, .rsb = 1, .csb = ks + KG_PAD,
                         .c = j->out + j0, .ldc = j->OC, .M = j->N, .N = jr, .K = ks, .accumulate = k0 > 0,
                         .bias = k0 == 0 && j->bias ? j->bias + j0 : NULL,
                         .gelu = j->gelu && k0 + ks == j->C ? j->out + j0 : NULL};
        loom_cpu_gemm_serial(&g, tid);
    }
}

/* The threads' panels, kept from call to call: a fresh 0.5 MB each call
 * was a fresh mapping, its pages faulted in and zeroed every time (smollm2
 * makes 210 calls a forward). Grown from serial code only; one product
 * runs at a time, as with cpu_gemm.c's packing buffers. */
static void *kg_grow(void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return *buf;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    free(*buf);
    *buf = p, *have = bytes;
    return p;
}

static float *kg_panels(size_t floats) {
    static void *buf;
    static size_t have;
    return kg_grow(&buf, &have, floats * sizeof(float));
}

#if defined(__x86_64__)
/* An int8 tile's product: the input rows quantized (all threads), then
 * panels of KI_P output rows unpacked and multiplied by every input tile. */
static int kx_run(const kg_job_t *j, int nt, const kx_kind_t *k, kx_block_fn block) {
    static void *abuf, *wbuf;
    static size_t ahave, whave;
    int nrec = j->C / k->values, ntile = (j->N + KI_R - 1) / KI_R, np = (j->OC + KI_P - 1) / KI_P;
    size_t ab = k->act_bytes * nrec, wb = k->w_bytes * nrec; /* an input tile's records, an output row's */
    char *act = kg_grow(&abuf, &ahave, (size_t)ntile * ab), *wp = kg_grow(&wbuf, &whave, (size_t)nt * KI_P * wb);
    if (!act || !wp) return 0;
    /* q8_0 held 8 rows interleaved: the AVX2 tile reads it as it lies (ka_tile_q8i) */
    int direct = k == &kb_kind && j->w->dtype == LOOM_INT8 && j->w->layout == LOOM_LAYOUT_ROWS8 && block == kx_block_avx2;
    if (j->N % KI_R) /* the last tile's unused lanes: zeros, their sums unused */
        memset(act + (size_t)(ntile - 1) * ab, 0, ab);
#pragma omp parallel num_threads(nt) if ((double)j->N * j->C * j->OC > 1 << 18)
    {
        char *w = wp + (size_t)omp_get_thread_num() * KI_P * wb;
#pragma omp for schedule(static)
        for (int r = 0; r < j->N; r++) k->quantize(j->inp + (size_t)r * j->C, r, nrec, act);
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < np; p++) {
            int o0 = p * KI_P, no = j->OC - o0 < KI_P ? j->OC - o0 : KI_P;
            int by8 = k->unpack8 && j->w->layout == LOOM_LAYOUT_ROWS8; /* o0 and no multiples of 8 then */
            for (int o = 0; o < no && !direct; o += by8 ? 8 : 1)
                if (by8) k->unpack8(j, o0 + o, w + (size_t)o * wb, wb);
                else k->unpack(j, o0 + o, w + (size_t)o * wb);
            if (no % KI_O && !direct) memset(w + (size_t)no * wb, 0, (size_t)(KI_O - no % KI_O) * wb);
            for (int t = 0; t < ntile; t++)
                for (int ot = 0; ot < no; ot += KI_O)
                    block(j, w + (size_t)ot * wb, act + (size_t)t * ab, nrec, t * KI_R, o0 + ot,
                             no - ot < KI_O ? no - ot : KI_O);
        }
    }
    return 1;
}
#endif

int loom_cpu_kq_gemm_run(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC,
                         int gelu) {
    int nt = omp_get_max_threads();
    /* int8 other than in blocks of 32, or with cpu_int8.c told to use
     * another instruction set than this tile's: cpu_int8.c's kernels */
    if (w->dtype == LOOM_INT8 && (w->block != 32 || (kg_pick() != KG_VNNI && kg_pick() != KG_AVX2I8) ||
                                  strcmp(loom_cpu_int8_isa(), kg_pick() == KG_VNNI ? "avx512vnni" : "avx2")))
        return 0;
    if (loom_cpu_gemm_init(nt) != 0) return 0;
    if (nt > loom_cpu_gemm_threads()) nt = loom_cpu_gemm_threads();
    kg_job_t job = {out, inp, w, bias, N, C, OC, gelu, kg_dequant_for_isa()};
#if defined(__x86_64__)
    if (kg_pick() == KG_VNNI || kg_pick() == KG_AVX2I8)
        return kx_run(&job, nt, w->dtype >= LOOM_Q4_K ? &ki_kind : &kb_kind, kg_pick() == KG_VNNI ? kx_block_vnni : kx_block_avx2);
#endif
    /* 32-row panels where 64-row ones would leave fewer than 4 per thread:
     * the last panel's wait is then short */
    int ocp = OC >= 4 * nt * KG_OCP ? KG_OCP : KG_OCP / 2, np = (OC + ocp - 1) / ocp;
    size_t per = (size_t)ocp * (size_t)((C < kg_slice ? C : kg_slice) + KG_PAD);
    float *panels = kg_panels((size_t)nt * per);
    if (!panels) return 0;
#pragma omp parallel num_threads(nt) if ((double)N * C * OC > 1 << 18)
    {
        int tid = omp_get_thread_num();
        /* dynamic: a descheduled thread's panels are taken by the other */
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < np; p++) {
            int j0 = p * ocp, jr = OC - j0 < ocp ? OC - j0 : ocp;
            kg_panel(&job, j0, jr, panels + (size_t)tid * per, tid);
        }
    }
    return 1;
}

int loom_cpu_kq_gemm(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC,
                     int gelu) {
    /* inside a parallel region the threads' panels and cpu_gemm.c's
     * packing buffers (by thread number) would be shared: the row kernel */
    if (N < loom_cpu_kq_gemm_rows(w->dtype) || omp_in_parallel()) return 0;
    return loom_cpu_kq_gemm_run(out, inp, w, bias, N, C, OC, gelu);
}
