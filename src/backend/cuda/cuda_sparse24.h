/* cuda_sparse24: 2:4-sparse weights on the GPU (ops.h VARIANT row
 * matmul_forward_s24): cuSPARSELt where it can run, else the dense way
 * (cuda_sparse24.cu says which and why). Compiled, not yet run on a GPU.
 * C++ only, internal to src/backend/cuda/. */
#ifndef LOOM_CUDA_SPARSE24_H
#define LOOM_CUDA_SPARSE24_H

#include <stddef.h>

#include "cuda_internal.h"

/* out (N,OC) = inp (N,C) @ dequant(w)^T + bias (may be NULL), then GELU
 * when gelu != 0; w (OC,C) of layout LOOM_LAYOUT_SPARSE24 in device memory. */
void cuda_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C,
                             int OC, int gelu);
/* Device memory [p, p + bytes) is being freed: drop every 2:4 weight
 * prepared from inside it (cuda_backend.cu's free calls this). */
void cuda_sparse24_forget(const void *p, size_t bytes);

/* cuda_sparselt.cpp: one weight on cuSPARSELt's sparse tensor cores. */
typedef struct cuda_sparselt_w cuda_sparselt_w;
/* Prepares dense_host (OC,C) fp32, 2:4 along C, for cuSPARSELt at the
 * run's dtype (bf16 or fp16): compressed once on the device. NULL, with
 * the reason in `why`, when it cannot (no cuSPARSELt in this build or on
 * this machine, an fp32/tf32 run, a shape or GPU it refuses). */
cuda_sparselt_w *cuda_sparselt_weight(const float *dense_host, int OC, int C, char *why, size_t why_size);
/* out (N,OC) = inp (N,C) @ w^T + bias, then GELU when gelu != 0; out and inp
 * are ACT tensors (g_cuda.act: fp32, or the run's 16-bit dtype). */
void cuda_sparselt_matmul(cuda_sparselt_w *w, float *out, const float *inp, const float *bias, int N, int C, int OC,
                          int gelu);
/* Frees what cuda_sparselt_weight made (NULL: nothing). */
void cuda_sparselt_free(cuda_sparselt_w *w);

#endif
