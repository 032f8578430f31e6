/* cuda_attention: causal multi-head attention, two ways (three at bf16 and
 * fp16, where cuDNN's tensor-core SDPA in cuda_attention_cudnn.cpp comes
 * first for head sizes it serves; LOOM_CUDA_ATTENTION=own skips it).
 *
 * Fused (default): flash-style kernels of our own. Forward streams key/value
 * tiles through shared memory and keeps, per query row, a running max,
 * running sum and output accumulator (online softmax), so no T x T tensor
 * exists; it saves only the row's log-sum-exp (the lse contract of
 * backend.h). Backward recomputes the probabilities from q, k and lse:
 * one kernel per query row for dq, one per key row for dk and dv, so every
 * output element is written by exactly one warp (no atomics, deterministic).
 * Work layout: a warp owns ROWS rows; in a tile each lane owns one of the
 * 32 keys (forward, dq) or queries (dk/dv) for the scores, and the head
 * dimension is spread over the lanes for the accumulators. These kernels
 * run on the CUDA cores in fp32 at every dtype; moving the two score
 * products onto tensor cores (mma.sync on bf16/fp16 tiles) is the next step.
 * Head sizes up to 128; larger heads use the unfused path.
 *
 * With 16-bit activations these fp32 kernels run on fp32 copies (the
 * entries at the end); cuDNN's SDPA reads the 16-bit tensors directly.
 *
 * Unfused (LOOM_CUDA_ATTENTION=unfused, the reference and fallback): heads
 * are split out to (B, NH, T, hs), scores and products are strided batched
 * GEMMs in cuBLAS at the run's compute type, and a softmax kernel between
 * them; it stores B*NH*T*T scores in scratch.
 *
 * Grouped-query attention (NKV key/value heads, NKV dividing NH): qkv rows
 * are NH query heads, then NKV key heads, then NKV value heads (ld = C +
 * 2*NKV*hs); query head h reads kv head h / (NH/NKV). The dk/dv kernel
 * runs per kv head and walks its group's query heads in order, so each
 * dk, dv element is still written by one warp. The unfused path repeats
 * each kv head for its group and sums the group's dk, dv when it merges.
 * cuDNN's SDPA is used at NKV = NH only. */
#include <math.h>

#include "cuda_internal.h"

#define ATT_WARPS 8
#define ATT_ROWS 4                      /* rows per warp */
#define ATT_BR (ATT_WARPS * ATT_ROWS)   /* rows per block */
#define ATT_BC 32                       /* keys (or queries) per tile: one per lane */
#define ATT_MAX_HS 128

/* D = dout . out per (b, h, t) row: the "delta" term of the softmax
 * backward, shared by both paths. Warp per (row, head). */
static __global__ void attention_rowdot_kernel(float *Dv, const float *dout, const float *out,
                                               int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * NH) return;
    int h = (int)(w % NH);
    size_t row = w / NH; /* b*T + t */
    const float *g = dout + row * C + h * hs, *o = out + row * C + h * hs;
    float s = 0.f;
    for (int d = lane; d < hs; d += 32) s += g[d] * o[d];
    s = warp_sum(s);
    if (lane == 0) {
        int b = (int)(row / T), t = (int)(row % T);
        Dv[((size_t)b * NH + h) * T + t] = s;
    }
}

static void attention_rowdot(float *Dv, const float *dout, const float *out, int B, int T, int C,
                             int NH) {
    size_t warps = (size_t)B * T * NH;
    attention_rowdot_kernel<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, g_cuda.stream>>>(
        Dv, dout, out, B, T, C, NH);
    LAUNCH_CHECK();
}

/* Copies `rows` x `hs` floats from a (row stride `ld`) into shared memory
 * with row stride `sld`, times `scale`; rows past `valid` become zeros. */
