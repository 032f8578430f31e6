/* cuda_paged: the inference engine's paged-cache ops (backend.h) on the GPU, the same
 * contract as the CPU's (src/backend/cpu/cpu_paged.c), which they are
 * tested against (tests/test_engine_cuda.c). Compiled, not yet run on a GPU.
 *
 * linear goes through the backend's cuBLASLt matmul, so unlike the CPU a
 * row's result may depend on the batch's size (cuBLAS picks its algorithm
 * by shape); the rest computes each row on its own.
 *
 * attention: one warp per (row, head); each lane holds hs/32 of the query
 * and of the output; keys are walked through the block table with an
 * online softmax (running max and sum), one key at a time.
 *
 * Activations (out, qkv, inp) are of the backend's ACT type (bf16 when a
 * training run at --dtype bf16 samples text), read into fp32; the cache is
 * fp32 or int8 (cuda_int8.cu writes and copies an int8 one; the attention
 * kernel here reads both, templated on the element type). */
#include <type_traits>

#include "cuda_internal.h"
#include "cuda_paged.h"
#include "cuda_int8.h"

#define MAX_HS_PER_LANE 8 /* head size up to 256 */

template <typename A>
__global__ void paged_embed_kernel(A *out, const int *tokens, const int *pos, const float *wte,
                                   const float *wpe, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C, c = i % C;
        out[i] = from_f<A>(wte[(size_t)tokens[r] * C + c] + (wpe ? wpe[(size_t)pos[r] * C + c] : 0.0f)); /* NULL: rotary */
    }
}

void cuda_embed_positions(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                        int N, int C) {
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        paged_embed_kernel<A><<<cuda_grid((size_t)N * C, 256), 256, 0, g_cuda.stream>>>((A *)out, tokens, pos, wte, wpe, N, C);
    });
    LAUNCH_CHECK();
}

void cuda_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                         int OC, int gelu) {
    cuda_matmul_forward(out, inp, w, bias, N, C, OC);
    if (gelu) cuda_gelu_forward(out, out, (size_t)N * OC);
}

/* The cache's layout (backend.h): head h's keys (which 0) or values
 * (which 1) of block `block`, token `off`. */
__device__ __forceinline__ float *kv_slot(float *kv, int NH, int bs, int hs, int block, int which, int h, int off) {
    return kv + ((((size_t)block * 2 + which) * NH + h) * bs + off) * hs;
}

static void fp32_only(const loom_tensor_t *kv) {
    if (kv->dtype != LOOM_FP32)
        loom_panic(__FILE__, __LINE__, "KV cache of %s: the CUDA paged ops take fp32", loom_dtype_name(kv->dtype));
}

/* One thread per (row, element of a token's K): the K and V parts of qkv
 * (rows of NH query heads, then NKV key heads, then NKV value heads) into
 * the cache of NKV heads. */
template <typename A>
__global__ void kv_write_kernel(float *kv, const A *qkv, const int *slot, int N, int NH, int NKV, int bs, int hs) {
    int C = NH * hs, KC = NKV * hs;
    size_t n = (size_t)N * KC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / KC), c = (int)(i % KC), h = c / hs, e = c % hs;
        int s = slot[r], blk = s / bs, off = s % bs;
        const A *row = qkv + (size_t)r * (C + 2 * KC);
        kv_slot(kv, NKV, bs, hs, blk, 0, h, off)[e] = to_f(row[C + c]);
        kv_slot(kv, NKV, bs, hs, blk, 1, h, off)[e] = to_f(row[C + KC + c]);
    }
}

void cuda_kv_write(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs) {
    if (kv->dtype == LOOM_INT8) return cuda_kv_write_int8(kv, qkv, slot, N, NH, NKV, bs); /* cuda_int8.cu */
    fp32_only(kv);
    int hs = (int)(kv->cols / bs);
    size_t n = (size_t)N * NKV * hs;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        kv_write_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((float *)kv->data, (const A *)qkv, slot, N, NH, NKV,
                                                                         bs, hs);
    });
    LAUNCH_CHECK();
}

/* One block of PA_WARPS warps per (row, query head); query head h reads
 * cache head h / (NH / NKV). Warp w takes the positions t = w, w + PA_WARPS,
 * ... with its own running maximum, sum and output (online softmax); the
 * warps' partials are then joined in shared memory, in warp order. A
 * decode step (one row per sequence) has N * NH warps' worth of rows: one
 * warp per row and head left a long serial chain over the context on a
 * few warps (the first GPU run: 43 us per call at 25 tokens, the largest
 * kernel of a decode step), here PA_WARPS chains of a share each. A row's
 * result does not depend on the other rows of the batch.
 * One kernel for a cache of element type E: float, or int8_t with one
 * scale per row (block, K or V, head) applied to the score (K) and to the
 * weight p (V) -- the only difference, as `attend` in cpu_paged.c has it.
 * With E = float there are no scales and the factors are exactly 1. */
