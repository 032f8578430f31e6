/* cpu_paged: the CPU's inference ops over the paged KV cache (contracts in
 * backend.h, with the cache's layout).
 *
 * linear: a matrix-vector kernel grown to a few rows. Both operands are
 * contiguous in k (a row of the input, a row of the weight), so a register
 * tile of 3 rows x 4 outputs keeps 12 AVX2 accumulators and each weight row
 * is streamed from memory once per block of 64 input rows: at decode, once
 * per step for every sequence of the batch. A single fp32 row (one
 * stream's decode) takes one output at a time instead: each weight row is
 * then read as one sequential stream without software prefetch, which
 * measured 1.37x the 1x4 tile's decode (docs/perf.md). Each output element
 * is one FMA chain per vector lane in k order, then a fixed horizontal sum,
 * whatever the tile it fell in: results do not depend on N or on the threads.
 *
 * int8 weights (matmul_forward_rows_i8, W8A32) run the same tiles with each
 * weight widened and scaled in registers (decode) or a tile of rows widened
 * once per pass (prefill): the same bits as the dequantized fp32 weight.
 *
 * 2:4-sparse weights held compressed (matmul_forward_s24: the kept values
 * and their 2-bit positions; backend.h, LOOM_LAYOUT_SPARSE24) run the same
 * tiles too, expanded in registers 8 columns at a time: the index byte of
 * those columns (two groups of 4) selects one of 256 vpermps patterns that
 * move the 4 kept values, loaded into the low half of a register whose
 * high half is zero, to their columns and a zero to every other column.
 * The zeros added change no sum, so each output equals the dense kernel's
 * on the decompressed weights, whatever N and the threads. What is saved
 * is memory traffic: 2 + 1/8 bytes per weight instead of 4, which bounds
 * decode; prefill (many rows per weight read) runs at the dense rate.
 *
 * attention: one (row, head) pair per task; keys are visited block by block
 * of the sequence's block table with a running (online) softmax, so no
 * scratch longer than a block is needed; fp32 and int8 caches share it. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "backend/backend.h"
#include "core/core.h"
#include "cpu_paged.h"

#include "cpu_gemm.h"
#include "cpu_int8.h"
#include "cpu_isa.h"
#include "cpu_team.h"
#include <pthread.h>

#define ROWS_PER_PASS 64 /* input rows per pass over the weights (L2-resident) */
#define TILE_J 4
#define TILE_M 3

void loom_cpu_embed_positions(float *out, const int *tokens, const int *pos, const float *wte,
                              const float *wpe, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 16)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;
        const float *e = wte + (size_t)tokens[i] * C;
        if (!wpe) { /* rotary models: positions enter in attention */
            memcpy(o, e, (size_t)C * sizeof(float));
            continue;
        }
        const float *p = wpe + (size_t)pos[i] * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* The weight operand (OC, K) of the row kernel, of one of three kinds:
 * W_F32 rows (f); W_I8 rows (q) whose element (j, k) is (float)q[j,k] *
 * s[j * nb + (k >> sh)] (per row: nb 1, sh 30; per block of 2^sh: nb
 * K >> sh), the value loom_tensor_dequantize gives; W_S24 compressed 2:4
 * rows: K/2 kept values (f) and (K + 7) / 8 index bytes (meta) per row.
 * Widening, scaling and expanding happen in registers, so each kind gives
 * the same bits as its dense fp32 copy. */
enum { W_F32, W_I8, W_S24 };
typedef struct {
    const float *f;
    const int8_t *q;
    const float *s;
    const uint8_t *meta;
    int nb, sh;
} wop_t;

#define S24_MS(K) (((size_t)(K) + 7) / 8) /* index bytes per compressed row */

/* perm[b][d]: for the index byte b of 8 columns, the source lane of column
 * d among the 4 kept values loaded (0..3), or 4, a lane holding zero. */
static int32_t perm[256][8] __attribute__((aligned(32)));
static pthread_once_t perm_once = PTHREAD_ONCE_INIT;

