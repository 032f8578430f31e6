/* cpu_kquant: the CPU's matrix product on block-quantized weights as a
 * GGUF stores them (ops.h VARIANT row matmul_forward_kq; formats in
 * backend/qblock.h): q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K. */
#ifndef LOOM_CPU_KQUANT_H
#define LOOM_CPU_KQUANT_H

#include <math.h>

#include "backend/backend.h"

/* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias, then GELU when gelu != 0,
 * with w a block format. Each input row is quantized per weight block
 * (32 or 256 values, as llama.cpp's Q8_0 / Q8_K): xd = max |x| / 127,
 * xq = round(x / xd) in int8, and the sums of xq per 16 values; then per
 * block b the exact integers I = sum_g sc_g * sum_{i in g} u_i * xq_i and
 * M = sum_g mn_g * sum_{i in g} xq_i (qblock.h's form), and the float
 * work of loom_cpu_kq_accum / loom_cpu_kq_total below. The integers are
 * exact on every instruction set and the float work is the same
 * operations in the same order, so every path (portable, AVX2, AVX-512,
 * AVX-512 VNNI) gives the same bits, for any N it is given and any number
 * of threads (a many-rows GEMM that takes large N away from this kernel
 * is its own matter). */
void loom_cpu_matmul_forward_kq(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu);
/* Quantize x (C values, a multiple of blk = 32 or 256) per block of blk:
 * xd[C / blk], xq[C], xs[C / 16] (the sums of xq per 16). Exposed for the
 * tests' error bound and for the many-rows path. */
void loom_cpu_kq_quantize_act(const float *x, int C, int blk, float *xd, int8_t *xq, int16_t *xs);
/* The instruction set in use: "avx512vnni", "avx512", "avx2" or
 * "portable" (the best this CPU has, from cpuid). */
const char *loom_cpu_kq_isa(void);
/* Use instruction set `name` from now on: 1, or 0 when this CPU lacks it
 * (nothing changes); NULL: back to the best. For tests and benchmarks. */
int loom_cpu_kq_use(const char *name);

/* The float work of one output after its block b's integers, shared by
 * every path (and by any other kernel that must give the same bits): the
 * row's 8 partial sums start at +0, block b goes into part[b % 8] with
 * two fused multiply-adds (written out, so no compiler contracts them
 * differently on different paths), and loom_cpu_kq_total adds the 8 in a
 * fixed tree. 8 partial sums let a vector kernel update 8 blocks at once
 * and keep the dependency chain short. */
static inline void loom_cpu_kq_accum(float *part, int b, float xd, float d, float dmin, int32_t isum, int32_t msum) {
    part[b & 7] = fmaf(xd, fmaf(d, (float)isum, -(dmin * (float)msum)), part[b & 7]);
}
static inline float loom_cpu_kq_total(const float *part) {
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

#endif
