/* cpu_gemm: packed, cache-blocked SGEMM (see cpu_gemm.h).
 *
 * Blocking follows BLIS's for AVX-512 (written for row-major C): for each
 * KC-deep slice of K, a thread packs its rows of A into MR-row micro-panels
 * (k-major, one MR-float column per k), then for each NC-wide block of
 * columns packs B into NR-column micro-panels (one NR-float row per k) that
 * stay in L2, and the micro-kernel runs over every (MR x NR) tile with the
 * A micro-panel held in L1. Tiles on the ragged edge are computed in full
 * into a local tile (the packs are zero-padded) and the valid part copied. */
#include "cpu_gemm.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"

#define KC 384     /* depth of a packed slice */
#define NCB 480    /* columns of B packed at once (KC x NCB floats ~ 720 KB, in L2) */
#define MCB 3072   /* rows of A packed at once */
#define MR_MAX 16
#define NR_MAX 32

/* One micro-kernel: tile (mr x nr) of C from kc packed columns of A and rows
 * of B. When `acc` is 0 the tile is overwritten with the product (plus
 * addrow[j] when addrow is non-NULL); when 1 the product is added. */
typedef void (*kernel_fn)(int kc, const float *ap, const float *bp, float *c, ptrdiff_t ldc,
                          const float *addrow, int acc);

typedef struct {
    const char *name;
    int mr, nr;
    kernel_fn fn;
} kernel_t;

/* ---- portable C kernel (the compiler vectorizes it for the build's target) ---- */

#define SC_MR 4
#define SC_NR 16
static void kernel_scalar(int kc, const float *ap, const float *bp, float *c, ptrdiff_t ldc,
                          const float *addrow, int acc) {
    float t[SC_MR][SC_NR];
    memset(t, 0, sizeof t);
    for (int k = 0; k < kc; k++) {
        for (int i = 0; i < SC_MR; i++) {
            float a = ap[k * SC_MR + i];
            for (int j = 0; j < SC_NR; j++) t[i][j] = fmaf(a, bp[k * SC_NR + j], t[i][j]);
        }
    }
    for (int i = 0; i < SC_MR; i++)
        for (int j = 0; j < SC_NR; j++) {
            float base = acc ? c[i * ldc + j] : (addrow ? addrow[j] : 0.0f);
            c[i * ldc + j] = base + t[i][j];
        }
}

/* ---- AVX2 + FMA: 6 x 16 (12 ymm accumulators) ---- */

#define A2_MR 6
#define A2_NR 16
__attribute__((target("avx2,fma"))) static void kernel_avx2(int kc, const float *ap, const float *bp,
                                                              float *c, ptrdiff_t ldc,
                                                              const float *addrow, int acc) {
    __m256 c0[A2_MR], c1[A2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < A2_MR; i++) c0[i] = c1[i] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
        for (int i = 0; i < A2_MR; i++) {
            __m256 a = _mm256_broadcast_ss(ap + i);
            c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
        }
        ap += A2_MR;
        bp += A2_NR;
    }
#pragma GCC unroll 6
    for (int i = 0; i < A2_MR; i++) {
        float *r = c + i * ldc;
        __m256 x0, x1;
        if (acc) {
            x0 = _mm256_loadu_ps(r);
            x1 = _mm256_loadu_ps(r + 8);
        } else if (addrow) {
            x0 = _mm256_loadu_ps(addrow);
            x1 = _mm256_loadu_ps(addrow + 8);
        } else {
            x0 = x1 = _mm256_setzero_ps();
        }
        _mm256_storeu_ps(r, _mm256_add_ps(x0, c0[i]));
        _mm256_storeu_ps(r + 8, _mm256_add_ps(x1, c1[i]));
    }
}

/* ---- AVX-512: 12 x 32 (24 zmm accumulators), BLIS's skx shape ---- */

