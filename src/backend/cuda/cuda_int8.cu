/* cuda_int8: int8 weights on the GPU (ops.h VARIANT rows matmul_forward_w8
 * and matmul_forward_w8a8), the same contract as the CPU's cpu_int8.c.
 * Compiled, not yet run on a GPU.
 *
 * W8A8 runs the int8 x int8 -> int32 product on cuBLASLt's integer tensor
 * cores (IMMA). cuBLASLt takes int8 in its plain column-major order only
 * as "TN" (A transposed, B not), with m and k multiples of 4, the leading
 * dimensions of A, B and C multiples of 4 and every pointer 4-byte aligned
 * (16 for its faster kernels). Row-major out (N,OC) = xq (N,C) wq (OC,C)^T
 * is column-major out^T (OC,N) = wq^T... written as A = wq stored (C,OC)
 * ld C and transposed, B = xq stored (C,N) ld C: exactly TN, m = OC,
 * k = C, n = N; so the rule is OC % 4 == 0 and C % 4 == 0 (GPT-2's widths
 * all are). Other shapes, or a cuBLASLt without an algorithm, run an own
 * dp4a kernel: the int32 sums are exact either way, so both give the same
 * bits. Around it: a kernel quantizing each activation row (the CPU's
 * rounding, op for op: IEEE division and round-half-away) and an epilogue
 * kernel applying sx[n] * sw[o] and the bias; GELU is the backend's GELU
 * kernel. Per-block scales (block 32) do not factor out of a row's int32
 * sum and IMMA has no per-block scaling, so they run an own kernel: the
 * activations quantized per block of the weight's size too (as the CPU,
 * llama.cpp's Q8_0 x Q8_0), each block's int32 sum by dp4a, times its
 * weight scale times its activation scale, summed in block order.
 *
 * W8A16/W8A32 (activations are fp32 at the op table's seam, so both are
 * this path): decode reads each weight once per step whatever the number
 * of sequences, so for up to W8_KERNEL_MAX_N rows one warp per output row
 * streams the int8 row (4 bytes a lane), widens and scales it in
 * registers and multiplies it into up to 8 activation rows at a time: a
 * quarter of fp32's weight bytes. Above that (prefill) the product is
 * compute-bound, and CUDA cores would lose to tensor cores: the weight is
 * dequantized into scratch and the backend's cuBLASLt matmul runs at the
 * run's dtype. */
#include <string.h>

#include <type_traits>

#include "cuda_int8.h"

/* ACT tensors (inp, out, qkv) are of type g_cuda.act; with_act, to_f and
 * from_f come from cuda_internal.h. */
#define ACT_TYPE(act) typedef std::decay_t<decltype(act)> A

#define W8_KERNEL_MAX_N 32 /* rows up to which the in-kernel dequantization runs */
#define W8_ROWS 8          /* activation rows per pass of the weight row */
#define W8_WARPS 8         /* warps (output rows) per block */

/* ---- W8A16 / W8A32: dequantize in the kernel ---- */

/* Scale of weight element c of a row whose scales start at sc: each weight
 * is widened and scaled before the product, as the CPU's row kernel does. */
__device__ __forceinline__ float w8_scale(const float *sc, int block, int c) { return block ? sc[c / block] : sc[0]; }

/* Four activations of row x from column c (VEC 4), or one. */
template <int VEC, typename A> __device__ __forceinline__ void load_x(float *xv, const A *x) {
    if constexpr (VEC == 4 && std::is_same<A, float>::value) {
        float4 v = __ldg(reinterpret_cast<const float4 *>(x));
        xv[0] = v.x, xv[1] = v.y, xv[2] = v.z, xv[3] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) xv[i] = to_f(x[i]);
    }
}

/* One warp per output row o: out[n, o] for every n. VEC 4: char4 weight
 * loads and 4-wide activation loads (C % 4 == 0, block % 4 == 0, aligned). */
