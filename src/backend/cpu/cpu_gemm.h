/* cpu_gemm: the CPU backend's own single-precision GEMM: packed, cache
 * blocked, with register-tiled micro-kernels for AVX-512 and AVX2 (chosen at
 * run time from CPUID, or by LOOM_CPU_KERNEL=avx512|avx2|scalar) and a
 * portable C kernel. Internal to src/backend/cpu/.
 *
 * Every element of C is summed in the same order whatever the thread count
 * and whatever part of C a thread gets (K is blocked from 0 in fixed steps,
 * each block summed in k order), so results are bitwise reproducible and
 * identical for 1 and N threads. */
#ifndef LOOM_CPU_GEMM_H
#define LOOM_CPU_GEMM_H

#include <stddef.h>

/* C (M,N), row-major with row stride ldc, gets op(A) (M,K) times op(B) (K,N)
 * where A(i,k) = a[i*rsa + k*csa] and B(k,j) = b[k*rsb + j*csb], so any
 * transposition is a choice of strides. */
typedef struct {
    const float *a;
    ptrdiff_t rsa, csa;
    const float *b;
    ptrdiff_t rsb, csb;
    float *c;
    ptrdiff_t ldc;
    int M, N, K;
    int accumulate;    /* 1: C += A B; 0: C = A B (+ bias) */
    const float *bias; /* (N) added to every row when !accumulate; may be NULL */
    float *gelu;       /* if non-NULL: gelu[i*ldc + j] = gelu(C(i,j)) once C is final */
    const float *dgelu; /* if non-NULL: C(i,j) *= gelu'(dgelu[i*ldc + j]) once C is final */
} loom_gemm_t;

/* Select the micro-kernel: "avx512", "avx2", "scalar" or NULL for the best
 * the CPU supports. Returns 0, or -1 (with *why set) when the CPU or the
 * build cannot run the named kernel. Call before any gemm. */
int loom_cpu_gemm_select(const char *name, const char **why);
/* Name of the selected kernel. */
const char *loom_cpu_gemm_kernel(void);
/* Size the per-thread packing buffers for `threads` threads. 0 or -1 (out
 * of memory). */
int loom_cpu_gemm_init(int threads);
/* Threads that have packing buffers (loom_cpu_gemm_serial's tid must be
 * below this). */
int loom_cpu_gemm_threads(void);
/* Run on the calling OpenMP team's threads: opens its own parallel region,
 * so call it from serial code. */
void loom_cpu_gemm(const loom_gemm_t *g);
/* Run on the calling thread only (inside a parallel region), with thread
 * `tid`'s packing buffers. */
void loom_cpu_gemm_serial(const loom_gemm_t *g, int tid);

#endif