#define A5_MR 12
#define A5_NR 32
__attribute__((target("avx512f"))) static void kernel_avx512(int kc, const float *ap, const float *bp,
                                                               float *c, ptrdiff_t ldc,
                                                               const float *addrow, int acc) {
    __m512 c0[A5_MR], c1[A5_MR];
#pragma GCC unroll 12
    for (int i = 0; i < A5_MR; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 12
        for (int i = 0; i < A5_MR; i++) {
            __m512 a = _mm512_set1_ps(ap[i]);
            c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
        ap += A5_MR;
        bp += A5_NR;
    }
#pragma GCC unroll 12
    for (int i = 0; i < A5_MR; i++) {
        float *r = c + i * ldc;
        __m512 x0, x1;
        if (acc) {
            x0 = _mm512_loadu_ps(r);
            x1 = _mm512_loadu_ps(r + 16);
        } else if (addrow) {
            x0 = _mm512_loadu_ps(addrow);
            x1 = _mm512_loadu_ps(addrow + 16);
        } else {
            x0 = x1 = _mm512_setzero_ps();
        }
        _mm512_storeu_ps(r, _mm512_add_ps(x0, c0[i]));
        _mm512_storeu_ps(r + 16, _mm512_add_ps(x1, c1[i]));
    }
}

static const kernel_t kernels[] = {
    {"avx512", A5_MR, A5_NR, kernel_avx512},
    {"avx2", A2_MR, A2_NR, kernel_avx2},
    {"scalar", SC_MR, SC_NR, kernel_scalar},
};
static const kernel_t *kern = &kernels[2];

static int cpu_has(const char *name) {
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 1;
}

int loom_cpu_gemm_select(const char *name, const char **why) {
    if (!name || !*name) {
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
            if (cpu_has(kernels[i].name)) {
                kern = &kernels[i];
                return 0;
            }
        return 0;
    }
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        if (strcmp(name, kernels[i].name) != 0) continue;
        if (!cpu_has(name)) {
            *why = "this CPU does not support it (CPUID)";
            return -1;
        }
        kern = &kernels[i];
        return 0;
    }
    *why = "unknown kernel; use avx512, avx2 or scalar";
    return -1;
}

const char *loom_cpu_gemm_kernel(void) { return kern->name; }

/* Per-thread packing buffers, sized once. */
static float **pack_a, **pack_b;
static int pack_threads;

int loom_cpu_gemm_init(int threads) {
    if (threads <= pack_threads) return 0;
    float **na = realloc(pack_a, (size_t)threads * sizeof *na), **nb;
    if (!na) return -1;
    pack_a = na;
    nb = realloc(pack_b, (size_t)threads * sizeof *nb);
    if (!nb) return -1;
    pack_b = nb;
    for (int t = pack_threads; t < threads; t++) {
        void *pa = NULL, *pb = NULL;
        if (posix_memalign(&pa, 64, (size_t)(MCB + MR_MAX) * KC * sizeof(float)) != 0) return -1;
        if (posix_memalign(&pb, 64, (size_t)(NCB + NR_MAX) * KC * sizeof(float)) != 0) return -1;
        pack_a[t] = pa;
        pack_b[t] = pb;
        pack_threads = t + 1;
    }
    return 0;
}

/* Pack rows [i0, i0+mc) x depth [p0, p0+kc) of A into MR-row micro-panels. */
static void pack_a_block(float *dst, const loom_gemm_t *g, int i0, int mc, int p0, int kc, int MR) {
    for (int ip = 0; ip < mc; ip += MR) {
        int mr = mc - ip < MR ? mc - ip : MR;
        float *d = dst + (size_t)ip * kc;
        const float *src = g->a + (ptrdiff_t)(i0 + ip) * g->rsa + (ptrdiff_t)p0 * g->csa;
        if (g->rsa == 1) { /* k-major source: copy MR-float columns */
            for (int k = 0; k < kc; k++) {
                const float *s = src + (ptrdiff_t)k * g->csa;
                float *o = d + (size_t)k * MR;
                for (int i = 0; i < mr; i++) o[i] = s[i];
                for (int i = mr; i < MR; i++) o[i] = 0.0f;
            }
        } else {
            for (int i = 0; i < mr; i++) {
                const float *s = src + (ptrdiff_t)i * g->rsa;
                if (g->csa == 1)
                    for (int k = 0; k < kc; k++) d[(size_t)k * MR + i] = s[k];
                else
                    for (int k = 0; k < kc; k++) d[(size_t)k * MR + i] = s[(ptrdiff_t)k * g->csa];
            }
            for (int i = mr; i < MR; i++)
                for (int k = 0; k < kc; k++) d[(size_t)k * MR + i] = 0.0f;
        }
    }
}

/* Pack depth [p0, p0+kc) x columns [j0, j0+nc) of B into NR-column micro-panels. */
static void pack_b_block(float *dst, const loom_gemm_t *g, int p0, int kc, int j0, int nc, int NR) {
    for (int jp = 0; jp < nc; jp += NR) {
        int nr = nc - jp < NR ? nc - jp : NR;
        float *d = dst + (size_t)jp * kc;
        const float *src = g->b + (ptrdiff_t)p0 * g->rsb + (ptrdiff_t)(j0 + jp) * g->csb;
        if (g->csb == 1) { /* rows of B contiguous: copy NR-float rows */
            for (int k = 0; k < kc; k++) {
                const float *s = src + (ptrdiff_t)k * g->rsb;
                float *o = d + (size_t)k * NR;
                for (int j = 0; j < nr; j++) o[j] = s[j];
                for (int j = nr; j < NR; j++) o[j] = 0.0f;
            }
        } else {
            for (int j = 0; j < nr; j++) {
                const float *s = src + (ptrdiff_t)j * g->csb;
                if (g->rsb == 1)
                    for (int k = 0; k < kc; k++) d[(size_t)k * NR + j] = s[k];
                else
                    for (int k = 0; k < kc; k++) d[(size_t)k * NR + j] = s[(ptrdiff_t)k * g->rsb];
            }
            for (int j = nr; j < NR; j++)
                for (int k = 0; k < kc; k++) d[(size_t)k * NR + j] = 0.0f;
        }
    }
}