template <int VEC, typename A>
__global__ void w8_rows_kernel(A *out, const A *inp, const int8_t *w, const float *scales, int block,
                               const float *bias, int N, int C, int OC) {
    int o = blockIdx.x * W8_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= OC) return;
    const int8_t *wr = w + (size_t)o * C;
    const float *sc = block ? scales + (size_t)o * (C / block) : scales + o;
    for (int n0 = 0; n0 < N; n0 += W8_ROWS) {
        float acc[W8_ROWS];
#pragma unroll
        for (int k = 0; k < W8_ROWS; k++) acc[k] = 0.f;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            float wf[VEC], xv[VEC], s = w8_scale(sc, block, c);
            if constexpr (VEC == 4) {
                char4 q = *reinterpret_cast<const char4 *>(wr + c);
                wf[0] = q.x * s, wf[1] = q.y * s, wf[2] = q.z * s, wf[3] = q.w * s;
            } else {
                wf[0] = wr[c] * s;
            }
#pragma unroll
            for (int k = 0; k < W8_ROWS; k++) {
                if (n0 + k >= N) break;
                load_x<VEC>(xv, inp + (size_t)(n0 + k) * C + c);
#pragma unroll
                for (int i = 0; i < VEC; i++) acc[k] += xv[i] * wf[i];
            }
        }
#pragma unroll
        for (int k = 0; k < W8_ROWS; k++) {
            float v = warp_sum(acc[k]); /* every lane joins the shuffle */
            if (lane == 0 && n0 + k < N)
                out[(size_t)(n0 + k) * OC + o] = from_f<A>(v + (bias ? bias[o] : 0.f));
        }
    }
}

/* wd (OC,C) fp32 = dequant(w): the prefill path's weight. */
__global__ void w8_dequantize_kernel(float *wd, const int8_t *w, const float *scales, int block, int C, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C;
        int c = (int)(i % C);
        wd[i] = w[i] * (block ? scales[r * (C / block) + c / block] : scales[r]);
    }
}

void cuda_matmul_forward_w8(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C,
                            int OC, int gelu) {
    if (N <= 0 || OC <= 0) return;
    const int8_t *wq = (const int8_t *)w->data;
    if (N > W8_KERNEL_MAX_N) {
        size_t n = (size_t)OC * C;
        float *wd = (float *)cuda_scratch(SCRATCH_QUANT, n * sizeof(float));
        w8_dequantize_kernel<<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(wd, wq, w->scales, w->block, C, n);
        LAUNCH_CHECK();
        cuda_matmul_forward(out, inp, wd, bias, N, C, OC);
    } else {
        bool vec = C % 4 == 0 && w->block % 4 == 0 && aligned16(inp) && ((uintptr_t)wq & 3) == 0;
        int blocks = (OC + W8_WARPS - 1) / W8_WARPS;
        with_act([&](auto act) {
            ACT_TYPE(act);
            if (vec)
                w8_rows_kernel<4, A><<<blocks, 32 * W8_WARPS, 0, g_cuda.stream>>>(
                    (A *)out, (const A *)inp, wq, w->scales, w->block, bias, N, C, OC);
            else
                w8_rows_kernel<1, A><<<blocks, 32 * W8_WARPS, 0, g_cuda.stream>>>(
                    (A *)out, (const A *)inp, wq, w->scales, w->block, bias, N, C, OC);
        });
        LAUNCH_CHECK();
    }
    if (gelu) cuda_gelu_forward(out, out, (size_t)N * OC);
}

/* ---- W8A8 ---- */

/* One warp per row: s[n] = max |x| / 127 (1 for a zero row), q = round(x /
 * s) clamped to +-127: loom_cpu_quantize_rows, op for op (__fdiv_rn and
 * __fmul_rn keep nvcc from contracting or approximating). */
template <typename A> __global__ void quantize_rows_kernel(int8_t *q, float *s, const A *x, int N, int C) {
    int n = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const A *r = x + (size_t)n * C;
    float mx = 0.f;
    for (int c = lane; c < C; c += 32) mx = fmaxf(mx, fabsf(to_f(r[c])));
    mx = warp_max(mx);
    float sc = mx > 0.f ? __fdiv_rn(mx, 127.f) : 1.f, inv = __fdiv_rn(1.f, sc);
    if (lane == 0) s[n] = sc;
    for (int c = lane; c < C; c += 32) {
        float v = roundf(__fmul_rn(to_f(r[c]), inv));
        q[(size_t)n * C + c] = (int8_t)(v > 127.f ? 127 : v < -127.f ? -127 : (int)v);
    }
}

