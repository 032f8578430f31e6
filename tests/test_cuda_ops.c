/* test_cuda_ops: every CUDA op against the CPU op on random data.
 *
 * Data are fresh each run (the seed is printed; LOOM_TEST_SEED=N repeats a
 * run). Outputs an op overwrites are poisoned with NaN on the device before
 * each launch, so an element the op forgets to write fails; outputs it
 * accumulates into start from the same random values on both sides. Each op
 * runs at every dtype over several shapes, ragged ones included (T=37,
 * C=96, odd C, head size 24, vocabularies not a multiple of 4), and the
 * normalized error ||gpu - cpu|| / ||cpu|| must stay under the bound below.
 *
 * ACT arguments (ops.h) are stored at the backend's act_dtype: bf16 and
 * fp16 at those dtypes. Their inputs are rounded to that type on the host
 * first, so the CPU reference reads exactly what the GPU reads; their
 * outputs come back widened and carry one rounding more (tol_act).
 *
 * Without CUDA in the build, or without a usable GPU, every GPU case prints
 * SKIP with the CUDA runtime's reason; the peak-table cases run anyway. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/plugin.h"
#include "backend/cuda/cuda_peak.h"
#include "check.h"
#include "model/quant.h"
#include "model/sparse24.h"
#include "parallel/dist_impl.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_devices.h"
#endif

static const loom_backend_t *cpu, *gpu;
static loom_dtype dtype;
static char no_gpu[512];   /* why the GPU cases of this dtype do not run ("" = they run) */
static int no_gpu_fails;   /* 1: the reason is a failure (FAIL), not an absent GPU (SKIP) */
static unsigned seed_next; /* advanced by every random array */
static unsigned seed0;
static char shape[160];    /* the shape under test, for failure messages */

/* Normalized-error bounds. Matrix work runs at the dtype (tensor cores
 * round inputs to 19, 16 or 11 significant bits); the memory-bound kernels
 * and the fused attention compute in fp32 at every dtype. */
#define TOL_FP32 1e-5
static double tol_matmul(void) {
    switch (dtype) {
    case LOOM_TF32: return 2e-3;
    case LOOM_BF16: return 1e-2;
    case LOOM_FP16: return 3e-3;
    default: return TOL_FP32;
    }
}
/* The rounding of a 16-bit ACT output (normalized error of round to
 * nearest: about 2^-9 for bf16, 2^-12 for fp16, with margin); 0 at fp32. */
static double tol_act(void) { return gpu && gpu->act_dtype == LOOM_BF16 ? 8e-3 : gpu && gpu->act_dtype == LOOM_FP16 ? 1e-3 : 0; }
/* cuBLASLt's GELU epilogues (GELU_AUX_BIAS forward, DGELU backward) may
 * evaluate tanh with the hardware approximation (PTX tanh.approx.f32,
 * relative error at most 2^-11) where the CPU calls tanhf: gelu(x) =
 * 0.5 x (1 + tanh(z)) then errs by at most 0.5 |x| |tanh z| 2^-11 <=
 * 2^-12 |x|, and over a vector ||x|| / ||gelu(x)|| <= 2 for these inputs,
 * so the normalized error grows by at most 2^-11 ~ 4.9e-4 (5e-4 here);
 * the derivative 0.5 (1 + t) + 0.5 x (1 - t^2) z'(x) carries the tanh
 * error with a factor up to about 2, hence 1e-3 (docs/cuda.md, "What must
 * be bitwise, what may drift"). The pre-activation output is unaffected. */
static double tol_gelu_epilogue(void) { return tol_matmul() + 5e-4; }
static double tol_dgelu_epilogue(void) { return tol_matmul() + 1e-3; }
/* The unfused attention backward chains five GEMMs at the dtype and a
 * cancellation (dP - D), so it gets three times the matmul bound. */
static double tol_attention_unfused_backward(void) { return 3 * tol_matmul(); }

/* ---- allocation helpers: everything is freed by release() ---- */

#define MAX_TRACKED 128
static void *host_ptrs[MAX_TRACKED], *dev_ptrs[MAX_TRACKED];
static int n_host, n_dev;

static void *track_host(void *p) {
    LOOM_ASSERT(p && n_host < MAX_TRACKED);
    return host_ptrs[n_host++] = p;
}
static void *dalloc(size_t bytes) {
    void *p = gpu->alloc(bytes);
    LOOM_ASSERT(p && n_dev < MAX_TRACKED);
    return dev_ptrs[n_dev++] = p;
}
static void release(void) {
    if (gpu) gpu->sync();
    for (int i = 0; i < n_host; i++) free(host_ptrs[i]);
    for (int i = 0; i < n_dev; i++) gpu->free(dev_ptrs[i]);
    n_host = n_dev = 0;
}

/* Host array of n random floats in [-scale, scale). */
static float *hrand(size_t n, float scale) {
    float *x = track_host(malloc((n ? n : 1) * sizeof(float)));
    check_fill(x, n, scale, seed_next++);
    return x;
}
static float *hcopy(const float *x, size_t n) {
    float *y = track_host(malloc((n ? n : 1) * sizeof(float)));
    memcpy(y, x, n * sizeof(float));
    return y;
}
static int *hrand_ids(size_t n, int limit) {
    int *t = track_host(malloc((n ? n : 1) * sizeof(int)));
    float *u = hrand(n, 1.0f);
    for (size_t i = 0; i < n; i++) {
        int v = (int)((u[i] * 0.5f + 0.5f) * limit);
        t[i] = v < 0 ? 0 : v >= limit ? limit - 1 : v;
    }
    return t;
}
/* Device copy of a host array. */
static void *dput(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    gpu->upload(d, h, bytes);
    return d;
}
/* Device array of n floats, all NaN. */
static float *dpoison(size_t n) {
    float *h = track_host(malloc((n ? n : 1) * sizeof(float)));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    return dput(h, n * sizeof(float));
}
/* Downloads d (n) and checks it against ref within tol. */
static void expect(const char *what, const float *d, const float *ref, size_t n, double tol) {
    float *got = track_host(malloc((n ? n : 1) * sizeof(float)));
    gpu->download(got, d, n * sizeof(float));
    double err = check_rel_err(got, ref, n);
    CHECK(err <= tol, "%s [%s, %s]: normalized error %.3g > %.3g (LOOM_TEST_SEED=%u)", what,
          shape, loom_dtype_name(dtype), err, tol, seed0);
}

/* ---- ACT tensors: stored at gpu->act_dtype ---- */

static size_t act_size(void) { return loom_dtype_size(gpu->act_dtype); }
/* ACT element `off` of device tensor d. */
static float *aoff(float *d, size_t off) { return (float *)((char *)d + off * act_size()); }
/* Device ACT copy of host h (n floats); h is rounded in place to what the
 * device holds, so the CPU reference reads the same values. */
static float *dput_act(float *h, size_t n) {
    void *tmp = track_host(malloc((n ? n : 1) * sizeof(float)));
    loom_dtype_from_f32(tmp, h, gpu->act_dtype, n);
    loom_dtype_to_f32(h, tmp, gpu->act_dtype, n);
    return dput(tmp, n * act_size());
}
/* Device ACT tensor of n elements, all NaN. */
static float *apoison(size_t n) {
    float *h = track_host(malloc((n ? n : 1) * sizeof(float)));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    return dput_act(h, n);
}
/* As expect, for an ACT output, within `bound` exactly. */
static void expect_act_within(const char *what, const float *d, const float *ref, size_t n, double bound) {
    float *got = track_host(malloc((n ? n : 1) * sizeof(float)));
    loom_backend_download_act(gpu, got, d, n);
    double err = check_rel_err(got, ref, n);
    CHECK(err <= bound, "%s [%s, %s, activations %s]: normalized error %.3g > %.3g (LOOM_TEST_SEED=%u)", what, shape,
          loom_dtype_name(dtype), loom_dtype_name(gpu->act_dtype), err, bound, seed0);
}
/* As expect, for an ACT output: its 16-bit rounding is added to tol. */
static void expect_act(const char *what, const float *d, const float *ref, size_t n, double tol) {
    expect_act_within(what, d, ref, n, tol + tol_act());
}

static int gpu_ready(void) {
    if (no_gpu[0]) {
        if (no_gpu_fails) check_fail_why("%s", no_gpu);
        else check_skip_gpu("%s", no_gpu);
        return 0;
    }
    return 1;
}

/* ---- encoder ---- */

static const int enc_shapes[][4] = {{2, 64, 128, 100}, {3, 37, 96, 50}, {1, 5, 7, 11}};

static void test_encoder(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof enc_shapes / sizeof enc_shapes[0]; s++) {
        int B = enc_shapes[s][0], T = enc_shapes[s][1], C = enc_shapes[s][2],
            V = enc_shapes[s][3];
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
        size_t n = (size_t)B * T * C;
        int *tok = hrand_ids((size_t)B * T, V);
        float *wte = hrand((size_t)V * C, 1), *wpe = hrand((size_t)T * C, 1);
        float *ref = hrand(n, 1);
        cpu->encoder_forward(ref, tok, wte, wpe, B, T, C);
        int *d_tok = dput(tok, (size_t)B * T * sizeof(int));
        float *d_wte = dput(wte, (size_t)V * C * 4), *d_wpe = dput(wpe, (size_t)T * C * 4);
        float *d_out = apoison(n);
        gpu->encoder_forward(d_out, d_tok, d_wte, d_wpe, B, T, C);
        expect_act("encoder_forward out", d_out, ref, n, TOL_FP32);

        float *dout = hrand(n, 1);
        float *dwte = hrand((size_t)V * C, 1), *dwpe = hrand((size_t)T * C, 1);
        float *d_dwte = dput(dwte, (size_t)V * C * 4), *d_dwpe = dput(dwpe, (size_t)T * C * 4);
        float *d_dout = dput_act(dout, n);
        cpu->encoder_backward(dwte, dwpe, dout, tok, B, T, C);
        gpu->encoder_backward(d_dwte, d_dwpe, d_dout, d_tok, B, T, C);
        expect("encoder_backward dwte", d_dwte, dwte, (size_t)V * C, TOL_FP32);
        expect("encoder_backward dwpe", d_dwpe, dwpe, (size_t)T * C, TOL_FP32);
        release();
    }
}

/* ---- layernorm ---- */

static const int ln_shapes[][2] = {{128, 128}, {111, 96}, {37, 7}, {64, 768}};

