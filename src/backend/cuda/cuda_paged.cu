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
 * online softmax (running max and sum), one key at a time. */
#include "cuda_internal.h"
#include "cuda_paged.h"

#define MAX_HS_PER_LANE 8 /* head size up to 256 */

__global__ void paged_embed_kernel(float *out, const int *tokens, const int *pos, const float *wte,
                                   const float *wpe, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C, c = i % C;
        out[i] = wte[(size_t)tokens[r] * C + c] + wpe[(size_t)pos[r] * C + c];
    }
}

void cuda_embed_positions(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                        int N, int C) {
    paged_embed_kernel<<<cuda_grid((size_t)N * C, 256), 256, 0, g_cuda.stream>>>(out, tokens, pos, wte, wpe, N, C);
    LAUNCH_CHECK();
}

void cuda_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                         int OC, int gelu) {
    cuda_matmul_forward(out, inp, w, bias, N, C, OC);
    if (gelu) cuda_gelu_forward(out, out, (size_t)N * OC);
}

__device__ __forceinline__ float *kv_slot(const loom_kv_layer_t kv, void *base, int block, int h, int off) {
    return (float *)base + (((size_t)block * kv.NH + h) * kv.block_size + off) * kv.hs;
}

/* One thread per (row, element of C): K and V parts of qkv into the cache. */
__global__ void kv_write_kernel(loom_kv_layer_t kv, const float *qkv, const int *slot, int N) {
    int C = kv.NH * kv.hs;
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / C), c = (int)(i % C), h = c / kv.hs, e = c % kv.hs;
        int s = slot[r], blk = s / kv.block_size, off = s % kv.block_size;
        const float *row = qkv + (size_t)r * 3 * C;
        kv_slot(kv, kv.k, blk, h, off)[e] = row[C + c];
        kv_slot(kv, kv.v, blk, h, off)[e] = row[2 * C + c];
    }
}

void cuda_kv_write(const loom_kv_layer_t *kv, const float *qkv, const int *slot, int N) {
    size_t n = (size_t)N * kv->NH * kv->hs;
    kv_write_kernel<<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(*kv, qkv, slot, N);
    LAUNCH_CHECK();
}

/* One warp per (row, head), 4 warps per block. */
__global__ void paged_attention_kernel(float *out, const float *qkv, loom_kv_layer_t kv, const int *pos,
                                       const int *seq, const int *tables, int max_blocks, int N) {
    int warp = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp >= N * kv.NH) return;
    int r = warp / kv.NH, h = warp % kv.NH, hs = kv.hs, C = kv.NH * hs, per = (hs + 31) / 32;
    const float *q = qkv + (size_t)r * 3 * C + h * hs;
    const int *table = tables + (size_t)seq[r] * max_blocks;
    float ql[MAX_HS_PER_LANE], o[MAX_HS_PER_LANE], mx = -INFINITY, sum = 0.0f, scale = rsqrtf((float)hs);
    for (int k = 0; k < per; k++) {
        int e = lane + 32 * k;
        ql[k] = e < hs ? q[e] : 0.0f;
        o[k] = 0.0f;
    }
    for (int t = 0; t <= pos[r]; t++) {
        int blk = table[t / kv.block_size], off = t % kv.block_size;
        const float *K = kv_slot(kv, kv.k, blk, h, off), *V = kv_slot(kv, kv.v, blk, h, off);
        float d = 0.0f;
        for (int k = 0; k < per; k++) {
            int e = lane + 32 * k;
            if (e < hs) d += ql[k] * K[e];
        }
        float s = warp_sum(d) * scale, nm = fmaxf(mx, s), corr = __expf(mx - nm), p = __expf(s - nm);
        sum = sum * corr + p;
        for (int k = 0; k < per; k++) {
            int e = lane + 32 * k;
            o[k] = o[k] * corr + (e < hs ? p * V[e] : 0.0f);
        }
        mx = nm;
    }
    float *dst = out + (size_t)r * C + h * hs;
    for (int k = 0; k < per; k++) {
        int e = lane + 32 * k;
        if (e < hs) dst[e] = o[k] / sum;
    }
}

void cuda_paged_attention(float *out, const float *qkv, const loom_kv_layer_t *kv, const int *pos,
                          const int *seq, const int *block_tables, int max_blocks, int max_pos, int N) {
    if (kv->hs > 32 * MAX_HS_PER_LANE)
        loom_panic(__FILE__, __LINE__, "paged attention: head size %d is above %d", kv->hs, 32 * MAX_HS_PER_LANE);
    int warps = N * kv->NH;
    paged_attention_kernel<<<(warps + 3) / 4, 128, 0, g_cuda.stream>>>(out, qkv, *kv, pos, seq, block_tables,
                                                                      max_blocks, N);
    LAUNCH_CHECK();
}

__global__ void gather_rows_kernel(float *out, const float *inp, const int *rows, int R, int C) {
    size_t n = (size_t)R * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = inp[(size_t)rows[i / C] * C + i % C];
}

void cuda_gather_rows(float *out, const float *inp, const int *rows, int R, int C) {
    gather_rows_kernel<<<cuda_grid((size_t)R * C, 256), 256, 0, g_cuda.stream>>>(out, inp, rows, R, C);
    LAUNCH_CHECK();
}

void cuda_kv_copy_block(const loom_kv_layer_t *kv, int src, int dst) {
    size_t bytes = (size_t)kv->NH * kv->block_size * kv->hs * sizeof(float), stride = bytes;
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->k + dst * stride, (char *)kv->k + src * stride, bytes,
                               cudaMemcpyDeviceToDevice, g_cuda.stream));
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->v + dst * stride, (char *)kv->v + src * stride, bytes,
                               cudaMemcpyDeviceToDevice, g_cuda.stream));
}
