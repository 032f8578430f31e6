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
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_isa.h"

#define KC 384     /* depth of a packed slice */
#define NCB 480    /* columns of B packed at once (KC x NCB floats ~ 720 KB, in L2) */
#define MCB 480    /* rows of A packed at once: with KC x NCB of B and MCB x NCB of C, about L2 */
#define MR_MAX 16
#define NR_MAX 32

/* One micro-kernel: tile (MR x NR) of C from kc steps of A and of packed B
 * (one NR-float row per k). A is either packed (lda == 0: one MR-float
 * column per k) or read in place from MR rows lda floats apart, each
 * contiguous in k (row-major A needs no packing). When `acc` is 0 the tile
 * is overwritten with the product (plus addrow[j] when addrow is non-NULL);
 * when 1 the product is added. */
typedef void (*kernel_fn)(int kc, const float *a, ptrdiff_t lda, const float *bp, float *c,
                          ptrdiff_t ldc, const float *addrow, int acc);

typedef struct {
    const char *name;
    int mr, nr;
    kernel_fn fn;
} kernel_t;

/* ---- portable C kernel (the compiler vectorizes it for the build's target) ---- */

#define SC_MR 4
#define SC_NR 16
static void kernel_scalar(int kc, const float *a, ptrdiff_t lda, const float *bp, float *c,
                          ptrdiff_t ldc, const float *addrow, int acc) {
    float t[SC_MR][SC_NR];
    memset(t, 0, sizeof t);
    for (int k = 0; k < kc; k++) {
        for (int i = 0; i < SC_MR; i++) {
            float x = lda ? a[i * lda + k] : a[k * SC_MR + i];
            for (int j = 0; j < SC_NR; j++) t[i][j] = fmaf(x, bp[k * SC_NR + j], t[i][j]);
        }
    }
    for (int i = 0; i < SC_MR; i++)
        for (int j = 0; j < SC_NR; j++) {
            float base = acc ? c[i * ldc + j] : (addrow ? addrow[j] : 0.0f);
            c[i * ldc + j] = base + t[i][j];
        }
}

/* The body shared by both A layouts: VEC/LOAD/BCAST/FMA/ADD/STORE/ZERO are
 * the ISA's intrinsics, NV the vectors per row of the tile. */
#define KERNEL_LOOP(MR, NV, W, VEC, LOAD, BCAST, FMA, AOF)                        \
    for (int k = 0; k < kc; k++) {                                                \
        VEC b[NV];                                                                \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) b[v] = LOAD(bp + v * W); \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                  \
            VEC x = BCAST(AOF);                                                   \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc_[i][v] = FMA(x, b[v], acc_[i][v]); \
        }                                                                         \
        ap += MR;                                                                 \
        bp += NV * W;                                                             \
    }

#define KERNEL_STORE(MR, NV, W, VEC, LOAD, ADD, STORE, ZERO)                      \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                      \
        float *r = c + i * ldc;                                                   \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                   \
            VEC base = acc ? LOAD(r + v * W) : (addrow ? LOAD(addrow + v * W) : ZERO()); \
            STORE(r + v * W, ADD(base, acc_[i][v]));                              \
        }                                                                         \
    }

#define DEFINE_KERNEL(NAME, TARGET, MR, NV, W, VEC, LOAD, BCAST, FMA, ADD, STORE, ZERO) \
    __attribute__((target(TARGET))) static void NAME(int kc, const float *a, ptrdiff_t lda, \
                                                     const float *bp, float *c, ptrdiff_t ldc, \
                                                     const float *addrow, int acc) {   \
        VEC acc_[MR][NV];                                                         \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc_[i][v] = ZERO(); \
        const float *ap = a;                                                      \
        if (acc) /* the tile's rows arrive while the k loop runs */              \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v += 64 / (4 * W) ? 64 / (4 * W) : 1) \
                    _mm_prefetch((const char *)(c + i * ldc + v * W), _MM_HINT_T0); \
        if (lda == 0) {                                                           \
            KERNEL_LOOP(MR, NV, W, VEC, LOAD, BCAST, FMA, &ap[i])                 \
        } else {                                                                  \
            const float *ar = a;                                                  \
            KERNEL_LOOP(MR, NV, W, VEC, LOAD, BCAST, FMA, &ar[i * lda + k])       \
        }                                                                         \
        KERNEL_STORE(MR, NV, W, VEC, LOAD, ADD, STORE, ZERO)                      \
    }