#define PA_WARPS 8
template <typename A, typename E>
__global__ void __launch_bounds__(PA_WARPS * 32)
    paged_attention_kernel(A *out, const A *qkv, const E *kv, const float *scales, const int *pos, const int *seq,
                           const int *tables, int max_blocks, int N, int NH, int NKV, int bs, int hs) {
    __shared__ float s_m[PA_WARPS], s_l[PA_WARPS], s_o[PA_WARPS][32 * MAX_HS_PER_LANE];
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x / NH, h = blockIdx.x % NH, C = NH * hs, per = (hs + 31) / 32, kh = h / (NH / NKV);
    const A *q = qkv + (size_t)r * (C + 2 * NKV * hs) + h * hs;
    const int *table = tables + (size_t)seq[r] * max_blocks;
    float ql[MAX_HS_PER_LANE], o[MAX_HS_PER_LANE], mx = -INFINITY, sum = 0.0f, scale = rsqrtf((float)hs);
    /* the per-lane arrays stay in registers: loops of a constant count */
#pragma unroll
    for (int k = 0; k < MAX_HS_PER_LANE; k++) {
        int e = lane + 32 * k;
        ql[k] = k < per && e < hs ? to_f(q[e]) : 0.0f;
        o[k] = 0.0f;
    }
    for (int t = w; t <= pos[r]; t += PA_WARPS) {
        size_t rk = ((size_t)table[t / bs] * 2) * NKV + kh, rv = rk + NKV; /* cache rows (backend.h) */
        const E *K = kv + (rk * bs + t % bs) * hs, *V = kv + (rv * bs + t % bs) * hs;
        float sk = scales ? scales[rk] : 1.0f, sv = scales ? scales[rv] : 1.0f;
        float d = 0.0f;
#pragma unroll
        for (int k = 0; k < MAX_HS_PER_LANE; k++) {
            int e = lane + 32 * k;
            if (k < per && e < hs) d += ql[k] * (float)K[e];
        }
        float s = warp_sum(d) * (sk * scale), nm = fmaxf(mx, s), corr = __expf(mx - nm), p = __expf(s - nm);
        float pv = p * sv;
        sum = sum * corr + p;
#pragma unroll
        for (int k = 0; k < MAX_HS_PER_LANE; k++) {
            int e = lane + 32 * k;
            if (k < per) o[k] = o[k] * corr + (e < hs ? pv * (float)V[e] : 0.0f);
        }
        mx = nm;
    }
    /* a warp without positions (context shorter than PA_WARPS) leaves
     * mx = -inf, sum = 0, o = 0: a factor of 0 below */
    if (lane == 0) s_m[w] = mx, s_l[w] = sum;
#pragma unroll
    for (int k = 0; k < MAX_HS_PER_LANE; k++) {
        int e = lane + 32 * k;
        if (k < per && e < hs) s_o[w][e] = o[k];
    }
    __syncthreads();
    float m = s_m[0]; /* warp 0 has position 0: finite */
    for (int i = 1; i < PA_WARPS; i++) m = fmaxf(m, s_m[i]);
    float l = 0.0f, f[PA_WARPS];
    for (int i = 0; i < PA_WARPS; i++) f[i] = __expf(s_m[i] - m), l += s_l[i] * f[i];
    A *dst = out + (size_t)r * C + h * hs;
    for (int e = threadIdx.x; e < hs; e += PA_WARPS * 32) {
        float v = 0.0f;
        for (int i = 0; i < PA_WARPS; i++) v += s_o[i][e] * f[i];
        dst[e] = from_f<A>(v / l);
    }
}

void cuda_paged_attention(float *out, const float *qkv, const loom_tensor_t *kv, const int *pos, const int *seq,
                          const int *block_tables, int max_blocks, int N, int NH, int NKV, int bs) {
    if (kv->dtype != LOOM_INT8) fp32_only(kv);
    int hs = (int)(kv->cols / bs);
    if (N <= 0) return;
    if (hs > 32 * MAX_HS_PER_LANE)
        loom_panic(__FILE__, __LINE__, "paged attention: head size %d is above %d", hs, 32 * MAX_HS_PER_LANE);
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        if (kv->dtype == LOOM_INT8)
            paged_attention_kernel<A, int8_t><<<N * NH, PA_WARPS * 32, 0, g_cuda.stream>>>(
                (A *)out, (const A *)qkv, (const int8_t *)kv->data, kv->scales, pos, seq, block_tables, max_blocks, N,
                NH, NKV, bs, hs);
        else
            paged_attention_kernel<A, float><<<N * NH, PA_WARPS * 32, 0, g_cuda.stream>>>(
                (A *)out, (const A *)qkv, (const float *)kv->data, (const float *)NULL, pos, seq, block_tables,
                max_blocks, N, NH, NKV, bs, hs);
    });
    LAUNCH_CHECK();
}

template <typename A> __global__ void gather_rows_kernel(A *out, const A *inp, const int *rows, int R, int C) {
    size_t n = (size_t)R * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = inp[(size_t)rows[i / C] * C + i % C];
}

void cuda_gather_rows(float *out, const float *inp, const int *rows, int R, int C) {
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        gather_rows_kernel<A><<<cuda_grid((size_t)R * C, 256), 256, 0, g_cuda.stream>>>((A *)out, (const A *)inp, rows, R, C);
    });
    LAUNCH_CHECK();
}

void cuda_kv_copy_block(const loom_tensor_t *kv, int src, int dst, int NH) {
    if (kv->dtype == LOOM_INT8) return cuda_kv_copy_block_int8(kv, src, dst, NH); /* cuda_int8.cu: with its scales */
    size_t n = 2 * (size_t)NH * (size_t)kv->cols * loom_dtype_size(kv->dtype);
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->data + (size_t)dst * n, (char *)kv->data + (size_t)src * n, n,
                               cudaMemcpyDeviceToDevice, g_cuda.stream));
}
