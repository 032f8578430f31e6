/* cuda_internal: what the CUDA backend's .cu files share with each other.
 * C++ only; C code sees the backend through backend.h, cuda_devices.h and
 * cuda_peak.h. Everything runs on one stream per process (g_cuda.stream), so
 * that a whole training step can be captured into a CUDA graph.
 *
 * The few device helpers below have bodies here because nvcc inlines
 * __device__ functions only within a translation unit (no -rdc); a host-only
 * .cpp file of the plugin (compiled by the C++ compiler) does not see them. */
#ifndef LOOM_CUDA_INTERNAL_H
#define LOOM_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
}

/* A failed CUDA call inside an op is a device fault or a bug (ops return
 * void), so it stops the process with the call's text, file:line and the
 * library's message; except while a CUDA graph is being captured, where the
 * first failure is kept and graph_end reports it (the trainer then runs the
 * step with plain launches). */
void cuda_check_failed(const char *file, int line, const char *call, const char *msg);
/* One check for both libraries: `ok` is the success value of the call's
 * status type, `str` turns a failure into the library's message. */
#define LOOM_LIB_CHECK_(call, type, ok, str)                                                 \
    do {                                                                                     \
        type lib_s_ = (call);                                                                \
        if (lib_s_ != (ok)) cuda_check_failed(__FILE__, __LINE__, #call, str(lib_s_));      \
    } while (0)
#define CUDA_CHECK(call) LOOM_LIB_CHECK_(call, cudaError_t, cudaSuccess, cudaGetErrorString)
#define CUBLAS_CHECK(call) LOOM_LIB_CHECK_(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
/* After every kernel launch: catches bad launch configurations at once. */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Per-process state of the backend (one device per process). */
struct loom_cuda_state {
    int ready;            /* init has run */
    int device;           /* CUDA device index */
    loom_dtype dtype;     /* precision of the matrix work */
    loom_dtype act;       /* element type of ACT tensors: dtype at bf16/fp16 (unless
                           * LOOM_CUDA_ACTIVATIONS=fp32), else fp32 */
    int num_sms;          /* streaming multiprocessors, for grid sizes */
    int attention_unfused;/* LOOM_CUDA_ATTENTION=unfused */
    int attention_own;    /* LOOM_CUDA_ATTENTION=own: the own fused kernels even where cuDNN would serve */
    cudaStream_t stream;  /* every op runs here */
    cublasLtHandle_t lt;
    cublasHandle_t blas;  /* batched GEMMs of the unfused attention */
    void *workspace;      /* cuBLAS(Lt) workspace, fixed so graph capture never allocates */
    size_t workspace_bytes;
    double *reduce;       /* (1024 partials + 1 total) for sumsq, deterministic */
};
extern loom_cuda_state g_cuda;

/* Scratch: one grow-only device buffer per purpose. Growing is refused
 * (panic with the reason) while a CUDA graph is being captured, so the
 * warm-up step before capture must use the largest shapes. */
enum {
    SCRATCH_LN, SCRATCH_BIAS, SCRATCH_ATTN, SCRATCH_ATTN_D, SCRATCH_ATTN_LP, SCRATCH_CUDNN_WS, SCRATCH_QUANT,
    SCRATCH_WLP,      /* a weight (and its bias) rounded to the 16-bit activation type, per matmul call */
    SCRATCH_ATTN_F32, /* fp32 copies of 16-bit activations for the fp32 attention kernels */
    SCRATCH_ENC,      /* encoder backward: the rows sorted by token */
    SCRATCH_BIAS_PART,/* bias gradient: per-chunk column sums */
    SCRATCH_COUNT
};
/* Whether ACT tensors are 16-bit (bf16 or fp16) in this process. */
static inline bool cuda_act16(void) {
    return g_cuda.act == LOOM_BF16 || g_cuda.act == LOOM_FP16;
}
void *cuda_scratch(int slot, size_t bytes);
/* Whether g_cuda.stream is being captured into a graph right now. */
int cuda_capturing(void);

/* Grid size for a grid-stride loop over n items with `block` threads. */
int cuda_grid(size_t n, int block);

/* cuda_kernels.cu, used by the matmul and attention code too (as are
 * cuda_accumulate and cuda_gelu_forward, declared below). ACT arguments
 * (out, dout here) are of type g_cuda.act. */
void cuda_bias_add(float *out, const float *bias, int N, int OC); /* out (N,OC) += bias */
void cuda_bias_grad(float *dbias, const float *dout, int N, int OC); /* dbias += colsum */
/* Returns cudaSuccess when this build has a kernel image for the device. */
cudaError_t cuda_kernels_probe(void);
void cuda_attention_init(void);
/* cuda_attention_cudnn.cpp: cuDNN's fused SDPA at bf16/fp16. takes: whether
 * it would serve this width and head count at the run's dtype; forward and
 * backward return false (nothing launched) when cuDNN refuses the shape. */
bool cuda_attention_cudnn_takes(int C, int NH);
bool cuda_attention_cudnn_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
bool cuda_attention_cudnn_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C, int NH);

