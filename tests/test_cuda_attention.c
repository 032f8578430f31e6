/* test_cuda_attention: the CUDA attention at GPT-2's shapes (head size 64,
 * T up to 1024) and at head size 128, ragged T included, per 16-bit dtype,
 * against the CPU op. At bf16 and fp16 these shapes take the tensor-core
 * path (cuDNN's SDPA when the plugin was built with cudnn-frontend), so the
 * bounds are the dtype's: activations stored with 8 (bf16) or 11 (fp16)
 * significant bits (the backend's act_dtype; the inputs are rounded on the
 * host first, so the CPU reads what the GPU reads), fp32 accumulation. Outputs are poisoned with NaN
 * before each launch; fresh random data each run (LOOM_TEST_SEED=N
 * repeats one). Each case prints its normalized errors.
 *
 * Without a GPU every case SKIPs with the reason; under LOOM_REQUIRE_GPU=1
 * (bench/gpu-check.sh) that SKIP is a FAIL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/plugin.h"
#include "check.h"

static const loom_backend_t *cpu, *gpu;
static char no_gpu[512];
static unsigned seed;

/* B, T, C, NH: GPT-2 small's heads (hs 64) at T 1024 and ragged T, and hs 128. */
static const int shapes[][4] = {{1, 1024, 768, 12}, {2, 1000, 256, 4}, {1, 77, 128, 2},
                                {1, 512, 256, 2},   {2, 333, 256, 2}};

static float *dev_copy(const float *h, size_t n) {
    float *d = gpu->alloc(n * sizeof(float));
    LOOM_ASSERT(d);
    gpu->upload(d, h, n * sizeof(float));
    return d;
}
static double err_vs(const float *d, const float *ref, size_t n) {
    float *h = malloc(n * sizeof(float));
    gpu->download(h, d, n * sizeof(float));
    double e = check_rel_err(h, ref, n);
    free(h);
    return isnan(e) ? INFINITY : e;
}
/* ACT tensors (qkv, out, dout, dqkv) live at gpu->act_dtype: h (n floats)
 * is rounded in place to that type and uploaded as it. */
static float *dev_act(float *h, size_t n) {
    size_t es = loom_dtype_size(gpu->act_dtype);
    void *tmp = malloc(n * es);
    loom_dtype_from_f32(tmp, h, gpu->act_dtype, n);
    loom_dtype_to_f32(h, tmp, gpu->act_dtype, n);
    float *d = gpu->alloc(n * es);
    LOOM_ASSERT(d);
    gpu->upload(d, tmp, n * es);
    free(tmp);
    return d;
}
/* n NaNs on the device: fp32 (lse) or, with act, an ACT tensor. */
static float *dev_nan(size_t n, int act) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = act ? dev_act(h, n) : dev_copy(h, n);
    free(h);
    return d;
}
static double err_act(const float *d, const float *ref, size_t n) {
    float *h = malloc(n * sizeof(float));
    loom_backend_download_act(gpu, h, d, n);
    double e = check_rel_err(h, ref, n);
    free(h);
    return isnan(e) ? INFINITY : e;
}

static void one_shape(loom_dtype dt, const int *s) {
    int B = s[0], T = s[1], C = s[2], NH = s[3];
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(nqkv * 4), *out = malloc(nout * 4), *lse = malloc(nl * 4), *dout = malloc(nout * 4),
          *dqkv = malloc(nqkv * 4);
    check_fill(qkv, nqkv, 1.5f, seed++);
    check_fill(dout, nout, 1.0f, seed++);
    float *d_qkv = dev_act(qkv, nqkv), *d_dout = dev_act(dout, nout), *d_out = dev_nan(nout, 1), *d_lse = dev_nan(nl, 0);
    cpu->attention_forward(out, lse, qkv, B, T, C, NH, NH);
    gpu->attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, NH);
    double e_out = err_act(d_out, out, nout), e_lse = err_vs(d_lse, lse, nl);
    /* backward from the CPU's forward results (out as the GPU stores it),
     * so it is tested alone */
    float *d_oref = dev_act(out, nout), *d_lref = dev_copy(lse, nl), *d_dqkv = dev_nan(nqkv, 1);
    cpu->attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH);
    gpu->attention_backward(d_dqkv, d_dout, d_qkv, d_oref, d_lref, B, T, C, NH, NH);
    double e_d = err_act(d_dqkv, dqkv, nqkv);
    gpu->sync();

    double tf = dt == LOOM_BF16 ? 1e-2 : 3e-3, tb = 2 * tf;
    printf("  %s B=%d T=%d C=%d NH=%d hs=%d: out %.2e, lse %.2e, dqkv %.2e (bounds %.0e, %.0e)\n",
           loom_dtype_name(dt), B, T, C, NH, C / NH, e_out, e_lse, e_d, tf, tb);
    CHECK(e_out <= tf && e_lse <= tf && e_d <= tb, "%s B=%d T=%d hs=%d: out %.3g lse %.3g dqkv %.3g (LOOM_TEST_SEED=%u)",
          loom_dtype_name(dt), B, T, C / NH, e_out, e_lse, e_d, seed);
    float *dev[] = {d_qkv, d_out, d_lse, d_dout, d_oref, d_lref, d_dqkv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(dev[i]);
    free(qkv), free(out), free(lse), free(dout), free(dqkv);
}

static loom_dtype cur;
static void attention_gpt2_shapes(void) {
    if (no_gpu[0]) {
        check_skip_gpu("%s", no_gpu);
        return;
    }
    if (!check_available(loom_backend_open(&gpu, "cuda:0", 1, cur), 1)) return;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) one_shape(cur, shapes[i]);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("# test_cuda_attention seed %u (LOOM_TEST_SEED=%u repeats this run)\n", seed, seed);
#ifdef LOOM_HAVE_CUDA
    char why[256] = "";
    int (*count)(char *, size_t) = (int (*)(char *, size_t))loom_cuda_symbol("loom_cuda_device_count", why, sizeof why);
    if ((count ? count(why, sizeof why) : -1) <= 0) snprintf(no_gpu, sizeof no_gpu, "no CUDA device: %s", why);
#else
    snprintf(no_gpu, sizeof no_gpu, "this build has no CUDA (nvcc not found at build time, or NO_CUDA / SANITIZE set)");
#endif
    if (!no_gpu[0] && loom_backend_cpu_init(&cpu, 0) != LOOM_OK) {
        printf("  cannot open the CPU reference: %s\n", loom_errmsg());
        return 1;
    }
    cur = LOOM_BF16;
    check_run("cuda_attention_gpt2_shapes/bf16", attention_gpt2_shapes);
    cur = LOOM_FP16;
    check_run("cuda_attention_gpt2_shapes/fp16", attention_gpt2_shapes);
    return check_main_end();
}