__device__ __forceinline__ void tile_load(float *dst, int sld, const float *src, size_t ld,
                                          int rows, int valid, int hs, float scale) {
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
        int r = i / hs, d = i % hs;
        dst[r * sld + d] = r < valid ? src[(size_t)r * ld + d] * scale : 0.f;
    }
}

/* acc[e] += sum over the tile's first n rows jj of (lane jj's w) * row jj
 * of `tile` (row stride ld), for this lane's head elements d = lane + 32e:
 * the shared inner loop of the three fused kernels. */
template <int DPL>
__device__ __forceinline__ void add_tile_rows(float (&acc)[DPL], float w, const float *tile, int ld, int n, int hs,
                                              int lane) {
    for (int jj = 0; jj < n; jj++) {
        float wj = __shfl_sync(0xffffffffu, w, jj);
        const float *row = tile + jj * ld;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            int d = lane + 32 * e;
            if (d < hs) acc[e] += wj * row[d];
        }
    }
}

/* *s = a . b and *dp = c . e over hs elements: a (query, key) pair's score
 * and dP in the two backward kernels. */
__device__ __forceinline__ void two_dots(const float *a, const float *b, const float *c, const float *e, int hs,
                                         float *s, float *dp) {
    float x = 0.f, y = 0.f;
    for (int d = 0; d < hs; d++) {
        x += a[d] * b[d];
        y += c[d] * e[d];
    }
    *s = x, *dp = y;
}

/* dst[d] = acc[e] * mul for this lane's head elements d = lane + 32e. */
template <int DPL>
__device__ __forceinline__ void store_row(float *dst, const float (&acc)[DPL], float mul, int hs, int lane) {
#pragma unroll
    for (int e = 0; e < DPL; e++) {
        int d = lane + 32 * e;
        if (d < hs) dst[d] = acc[e] * mul;
    }
}

/* ---- fused forward ---- */

/* Grid (B*NH, query tiles) (flash_grid); 256 threads. DPL = ceil(hs/32) head elements per
 * lane. Shared: Q (BR x hs, pre-scaled), K (BC x hs+1), V (BC x hs). */
template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    flash_forward_kernel(float *out, float *lse, const float *qkv, int T, int C, int NH, int NKV,
                         float scale) {
    extern __shared__ float sh[];
    int hs = C / NH;
    float *Qs = sh, *Ks = Qs + ATT_BR * hs, *Vs = Ks + ATT_BC * (hs + 1);
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_BR; /* longest rows first */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t ld = (size_t)C + 2 * (size_t)NKV * hs;
    const float *base = qkv + (size_t)b * T * ld + h * hs;
    const float *kbase = qkv + (size_t)b * T * ld + C + kh * hs, *vbase = kbase + (size_t)NKV * hs;

    tile_load(Qs, hs, base + (size_t)q0 * ld, ld, ATT_BR, min(ATT_BR, T - q0), hs, scale);

    float m[ATT_ROWS], l[ATT_ROWS], acc[ATT_ROWS][DPL];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[r][e] = 0.f;
    }
    int kend = min(T, q0 + ATT_BR); /* keys any row of this block can see */
    for (int k0 = 0; k0 < kend; k0 += ATT_BC) {
        __syncthreads(); /* previous tile fully used (and Q loaded) */
        int kvalid = min(ATT_BC, T - k0);
        tile_load(Ks, hs + 1, kbase + (size_t)k0 * ld, ld, ATT_BC, kvalid, hs, 1.f);
        tile_load(Vs, hs, vbase + (size_t)k0 * ld, ld, ATT_BC, kvalid, hs, 1.f);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            int qr = warp * ATT_ROWS + r, i = q0 + qr;
            if (i >= T || k0 > i) continue; /* warp-uniform */
            const float *q = Qs + qr * hs, *k = Ks + lane * (hs + 1);
            float s = 0.f;
            for (int d = 0; d < hs; d++) s += q[d] * k[d];
            int j = k0 + lane;
            if (j > i) s = -INFINITY;
            float mnew = fmaxf(m[r], warp_max(s)); /* finite: key k0 <= i */
            float corr = expf(m[r] - mnew);
            float p = expf(s - mnew);
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = mnew;
            int nk = min(ATT_BC, i - k0 + 1);
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[r][e] *= corr;
            add_tile_rows<DPL>(acc[r], p, Vs, hs, nk, hs, lane);
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = q0 + warp * ATT_ROWS + r;
        if (i >= T) continue;
        store_row<DPL>(out + ((size_t)b * T + i) * C + h * hs, acc[r], 1.f / l[r], hs, lane);
        if (lane == 0) lse[(size_t)bh * T + i] = m[r] + logf(l[r]);
    }
}