static void test_layernorm(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof ln_shapes / sizeof ln_shapes[0]; s++) {
        int N = ln_shapes[s][0], C = ln_shapes[s][1];
        size_t n = (size_t)N * C;
        snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
        float *inp = hrand(n, 2), *w = hrand(C, 1), *b = hrand(C, 1);
        float *out = hrand(n, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
        float *d_inp = dput_act(inp, n), *d_w = dput(w, C * 4), *d_b = dput(b, C * 4);
        cpu->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
        float *d_out = apoison(n), *d_mean = dpoison(N), *d_rstd = dpoison(N);
        gpu->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        expect_act("layernorm_forward out", d_out, out, n, TOL_FP32);
        expect("layernorm_forward mean", d_mean, mean, N, TOL_FP32);
        expect("layernorm_forward rstd", d_rstd, rstd, N, TOL_FP32);

        float *dout = hrand(n, 1), *dinp = hrand(n, 1), *dw = hrand(C, 1), *db = hrand(C, 1);
        float *d_dout = dput_act(dout, n), *d_dinp = dput_act(dinp, n);
        float *d_dw = dput(dw, C * 4), *d_db = dput(db, C * 4);
        float *d_mref = dput(mean, N * 4), *d_rref = dput(rstd, N * 4);
        cpu->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        gpu->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mref, d_rref, N, C);
        expect_act("layernorm_backward dinp", d_dinp, dinp, n, TOL_FP32);
        expect("layernorm_backward dw", d_dw, dw, C, TOL_FP32);
        expect("layernorm_backward db", d_db, db, C, TOL_FP32);
        release();
    }
}

static void test_residual_layernorm(void) {
    if (!gpu_ready()) return;
    if (!gpu->residual_layernorm_forward) {
        check_fail_why("the CUDA backend has no residual_layernorm_forward, which it is meant to have");
        return;
    }
    for (size_t s = 0; s < sizeof ln_shapes / sizeof ln_shapes[0]; s++) {
        int N = ln_shapes[s][0], C = ln_shapes[s][1];
        size_t n = (size_t)N * C;
        snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
        float *a = hrand(n, 1), *r = hrand(n, 1), *w = hrand(C, 1), *b = hrand(C, 1);
        float *res = hrand(n, 1), *out = hrand(n, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
        float *d_a = dput_act(a, n), *d_r = dput_act(r, n), *d_w = dput(w, C * 4), *d_b = dput(b, C * 4);
        cpu->residual_forward(res, a, r, n);
        cpu->layernorm_forward(out, mean, rstd, res, w, b, N, C);
        float *d_res = apoison(n), *d_out = apoison(n), *d_mean = dpoison(N), *d_rstd = dpoison(N);
        gpu->residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_a, d_r, d_w, d_b, N, C);
        expect_act("residual_layernorm_forward res", d_res, res, n, TOL_FP32);
        /* 16-bit: the statistics are those of the stored (rounded) sum */
        expect_act("residual_layernorm_forward out", d_out, out, n, TOL_FP32 + tol_act());
        expect("residual_layernorm_forward rstd", d_rstd, rstd, N, TOL_FP32 + tol_act());
        /* in place: res aliases a */
        gpu->residual_layernorm_forward(d_a, d_out, d_mean, d_rstd, d_a, d_r, d_w, d_b, N, C);
        expect_act("residual_layernorm_forward in place", d_a, res, n, TOL_FP32);
        release();
    }
}

/* ---- matmul ---- */

static const int mm_shapes[][3] = {{128, 128, 384}, {111, 96, 288}, {37, 96, 50}, {64, 7, 13},
                                   {256, 768, 3072}};

static void test_matmul_forward(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int N = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
            snprintf(shape, sizeof shape, "N=%d C=%d OC=%d bias=%d", N, C, OC, with_bias);
            float *inp = hrand((size_t)N * C, 1), *w = hrand((size_t)OC * C, 1),
                  *bias = hrand(OC, 1), *out = hrand((size_t)N * OC, 1);
            float *d_inp = dput_act(inp, (size_t)N * C), *d_w = dput(w, (size_t)OC * C * 4);
            cpu->matmul_forward(out, inp, w, with_bias ? bias : NULL, N, C, OC);
            float *d_bias = dput(bias, OC * 4), *d_out = apoison((size_t)N * OC);
            gpu->matmul_forward(d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, C, OC);
            expect_act("matmul_forward out", d_out, out, (size_t)N * OC, tol_matmul());
            release();
        }
}

static void test_matmul_backward(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        for (int full = 0; full < 2; full++) { /* full = 0: dinp and dbias NULL */
            int N = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
            snprintf(shape, sizeof shape, "N=%d C=%d OC=%d dinp,dbias=%s", N, C, OC,
                     full ? "yes" : "NULL");
            size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
            float *inp = hrand(nin, 1), *w = hrand(nw, 1), *dout = hrand(nout, 1);
            float *dinp = hrand(nin, 1), *dw = hrand(nw, 1), *dbias = hrand(OC, 1);
            float *d_inp = dput_act(inp, nin), *d_w = dput(w, nw * 4), *d_dout = dput_act(dout, nout);
            float *d_dinp = dput_act(dinp, nin), *d_dw = dput(dw, nw * 4), *d_dbias = dput(dbias, OC * 4);
            cpu->matmul_backward(full ? dinp : NULL, dw, full ? dbias : NULL, dout, inp, w, N, C,
                                 OC);
            gpu->matmul_backward(full ? d_dinp : NULL, d_dw, full ? d_dbias : NULL, d_dout,
                                 d_inp, d_w, N, C, OC);
            expect("matmul_backward dw", d_dw, dw, nw, tol_matmul());
            expect_act("matmul_backward dinp", d_dinp, dinp, nin, tol_matmul());
            expect("matmul_backward dbias", d_dbias, dbias, OC, tol_matmul());
            release();
        }
}

static void test_matmul_forward_gelu(void) {
    if (!gpu_ready()) return;
    if (!gpu->matmul_forward_gelu) {
        check_fail_why("the CUDA backend has no matmul_forward_gelu, which it is meant to have");
        return;
    }
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int N = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
            snprintf(shape, sizeof shape, "N=%d C=%d OC=%d bias=%d", N, C, OC, with_bias);
            size_t nout = (size_t)N * OC;
            float *inp = hrand((size_t)N * C, 1), *w = hrand((size_t)OC * C, 1),
                  *bias = hrand(OC, 1), *pre = hrand(nout, 1), *out = hrand(nout, 1);
            float *d_inp = dput_act(inp, (size_t)N * C), *d_w = dput(w, (size_t)OC * C * 4);
            cpu->matmul_forward(pre, inp, w, with_bias ? bias : NULL, N, C, OC);
            cpu->gelu_forward(out, pre, nout);
            float *d_bias = dput(bias, OC * 4), *d_out = apoison(nout), *d_pre = apoison(nout);
            gpu->matmul_forward_gelu(d_out, d_pre, d_inp, d_w, with_bias ? d_bias : NULL, N, C,
                                     OC);
            expect_act("matmul_forward_gelu pre", d_pre, pre, nout, tol_matmul());
            expect_act("matmul_forward_gelu out", d_out, out, nout, tol_gelu_epilogue());
            release();
        }
}

static void test_matmul_backward_gelu(void) {
    if (!gpu_ready()) return;
    if (!gpu->matmul_backward_gelu) {
        check_fail_why("the CUDA backend has no matmul_backward_gelu, which it is meant to have");
        return;
    }
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int N = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
            snprintf(shape, sizeof shape, "N=%d C=%d OC=%d dbias=%d", N, C, OC, with_bias);
            size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
            float *pre = hrand(nin, 2), *inp = hrand(nin, 1), *w = hrand(nw, 1);
            float *dout = hrand(nout, 1), *dw = hrand(nw, 1), *dbias = hrand(OC, 1);
            float *d_pre = dput_act(pre, nin);
            cpu->gelu_forward(inp, pre, nin);
            float *d_inp = dput_act(inp, nin), *d_w = dput(w, nw * 4), *d_dout = dput_act(dout, nout);
            float *d_dw = dput(dw, nw * 4), *d_dbias = dput(dbias, OC * 4), *d_dpre = apoison(nin);
            float *dpre = track_host(calloc(nin, sizeof(float)));
            cpu->matmul_backward(dpre, dw, with_bias ? dbias : NULL, dout, inp, w, N, C, OC);
            cpu->gelu_backward(dpre, pre, dpre, nin);
            gpu->matmul_backward_gelu(d_dpre, d_dw, with_bias ? d_dbias : NULL, d_dout, d_inp,
                                      d_pre, d_w, N, C, OC);
            expect_act("matmul_backward_gelu dpre", d_dpre, dpre, nin, tol_dgelu_epilogue());
            expect("matmul_backward_gelu dw", d_dw, dw, nw, tol_matmul());
            expect("matmul_backward_gelu dbias", d_dbias, dbias, OC, tol_matmul());
            release();
        }
}

/* ---- attention ---- */

/* B, T, C, NH, NKV: head sizes 32, 32 (T ragged), 24, 96, 128, 40, and
 * 160 (larger than the fused kernels take: exercises the fallback); B * NH
 * = 65536 heads of 8, one more than a grid's y dimension holds (the fused
 * kernels put B * NH on x); grouped-query (2 kv heads for 4, and for 8 at
 * hs 24) and multi-query. */
static const int att_shapes[][5] = {{2, 64, 128, 4, 4}, {3, 37, 96, 3, 3}, {1, 37, 96, 4, 4},
                                    {2, 70, 192, 2, 2}, {1, 33, 256, 2, 2}, {1, 20, 40, 1, 1},
                                    {1, 17, 160, 1, 1}, {4096, 3, 128, 16, 16}, {2, 64, 128, 4, 2},
                                    {1, 37, 192, 8, 2}, {1, 33, 128, 4, 1}, {1, 17, 320, 2, 1}};

/* Every shape of att_shapes whose head size is at most max_hs (0: all). */
static void attention_cases(double tol_fwd, double tol_bwd, int max_hs) {
    for (size_t s = 0; s < sizeof att_shapes / sizeof att_shapes[0]; s++) {
        int B = att_shapes[s][0], T = att_shapes[s][1], C = att_shapes[s][2],
            NH = att_shapes[s][3], NKV = att_shapes[s][4];
        if (max_hs && C / NH > max_hs) continue;
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d NKV=%d hs=%d", B, T, C, NH, NKV, C / NH);
        size_t nqkv = (size_t)B * T * (C + 2 * NKV * (C / NH)), nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv = hrand(nqkv, 1.5f), *out = hrand(nout, 1), *lse = hrand(nl, 1);
        float *d_qkv = dput_act(qkv, nqkv), *d_out = apoison(nout), *d_lse = dpoison(nl);
        cpu->attention_forward(out, lse, qkv, B, T, C, NH, NKV);
        gpu->attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, NKV);
        expect_act("attention_forward out", d_out, out, nout, tol_fwd);
        expect("attention_forward lse", d_lse, lse, nl, tol_fwd);

        /* backward from the CPU's forward results (out rounded to the
         * activation type as the GPU holds it), so it is tested alone */
        float *dout = hrand(nout, 1), *dqkv = hrand(nqkv, 1);
        float *d_dout = dput_act(dout, nout), *d_oref = dput_act(out, nout), *d_lref = dput(lse, nl * 4),
              *d_dqkv = apoison(nqkv);
        cpu->attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
        gpu->attention_backward(d_dqkv, d_dout, d_qkv, d_oref, d_lref, B, T, C, NH, NKV);
        expect_act("attention_backward dqkv", d_dqkv, dqkv, nqkv, tol_bwd);
        release();
    }
}

