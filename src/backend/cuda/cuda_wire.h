/* cuda_wire: fp32 <-> bf16 conversions on a stream of the caller's, for
 * the NCCL transport's bf16 reduction of fp32 gradients (--grad-dtype
 * bf16, parallel/dist_nccl.c). C-callable: the transport is C, compiled
 * into the CUDA plugin beside the kernels.
 *
 * n elements; to bf16 rounds to nearest even (dist_f32_to_bf16 on the
 * host does the same), to fp32 widens exactly. stream: a cudaStream_t
 * (NULL: the backend's own stream). Returns the launch's cudaError_t as
 * an int, 0 when it was launched. */
#ifndef LOOM_CUDA_WIRE_H
#define LOOM_CUDA_WIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int loom_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream);
int loom_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
