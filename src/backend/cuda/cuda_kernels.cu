/* cuda_kernels: the memory-bound ops of the CUDA backend. Each op is one or
 * two launches on g_cuda.stream; rows are handled warp-per-row, and loads are
 * 4-element vectors (16 bytes of fp32, 8 of bf16/fp16) where the row length
 * and the pointers allow it, with a scalar version of the same template
 * otherwise. ACT tensors are of type g_cuda.act (float, or bf16/fp16 when
 * the backend stores activations in 16 bits): every kernel over them is a
 * template on that type, widening on load and rounding on store, with the
 * arithmetic, the LayerNorm statistics and the losses in fp32. Accumulations use fp32
 * registers; the global reductions (sumsq) use double partials in a fixed
 * order, so they are deterministic. Two ops use atomics and are therefore not
 * bit-reproducible run to run: encoder_backward (dwte, tokens repeat) and the
 * shared-memory column sums of layernorm_backward. */
#include <math.h>

#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "cuda_internal.h"

/* ---- vector access: VEC = 4 loads 4 elements at once (float4 for fp32,
 * 8 bytes for 16-bit types), VEC = 1 one at a time; values are fp32 ---- */
template <int VEC> struct fvec {
    float v[VEC];
};
template <int VEC, typename T> __device__ __forceinline__ fvec<VEC> vload(const T *p) {
    fvec<VEC> r;
    if constexpr (VEC == 4 && sizeof(T) == 4) {
        float4 t = *reinterpret_cast<const float4 *>(p);
        r.v[0] = t.x, r.v[1] = t.y, r.v[2] = t.z, r.v[3] = t.w;
    } else if constexpr (VEC == 4) {
        union { uint2 u; T t[4]; } x;
        x.u = *reinterpret_cast<const uint2 *>(p);
#pragma unroll
        for (int i = 0; i < 4; i++) r.v[i] = to_f(x.t[i]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) r.v[i] = to_f(p[i]);
    }
    return r;
}
template <int VEC, typename T> __device__ __forceinline__ void vstore(T *p, const fvec<VEC> &r) {
    if constexpr (VEC == 4 && sizeof(T) == 4) {
        *reinterpret_cast<float4 *>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    } else if constexpr (VEC == 4) {
        union { uint2 u; T t[4]; } x;
#pragma unroll
        for (int i = 0; i < 4; i++) x.t[i] = from_f<T>(r.v[i]);
        *reinterpret_cast<uint2 *>(p) = x.u;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) p[i] = from_f<T>(r.v[i]);
    }
}
/* The element type of a with_act argument, as a type. */
#define ACT_T(x) std::decay_t<decltype(x)>

int cuda_grid(size_t n, int block) {
    size_t g = (n + (size_t)block - 1) / (size_t)block;
    size_t cap = (size_t)(g_cuda.num_sms > 0 ? g_cuda.num_sms : 80) * 32;
    if (g > cap) g = cap;
    return g < 1 ? 1 : (int)g;
}

/* ---- encoder ---- */

template <int VEC, typename A>
static __global__ void encoder_forward_kernel(A *out, const int *tokens, const float *wte,
                                       const float *wpe, int T, int C, size_t nvec) {
    int cv = C / VEC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / cv;
        int c = (int)(i % cv) * VEC;
        int t = (int)(row % T);
        int tok = tokens[row];
        fvec<VEC> a = vload<VEC>(wte + (size_t)tok * C + c);
        if (wpe) { /* NULL: rotary models, no position table */
            fvec<VEC> b = vload<VEC>(wpe + (size_t)t * C + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) a.v[k] += b.v[k];
        }
        vstore<VEC>(out + row * C + c, a);
    }
}

void cuda_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                          int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    with_act([&](auto a) {
        typedef ACT_T(a) A;
        A *o = (A *)out;
        if (C % 4 == 0 && aligned16(wte, wpe ? wpe : wte) && vec4_ok<A>(o))
            encoder_forward_kernel<4, A><<<cuda_grid(n / 4, 256), 256, 0, g_cuda.stream>>>(o, tokens, wte, wpe, T, C, n / 4);
        else
            encoder_forward_kernel<1, A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(o, tokens, wte, wpe, T, C, n);
    });
    LAUNCH_CHECK();
}

