/* cpu_kquant_gemm: the prefill (many input rows) matrix product on
 * llama.cpp's block formats as stored (q4_0, q4_1, q5_0, q5_1, q4_K, q5_K,
 * q6_K; backend/qblock.h). cpu_kquant.c's loom_cpu_matmul_forward_kq hands
 * it every call of at least loom_cpu_kq_gemm_rows() input rows; fewer rows
 * stay on that file's block-dot kernel (decode).
 *
 * Each thread takes a panel of output rows, dequantizes a slice of its
 * weight blocks into a transient fp32 panel (exactly the values of
 * gguf.quants.dequantize: the same float operations in the same order),
 * and runs loom's fp32 GEMM (cpu_gemm.c) on it with the fp32 activations
 * read in place: exact weights, unrounded activations, fp32 sums. The
 * panel lives in L2 and is gone after the call: no copy of the weights
 * outlives it. On CPUs with AVX-512 VNNI or AVX2 every block format (and
 * int8 in blocks of 32, a Q8_0 file) instead takes an int8 tile
 * (llama.cpp's arithmetic: activations rounded to int8 per 256 or 32
 * values, exact integer products with the unpacked weights: vpdpbusd, or
 * vpmaddubsw + vpmaddwd).
 * docs/quantization.md "Prefill" has the measurements behind the choice. */
#ifndef LOOM_CPU_KQUANT_GEMM_H
#define LOOM_CPU_KQUANT_GEMM_H

#include "backend/backend.h"

/* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias, then GELU when gelu != 0,
 * when N >= loom_cpu_kq_gemm_rows(w->dtype): 1 once done. 0 (nothing written)
 * when N is below it, when called inside an OpenMP parallel region, or
 * when the GEMM's buffers cannot be had: the caller then runs its own
 * kernel. Call it from one thread at a time (as cpu_gemm.c). */
int loom_cpu_kq_gemm(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC,
                     int gelu);
/* The same whatever N: 1, or 0 when out of memory. For the tests and the
 * kernel benchmark. */
int loom_cpu_kq_gemm_run(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC,
                         int gelu);
/* The input rows from which loom_cpu_kq_gemm runs on format d (the
 * environment's LOOM_KQ_GEMM_ROWS when set, for measuring the threshold). */
int loom_cpu_kq_gemm_rows(loom_dtype d);
/* The instruction set: "avx512vnni" or "avx2int8" (the int8 tiles),
 * "avx512", "avx2" or "portable" (the fp32 panel's dequantization); the
 * best this CPU has, from cpuid. The fp32 GEMM's micro-kernel is
 * cpu_gemm.c's choice. */
const char *loom_cpu_kq_gemm_isa(void);
/* Use instruction set `name` from now on: 1, or 0 when this CPU lacks
 * it (nothing changes); NULL: back to the best. For tests. */
int loom_cpu_kq_gemm_use(const char *name);
/* Tests: the depth of a dequantized slice (values, a multiple of 256; 0
 * back to the default), so that small shapes cross slice edges. */
void loom_cpu_kq_gemm_slice(int values);

#endif
