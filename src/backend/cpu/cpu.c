/* The CPU backend: OpenMP loops and BLAS (cblas_sgemm). The reference that
 * every other backend is tested against. Deterministic for a given thread
 * count: every parallel loop uses a static schedule and every reduction
 * runs in a fixed order. */
#ifndef LOOM_NO_BLAS
#include <cblas.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cpu.h"
#include "cpu_attention.h"
#include "cpu_gemm.h"
#include "cpu_math.h"
#include "cpu_int8.h"
#include "cpu_kquant.h"
#include "cpu_paged.h"
#include "cpu_team.h"

#ifdef LOOM_NO_BLAS
/* Built without OpenBLAS (make NO_BLAS=1: the GPU bundle, where it would
 * be 35 of the MiB that can be carried): LOOM_GEMM=blas is refused at
 * open, so the BLAS paths below are never taken. */
enum { CblasRowMajor, CblasNoTrans, CblasTrans };
static void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    loom_panic(__FILE__, __LINE__, "cblas_sgemm in a loom built without OpenBLAS (NO_BLAS=1)");
}
static void openblas_set_num_threads(int n) { (void)n; }
#endif

static int cpu_threads = 1;

void *loom_cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}
void loom_cpu_free(void *p) { free(p); }
/* Below this many elements a forward op runs on the calling thread: waking
 * the team costs more than the work (a decode step of a small model is
 * ~100 such ops on one row each). Per-element results do not depend on it. */
#define PAR_MIN ((size_t)1 << 15)

void loom_cpu_upload(void *dst, const void *src_host, size_t bytes) { memcpy(dst, src_host, bytes); }
void loom_cpu_download(void *dst_host, const void *src, size_t bytes) { memcpy(dst_host, src, bytes); }
/* Large buffers (the gradients, 500 MB for GPT-2 small) are zeroed by all
 * threads, a contiguous share each. */
void loom_cpu_zero(void *p, size_t bytes) {
    if (bytes < ((size_t)1 << 20)) {
        memset(p, 0, bytes);
        return;
    }
#pragma omp parallel
    {
        size_t t = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
        size_t a = bytes * t / n / 64 * 64, b = t + 1 == n ? bytes : bytes * (t + 1) / n / 64 * 64;
        memset((char *)p + a, 0, b - a);
    }
}
void loom_cpu_sync(void) {}

void loom_cpu_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * C > PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tokens[b * T + t] * C;
            if (!wpe) { /* rotary models: no position table */
                memcpy(o, e, (size_t)C * sizeof(float));
                continue;
            }
            const float *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

/* Parallel over channel blocks, so that two positions with the same token
 * never race and the sum order is fixed. */
void loom_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
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
                float *wp = dwpe ? dwpe + (size_t)t * C : NULL;
                for (int i = c0; i < c1; i++) {
                    we[i] += d[i];
                    if (wp) wp[i] += d[i];
                }
            }
    }
}

/* A grow-only scratch for the ops' per-thread partial sums: allocated on
 * the first step, reused after (no allocation in a steady-state step). */
static float *op_scratch;
static size_t op_scratch_floats;
static float *scratch_get(size_t floats) {
    if (floats > op_scratch_floats) {
        void *p = NULL;
        if (posix_memalign(&p, 64, floats * sizeof(float)) != 0)
            loom_panic(__FILE__, __LINE__, "out of memory for %zu floats of scratch", floats);
        free(op_scratch);
        op_scratch = p;
        op_scratch_floats = floats;
    }
    return op_scratch;
}

/* One row: mean and rstd of x, out = (x - mean) * rstd * w + b. */
static inline void layernorm_row(float *o, float *mean, float *rstd, const float *x, const float *w,
                                 const float *b, int C) {
    float m = 0;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        var += d * d;
    }
    var /= C;
    float s = 1.0f / sqrtf(var + 1e-5f);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
    *mean = m;
    *rstd = s;
}

void loom_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b, C);
}

void loom_cpu_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                       const float *a, const float *b_res, const float *w,
                                       const float *b, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *r = res + (size_t)n * C;
        const float *x = a + (size_t)n * C, *y = b_res + (size_t)n * C;
#pragma omp simd
        for (int i = 0; i < C; i++) r[i] = x[i] + y[i];
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, r, w, b, C);
    }
}

/* dinp is per row (parallel over rows); dw and db sum over rows, so each
 * thread sums a fixed contiguous range of rows into its own slot and the
 * slots are added in thread order. */
void loom_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
    int nt = omp_get_max_threads();
    float *part = scratch_get((size_t)nt * 2 * C);
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int n0 = (int)((long long)N * tid / nth), n1 = (int)((long long)N * (tid + 1) / nth);
        float *pw = part + (size_t)tid * 2 * C, *pb = pw + C;
        memset(pw, 0, 2 * (size_t)C * sizeof(float));
        for (int n = n0; n < n1; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
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
#pragma omp simd
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
}