/* dwte, without atomics: the rows sorted by token (stable, so each token's
 * rows stay in row order), then one thread per (row, channel) where a
 * token's run of rows starts, summing the run in order. The same bits on
 * every run, graphs or not (docs/cuda.md, "What must be bitwise"). */
static __global__ void iota_kernel(int *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}
template <typename T>
static __global__ void encoder_backward_wte_kernel(float *dwte, const T *dout, const int *stok, const int *srow,
                                                   int N, int C, int v0, int nv) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i / C), c = (int)(i % C), tok = stok[j];
        if ((j > 0 && stok[j - 1] == tok) || tok < v0 || tok - v0 >= nv) continue; /* outside: another rank's row */
        float s = 0.f;
        for (int k = j; k < N && stok[k] == tok; k++) s += to_f(dout[(size_t)srow[k] * C + c]);
        dwte[(size_t)(tok - v0) * C + c] += s;
    }
}
/* dwpe: one thread per (t, channel) summing over the batch in order. */
template <typename A>
static __global__ void encoder_backward_wpe_kernel(float *dwpe, const A *dout, int B, int T, int C) {
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int b = 0; b < B; b++) s += to_f(dout[(size_t)b * n + i]);
        dwpe[i] += s;
    }
}

/* dwte's rows v0 .. v0+nv-1 (the whole table: 0, INT_MAX; a tensor-parallel
 * rank's vocabulary shard: its rows), dwpe's whole. */
static void encoder_backward_rows(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T, int C,
                                  int v0, int nv) {
    int N = B * T;
    size_t n = (size_t)N * C, sort_bytes = 0, bn = ((size_t)N * sizeof(int) + 255) & ~(size_t)255;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const int *)nullptr, (int *)nullptr,
                                               (const int *)nullptr, (int *)nullptr, N, 0, 32, g_cuda.stream));
    /* scratch: rows 0..N-1 | tokens sorted | their rows | the sort's own */
    char *sc = (char *)cuda_scratch(SCRATCH_ENC, 3 * bn + sort_bytes);
    int *rows = (int *)sc, *stok = (int *)(sc + bn), *srow = (int *)(sc + 2 * bn);
    iota_kernel<<<cuda_grid((size_t)N, 256), 256, 0, g_cuda.stream>>>(rows, N);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sc + 3 * bn, sort_bytes, tokens, stok, rows, srow, N, 0, 32,
                                               g_cuda.stream));
    with_act([&](auto a) {
        typedef ACT_T(a) A;
        encoder_backward_wte_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>(dwte, (const A *)dout, stok, srow,
                                                                                     N, C, v0, nv);
        LAUNCH_CHECK();
        if (dwpe) {
            encoder_backward_wpe_kernel<A><<<cuda_grid((size_t)T * C, 256), 256, 0, g_cuda.stream>>>(dwpe, (const A *)dout, B, T, C);
            LAUNCH_CHECK();
        }
    });
}

void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T, int C) {
    encoder_backward_rows(dwte, dwpe, dout, tokens, B, T, C, 0, INT_MAX);
}

void cuda_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T, int C,
                               int v0, int nv) {
    encoder_backward_rows(dwte, dwpe, dout, tokens, B, T, C, v0, nv);
}

/* ---- layernorm ---- */

/* Warp per row. With b_res != NULL the row is x = a + b_res, written to res
 * first (residual add fused into the same pass). Two-pass variance from the
 * row (re-read from L1/L2), as the CPU reference computes it. */
