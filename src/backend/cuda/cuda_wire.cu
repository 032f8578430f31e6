/* cuda_wire: the conversions of cuda_wire.h, on cuda_kernels.cu's fp32 <->
 * 16-bit copy kernels launched on the caller's stream: the NCCL
 * transport's, on the communication thread, so each conversion is ordered
 * with the reduction it feeds while the compute stream runs on with the
 * backward (the overlapped reduction). Compiled here, not yet run on a
 * GPU. */
#include "cuda_internal.h"
#include "cuda_wire.h"

static cudaStream_t stream_or_backend(void *stream) { return stream ? (cudaStream_t)stream : g_cuda.stream; }

/* Launch errors come back to the caller (the transport turns them into a
 * rank's error), not through LAUNCH_CHECK's panic. */
int loom_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream) {
    cuda_to_lp16_on(stream_or_backend(stream), dst, src, n, true);
    return (int)cudaGetLastError();
}

int loom_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream) {
    cuda_from_lp16_on(stream_or_backend(stream), dst, src, n, true);
    return (int)cudaGetLastError();
}
