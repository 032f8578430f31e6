/* cuda_tp: the ops of a tensor-parallel rank's vocabulary shard on the
 * GPU (contracts in backend.h; cpu.c's loom_cpu_vocab_* are the
 * reference): the embedding of the shard's rows and the two halves of the
 * cross-entropy on sharded logits (the embedding's backward is
 * cuda_encoder_backward's sorted pass over the shard's rows, in
 * cuda_kernels.cu). Compiled here, not
 * yet run on a GPU.
 *
 * Activations are of the backend's ACT type, math in fp32. Every output
 * element is written by one thread, summing in row order (no atomics), so
 * results repeat run to run. */
#include <type_traits>

#include "cuda_internal.h"

#define TP_ACT(x) std::decay_t<decltype(x)>

template <typename A>
static __global__ void vocab_embed_forward_kernel(A *out, const int *tokens, const float *wte, const float *wpe, int T,
                                                  int C, int v0, int nv, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / C;
        int c = (int)(i % C), tok = tokens[row] - v0;
        float v = tok >= 0 && tok < nv ? wte[(size_t)tok * C + c] : 0.f;
        if (wpe) v += wpe[(size_t)(row % T) * C + c];
        out[i] = from_f<A>(v);
    }
}

void cuda_vocab_embed_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T, int C,
                              int v0, int nv) {
    size_t n = (size_t)B * T * C;
    with_act([&](auto a) {
        typedef TP_ACT(a) A;
        vocab_embed_forward_kernel<A><<<cuda_grid(n, 256), 256, 0, g_cuda.stream>>>((A *)out, tokens, wte, wpe, T, C, v0,
                                                                                    nv, n);
    });
    LAUNCH_CHECK();
}

/* A warp per row: max, then the sum of exp against it, then the target. */
template <typename A>
static __global__ void vocab_ce_stats_kernel(float *stats, const A *logits, const int *targets, int N, int Vp, int v0,
                                             int nv) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const A *z = logits + (size_t)row * Vp;
    float mx = -INFINITY;
    for (int i = lane; i < nv; i += 32) mx = fmaxf(mx, to_f(z[i]));
    mx = warp_max(mx);
    float s = 0.f;
    for (int i = lane; i < nv; i += 32) s += expf(to_f(z[i]) - mx);
    s = warp_sum(s);
    if (lane) return;
    int y = targets[row] - v0;
    stats[3 * row] = mx;
    stats[3 * row + 1] = s;
    stats[3 * row + 2] = y >= 0 && y < nv ? to_f(z[y]) : 0.f;
}

void cuda_vocab_ce_stats(float *stats, const float *logits, const int *targets, int N, int Vp, int v0, int nv) {
    with_act([&](auto a) {
        typedef TP_ACT(a) A;
        vocab_ce_stats_kernel<A><<<(N + 7) / 8, 256, 0, g_cuda.stream>>>(stats, (const A *)logits, targets, N, Vp, v0, nv);
    });
    LAUNCH_CHECK();
}

/* A warp per row: the ranks' statistics combined (every lane the same,
 * in rank order), then the shard's gradient. */
template <typename A>
static __global__ void vocab_ce_finish_kernel(float *losses, A *logits, const int *targets, const float *stats, int ranks,
                                              int N, int Vp, int v0, int nv, float dloss) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    float mx = -INFINITY, zy = 0.f, sum = 0.f;
    for (int r = 0; r < ranks; r++) {
        const float *s = stats + ((size_t)r * N + row) * 3;
        mx = fmaxf(mx, s[0]);
        zy += s[2];
    }
    for (int r = 0; r < ranks; r++) {
        const float *s = stats + ((size_t)r * N + row) * 3;
        if (s[1] > 0.f) sum += s[1] * expf(s[0] - mx);
    }
    if (lane == 0) losses[row] = logf(sum) + mx - zy;
    if (dloss == 0.f) return;
    A *z = logits + (size_t)row * Vp;
    int y = targets[row] - v0;
    float scale = dloss / sum;
    for (int i = lane; i < Vp; i += 32) {
        float g = i < nv ? expf(to_f(z[i]) - mx) * scale - (i == y ? dloss : 0.f) : 0.f;
        z[i] = from_f<A>(g);
    }
}

void cuda_vocab_ce_finish(float *losses, float *logits, const int *targets, const float *stats, int ranks, int N, int Vp,
                          int v0, int nv, float dloss) {
    with_act([&](auto a) {
        typedef TP_ACT(a) A;
        vocab_ce_finish_kernel<A><<<(N + 7) / 8, 256, 0, g_cuda.stream>>>(losses, (A *)logits, targets, stats, ranks, N, Vp,
                                                                          v0, nv, dloss);
    });
    LAUNCH_CHECK();
}