template <int VEC, typename T>
static __global__ void layernorm_forward_kernel(T *res, T *out, float *mean, float *rstd,
                                         const T *a, const T *b_res, const float *w,
                                         const float *bias, int N, int C) {
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * warps + threadIdx.x / 32;
    if (row >= N) return;
    const T *x = a + (size_t)row * C;
    const T *xr = b_res ? b_res + (size_t)row * C : nullptr;
    T *r = res ? res + (size_t)row * C : nullptr;
    float s = 0.f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        fvec<VEC> v = vload<VEC>(x + c);
        if (xr) {
            fvec<VEC> u = vload<VEC>(xr + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) v.v[k] = to_f(from_f<T>(v.v[k] + u.v[k])); /* the stored value */
            vstore<VEC>(r + c, v);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) s += v.v[k];
    }
    const T *src = xr ? r : x; /* this lane wrote r itself: visible to it */
    float m = warp_sum(s) / C;
    float q = 0.f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        fvec<VEC> v = vload<VEC>(src + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) q += (v.v[k] - m) * (v.v[k] - m);
    }
    float rs = rsqrtf(warp_sum(q) / C + 1e-5f);
    T *o = out + (size_t)row * C;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        fvec<VEC> v = vload<VEC>(src + c), wv = vload<VEC>(w + c), bv = vload<VEC>(bias + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) v.v[k] = (v.v[k] - m) * rs * wv.v[k] + bv.v[k];
        vstore<VEC>(o + c, v);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

void cuda_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                     const float *a, const float *b_res, const float *w,
                                     const float *b, int N, int C) {
    const int block = 256, rows_per_block = block / 32;
    int grid = (N + rows_per_block - 1) / rows_per_block;
    if (grid == 0) return;
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        A *r = (A *)res, *o = (A *)out;
        const A *x = (const A *)a, *xr = (const A *)b_res;
        if (C % 4 == 0 && aligned16(w, b) && vec4_ok<A>(o) && vec4_ok<A>(x) && vec4_ok<A>(r) && vec4_ok<A>(xr))
            layernorm_forward_kernel<4, A><<<grid, block, 0, g_cuda.stream>>>(r, o, mean, rstd, x, xr, w, b, N, C);
        else
            layernorm_forward_kernel<1, A><<<grid, block, 0, g_cuda.stream>>>(r, o, mean, rstd, x, xr, w, b, N, C);
    });
    LAUNCH_CHECK();
}

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C) {
    cuda_residual_layernorm_forward(nullptr, out, mean, rstd, inp, nullptr, w, b, N, C);
}

/* Warp per row, grid-stride over rows. dinp is accumulated directly. dw
 * and db: each warp sums its rows into its own slice of shared memory
 * (every lane owns fixed columns, so no atomics), then the warps' slices
 * are added in warp order and written as the block's partial (part:
 * gridDim.x x 2C), which layernorm_reduce_kernel adds in block order: the
 * result is the same bits on every run (docs/cuda.md, "What must be
 * bitwise"). */
template <int VEC, typename T>
static __global__ void layernorm_backward_kernel(T *dinp, float *part, const T *dout,
                                          const T *inp, const float *w, const float *mean,
                                          const float *rstd, int N, int C) {
    extern __shared__ float sh[]; /* per warp: dw (C), db (C) */
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *dw_s = sh + (size_t)warp * 2 * C, *db_s = dw_s + C;
    for (int c = lane; c < 2 * C; c += 32) dw_s[c] = 0.f;
    __syncwarp();
    for (int row = blockIdx.x * warps + warp; row < N; row += gridDim.x * warps) {
        const T *g = dout + (size_t)row * C, *x = inp + (size_t)row * C;
        float m = mean[row], rs = rstd[row];
        float s1 = 0.f, s2 = 0.f;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            fvec<VEC> gv = vload<VEC>(g + c), xv = vload<VEC>(x + c), wv = vload<VEC>(w + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float dn = wv.v[k] * gv.v[k];
                s1 += dn;
                s2 += dn * (xv.v[k] - m) * rs;
            }
        }
        float dmean = warp_sum(s1) / C, dnorm_mean = warp_sum(s2) / C;
        T *di = dinp + (size_t)row * C;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            fvec<VEC> gv = vload<VEC>(g + c), xv = vload<VEC>(x + c), wv = vload<VEC>(w + c);
            fvec<VEC> dv = vload<VEC>(di + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float norm = (xv.v[k] - m) * rs;
                db_s[c + k] += gv.v[k];
                dw_s[c + k] += gv.v[k] * norm;
                dv.v[k] += (wv.v[k] * gv.v[k] - dmean - norm * dnorm_mean) * rs;
            }
            vstore<VEC>(di + c, dv);
        }
    }
    __syncthreads();
    float *p = part + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float v = 0.f;
        for (int k = 0; k < warps; k++) v += sh[(size_t)k * 2 * C + c];
        p[c] = v;
    }
}