/* acc (N,OC) int32 = xq (N,C) . wq (OC,C) rows, one thread per output:
 * where cuBLASLt cannot. dp4a on 4 bytes at a time when aligned. */
__global__ void int8_dot_kernel(int32_t *acc, const int8_t *xq, const int8_t *wq, int N, int C, int OC, int vec) {
    size_t n_out = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_out; i += (size_t)gridDim.x * blockDim.x) {
        const int8_t *x = xq + (i / OC) * C, *w = wq + (i % OC) * C;
        int32_t s = 0;
        int c = 0;
        if (vec)
            for (; c + 4 <= C; c += 4)
                s = __dp4a(*reinterpret_cast<const int *>(x + c), *reinterpret_cast<const int *>(w + c), s);
        for (; c < C; c++) s += (int32_t)x[c] * (int32_t)w[c];
        acc[i] = s;
    }
}

/* out (N,OC) = acc * (sx[n] * sw[o]) + bias: the CPU's order of operations. */
template <typename A>
__global__ void w8a8_epilogue_kernel(A *out, const int32_t *acc, const float *sx, const float *sw,
                                     const float *bias, int N, int OC) {
    size_t n_out = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_out; i += (size_t)gridDim.x * blockDim.x) {
        int o = (int)(i % OC);
        float v = __fmul_rn((float)acc[i], __fmul_rn(sx[i / OC], sw[o]));
        out[i] = from_f<A>(bias ? __fadd_rn(v, bias[o]) : v);
    }
}

/* W8A8 with per-block scales (block 32, llama.cpp's Q8_0 form): a block's
 * scales do not factor out of a row's int32 sum, so one thread per output
 * takes each block's exact int32 sum (dp4a when aligned), converts it and
 * multiplies by the block's weight scale times its activation block's scale
 * sx[n][b], summing the blocks in order, then adds the bias: the CPU's w8a8
 * per-block arithmetic. */
template <typename A>
__global__ void w8a8_blocks_kernel(A *out, const int8_t *xq, const float *sx, const int8_t *wq, const float *ws,
                                   int block, const float *bias, int N, int C, int OC, int vec) {
    size_t n_out = (size_t)N * OC;
    int nb = C / block;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_out; i += (size_t)gridDim.x * blockDim.x) {
        int o = (int)(i % OC);
        const int8_t *x = xq + (i / OC) * C, *w = wq + (size_t)o * C;
        float f = 0.f;
        for (int b = 0; b < nb; b++) {
            int32_t d = 0;
            int c = b * block;
            if (vec)
                for (; c + 4 <= (b + 1) * block; c += 4)
                    d = __dp4a(*reinterpret_cast<const int *>(x + c), *reinterpret_cast<const int *>(w + c), d);
            for (; c < (b + 1) * block; c++) d += (int32_t)x[c] * (int32_t)w[c];
            f = __fadd_rn(f, __fmul_rn((float)d, __fmul_rn(ws[(size_t)o * nb + b], sx[(i / OC) * nb + b])));
        }
        float v = f;
        out[i] = from_f<A>(bias ? __fadd_rn(v, bias[o]) : v);
    }
}

/* cuBLASLt's answer for one IMMA shape, asked once. */
typedef struct {
    int used, found, m, n, k, align;
    cublasLtMatmulAlgo_t algo;
} imma_entry;
#define IMMA_CACHE 128
static imma_entry g_imma[IMMA_CACHE];

/* Largest power of two (<= 16) dividing every address. */
static int align_of(const void *a, const void *b, const void *c) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    int r = 16;
    while (r > 1 && x % (uintptr_t)r) r /= 2;
    return r;
}