static void perm_build(void) {
    for (int b = 0; b < 256; b++)
        for (int d = 0; d < 8; d++) {
            int g = d / 4, p = d % 4, nib = b >> (4 * g) & 15;
            perm[b][d] = p == (nib & 3) ? 2 * g : p == (nib >> 2) ? 2 * g + 1 : 4;
        }
}

/* The 4 weights of group g of a compressed row (kept values v, index
 * bytes m). */
static inline void group_expand(const float *v, const uint8_t *m, int g, float w4[4]) {
    int nib = m[g / 2] >> (g % 2 * 4) & 15;
    w4[0] = w4[1] = w4[2] = w4[3] = 0.0f;
    w4[nib & 3] = v[2 * g];
    w4[nib >> 2] = v[2 * g + 1];
}

__attribute__((target("avx2,fma"), always_inline)) static inline __m256 wvec(const wop_t *W, int kind, size_t j,
                                                                            int K, int k) {
    if (kind == W_F32) return _mm256_loadu_ps(W->f + j * K + k);
    if (kind == W_S24) {
        __m256i idx = _mm256_load_si256((const __m256i *)perm[W->meta[j * S24_MS(K) + (size_t)k / 8]]);
        return _mm256_permutevar8x32_ps(_mm256_zextps128_ps256(_mm_loadu_ps(W->f + j * (K / 2) + k / 2)), idx);
    }
    __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(W->q + j * K + k))));
    return _mm256_mul_ps(v, _mm256_broadcast_ss(W->s + j * W->nb + (k >> W->sh)));
}

static inline float wval(const wop_t *W, int kind, size_t j, int K, int k) {
    if (kind == W_S24) {
        float w4[4];
        group_expand(W->f + j * (K / 2), W->meta + j * S24_MS(K), k / 4, w4);
        return w4[k % 4];
    }
    return kind == W_I8 ? (float)W->q[j * K + k] * W->s[j * W->nb + (k >> W->sh)] : W->f[j * K + k];
}

/* out[m][j] for mr <= TILE_M rows of x and jr <= TILE_J rows j0.. of W.
 * Always inlined with constant mr, jr, kind so that each variant keeps its
 * accumulators in registers; every (m, j) element sees the same operations
 * in each: one FMA chain per lane in column order, a fixed horizontal sum,
 * the last K % 8 columns one by one. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile_avx2(const float *x, int K, const wop_t *W, size_t j0, int mr, int jr, int kind, int pf, float out[TILE_M][TILE_J]) {
    __m256 acc[TILE_M][TILE_J];
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) acc[m][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[TILE_M];
        for (int m = 0; m < mr; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * K + k);
        /* the next tile's rows (contiguous after these), in order, as fast
         * as this one is read: short rows train the hardware prefetcher
         * too late */
        if (!pf) {
        } else if (kind == W_I8) {
            _mm_prefetch((const char *)(W->q + (j0 + TILE_J) * K) + (size_t)k * TILE_J, _MM_HINT_T0);
        } else if (kind == W_F32) {
            _mm_prefetch((const char *)(W->f + (j0 + TILE_J) * K) + (size_t)k * TILE_J * 4, _MM_HINT_T0);
            _mm_prefetch((const char *)(W->f + (j0 + TILE_J) * K) + (size_t)k * TILE_J * 4 + 64, _MM_HINT_T0);
        }
        for (int j = 0; j < jr; j++) {
            __m256 wv = wvec(W, kind, j0 + j, K, k);
            for (int m = 0; m < mr; m++) acc[m][j] = _mm256_fmadd_ps(xv[m], wv, acc[m][j]);
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) {
            float s = loom_hsum8(acc[m][j]);
            for (int kk = k; kk < K; kk++) s = fmaf(x[(size_t)m * K + kk], wval(W, kind, j0 + j, K, kk), s);
            out[m][j] = s;
        }
}