/* The kernels of the table, one per entry of ops.h, declared from the
 * list: the kernel of entry X is cuda_X (weak for the optional kinds;
 * contracts in backend.h). cuda_backend.cu's fill_table takes the table
 * from the same list, so a new entry needs its row and its kernel only. */
#define LOOM_CUDA_KERNEL_(name, ret, kind, fallback, flops, n, args) \
    LOOM_OP_KERNEL(cuda_##name, ret, kind, n, args)
LOOM_OPS(LOOM_CUDA_KERNEL_)
#undef LOOM_CUDA_KERNEL_

/* Drops the cached cuBLASLt algorithms and descriptors (they depend on the
 * compute type). */
void cuda_matmul_reset(void);

/* fp32 <-> the run's 16-bit type (bf16 when bf16 is set, else fp16), n elements. */
void cuda_to_lp16(void *dst, const float *src, size_t n, bool bf16);
void cuda_from_lp16(float *dst, const void *src, size_t n, bool bf16);
/* The same on `stream`, without the launch check (cuda_wire.cu returns
 * the error to its caller). */
void cuda_to_lp16_on(cudaStream_t stream, void *dst, const float *src, size_t n, bool bf16);
void cuda_from_lp16_on(cudaStream_t stream, float *dst, const void *src, size_t n, bool bf16);
/* fp32 <-> the ACT type g_cuda.act (16-bit only: callers check cuda_act16). */
void cuda_act_from_f32(void *dst, const float *src, size_t n);
void cuda_act_to_f32(float *dst, const void *src, size_t n);

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- the activation element type ---- */

/* Calls f(T()) with T the C++ type of g_cuda.act: float, __nv_bfloat16 or
 * __half. Kernels over ACT tensors are templates on T with fp32 math
 * inside; loads widen, stores round to nearest even. */
template <typename F> static inline void with_act(F f) {
    switch (g_cuda.act) {
    case LOOM_BF16: f(__nv_bfloat16()); break;
    case LOOM_FP16: f(__half()); break;
    default: f(0.f); break;
    }
}
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
/* True when p is aligned for 4-element vector access of T (16 bytes for
 * fp32, 8 for 16-bit types). */
template <typename T> static inline bool vec4_ok(const void *p) {
    return ((uintptr_t)p % (4 * sizeof(T))) == 0;
}

/* ---- device helpers ---- */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* True when every pointer is 16-byte aligned (float4 loads allowed). */
static inline bool aligned16(const void *a, const void *b = nullptr, const void *c = nullptr,
                             const void *d = nullptr) {
    return ((((uintptr_t)a) | ((uintptr_t)b) | ((uintptr_t)c) | ((uintptr_t)d)) & 15) == 0;
}

#endif /* __CUDACC__ */

#endif
