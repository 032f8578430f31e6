/* The CPU backend: OpenMP loops and BLAS (cblas_sgemm). The reference that
 * every other backend is tested against. Deterministic for a given thread
 * count: every parallel loop uses a static schedule and every reduction
 * runs in a fixed order. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static int cpu_threads = 1;

int loom_backend_cpu_threads(void) { return cpu_threads; }

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_sync(void) {}

static void encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tokens[b * T + t] * C;
            const float *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

/* Parallel over channel blocks, so that two positions with the same token
 * never race and the sum order is fixed. */
static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C) {
    const int CB = 16;
    int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)tokens[b * T + t] * C;
                float *wp = dwpe + (size_t)t * C;
                for (int i = c0; i < c1; i++) {
                    we[i] += d[i];
                    wp[i] += d[i];
                }
            }
    }
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        float var = 0;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            var += d * d;
        }
        var /= C;
        float s = 1.0f / sqrtf(var + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dinp is per row (parallel over rows); dw and db sum over rows, so each
 * thread sums a fixed contiguous range of rows into its own slot and the
 * slots are added in thread order. */
static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
    int nt = omp_get_max_threads();
    float *part = calloc((size_t)nt * 2 * C, sizeof(float));
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int n0 = (int)((long long)N * tid / nth), n1 = (int)((long long)N * (tid + 1) / nth);
        float *pw = part + (size_t)tid * 2 * C, *pb = pw + C;
        for (int n = n0; n < n1; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            float dnorm_mean = 0, dnorm_norm_mean = 0;
            for (int i = 0; i < C; i++) {
                float norm = (x[i] - m) * s;
                float dnorm = w[i] * d[i];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
                pb[i] += d[i];
                pw[i] += norm * d[i];
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            float *di = dinp + (size_t)n * C;
            for (int i = 0; i < C; i++) {
                float norm = (x[i] - m) * s;
                float dnorm = w[i] * d[i];
                di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < C; i++) {
            dw[i] += part[(size_t)t * 2 * C + i];
            db[i] += part[(size_t)t * 2 * C + C + i];
        }
    free(part);
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        const int OB = 64;
        int nblocks = (OC + OB - 1) / OB;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * OB, o1 = o0 + OB < OC ? o0 + OB : OC;
            float acc[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
            }
            for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
        }
    }
}

/* Causal attention one query row at a time with an online softmax: the
 * scores of a row live in a T-float scratch, only the row's log-sum-exp is
 * stored. Parallel over (batch, head). */
static void attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                              int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C;
#pragma omp parallel
    {
        float *s = malloc((size_t)T * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *base = qkv + (size_t)b * T * C3;
                for (int i = 0; i < T; i++) {
                    const float *q = base + i * C3 + h * hs;
                    float mx = -INFINITY;
                    for (int j = 0; j <= i; j++) {
                        const float *k = base + j * C3 + C + h * hs;
                        float dot = 0;
                        for (int e = 0; e < hs; e++) dot += q[e] * k[e];
                        s[j] = dot * scale;
                        if (s[j] > mx) mx = s[j];
                    }
                    float sum = 0;
                    for (int j = 0; j <= i; j++) {
                        s[j] = expf(s[j] - mx);
                        sum += s[j];
                    }
                    float inv = 1.0f / sum;
                    float *o = out + ((size_t)b * T + i) * C + h * hs;
                    for (int e = 0; e < hs; e++) o[e] = 0;
                    for (int j = 0; j <= i; j++) {
                        const float *v = base + j * C3 + 2 * C + h * hs;
                        float p = s[j] * inv;
                        for (int e = 0; e < hs; e++) o[e] += p * v[e];
                    }
                    lse[((size_t)b * NH + h) * T + i] = mx + logf(sum);
                }
            }
        free(s);
    }
}

