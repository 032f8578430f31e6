/* cuda_llama: the Llama family's block ops on the GPU (contracts in
 * backend.h; the CPU's cpu_llama.c is the reference tests/test_cuda_ops.c
 * checks them against): RMSNorm, rotary position embedding and SwiGLU,
 * forward and backward. Compiled here; run in the GPU check.
 *
 * Activations are of the backend's ACT type (fp32, bf16 or fp16), math in
 * fp32; weights, rstd and frequencies are fp32. Every output element is
 * written by one thread (no atomics): RMSNorm's dw is one thread per
 * column summing over rows in order, so results repeat run to run. */
#include <type_traits>

#include "cuda_internal.h"

/* ---- RMSNorm ---- */

/* Warp per row: rstd = 1/sqrt(mean(x^2) + eps), out = w * (x * rstd). */
template <typename A>
static __global__ void rmsnorm_forward_kernel(A *out, float *rstd, const A *inp, const float *w, int N, int C,
                                              float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const A *x = inp + (size_t)row * C;
    float ss = 0.f;
    for (int i = lane; i < C; i += 32) {
        float v = to_f(x[i]);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    if (lane == 0) rstd[row] = r;
    A *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) o[i] = from_f<A>(w[i] * (to_f(x[i]) * r));
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (N <= 0) return;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        rmsnorm_forward_kernel<A><<<(N + 7) / 8, 256, 0, g_cuda.stream>>>((A *)out, rstd, (const A *)inp, w, N, C, eps);
    });
    LAUNCH_CHECK();
}

/* Warp per row: dinp += r w dy - x r^3 / C * sum(w dy x). */
template <typename A>
static __global__ void rmsnorm_backward_dx_kernel(A *dinp, const A *dout, const A *inp, const float *w,
                                                  const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const A *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float r = rstd[row], dot = 0.f;
    for (int i = lane; i < C; i += 32) dot += w[i] * to_f(d[i]) * to_f(x[i]);
    float k = warp_sum(dot) * r * r * r / (float)C;
    A *di = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) di[i] = from_f<A>(to_f(di[i]) + r * w[i] * to_f(d[i]) - k * to_f(x[i]));
}

/* Thread per column: dw[c] += sum over rows of dy * x * rstd, in row order. */
template <typename A>
static __global__ void rmsnorm_backward_dw_kernel(float *dw, const A *dout, const A *inp, const float *rstd, int N,
                                                  int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int n = 0; n < N; n++) s += to_f(dout[(size_t)n * C + c]) * to_f(inp[(size_t)n * C + c]) * rstd[n];
    dw[c] += s;
}

void cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           const float *rstd, int N, int C) {
    if (N <= 0) return;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        rmsnorm_backward_dx_kernel<A><<<(N + 7) / 8, 256, 0, g_cuda.stream>>>((A *)dinp, (const A *)dout,
                                                                              (const A *)inp, w, rstd, N, C);
        LAUNCH_CHECK();
        rmsnorm_backward_dw_kernel<A><<<(C + 255) / 256, 256, 0, g_cuda.stream>>>(dw, (const A *)dout, (const A *)inp,
                                                                                  rstd, N, C);
    });
    LAUNCH_CHECK();
}

/* ---- rotary position embedding ---- */

/* Thread per (row, q or k head, pair j < hs/2): rotate (x_j, x_{j+hs/2}) by
 * dir * pos * freq[j], in place. */
template <typename A>
static __global__ void rope_kernel(A *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs,
                                   float dir) {
    int half = hs / 2, heads = NH + NKV;
    size_t n = (size_t)N * heads * half, row_len = (size_t)(NH + 2 * NKV) * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half), h = (int)((i / half) % heads);
        size_t r = i / ((size_t)half * heads);
        float s, c;
        sincosf((float)pos[r] * freq[j], &s, &c);
        s *= dir;
        A *x = qkv + r * row_len + (size_t)h * hs;
        float a = to_f(x[j]), b = to_f(x[j + half]);
        x[j] = from_f<A>(a * c - b * s);
        x[j + half] = from_f<A>(b * c + a * s);
    }
}

static void rope(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs, float dir) {
    size_t n = (size_t)N * (NH + NKV) * (hs / 2);
    if (n == 0) return;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        rope_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((A *)qkv, pos, freq, N, NH, NKV, hs, dir);
    });
    LAUNCH_CHECK();
}

void cuda_rope_forward(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    rope(qkv, pos, freq, N, NH, NKV, hs, 1.0f);
}

void cuda_rope_backward(float *dqkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    rope(dqkv, pos, freq, N, NH, NKV, hs, -1.0f);
}

/* ---- SwiGLU ---- */

/* out (N,H) = silu(gate) * up, inp (N,2H) = [gate | up] per row. */
template <typename A>
static __global__ void swiglu_forward_kernel(A *out, const A *inp, int N, int H) {
    size_t n = (size_t)N * H;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / H, k = i % H;
        float g = to_f(inp[r * 2 * H + k]), u = to_f(inp[r * 2 * H + H + k]);
        out[i] = from_f<A>(g / (1.0f + expf(-g)) * u);
    }
}

/* d gate = dy u s (1 + g (1 - s)), d up = dy g s, s = sigmoid(g). */
template <typename A>
static __global__ void swiglu_backward_kernel(A *dinp, const A *inp, const A *dout, int N, int H) {
    size_t n = (size_t)N * H;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / H, k = i % H;
        float g = to_f(inp[r * 2 * H + k]), u = to_f(inp[r * 2 * H + H + k]), d = to_f(dout[i]);
        float s = 1.0f / (1.0f + expf(-g));
        dinp[r * 2 * H + k] = from_f<A>(d * u * s * (1.0f + g * (1.0f - s)));
        dinp[r * 2 * H + H + k] = from_f<A>(d * g * s);
    }
}

void cuda_swiglu_forward(float *out, const float *inp, int N, int H) {
    size_t n = (size_t)N * H;
    if (n == 0) return;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        swiglu_forward_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((A *)out, (const A *)inp, N, H);
    });
    LAUNCH_CHECK();
}

void cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int H) {
    size_t n = (size_t)N * H;
    if (n == 0) return;
    with_act([&](auto act) {
        typedef std::decay_t<decltype(act)> A;
        swiglu_backward_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((A *)dinp, (const A *)inp,
                                                                                (const A *)dout, N, H);
    });
    LAUNCH_CHECK();
}
