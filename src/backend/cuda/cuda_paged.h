/* cuda_paged: the CUDA implementation of the inference engine's ops over
 * the paged KV cache (contracts in backend.h, layout in backend/paged.h).
 * Compiled, not yet run on a GPU. C++ only, internal to src/backend/cuda/. */
#ifndef LOOM_CUDA_PAGED_H
#define LOOM_CUDA_PAGED_H

extern "C" {
#include "backend/paged.h"
}

void cuda_embed_positions(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                          int N, int C);
void cuda_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                              int OC, int gelu);
void cuda_kv_write(const loom_kv_layer_t *kv, const float *qkv, const int *slot, int N);
void cuda_paged_attention(float *out, const float *qkv, const loom_kv_layer_t *kv, const int *pos,
                          const int *seq, const int *block_tables, int max_blocks, int max_pos, int N);
void cuda_gather_rows(float *out, const float *inp, const int *rows, int R, int C);
void cuda_kv_copy_block(const loom_kv_layer_t *kv, int src, int dst);

#endif