#define TILE_CASE(MR, JR, J0, T)                                                                      \
    (kind == W_I8    ? tile_avx2(x, K, W, J0, MR, JR, W_I8, 1, T)                                     \
     : kind == W_S24 ? tile_avx2(x, K, W, J0, MR, JR, W_S24, 1, T)                                    \
                     : tile_avx2(x, K, W, J0, MR, JR, W_F32, 1, T))
__attribute__((target("avx2,fma"))) static void tile_dispatch_avx2(const float *x, int K, const wop_t *W, size_t j0,
                                                                   int mr, int jr, int kind, float t[TILE_M][TILE_J]) {
    if (mr == 1 && kind == W_F32) { /* one fp32 row (a single stream's decode): each weight row read as one
                                       sequential stream, no prefetch; each output the same chain as in any tile */
        for (int j = 0; j < jr; j++) {
            float tj[TILE_M][TILE_J];
            tile_avx2(x, K, W, j0 + j, 1, 1, W_F32, 0, tj);
            t[0][j] = tj[0][0];
        }
        return;
    }
    if (jr == TILE_J) {
        if (mr == 3) TILE_CASE(3, 4, j0, t);
        else if (mr == 2) TILE_CASE(2, 4, j0, t);
        else TILE_CASE(1, 4, j0, t);
    } else {
        for (int j = 0; j < jr; j++) { /* edge outputs one by one: same chain per element */
            float tj[TILE_M][TILE_J];
            if (mr == 3) TILE_CASE(3, 1, j0 + j, tj);
            else if (mr == 2) TILE_CASE(2, 1, j0 + j, tj);
            else TILE_CASE(1, 1, j0 + j, tj);
            for (int m = 0; m < mr; m++) t[m][j] = tj[m][0];
        }
    }
}

static void tile_scalar(const float *x, int K, const float *w, int mr, int jr, float t[TILE_M][TILE_J]) {
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s = fmaf(x[(size_t)m * K + k], w[(size_t)j * K + k], s);
            t[m][j] = s;
        }
}

static int have_avx2(void) { return loom_cpu_has(LOOM_ISA_AVX2); }

/* Rows j0..j0+jr-1 of an int8 or compressed W as fp32 (jr, K) into d: for
 * many input rows, widening once beats widening in every tile (and the
 * portable tile takes dense rows). */
static void dequant_rows(const wop_t *W, int kind, int blk, size_t j0, int jr, int K, float *d) {
    for (int j = 0; j < jr; j++) {
        if (kind == W_S24) {
            for (int g = 0; g < K / 4; g++)
                group_expand(W->f + (j0 + j) * (K / 2), W->meta + (j0 + j) * S24_MS(K), g, d + (size_t)j * K + 4 * g);
            continue;
        }
        const int8_t *q = W->q + (j0 + j) * K;
        const float *s = W->s + (j0 + j) * W->nb;
        int bl = blk ? blk : K;
        for (int b = 0; b < K / bl; b++) {
            float sc = s[b];
#pragma omp simd
            for (int k = b * bl; k < (b + 1) * bl; k++) d[(size_t)j * K + k] = (float)q[k] * sc;
        }
    }
}

static int kind_of(const wop_t *W) { return W->meta ? W_S24 : W->q ? W_I8 : W_F32; }

/* Outputs j0..j0+jr-1 of input rows r0..r1-1 (bias, GELU). `deq` (TILE_J,
 * C) scratch: an int8 or compressed W is widened there first, unless
 * `inl` (few rows, a layout the registers handle): widened in the tile. */