static void attention_backward(float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C,
                               int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C;
#pragma omp parallel
    {
        float *p = malloc((size_t)T * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *base = qkv + (size_t)b * T * C3;
                float *dbase = dqkv + (size_t)b * T * C3;
                for (int i = 0; i < T; i++)
                    for (int k = 0; k < 3; k++) memset(dbase + i * C3 + k * C + h * hs, 0, (size_t)hs * sizeof(float));
                for (int i = 0; i < T; i++) {
                    const float *q = base + i * C3 + h * hs;
                    const float *dO = dout + ((size_t)b * T + i) * C + h * hs;
                    const float *O = out + ((size_t)b * T + i) * C + h * hs;
                    float *dq = dbase + i * C3 + h * hs;
                    float L = lse[((size_t)b * NH + h) * T + i];
                    float D = 0;
                    for (int e = 0; e < hs; e++) D += dO[e] * O[e];
                    for (int j = 0; j <= i; j++) {
                        const float *k = base + j * C3 + C + h * hs;
                        float dot = 0;
                        for (int e = 0; e < hs; e++) dot += q[e] * k[e];
                        p[j] = expf(dot * scale - L);
                    }
                    for (int j = 0; j <= i; j++) {
                        const float *k = base + j * C3 + C + h * hs;
                        const float *v = base + j * C3 + 2 * C + h * hs;
                        float *dk = dbase + j * C3 + C + h * hs;
                        float *dv = dbase + j * C3 + 2 * C + h * hs;
                        float dp = 0;
                        for (int e = 0; e < hs; e++) dp += dO[e] * v[e];
                        float ds = p[j] * (dp - D) * scale;
                        for (int e = 0; e < hs; e++) {
                            dq[e] += ds * k[e];
                            dk[e] += ds * q[e];
                            dv[e] += p[j] * dO[e];
                        }
                    }
                }
            }
        free(p);
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static void gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void accumulate(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

static void crossentropy(float *losses, float *logits, const int *targets, int N, int V, int Vp,
                         float dloss) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * Vp;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (z[i] > mx) mx = z[i];
        float sum = 0;
        for (int i = 0; i < V; i++) sum += expf(z[i] - mx);
        float logsum = logf(sum) + mx;
        int y = targets[n];
        losses[n] = logsum - z[y];
        if (dloss != 0.0f) {
            for (int i = 0; i < V; i++) z[i] = expf(z[i] - logsum) * dloss;
            z[y] -= dloss;
            for (int i = V; i < Vp; i++) z[i] = 0;
        }
    }
}

static void adamw(float *params, const float *grads, float *m, float *v, size_t n,
                  const loom_adamw_t *hp) {
    float b1c = 1.0f - powf(hp->beta1, (float)hp->t);
    float b2c = 1.0f - powf(hp->beta2, (float)hp->t);
    float lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
    float gs = hp->grad_scale;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / b1c, vhat = vi / b2c;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
    }
}

/* Each thread sums a fixed range; the partial sums are added in thread
 * order (an OpenMP reduction adds them in finishing order, which varies). */
static double sumsq(const float *x, size_t n) {
    double part[256] = {0};
    int nt = omp_get_max_threads() < 256 ? omp_get_max_threads() : 256;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t i0 = n * (size_t)tid / (size_t)nth, i1 = n * (size_t)(tid + 1) / (size_t)nth;
        double s = 0;
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[tid] = s;
    }
    double s = 0;
    for (int t = 0; t < nt; t++) s += part[t];
    return s;
}

static loom_backend_t cpu_backend = {
    .name = "cpu",
    .dtype = LOOM_FP32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .accumulate = accumulate,
    .crossentropy = crossentropy,
    .adamw = adamw,
    .sumsq = sumsq,
};

/* Peak: the best of a few 1024^3 SGEMMs on the threads we were given. */
static double measure_peak(void) {
    const int n = 1024;
    float *a = cpu_alloc((size_t)n * n * 4), *b = cpu_alloc((size_t)n * n * 4), *c = cpu_alloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = loom_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = loom_now() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * n / best;
}

loom_status loom_backend_cpu_init(const loom_backend_t **out, int threads) {
    if (threads < 0) return loom_error(LOOM_EINVAL, "--threads %d: must be 0 (all cores) or more", threads);
    if (threads == 0) threads = omp_get_num_procs();
    cpu_threads = threads;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    static int measured_threads = -1;
    static char source[128];
    if (measured_threads != threads) {
        cpu_backend.peak_flops = measure_peak();
        snprintf(source, sizeof source, "measured SGEMM 1024^3 on %d thread%s: %.1f GFLOP/s",
                 threads, threads == 1 ? "" : "s", cpu_backend.peak_flops / 1e9);
        cpu_backend.peak_source = source;
        measured_threads = threads;
    }
    *out = &cpu_backend;
    return LOOM_OK;
}