static __global__ void layernorm_reduce_kernel(float *dw, float *db, const float *part, int nblocks,
                                        int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.f, sb = 0.f;
    for (int i = 0; i < nblocks; i++) {
        sw += part[(size_t)i * 2 * C + c];
        sb += part[(size_t)i * 2 * C + C + c];
    }
    dw[c] += sw;
    db[c] += sb;
}

void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, int N, int C) {
    if (N <= 0) return;
    /* 8 warps per block while their slices fit in 96 KiB (C <= 1536), fewer
     * for wider rows; at least one (C <= 12288 fits 96 KiB) */
    int warps = (int)((96u << 10) / (2 * (size_t)C * sizeof(float)));
    warps = warps > 8 ? 8 : warps < 1 ? 1 : warps;
    const int block = 32 * warps;
    int grid = (N + warps - 1) / warps;
    if (grid > 2 * g_cuda.num_sms) grid = 2 * g_cuda.num_sms;
    size_t shmem = (size_t)warps * 2 * C * sizeof(float);
    float *part = (float *)cuda_scratch(SCRATCH_LN, (size_t)grid * 2 * C * sizeof(float));
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        /* vector loads when every row is aligned for them, else scalar */
        void (*kernel)(A *, float *, const A *, const A *, const float *, const float *, const float *, int, int) =
            C % 4 == 0 && aligned16(w) && vec4_ok<A>(dinp) && vec4_ok<A>(dout) && vec4_ok<A>(inp)
                ? layernorm_backward_kernel<4, A>
                : layernorm_backward_kernel<1, A>;
        if (shmem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
        kernel<<<grid, block, shmem, g_cuda.stream>>>((A *)dinp, part, (const A *)dout, (const A *)inp, w, mean, rstd, N, C);
    });
    LAUNCH_CHECK();
    layernorm_reduce_kernel<<<(C + 255) / 256, 256, 0, g_cuda.stream>>>(dw, db, part, grid, C);
    LAUNCH_CHECK();
}

/* ---- GELU (tanh approximation), residual, accumulate, bias ---- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* The elementwise ops as functors of (a[i], b[i]) for map_kernel. */
struct gelu_op {
    __device__ float operator()(float v, float) const {
        return 0.5f * v * (1.f + tanhf(GELU_SCALE * (v + 0.044715f * v * v * v)));
    }
};
struct gelu_grad_op { /* (inp, dout) -> dinp */
    __device__ float operator()(float v, float g) const {
        float th = tanhf(GELU_SCALE * (v + 0.044715f * v * v * v));
        float sech2 = 1.f - th * th;
        float local = 0.5f * (1.f + th) + v * 0.5f * sech2 * GELU_SCALE * (1.f + 3.f * 0.044715f * v * v);
        return g * local;
    }
};
struct add_op { /* with out == a it is dst += src */
    __device__ float operator()(float a, float b) const { return a + b; }
};

/* out[i] = f(a[i], b[i]) (b NULL: f(a[i], a[i])) over nvec vectors of VEC
 * elements, computed in fp32 whatever T is. */
template <int VEC, typename T, typename F>
static __global__ void map_kernel(T *out, const T *a, const T *b, size_t nvec, F f) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        fvec<VEC> x = vload<VEC>(a + i * VEC), y = b ? vload<VEC>(b + i * VEC) : x;
#pragma unroll
        for (int k = 0; k < VEC; k++) x.v[k] = f(x.v[k], y.v[k]);
        vstore<VEC>(out + i * VEC, x);
    }
}

/* Runs `launch(vec, offset, count)` for an elementwise op over n floats: the
 * float4 version (vec = 4) over the first n/4*4 when every pointer is
 * aligned, the scalar version (vec = 1) over the rest. `count` is in units
 * of vec. */
template <typename F> static void split_vec(size_t n, bool aligned, F launch) {
    size_t head = 0;
    if (aligned && n >= 4) {
        head = n / 4 * 4;
        launch(std::integral_constant<int, 4>(), (size_t)0, head / 4);
        LAUNCH_CHECK();
    }
    if (head < n) {
        launch(std::integral_constant<int, 1>(), head, n - head);
        LAUNCH_CHECK();
    }
}