static void rows_block(float *out, const float *inp, const wop_t *W, int blk, const float *bias, int r0, int r1,
                       int C, int OC, int gelu, size_t j0, int jr, int avx2, int inl, float *deq) {
    wop_t D = {.f = deq};
    const wop_t *use = W;
    size_t wj = j0; /* the tile's first row in `use` */
    int kind = kind_of(W);
    if (kind != W_F32 && !(avx2 && inl)) {
        dequant_rows(W, kind, blk, j0, jr, C, deq);
        use = &D, wj = 0, kind = W_F32;
    }
    for (int m0 = r0; m0 < r1; m0 += TILE_M) {
        int mr = r1 - m0 < TILE_M ? r1 - m0 : TILE_M;
        float tl[TILE_M][TILE_J];
        const float *x = inp + (size_t)m0 * C;
        if (avx2) tile_dispatch_avx2(x, C, use, wj, mr, jr, kind, tl);
        else tile_scalar(x, C, use->f + wj * C, mr, jr, tl);
        for (int m = 0; m < mr; m++)
            for (int j = 0; j < jr; j++) {
                float v = tl[m][j] + (bias ? bias[j0 + j] : 0.0f);
                out[(size_t)(m0 + m) * OC + j0 + j] = gelu ? loom_gelu(v) : v;
            }
    }
}

/* out (N, OC) = inp (N, C) @ W^T + bias: passes of ROWS_PER_PASS input
 * rows, each streaming W once in tiles of TILE_J rows. */
static void rows_kernel(float *out, const float *inp, const wop_t *W, int blk, const float *bias, int N, int C,
                        int OC, int gelu) {
    int avx2 = W->meta ? loom_cpu_s24_avx2() : have_avx2(), nblk = (OC + TILE_J - 1) / TILE_J;
    /* int8 rows widened in registers while a pass is one tile of rows
     * (decode); with more rows, once per pass into `deq`. Compressed rows
     * always in registers (expanding is cheap; the traffic saved is not). */
    int inl = W->meta || (N <= TILE_M && (blk == 0 || (blk >= 8 && (blk & (blk - 1)) == 0)));
    /* a small product is not worth waking the team (on a busy machine a
     * descheduled thread stalls every barrier) */
#pragma omp parallel if ((double)N * C * OC > 1 << 18)
    {
        float *deq = kind_of(W) != W_F32 && !(avx2 && inl) ? loom_malloc((size_t)TILE_J * C * sizeof(float)) : NULL;
        for (int r0 = 0; r0 < N; r0 += ROWS_PER_PASS) {
            int r1 = r0 + ROWS_PER_PASS < N ? r0 + ROWS_PER_PASS : N;
            /* dynamic: on a shared machine a descheduled thread's share
             * is taken by the others instead of waited for */
#pragma omp for schedule(dynamic, 16) nowait
            for (int b = 0; b < nblk; b++) {
                int j0 = b * TILE_J, jr = OC - j0 < TILE_J ? OC - j0 : TILE_J;
                rows_block(out, inp, W, blk, bias, r0, r1, C, OC, gelu, (size_t)j0, jr, avx2, inl, deq);
            }
        }
        free(deq);
    }
}

void loom_cpu_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias,
                                  int N, int C, int OC, int gelu) {
    wop_t W = {.f = w};
    rows_kernel(out, inp, &W, 0, bias, N, C, OC, gelu);
}

void loom_cpu_matmul_forward_rows_i8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                     int N, int C, int OC, int gelu) {
    int blk = w->block, sh = 30;
    if (blk && (blk & (blk - 1)) == 0)
        for (sh = 0; (1 << sh) < blk; sh++) {
        }
    wop_t W = {.q = (const int8_t *)w->data, .s = w->scales, .nb = blk ? C / blk : 1, .sh = sh};
    rows_kernel(out, inp, &W, blk, bias, N, C, OC, gelu);
}

int loom_cpu_s24_avx2(void) {
    return loom_cpu_has(LOOM_ISA_AVX2) && strcmp(loom_cpu_gemm_kernel(), "scalar") != 0;
}