/* GELU over a finished (mr x nr) tile. */
static void gelu_tile(const loom_gemm_t *g, int i, int j, int mr, int nr) {
    for (int r = 0; r < mr; r++) {
        const float *x = g->c + (ptrdiff_t)(i + r) * g->ldc + j;
        float *y = g->gelu + (ptrdiff_t)(i + r) * g->ldc + j;
#pragma omp simd
        for (int q = 0; q < nr; q++) y[q] = loom_gelu(x[q]);
    }
}

/* C[i0:i1, j0:j1] on the calling thread with buffers pa, pb. */
static void gemm_part(const loom_gemm_t *g, int i0, int i1, int j0, int j1, float *pa, float *pb) {
    const int MR = kern->mr, NR = kern->nr;
    float tile[MR_MAX * NR_MAX] __attribute__((aligned(64)));
    if (i0 >= i1 || j0 >= j1) return;
    if (g->K == 0) { /* no product: C = bias (or 0), or unchanged */
        for (int i = i0; i < i1; i++)
            for (int j = j0; j < j1; j++) {
                float *c = g->c + (ptrdiff_t)i * g->ldc + j;
                if (!g->accumulate) *c = g->bias ? g->bias[j] : 0.0f;
                if (g->gelu) g->gelu[(ptrdiff_t)i * g->ldc + j] = loom_gelu(*c);
            }
        return;
    }
    for (int ic = i0; ic < i1; ic += MCB) {
        int mc = i1 - ic < MCB ? i1 - ic : MCB;
        for (int pc = 0; pc < g->K; pc += KC) {
            int kc = g->K - pc < KC ? g->K - pc : KC;
            int first = pc == 0, last = pc + kc == g->K;
            int acc = g->accumulate || !first;
            pack_a_block(pa, g, ic, mc, pc, kc, MR);
            for (int jc = j0; jc < j1; jc += NCB) {
                int nc = j1 - jc < NCB ? j1 - jc : NCB;
                pack_b_block(pb, g, pc, kc, jc, nc, NR);
                for (int ir = 0; ir < mc; ir += MR) {
                    int mr = mc - ir < MR ? mc - ir : MR;
                    const float *ap = pa + (size_t)ir * kc;
                    for (int jr = 0; jr < nc; jr += NR) {
                        int nr = nc - jr < NR ? nc - jr : NR;
                        int i = ic + ir, j = jc + jr;
                        float *c = g->c + (ptrdiff_t)i * g->ldc + j;
                        const float *bias = !acc && g->bias ? g->bias + j : NULL;
                        if (mr == MR && nr == NR) {
                            kern->fn(kc, ap, pb + (size_t)jr * kc, c, g->ldc, bias, acc);
                        } else {
                            kern->fn(kc, ap, pb + (size_t)jr * kc, tile, NR, NULL, 0);
                            for (int r = 0; r < mr; r++)
                                for (int q = 0; q < nr; q++) {
                                    float base = acc ? c[r * g->ldc + q] : (bias ? bias[q] : 0.0f);
                                    c[r * g->ldc + q] = base + tile[r * NR + q];
                                }
                        }
                        if (last && g->gelu) gelu_tile(g, i, j, mr, nr);
                    }
                }
            }
        }
    }
}

void loom_cpu_gemm_serial(const loom_gemm_t *g, int tid) {
    gemm_part(g, 0, g->M, 0, g->N, pack_a[tid], pack_b[tid]);
}

void loom_cpu_gemm(const loom_gemm_t *g) {
    const int MR = kern->mr, NR = kern->nr;
    int mp = (g->M + MR - 1) / MR, np = (g->N + NR - 1) / NR;
    int nt = omp_get_max_threads();
    if (nt > pack_threads) nt = pack_threads;
    if (nt > (mp > np ? mp : np)) nt = mp > np ? mp : np;
    if (nt < 1) nt = 1;
    /* Split the longer side of C into equal runs of whole micro-tiles. */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        if (mp >= np) {
            int a = (int)((long long)mp * t / n) * MR, b = (int)((long long)mp * (t + 1) / n) * MR;
            gemm_part(g, a, b < g->M ? b : g->M, 0, g->N, pack_a[t], pack_b[t]);
        } else {
            int a = (int)((long long)np * t / n) * NR, b = (int)((long long)np * (t + 1) / n) * NR;
            gemm_part(g, 0, g->M, a, b < g->N ? b : g->N, pack_a[t], pack_b[t]);
        }
    }
}