static void test_attention_fused(void) {
    if (!gpu_ready()) return;
    /* the own fused kernels are fp32; at bf16/fp16 cuDNN's SDPA serves head
     * sizes that are multiples of 8 (inputs rounded to the dtype); the
     * hs=160 case falls back to the unfused path, whose GEMMs run at the dtype */
    attention_cases(tol_matmul(), tol_attention_unfused_backward(), 0);
}

/* Reopens the backend with LOOM_CUDA_ATTENTION set (it is read at open). */
static int reopen_with_attention(const char *mode) {
    if (mode) setenv("LOOM_CUDA_ATTENTION", mode, 1);
    else unsetenv("LOOM_CUDA_ATTENTION");
    loom_status st = loom_backend_open(&gpu, "cuda:0", 1, dtype);
    CHECK(st == LOOM_OK, "reopening cuda:0: %s", loom_errmsg());
    return st == LOOM_OK;
}

static void test_attention_unfused(void) {
    if (!gpu_ready()) return;
    if (!reopen_with_attention("unfused")) return;
    attention_cases(tol_matmul(), tol_attention_unfused_backward(), 0);
    reopen_with_attention(NULL);
}

/* The own fused kernels alone at the fp32 bound: shapes they take (hs <=
 * 128); LOOM_CUDA_ATTENTION=own keeps cuDNN's 16-bit SDPA out at bf16/fp16. */
static void test_attention_fused_fp32_bound(void) {
    if (!gpu_ready()) return;
    if (!reopen_with_attention("own")) return;
    attention_cases(TOL_FP32, TOL_FP32, 128);
    reopen_with_attention(NULL);
}

/* ---- elementwise ---- */

static const size_t ew_sizes[] = {1000, 1003, 3, 65536 + 1};

static void test_gelu(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof ew_sizes / sizeof ew_sizes[0]; s++)
        for (int off = 0; off < 2; off++) { /* off = 1: pointers not 16-byte aligned */
            size_t n = ew_sizes[s];
            snprintf(shape, sizeof shape, "n=%zu offset=%d", n, off);
            float *inp = hrand(n + off, 4), *out = hrand(n, 1), *dout = hrand(n + off, 1);
            float *dinp = hrand(n, 1);
            float *d_inp = dput_act(inp, n + off), *d_out = apoison(n + off), *d_dout = dput_act(dout, n + off);
            cpu->gelu_forward(out, inp + off, n);
            cpu->gelu_backward(dinp, inp + off, dout + off, n);
            gpu->gelu_forward(aoff(d_out, off), aoff(d_inp, off), n);
            expect_act("gelu_forward", aoff(d_out, off), out, n, TOL_FP32);
            float *d_dinp = apoison(n + off);
            gpu->gelu_backward(aoff(d_dinp, off), aoff(d_inp, off), aoff(d_dout, off), n);
            expect_act("gelu_backward", aoff(d_dinp, off), dinp, n, TOL_FP32);
            gpu->gelu_backward(aoff(d_dout, off), aoff(d_inp, off), aoff(d_dout, off), n); /* in place */
            expect_act("gelu_backward in place", aoff(d_dout, off), dinp, n, TOL_FP32);
            release();
        }
}

static void test_residual_accumulate(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof ew_sizes / sizeof ew_sizes[0]; s++)
        for (int off = 0; off < 2; off++) {
            size_t n = ew_sizes[s];
            snprintf(shape, sizeof shape, "n=%zu offset=%d", n, off);
            float *a = hrand(n + off, 1), *b = hrand(n + off, 1), *out = hrand(n, 1);
            float *a16 = hcopy(a, n + off), *b16 = hcopy(b, n + off);
            float *d_a16 = dput_act(a16, n + off), *d_b16 = dput_act(b16, n + off), *d_out = apoison(n + off);
            cpu->residual_forward(out, a16 + off, b16 + off, n);
            gpu->residual_forward(aoff(d_out, off), aoff(d_a16, off), aoff(d_b16, off), n);
            expect_act("residual_forward", aoff(d_out, off), out, n, TOL_FP32);
            /* accumulate is fp32 (F32: the trainer's loss sums) */
            float *d_a = dput(a, (n + off) * 4), *d_b = dput(b, (n + off) * 4);
            float *acc = hcopy(a + off, n);
            cpu->accumulate(acc, b + off, n);
            gpu->accumulate(d_a + off, d_b + off, n);
            expect("accumulate", d_a + off, acc, n, TOL_FP32);
            release();
        }
}

/* ---- cross-entropy ---- */

static const int ce_shapes[][3] = {{64, 1000, 1024}, {37, 50, 64}, {5, 37, 64}, {3, 50257, 50304}};

static void crossentropy_cases(int use_dev) {
    for (size_t s = 0; s < sizeof ce_shapes / sizeof ce_shapes[0]; s++)
        for (int with_grad = 0; with_grad < 2; with_grad++) {
            int N = ce_shapes[s][0], V = ce_shapes[s][1], Vp = ce_shapes[s][2];
            float dloss = with_grad ? 1.0f / N : 0.0f;
            snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d dloss=%g", N, V, Vp, dloss);
            size_t nl = (size_t)N * Vp;
            float *logits = hrand(nl, 4), *losses = hrand(N, 1);
            int *tgt = hrand_ids(N, V);
            float *d_logits = dput_act(logits, nl), *d_losses = dpoison(N);
            int *d_tgt = dput(tgt, N * sizeof(int));
            float *ref = hcopy(logits, nl);
            cpu->crossentropy(losses, ref, tgt, N, V, Vp, dloss);
            if (use_dev) {
                float scalars[8] = {0};
                scalars[5] = dloss;
                float *d_sc = dput(scalars, sizeof scalars);
                gpu->crossentropy_dev(d_losses, d_logits, d_tgt, N, V, Vp, d_sc);
            } else {
                gpu->crossentropy(d_losses, d_logits, d_tgt, N, V, Vp, dloss);
            }
            expect("crossentropy losses", d_losses, losses, N, TOL_FP32);
            if (with_grad) expect_act("crossentropy dlogits", d_logits, ref, nl, TOL_FP32);
            else expect_act_within("crossentropy logits unchanged", d_logits, ref, nl, 0.0);
            release();
        }
}

static void test_crossentropy(void) {
    if (!gpu_ready()) return;
    crossentropy_cases(0);
}

static void test_crossentropy_dev(void) {
    if (!gpu_ready()) return;
    if (!gpu->crossentropy_dev) {
        check_fail_why("the CUDA backend has no crossentropy_dev, which it is meant to have");
        return;
    }
    crossentropy_cases(1);
}

/* ---- AdamW and sumsq ---- */

static const size_t opt_sizes[] = {10007, 4, 1 << 20};

static void test_adamw(void) {
    if (!gpu_ready()) return;
    for (size_t s = 0; s < sizeof opt_sizes / sizeof opt_sizes[0]; s++)
        for (int off = 0; off < 2; off++) {
            size_t n = opt_sizes[s];
            snprintf(shape, sizeof shape, "n=%zu offset=%d", n, off);
            float *p = hrand(n + off, 1), *g = hrand(n + off, 1), *m = hrand(n + off, 0.1f);
            float *v = hrand(n + off, 0.1f);
            for (size_t i = 0; i < n + off; i++) v[i] = fabsf(v[i]);
            float *d_p = dput(p, (n + off) * 4), *d_g = dput(g, (n + off) * 4),
                  *d_m = dput(m, (n + off) * 4), *d_v = dput(v, (n + off) * 4);
            loom_adamw_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .grad_scale = 0.5f, .t = 3};
            cpu->adamw(p + off, g + off, m + off, v + off, n, &hp);
            gpu->adamw(d_p + off, d_g + off, d_m + off, d_v + off, n, &hp);
            expect("adamw params", d_p + off, p + off, n, TOL_FP32);
            expect("adamw m", d_m + off, m + off, n, TOL_FP32);
            expect("adamw v", d_v + off, v + off, n, TOL_FP32);
            release();
        }
}

static void test_adamw_dev(void) {
    if (!gpu_ready()) return;
    if (!gpu->adamw_dev) {
        check_fail_why("the CUDA backend has no adamw_dev, which it is meant to have");
        return;
    }
    /* mode 0: plain; 1: clipped by max_norm; 2: sumsq = inf, step skipped */
    for (int mode = 0; mode < 3; mode++) {
        size_t n = 10007;
        snprintf(shape, sizeof shape, "n=%zu mode=%s", n,
                 mode == 0 ? "plain" : mode == 1 ? "clipped" : "skipped");
        float *p = hrand(n, 1), *g = hrand(n, 1), *m = hrand(n, 0.1f), *v = hrand(n, 0.1f);
        for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        float *d_p = dput(p, n * 4), *d_g = dput(g, n * 4), *d_m = dput(m, n * 4),
              *d_v = dput(v, n * 4);
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
        float gs = 0.5f, max_norm = mode == 1 ? 0.25f * (float)sqrt(ss) * gs : 0.0f;
        float scalars[8] = {2e-3f, gs, 7.0f, max_norm, mode == 2 ? INFINITY : (float)ss, 0, 0, 0};
        float *d_sc = dput(scalars, sizeof scalars);
        /* host-side values that adamw_dev must ignore */
        loom_adamw_t hp = {.lr = 99.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .grad_scale = 99.0f, .t = 1};
        gpu->adamw_dev(d_p, d_g, d_m, d_v, n, &hp, d_sc);
        if (mode < 2) {
            hp.lr = scalars[0];
            hp.t = 7;
            float norm = (float)sqrt(ss) * gs;
            hp.grad_scale = mode == 1 ? gs * (max_norm / norm) : gs;
            cpu->adamw(p, g, m, v, n, &hp);
        }
        expect("adamw_dev params", d_p, p, n, TOL_FP32);
        expect("adamw_dev m", d_m, m, n, TOL_FP32);
        expect("adamw_dev v", d_v, v, n, TOL_FP32);
        release();
    }
}