void loom_cpu_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                 int N, int C, int OC, int gelu) {
    if (w->dtype != LOOM_FP32 || w->layout != LOOM_LAYOUT_SPARSE24 || w->rows != OC || w->cols != C || C % 4)
        loom_panic(__FILE__, __LINE__, "matmul_forward_s24: weight %lld x %lld of %s, layout %d; want %d x %d fp32 2:4",
                   w->rows, w->cols, loom_dtype_name(w->dtype), (int)w->layout, OC, C);
    pthread_once(&perm_once, perm_build);
    wop_t W = {.f = w->data, .meta = w->meta};
    rows_kernel(out, inp, &W, 0, bias, N, C, OC, gelu);
}

/* Head h's keys (which 0) or values (which 1) of block `block`, token
 * `off` (the layout in backend.h). */
static inline float *kv_at(const loom_tensor_t *kv, int NH, int bs, int block, int which, int h, int off) {
    size_t hs = (size_t)kv->cols / (size_t)bs;
    return (float *)kv->data + ((((size_t)block * 2 + which) * NH + h) * bs + off) * hs;
}

static void fp32_only(const loom_tensor_t *kv) {
    if (kv->dtype != LOOM_FP32)
        loom_panic(__FILE__, __LINE__, "KV cache of %s: the CPU's paged ops take fp32 (a quantized cache needs its variant ops)",
                   loom_dtype_name(kv->dtype));
}

void loom_cpu_kv_write(const loom_tensor_t *kv, const float *qkv, const int *slots, int N, int NH, int NKV, int bs) {
    if (kv->dtype == LOOM_INT8) { /* cpu_int8.c */
        loom_cpu_kv_write_int8(kv, qkv, slots, N, NH, NKV, bs);
        return;
    }
    fp32_only(kv);
    int hs = (int)(kv->cols / bs), C = NH * hs, KC = NKV * hs;
#pragma omp parallel for schedule(static) if ((size_t)N * C > 1 << 16)
    for (int i = 0; i < N; i++) {
        int slot = slots[i], blk = slot / bs, off = slot % bs;
        const float *row = qkv + (size_t)i * (C + 2 * KC);
        for (int h = 0; h < NKV; h++) {
            memcpy(kv_at(kv, NKV, bs, blk, 0, h, off), row + C + h * hs, (size_t)hs * sizeof(float));
            memcpy(kv_at(kv, NKV, bs, blk, 1, h, off), row + C + KC + h * hs, (size_t)hs * sizeof(float));
        }
    }
}

#define MAX_BLOCK 256 /* the largest block_size the engine accepts */

#define ATT_G 8 /* query heads one task takes at most */

/* s[j] = (q . K[j]) * sk for the n keys of a block (fp32, hs a multiple of
 * 8): eight keys at a time, each its own chain of multiply-adds, their
 * eight sums reduced together. One key at a time (the loop below) was one
 * chain: a multiply-add's latency per 8 values, and a whole horizontal sum
 * per key. */
__attribute__((target("avx2,fma"))) static void scores_avx2(const float *q, const float *K, int n, int hs, float sk, float *s) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
        for (int e = 0; e < hs; e += 8) {
            __m256 qv = _mm256_loadu_ps(q + e);
            for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (size_t)(j + k) * hs + e), a[k]);
        }
        __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3])); /* keys 0-3 | 0-3, halves */
        __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        __m256 t = _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
        _mm256_storeu_ps(s + j, _mm256_mul_ps(t, _mm256_set1_ps(sk)));
    }
    for (; j < n; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int e = 0; e < hs; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), _mm256_loadu_ps(K + (size_t)j * hs + e), a);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        s[j] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))) * sk;
    }
}

/* Query heads h0 .. h0 + ng - 1 (ng <= ATT_G) of one row, all reading the
 * cache's head kh (grouped-query attention): o (ng x hs) = softmax(q K^T *
 * scale) V over keys 0..pos, a block of the table at a time with a running
 * (online) softmax per head. A block's keys and values are read from
 * memory once for the ng heads (the later heads find them in L1: on
 * smollm2's 16-in-flight decode, one head at a time read the cache three
 * times and attention was a fifth of the step). One loop for both cache
 * types: always inlined with a constant i8, so each element type gets its
 * own vectorized copy, and with a constant head size for the common ones
 * (64, 128: a head's running output then stays in registers). On an int8
 * cache a row's scale goes into the key scale and the softmax weight of
 * each value. The block's exponentials are taken in one vector loop
 * before the weighted sum of values (the same value per key as one at a
 * time). */