/* out = f(a, b) over n elements of type A (b may be NULL: map_kernel). */
template <typename A, typename F> static void map_launch(A *out, const A *a, const A *b, size_t n, F f) {
    split_vec(n, vec4_ok<A>(out) && vec4_ok<A>(a) && (!b || vec4_ok<A>(b)), [&](auto vec, size_t o, size_t nv) {
        constexpr int V = decltype(vec)::value;
        map_kernel<V, A><<<cuda_grid(nv, 256), 256, 0, g_cuda.stream>>>(out + o, a + o, b ? b + o : nullptr, nv, f);
    });
}

void cuda_gelu_forward(float *out, const float *inp, size_t n) {
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        map_launch<A>((A *)out, (const A *)inp, nullptr, n, gelu_op());
    });
}

void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        map_launch<A>((A *)dinp, (const A *)inp, (const A *)dout, n, gelu_grad_op());
    });
}

void cuda_residual_forward(float *out, const float *a, const float *b, size_t n) {
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        map_launch<A>((A *)out, (const A *)a, (const A *)b, n, add_op());
    });
}

/* fp32 (F32 in ops.h): the trainer's loss sums, the bias gradients. */
void cuda_accumulate(float *dst, const float *src, size_t n) { map_launch<float>(dst, dst, src, n, add_op()); }

template <typename T> static __global__ void bias_add_kernel(T *out, const float *bias, int OC, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(to_f(out[i]) + bias[i % OC]);
}

void cuda_bias_add(float *out, const float *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        bias_add_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((A *)out, bias, OC, n);
    });
    LAUNCH_CHECK();
}

/* dbias[c] += sum over rows of dout[., c], in two deterministic steps:
 * blocks of (32 columns x 8 row-lanes) over chunks of rows, each writing
 * its chunk's column sums to part (chunks x OC), then the chunks added in
 * order. Enough chunks that the grid fills the GPU (4 blocks per SM):
 * with one chunk a GPT-2 layer had 24 to 96 blocks for 132 SMs. */
template <typename T>
static __global__ void bias_grad_kernel(float *part, const T *dout, int N, int OC, int rows_per_chunk) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * rows_per_chunk;
    int r1 = min(N, r0 + rows_per_chunk);
    float s = 0.f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) s += to_f(dout[(size_t)r * OC + c]);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int k = 1; k < 8; k++) s += sh[k][threadIdx.x];
        part[(size_t)blockIdx.y * OC + c] = s;
    }
}
static __global__ void bias_grad_sum_kernel(float *dbias, const float *part, int chunks, int OC) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float s = 0.f;
    for (int k = 0; k < chunks; k++) s += part[(size_t)k * OC + c];
    dbias[c] += s;
}

void cuda_bias_grad(float *dbias, const float *dout, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    int cols = (OC + 31) / 32, want = 4 * g_cuda.num_sms;
    int chunks = (want + cols - 1) / cols, most = (N + 63) / 64; /* at least 64 rows a chunk */
    chunks = chunks > most ? most : chunks < 1 ? 1 : chunks;
    int rows_per_chunk = (N + chunks - 1) / chunks;
    chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    float *part = (float *)cuda_scratch(SCRATCH_BIAS_PART, (size_t)chunks * OC * sizeof(float));
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        bias_grad_kernel<A><<<dim3(cols, chunks), dim3(32, 8), 0, g_cuda.stream>>>(part, (const A *)dout, N, OC,
                                                                                 rows_per_chunk);
    });
    LAUNCH_CHECK();
    bias_grad_sum_kernel<<<(OC + 255) / 256, 256, 0, g_cuda.stream>>>(dbias, part, chunks, OC);
    LAUNCH_CHECK();
}

/* ---- fused softmax + cross-entropy + gradient ---- */

