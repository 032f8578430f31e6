/* cpu_sparse24: the CPU's 2:4-sparse weight variant (ops.h VARIANT row
 * matmul_forward_s24). Internal to src/backend/cpu/. */
#ifndef LOOM_CPU_SPARSE24_H
#define LOOM_CPU_SPARSE24_H

#include "backend/backend.h"

/* out (N,OC) = inp (N,C) @ dequant(w (OC,C))^T + bias (may be NULL), then
 * GELU when gelu != 0, for w of layout LOOM_LAYOUT_SPARSE24 with fp32 kept
 * values (backend.h). AVX2+FMA where the CPU has it and the GEMM kernel is
 * not forced to "scalar" (LOOM_CPU_KERNEL), else portable C. */
void loom_cpu_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                 int N, int C, int OC, int gelu);
/* 1 when loom_cpu_matmul_forward_s24 runs its AVX2 kernel now. */
int loom_cpu_s24_avx2(void);

#endif