/* ---- fused backward: dq ---- */

/* Per query row i: dq_i = scale * sum_j p_ij (dO_i.v_j - D_i) k_j, with
 * p_ij = exp(scale q_i.k_j - lse_i). Shared: Q (BR x hs, pre-scaled),
 * dO (BR x hs), K (BC x hs+1), V (BC x hs+1). */
template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    flash_backward_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                             const float *Dv, int T, int C, int NH, int NKV, float scale) {
    extern __shared__ float sh[];
    int hs = C / NH;
    float *Qs = sh, *dOs = Qs + ATT_BR * hs, *Ks = dOs + ATT_BR * hs,
          *Vs = Ks + ATT_BC * (hs + 1);
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_BR;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t ld = (size_t)C + 2 * (size_t)NKV * hs;
    const float *base = qkv + (size_t)b * T * ld + h * hs;
    const float *kbase = qkv + (size_t)b * T * ld + C + kh * hs, *vbase = kbase + (size_t)NKV * hs;
    int qvalid = min(ATT_BR, T - q0);
    tile_load(Qs, hs, base + (size_t)q0 * ld, ld, ATT_BR, qvalid, hs, scale);
    tile_load(dOs, hs, dout + ((size_t)b * T + q0) * C + h * hs, C, ATT_BR, qvalid, hs, 1.f);

    float rl[ATT_ROWS], rD[ATT_ROWS], dq[ATT_ROWS][DPL];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = q0 + warp * ATT_ROWS + r;
        rl[r] = i < T ? lse[(size_t)bh * T + i] : 0.f;
        rD[r] = i < T ? Dv[(size_t)bh * T + i] : 0.f;
#pragma unroll
        for (int e = 0; e < DPL; e++) dq[r][e] = 0.f;
    }
    int kend = min(T, q0 + ATT_BR);
    for (int k0 = 0; k0 < kend; k0 += ATT_BC) {
        __syncthreads();
        int kvalid = min(ATT_BC, T - k0);
        tile_load(Ks, hs + 1, kbase + (size_t)k0 * ld, ld, ATT_BC, kvalid, hs, 1.f);
        tile_load(Vs, hs + 1, vbase + (size_t)k0 * ld, ld, ATT_BC, kvalid, hs, 1.f);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            int qr = warp * ATT_ROWS + r, i = q0 + qr;
            if (i >= T || k0 > i) continue;
            const float *q = Qs + qr * hs, *go = dOs + qr * hs;
            const float *k = Ks + lane * (hs + 1), *v = Vs + lane * (hs + 1);
            float s, dp;
            two_dots(q, k, go, v, hs, &s, &dp);
            int j = k0 + lane;
            float p = j <= i ? expf(s - rl[r]) : 0.f;
            float ds = p * (dp - rD[r]);
            add_tile_rows<DPL>(dq[r], ds, Ks, hs + 1, min(ATT_BC, i - k0 + 1), hs, lane);
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = q0 + warp * ATT_ROWS + r;
        if (i < T) store_row<DPL>(dqkv + ((size_t)b * T + i) * ld + h * hs, dq[r], scale, hs, lane);
    }
}

/* ---- fused backward: dk, dv ---- */