/* Online (max, sum of exp) pair; m = -inf means "empty". */
struct msum {
    float m, s;
};
__device__ __forceinline__ msum msum_join(msum a, msum b) {
    if (a.m == -INFINITY) return b;
    if (b.m == -INFINITY) return a;
    float m = fmaxf(a.m, b.m);
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
/* One exp per element: rescale the running sum only when the max grows. */
__device__ __forceinline__ msum msum_add(msum a, float x) {
    if (x > a.m) return {x, a.s * expf(a.m - x) + 1.f}; /* expf(-inf) = 0 */
    return {a.m, a.s + expf(x - a.m)};
}

/* One block per row. Pass 1 finds the row's log-sum-exp over the first V
 * columns; pass 2 (when dloss != 0) overwrites the row with its gradient.
 * Nothing but the loss and the gradient is ever written. ROW_IN_SHARED:
 * pass 1 also keeps the row in shared memory (Vp elements of T: 100 KB of
 * bf16 for GPT-2's 50304) and pass 2 reads it from there, so the logits
 * cross the memory bus once each way instead of twice in and once out. */
template <int VEC, typename T, bool ROW_IN_SHARED>
static __global__ void crossentropy_kernel(float *losses, T *logits, const int *targets, int V,
                                    int Vp, float dloss_arg, const float *dloss_dev) {
    __shared__ msum warp_part[32];
    __shared__ float row_lse;
    extern __shared__ __align__(16) unsigned char ce_row_raw[];
    T *row_s = (T *)ce_row_raw;
    int row = blockIdx.x;
    T *x = logits + (size_t)row * Vp;
    int target = targets[row];
    float x_target = threadIdx.x == 0 ? to_f(x[target]) : 0.f; /* read before pass 2 writes */
    msum acc = {-INFINITY, 0.f};
    for (int j = threadIdx.x * VEC; j < (ROW_IN_SHARED ? Vp : V); j += blockDim.x * VEC) {
        fvec<VEC> v = vload<VEC>(x + j);
        if (ROW_IN_SHARED) vstore<VEC>(row_s + j, v); /* exact: v was read from T */
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (j + k < V) acc = msum_add(acc, v.v[k]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        msum other = {__shfl_xor_sync(0xffffffffu, acc.m, o),
                      __shfl_xor_sync(0xffffffffu, acc.s, o)};
        acc = msum_join(acc, other);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) warp_part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        msum t = warp_part[0];
        for (int w = 1; w < nwarps; w++) t = msum_join(t, warp_part[w]);
        row_lse = t.m + logf(t.s);
        losses[row] = row_lse - x_target;
    }
    __syncthreads();
    float dloss = dloss_dev ? *dloss_dev : dloss_arg;
    if (dloss == 0.f) return;
    float lse = row_lse;
    const T *src = ROW_IN_SHARED ? row_s : x;
    for (int j = threadIdx.x * VEC; j < Vp; j += blockDim.x * VEC) {
        fvec<VEC> v = vload<VEC>(src + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            int col = j + k;
            v.v[k] = col < V ? dloss * (expf(v.v[k] - lse) - (col == target ? 1.f : 0.f)) : 0.f;
        }
        vstore<VEC>(x + j, v);
    }
}

/* Shared memory a block may opt in to on this device (0 until asked). */
static int ce_smem_max(void) {
    static int dev = -1, most = 0;
    if (dev != g_cuda.device) {
        CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, g_cuda.device));
        dev = g_cuda.device;
    }
    return most;
}

template <int VEC, typename A>
static void crossentropy_row_launch(float *losses, A *x, const int *targets, int N, int V, int Vp, float dloss,
                                    const float *dloss_dev) {
    const int block = 512;
    /* the one-pass kernel when the row fits in shared memory, with 4 KiB
     * left for the block's own (warp partials) */
    size_t row_bytes = ((size_t)Vp * sizeof(A) + 15) & ~(size_t)15;
    if (row_bytes + 4096 <= (size_t)ce_smem_max()) {
        CUDA_CHECK(cudaFuncSetAttribute(crossentropy_kernel<VEC, A, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)row_bytes));
        crossentropy_kernel<VEC, A, true><<<N, block, row_bytes, g_cuda.stream>>>(losses, x, targets, V, Vp, dloss,
                                                                                 dloss_dev);
    } else {
        crossentropy_kernel<VEC, A, false><<<N, block, 0, g_cuda.stream>>>(losses, x, targets, V, Vp, dloss, dloss_dev);
    }
}