__attribute__((always_inline)) static inline void attend(float *o, const float *q, const loom_tensor_t *kv, int NH,
                                                        int bs, const int *table, int pos, int kh, int ng, int i8, int hs,
                                                        int avx2) {
    float scale = 1.0f / sqrtf((float)hs), mx[ATT_G], sum[ATT_G], s[MAX_BLOCK], acc[ATT_G][hs];
    for (int g = 0; g < ng; g++) {
        mx[g] = -INFINITY, sum[g] = 0.0f;
        for (int e = 0; e < hs; e++) acc[g][e] = 0.0f;
    }
    for (int t0 = 0; t0 <= pos; t0 += bs) {
        int n = pos + 1 - t0 < bs ? pos + 1 - t0 : bs, blk = table[t0 / bs];
        size_t rk = ((size_t)blk * 2) * NH + kh, rv = rk + NH; /* rows of K and V (backend.h) */
        const float *K = (const float *)kv->data + rk * kv->cols, *V = (const float *)kv->data + rv * kv->cols;
        const int8_t *K8 = (const int8_t *)kv->data + rk * kv->cols, *V8 = (const int8_t *)kv->data + rv * kv->cols;
        float sk = i8 ? kv->scales[rk] * scale : scale, sv = i8 ? kv->scales[rv] : 1.0f;
        if (t0 + bs <= pos) { /* the next block's keys and values asked for now: blocks lie apart, so the
                               * hardware's prefetcher starts each cold (decode's attention waited on memory) */
            size_t nk = ((size_t)table[t0 / bs + 1] * 2) * NH + kh, bytes = (size_t)kv->cols * (i8 ? 1 : sizeof(float));
            const char *nK = (const char *)kv->data + nk * bytes, *nV = nK + (size_t)NH * bytes;
            for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(nK + b), __builtin_prefetch(nV + b);
        }
        for (int g = 0; g < ng; g++) {
            const float *qg = q + (size_t)g * hs;
            float *ag = acc[g], bmx = mx[g];
            if (!i8 && avx2) scores_avx2(qg, K, n, hs, sk, s);
            else
                for (int j = 0; j < n; j++) {
                    float d = 0;
#pragma omp simd reduction(+ : d)
                    for (int e = 0; e < hs; e++) d += qg[e] * (i8 ? (float)K8[(size_t)j * hs + e] : K[(size_t)j * hs + e]);
                    s[j] = d * sk;
                }
            for (int j = 0; j < n; j++) bmx = s[j] > bmx ? s[j] : bmx;
            float corr = loom_expf(mx[g] - bmx); /* 0 on the first block (mx = -inf) */
            sum[g] *= corr;
#pragma omp simd
            for (int e = 0; e < hs; e++) ag[e] *= corr;
#pragma omp simd
            for (int j = 0; j < n; j++) s[j] = loom_expf(s[j] - bmx);
            for (int j = 0; j < n; j++) {
                float p = s[j];
                sum[g] += p;
                if (i8) p *= sv;
#pragma omp simd
                for (int e = 0; e < hs; e++) ag[e] = fmaf(p, i8 ? (float)V8[(size_t)j * hs + e] : V[(size_t)j * hs + e], ag[e]);
            }
            mx[g] = bmx;
        }
    }
    for (int g = 0; g < ng; g++) {
        float inv = 1.0f / sum[g];
        for (int e = 0; e < hs; e++) o[(size_t)g * hs + e] = acc[g][e] * inv;
    }
}

