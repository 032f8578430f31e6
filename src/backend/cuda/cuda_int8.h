/* cuda_int8: the CUDA side of compressed inference (issue 16): the int8
 * weight variants of ops.h (matmul_forward_w8, matmul_forward_w8a8) and
 * the int8 paged KV cache, on the same contracts as the CPU's
 * (src/backend/cpu/cpu_int8.c), which tests/test_cuda_ops.c checks them
 * against. Compiled, not yet run on a GPU. C++ only, internal to
 * src/backend/cuda/. */
#ifndef LOOM_CUDA_INT8_H
#define LOOM_CUDA_INT8_H

#include "cuda_internal.h"

/* out (N,OC) = inp (N,C) @ dequant(w (OC,C) int8)^T + bias, then GELU when
 * gelu != 0 (W8A16/W8A32): the int8 weights are widened and scaled in the
 * kernel (per row, or per block of w->block), fp32 sums. */
void cuda_matmul_forward_w8(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C,
                            int OC, int gelu);
/* W8A8: each row of inp quantized to int8 (one scale per token, as the
 * CPU), int8 x int8 -> int32 on cuBLASLt IMMA (own kernel where cuBLASLt
 * cannot take the shape), then out = dot * sx[n] * sw[o] + bias (+ GELU).
 * A weight with per-block scales: each block's exact int32 sum times its
 * scale, summed in block order, times sx[n], + bias (own kernel), as the
 * CPU. */
void cuda_matmul_forward_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N,
                              int C, int OC, int gelu);

/* The paged-cache ops (backend.h) on an int8 cache (kv->dtype LOOM_INT8,
 * one scale per row: block, K or V, head), bit for bit the CPU's rules:
 * a row's scale is set by its token at offset 0 and raised (earlier tokens
 * requantized) when a later token is larger; rows written in batch order.
 * cuda_paged.cu calls these for kv->dtype == LOOM_INT8 (and reads the
 * cache in its attention kernel, templated on the element type). */
void cuda_kv_write_int8(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs);
void cuda_kv_copy_block_int8(const loom_tensor_t *kv, int src, int dst, int NH);

#endif