static void test_sumsq(void) {
    if (!gpu_ready()) return;
    const size_t sizes[] = {1, 1000, 1003, (1 << 20) + 3};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        snprintf(shape, sizeof shape, "n=%zu", n);
        float *x = hrand(n, 1);
        float *d_x = dput(x, n * 4);
        double ref = cpu->sumsq(x, n), got = gpu->sumsq(d_x, n);
        double err = fabs(got - ref) / fmax(ref, 1e-30);
        CHECK(err <= TOL_FP32, "sumsq [%s]: %.17g vs cpu %.17g (rel %.3g)", shape, got, ref,
              err);
        if (gpu->sumsq_dev) {
            float acc0 = 2.0f, acc;
            float *d_acc = dput(&acc0, sizeof acc0);
            gpu->sumsq_dev(d_acc, d_x, n);
            gpu->download(&acc, d_acc, sizeof acc);
            double e2 = fabs(acc - (ref + 2.0)) / (ref + 2.0);
            CHECK(e2 <= TOL_FP32, "sumsq_dev [%s]: %.9g vs cpu %.9g + 2", shape, acc, ref);
        }
        release();
    }
}

/* ---- CUDA graphs: replay gives what plain launches give ---- */

/* A small step: matmul, gelu, layernorm, cross-entropy with device dloss
 * (its gradient overwrites y), a weight gradient from it, sumsq into the
 * device scalars, AdamW from the device scalars. Not a true gradient of
 * the loss (gelu and layernorm backward are left out), which does not
 * matter here: the test compares replay with plain launches. */
typedef struct {
    float *x, *w, *dw, *h, *a, *y, *mean, *rstd, *lnw, *lnb, *losses, *sc, *m, *v;
    int *tgt;
} graph_bufs;

static void graph_step(graph_bufs *b, int N, int C, int V) {
    loom_adamw_t hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    gpu->matmul_forward(b->h, b->x, b->w, NULL, N, C, V);
    gpu->gelu_forward(b->a, b->h, (size_t)N * V);
    gpu->layernorm_forward(b->y, b->mean, b->rstd, b->a, b->lnw, b->lnb, N, V);
    gpu->crossentropy_dev(b->losses, b->y, b->tgt, N, V, V, b->sc);
    gpu->zero(b->dw, (size_t)V * C * sizeof(float));
    gpu->matmul_backward(NULL, b->dw, NULL, b->y, b->x, b->w, N, C, V);
    gpu->zero(b->sc + 4, sizeof(float));
    gpu->sumsq_dev(b->sc + 4, b->dw, (size_t)V * C);
    gpu->adamw_dev(b->w, b->dw, b->m, b->v, (size_t)V * C, &hp, b->sc);
}

static void graph_setup(graph_bufs *b, int N, int C, int V, unsigned seed) {
    unsigned keep = seed_next;
    seed_next = seed; /* both copies start from the same data */
    b->x = dput_act(hrand((size_t)N * C, 1), (size_t)N * C);
    b->w = dput(hrand((size_t)V * C, 1), (size_t)V * C * 4);
    b->h = apoison((size_t)N * V);
    b->a = apoison((size_t)N * V);
    b->y = apoison((size_t)N * V);
    b->mean = dpoison(N);
    b->rstd = dpoison(N);
    b->lnw = dput(hrand(V, 1), V * 4);
    b->lnb = dput(hrand(V, 1), V * 4);
    b->losses = dpoison(N);
    b->tgt = dput(hrand_ids(N, V), N * sizeof(int));
    b->dw = dalloc((size_t)V * C * 4);
    b->m = dalloc((size_t)V * C * 4);
    b->v = dalloc((size_t)V * C * 4);
    b->sc = dalloc(8 * sizeof(float));
    seed_next = keep + 1000;
}

static void test_graph_replay(void) {
    if (!gpu_ready()) return;
    if (!gpu->graph_begin || !gpu->adamw_dev || !gpu->sumsq_dev || !gpu->crossentropy_dev) {
        check_fail_why("the CUDA backend has no graph or DEV entries, which it is meant to have");
        return;
    }
    const int N = 64, C = 96, V = 128; /* N x V logits: y doubles as the gradient */
    snprintf(shape, sizeof shape, "N=%d C=%d V=%d", N, C, V);
    graph_bufs plain, graph;
    unsigned s = seed_next;
    graph_setup(&plain, N, C, V, s);
    graph_setup(&graph, N, C, V, s);
    float scalars[8] = {1e-3f, 1.0f, 1.0f, 1.0f, 0, 1.0f / N, 0, 0};

    /* warm-up (sizes scratch, picks algorithms), then capture */
    gpu->upload(graph.sc, scalars, sizeof scalars);
    graph_step(&graph, N, C, V);
    gpu->upload(plain.sc, scalars, sizeof scalars);
    graph_step(&plain, N, C, V);
    loom_status st = gpu->graph_begin(7);
    CHECK(st == LOOM_OK, "graph_begin: %s", loom_errmsg());
    graph_step(&graph, N, C, V);
    st = gpu->graph_end(7);
    CHECK(st == LOOM_OK, "graph_end: %s", loom_errmsg());
    if (st != LOOM_OK) {
        release();
        return;
    }
    for (int step = 2; step <= 4; step++) {
        scalars[0] = 1e-3f * step; /* a schedule: replay must see the new lr and t */
        scalars[2] = (float)step;
        gpu->upload(graph.sc, scalars, sizeof scalars);
        st = gpu->graph_replay(7);
        CHECK(st == LOOM_OK, "graph_replay: %s", loom_errmsg());
        gpu->upload(plain.sc, scalars, sizeof scalars);
        graph_step(&plain, N, C, V);
    }
    float *w_plain = track_host(malloc((size_t)V * C * 4));
    float *l_plain = track_host(malloc((size_t)N * 4));
    gpu->download(w_plain, plain.w, (size_t)V * C * 4);
    gpu->download(l_plain, plain.losses, (size_t)N * 4);
    expect("graph replay weights", graph.w, w_plain, (size_t)V * C, 1e-6);
    expect("graph replay losses", graph.losses, l_plain, N, 1e-6);
    st = gpu->graph_replay(8);
    CHECK(st != LOOM_OK, "graph_replay of a key never captured must fail");
    gpu->graph_reset();
    release();
}

/* ---- peak table: pure C, runs in every build ---- */

static double peak(const char *name, int ma, int mi, int sms, int khz, loom_dtype d, char *src,
                   size_t n) {
    loom_cuda_gpu_t g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "%s", name);
    g.cc_major = ma, g.cc_minor = mi, g.sms = sms, g.clock_khz = khz;
    return loom_cuda_peak_flops(&g, d, src, n);
}