void loom_cpu_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = loom_gelu(inp[i]);
}

void loom_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = loom_gelu_grad(inp[i]) * dout[i];
}

/* LOOM_GEMM=blas routes the three matmul GEMMs through OpenBLAS; the
 * default is the backend's own (cpu_gemm.c). */
static int use_blas;

void loom_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC) {
    if (!use_blas) {
        loom_gemm_t g = {.a = inp, .rsa = C, .csa = 1, .b = w, .rsb = 1, .csb = C, .c = out,
                         .ldc = OC, .M = N, .N = OC, .K = C, .bias = bias};
        loom_cpu_gemm(&g);
        return;
    }
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void loom_cpu_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC) {
    if (use_blas) {
        loom_cpu_matmul_forward(pre, inp, w, bias, N, C, OC);
        loom_cpu_gelu_forward(out, pre, (size_t)N * OC);
        return;
    }
    loom_gemm_t g = {.a = inp, .rsa = C, .csa = 1, .b = w, .rsb = 1, .csb = C, .c = pre,
                     .ldc = OC, .M = N, .N = OC, .K = C, .bias = bias, .gelu = out};
    loom_cpu_gemm(&g);
}

/* dbias (OC) += column sums of dout (N,OC), in blocks of 64 columns. */
static void bias_backward(float *dbias, const float *dout, int N, int OC) {
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

void loom_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    if (use_blas) {
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    } else {
        if (dinp) {
            loom_gemm_t g = {.a = dout, .rsa = OC, .csa = 1, .b = w, .rsb = C, .csb = 1, .c = dinp,
                             .ldc = C, .M = N, .N = C, .K = OC, .accumulate = 1};
            loom_cpu_gemm(&g);
        }
        loom_gemm_t g = {.a = dout, .rsa = 1, .csa = OC, .b = inp, .rsb = C, .csb = 1, .c = dw,
                         .ldc = C, .M = OC, .N = C, .K = N, .accumulate = 1};
        loom_cpu_gemm(&g);
    }
    if (dbias) bias_backward(dbias, dout, N, OC);
}

/* dpre = gelu'(pre) * (dout @ w), overwritten, the derivative applied in
 * the GEMM's epilogue; dw, dbias as matmul_backward. */
void loom_cpu_matmul_backward_gelu(float *dpre, float *dw, float *dbias, const float *dout,
                                 const float *inp, const float *pre, const float *w, int N, int C,
                                 int OC) {
    if (use_blas) {
        memset(dpre, 0, (size_t)N * C * sizeof(float));
        loom_cpu_matmul_backward(dpre, dw, dbias, dout, inp, w, N, C, OC);
        loom_cpu_gelu_backward(dpre, pre, dpre, (size_t)N * C);
        return;
    }
    loom_gemm_t gd = {.a = dout, .rsa = OC, .csa = 1, .b = w, .rsb = C, .csb = 1, .c = dpre,
                      .ldc = C, .M = N, .N = C, .K = OC, .dgelu = pre};
    loom_cpu_gemm(&gd);
    loom_cpu_matmul_backward(NULL, dw, dbias, dout, inp, w, N, C, OC);
}

void loom_cpu_residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void loom_cpu_accumulate(float *dst, const float *src, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Per row: the max, then one pass of exp that also keeps exp(z - max) in
 * place when training, then (training) a scaling pass to the gradient:
 * each a vectorized pass over the row, one exp per logit. */
void loom_cpu_crossentropy(float *losses, float *logits, const int *targets, int N, int V, int Vp,
                         float dloss) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * Vp;
        int y = targets[n];
        float zy = z[y], mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) mx = z[i] > mx ? z[i] : mx;
        float sum = 0;
        if (dloss != 0.0f) {
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++) {
                float e = loom_expf(z[i] - mx);
                z[i] = e;
                sum += e;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++) sum += loom_expf(z[i] - mx);
        }
        losses[n] = logf(sum) + mx - zy;
        if (dloss != 0.0f) {
            float s = dloss / sum;
#pragma omp simd
            for (int i = 0; i < V; i++) z[i] *= s;
            z[y] -= dloss;
            for (int i = V; i < Vp; i++) z[i] = 0;
        }
    }
}

void loom_cpu_adamw(float *params, const float *grads, float *m, float *v, size_t n,
                  const loom_adamw_t *hp) {
    float b1c = 1.0f - powf(hp->beta1, (float)hp->t);
    float b2c = 1.0f - powf(hp->beta2, (float)hp->t);
    float lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
    float gs = hp->grad_scale;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / b1c, vhat = vi / b2c;
        params[i] -= lr * (mhat / (__builtin_sqrtf(vhat) + eps) + wd * params[i]);
    }
}