/* The cached algorithm for (m, n, k, align); false when cuBLASLt has none. */
static bool imma_algo(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                      cublasLtMatrixLayout_t lc, int m, int n, int k, int align, cublasLtMatmulAlgo_t *algo) {
    imma_entry *slot = &g_imma[((unsigned)m * 31u + (unsigned)n * 17u + (unsigned)k * 7u + (unsigned)align) % IMMA_CACHE];
    if (slot->used && slot->m == m && slot->n == n && slot->k == k && slot->align == align) {
        *algo = slot->algo;
        return slot->found;
    }
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = g_cuda.workspace_bytes;
    uint32_t al = (uint32_t)align;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulPreferenceAttributes_t attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_cuda.lt, op, la, lb, lc, lc, pref, 1, &res, &nres);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    slot->used = 1, slot->m = m, slot->n = n, slot->k = k, slot->align = align;
    slot->found = st == CUBLAS_STATUS_SUCCESS && nres > 0;
    if (slot->found) slot->algo = *algo = res.algo;
    return slot->found;
}

/* acc (N,OC) int32 = xq (N,C) wq (OC,C)^T on IMMA, as column-major
 * acc^T (OC,N) = op(A) B with A = wq stored (C,OC) ld C transposed, B = xq
 * stored (C,N) ld C. False (nothing launched) when cuBLASLt cannot. */
static bool imma_matmul(int32_t *acc, const int8_t *wq, const int8_t *xq, int N, int C, int OC) {
    int align = align_of(acc, wq, xq);
    if (OC % 4 || C % 4 || align < 4) return false;
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, lc;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, C, OC, C));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, C, N, C));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, OC, N, OC));
    cublasLtMatmulAlgo_t algo;
    bool found = imma_algo(op, la, lb, lc, OC, N, C, align, &algo);
    if (found) {
        const int32_t alpha = 1, beta = 0;
        CUBLAS_CHECK(cublasLtMatmul(g_cuda.lt, op, &alpha, wq, la, xq, lb, &beta, acc, lc, acc, lc, &algo,
                                    g_cuda.workspace, g_cuda.workspace_bytes, g_cuda.stream));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
    return found;
}

/* Bytes rounded up to 256, so that each part of the scratch stays aligned. */
static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

void cuda_matmul_forward_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N,
                              int C, int OC, int gelu) {
    if (N <= 0 || OC <= 0) return;
    /* scratch: acc (N,OC) int32 (per-row scales only) | xq (N,C) int8 | sx (N, nb) fp32, nb activation
     * blocks a row (the weight's blocks; 1 with per-row scales) */
    int nb = w->block ? C / w->block : 1, xc = C / nb;
    size_t b_acc = w->block ? 0 : round256((size_t)N * OC * 4), b_xq = round256((size_t)N * C);
    char *s = (char *)cuda_scratch(SCRATCH_QUANT, b_acc + b_xq + (size_t)N * nb * 4);
    int32_t *acc = (int32_t *)s;
    int8_t *xq = (int8_t *)(s + b_acc);
    float *sx = (float *)(s + b_acc + b_xq);
    const int8_t *wq = (const int8_t *)w->data;
    int vec = C % 4 == 0 && w->block % 4 == 0 && ((uintptr_t)wq & 3) == 0, grid = cuda_grid((size_t)N * OC, 256);
    with_act([&](auto act) {
        ACT_TYPE(act);
        /* each activation block a row of its own: the rows are contiguous */
        quantize_rows_kernel<A><<<(N * nb + 3) / 4, 128, 0, g_cuda.stream>>>(xq, sx, (const A *)inp, N * nb, xc);
    });
    LAUNCH_CHECK();
    if (w->block) {
        with_act([&](auto act) {
            ACT_TYPE(act);
            w8a8_blocks_kernel<A><<<grid, 256, 0, g_cuda.stream>>>((A *)out, xq, sx, wq, w->scales, w->block, bias,
                                                                   N, C, OC, vec);
        });
    } else {
        if (!imma_matmul(acc, wq, xq, N, C, OC)) {
            int8_dot_kernel<<<grid, 256, 0, g_cuda.stream>>>(acc, xq, wq, N, C, OC, vec);
            LAUNCH_CHECK();
        }
        with_act([&](auto act) {
            ACT_TYPE(act);
            w8a8_epilogue_kernel<A><<<grid, 256, 0, g_cuda.stream>>>((A *)out, acc, sx, w->scales, bias, N, OC);
        });
    }
    LAUNCH_CHECK();
    if (gelu) cuda_gelu_forward(out, out, (size_t)N * OC);
}