static void test_peak_table(void) {
    char src[320];
    struct {
        const char *name;
        int ma, mi, sms, khz;
        loom_dtype d;
        double tflops;
        const char *rule;
    } cases[] = {
        {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410000, LOOM_BF16, 312, "table"},
        {"NVIDIA A100-PCIE-40GB", 8, 0, 108, 1410000, LOOM_TF32, 156, "table"},
        {"NVIDIA A100 80GB PCIe", 8, 0, 108, 1410000, LOOM_FP32, 19.5, "table"},
        {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000, LOOM_BF16, 989.4, "table"},
        {"NVIDIA H100 PCIe", 9, 0, 114, 1755000, LOOM_FP16, 756, "table"},
        {"NVIDIA H100 NVL", 9, 0, 132, 1785000, LOOM_BF16, 835.5, "table"},
        {"NVIDIA H200", 9, 0, 132, 1980000, LOOM_BF16, 989.4, "table"},
        {"NVIDIA A10", 8, 6, 72, 1695000, LOOM_BF16, 125, "table"},
        {"NVIDIA L4", 8, 9, 58, 2040000, LOOM_BF16, 121, "table"},
        {"NVIDIA L40S", 8, 9, 142, 2520000, LOOM_BF16, 362, "table"},
        {"NVIDIA GeForce RTX 4090", 8, 9, 128, 2520000, LOOM_BF16, 165.2, "table"},
        {"Tesla V100-SXM2-16GB", 7, 0, 80, 1530000, LOOM_FP16, 125, "table"},
        {"Tesla V100-SXM2-16GB", 7, 0, 80, 1530000, LOOM_BF16, 15.7, "table"},
        /* MIG: table rate scaled by the slice's SMs */
        {"NVIDIA A100-SXM4-40GB MIG 3g.20gb", 8, 0, 42, 1410000, LOOM_BF16, 312.0 * 42 / 108,
         "MIG slice"},
        {"NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9, 0, 16, 1980000, LOOM_BF16,
         989.4 * 16 / 132, "MIG slice"},
        /* unknown names: SMs x clock x per-SM rate */
        {"NVIDIA Future 9000", 9, 0, 100, 1500000, LOOM_BF16, 100 * 1.5 * 4096 / 1000, "rule"},
        {"NVIDIA GeForce RTX 5090", 12, 0, 170, 2407000, LOOM_BF16, 170 * 2.407 * 512 / 1000,
         "rule"},
        {"NVIDIA Next", 13, 0, 100, 2000000, LOOM_BF16, 100 * 2.0 * 1024 / 1000, "rule"},
        {"NVIDIA Quadro P6000", 6, 1, 30, 1500000, LOOM_BF16, 0, "unknown"},
        {"NVIDIA Mystery", 9, 0, 100, 0, LOOM_BF16, 0, "unknown"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = peak(cases[i].name, cases[i].ma, cases[i].mi, cases[i].sms, cases[i].khz,
                          cases[i].d, src, sizeof src);
        double want = cases[i].tflops * 1e12;
        CHECK(fabs(got - want) <= 1e-6 * fmax(want, 1), "%s %s: %.4g TFLOP/s, want %.4g (%s)",
              cases[i].name, loom_dtype_name(cases[i].d), got / 1e12, cases[i].tflops, src);
        CHECK(strncmp(src, cases[i].rule, strlen(cases[i].rule)) == 0,
              "%s: source \"%s\" should start with \"%s\"", cases[i].name, src, cases[i].rule);
    }
}

static void test_peak_never_negative(void) {
    char src[320];
    const char *names[] = {"", "NVIDIA", "MIG", "A10 MIG", "NVIDIA A100", "x A100-", "H100",
                           "NVIDIA H100 NVL MIG 7g.94gb"};
    int ccs[][2] = {{0, 0}, {5, 2}, {7, 0}, {7, 5}, {8, 0}, {8, 6}, {8, 7}, {8, 9}, {9, 0},
                    {10, 0}, {11, 0}, {12, 0}, {99, 9}};
    int sms[] = {-5, 0, 1, 200, 10000};
    for (size_t a = 0; a < sizeof names / sizeof names[0]; a++)
        for (size_t b = 0; b < sizeof ccs / sizeof ccs[0]; b++)
            for (size_t c = 0; c < sizeof sms / sizeof sms[0]; c++)
                for (int d = 0; d < 4; d++) {
                    double p = peak(names[a], ccs[b][0], ccs[b][1], sms[c], 1500000, d, src,
                                    sizeof src);
                    CHECK(p >= 0 && isfinite(p) && p < 1e18 && src[0],
                          "\"%s\" sm_%d%d %d SMs %s: %g (%s)", names[a], ccs[b][0], ccs[b][1],
                          sms[c], loom_dtype_name(d), p, src);
                }
}

/* ---- main ---- */

typedef struct {
    const char *name;
    void (*fn)(void);
    const char *covers; /* the ops.h entries the case checks, space-separated */
} gpu_case;

/* ---- the inference engine's ops (paged KV cache) ---- */

static void test_paged_rows(void) {
    if (!gpu_ready()) return;
    const int N = 5, C = 96, OC = 200, V = 50, maxT = 40;
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", N, C, OC);
    int *tok = hrand_ids(N, V), *pos = hrand_ids(N, maxT), rows[3] = {4, 0, 2};
    float *wte = hrand((size_t)V * C, 1), *wpe = hrand((size_t)maxT * C, 1), *x = hrand((size_t)N * C, 1);
    float *w = hrand((size_t)OC * C, 1), *bias = hrand(OC, 1), *y = hrand((size_t)N * OC, 1), *g = hrand(3 * (size_t)C, 1);
    float *d_x = apoison((size_t)N * C), *d_y = apoison((size_t)N * OC), *d_g = apoison(3 * (size_t)C);
    cpu->embed_positions(x, tok, pos, wte, wpe, N, C);
    gpu->embed_positions(d_x, dput(tok, N * 4), dput(pos, N * 4), dput(wte, (size_t)V * C * 4), dput(wpe, (size_t)maxT * C * 4), N, C);
    expect_act("embed_positions", d_x, x, (size_t)N * C, TOL_FP32);
    loom_backend_download_act(gpu, x, d_x, (size_t)N * C); /* the next ops read what the GPU holds */
    for (int gelu = 0; gelu < 2; gelu++) {
        cpu->matmul_forward_rows(y, x, w, bias, N, C, OC, gelu);
        gpu->matmul_forward_rows(d_y, d_x, dput(w, (size_t)OC * C * 4), dput(bias, OC * 4), N, C, OC, gelu);
        expect_act(gelu ? "matmul_forward_rows gelu" : "matmul_forward_rows", d_y, y, (size_t)N * OC,
                   gelu ? tol_gelu_epilogue() : tol_matmul());
    }
    cpu->gather_rows(g, x, rows, 3, C);
    gpu->gather_rows(d_g, d_x, dput(rows, sizeof rows), 3, C);
    expect_act_within("gather_rows", d_g, g, 3 * (size_t)C, 0.0);
    release();
}

/* Three sequences over scattered blocks of 8 tokens, 4 query heads of 32
 * over NKV cache heads. */
static void paged_kv_case(int NKV) {
    enum { NH = 4, hs = 32, C = NH * hs, bs = 8, nb = 20, mb = 6, N = 3 };
    snprintf(shape, sizeof shape, "N=%d NH=%d NKV=%d hs=%d block=%d", N, NH, NKV, hs, bs);
    int pos[N] = {0, 13, 41}, seq[N] = {0, 1, 2}, tables[3 * mb], slot[N];
    for (int i = 0; i < 3 * mb; i++) tables[i] = (i * 7 + 3) % nb;
    for (int i = 0; i < N; i++) slot[i] = tables[seq[i] * mb + pos[i] / bs] * bs + pos[i] % bs;
    size_t cache = (size_t)nb * 2 * NKV * bs * hs, QR = (size_t)C + 2 * NKV * hs;
    float *kc = hrand(cache, 1), *qkv = hrand((size_t)N * QR, 1), *out = hrand((size_t)N * C, 1);
    loom_tensor_t hk = {.data = kc, .dtype = LOOM_FP32, .rows = nb * 2 * NKV, .cols = bs * hs}, dk = hk;
    dk.data = dput(kc, cache * 4);
    int *d_pos = dput(pos, sizeof pos), *d_seq = dput(seq, sizeof seq), *d_tab = dput(tables, sizeof tables);
    float *d_qkv = dput_act(qkv, (size_t)N * QR), *d_out = apoison((size_t)N * C);
    cpu->kv_write(&hk, qkv, slot, N, NH, NKV, bs);
    gpu->kv_write(&dk, d_qkv, dput(slot, sizeof slot), N, NH, NKV, bs);
    expect("kv_write", dk.data, kc, cache, TOL_FP32);
    cpu->paged_attention(out, qkv, &hk, pos, seq, tables, mb, N, NH, NKV, bs);
    gpu->paged_attention(d_out, d_qkv, &dk, d_pos, d_seq, d_tab, mb, N, NH, NKV, bs);
    expect_act("paged_attention", d_out, out, (size_t)N * C, TOL_FP32);
    cpu->kv_copy_block(&hk, tables[0], nb - 1, NKV);
    gpu->kv_copy_block(&dk, tables[0], nb - 1, NKV);
    expect("kv_copy_block", dk.data, kc, cache, TOL_FP32);
    release();
}

static void test_paged_kv(void) {
    if (!gpu_ready()) return;
    paged_kv_case(4);
    paged_kv_case(2);
}

/* ---- int8 weights and the int8 KV cache (issue 16; src/backend/cuda/cuda_int8.cu) ---- */

/* A random int8 weight (OC,C) with positive scales, one per row (block 0)
 * or per block of `block`: the host tensor and its device copy. */
static void int8_weight(loom_tensor_t *hw, loom_tensor_t *dw, int OC, int C, int block) {
    size_t n = (size_t)OC * C, ns = block ? n / (size_t)block : (size_t)OC;
    signed char *wq = track_host(malloc(n));
    float *u = hrand(n, 1.0f), *sc = hrand(ns, 1.0f);
    for (size_t i = 0; i < n; i++) wq[i] = (signed char)lroundf(u[i] * 127.0f);
    for (size_t i = 0; i < ns; i++) sc[i] = 0.001f + fabsf(sc[i]) * 0.01f;
    *hw = (loom_tensor_t){.data = wq, .dtype = LOOM_INT8, .rows = OC, .cols = C, .scales = sc, .block = block};
    *dw = *hw;
    dw->data = dput(wq, n);
    dw->scales = dput(sc, ns * sizeof(float));
}

/* W8A32 and W8A8 against the CPU's on the same int8 weights and scales.
 * W8A8's int32 sums (per row, or per block of 32) are exact on both sides
 * and the activations are quantized by the same IEEE operations, so it must
 * agree to fp32 rounding (block sums, epilogue, GELU); W8A32 sums in fp32 in another order, and above 32
 * rows runs cuBLASLt at the dtype (the matmul bound). Shapes: decode and
 * prefill row counts, per-channel and block-32 scales, a GPT-2 width, and
 * a ragged one that cuBLASLt's int8 kernels refuse (own dp4a kernel). */
static void test_int8_matmul(void) {
    if (!gpu_ready()) return;
    if (!gpu->matmul_forward_w8 || !gpu->matmul_forward_w8a8) {
        check_fail_why("the CUDA backend has no int8 matmul variant (cuda_int8.cu), which it is meant to have");
        return;
    }
    static const int shapes[][4] = {{5, 96, 200, 0}, {5, 96, 200, 32}, {70, 96, 200, 0}, {70, 128, 64, 32},
                                    {3, 90, 37, 0},  {1, 768, 2304, 0}, {16, 768, 768, 0}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        int N = shapes[t][0], C = shapes[t][1], OC = shapes[t][2], block = shapes[t][3];
        snprintf(shape, sizeof shape, "N=%d C=%d OC=%d block=%d", N, C, OC, block);
        loom_tensor_t hw, dw;
        int8_weight(&hw, &dw, OC, C, block);
        float *x = hrand((size_t)N * C, 2.0f), *bias = hrand(OC, 1), *y = hrand((size_t)N * OC, 1);
        float *d_x = dput_act(x, (size_t)N * C), *d_b = dput(bias, OC * 4), *d_y = apoison((size_t)N * OC);
        double tol_w8 = N > 32 ? tol_matmul() : TOL_FP32, tol_w8a8 = TOL_FP32;
        for (int gelu = 0; gelu < 2; gelu++) {
            cpu->matmul_forward_w8(y, x, &hw, bias, N, C, OC, gelu);
            gpu->matmul_forward_w8(d_y, d_x, &dw, d_b, N, C, OC, gelu);
            expect_act(gelu ? "matmul_forward_w8 gelu" : "matmul_forward_w8", d_y, y, (size_t)N * OC, tol_w8);
            cpu->matmul_forward_w8a8(y, x, &hw, gelu ? bias : NULL, N, C, OC, gelu);
            gpu->matmul_forward_w8a8(d_y, d_x, &dw, gelu ? d_b : NULL, N, C, OC, gelu);
            expect_act(gelu ? "matmul_forward_w8a8 bias gelu" : "matmul_forward_w8a8 no bias", d_y, y, (size_t)N * OC,
                       tol_w8a8);
        }
    }
    release();
}

/* Downloads n bytes of d and counts those that differ from ref. */
static size_t bytes_differ(const void *d, const void *ref, size_t n) {
    unsigned char *got = track_host(malloc(n ? n : 1));
    gpu->download(got, d, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != ((const unsigned char *)ref)[i];
    return bad;
}

/* The int8 KV cache: a batched prefill of three sequences over scattered
 * blocks of 8 (keys growing along each sequence, so block scales rise and
 * earlier tokens are requantized), compared byte for byte and scale for
 * scale with the CPU; attention over it; a copy-on-write block copy. */
static void int8_kv_case(int NKV) {
    enum { NH = 4, hs = 32, C = NH * hs, bs = 8, nb = 20, mb = 6, S = 3 };
    int len[S] = {5, 14, 21}, N = 0, tables[S * mb], pos[40], seq[40], slot[40];
    for (int i = 0; i < S * mb; i++) tables[i] = (i * 7 + 3) % nb;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < len[s]; p++, N++)
            pos[N] = p, seq[N] = s, slot[N] = tables[s * mb + p / bs] * bs + p % bs;
    snprintf(shape, sizeof shape, "N=%d NH=%d NKV=%d hs=%d block=%d", N, NH, NKV, hs, bs);
    size_t rows = (size_t)nb * 2 * NKV, cache = rows * bs * hs, QR = (size_t)C + 2 * NKV * hs;
    float *qkv = hrand((size_t)N * QR, 1), *out = hrand((size_t)N * C, 1);
    for (int i = 0; i < N; i++)
        for (size_t c = 0; c < QR; c++) qkv[(size_t)i * QR + c] *= 1.0f + 0.15f * (float)pos[i];
    signed char *kc = track_host(calloc(cache, 1));
    float *sc = track_host(calloc(rows, sizeof(float)));
    loom_tensor_t hk = {.data = kc, .dtype = LOOM_INT8, .rows = (long long)rows, .cols = bs * hs, .scales = sc};
    loom_tensor_t dk = hk;
    dk.data = dput(kc, cache);
    dk.scales = dput(sc, rows * sizeof(float));
    /* qkv and out are activations (16-bit at bf16/fp16); qkv rounded in
     * place, so the CPU quantizes the values the GPU reads */
    float *d_qkv = dput_act(qkv, (size_t)N * QR), *d_out = apoison((size_t)N * C);
    cpu->kv_write(&hk, qkv, slot, N, NH, NKV, bs);
    gpu->kv_write(&dk, d_qkv, dput(slot, N * sizeof(int)), N, NH, NKV, bs);
    size_t bad = bytes_differ(dk.data, kc, cache);
    CHECK(bad == 0, "kv_write int8 [%s]: %zu of %zu cache bytes differ from the CPU's (LOOM_TEST_SEED=%u)", shape, bad,
          cache, seed0);
    expect("kv_write int8 scales", dk.scales, sc, rows, 0.0);
    cpu->paged_attention(out, qkv, &hk, pos, seq, tables, mb, N, NH, NKV, bs);
    gpu->paged_attention(d_out, d_qkv, &dk, dput(pos, N * sizeof(int)), dput(seq, N * sizeof(int)),
                         dput(tables, sizeof tables), mb, N, NH, NKV, bs);
    expect_act("paged_attention int8", d_out, out, (size_t)N * C, TOL_FP32);
    cpu->kv_copy_block(&hk, tables[mb + 1], nb - 1, NKV);
    gpu->kv_copy_block(&dk, tables[mb + 1], nb - 1, NKV);
    bad = bytes_differ(dk.data, kc, cache);
    CHECK(bad == 0, "kv_copy_block int8 [%s]: %zu cache bytes differ", shape, bad);
    expect("kv_copy_block int8 scales", dk.scales, sc, rows, 0.0);
    release();
}

static void test_int8_kv(void) {
    if (!gpu_ready()) return;
    if (!(gpu->dtypes & LOOM_DTYPE_BIT(LOOM_INT8))) {
        check_fail_why("the CUDA backend does not list int8 in its dtypes, so --kv-dtype int8 is refused there");
        return;
    }
    int8_kv_case(4);
    int8_kv_case(2);
}

/* ---- the Llama family's ops (src/backend/cuda/cuda_llama.cu) ---- */

/* RMSNorm, rotary embedding and SwiGLU, forward and backward, against the
 * CPU's; the encoder without a position table (rotary models). */
static void test_llama_ops(void) {
    if (!gpu_ready()) return;
    enum { N = 37, C = 96, H = 130, NH = 4, NKV = 2, hs = 24, QR = (NH + 2 * NKV) * hs };
    snprintf(shape, sizeof shape, "N=%d C=%d H=%d NH=%d NKV=%d hs=%d", N, C, H, NH, NKV, hs);
    float *x = hrand((size_t)N * C, 2), *w = hrand(C, 1), *out = hrand((size_t)N * C, 1), *rstd = hrand(N, 1);
    float *d_x = dput_act(x, (size_t)N * C), *d_w = dput(w, C * 4), *d_out = apoison((size_t)N * C), *d_rstd = dpoison(N);
    cpu->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    gpu->rmsnorm_forward(d_out, d_rstd, d_x, d_w, N, C, 1e-5f);
    expect_act("rmsnorm_forward out", d_out, out, (size_t)N * C, TOL_FP32);
    expect("rmsnorm_forward rstd", d_rstd, rstd, N, TOL_FP32);
    float *dout = hrand((size_t)N * C, 1), *dx = hrand((size_t)N * C, 1), *dw = hrand(C, 1);
    /* dout rounded to the activations' type before the CPU reads it */
    float *d_dx = dput_act(dx, (size_t)N * C), *d_dw = dput(dw, C * 4), *d_dout = dput_act(dout, (size_t)N * C);
    cpu->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    gpu->rmsnorm_backward(d_dx, d_dw, d_dout, d_x, d_w, dput(rstd, N * 4), N, C);
    expect_act("rmsnorm_backward dinp", d_dx, dx, (size_t)N * C, TOL_FP32);
    expect("rmsnorm_backward dw", d_dw, dw, C, TOL_FP32);

    int *pos = hrand_ids(N, 4000);
    float freq[hs / 2], *qkv = hrand((size_t)N * QR, 1);
    for (int j = 0; j < hs / 2; j++) freq[j] = powf(10000.0f, -2.0f * j / hs);
    int *d_pos = dput(pos, N * sizeof(int));
    float *d_freq = dput(freq, sizeof freq), *d_qkv = dput_act(qkv, (size_t)N * QR);
    cpu->rope_forward(qkv, pos, freq, N, NH, NKV, hs);
    gpu->rope_forward(d_qkv, d_pos, d_freq, N, NH, NKV, hs);
    expect_act("rope_forward", d_qkv, qkv, (size_t)N * QR, TOL_FP32);
    cpu->rope_backward(qkv, pos, freq, N, NH, NKV, hs);
    gpu->rope_backward(d_qkv, d_pos, d_freq, N, NH, NKV, hs);
    expect_act("rope_backward", d_qkv, qkv, (size_t)N * QR, TOL_FP32);

    float *gu = hrand((size_t)N * 2 * H, 3), *act = hrand((size_t)N * H, 1), *dact = hrand((size_t)N * H, 1);
    float *dgu = hrand((size_t)N * 2 * H, 1), *d_gu = dput_act(gu, (size_t)N * 2 * H), *d_act = apoison((size_t)N * H);
    float *d_dgu = apoison((size_t)N * 2 * H);
    cpu->swiglu_forward(act, gu, N, H);
    gpu->swiglu_forward(d_act, d_gu, N, H);
    expect_act("swiglu_forward", d_act, act, (size_t)N * H, TOL_FP32);
    float *d_dact = dput_act(dact, (size_t)N * H);
    cpu->swiglu_backward(dgu, gu, dact, N, H);
    gpu->swiglu_backward(d_dgu, d_gu, d_dact, N, H);
    expect_act("swiglu_backward", d_dgu, dgu, (size_t)N * 2 * H, TOL_FP32);

    int *tok = hrand_ids(N, 50);
    float *wte = hrand((size_t)50 * C, 1), *enc = hrand((size_t)N * C, 1), *d_enc = apoison((size_t)N * C);
    cpu->encoder_forward(enc, tok, wte, NULL, 1, N, C);
    gpu->encoder_forward(d_enc, dput(tok, N * sizeof(int)), dput(wte, (size_t)50 * C * 4), NULL, 1, N, C);
    expect_act("encoder_forward without wpe", d_enc, enc, (size_t)N * C, TOL_FP32);
    release();
}

/* The 2:4 variant against the CPU's on the same compressed weights (values
 * + 2-bit positions, backend.h LOOM_LAYOUT_SPARSE24): on cuSPARSELt at
 * bf16/fp16 where the library loads, else dense cuBLASLt (fp32/tf32, or no
 * cuSPARSELt; cuda_sparse24.cu says which on stderr), both at the run's
 * dtype: the matmul bound. C = 100 (not a multiple of 8, which cuSPARSELt
 * refuses: dense), decode and prefill row counts, GPT-2 widths; the last
 * shape repeats after the weights are freed, so a new weight at an old
 * address must not reuse the old one's preparation. */
static void test_sparse24_matmul(void) {
    if (!gpu_ready()) return;
    if (!gpu->matmul_forward_s24) {
        check_fail_why("the CUDA backend has no matmul_forward_s24 (cuda_sparse24.cu), which it is meant to have");
        return;
    }
    static const int shapes[][3] = {{5, 100, 200}, {70, 128, 64}, {1, 768, 2304}, {16, 768, 768}, {16, 768, 768}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        int N = shapes[t][0], C = shapes[t][1], OC = shapes[t][2];
        size_t nm = (size_t)OC * ((C + 7) / 8);
        snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", N, C, OC);
        float *w = hrand((size_t)OC * C, 1), *vals = hrand((size_t)OC * C / 2, 1), *x = hrand((size_t)N * C, 1);
        float *bias = hrand(OC, 1), *y = hrand((size_t)N * OC, 1);
        unsigned char *meta = track_host(malloc(nm));
        loom_prune24_rows(w, OC, C);
        loom_sparse24_compress(w, OC, C, vals, meta);
        loom_tensor_t hw = {.data = vals, .dtype = LOOM_FP32, .rows = OC, .cols = C, .layout = LOOM_LAYOUT_SPARSE24,
                            .meta = meta}, dw = hw;
        dw.data = dput(vals, (size_t)OC * C / 2 * 4);
        dw.meta = dput(meta, nm);
        float *d_x = dput_act(x, (size_t)N * C), *d_b = dput(bias, OC * 4), *d_y = apoison((size_t)N * OC);
        for (int gelu = 0; gelu < 2; gelu++) {
            cpu->matmul_forward_s24(y, x, &hw, gelu ? bias : NULL, N, C, OC, gelu);
            gpu->matmul_forward_s24(d_y, d_x, &dw, gelu ? d_b : NULL, N, C, OC, gelu);
            expect_act(gelu ? "matmul_forward_s24 bias gelu" : "matmul_forward_s24 no bias", d_y, y, (size_t)N * OC,
                       tol_matmul());
        }
        release(); /* frees the weight */
    }
}

/* Opening cuda:0 at another dtype hands out another table and leaves the
 * one already held as it was (the table was one static, rewritten on every
 * open); opening at the first dtype again gives the first table back. */
static void test_tables_stay(void) {
    if (!gpu_ready()) return;
    loom_backend_t before = *gpu;
    const loom_backend_t *other = NULL, *again = NULL;
    loom_dtype od = dtype == LOOM_FP32 ? LOOM_FP16 : LOOM_FP32;
    CHECK(loom_backend_open(&other, "cuda:0", 1, od) == LOOM_OK, "opening cuda:0 at %s: %s", loom_dtype_name(od),
          loom_errmsg());
    CHECK(other != gpu, "cuda:0 at %s and at %s share one table", loom_dtype_name(dtype), loom_dtype_name(od));
    CHECK(memcmp(&before, gpu, sizeof before) == 0, "opening cuda:0 at %s rewrote the %s table", loom_dtype_name(od),
          loom_dtype_name(dtype));
    CHECK(loom_backend_open(&again, "cuda:0", 1, dtype) == LOOM_OK && again == gpu,
          "opening cuda:0 at %s again did not give its table back", loom_dtype_name(dtype));
}

/* llama.cpp's block formats (q4_0 .. q6_K) have no CUDA kernel yet: the
 * CUDA table leaves matmul_forward_kq empty and a model moved to the GPU
 * runs those layers on their dequantized fp32 values (said at load;
 * docs/quantization.md). When a kernel lands this case must test it. */
static void test_kquant_absent(void) {
    if (!gpu_ready()) return;
    CHECK(gpu->matmul_forward_kq == NULL, "the CUDA table fills matmul_forward_kq: give it a case against the CPU kernel");
}

/* ---- a vocabulary shard (tensor parallelism) ---- */

/* Two ranks' shards of a vocabulary of V = 150 ids (rows v0..v0+nv-1 each,
 * the second shorter, as when V does not divide): the embedding with and
 * without its position term, the cross-entropy statistics of each shard,
 * and the finish that combines both shards' statistics into losses and the
 * shard's logit gradients. */
static void test_vocab_shard(void) {
    if (!gpu_ready()) return;
    enum { B = 3, T = 11, C = 40, N = B * T, V = 150, Vp = 128 };
    const int v0s[2] = {0, 128}, nvs[2] = {128, V - 128};
    int *tok = hrand_ids(N, V), *d_tok = dput(tok, N * sizeof(int));
    float *stats = hrand((size_t)2 * N * 3, 1), *logits[2];
    for (int r = 0; r < 2; r++) {
        int v0 = v0s[r], nv = nvs[r];
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d shard %d..%d of %d", B, T, C, v0, v0 + nv, V);
        float *wte = hrand((size_t)nv * C, 1), *wpe = hrand((size_t)T * C, 1), *out = hrand((size_t)N * C, 1);
        float *d_wte = dput(wte, (size_t)nv * C * 4), *d_wpe = dput(wpe, (size_t)T * C * 4), *d_out = apoison((size_t)N * C);
        cpu->vocab_embed_forward(out, tok, wte, r ? NULL : wpe, B, T, C, v0, nv);
        gpu->vocab_embed_forward(d_out, d_tok, d_wte, r ? NULL : d_wpe, B, T, C, v0, nv);
        expect_act("vocab_embed_forward out", d_out, out, (size_t)N * C, TOL_FP32 + tol_act());
        float *dout = hrand((size_t)N * C, 1), *dwte = hrand((size_t)nv * C, 1), *dwpe = hrand((size_t)T * C, 1);
        float *d_dwte = dput(dwte, (size_t)nv * C * 4), *d_dwpe = dput(dwpe, (size_t)T * C * 4);
        float *d_dout = dput_act(dout, (size_t)N * C);
        cpu->vocab_embed_backward(dwte, r ? NULL : dwpe, dout, tok, B, T, C, v0, nv);
        gpu->vocab_embed_backward(d_dwte, r ? NULL : d_dwpe, d_dout, d_tok, B, T, C, v0, nv);
        expect("vocab_embed_backward dwte", d_dwte, dwte, (size_t)nv * C, TOL_FP32);
        if (!r) expect("vocab_embed_backward dwpe", d_dwpe, dwpe, (size_t)T * C, TOL_FP32);
        logits[r] = hrand((size_t)N * Vp, 3);
        float *d_logits = dput_act(logits[r], (size_t)N * Vp), *d_stats = dpoison((size_t)N * 3);
        cpu->vocab_ce_stats(stats + (size_t)r * N * 3, logits[r], tok, N, Vp, v0, nv);
        gpu->vocab_ce_stats(d_stats, d_logits, d_tok, N, Vp, v0, nv);
        expect("vocab_ce_stats", d_stats, stats + (size_t)r * N * 3, (size_t)N * 3, TOL_FP32);
    }
    for (int r = 0; r < 2; r++) {
        snprintf(shape, sizeof shape, "N=%d shard %d..%d of %d", N, v0s[r], v0s[r] + nvs[r], V);
        float *losses = hrand(N, 1), *d_losses = dpoison(N);
        float *d_logits = dput_act(logits[r], (size_t)N * Vp), *d_stats = dput(stats, (size_t)2 * N * 3 * 4);
        cpu->vocab_ce_finish(losses, logits[r], tok, stats, 2, N, Vp, v0s[r], nvs[r], 1.0f / N);
        gpu->vocab_ce_finish(d_losses, d_logits, d_tok, d_stats, 2, N, Vp, v0s[r], nvs[r], 1.0f / N);
        expect("vocab_ce_finish losses", d_losses, losses, N, TOL_FP32);
        expect_act("vocab_ce_finish dlogits", d_logits, logits[r], (size_t)N * Vp, TOL_FP32 + tol_act());
    }
    release();
}

/* ---- the NCCL transport's bf16 and fp16 (parallel/dist_nccl.c) ---- */

typedef int (*to_bf16_fn)(uint16_t *, const float *, size_t, void *);
typedef int (*from_bf16_fn)(float *, const uint16_t *, size_t, void *);
typedef loom_status (*nccl_join_fn)(dist_join_t *, const dist_join_t *, int, double);

/* n random floats, every 7th a tie for bf16 (the 16 dropped bits exactly
 * 0x8000), with the host's rounding of them (nearest even). */
static float *bf16_cases(size_t n, uint16_t **want) {
    float *x = hrand(n, 3);
    for (size_t i = 0; i < n; i += 7) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (u & 0xffff0000u) | 0x8000u;
        memcpy(&x[i], &u, 4);
    }
    *want = track_host(malloc(n * sizeof **want));
    loom_dtype_from_f32(*want, x, LOOM_BF16, n);
    return x;
}