/* AVX2 + FMA: 6 x 16 (12 ymm accumulators). */
#define A2_MR 6
#define A2_NR 16
DEFINE_KERNEL(kernel_avx2, "avx2,fma", A2_MR, 2, 8, __m256, _mm256_loadu_ps, _mm256_broadcast_ss,
              _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, _mm256_setzero_ps)

/* AVX-512: 12 x 32 (24 zmm accumulators), BLIS's skx shape. */
#define A5_MR 12
#define A5_NR 32
static inline __attribute__((target("avx512f"))) __m512 bcast512(const float *p) { return _mm512_set1_ps(*p); }
DEFINE_KERNEL(kernel_avx512, "avx512f", A5_MR, 2, 16, __m512, _mm512_loadu_ps, bcast512,
              _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, _mm512_setzero_ps)

static const kernel_t kernels[] = {
    {"avx512", A5_MR, A5_NR, kernel_avx512},
    {"avx2", A2_MR, A2_NR, kernel_avx2},
    {"scalar", SC_MR, SC_NR, kernel_scalar},
};
static const kernel_t *kern = &kernels[2];

static int cpu_has(const char *name) {
    if (strcmp(name, "avx512") == 0) return loom_cpu_has(LOOM_ISA_AVX512);
    if (strcmp(name, "avx2") == 0) return loom_cpu_has(LOOM_ISA_AVX2);
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

/* Packing buffers, sized once: per thread for A and for B, plus one B
 * block that all threads fill together when they share it. */
static float **pack_a, **pack_b, *pack_b_shared[2];
static int pack_threads;

static float *buf_new(size_t floats) {
    void *p = NULL;
    return posix_memalign(&p, 64, floats * sizeof(float)) == 0 ? p : NULL;
}

int loom_cpu_gemm_threads(void) { return pack_threads; }

int loom_cpu_gemm_init(int threads) {
    if (threads <= pack_threads) return 0;
    float **na = realloc(pack_a, (size_t)threads * sizeof *na), **nb;
    if (!na) return -1;
    pack_a = na;
    nb = realloc(pack_b, (size_t)threads * sizeof *nb);
    if (!nb) return -1;
    pack_b = nb;
    for (int i = 0; i < 2; i++)
        if (!pack_b_shared[i] && !(pack_b_shared[i] = buf_new((size_t)(NCB + NR_MAX) * KC))) return -1;
    for (int t = pack_threads; t < threads; t++) {
        if (!(pack_a[t] = buf_new((size_t)(MCB + MR_MAX) * KC))) return -1;
        if (!(pack_b[t] = buf_new((size_t)(NCB + NR_MAX) * KC))) return -1;
        pack_threads = t + 1;
    }
    return 0;
}

/* o[0..n) = s[0..n), o[n..width) = 0: one micro-panel row of a packed block. */
static inline void copy_padded(float *o, const float *s, int n, int width) {
    if (n == width) {
        memcpy(o, s, (size_t)width * sizeof(float));
        return;
    }
    for (int i = 0; i < n; i++) o[i] = s[i];
    for (int i = n; i < width; i++) o[i] = 0.0f;
}

/* Pack rows [i0, i0+mc) x depth [p0, p0+kc) of A into MR-row micro-panels
 * (one MR-float column per k). */
static void pack_a_block(float *dst, const loom_gemm_t *g, int i0, int mc, int p0, int kc, int MR) {
    if (g->rsa == 1) {
        /* k-major source (A^T row-major): copy MR-float columns, 8 source
         * rows at a time across all panels, so that reads run along rows
         * and writes stay in a few lines per panel. */
        for (int k0 = 0; k0 < kc; k0 += 8) {
            int k1 = k0 + 8 < kc ? k0 + 8 : kc;
            for (int ip = 0; ip < mc; ip += MR) {
                int mr = mc - ip < MR ? mc - ip : MR;
                float *d = dst + (size_t)ip * kc;
                const float *src = g->a + (ptrdiff_t)(i0 + ip) + (ptrdiff_t)p0 * g->csa;
                for (int k = k0; k < k1; k++) {
                    const float *s = src + (ptrdiff_t)k * g->csa;
                    float *o = d + (size_t)k * MR;
                    copy_padded(o, s, mr, MR);
                }
            }
        }
        return;
    }
    for (int ip = 0; ip < mc; ip += MR) {
        int mr = mc - ip < MR ? mc - ip : MR;
        float *d = dst + (size_t)ip * kc;
        const float *src = g->a + (ptrdiff_t)(i0 + ip) * g->rsa + (ptrdiff_t)p0 * g->csa;
        for (int i = 0; i < mr; i++) {
            const float *s = src + (ptrdiff_t)i * g->rsa;
            for (int k = 0; k < kc; k++) d[(size_t)k * MR + i] = s[(ptrdiff_t)k * g->csa];
        }
        for (int i = mr; i < MR; i++)
            for (int k = 0; k < kc; k++) d[(size_t)k * MR + i] = 0.0f;
    }
}

/* 16 x 16 transpose: out row kk (16 floats, at o + kk*ld) = column kk of the
 * 16 rows at s + j*lds. */
__attribute__((target("avx512f"))) static void transpose16(float *o, ptrdiff_t ld, const float *s,
                                                             ptrdiff_t lds) {
    __m512 r[16], t[16];
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(s + j * lds);
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) {
        r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
        r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
    }
    /* r[4q + m] holds, in each 128-bit lane L, rows 4L'.. of column 4L + m
     * for row group q; gather the lanes. */
    for (int m = 0; m < 4; m++) {
        __m512 a0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);      /* lanes 0,2 of r[m]; 0,2 of r[4+m] */
        __m512 a1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);      /* lanes 1,3 */
        __m512 b0 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        __m512 b1 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
        t[m] = _mm512_shuffle_f32x4(a0, b0, 0x88);      /* lane 0 of each: column m */
        t[8 + m] = _mm512_shuffle_f32x4(a0, b0, 0xDD);  /* lane 2: column 8+m */
        t[4 + m] = _mm512_shuffle_f32x4(a1, b1, 0x88);  /* lane 1: column 4+m */
        t[12 + m] = _mm512_shuffle_f32x4(a1, b1, 0xDD); /* lane 3: column 12+m */
    }
    for (int kk = 0; kk < 16; kk++) _mm512_storeu_ps(o + kk * ld, t[kk]);
}