/* Each thread sums a fixed range; the partial sums are added in thread
 * order (an OpenMP reduction adds them in finishing order, which varies). */
double loom_cpu_sumsq(const float *x, size_t n) {
    double part[256] = {0};
    int nt = omp_get_max_threads() < 256 ? omp_get_max_threads() : 256;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t i0 = n * (size_t)tid / (size_t)nth, i1 = n * (size_t)(tid + 1) / (size_t)nth;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[tid] = s;
    }
    double s = 0;
    for (int t = 0; t < nt; t++) s += part[t];
    return s;
}

/* The table: every entry of ops.h whose kernel loom_cpu_<name> exists
 * (cpu.h; the optional ones the CPU lacks stay NULL). */
static loom_backend_t cpu_backend = {
    .name = "cpu",
    .dtype = LOOM_FP32,
    .caps = 0, /* host memory, synchronous ops, no graphs, no device step */
    .dtypes = LOOM_DTYPE_BIT(LOOM_FP32) | LOOM_DTYPE_BIT(LOOM_INT32) | LOOM_DTYPE_BIT(LOOM_INT8) | LOOM_DTYPE_BIT(LOOM_Q4_0) |
              LOOM_DTYPE_BIT(LOOM_Q4_1) | LOOM_DTYPE_BIT(LOOM_Q5_0) | LOOM_DTYPE_BIT(LOOM_Q5_1) | LOOM_DTYPE_BIT(LOOM_Q4_K) |
              LOOM_DTYPE_BIT(LOOM_Q5_K) | LOOM_DTYPE_BIT(LOOM_Q6_K),
    .act_dtype = LOOM_FP32,
#define CPU_SLOT_(name, ret, kind, fallback, flops, n, args) .name = loom_cpu_##name,
    LOOM_OPS(CPU_SLOT_)
#undef CPU_SLOT_
};

/* Peak: the best of `reps` n^3 SGEMMs on the threads we were given, with
 * the GEMM this run uses (1024^3, best of 8, at open). Only that one runs: OpenBLAS's worker threads
 * spin for a while after each call and would steal the cores from the own
 * GEMM's OpenMP team. */
static double measure_peak(int n, int reps, char *how, size_t how_size) {
    float *a = loom_cpu_alloc((size_t)n * n * 4), *b = loom_cpu_alloc((size_t)n * n * 4), *c = loom_cpu_alloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) { /* the best: other work on the machine only slows some */
        double t0 = loom_now();
        if (use_blas) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        } else {
            loom_gemm_t g = {.a = a, .rsa = n, .csa = 1, .b = b, .rsb = 1, .csb = n, .c = c, .ldc = n,
                             .M = n, .N = n, .K = n};
            loom_cpu_gemm(&g);
        }
        double dt = loom_now() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    if (use_blas) {
        const char *ct = getenv("OPENBLAS_CORETYPE");
        snprintf(how, how_size, "OpenBLAS%s%s", ct ? ", OPENBLAS_CORETYPE=" : "", ct ? ct : "");
    } else {
        snprintf(how, how_size, "own GEMM, %s kernel", loom_cpu_gemm_kernel());
    }
    return 2.0 * n * n * n / best;
}