/* d (n fp32, device) holds exactly the widened `want` (bf16 bits). */
static void expect_widened(const char *what, const float *d, const uint16_t *want, size_t n) {
    float *got = track_host(malloc(n * sizeof(float))), *ref = track_host(malloc(n * sizeof(float)));
    gpu->download(got, d, n * sizeof(float));
    loom_dtype_to_f32(ref, want, LOOM_BF16, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], 4) && !bad++) first = i;
    CHECK(bad == 0, "%s [%s]: %zu of %zu differ from the host's bf16 rounding, the first at %zu: %.9g, want %.9g (LOOM_TEST_SEED=%u)",
          what, shape, bad, n, first, got[first], ref[first], seed0);
}

/* --grad-dtype bf16's conversions (cuda_wire.h) on the backend's stream,
 * bitwise against the host's rounding, ties included, and back. */
static void test_wire_bf16(void) {
    if (!gpu_ready()) return;
    char why[400];
    to_bf16_fn to = (to_bf16_fn)loom_cuda_symbol("loom_cuda_f32_to_bf16", why, sizeof why);
    from_bf16_fn back = (from_bf16_fn)loom_cuda_symbol("loom_cuda_bf16_to_f32", why, sizeof why);
    if (!to || !back) {
        check_fail_why("the plugin lacks the bf16 conversions: %s", why);
        return;
    }
    const size_t n = 4099;
    snprintf(shape, sizeof shape, "n=%zu", n);
    uint16_t *want, *got = track_host(malloc(n * 2));
    float *x = bf16_cases(n, &want), *d_x = dput(x, n * 4), *d_y = dpoison(n);
    uint16_t *d_w = dalloc(n * 2);
    CHECK(to(d_w, d_x, n, NULL) == 0 && back(d_y, d_w, n, NULL) == 0, "the conversion kernels did not launch");
    gpu->download(got, d_w, n * 2);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && !bad++) first = i;
    CHECK(bad == 0, "f32 -> bf16: %zu of %zu differ from the host's rounding, the first at %zu: %.9g -> %04x, want %04x",
          bad, n, first, x[first], got[first], want[first]);
    expect_widened("bf16 -> f32", d_y, want, n);
    release();
}