/* Per key row j: dv_j = sum_{i>=j} p_ij dO_i, dk_j = scale * sum_{i>=j}
 * ds_ij q_i. Rows of this block are keys; tiles stream queries. Shared:
 * K (BR x hs, pre-scaled), V (BR x hs), Q (BC x hs+1), dO (BC x hs+1),
 * lse (BC), D (BC). */
template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    flash_backward_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                              const float *Dv, int T, int C, int NH, int NKV, float scale) {
    extern __shared__ float sh[];
    int hs = C / NH, G = NH / NKV;
    float *Ks = sh, *Vs = Ks + ATT_BR * hs, *Qs = Vs + ATT_BR * hs, *dOs = Qs + ATT_BC * (hs + 1);
    float *Ls = dOs + ATT_BC * (hs + 1), *Ds = Ls + ATT_BC;
    int bk = blockIdx.x, b = bk / NKV, kh = bk % NKV; /* a kv head; its G query heads in order */
    int k0 = blockIdx.y * ATT_BR; /* early keys see the most queries: launched first */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t ld = (size_t)C + 2 * (size_t)NKV * hs;
    const float *kbase = qkv + (size_t)b * T * ld + C + kh * hs, *vbase = kbase + (size_t)NKV * hs;
    int kvalid = min(ATT_BR, T - k0);
    tile_load(Ks, hs, kbase + (size_t)k0 * ld, ld, ATT_BR, kvalid, hs, scale);
    tile_load(Vs, hs, vbase + (size_t)k0 * ld, ld, ATT_BR, kvalid, hs, 1.f);

    float dk[ATT_ROWS][DPL], dv[ATT_ROWS][DPL];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++)
#pragma unroll
        for (int e = 0; e < DPL; e++) dk[r][e] = dv[r][e] = 0.f;

    /* the group's query heads in order, each over its query tiles from k0
     * (queries before k0 see none of these keys) */
    int ntiles = (T - k0 + ATT_BC - 1) / ATT_BC;
    for (int gt = 0; gt < G * ntiles; gt++) {
        int i0 = k0 + (gt % ntiles) * ATT_BC, h = kh * G + gt / ntiles, bh = b * NH + h;
        const float *base = qkv + (size_t)b * T * ld + h * hs;
        __syncthreads();
        int qvalid = min(ATT_BC, T - i0);
        tile_load(Qs, hs + 1, base + (size_t)i0 * ld, ld, ATT_BC, qvalid, hs, 1.f);
        tile_load(dOs, hs + 1, dout + ((size_t)b * T + i0) * C + h * hs, C, ATT_BC, qvalid, hs,
                  1.f);
        for (int t = threadIdx.x; t < ATT_BC; t += blockDim.x) {
            Ls[t] = t < qvalid ? lse[(size_t)bh * T + i0 + t] : 0.f;
            Ds[t] = t < qvalid ? Dv[(size_t)bh * T + i0 + t] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            int kr = warp * ATT_ROWS + r, j = k0 + kr;
            if (j >= T || i0 + ATT_BC - 1 < j) continue; /* no query of the tile sees key j */
            const float *k = Ks + kr * hs, *v = Vs + kr * hs;
            const float *q = Qs + lane * (hs + 1), *go = dOs + lane * (hs + 1);
            float s, dp;
            two_dots(k, q, v, go, hs, &s, &dp);
            int i = i0 + lane;
            float p = (i < T && i >= j) ? expf(s - Ls[lane]) : 0.f;
            float ds = p * (dp - Ds[lane]);
            int first = max(0, j - i0), last = min(ATT_BC, T - i0); /* queries i0+first.. */
            for (int ii = first; ii < last; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii);
                float dsi = __shfl_sync(0xffffffffu, ds, ii);
                const float *qi = Qs + ii * (hs + 1), *gi = dOs + ii * (hs + 1);
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    int d = lane + 32 * e;
                    if (d < hs) {
                        dv[r][e] += pi * gi[d];
                        dk[r][e] += dsi * qi[d];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int j = k0 + warp * ATT_ROWS + r;
        if (j >= T) continue;
        float *o = dqkv + ((size_t)b * T + j) * ld + C + kh * hs;
        store_row<DPL>(o, dk[r], scale, hs, lane);
        store_row<DPL>(o + (size_t)NKV * hs, dv[r], 1.f, hs, lane);
    }
}

static size_t fwd_smem(int hs) {
    return sizeof(float) * ((size_t)ATT_BR * hs + ATT_BC * (hs + 1) + ATT_BC * hs);
}
static size_t bwd_smem(int hs) {
    return sizeof(float) * (2 * (size_t)ATT_BR * hs + 2 * ATT_BC * (hs + 1) + 2 * ATT_BC);
}

/* Calls f(integral_constant<DPL>) for the head size. */
template <typename F> static void with_dpl(int hs, F f) {
    switch ((hs + 31) / 32) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    default: f(std::integral_constant<int, 4>()); break;
    }
}