loom_status loom_backend_cpu_init(const loom_backend_t **out, int threads) {
    if (threads < 0) return loom_error(LOOM_EINVAL, "--threads %d: must be 0 (all cores) or more", threads);
    if (threads == 0) threads = omp_get_num_procs();
    const char *kname = getenv("LOOM_CPU_KERNEL"), *why = "";
    if (kname && !*kname) kname = NULL;
    if (loom_cpu_gemm_select(kname, &why) != 0)
        return loom_error(LOOM_EUNAVAIL, "LOOM_CPU_KERNEL=%s: %s", kname, why);
    const char *gemm = getenv("LOOM_GEMM");
    if (gemm && *gemm && strcmp(gemm, "blas") != 0 && strcmp(gemm, "own") != 0)
        return loom_error(LOOM_EINVAL, "LOOM_GEMM=%s: use own or blas", gemm);
    use_blas = gemm && strcmp(gemm, "blas") == 0;
#ifdef LOOM_NO_BLAS
    if (use_blas)
        return loom_error(LOOM_EUNAVAIL, "LOOM_GEMM=blas: this loom was built without OpenBLAS (make NO_BLAS=1); "
                          "unset LOOM_GEMM to use loom's own GEMM");
#endif
    if (loom_cpu_gemm_init(threads) != 0)
        return loom_error(LOOM_ENOMEM, "cannot allocate the GEMM packing buffers for %d threads", threads);
    cpu_threads = cpu_backend.threads = threads;
    static char kernels[96];
    snprintf(kernels, sizeof kernels, "gemm %s%s, int8 %s", use_blas ? "blas" : loom_cpu_gemm_kernel(), use_blas ? "" : " (own)",
             loom_cpu_int8_isa());
    cpu_backend.kernels = kernels;
    omp_set_num_threads(threads);
    loom_cpu_team_set_threads(threads);
    openblas_set_num_threads(threads);
    static int measured_threads = -1;
    static const char *measured_kernel;
    static int measured_blas = -1;
    static char source[192];
    if (measured_threads != threads || measured_kernel != loom_cpu_gemm_kernel() || measured_blas != use_blas) {
        char how[128];
        cpu_backend.peak_flops = measure_peak(1024, 8, how, sizeof how);
        snprintf(source, sizeof source, "measured SGEMM 1024^3 on %d thread%s: %.1f GFLOP/s (%s)",
                 threads, threads == 1 ? "" : "s", cpu_backend.peak_flops / 1e9, how);
        cpu_backend.peak_source = source;
        measured_threads = threads;
        measured_kernel = loom_cpu_gemm_kernel();
        measured_blas = use_blas;
    }
    LOOM_TRY(loom_backend_check(&cpu_backend));
    *out = &cpu_backend;
    return LOOM_OK;
}

double loom_backend_cpu_measure_peak(int n, int reps, char *how, size_t how_size) {
    char kind[128];
    double flops = measure_peak(n, reps, kind, sizeof kind);
    snprintf(how, how_size, "measured SGEMM %d^3, best of %d, on %d thread%s: %.1f GFLOP/s (%s)", n, reps,
             cpu_threads, cpu_threads == 1 ? "" : "s", flops / 1e9, kind);
    return flops;
}

/* ---- a vocabulary shard (tensor parallelism): backend.h ---- */

void loom_cpu_vocab_embed_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                                  int C, int v0, int nv) {
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > PAR_MIN)
    for (int r = 0; r < B * T; r++) {
        float *o = out + (size_t)r * C;
        int tok = tokens[r] - v0;
        const float *p = wpe ? wpe + (size_t)(r % T) * C : NULL;
        for (int i = 0; i < C; i++)
            o[i] = (tok >= 0 && tok < nv ? wte[(size_t)tok * C + i] : 0.0f) + (p ? p[i] : 0.0f);
    }
}

void loom_cpu_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                                   int C, int v0, int nv) {
    /* one thread per channel block, rows in order: a fixed sum order */
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int r = 0; r < B * T; r++) {
            const float *d = dout + (size_t)r * C;
            int tok = tokens[r] - v0;
            if (tok >= 0 && tok < nv)
                for (int i = c0; i < c1; i++) dwte[(size_t)tok * C + i] += d[i];
            if (dwpe)
                for (int i = c0; i < c1; i++) dwpe[(size_t)(r % T) * C + i] += d[i];
        }
    }
}

void loom_cpu_vocab_ce_stats(float *stats, const float *logits, const int *targets, int N, int Vp, int v0, int nv) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vp;
        float mx = -INFINITY, sum = 0;
        for (int i = 0; i < nv; i++) mx = z[i] > mx ? z[i] : mx;
        for (int i = 0; i < nv; i++) sum += loom_expf(z[i] - mx);
        int y = targets[n] - v0;
        stats[3 * n] = mx;
        stats[3 * n + 1] = sum;
        stats[3 * n + 2] = y >= 0 && y < nv ? z[y] : 0.0f;
    }
}

void loom_cpu_vocab_ce_finish(float *losses, float *logits, const int *targets, const float *stats, int ranks, int N,
                              int Vp, int v0, int nv, float dloss) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float mx = -INFINITY, zy = 0, sum = 0;
        for (int r = 0; r < ranks; r++) {
            const float *s = stats + ((size_t)r * N + n) * 3;
            mx = s[0] > mx ? s[0] : mx;
            zy += s[2];
        }
        for (int r = 0; r < ranks; r++) {
            const float *s = stats + ((size_t)r * N + n) * 3;
            if (s[1] > 0) sum += s[1] * loom_expf(s[0] - mx);
        }
        losses[n] = logf(sum) + mx - zy;
        if (dloss == 0.0f) continue;
        float *z = logits + (size_t)n * Vp, scale = dloss / sum;
        int y = targets[n] - v0;
        for (int i = 0; i < nv; i++) z[i] = loom_expf(z[i] - mx) * scale;
        if (y >= 0 && y < nv) z[y] -= dloss;
        for (int i = nv; i < Vp; i++) z[i] = 0;
    }
}