/* The NCCL transport with one rank (two ranks cannot share a GPU: NCCL
 * refuses a duplicate device), through its ops as dist.c calls them:
 * bf16 and fp16 buffers summed as stored come back unchanged; fp32 with
 * bf16 on the wire (all-reduce, then a larger reduce-scatter that grows
 * the transport's scratch) comes back as the host's bf16 rounding. No
 * NCCL library on the loader's path: SKIP. */
static void test_nccl_one_rank(void) {
    if (!gpu_ready()) return;
    char why[400];
    nccl_join_fn join = (nccl_join_fn)loom_cuda_symbol("dist_nccl_join", why, sizeof why);
    if (!join) {
        check_fail_why("the plugin lacks dist_nccl_join: %s", why);
        return;
    }
    dist_join_t boot = {.rank = 0, .size = 1, .name = "single"}, j;
    loom_status st = join(&j, &boot, 0, 120); /* a guard only */
    if (st == LOOM_EUNAVAIL) {
        check_skip("%s", loom_errmsg());
        return;
    }
    CHECK(st == LOOM_OK, "one-rank NCCL join: %s", loom_errmsg());
    if (st != LOOM_OK) return;
    const size_t n = 3001;
    for (int t = 0; t < 2; t++) { /* bf16, fp16 */
        snprintf(shape, sizeof shape, "n=%zu %s", n, t ? "fp16" : "bf16");
        float *x = hrand(n, 2);
        uint16_t *h = track_host(malloc(n * 2)), *got = track_host(malloc(n * 2));
        loom_dtype_from_f32(h, x, t ? LOOM_FP16 : LOOM_BF16, n);
        void *d = dput(h, n * 2);
        gpu->sync();
        CHECK(j.ops->allreduce(j.impl, d, n, t ? DIST_F16 : DIST_BF16, 1.0f) == LOOM_OK, "%s all-reduce: %s", shape, loom_errmsg());
        gpu->download(got, d, n * 2);
        CHECK(memcmp(got, h, n * 2) == 0, "%s: one rank's sum changed the buffer", shape);
    }
    for (int k = 0; k < 2; k++) { /* all-reduce of n, reduce-scatter of 2n */
        size_t m = n * (size_t)(k + 1), counts[1] = {m};
        snprintf(shape, sizeof shape, "n=%zu fp32 as bf16, %s", m, k ? "reduce-scatter" : "all-reduce");
        uint16_t *want;
        float *x = bf16_cases(m, &want), *d = dput(x, m * 4);
        gpu->sync();
        st = k ? j.ops->reduce_scatter(j.impl, d, counts, DIST_F32_AS_BF16, 1.0f)
               : j.ops->allreduce(j.impl, d, m, DIST_F32_AS_BF16, 1.0f);
        CHECK(st == LOOM_OK, "%s: %s", shape, loom_errmsg());
        expect_widened(shape, d, want, m);
    }
    j.ops->free(j.impl);
    release();
}