void cuda_attention_init(void) {
    /* The largest head needs more than the default 48 KiB of shared memory. */
    for (int hs = 32; hs <= ATT_MAX_HS; hs += 32)
        with_dpl(hs, [&](auto dpl) {
            constexpr int DPL = decltype(dpl)::value;
            CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<DPL>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)fwd_smem(hs)));
            CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dq_kernel<DPL>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)bwd_smem(hs)));
            CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dkv_kernel<DPL>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)bwd_smem(hs)));
        });
}

/* ---- unfused reference path ---- */

/* Element i of a (B, NH, T, hs) tensor: its row (b, t) and column h * hs + d. */
struct bhtd_t {
    int b, h, t, d;
};
static __device__ inline bhtd_t bhtd(size_t i, int T, int NH, int hs) {
    size_t r = i / hs;
    return {(int)(r / ((size_t)T * NH)), (int)((r / T) % NH), (int)(r % T), (int)(i % hs)};
}

/* (B, T, *) rows with stride ld, head h at column off + h*hs  <->  (B, NH, T, hs).
 * With G > 1 the row holds NH/G heads, each repeated for its G query heads
 * (split) and the G heads' values summed into it (merge: dk, dv of GQA). */
static __global__ void split_heads_kernel(float *dst, const float *src, size_t ld, int off, int B,
                                          int T, int NH, int G, int hs) {
    size_t n = (size_t)B * NH * T * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        bhtd_t e = bhtd(i, T, NH, hs);
        dst[i] = src[((size_t)e.b * T + e.t) * ld + off + (e.h / G) * hs + e.d];
    }
}
static __global__ void merge_heads_kernel(float *dst, size_t ld, int off, const float *src, int B,
                                          int T, int NH, int G, int hs) {
    int ND = NH / G; /* heads in dst */
    size_t n = (size_t)B * ND * T * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        bhtd_t e = bhtd(i, T, ND, hs); /* e.h: the head in dst */
        float s = 0.f;
        for (int g = 0; g < G; g++) s += src[(((size_t)e.b * NH + e.h * G + g) * T + e.t) * hs + e.d];
        dst[((size_t)e.b * T + e.t) * ld + off + e.h * hs + e.d] = s;
    }
}

static void split_heads(float *dst, const float *src, size_t ld, int off, int B, int T, int NH,
                        int G, int hs) {
    size_t n = (size_t)B * NH * T * hs;
    split_heads_kernel<<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(dst, src, ld, off, B, T, NH,
                                                                     G, hs);
    LAUNCH_CHECK();
}
static void merge_heads(float *dst, size_t ld, int off, const float *src, int B, int T, int NH,
                        int G, int hs) {
    size_t n = (size_t)B * (NH / G) * T * hs;
    merge_heads_kernel<<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(dst, ld, off, src, B, T, NH,
                                                                     G, hs);
    LAUNCH_CHECK();
}