/* ---- int8 paged KV cache ---- */

/* Token `off` of one cache row (int8, scale *scp) gets v (hs), by one warp:
 * kv_put of cpu_int8.c, op for op. A row's scale is set by its token at
 * offset 0 and can only rise; a rise requantizes the tokens already there. */
template <typename A>
__device__ void kv_put_warp(int8_t *row, float *scp, const A *v, int off, int hs, int lane) {
    float mx = 0.f, sc = *scp;
    for (int e = lane; e < hs; e += 32) mx = fmaxf(mx, fabsf(to_f(v[e])));
    mx = warp_max(mx);
    if (off == 0) {
        sc = mx > 0.f ? __fdiv_rn(mx, 127.f) : 1.f;
    } else if (mx > __fmul_rn(127.f, sc)) {
        float ns = __fdiv_rn(mx, 127.f), k = __fdiv_rn(sc, ns);
        for (int j = lane; j < off * hs; j += 32) row[j] = (int8_t)lroundf(__fmul_rn((float)row[j], k));
        sc = ns;
    }
    float inv = __fdiv_rn(1.f, sc);
    for (int e = lane; e < hs; e += 32) {
        float q = roundf(__fmul_rn(to_f(v[e]), inv));
        row[(size_t)off * hs + e] = (int8_t)(q > 127.f ? 127 : q < -127.f ? -127 : (int)q);
    }
    __syncwarp(); /* every lane has read *scp and written its bytes before the next token */
    if (lane == 0) *scp = sc;
    __syncwarp();
}

/* One warp per (K or V, head, batch row i). Only tokens in the same cache
 * block touch the same row (and its scale), and the CPU writes them in
 * batch order; so the warp of the first row of the batch in each block
 * writes that block's tokens in batch order and the others return. A
 * prefill chunk then runs one warp per (block, K or V, head), not one per
 * (K or V, head) over the whole chunk. */
template <typename A>
__global__ void kv_write_int8_kernel(int8_t *kv, float *scales, const A *qkv, const int *slot, int N, int NH,
                                     int NKV, int bs, int hs) {
    int warp = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp >= 2 * NKV * N) return;
    int task = warp / N, i = warp % N, which = task / NKV, h = task % NKV, C = NH * hs, blk = slot[i] / bs;
    size_t QR = (size_t)C + 2 * (size_t)NKV * hs; /* qkv's row: NH query heads, NKV keys, NKV values */
    bool earlier = false;
    for (int j = lane; j < i; j += 32) earlier |= slot[j] / bs == blk;
    if (__any_sync(0xffffffffu, earlier)) return;
    size_t r = ((size_t)blk * 2 + which) * NKV + h;
    for (int j = i; j < N; j++) {
        if (slot[j] / bs != blk) continue;
        kv_put_warp(kv + r * (size_t)bs * hs, scales + r, qkv + (size_t)j * QR + C + (size_t)which * NKV * hs + h * hs,
                    slot[j] % bs, hs, lane);
    }
}

void cuda_kv_write_int8(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs) {
    int hs = (int)(kv->cols / bs), warps = 2 * NKV * N;
    if (N <= 0) return;
    with_act([&](auto act) {
        ACT_TYPE(act);
        kv_write_int8_kernel<A><<<(warps + 3) / 4, 128, 0, g_cuda.stream>>>(
            (int8_t *)kv->data, (float *)kv->scales, (const A *)qkv, slot, N, NH, NKV, bs, hs);
    });
    LAUNCH_CHECK();
}

/* Block src to block dst: its int8 rows and their 2 * NH scales. */
void cuda_kv_copy_block_int8(const loom_tensor_t *kv, int src, int dst, int NH) {
    size_t n = 2 * (size_t)NH * (size_t)kv->cols, ns = 2 * (size_t)NH * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync((int8_t *)kv->data + (size_t)dst * n, (const int8_t *)kv->data + (size_t)src * n, n,
                               cudaMemcpyDeviceToDevice, g_cuda.stream));
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->scales + (size_t)dst * ns, (const char *)kv->scales + (size_t)src * ns,
                               ns, cudaMemcpyDeviceToDevice, g_cuda.stream));
}