/* Pack micro-panels [q0, q1) of depth [p0, p0+kc) x columns [j0, j0+nc) of
 * B (one NR-float row per k, zero-padded). */
static void pack_b_panels(float *dst, const loom_gemm_t *g, int p0, int kc, int j0, int nc, int NR,
                          int q0, int q1) {
    for (int q = q0; q < q1; q++) {
        int jp = q * NR, nr = nc - jp < NR ? nc - jp : NR;
        float *d = dst + (size_t)jp * kc;
        const float *src = g->b + (ptrdiff_t)p0 * g->rsb + (ptrdiff_t)(j0 + jp) * g->csb;
        if (g->csb == 1) { /* rows of B contiguous: copy NR-float rows */
            for (int k = 0; k < kc; k++) {
                const float *s = src + (ptrdiff_t)k * g->rsb;
                float *o = d + (size_t)k * NR;
                copy_padded(o, s, nr, NR);
            }
            continue;
        }
        int k = 0;
        if (g->rsb == 1 && nr == NR && NR % 16 == 0 && kern->fn == kernel_avx512)
            for (; k + 16 <= kc; k += 16)
                for (int j = 0; j < NR; j += 16) transpose16(d + (size_t)k * NR + j, NR, src + k + j * g->csb, g->csb);
        for (int j = 0; j < nr; j++) {
            const float *s = src + (ptrdiff_t)j * g->csb;
            for (int kk = k; kk < kc; kk++) d[(size_t)kk * NR + j] = s[(ptrdiff_t)kk * g->rsb];
        }
        for (int j = nr; j < NR; j++)
            for (int kk = k; kk < kc; kk++) d[(size_t)kk * NR + j] = 0.0f;
    }
}