/* Warp per score row (b, h, i) of att (B*NH, T, T). mode 0 (forward):
 * softmax of the causal row in place, lse saved. mode 1 (backward): att =
 * exp(att - lse) (masked), the probabilities again. Scores arrive scaled. */
static __global__ void causal_softmax_kernel(float *att, float *lse, int rows, int T, int mode) {
    size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)rows) return;
    int i = (int)(w % T);
    float *x = att + w * T;
    float L;
    if (mode == 0) {
        float m = -INFINITY;
        for (int j = lane; j <= i; j += 32) m = fmaxf(m, x[j]);
        m = warp_max(m);
        float s = 0.f;
        for (int j = lane; j <= i; j += 32) s += expf(x[j] - m);
        s = warp_sum(s);
        L = m + logf(s);
        if (lane == 0) lse[w] = L;
    } else {
        L = lse[w];
    }
    for (int j = lane; j < T; j += 32) x[j] = j <= i ? expf(x[j] - L) : 0.f;
}

/* dS = P * (dP - D_i), in place over dP. */
static __global__ void softmax_backward_kernel(float *dP, const float *P, const float *Dv,
                                               size_t rows, int T) {
    size_t n = rows * T;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x)
        dP[k] = P[k] * (dP[k] - Dv[k / T]);
}

/* Row-major batched C = alpha op(A) op(B) + beta C, (M, N) = (M, K)(K, N),
 * through column-major cuBLAS as C^T = op(B)^T op(A)^T. */
static void rm_bgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     long long sA, const float *B, int ldb, long long sB, float beta, float *Cm,
                     int ldc, long long sC, int batch) {
    cublasComputeType_t ct = g_cuda.dtype == LOOM_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                             : g_cuda.dtype == LOOM_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                             : g_cuda.dtype == LOOM_FP16 ? CUBLAS_COMPUTE_32F_FAST_16F
                                                         : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        g_cuda.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
        &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F, lda, sA, &beta, Cm, CUDA_R_32F, ldc, sC,
        batch, ct, CUBLAS_GEMM_DEFAULT));
}

static void unfused_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                            int NH, int NKV) {
    int hs = C / NH, BH = B * NH, G = NH / NKV, KC = NKV * hs;
    size_t x = (size_t)B * T * C, tt = (size_t)T * T, th = (size_t)T * hs, ld = (size_t)C + 2 * (size_t)KC;
    float *q = (float *)cuda_scratch(SCRATCH_ATTN, sizeof(float) * (4 * x + BH * tt));
    float *k = q + x, *v = k + x, *y = v + x, *att = y + x;
    split_heads(q, qkv, ld, 0, B, T, NH, 1, hs);
    split_heads(k, qkv, ld, C, B, T, NH, G, hs);
    split_heads(v, qkv, ld, C + KC, B, T, NH, G, hs);
    float scale = 1.f / sqrtf((float)hs);
    /* att (T, T) = scale * q (T, hs) k^T */
    rm_bgemm(false, true, T, T, hs, scale, q, hs, th, k, hs, th, 0.f, att, T, tt, BH);
    size_t rows = (size_t)BH * T;
    causal_softmax_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, g_cuda.stream>>>(
        att, lse, (int)rows, T, 0);
    LAUNCH_CHECK();
    /* y (T, hs) = att (T, T) v (T, hs) */
    rm_bgemm(false, false, T, hs, T, 1.f, att, T, tt, v, hs, th, 0.f, y, hs, th, BH);
    merge_heads(out, C, 0, y, B, T, NH, 1, hs);
}

