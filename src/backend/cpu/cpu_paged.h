/* cpu_paged: the CPU implementation of the inference engine's ops over the
 * paged KV cache (contracts and the cache's layout in backend.h). Internal
 * to src/backend/cpu/. */
#ifndef LOOM_CPU_PAGED_H
#define LOOM_CPU_PAGED_H

#include "backend/backend.h"

void loom_cpu_embed_positions(float *out, const int *tokens, const int *pos, const float *wte,
                              const float *wpe, int N, int C);
void loom_cpu_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias,
                                  int N, int C, int OC, int gelu);
/* out (N, OC) = inp (N, C) @ dequant(w)^T + bias (GELU when gelu): w int8
 * (OC, C) with per-row or per-block scales, widened in the kernel; the same
 * bits as loom_cpu_matmul_forward_rows on loom_tensor_dequantize(w). */
void loom_cpu_matmul_forward_rows_i8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                     int N, int C, int OC, int gelu);
/* The same for w of layout LOOM_LAYOUT_SPARSE24 with fp32 kept values
 * (backend.h): the bits of the dense kernel on the decompressed weight.
 * AVX2+FMA where the CPU has it and the GEMM kernel is not forced to
 * "scalar" (LOOM_CPU_KERNEL), else portable C. */
void loom_cpu_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                 int N, int C, int OC, int gelu);
/* 1 when loom_cpu_matmul_forward_s24 runs its AVX2 kernel now. */
int loom_cpu_s24_avx2(void);
void loom_cpu_kv_write(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs);
void loom_cpu_paged_attention(float *out, const float *qkv, const loom_tensor_t *kv, const int *pos,
                              const int *seq, const int *block_tables, int max_blocks, int N, int NH, int NKV,
                              int bs);
void loom_cpu_gather_rows(float *out, const float *inp, const int *rows, int R, int C);
void loom_cpu_kv_copy_block(const loom_tensor_t *kv, int src, int dst, int NH);

#endif