static const gpu_case gpu_cases[] = {
    {"kquant_absent", test_kquant_absent, "matmul_forward_kq"},
    {"encoder", test_encoder, "encoder_forward encoder_backward"},
    {"layernorm", test_layernorm, "layernorm_forward layernorm_backward"},
    {"residual_layernorm", test_residual_layernorm, "residual_layernorm_forward"},
    {"matmul_forward", test_matmul_forward, "matmul_forward"},
    {"matmul_backward", test_matmul_backward, "matmul_backward"},
    {"matmul_forward_gelu", test_matmul_forward_gelu, "matmul_forward_gelu"},
    {"matmul_backward_gelu", test_matmul_backward_gelu, "matmul_backward_gelu"},
    {"attention_fused", test_attention_fused, "attention_forward attention_backward"},
    {"attention_fused_fp32_bound", test_attention_fused_fp32_bound, ""},
    {"attention_unfused", test_attention_unfused, "attention_forward attention_backward"},
    {"gelu", test_gelu, "gelu_forward gelu_backward"},
    {"residual_accumulate", test_residual_accumulate, "residual_forward accumulate"},
    {"crossentropy", test_crossentropy, "crossentropy"},
    {"crossentropy_dev", test_crossentropy_dev, "crossentropy_dev"},
    {"adamw", test_adamw, "adamw"},
    {"adamw_dev", test_adamw_dev, "adamw_dev"},
    {"sumsq", test_sumsq, "sumsq sumsq_dev"},
    {"graph_replay", test_graph_replay, "zero graph_begin graph_end graph_replay graph_reset"},
    {"paged_rows", test_paged_rows, "embed_positions matmul_forward_rows gather_rows"},
    {"paged_kv", test_paged_kv, "kv_write paged_attention kv_copy_block"},
    {"int8_matmul", test_int8_matmul, "matmul_forward_w8 matmul_forward_w8a8"},
    {"int8_kv", test_int8_kv, "kv_write paged_attention kv_copy_block"},
    {"sparse24_matmul", test_sparse24_matmul, "matmul_forward_s24"},
    {"llama_ops", test_llama_ops, "rmsnorm_forward rmsnorm_backward rope_forward rope_backward swiglu_forward swiglu_backward"},
    {"vocab_shard", test_vocab_shard, "vocab_embed_forward vocab_embed_backward vocab_ce_stats vocab_ce_finish"},
    {"wire_bf16", test_wire_bf16, ""},
    {"nccl_one_rank", test_nccl_one_rank, ""},
    {"tables_stay", test_tables_stay, ""},
};

/* 1 when `name` is a whole word of the space-separated `list`. */
static int listed(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len)
        if ((p == list || p[-1] == ' ') && (p[len] == 0 || p[len] == ' ')) return 1;
    return 0;
}

/* Every op of ops.h that runs on the device (all kinds but MEM, whose
 * entries every case uses) has a case above: an op added to the list
 * without a GPU test fails here, on every machine. */
static void every_op_has_a_gpu_case(void) {
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        const loom_op_info_t *info = loom_op_info((loom_op_id)op);
        if (info->kind == LOOM_OPK_MEM) continue;
        int found = 0;
        for (size_t i = 0; i < sizeof gpu_cases / sizeof gpu_cases[0]; i++) found |= listed(gpu_cases[i].covers, info->name);
        CHECK(found, "%s (src/backend/ops.h) has no GPU case in tests/test_cuda_ops.c", info->name);
    }
}

/* Fills no_gpu with the reason no GPU case can run, or leaves it empty. */
static void probe_gpu(void) {
#ifdef LOOM_HAVE_CUDA
    char why[256] = "";
    int (*device_count)(char *, size_t) = (int (*)(char *, size_t))loom_cuda_symbol("loom_cuda_device_count", why, sizeof why);
    int n = device_count ? device_count(why, sizeof why) : -1;
    if (n <= 0) snprintf(no_gpu, sizeof no_gpu, "no CUDA device: %s", why);
#else
    snprintf(no_gpu, sizeof no_gpu,
             "this build has no CUDA (nvcc not found at build time, or NO_CUDA / SANITIZE set)");
#endif
}

/* LOOM_CUDA_OPS_ONLY=a,b,-c: only the cases whose name contains one of
 * the comma-separated parts and none of the parts after a '-'
 * (bench/gpu-check.sh's reduced runs under compute-sanitizer: "/bf16,
 * -nccl_one_rank"); only '-' parts: all but those; unset: all. */
static int case_selected(const char *name) {
    const char *only = getenv("LOOM_CUDA_OPS_ONLY");
    if (!only || !*only) return 1;
    char buf[512];
    int hit = 0, wanted = 0;
    snprintf(buf, sizeof buf, "%s", only);
    for (char *save = NULL, *part = strtok_r(buf, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
        if (part[0] == '-' && part[1] && strstr(name, part + 1)) return 0;
        if (part[0] != '-') wanted = 1, hit |= strstr(name, part) != NULL;
    }
    return hit || !wanted;
}

/* The cases selected (case_selected) and the dtype they run at. */
static int sel[sizeof gpu_cases / sizeof gpu_cases[0]], nsel;

/* In each child of check_run_isolated: the CPU reference, then cuda:0 at
 * `dtype`, or the reason why not. Both open there, not in the parent: a
 * CUDA context does not survive fork, and neither does OpenMP's pool. */
static void open_dtype(void) {
    probe_gpu();
    no_gpu_fails = 0;
    if (!no_gpu[0] && loom_backend_cpu_init(&cpu, 0) != LOOM_OK) {
        snprintf(no_gpu, sizeof no_gpu, "cannot open the CPU reference: %s", loom_errmsg());
        no_gpu_fails = 1;
        return;
    }
    loom_status st = no_gpu[0] ? LOOM_EUNAVAIL : loom_backend_open(&gpu, "cuda:0", 1, dtype);
    if (!no_gpu[0] && st != LOOM_OK) {
        /* EUNAVAIL: this GPU lacks the dtype (bf16 before sm_80), a SKIP;
         * anything else is a failure of every case at this dtype. */
        snprintf(no_gpu, sizeof no_gpu, "%s", loom_errmsg());
        no_gpu_fails = st != LOOM_EUNAVAIL;
    }
}

static const char *case_name(int i) {
    static char name[96];
    snprintf(name, sizeof name, "cuda_%s/%s", gpu_cases[sel[i]].name, loom_dtype_name(dtype));
    return name;
}

static void run_case(int i) {
    seed_next = seed0 + 7919u * (unsigned)((int)dtype * 64 + sel[i]);
    check_run(case_name(i), gpu_cases[sel[i]].fn);
}

/* The CPU table is generated from ops.h by name (src/backend/cpu/cpu.h):
 * it must hold every FUSED and VARIANT kernel (a kernel misnamed against
 * the convention would leave its weak slot NULL without a word) and no DEV
 * or GRAPH entry (its ops are synchronous). Runs after every fork: opening
 * the CPU backend starts OpenMP's threads. */
static void cpu_table_follows_the_list(void) {
    const loom_backend_t *c = NULL;
    if (!check_available(loom_backend_cpu_init(&c, 1), 0)) return;
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        const loom_op_info_t *info = loom_op_info((loom_op_id)op);
        int has = loom_backend_slot(c, (loom_op_id)op) != NULL;
        int want = info->kind != LOOM_OPK_DEV && info->kind != LOOM_OPK_GRAPH;
        CHECK(has == want, "the CPU table %s %s (kernel loom_cpu_%s)", has ? "has" : "lacks", info->name, info->name);
    }
}

/* ---- isolation: what the GPU check relies on ---- */

static void demo_pass(void) {}
static void demo_panic(void) { loom_panic(__FILE__, __LINE__, "a planted panic (LOOM_CUDA_OPS_DEMO=1)"); }
static const gpu_case demo_cases[] = {{"demo_before", demo_pass, ""}, {"demo_panics", demo_panic, ""},
                                      {"demo_after", demo_pass, ""}};
static const char *demo_name(int i) { return demo_cases[i].name; }
static void demo_run(int i) { check_run(demo_cases[i].name, demo_cases[i].fn); }

/* A case that panics (loom_panic aborts the process) FAILS alone, and the
 * case after it still runs and passes: this binary again, with
 * LOOM_CUDA_OPS_DEMO=1, runs the three demo cases isolated. */
static void isolation_survives_a_panic(void) {
    char self[4096], cmd[4200], out[8192] = "";
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        check_fail_why("readlink /proc/self/exe failed");
        return;
    }
    self[k] = 0;
    snprintf(cmd, sizeof cmd, "LOOM_CUDA_OPS_DEMO=1 '%s' 2>/dev/null", self);
    FILE *f = popen(cmd, "r");
    if (!f) {
        check_fail_why("popen %s failed", self);
        return;
    }
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    CHECK(strstr(out, "PASS demo_before\n") && strstr(out, "FAIL demo_panics: the test process died") &&
              strstr(out, "PASS demo_after\n"),
          "the demo run printed:\n%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the demo run's exit status is %d, want 1 (a case failed)", st);
}

int main(void) {
    if (getenv("LOOM_CUDA_OPS_DEMO")) {
        check_run_isolated(3, demo_name, NULL, demo_run);
        return check_main_end();
    }
    const char *env = getenv("LOOM_TEST_SEED");
    seed0 = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    seed_next = seed0;
    printf("# test_cuda_ops seed %u (LOOM_TEST_SEED=%u repeats this run)\n", seed0, seed0);
    RUN(test_peak_table);
    RUN(test_peak_never_negative);
    RUN(every_op_has_a_gpu_case);
    RUN(isolation_survives_a_panic);
    /* each dtype's cases in a child process: a case that panics (or
     * faults the device) fails alone, and the next one runs */
    for (int d = LOOM_FP32; d <= LOOM_FP16; d++) {
        dtype = (loom_dtype)d;
        nsel = 0;
        for (size_t i = 0; i < sizeof gpu_cases / sizeof gpu_cases[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "cuda_%s/%s", gpu_cases[i].name, loom_dtype_name(dtype));
            if (case_selected(name)) sel[nsel++] = (int)i;
        }
        check_run_isolated(nsel, case_name, open_dtype, run_case);
    }
    RUN(cpu_table_follows_the_list);
    return check_main_end();
}