/* The epilogues on a finished (mr x nr) tile: GELU into g->gelu, or the
 * GELU derivative at g->dgelu multiplied in. */
static void epilogue_tile(const loom_gemm_t *g, int i, int j, int mr, int nr) {
    for (int r = 0; r < mr; r++) {
        ptrdiff_t off = (ptrdiff_t)(i + r) * g->ldc + j;
        float *x = g->c + off;
        if (g->gelu) {
            float *y = g->gelu + off;
#pragma omp simd
            for (int q = 0; q < nr; q++) y[q] = loom_gelu(x[q]);
        }
        if (g->dgelu) {
            const float *pre = g->dgelu + off;
#pragma omp simd
            for (int q = 0; q < nr; q++) x[q] *= loom_gelu_grad(pre[q]);
        }
    }
}

/* Rows [i0, i1) x columns [jc, jc+nc) of C, depth [pc, pc+kc), from the
 * packed B block pb and A either packed in pa (rows from i0) or, when pa is
 * NULL, read in place (csa == 1). `edge` holds one packed A panel. */
static void compute_block(const loom_gemm_t *g, int i0, int i1, int jc, int nc, int pc, int kc,
                          const float *pa, const float *pb, float *edge) {
    const int MR = kern->mr, NR = kern->nr;
    float tile[MR_MAX * NR_MAX] __attribute__((aligned(64)));
    int acc = g->accumulate || pc > 0, last = pc + kc == g->K;
    for (int i = i0; i < i1; i += MR) {
        int mr = i1 - i < MR ? i1 - i : MR;
        const float *a;
        ptrdiff_t lda = 0;
        if (pa) {
            a = pa + (size_t)(i - i0) * kc;
        } else if (mr == MR) {
            a = g->a + (ptrdiff_t)i * g->rsa + pc;
            lda = g->rsa;
        } else {
            pack_a_block(edge, g, i, mr, pc, kc, MR);
            a = edge;
        }
        for (int jr = 0; jr < nc; jr += NR) {
            int nr = nc - jr < NR ? nc - jr : NR, j = jc + jr;
            float *c = g->c + (ptrdiff_t)i * g->ldc + j;
            const float *bias = !acc && g->bias ? g->bias + j : NULL;
            const float *bp = pb + (size_t)jr * kc;
            if (mr == MR && nr == NR) {
                kern->fn(kc, a, lda, bp, c, g->ldc, bias, acc);
            } else {
                kern->fn(kc, a, lda, bp, tile, NR, NULL, 0);
                for (int r = 0; r < mr; r++)
                    for (int q = 0; q < nr; q++) {
                        float base = acc ? c[r * g->ldc + q] : (bias ? bias[q] : 0.0f);
                        c[r * g->ldc + q] = base + tile[r * NR + q];
                    }
            }
            if (last && (g->gelu || g->dgelu)) epilogue_tile(g, i, j, mr, nr);
        }
    }
}

/* C with K == 0: C = bias (or 0), or unchanged; then the GELU. */
static void gemm_k0(const loom_gemm_t *g) {
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) {
            float *c = g->c + (ptrdiff_t)i * g->ldc + j;
            if (!g->accumulate) *c = g->bias ? g->bias[j] : 0.0f;
            if (g->gelu) g->gelu[(ptrdiff_t)i * g->ldc + j] = loom_gelu(*c);
            if (g->dgelu) *c *= loom_gelu_grad(g->dgelu[(ptrdiff_t)i * g->ldc + j]);
        }
}

