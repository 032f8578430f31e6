/* cuda_paged: the CUDA implementation of the inference engine's ops over
 * the paged KV cache (contracts and the cache's layout in backend.h).
 * Compiled, not yet run on a GPU. C++ only, internal to src/backend/cuda/. */
#ifndef LOOM_CUDA_PAGED_H
#define LOOM_CUDA_PAGED_H

#include "cuda_internal.h"

void cuda_embed_positions(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                          int N, int C);
void cuda_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                              int OC, int gelu);
void cuda_kv_write(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs);
void cuda_paged_attention(float *out, const float *qkv, const loom_tensor_t *kv, const int *pos, const int *seq,
                          const int *block_tables, int max_blocks, int N, int NH, int NKV, int bs);
void cuda_gather_rows(float *out, const float *inp, const int *rows, int R, int C);
void cuda_kv_copy_block(const loom_tensor_t *kv, int src, int dst, int NH);

#endif
