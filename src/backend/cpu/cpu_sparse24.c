/* cpu_sparse24: matrix products with 2:4-sparse weights held compressed
 * (the kept values and their 2-bit positions; backend.h,
 * LOOM_LAYOUT_SPARSE24), for inference.
 *
 * The weights are expanded in registers, 8 columns at a time: the index
 * byte of those columns (two groups of 4) selects one of 256 vpermps
 * patterns that move the 4 kept values, loaded into the low half of a
 * register whose high half is zero, to their columns and a zero to every
 * other column. The product then runs as the dense kernel of cpu_paged.c
 * does: a register tile of 3 input rows x 4 weight rows, one FMA chain per
 * lane in column order, a fixed horizontal sum, a last group of 4 columns
 * one by one. The zeros added change no sum, so each output equals the
 * dense kernel's on the decompressed weights, whatever N and the threads.
 * What is saved is memory traffic: 2 + 1/8 bytes per weight instead of 4,
 * which bounds decode; the arithmetic is the dense kernel's, so prefill
 * (many rows per weight read) runs at the dense rate with no fallback. */
#include "cpu_sparse24.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "cpu_gemm.h"
#include "cpu_math.h"
#include "cpu_isa.h"

#define ROWS_PER_PASS 64 /* input rows per pass over the weights (L2-resident) */
#define TILE_J 4
#define TILE_M 3

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

int loom_cpu_s24_avx2(void) {
    return loom_cpu_has(LOOM_ISA_AVX2) && strcmp(loom_cpu_gemm_kernel(), "scalar") != 0;
}

#if defined(__x86_64__)
/* out[m][j] for mr <= TILE_M rows of x (K columns) and jr <= TILE_J
 * compressed weight rows (values v, K/2 per row; index bytes meta,
 * (K + 7) / 8 per row). Inlined with constant mr, jr so that the
 * accumulators stay in registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile_avx2(const float *x, int K, const float *v, const uint8_t *meta, int mr, int jr, float out[TILE_M][TILE_J]) {
    size_t vs = (size_t)K / 2, ms = ((size_t)K + 7) / 8;
    __m256 acc[TILE_M][TILE_J];
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) acc[m][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[TILE_M];
        for (int m = 0; m < mr; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * K + k);
        for (int j = 0; j < jr; j++) {
            __m256i idx = _mm256_load_si256((const __m256i *)perm[meta[j * ms + (size_t)k / 8]]);
            __m256 wv = _mm256_permutevar8x32_ps(_mm256_zextps128_ps256(_mm_loadu_ps(v + j * vs + (size_t)k / 2)), idx);
            for (int m = 0; m < mr; m++) acc[m][j] = _mm256_fmadd_ps(xv[m], wv, acc[m][j]);
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) {
            float s = loom_hsum8(acc[m][j]);
            if (k < K) { /* K % 8 == 4: the last group column by column, as the dense tail */
                float w4[4];
                group_expand(v + j * vs, meta + j * ms, k / 4, w4);
                for (int c = 0; c < 4; c++) s = fmaf(x[(size_t)m * K + k + c], w4[c], s);
            }
            out[m][j] = s;
        }
}

#define TILE_CASE(MR, JR) tile_avx2(x, K, v, meta, MR, JR, t)
__attribute__((target("avx2,fma"))) static void tile_dispatch_avx2(const float *x, int K, const float *v,
                                                                   const uint8_t *meta, int mr, int jr,
                                                                   float t[TILE_M][TILE_J]) {
    if (jr == TILE_J) {
        if (mr == 3) TILE_CASE(3, 4);
        else if (mr == 2) TILE_CASE(2, 4);
        else TILE_CASE(1, 4);
        return;
    }
    size_t vs = (size_t)K / 2, ms = ((size_t)K + 7) / 8;
    for (int j = 0; j < jr; j++) { /* edge outputs one by one: the same chain per element */
        float tj[TILE_M][TILE_J];
        if (mr == 3) tile_avx2(x, K, v + j * vs, meta + j * ms, 3, 1, tj);
        else if (mr == 2) tile_avx2(x, K, v + j * vs, meta + j * ms, 2, 1, tj);
        else tile_avx2(x, K, v + j * vs, meta + j * ms, 1, 1, tj);
        for (int m = 0; m < mr; m++) t[m][j] = tj[m][0];
    }
}
#endif

/* Portable: one fmaf chain per output over the kept weights in column
 * order (the dense chain without its zero terms). */
static void tile_scalar(const float *x, int K, const float *v, const uint8_t *meta, int mr, int jr,
                        float t[TILE_M][TILE_J]) {
    size_t vs = (size_t)K / 2, ms = ((size_t)K + 7) / 8;
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < jr; j++) {
            const float *xr = x + (size_t)m * K, *vr = v + j * vs;
            const uint8_t *mr8 = meta + j * ms;
            float s = 0.0f;
            for (int g = 0; g < K / 4; g++) {
                int nib = mr8[g / 2] >> (g % 2 * 4) & 15;
                s = fmaf(xr[4 * g + (nib & 3)], vr[2 * g], s);
                s = fmaf(xr[4 * g + (nib >> 2)], vr[2 * g + 1], s);
            }
            t[m][j] = s;
        }
}

void loom_cpu_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                 int N, int C, int OC, int gelu) {
    if (w->dtype != LOOM_FP32 || w->layout != LOOM_LAYOUT_SPARSE24 || w->rows != OC || w->cols != C || C % 4)
        loom_panic(__FILE__, __LINE__, "matmul_forward_s24: weight %lld x %lld of %s, layout %d; want %d x %d fp32 2:4",
                   w->rows, w->cols, loom_dtype_name(w->dtype), (int)w->layout, OC, C);
    pthread_once(&perm_once, perm_build);
    int avx2 = loom_cpu_s24_avx2(), nblk = (OC + TILE_J - 1) / TILE_J;
    const float *v = w->data;
    size_t vs = (size_t)C / 2, ms = ((size_t)C + 7) / 8;
#pragma omp parallel if ((double)N * C * OC > 1 << 18)
    {
        for (int r0 = 0; r0 < N; r0 += ROWS_PER_PASS) {
            int r1 = r0 + ROWS_PER_PASS < N ? r0 + ROWS_PER_PASS : N;
#pragma omp for schedule(dynamic, 16) nowait
            for (int b = 0; b < nblk; b++) {
                int j0 = b * TILE_J, jr = OC - j0 < TILE_J ? OC - j0 : TILE_J;
                for (int m0 = r0; m0 < r1; m0 += TILE_M) {
                    int mr = r1 - m0 < TILE_M ? r1 - m0 : TILE_M;
                    float tl[TILE_M][TILE_J];
                    const float *x = inp + (size_t)m0 * C, *vj = v + (size_t)j0 * vs;
                    const uint8_t *mj = w->meta + (size_t)j0 * ms;
#if defined(__x86_64__)
                    if (avx2) tile_dispatch_avx2(x, C, vj, mj, mr, jr, tl);
                    else
#endif
                        tile_scalar(x, C, vj, mj, mr, jr, tl);
                    for (int m = 0; m < mr; m++)
                        for (int j = 0; j < jr; j++) {
                            float y = tl[m][j] + (bias ? bias[j0 + j] : 0.0f);
                            out[(size_t)(m0 + m) * OC + j0 + j] = gelu ? loom_gelu(y) : y;
                        }
                }
            }
        }
    }
    (void)avx2;
}
