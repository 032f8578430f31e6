/* cpu_llama: the CPU's ops of the Llama family's block (contracts in
 * backend.h; declared from the op list in cpu.h): RMSNorm, rotary position
 * embedding and SwiGLU, forward and backward.
 *
 * All three are memory-bound: one pass over rows, parallel over rows with
 * OpenMP, inner loops the compiler vectorizes (-march=native). The only sum
 * across rows, RMSNorm's dw, goes through per-thread partial sums added in
 * thread order, so results are reproducible for a thread count. */
#include "cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu_math.h"

#define PAR_MIN (1 << 15) /* elements below which a team is not worth waking */

void loom_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C, ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < C; i++) ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = w[i] * (x[i] * r);
    }
}

/* y = w * x * r, r = (mean(x^2) + eps)^-1/2:
 * dx = r * (w dy) - x * r^3 / C * sum(w dy x); dw += dy * x * r. */
void loom_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int N, int C) {
    int nt = (size_t)N * C > PAR_MIN ? omp_get_max_threads() : 1;
    float *part = loom_calloc((size_t)nt * C, sizeof(float));
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int n0 = (int)((long long)N * tid / nth), n1 = (int)((long long)N * (tid + 1) / nth);
        float *pw = part + (size_t)tid * C;
        for (int n = n0; n < n1; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float r = rstd[n], dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < C; i++) {
                dot += w[i] * d[i] * x[i];
                pw[i] += d[i] * x[i] * r;
            }
            float k = dot * r * r * r / (float)C;
            float *di = dinp + (size_t)n * C;
#pragma omp simd
            for (int i = 0; i < C; i++) di[i] += r * w[i] * d[i] - k * x[i];
        }
    }
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < C; i++) dw[i] += part[(size_t)t * C + i];
    free(part);
}

/* Rotate the query and key heads of N rows by +angle (dir 1) or -angle
 * (dir -1), Hugging Face's pairing (j, j + hs/2). */
static void rope(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs, float dir) {
    int half = hs / 2, heads = NH + NKV;
    size_t row = (size_t)(NH + 2 * NKV) * hs; /* q and k heads are the first NH + NKV of the row */
#pragma omp parallel for schedule(static) if ((size_t)N * heads * hs > PAR_MIN)
    for (int n = 0; n < N; n++) {
        float cs[512], sn[512]; /* hs/2 <= 512: head sizes up to 1024 */
        for (int j = 0; j < half; j++) {
            float a = (float)pos[n] * freq[j];
            cs[j] = cosf(a);
            sn[j] = dir * sinf(a);
        }
        for (int h = 0; h < heads; h++) {
            float *x = qkv + (size_t)n * row + (size_t)h * hs, *y = x + half;
#pragma omp simd
            for (int j = 0; j < half; j++) {
                float a = x[j], b = y[j];
                x[j] = a * cs[j] - b * sn[j];
                y[j] = b * cs[j] + a * sn[j];
            }
        }
    }
}

void loom_cpu_rope_forward(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    if (hs > 1024) loom_panic(__FILE__, __LINE__, "rope: head size %d above 1024", hs);
    rope(qkv, pos, freq, N, NH, NKV, hs, 1.0f);
}

void loom_cpu_rope_backward(float *dqkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    if (hs > 1024) loom_panic(__FILE__, __LINE__, "rope: head size %d above 1024", hs);
    rope(dqkv, pos, freq, N, NH, NKV, hs, -1.0f);
}

void loom_cpu_swiglu_forward(float *out, const float *inp, int N, int H) {
#pragma omp parallel for schedule(static) if ((size_t)N * H > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * H, *u = g + H;
        float *o = out + (size_t)n * H;
#pragma omp simd
        for (int i = 0; i < H; i++) o[i] = g[i] / (1.0f + loom_expf(-g[i])) * u[i];
    }
}

/* silu(g) = g s, s = sigmoid(g); d silu / dg = s (1 + g (1 - s)). */
void loom_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int H) {
#pragma omp parallel for schedule(static) if ((size_t)N * H > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * H, *u = g + H, *d = dout + (size_t)n * H;
        float *dg = dinp + (size_t)n * 2 * H, *du = dg + H;
#pragma omp simd
        for (int i = 0; i < H; i++) {
            float s = 1.0f / (1.0f + loom_expf(-g[i])), gi = g[i], ui = u[i], di = d[i];
            dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
            du[i] = di * gi * s;
        }
    }
}