/* attend for the cache's type, with the head size a constant where common. */
#define ATTEND_HS(NAME, I8)                                                                                          \
    static void NAME(float *o, const float *q, const loom_tensor_t *kv, int NH, int bs, const int *table, int pos, int kh, \
                     int ng) {                                                                                       \
        int hs = (int)(kv->cols / bs), avx2 = hs % 8 == 0 && have_avx2();                                          \
        if (hs == 64) attend(o, q, kv, NH, bs, table, pos, kh, ng, I8, 64, avx2);                                    \
        else if (hs == 128) attend(o, q, kv, NH, bs, table, pos, kh, ng, I8, 128, avx2);                             \
        else attend(o, q, kv, NH, bs, table, pos, kh, ng, I8, hs, avx2);                                             \
    }
ATTEND_HS(attend_f32, 0)
ATTEND_HS(attend_i8, 1)

/* The tasks of one attention call (cpu_team.h): per row, cache head and
 * chunk of `per` of its G query heads. */
typedef struct {
    float *out;
    const float *qkv;
    const loom_tensor_t *kv;
    const int *pos, *seq, *tables;
    int max_blocks, NH, NKV, bs, hs, G, per, chunks;
    size_t QR;
} attn_job_t;

static void attn_task(void *ctx, int task) {
    const attn_job_t *j = ctx;
    int i = task / (j->NKV * j->chunks), kh = task / j->chunks % j->NKV, c = task % j->chunks;
    int h = kh * j->G + c * j->per, ng = j->G - c * j->per < j->per ? j->G - c * j->per : j->per, C = j->NH * j->hs;
    (j->kv->dtype == LOOM_INT8 ? attend_i8 : attend_f32)(j->out + (size_t)i * C + (size_t)h * j->hs,
                                                         j->qkv + (size_t)i * j->QR + (size_t)h * j->hs, j->kv, j->NKV, j->bs,
                                                         j->tables + (size_t)j->seq[i] * j->max_blocks, j->pos[i], kh, ng);
}

void loom_cpu_paged_attention(float *out, const float *qkv, const loom_tensor_t *kv, const int *pos,
                              const int *seq, const int *block_tables, int max_blocks, int N, int NH, int NKV,
                              int bs) {
    if (kv->dtype != LOOM_INT8) fp32_only(kv);
    int hs = (int)(kv->cols / bs), C = NH * hs, G = NH / NKV;
    /* a task per cache head and row while there are four a thread (of the
     * team or OpenMP: loom_cpu_team_or_omp's choice below); with fewer (one
     * row's decode) its query heads are split into more */
    int threads = N <= LOOM_CPU_TEAM_ROWS ? loom_cpu_team_threads() : omp_get_max_threads();
    int per = G < ATT_G ? G : ATT_G, want = 4 * threads;
    while (per > 1 && (long)N * NKV * ((G + per - 1) / per) < want) per = (per + 1) / 2;
    int chunks = (G + per - 1) / per;
    attn_job_t j = {out, qkv, kv, pos, seq, block_tables, max_blocks, NH, NKV, bs, hs, G, per, chunks,
                    (size_t)C + 2 * (size_t)NKV * hs};
    loom_cpu_team_or_omp(attn_task, &j, N * NKV * chunks, N); /* decode's few rows: the team the matrix products use */
}

void loom_cpu_gather_rows(float *out, const float *inp, const int *rows, int R, int C) {
    for (int r = 0; r < R; r++) memcpy(out + (size_t)r * C, inp + (size_t)rows[r] * C, (size_t)C * sizeof(float));
}

void loom_cpu_kv_copy_block(const loom_tensor_t *kv, int src, int dst, int NH) {
    if (kv->dtype == LOOM_INT8) { /* cpu_int8.c */
        loom_cpu_kv_copy_block_int8(kv, src, dst, NH);
        return;
    }
    size_t row = (size_t)kv->cols * loom_dtype_size(kv->dtype), n = 2 * (size_t)NH * row;
    memcpy((char *)kv->data + (size_t)dst * n, (char *)kv->data + (size_t)src * n, n);
}