static void crossentropy_launch(float *losses, float *logits, const int *targets, int N, int V,
                                int Vp, float dloss, const float *dloss_dev) {
    if (N <= 0) return;
    with_act([&](auto act) {
        typedef ACT_T(act) A;
        A *x = (A *)logits;
        if (Vp % 4 == 0 && vec4_ok<A>(x))
            crossentropy_row_launch<4, A>(losses, x, targets, N, V, Vp, dloss, dloss_dev);
        else
            crossentropy_row_launch<1, A>(losses, x, targets, N, V, Vp, dloss, dloss_dev);
    });
    LAUNCH_CHECK();
}

void cuda_crossentropy(float *losses, float *logits, const int *targets, int N, int V, int Vp,
                       float dloss) {
    crossentropy_launch(losses, logits, targets, N, V, Vp, dloss, nullptr);
}

void cuda_crossentropy_dev(float *losses, float *logits, const int *targets, int N, int V,
                           int Vp, const float *scalars) {
    crossentropy_launch(losses, logits, targets, N, V, Vp, 0.f, scalars + 5);
}

/* ---- AdamW ---- */

/* scalars (device, may be NULL): lr, grad_scale, t, max_norm, sumsq (see
 * backend.h, adamw_dev). With them the step reads everything that changes
 * between steps from device memory, so a captured graph stays valid. */
template <int VEC>
static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t nvec, float lr,
                             float b1, float b2, float eps, float wd, float scale, float bc1,
                             float bc2, const float *scalars) {
    if (scalars) {
        float sumsq = scalars[4];
        if (!isfinite(sumsq)) return; /* overflowed gradients: skip the step */
        lr = scalars[0];
        scale = scalars[1];
        float t = scalars[2], max_norm = scalars[3];
        float norm = sqrtf(sumsq) * scale;
        if (max_norm > 0.f && norm > max_norm) scale *= max_norm / norm;
        bc1 = 1.f - powf(b1, t);
        bc2 = 1.f - powf(b2, t);
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        fvec<VEC> pv = vload<VEC>(p + i * VEC), gv = vload<VEC>(g + i * VEC);
        fvec<VEC> mv = vload<VEC>(m + i * VEC), vv = vload<VEC>(v + i * VEC);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float gr = gv.v[k] * scale;
            float mm = b1 * mv.v[k] + (1.f - b1) * gr;
            float vvv = b2 * vv.v[k] + (1.f - b2) * gr * gr;
            mv.v[k] = mm;
            vv.v[k] = vvv;
            float mhat = mm / bc1, vhat = vvv / bc2;
            pv.v[k] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * pv.v[k]);
        }
        vstore<VEC>(p + i * VEC, pv);
        vstore<VEC>(m + i * VEC, mv);
        vstore<VEC>(v + i * VEC, vv);
    }
}

static void adamw_launch(float *params, const float *grads, float *m, float *v, size_t n,
                         const loom_adamw_t *hp, const float *scalars) {
    float bc1 = 1.f - powf(hp->beta1, (float)hp->t), bc2 = 1.f - powf(hp->beta2, (float)hp->t);
    split_vec(n, aligned16(params, grads, m, v), [&](auto vec, size_t o, size_t nv) {
        constexpr int V = decltype(vec)::value;
        adamw_kernel<V><<<cuda_grid(nv, 256), 256, 0, g_cuda.stream>>>(
            params + o, grads + o, m + o, v + o, nv, hp->lr, hp->beta1, hp->beta2, hp->eps,
            hp->weight_decay, hp->grad_scale, bc1, bc2, scalars);
    });
}

void cuda_adamw(float *params, const float *grads, float *m, float *v, size_t n,
                const loom_adamw_t *hp) {
    adamw_launch(params, grads, m, v, n, hp, nullptr);
}

void cuda_adamw_dev(float *params, const float *grads, float *m, float *v, size_t n,
                    const loom_adamw_t *hp, const float *scalars) {
    adamw_launch(params, grads, m, v, n, hp, scalars);
}

/* ---- sum of squares: fixed grid, double partials, one final block ---- */