static void unfused_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int C, int NH, int NKV) {
    int hs = C / NH, BH = B * NH, G = NH / NKV, KC = NKV * hs;
    size_t x = (size_t)B * T * C, tt = (size_t)T * T, th = (size_t)T * hs, ld = (size_t)C + 2 * (size_t)KC;
    float *q = (float *)cuda_scratch(SCRATCH_ATTN, sizeof(float) * (7 * x + 2 * BH * tt));
    float *k = q + x, *v = k + x, *go = v + x, *dq = go + x, *dk = dq + x, *dv = dk + x;
    float *P = dv + x, *dP = P + BH * tt;
    float *Dv = (float *)cuda_scratch(SCRATCH_ATTN_D, sizeof(float) * BH * T);
    split_heads(q, qkv, ld, 0, B, T, NH, 1, hs);
    split_heads(k, qkv, ld, C, B, T, NH, G, hs);
    split_heads(v, qkv, ld, C + KC, B, T, NH, G, hs);
    split_heads(go, dout, C, 0, B, T, NH, 1, hs);
    attention_rowdot(Dv, dout, out, B, T, C, NH);
    float scale = 1.f / sqrtf((float)hs);
    rm_bgemm(false, true, T, T, hs, scale, q, hs, th, k, hs, th, 0.f, P, T, tt, BH);
    size_t rows = (size_t)BH * T;
    causal_softmax_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, g_cuda.stream>>>(
        P, (float *)lse, (int)rows, T, 1);
    LAUNCH_CHECK();
    /* dv (T, hs) = P^T (T, T) dO (T, hs); dP (T, T) = dO v^T */
    rm_bgemm(true, false, T, hs, T, 1.f, P, T, tt, go, hs, th, 0.f, dv, hs, th, BH);
    rm_bgemm(false, true, T, T, hs, 1.f, go, hs, th, v, hs, th, 0.f, dP, T, tt, BH);
    softmax_backward_kernel<<<cuda_grid(rows * T, 256), 256, 0, g_cuda.stream>>>(dP, P, Dv, rows,
                                                                                  T);
    LAUNCH_CHECK();
    /* dq = scale dS k; dk = scale dS^T q */
    rm_bgemm(false, false, T, hs, T, scale, dP, T, tt, k, hs, th, 0.f, dq, hs, th, BH);
    rm_bgemm(true, false, T, hs, T, scale, dP, T, tt, q, hs, th, 0.f, dk, hs, th, BH);
    merge_heads(dqkv, ld, 0, dq, B, T, NH, 1, hs);
    merge_heads(dqkv, ld, C, dk, B, T, NH, G, hs);
    merge_heads(dqkv, ld, C + KC, dv, B, T, NH, G, hs);
}

/* ---- entries ---- */

static bool use_fused(int C, int NH) {
    return !g_cuda.attention_unfused && C / NH <= ATT_MAX_HS;
}
/* cuDNN's tensor-core SDPA first, where it serves (bf16/fp16, hs % 8 == 0, hs <= 128; multi-head). */
static bool use_cudnn(int C, int NH, int NKV) {
    return !g_cuda.attention_unfused && !g_cuda.attention_own && NKV == NH && cuda_attention_cudnn_takes(C, NH);
}

/* The fused kernels' grid: (batch x heads, query or key tiles). Batch x
 * heads goes on x, whose limit is 2^31 - 1 (on y, 65535, B * NH = 4096 x
 * 16 would already not launch); tiles on y, launched in y order, so the
 * longest rows (forward, dq) or the earliest keys (dkv) start first. */
static dim3 flash_grid(int B, int T, int NH) {
    long long bh = (long long)B * NH, tiles = (T + ATT_BR - 1) / ATT_BR;
    if (bh > 0x7fffffffLL || tiles > 65535)
        loom_panic(__FILE__, __LINE__, "attention: B*NH = %lld (at most 2^31 - 1) or T = %d (at most %d) is past the "
                   "fused kernels' grid; use a smaller batch or sequence", bh, T, 65535 * ATT_BR);
    return dim3((unsigned)bh, (unsigned)tiles);
}