/* C[i0:i1, j0:j1] on the calling thread with its own buffers. */
static void gemm_part(const loom_gemm_t *g, int i0, int i1, int j0, int j1, int tid) {
    const int MR = kern->mr, NR = kern->nr;
    float *pa = pack_a[tid], *pb = pack_b[tid];
    int direct = g->csa == 1;
    if (i0 >= i1 || j0 >= j1) return;
    for (int ic = i0; ic < i1; ic += MCB) {
        int mc = i1 - ic < MCB ? i1 - ic : MCB;
        for (int pc = 0; pc < g->K; pc += KC) {
            int kc = g->K - pc < KC ? g->K - pc : KC;
            if (!direct) pack_a_block(pa, g, ic, mc, pc, kc, MR);
            for (int jc = j0; jc < j1; jc += NCB) {
                int nc = j1 - jc < NCB ? j1 - jc : NCB;
                pack_b_panels(pb, g, pc, kc, jc, nc, NR, 0, (nc + NR - 1) / NR);
                compute_block(g, ic, ic + mc, jc, nc, pc, kc, direct ? NULL : pa, pb, pa);
            }
        }
    }
}

void loom_cpu_gemm_serial(const loom_gemm_t *g, int tid) {
    if (g->K == 0) {
        gemm_k0(g);
        return;
    }
    gemm_part(g, 0, g->M, 0, g->N, tid);
}

/* A barrier for the GEMM's team that spins briefly, then yields the core:
 * on a machine shared with other work, a waiting thread that only spins
 * keeps the core from the thread it waits for (OpenBLAS yields the same
 * way). Sense-reversing; one GEMM runs at a time. */
static atomic_int bar_count, bar_sense;
static void team_barrier(int n, int *sense) {
    int s = !*sense;
    *sense = s;
    if (atomic_fetch_add(&bar_count, 1) == n - 1) {
        atomic_store(&bar_count, 0);
        atomic_store(&bar_sense, s);
        return;
    }
    for (int spins = 0; atomic_load(&bar_sense) != s; spins++) {
        if (spins < 2000) _mm_pause();
        else sched_yield();
    }
}

void loom_cpu_gemm(const loom_gemm_t *g) {
    const int MR = kern->mr, NR = kern->nr;
    if (g->K == 0 || g->M == 0 || g->N == 0) {
        gemm_k0(g);
        return;
    }
    int mp = (g->M + MR - 1) / MR, np = (g->N + NR - 1) / NR;
    int nt = omp_get_max_threads();
    if (nt > pack_threads) nt = pack_threads;
    if (nt > (mp > np ? mp : np)) nt = mp > np ? mp : np;
    if (nt < 1) nt = 1;
    if (g->csa == 1 && mp >= nt) {
        /* Row-major A read in place; the threads split the rows and pack
         * each B block together (each packs a share of its panels), into
         * two buffers in turn so that one barrier per block suffices: a
         * thread packing block s+1 has passed barrier s, so every thread
         * has finished block s-1, the last user of that buffer. */
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads(), step = 0;
            int sense = atomic_load(&bar_sense);
            int i0 = (int)((long long)mp * t / n) * MR, i1 = (int)((long long)mp * (t + 1) / n) * MR;
            if (i1 > g->M) i1 = g->M;
            for (int jc = 0; jc < g->N; jc += NCB) {
                int nc = g->N - jc < NCB ? g->N - jc : NCB, panels = (nc + NR - 1) / NR;
                for (int pc = 0; pc < g->K; pc += KC, step++) {
                    int kc = g->K - pc < KC ? g->K - pc : KC;
                    float *pb = pack_b_shared[step & 1];
                    pack_b_panels(pb, g, pc, kc, jc, nc, NR, panels * t / n, panels * (t + 1) / n);
                    team_barrier(n, &sense);
                    compute_block(g, i0, i1, jc, nc, pc, kc, NULL, pb, pack_a[t]);
                }
            }
        }
        return;
    }
    /* Otherwise split the longer side of C into equal runs of whole micro-tiles. */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        if (mp >= np) {
            int a = (int)((long long)mp * t / n) * MR, b = (int)((long long)mp * (t + 1) / n) * MR;
            gemm_part(g, a, b < g->M ? b : g->M, 0, g->N, t);
        } else {
            int a = (int)((long long)np * t / n) * NR, b = (int)((long long)np * (t + 1) / n) * NR;
            gemm_part(g, 0, g->M, a, b < g->N ? b : g->N, t);
        }
    }
}