#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

static __global__ void sumsq_partial_kernel(double *part, const float *x, size_t n) {
    __shared__ double sh[SUMSQ_THREADS / 32];
    float s = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    double d = warp_sum_d((double)s);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < SUMSQ_THREADS / 32; w++) t += sh[w];
        part[blockIdx.x] = t;
    }
}

/* One block of 1024 threads: total of the partials; writes *out_d and/or
 * adds to *acc_f. */
static __global__ void sumsq_final_kernel(double *out_d, float *acc_f, const double *part, int nparts) {
    __shared__ double sh[32];
    double d = threadIdx.x < (unsigned)nparts ? part[threadIdx.x] : 0.0;
    d = warp_sum_d(d);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < 32; w++) t += sh[w];
        if (out_d) *out_d = t;
        if (acc_f) *acc_f += (float)t;
    }
}

static void sumsq_launch(double *out_d, float *acc_f, const float *x, size_t n) {
    size_t g = (n + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    int grid = g > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : (g < 1 ? 1 : (int)g);
    sumsq_partial_kernel<<<grid, SUMSQ_THREADS, 0, g_cuda.stream>>>(g_cuda.reduce, x, n);
    LAUNCH_CHECK();
    sumsq_final_kernel<<<1, 1024, 0, g_cuda.stream>>>(out_d, acc_f, g_cuda.reduce, grid);
    LAUNCH_CHECK();
}

double cuda_sumsq(const float *x, size_t n) {
    if (cuda_capturing())
        loom_panic(__FILE__, __LINE__, "sumsq was called while a CUDA graph was being captured; it returns to the "
                                       "host, so use sumsq_dev inside a graph");
    double r = 0;
    sumsq_launch(g_cuda.reduce + SUMSQ_BLOCKS, nullptr, x, n);
    CUDA_CHECK(cudaMemcpyAsync(&r, g_cuda.reduce + SUMSQ_BLOCKS, sizeof r,
                               cudaMemcpyDeviceToHost, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    return r;
}

void cuda_sumsq_dev(float *acc, const float *x, size_t n) { sumsq_launch(nullptr, acc, x, n); }

cudaError_t cuda_kernels_probe(void) {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, sumsq_final_kernel);
}

/* ---- fp32 <-> 16-bit copies (cuDNN's attention reads and writes 16-bit) ---- */

template <typename T> static __global__ void to_lp_kernel(T *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<T>(src[i]);
}
template <typename T> static __global__ void from_lp_kernel(float *dst, const T *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_f(src[i]);
}

void cuda_to_lp16_on(cudaStream_t stream, void *dst, const float *src, size_t n, bool bf16) {
    if (n == 0) return;
    if (bf16)
        to_lp_kernel<<<cuda_grid(n, 256), 256, 0, stream>>>((__nv_bfloat16 *)dst, src, n);
    else
        to_lp_kernel<<<cuda_grid(n, 256), 256, 0, stream>>>((__half *)dst, src, n);
}

void cuda_from_lp16_on(cudaStream_t stream, float *dst, const void *src, size_t n, bool bf16) {
    if (n == 0) return;
    if (bf16)
        from_lp_kernel<<<cuda_grid(n, 256), 256, 0, stream>>>(dst, (const __nv_bfloat16 *)src, n);
    else
        from_lp_kernel<<<cuda_grid(n, 256), 256, 0, stream>>>(dst, (const __half *)src, n);
}

void cuda_to_lp16(void *dst, const float *src, size_t n, bool bf16) {
    cuda_to_lp16_on(g_cuda.stream, dst, src, n, bf16);
    LAUNCH_CHECK();
}

void cuda_from_lp16(float *dst, const void *src, size_t n, bool bf16) {
    cuda_from_lp16_on(g_cuda.stream, dst, src, n, bf16);
    LAUNCH_CHECK();
}

void cuda_act_from_f32(void *dst, const float *src, size_t n) { cuda_to_lp16(dst, src, n, g_cuda.act == LOOM_BF16); }
void cuda_act_to_f32(float *dst, const void *src, size_t n) { cuda_from_lp16(dst, src, n, g_cuda.act == LOOM_BF16); }