/* The own kernels on fp32 tensors. */
static void attention_forward_f32(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int NKV) {
    if (!use_fused(C, NH)) {
        unfused_forward(out, lse, qkv, B, T, C, NH, NKV);
        return;
    }
    int hs = C / NH;
    float scale = 1.f / sqrtf((float)hs);
    dim3 grid = flash_grid(B, T, NH);
    with_dpl(hs, [&](auto dpl) {
        constexpr int DPL = decltype(dpl)::value;
        flash_forward_kernel<DPL><<<grid, ATT_WARPS * 32, fwd_smem(hs), g_cuda.stream>>>(
            out, lse, qkv, T, C, NH, NKV, scale);
    });
    LAUNCH_CHECK();
}

static void attention_backward_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C, int NH, int NKV) {
    if (!use_fused(C, NH)) {
        unfused_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
        return;
    }
    int hs = C / NH;
    float scale = 1.f / sqrtf((float)hs);
    float *Dv = (float *)cuda_scratch(SCRATCH_ATTN_D, sizeof(float) * (size_t)B * NH * T);
    attention_rowdot(Dv, dout, out, B, T, C, NH);
    dim3 grid = flash_grid(B, T, NH), kvgrid = flash_grid(B, T, NKV); /* dk, dv: a block per kv head */
    with_dpl(hs, [&](auto dpl) {
        constexpr int DPL = decltype(dpl)::value;
        flash_backward_dq_kernel<DPL><<<grid, ATT_WARPS * 32, bwd_smem(hs), g_cuda.stream>>>(
            dqkv, dout, qkv, lse, Dv, T, C, NH, NKV, scale);
        LAUNCH_CHECK();
        flash_backward_dkv_kernel<DPL><<<kvgrid, ATT_WARPS * 32, bwd_smem(hs), g_cuda.stream>>>(
            dqkv, dout, qkv, lse, Dv, T, C, NH, NKV, scale);
        LAUNCH_CHECK();
    });
}

/* With 16-bit activations, the fp32 kernels (head sizes or dtypes cuDNN
 * does not serve, LOOM_CUDA_ATTENTION=own|unfused) run on fp32 copies in
 * scratch: correct, not fast (docs/cuda.md). */
void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int NKV) {
    if (B <= 0 || T <= 0) return;
    if (use_cudnn(C, NH, NKV) && cuda_attention_cudnn_forward(out, lse, qkv, B, T, C, NH)) return;
    if (!cuda_act16()) {
        attention_forward_f32(out, lse, qkv, B, T, C, NH, NKV);
        return;
    }
    size_t BT = (size_t)B * T, QR = (size_t)C + 2 * (size_t)NKV * (C / NH);
    float *q32 = (float *)cuda_scratch(SCRATCH_ATTN_F32, BT * (QR + C) * sizeof(float)), *o32 = q32 + BT * QR;
    cuda_act_to_f32(q32, qkv, BT * QR);
    attention_forward_f32(o32, lse, q32, B, T, C, NH, NKV);
    cuda_act_from_f32(out, o32, BT * C);
}

void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int C, int NH, int NKV) {
    if (B <= 0 || T <= 0) return;
    if (use_cudnn(C, NH, NKV) && cuda_attention_cudnn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH)) return;
    if (!cuda_act16()) {
        attention_backward_f32(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
        return;
    }
    size_t BT = (size_t)B * T, QR = (size_t)C + 2 * (size_t)NKV * (C / NH);
    float *q32 = (float *)cuda_scratch(SCRATCH_ATTN_F32, BT * (2 * QR + 2 * C) * sizeof(float));
    float *o32 = q32 + BT * QR, *g32 = o32 + BT * C, *d32 = g32 + BT * C; /* qkv, out, dout, dqkv */
    cuda_act_to_f32(q32, qkv, BT * QR);
    cuda_act_to_f32(o32, out, BT * C);
    cuda_act_to_f32(g32, dout, BT * C);
    attention_backward_f32(d32, g32, q32, o32, lse, B, T, C, NH, NKV);
    cuda_act_from_f32(dqkv, d32, BT * QR);
}
