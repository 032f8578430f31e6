/* test_cuda_model: the whole model and the training step on the GPU against
 * the CPU reference.
 *
 * GPU cases (each prints `SKIP name: <reason>` with the CUDA runtime's
 * reason, from loom_backend_open("cuda:0"), where no GPU can be used):
 * - loss and every parameter gradient of one forward/backward, GPU vs CPU,
 *   at fp32 and bf16;
 * - 20 training steps on the GPU (bf16, the device-resident step) track the
 *   CPU's loss curve;
 * - CUDA-graph replay gives the losses of plain launches, with and without
 *   gradient accumulation;
 * - fp16 with a loss scale too large for fp16 (2^30): steps are skipped, the scale
 *   backs off, training goes on and the loss falls;
 * - recompute all on the GPU gives the gradients of recompute none.
 * The bounds are set a priori (no GPU has run these yet): bf16 rounds the
 * GEMM inputs to 8 significant bits, so a two-layer model's gradients get
 * 5e-2 normalized error; fp32 2e-3: a different summation order (1e-5)
 * plus cuBLASLt's GELU epilogues, whose tanh may be the hardware
 * approximation (2^-11 relative: up to 5e-4 on a GELU output, 1e-3 on its
 * derivative, test_cuda_ops), which every gradient below the first MLP
 * carries, twice for two layers. Graph replay is bitwise: the kernels have
 * no float atomics (docs/cuda.md, "What must be bitwise, what may drift").
 *
 * CPU cases (run everywhere): the loss-scale policy, and the device-resident
 * step (train/step_graph.c) on a simulated device, the CPU backend plus
 * host versions of the step-scalar entries: same losses as loom_train_step,
 * an overflowing loss scale skips the update and leaves the parameters; and
 * with simulated CUDA graphs (ops recorded during capture, run on replay)
 * the same bits as plain launches, with no synchronizing call captured;
 * tensor and pipeline parallelism over 2 ranks on a simulated bf16 device
 * against the whole model on it (the GPU path's activation dtype, on the
 * host's transport). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "model/gpt.h"
#include "parallel/dist.h"
#include "parallel/tp.h"
#include "train/pipeline.h"
#include "train/step.h"
#include "train/step_graph.h"

static const loom_backend_t *cpu;

static loom_gpt_config_t cfg(void) {
    loom_gpt_config_t c = {.max_seq_len = 64, .vocab_size = 211, .n_layer = 2, .n_head = 4, .channels = 64};
    return c;
}
enum { B = 4, T = 64, BT = B * T, STEPS = 20 };

/* A batch with structure to learn: targets are the next token of a
 * repeating sequence. */
static void batch(int *in, int *tg, int n, int V, unsigned seed) {
    int seq[17];
    check_tokens(seq, 17, V, seed);
    for (int i = 0; i < n; i++) {
        in[i] = seq[i % 17];
        tg[i] = seq[(i + 1) % 17];
    }
}

static const loom_optim_t opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};

/* The GPU backend at `d`, or NULL after marking the case skipped with the
 * reason loom_backend_open gives when it says the GPU is unavailable (the
 * CUDA runtime's, or the build's; a FAIL under LOOM_REQUIRE_GPU=1), or
 * failed when it fails otherwise. */
static const loom_backend_t *gpu_or_skip(loom_dtype d) {
    const loom_backend_t *g = NULL;
    return check_available(loom_backend_open(&g, "cuda:0", 1, d), 1) ? g : NULL;
}

static loom_gpt_t *model(const loom_backend_t *be, unsigned long long seed) {
    loom_gpt_config_t c = cfg();
    loom_gpt_t *m = NULL;
    CHECK(loom_gpt_init(&m, &c, be, seed) == LOOM_OK, "init on %s: %s", be->name, loom_errmsg());
    if (m) CHECK(loom_gpt_alloc_train(m) == LOOM_OK, "alloc on %s: %s", be->name, loom_errmsg());
    return m;
}

/* A static loss scale for one forward/backward at `d`: fp16 activation
 * gradients of a mean over B*T positions are small enough to lose bits
 * to fp16's subnormals, so fp16 scales the loss gradient by 1024 (and the
 * gradients back), as training does with its dynamic scale. */
static float loss_scale_for(loom_dtype d) { return d == LOOM_FP16 ? 1024.0f : 1.0f; }

/* Loss of one forward/backward; the gradients copied to host memory. */
static float grads_host(loom_gpt_t *m, const int *in, const int *tg, float *out) {
    float loss = NAN, scale = loss_scale_for(m->be->act_dtype);
    loom_gpt_zero_grad(m);
    CHECK(loom_gpt_forward(m, in, tg, B, T, scale / BT, &loss) == LOOM_OK, "forward: %s", loom_errmsg());
    loom_gpt_backward(m, B, T);
    m->be->download(out, m->grads, m->num_params * sizeof(float));
    if (scale != 1.0f)
        for (size_t i = 0; i < m->num_params; i++) out[i] /= scale;
    return loss;
}

/* Checks every parameter's gradient; returns the largest error. */
static double compare_grads(const char *what, const loom_gpt_t *m, const float *got, const float *ref, double tol) {
    double worst = 0;
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *t = &m->ptable[i];
        if (!t->numel) continue; /* not in this variant */
        double e = check_rel_err(got + t->offset, ref + t->offset, t->numel);
        CHECK(e <= tol, "%s: gradient of %s: normalized error %.3g > %.3g", what, t->name, e, tol);
        if (e > worst) worst = e;
    }
    return worst;
}

/* ---- GPU cases ---- */

/* Loss and gradients of one forward/backward on `be` against the fp32 CPU.
 * With 16-bit activations the ACT block must also be about half the fp32
 * one's bytes (only the statistics and losses stay fp32). */
static void model_matches_cpu_on(const loom_backend_t *be, double tol_loss, double tol_grad) {
    loom_gpt_t *mc = model(cpu, 17), *mg = model(be, 17);
    if (!mc || !mg) return;
    int in[BT], tg[BT];
    batch(in, tg, BT, cfg().vocab_size, 1);
    float *gc = malloc(mc->num_params * sizeof(float)), *gg = malloc(mc->num_params * sizeof(float));
    float lc = grads_host(mc, in, tg, gc), lg = grads_host(mg, in, tg, gg);
    const char *d = loom_dtype_name(be->dtype);
    CHECK(fabs(lg - lc) <= tol_loss * fabs(lc), "%s: loss %.7g on %s vs %.7g on the CPU", d, lg, be->name, lc);
    double worst = compare_grads(d, mc, gg, gc, tol_grad);
    printf("  %s on %s: loss %.6f vs %.6f, worst gradient error %.3g (bound %.3g)\n", d, be->name, lg, lc, worst, tol_grad);
    if (be->act_dtype != LOOM_FP32)
        CHECK(mg->act_bytes < 0.6 * mc->act_bytes, "%s activations: %zu bytes vs %zu at fp32", d, mg->act_bytes, mc->act_bytes);
    free(gc);
    free(gg);
    loom_gpt_free(mc);
    loom_gpt_free(mg);
}

static void model_matches_cpu_at(loom_dtype d, double tol_loss, double tol_grad) {
    const loom_backend_t *gpu = gpu_or_skip(d);
    if (!gpu) return;
    CHECK(d == LOOM_FP32 || gpu->act_dtype == d, "cuda at %s stores activations as %s", loom_dtype_name(d), loom_dtype_name(gpu->act_dtype));
    model_matches_cpu_on(gpu, tol_loss, tol_grad);
}

/* The bounds: bf16 keeps 8 significant bits of every activation and
 * activation gradient (fp16 11), on top of the GEMMs' rounding; the
 * simulated-device cases below measure what storage alone does. */
static void cuda_model_matches_cpu_fp32(void) { model_matches_cpu_at(LOOM_FP32, 1e-4, 2e-3); }
static void cuda_model_matches_cpu_bf16(void) { model_matches_cpu_at(LOOM_BF16, 1e-2, 5e-2); }
static void cuda_model_matches_cpu_fp16(void) { model_matches_cpu_at(LOOM_FP16, 5e-3, 2e-2); }

/* Runs `steps` device-resident steps; losses into out. */
static int device_steps(loom_gpt_t *m, int graphs, int accum, int steps, loom_loss_scaler_t *ls, float *out, int *replays) {
    loom_step_graph_t *sg;
    if (loom_step_graph_init(&sg, m, graphs) != LOOM_OK) {
        CHECK(0, "step_graph_init: %s", loom_errmsg());
        return 0;
    }
    int in[BT * 2], tg[BT * 2], ok = 1;
    *replays = 0;
    for (int s = 0; s < steps && ok; s++) {
        batch(in, tg, BT * accum, cfg().vocab_size, 100 + (unsigned)s % 3);
        loom_step_result_t r;
        loom_status st = loom_step_graph_run(sg, in, tg, B, T, accum, &opt, 1e-3f, s + 1, ls, &r);
        CHECK(st == LOOM_OK, "step %d: %s", s + 1, loom_errmsg());
        ok = st == LOOM_OK;
        out[s] = r.loss;
        *replays += r.replayed;
    }
    loom_step_graph_free(sg);
    return ok;
}

/* STEPS device-resident steps on `be` (graphs when it has them) track
 * loom_train_step on the fp32 CPU within 2% per step, and the loss falls.
 * fp16 runs with the dynamic loss scale training uses (from 65536). */
static void training_tracks_cpu_on(const loom_backend_t *be) {
    loom_gpt_t *mc = model(cpu, 23), *mg = model(be, 23);
    if (!mc || !mg) return;
    float lc[STEPS], lg[STEPS];
    int replays;
    int in[BT], tg[BT];
    for (int s = 0; s < STEPS; s++) {
        float norm;
        batch(in, tg, BT, cfg().vocab_size, 100 + (unsigned)s % 3);
        CHECK(loom_train_step(mc, in, tg, B, T, 1, &opt, 1e-3f, s + 1, &lc[s], &norm) == LOOM_OK, "cpu step: %s", loom_errmsg());
    }
    loom_loss_scaler_t ls;
    loom_loss_scaler_init(&ls, 65536.0f, 2000);
    int graphs = be->graph_begin != NULL;
    if (device_steps(mg, graphs, 1, STEPS, be->caps & LOOM_CAP_LOSS_SCALING ? &ls : NULL, lg, &replays)) {
        for (int s = 0; s < STEPS; s++)
            CHECK(fabsf(lg[s] - lc[s]) <= 2e-2f * lc[s], "step %d: %s loss %.5f vs CPU %.5f", s + 1, be->name, lg[s], lc[s]);
        CHECK(lg[STEPS - 1] < lg[0] - 0.5f, "%s loss did not fall: %.4f -> %.4f", be->name, lg[0], lg[STEPS - 1]);
        CHECK(replays == (graphs ? STEPS - LOOM_STEP_GRAPH_WARMUP : 0), "%d of %d steps replayed a graph", replays, STEPS);
        printf("  %s: loss %.4f -> %.4f (CPU %.4f -> %.4f)\n", be->name, lg[0], lg[STEPS - 1], lc[0], lc[STEPS - 1]);
    }
    loom_gpt_free(mc);
    loom_gpt_free(mg);
}

static void training_tracks_cpu_at(loom_dtype d) {
    const loom_backend_t *gpu = gpu_or_skip(d);
    if (gpu) training_tracks_cpu_on(gpu);
}
static void cuda_training_tracks_cpu(void) { training_tracks_cpu_at(LOOM_BF16); }
static void cuda_training_tracks_cpu_fp16(void) { training_tracks_cpu_at(LOOM_FP16); }

/* 8 steps with graphs against 8 with plain launches, accum 1 and 2: the
 * same kernels in the same order on the same inputs, and none of them
 * orders a sum by timing (no float atomics: the encoder's dwte sums each
 * token's rows in row order, layernorm's dw/db sum per warp then in warp
 * and block order, cuDNN's SDPA backward runs its deterministic
 * algorithm), so the losses are the same bits at every dtype. */
static void graph_replay_matches_plain_at(loom_dtype d) {
    const loom_backend_t *gpu = gpu_or_skip(d);
    if (!gpu) return;
    loom_loss_scaler_t ls;
    for (int accum = 1; accum <= 2; accum++) {
        float lp[8], lr[8];
        int rp, rr;
        loom_gpt_t *a = model(gpu, 31);
        if (!a) return;
        loom_loss_scaler_init(&ls, 65536.0f, 2000);
        int ok = device_steps(a, 0, accum, 8, d == LOOM_FP16 ? &ls : NULL, lp, &rp);
        loom_gpt_free(a);
        loom_gpt_t *b = model(gpu, 31);
        if (!b) return;
        loom_loss_scaler_init(&ls, 65536.0f, 2000);
        ok = ok && device_steps(b, 1, accum, 8, d == LOOM_FP16 ? &ls : NULL, lr, &rr);
        loom_gpt_free(b);
        if (!ok) return;
        CHECK(rp == 0 && rr == 8 - LOOM_STEP_GRAPH_WARMUP, "accum %d: %d plain and %d graph steps replayed", accum, rp, rr);
        for (int s = 0; s < 8; s++)
            CHECK(lr[s] == lp[s], "%s accum %d step %d: graph %.9g vs plain %.9g (must be the same bits)",
                  loom_dtype_name(d), accum, s + 1, lr[s], lp[s]);
    }
}
static void cuda_graph_replay_matches_plain(void) { graph_replay_matches_plain_at(LOOM_FP32); }
static void cuda_graph_replay_matches_plain_bf16(void) { graph_replay_matches_plain_at(LOOM_BF16); }
static void cuda_graph_replay_matches_plain_fp16(void) { graph_replay_matches_plain_at(LOOM_FP16); }

static void cuda_fp16_loss_scaling(void) {
    const loom_backend_t *gpu = gpu_or_skip(LOOM_FP16);
    if (!gpu) return;
    loom_gpt_t *m = model(gpu, 41);
    if (!m) return;
    /* 2^30 / (B*T) = 4e6 per unit of logit gradient: beyond fp16's 65504
     * where the head's backward GEMM rounds its inputs to fp16. */
    const float start = 1073741824.0f;
    loom_loss_scaler_t ls;
    loom_loss_scaler_init(&ls, start, 2000);
    float l[STEPS];
    int replays;
    if (device_steps(m, 1, 1, STEPS, &ls, l, &replays)) {
        CHECK(ls.skipped >= 1, "no step was skipped at a loss scale of 2^30");
        CHECK(ls.scale < start, "the scale did not back off: %g", ls.scale);
        CHECK(l[STEPS - 1] < l[0] - 0.3f, "loss did not fall: %.4f -> %.4f", l[0], l[STEPS - 1]);
        printf("  fp16: %lld steps skipped, scale now %g, loss %.4f -> %.4f\n", ls.skipped, ls.scale, l[0], l[STEPS - 1]);
    }
    loom_gpt_free(m);
}

static void cuda_recompute_all_matches_none(void) {
    const loom_backend_t *gpu = gpu_or_skip(LOOM_FP32);
    if (!gpu) return;
    loom_gpt_t *a = model(gpu, 53), *b = model(gpu, 53);
    if (!a || !b) return;
    loom_gpt_set_recompute(b, LOOM_RECOMPUTE_ALL);
    int in[BT], tg[BT];
    batch(in, tg, BT, cfg().vocab_size, 7);
    float *ga = malloc(a->num_params * sizeof(float)), *gb = malloc(a->num_params * sizeof(float));
    float la = grads_host(a, in, tg, ga), lb = grads_host(b, in, tg, gb);
    CHECK(fabsf(la - lb) <= 1e-6f * la, "loss %.7g vs %.7g", lb, la);
    compare_grads("recompute all", a, gb, ga, 1e-5);
    CHECK(b->num_acts < a->num_acts, "activations %zu vs %zu floats", b->num_acts, a->num_acts);
    free(ga);
    free(gb);
    loom_gpt_free(a);
    loom_gpt_free(b);
}

/* ---- CPU cases: the loss-scale policy, the device step on a simulated device ---- */

static void loss_scaler_policy(void) {
    loom_loss_scaler_t s;
    loom_loss_scaler_init(&s, 65536.0f, 3);
    CHECK(loom_loss_scaler_update(&s, 1) == -1 && s.scale == 32768.0f && s.skipped == 1, "backoff: %g", s.scale);
    CHECK(loom_loss_scaler_update(&s, 0) == 0 && loom_loss_scaler_update(&s, 0) == 0, "grew too early");
    CHECK(loom_loss_scaler_update(&s, 0) == 1 && s.scale == 65536.0f, "growth after 3 good steps: %g", s.scale);
    CHECK(loom_loss_scaler_update(&s, 0) == 0 && loom_loss_scaler_update(&s, 1) == -1 && s.good == 0, "overflow resets the count");
    loom_loss_scaler_init(&s, 2.0f, 1);
    loom_loss_scaler_update(&s, 1);
    CHECK(loom_loss_scaler_update(&s, 1) == 0 && s.scale == 1.0f, "scale went below 1: %g", s.scale);
    loom_loss_scaler_init(&s, 16777216.0f, 1);
    CHECK(loom_loss_scaler_update(&s, 0) == 0 && s.scale == 16777216.0f, "scale grew past 2^24");
}

/* The CPU backend plus host versions of the step-scalar entries (no graph
 * entries: the device step then launches plainly). */
static loom_backend_t sim;

static void sim_sumsq_dev(float *acc, const float *x, size_t n) { acc[0] += (float)cpu->sumsq(x, n); }

static void sim_crossentropy_dev(float *losses, float *logits, const int *targets, int N, int V, int Vp, const float *sc) {
    cpu->crossentropy(losses, logits, targets, N, V, Vp, sc[5]);
}

static void sim_adamw_dev(float *p, const float *g, float *m, float *v, size_t n, const loom_adamw_t *hp, const float *sc) {
    if (!isfinite(sc[4])) return;
    loom_adamw_t h = *hp;
    h.lr = sc[0];
    h.grad_scale = sc[1];
    h.t = (int)sc[2];
    float norm = sqrtf(sc[4]) * sc[1];
    if (sc[3] > 0 && norm > sc[3]) h.grad_scale *= sc[3] / norm;
    cpu->adamw(p, g, m, v, n, &h);
}

static const loom_backend_t *sim_backend(void) {
    sim = *cpu;
    sim.name = "cpu-sim";
    sim.sumsq_dev = sim_sumsq_dev;
    sim.crossentropy_dev = sim_crossentropy_dev;
    sim.adamw_dev = sim_adamw_dev;
    sim.caps |= LOOM_CAP_DEVICE_STEP;
    return &sim;
}


/* ---- 16-bit activations, simulated: the CPU ops, with every ACT argument
 * stored as bf16 (or fp16) in memory and widened to fp32 around each call
 * (outputs rounded back), as the CUDA backend stores them at --dtype
 * bf16. It checks the model's side of the typed contract on this machine:
 * that every ACT buffer is sized, offset and zeroed at act_dtype, that
 * nothing fp32 is passed where ops.h says ACT (or back), and what bf16
 * storage does to the loss and the gradients. ---- */

static loom_backend_t sim16;
/* The wrapper of entry X is s16_X, declared from ops.h and weak: an entry
 * with an ACT argument and no wrapper (the inference ops, which the
 * training step does not call, or an op added to ops.h later) is left out
 * of the simulated table instead of running fp32 code on 16-bit memory. */
#define S16_KERNEL_(name, ret, kind, fallback, flops, n, args) \
    ret s16_##name LOOM_OP_PARAMS(n, args) __attribute__((weak));
LOOM_OPS(S16_KERNEL_)
#undef S16_KERNEL_
typedef struct {
    const void *p;
    float *f;
    size_t n;
} shadow_t;
static shadow_t shadows[8];
static int nshadows;

/* The fp32 view of ACT tensor p (n elements) for one call; the same
 * pointer twice (an op's aliased arguments) gets the same view. */
static float *wide(const void *p, size_t n) {
    if (!p) return NULL;
    for (int i = 0; i < nshadows; i++)
        if (shadows[i].p == p) return shadows[i].f;
    LOOM_ASSERT(nshadows < 8);
    float *f = malloc((n ? n : 1) * sizeof(float));
    loom_dtype_to_f32(f, p, sim16.act_dtype, n);
    shadows[nshadows++] = (shadow_t){p, f, n};
    return f;
}
/* After the call: every view back into its 16-bit tensor, rounded (inputs
 * round to themselves). */
static void narrow(void) {
    for (int i = 0; i < nshadows; i++) {
        loom_dtype_from_f32((void *)shadows[i].p, shadows[i].f, sim16.act_dtype, shadows[i].n);
        free(shadows[i].f);
    }
    nshadows = 0;
}

void s16_encoder_forward(float *out, const int *tok, const float *wte, const float *wpe, int B, int T, int C) {
    cpu->encoder_forward(wide(out, (size_t)B * T * C), tok, wte, wpe, B, T, C);
    narrow();
}
void s16_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tok, int B, int T, int C) {
    cpu->encoder_backward(dwte, dwpe, wide(dout, (size_t)B * T * C), tok, B, T, C);
    narrow();
}
void s16_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C) {
    size_t n = (size_t)N * C;
    cpu->layernorm_forward(wide(out, n), mean, rstd, wide(inp, n), w, b, N, C);
    narrow();
}
void s16_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C) {
    size_t n = (size_t)N * C;
    cpu->layernorm_backward(wide(dinp, n), dw, db, wide(dout, n), wide(inp, n), w, mean, rstd, N, C);
    narrow();
}
void s16_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    cpu->matmul_forward(wide(out, (size_t)N * OC), wide(inp, (size_t)N * C), w, bias, N, C, OC);
    narrow();
}
void s16_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                                int N, int C, int OC) {
    cpu->matmul_backward(wide(dinp, (size_t)N * C), dw, dbias, wide(dout, (size_t)N * OC), wide(inp, (size_t)N * C), w, N, C, OC);
    narrow();
}
void s16_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int NKV) {
    size_t n = (size_t)B * T * C, nq = (size_t)B * T * (C + 2 * NKV * (C / NH));
    cpu->attention_forward(wide(out, n), lse, wide(qkv, nq), B, T, C, NH, NKV);
    narrow();
}
void s16_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                                   int B, int T, int C, int NH, int NKV) {
    size_t n = (size_t)B * T * C, nq = (size_t)B * T * (C + 2 * NKV * (C / NH));
    cpu->attention_backward(wide(dqkv, nq), wide(dout, n), wide(qkv, nq), wide(out, n), lse, B, T, C, NH, NKV);
    narrow();
}
void s16_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    size_t n = (size_t)N * C;
    cpu->rmsnorm_forward(wide(out, n), rstd, wide(inp, n), w, N, C, eps);
    narrow();
}
void s16_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                          int N, int C) {
    size_t n = (size_t)N * C;
    cpu->rmsnorm_backward(wide(dinp, n), dw, wide(dout, n), wide(inp, n), w, rstd, N, C);
    narrow();
}
void s16_rope_forward(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    cpu->rope_forward(wide(qkv, (size_t)N * (NH + 2 * NKV) * hs), pos, freq, N, NH, NKV, hs);
    narrow();
}
void s16_rope_backward(float *dqkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs) {
    cpu->rope_backward(wide(dqkv, (size_t)N * (NH + 2 * NKV) * hs), pos, freq, N, NH, NKV, hs);
    narrow();
}
void s16_swiglu_forward(float *out, const float *inp, int N, int H) {
    cpu->swiglu_forward(wide(out, (size_t)N * H), wide(inp, (size_t)N * 2 * H), N, H);
    narrow();
}
void s16_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int H) {
    size_t n = (size_t)N * H;
    cpu->swiglu_backward(wide(dinp, 2 * n), wide(inp, 2 * n), wide(dout, n), N, H);
    narrow();
}
void s16_gelu_forward(float *out, const float *inp, size_t n) {
    cpu->gelu_forward(wide(out, n), wide(inp, n), n);
    narrow();
}
void s16_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    cpu->gelu_backward(wide(dinp, n), wide(inp, n), wide(dout, n), n);
    narrow();
}
void s16_residual_forward(float *out, const float *a, const float *b, size_t n) {
    cpu->residual_forward(wide(out, n), wide(a, n), wide(b, n), n);
    narrow();
}
void s16_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                           const float *b_res, const float *w, const float *b, int N, int C) {
    size_t n = (size_t)N * C;
    cpu->residual_layernorm_forward(wide(res, n), wide(out, n), mean, rstd, wide(a, n), wide(b_res, n), w, b, N, C);
    narrow();
}
void s16_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                                    int C, int OC) {
    size_t no = (size_t)N * OC;
    cpu->matmul_forward_gelu(wide(out, no), wide(pre, no), wide(inp, (size_t)N * C), w, bias, N, C, OC);
    narrow();
}
void s16_matmul_backward_gelu(float *dpre, float *dw, float *dbias, const float *dout, const float *inp,
                                     const float *pre, const float *w, int N, int C, int OC) {
    size_t ni = (size_t)N * C;
    cpu->matmul_backward_gelu(wide(dpre, ni), dw, dbias, wide(dout, (size_t)N * OC), wide(inp, ni), wide(pre, ni), w, N, C, OC);
    narrow();
}
void s16_crossentropy(float *losses, float *logits, const int *tg, int N, int V, int Vp, float dloss) {
    cpu->crossentropy(losses, wide(logits, (size_t)N * Vp), tg, N, V, Vp, dloss);
    narrow();
}
void s16_crossentropy_dev(float *losses, float *logits, const int *tg, int N, int V, int Vp, const float *sc) {
    s16_crossentropy(losses, logits, tg, N, V, Vp, sc[5]);
}
void s16_vocab_embed_forward(float *out, const int *tok, const float *wte, const float *wpe, int B_, int T_, int C, int v0, int nv) {
    cpu->vocab_embed_forward(wide(out, (size_t)B_ * T_ * C), tok, wte, wpe, B_, T_, C, v0, nv);
    narrow();
}
void s16_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tok, int B_, int T_, int C, int v0, int nv) {
    cpu->vocab_embed_backward(dwte, dwpe, wide(dout, (size_t)B_ * T_ * C), tok, B_, T_, C, v0, nv);
    narrow();
}
void s16_vocab_ce_stats(float *stats, const float *logits, const int *tg, int N, int Vp, int v0, int nv) {
    cpu->vocab_ce_stats(stats, wide(logits, (size_t)N * Vp), tg, N, Vp, v0, nv);
    narrow();
}
void s16_vocab_ce_finish(float *losses, float *logits, const int *tg, const float *stats, int ranks, int N, int Vp, int v0,
                         int nv, float dloss) {
    cpu->vocab_ce_finish(losses, wide(logits, (size_t)N * Vp), tg, stats, ranks, N, Vp, v0, nv, dloss);
    narrow();
}

/* 1 when one of op's arguments is tagged ACT in ops.h. */
static int takes_act(loom_op_id op) {
    const loom_op_info_t *info = loom_op_info(op);
    for (int a = 0; a < info->nargs; a++)
        if (info->arg_tags[a] == LOOM_ARG_ACT) return 1;
    return 0;
}

/* The simulated device with ACT tensors of type d (bf16 or fp16): every
 * entry with an ACT argument runs through its s16_ wrapper (NULL where the
 * CPU has no kernel or there is no wrapper), the others are sim's. */
static const loom_backend_t *sim16_backend(loom_dtype d) {
    sim16 = *sim_backend();
    sim16.name = d == LOOM_BF16 ? "cpu-sim-bf16" : "cpu-sim-fp16";
    sim16.dtype = d;
    sim16.act_dtype = d;
    sim16.dtypes |= LOOM_DTYPE_BIT(d);
    if (d == LOOM_FP16) sim16.caps |= LOOM_CAP_LOSS_SCALING;
#define S16_SET_(name, ret, kind, fallback, flops, n, args) \
    if (takes_act(LOOM_OP_##name)) sim16.name = sim16.name ? s16_##name : NULL;
    LOOM_OPS(S16_SET_)
#undef S16_SET_
    return &sim16;
}

/* ---- CUDA graphs, simulated: while "capturing", every op the step calls
 * is recorded instead of run (as CUDA does), and replay runs the record.
 * Calls that synchronize or allocate during capture are counted as
 * violations of the protocol (backend.h); so are the by-value crossentropy
 * and adamw, whose dloss and lr would be frozen in a real graph. ---- */

/* Each entry's arguments as a struct, from ops.h (`unused_` keeps entries
 * without arguments legal C). */
#define REC_ARGS_(name, ret, kind, fallback, flops, n, args) \
    typedef struct { char unused_; LOOM_OP_MAP(LOOM_OP_FIELD, LOOM_OP_NOSEP, n, args) } args_##name;
LOOM_OPS(REC_ARGS_)

typedef struct call call_t;
struct call {
    void (*run)(const call_t *);
    union {
#define REC_MEMBER_(name, ...) args_##name name;
        LOOM_OPS(REC_MEMBER_)
    } a;
    loom_adamw_t hp; /* an HP argument, copied: a real graph freezes it at capture */
    loom_tensor_t qt; /* a QT argument's descriptor, copied likewise (one per op) */
};
#define SIM_KEYS 8
#define SIM_CALLS 1024
static call_t sim_graph[SIM_KEYS][SIM_CALLS];
static int sim_len[SIM_KEYS], sim_have[SIM_KEYS];
static int sim_capturing = -1, sim_violations, sim_replays;

static call_t *rec(void (*run)(const call_t *)) {
    int k = sim_capturing;
    if (sim_len[k] >= SIM_CALLS) {
        sim_violations++;
        return &sim_graph[k][SIM_CALLS - 1];
    }
    call_t *c = &sim_graph[k][sim_len[k]++];
    memset(c, 0, sizeof *c);
    c->run = run;
    return c;
}

static void forbidden(const char *what) {
    if (sim_capturing < 0) return;
    printf("  %s called during capture\n", what);
    sim_violations++;
}

/* One recorder and one replayer per entry of kind OP, FUSED, DEV and
 * VARIANT (what a graph may hold), from ops.h; MEM and HOST entries count
 * as violations during capture and then run. Outside capture every entry
 * runs on `sim`. */
#define REC_FROM_S_(tag, type, name) s->name
#define REC_KEEP_(tag, type, name) REC_KEEP_##tag##_(name)
#define REC_KEEP_HP_(name) c->hp = *name, s.name = &c->hp;
#define REC_KEEP_ACT_(name)
#define REC_KEEP_F32_(name)
#define REC_KEEP_I32_(name)
#define REC_KEEP_QT_(name) c->qt = *name, s.name = &c->qt;
#define REC_KEEP_BYTES_(name)
#define REC_KEEP_VAL_(name)
#define REC_CAPTURE_(name, ret, kind, fallback, flops, n, args)                                  \
    static void r_##name(const call_t *c) {                                                    \
        const args_##name *s = &c->a.name;                                                     \
        sim.name(LOOM_OP_MAP(REC_FROM_S_, LOOM_OP_COMMA, n, args));                            \
    }                                                                                          \
    static void g_##name LOOM_OP_PARAMS(n, args) {                                             \
        if (sim_capturing < 0) {                                                               \
            sim.name LOOM_OP_ARGS(n, args);                                                    \
            return;                                                                            \
        }                                                                                      \
        call_t *c = rec(r_##name);                                                             \
        args_##name s = {0, LOOM_OP_MAP(LOOM_OP_NAME, LOOM_OP_COMMA, n, args)};                \
        LOOM_OP_MAP(REC_KEEP_, LOOM_OP_NOSEP, n, args)                                         \
        c->a.name = s;                                                                         \
    }
#define REC_FORBID_(name, ret, kind, fallback, flops, n, args) \
    static ret g_##name LOOM_OP_PARAMS(n, args) {              \
        forbidden(#name " (" #kind ")");                       \
        return sim.name LOOM_OP_ARGS(n, args);                 \
    }
#define REC_OP_ REC_CAPTURE_
#define REC_FUSED_ REC_CAPTURE_
#define REC_DEV_ REC_CAPTURE_
#define REC_VARIANT_ REC_CAPTURE_
#define REC_MEM_ REC_FORBID_
#define REC_HOST_ REC_FORBID_
#define REC_GRAPH_(...)
#define REC_(name, ret, kind, fallback, flops, n, args) REC_##kind##_(name, ret, kind, fallback, flops, n, args)
LOOM_OPS(REC_)

static loom_status g_begin(int key) {
    if (key < 0 || key >= SIM_KEYS || sim_capturing >= 0) return loom_error(LOOM_EINVAL, "sim graph_begin(%d)", key);
    sim_capturing = key;
    sim_len[key] = 0;
    return LOOM_OK;
}
static int sim_fail_end; /* graph_end fails, as a broken capture would */
static loom_status g_end(int key) {
    if (sim_capturing != key) return loom_error(LOOM_EINVAL, "sim graph_end(%d): not capturing it", key);
    sim_capturing = -1;
    if (sim_fail_end) return loom_error(LOOM_EINTERNAL, "sim graph_end(%d): capture failed (planted)", key);
    sim_have[key] = 1;
    return LOOM_OK;
}
static loom_status g_replay(int key) {
    if (key < 0 || key >= SIM_KEYS || !sim_have[key]) return loom_error(LOOM_EINVAL, "sim graph_replay(%d): none captured", key);
    for (int i = 0; i < sim_len[key]; i++) sim_graph[key][i].run(&sim_graph[key][i]);
    sim_replays++;
    return LOOM_OK;
}
static void g_reset(void) {
    for (int k = 0; k < SIM_KEYS; k++) sim_have[k] = sim_len[k] = 0;
}

/* The simulated device `base` with graph entries: every op goes through a
 * recorder, which runs base's op (through `sim`) outside capture and on
 * replay. */
static loom_backend_t sim_graphs;
static const loom_backend_t *sim_graph_backend_over(const loom_backend_t *base) {
    loom_backend_t *b = &sim_graphs;
    sim = *base;
    *b = sim;
    b->name = "cpu-sim-graphs";
    b->caps |= LOOM_CAP_GRAPHS;
#define SIM_SET_(name, ret, kind, fallback, flops, n, args) SIM_SET_##kind##_(name)
#define SIM_SET_ALL_(name) b->name = g_##name;
#define SIM_SET_IF_(name) b->name = sim.name ? g_##name : NULL;
#define SIM_SET_MEM_ SIM_SET_ALL_
#define SIM_SET_OP_ SIM_SET_ALL_
#define SIM_SET_HOST_ SIM_SET_ALL_
#define SIM_SET_FUSED_ SIM_SET_IF_
#define SIM_SET_DEV_ SIM_SET_IF_
#define SIM_SET_VARIANT_ SIM_SET_IF_
#define SIM_SET_GRAPH_(name)
    LOOM_OPS(SIM_SET_)
    b->graph_begin = g_begin, b->graph_end = g_end, b->graph_replay = g_replay, b->graph_reset = g_reset;
    return b;
}
static const loom_backend_t *sim_graph_backend(void) { return sim_graph_backend_over(sim_backend()); }

/* A capture that fails (graph_end returns an error) does not end the run:
 * the step runs with plain launches, bit for bit as a plain run, and keeps
 * doing so (no replays, no further captures). */
static void sim_graph_capture_failure_falls_back(void) {
    const loom_backend_t *plain = sim_backend(), *graphs = sim_graph_backend();
    loom_gpt_t *a = model(plain, 72), *b = model(graphs, 72);
    if (!a || !b) return;
    loom_step_graph_t *sa, *sb;
    CHECK(loom_step_graph_init(&sa, a, 1) == LOOM_OK && loom_step_graph_init(&sb, b, 1) == LOOM_OK, "init: %s", loom_errmsg());
    sim_fail_end = 1;
    sim_replays = 0;
    int in[BT], tg[BT];
    for (int s = 0; s < 5; s++) {
        batch(in, tg, BT, cfg().vocab_size, 400 + (unsigned)s);
        loom_step_result_t ra, rb;
        CHECK(loom_step_graph_run(sa, in, tg, B, T, 1, &opt, 1e-3f, s + 1, NULL, &ra) == LOOM_OK, "plain: %s", loom_errmsg());
        CHECK(loom_step_graph_run(sb, in, tg, B, T, 1, &opt, 1e-3f, s + 1, NULL, &rb) == LOOM_OK, "step %d after a failed capture: %s", s + 1, loom_errmsg());
        CHECK(ra.loss == rb.loss && !rb.replayed, "step %d: loss %.9g vs %.9g, replayed %d", s + 1, rb.loss, ra.loss, rb.replayed);
    }
    sim_fail_end = 0;
    CHECK(memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0, "parameters differ after 5 steps");
    CHECK(!loom_step_graph_uses_graphs(sb) && sim_replays == 0, "graphs still in use (%d replays)", sim_replays);
    loom_step_graph_free(sa);
    loom_step_graph_free(sb);
    loom_gpt_free(a);
    loom_gpt_free(b);
}

/* Graphs on the simulated device: the same losses and parameters as plain
 * launches (bit for bit: the same CPU ops in the same order), replays from
 * the step after the warm-up, nothing forbidden called during capture, and
 * one graph per part combination: 7; 3, 6; 3, 2, 6 for accum 1, 2, 3. */
static void sim_graph_replay_matches_plain_on(const loom_backend_t *plain, const loom_backend_t *graphs) {
    for (int accum = 1; accum <= 3; accum++) {
        loom_gpt_t *a = model(plain, 71), *b = model(graphs, 71);
        if (!a || !b) return;
        loom_step_graph_t *sa, *sb;
        CHECK(loom_step_graph_init(&sa, a, 1) == LOOM_OK && loom_step_graph_init(&sb, b, 1) == LOOM_OK, "init: %s", loom_errmsg());
        CHECK(loom_step_graph_uses_graphs(sb), "graphs not used on a backend with graph entries");
        sim_violations = sim_replays = 0;
        int in[3 * BT], tg[3 * BT];
        for (int s = 0; s < 5; s++) {
            batch(in, tg, BT * accum, cfg().vocab_size, 300 + (unsigned)s);
            loom_step_result_t ra, rb;
            float lr = 1e-3f * (float)(s + 1); /* a schedule: replays must see each step's lr */
            CHECK(loom_step_graph_run(sa, in, tg, B, T, accum, &opt, lr, s + 1, NULL, &ra) == LOOM_OK, "plain: %s", loom_errmsg());
            CHECK(loom_step_graph_run(sb, in, tg, B, T, accum, &opt, lr, s + 1, NULL, &rb) == LOOM_OK, "graphs: %s", loom_errmsg());
            CHECK(rb.replayed == (s >= LOOM_STEP_GRAPH_WARMUP), "accum %d step %d: replayed %d", accum, s + 1, rb.replayed);
            CHECK(ra.loss == rb.loss && ra.grad_norm == rb.grad_norm, "accum %d step %d: loss %.9g vs %.9g, norm %.9g vs %.9g",
                  accum, s + 1, rb.loss, ra.loss, rb.grad_norm, ra.grad_norm);
        }
        CHECK(memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0, "accum %d: parameters differ after 5 steps", accum);
        CHECK(sim_violations == 0, "accum %d: %d calls that a CUDA graph cannot hold during capture", accum, sim_violations);
        int graphs_held = 0;
        for (int k = 0; k < SIM_KEYS; k++) graphs_held += sim_have[k];
        CHECK(graphs_held == (accum < 3 ? accum : 3), "accum %d: %d graphs captured", accum, graphs_held);
        CHECK(sim_replays == (5 - LOOM_STEP_GRAPH_WARMUP) * accum, "accum %d: %d replays", accum, sim_replays);
        loom_step_graph_free(sa);
        loom_step_graph_free(sb);
        loom_gpt_free(a);
        loom_gpt_free(b);
    }
}
static void sim_graph_replay_matches_plain(void) {
    const loom_backend_t *plain = sim_backend();
    sim_graph_replay_matches_plain_on(plain, sim_graph_backend());
}

/* ---- the 16-bit activation cases on the simulated device (run here) ---- */

/* One forward/backward with bf16 (fp16) activations against fp32: storage
 * alone, measured; the GPU bound (above) adds the GEMMs' rounding. */
static void sim_bf16_model_matches_fp32(void) { model_matches_cpu_on(sim16_backend(LOOM_BF16), 1e-2, 5e-2); }
static void sim_fp16_model_matches_fp32(void) { model_matches_cpu_on(sim16_backend(LOOM_FP16), 5e-3, 2e-2); }
static void sim_bf16_training_tracks_fp32(void) { training_tracks_cpu_on(sim16_backend(LOOM_BF16)); }
static void sim_fp16_training_tracks_fp32(void) { training_tracks_cpu_on(sim16_backend(LOOM_FP16)); }
/* Graph capture and replay with 16-bit activations: bit for bit as plain. */
static void sim_bf16_graph_replay_matches_plain(void) {
    const loom_backend_t *plain = sim16_backend(LOOM_BF16);
    sim_graph_replay_matches_plain_on(plain, sim_graph_backend_over(plain));
}

/* ---- tensor and pipeline parallelism at bf16 activations, simulated: 2
 * ranks (this binary again, exec'd: OpenMP's pool does not survive a
 * fork) over TCP, each a tp shard or a pp stage on the simulated bf16
 * device beside the whole model on it; every step's loss and gradient norm
 * must agree with the whole model's, and stay near the fp32 CPU's. tp's
 * hooks then sum bf16 buffers (parallel/dist.c: widened, summed in fp32,
 * rounded once) and the vocabulary ops read and write bf16; pp's stages
 * send loom_backend_act_bytes of bf16 residual stream and its gradient, as
 * on GPUs with NCCL. Bounds a priori: bf16 keeps 8 significant bits (2^-9
 * relative per element), and a partial sum rounded before the all-reduce
 * adds one such rounding to each row-parallel output (pp adds none: the
 * stages pass the same bf16 values); a mean loss over B*T rows keeps far
 * less of it, so 5e-3 relative against one piece, the 2e-2 of the training
 * cases against fp32. ---- */

enum { PAR_STEPS = 4, PAR_MICRO = 2 };

/* The layout under test on this rank: a tp shard or a pp stage. */
typedef struct {
    loom_tp_t *tp;
    loom_pp_t *pp;
    loom_gpt_t *start;
} par_t;

static loom_status par_init(par_t *p, int pp, loom_dist_t *d, loom_dist_t *g, const loom_backend_t *be) {
    loom_gpt_config_t c = cfg();
    if (pp) {
        loom_pp_opts_t o = {.stages = 2, .tp = 1, .B = B, .T = T, .micro = PAR_MICRO, .seed = 31};
        loom_gpt_t *stage;
        return loom_pp_init(&p->pp, d, &c, be, &o, &stage);
    }
    LOOM_TRY(loom_gpt_init(&p->start, &c, cpu, 31));
    return loom_tp_init(&p->tp, p->start, be, g, NULL);
}

static loom_status par_step(par_t *p, const int *in, const int *tg, int accum, int s, float *loss, float *norm) {
    if (p->pp) return loom_pp_step(p->pp, in, tg, &opt, 1e-3f, s, loss, norm);
    return loom_train_step_tp(p->tp, NULL, in, tg, B, T, accum, &opt, 1e-3f, s, loss, norm);
}

/* Each step: the layout's loss and norm (lp, np) against the whole model's
 * on the same device (lw, nw) and on the fp32 CPU (lf); 0, 4 (a step
 * failed) or 5 (out of bounds). */
static int par_steps(par_t *p, loom_gpt_t *whole, loom_gpt_t *fp32, int rank, const char *what) {
    int accum = p->pp ? PAR_MICRO : 1, rc = 0;
    int *in = malloc((size_t)accum * BT * sizeof(int)), *tg = malloc((size_t)accum * BT * sizeof(int));
    for (int s = 1; s <= PAR_STEPS && !rc; s++) {
        float lw, lp, lf, nw, np, nf;
        batch(in, tg, accum * BT, whole->cfg.vocab_size, 40 + (unsigned)s);
        if (loom_train_step(whole, in, tg, B, T, accum, &opt, 1e-3f, s, &lw, &nw) != LOOM_OK ||
            loom_train_step(fp32, in, tg, B, T, accum, &opt, 1e-3f, s, &lf, &nf) != LOOM_OK ||
            par_step(p, in, tg, accum, s, &lp, &np) != LOOM_OK) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, s, loom_errmsg());
            rc = 4;
        } else if (fabsf(lp - lw) > 5e-3f * lw || fabsf(np - nw) > 5e-2f * nw || fabsf(lp - lf) > 2e-2f * lf) {
            rc = 5;
        }
        if (rank == 0 || rc == 5)
            printf("  rank %d step %d: loss %s bf16 %.6f, one piece bf16 %.6f, fp32 %.6f; norm %.5f, %.5f, %.5f\n", rank, s,
                   what, lp, lw, lf, np, nw, nf);
    }
    free(in);
    free(tg);
    return rc;
}

/* One rank (LOOM_TEST_SIM_PAR=tp2 or pp2, the torchrun variables from the
 * parent): 0 when every check passes, else the number of the one that
 * failed. */
static int sim_par_rank(const char *what) {
    loom_dist_t *d = NULL, *g = NULL;
    loom_dist_opts_t o = {.transport = "tcp", .timeout_s = 600}; /* a guard only */
    loom_gpt_t *whole = NULL, *fp32 = NULL;
    par_t p = {0};
    loom_gpt_config_t c = cfg();
    if (loom_backend_cpu_init(&cpu, 1) != LOOM_OK) return 2;
    const loom_backend_t *be = sim16_backend(LOOM_BF16);
    int ok = loom_dist_init(&d, &o) == LOOM_OK && loom_dist_split(d, 0, loom_dist_rank(d), &g) == LOOM_OK &&
             loom_gpt_init(&whole, &c, be, 31) == LOOM_OK && loom_gpt_init(&fp32, &c, cpu, 31) == LOOM_OK &&
             par_init(&p, what[0] == 'p', d, g, be) == LOOM_OK && loom_gpt_alloc_train(whole) == LOOM_OK &&
             loom_gpt_alloc_train(fp32) == LOOM_OK;
    if (!ok) fprintf(stderr, "rank %d: %s\n", loom_dist_rank(d), loom_errmsg());
    int rc = ok ? par_steps(&p, whole, fp32, loom_dist_rank(d), what) : 3;
    loom_pp_free(p.pp);
    loom_tp_free(p.tp);
    loom_gpt_free(p.start);
    loom_gpt_free(fp32);
    loom_gpt_free(whole);
    loom_dist_free(g);
    loom_dist_free(d);
    return rc;
}

/* The environment of rank r: the parent's and the torchrun variables,
 * made before fork (the child only calls execve). */
static char **rank_env(int r, int port, const char *what, char (*own)[64]) {
    extern char **environ;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = malloc((n + 7) * sizeof *env);
    memcpy(env, environ, n * sizeof *env);
    snprintf(own[0], 64, "RANK=%d", r);
    snprintf(own[1], 64, "LOCAL_RANK=%d", r);
    snprintf(own[2], 64, "WORLD_SIZE=2");
    snprintf(own[3], 64, "MASTER_ADDR=127.0.0.1");
    snprintf(own[4], 64, "MASTER_PORT=%d", port);
    snprintf(own[5], 64, "LOOM_TEST_SIM_PAR=%s", what);
    for (int i = 0; i < 6; i++) env[n + i] = own[i];
    env[n + 6] = NULL;
    return env;
}

/* The two ranks of layout `what` (tp2, pp2), this binary exec'd. */
static void sim_bf16_on_2_ranks(const char *what) {
    char self[4096], own[2][6][64];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        check_fail_why("readlink /proc/self/exe failed");
        return;
    }
    self[k] = 0;
    int port = loom_dist_free_port(29617);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        char **env = rank_env(r, port, what, own[r]);
        char *argv[] = {self, NULL};
        fflush(stdout);
        pid[r] = fork();
        if (pid[r] == 0) {
            execve(self, argv, env);
            _exit(127);
        }
        free(env);
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        CHECK(pid[r] > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "%s rank %d: exit status %d (3 setup, 4 a step failed, 5 a loss or norm out of bounds: its line above)", what,
              r, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

static void sim_bf16_tp2_matches_one(void) { sim_bf16_on_2_ranks("tp2"); }
static void sim_bf16_pp2_matches_one(void) { sim_bf16_on_2_ranks("pp2"); }

static void device_step_matches_host_step(void) {
    const loom_backend_t *be = sim_backend();
    char why[128];
    CHECK(loom_step_graph_supported(be, why, sizeof why), "sim: %s", why);
    CHECK(!loom_step_graph_supported(cpu, why, sizeof why) && strstr(why, "sumsq_dev"), "cpu backend: %s", why);
    for (int accum = 1; accum <= 2; accum++) {
        loom_gpt_t *h = model(cpu, 61), *d = model(be, 61);
        if (!h || !d) return;
        loom_step_graph_t *sg;
        CHECK(loom_step_graph_init(&sg, d, 1) == LOOM_OK, "init: %s", loom_errmsg());
        CHECK(!loom_step_graph_uses_graphs(sg), "graphs on a backend without graph entries");
        int in[2 * BT], tg[2 * BT];
        for (int s = 0; s < 3; s++) {
            batch(in, tg, BT * accum, cfg().vocab_size, 200 + (unsigned)s);
            float lh, nh;
            loom_step_result_t r;
            CHECK(loom_train_step(h, in, tg, B, T, accum, &opt, 1e-3f, s + 1, &lh, &nh) == LOOM_OK, "host step: %s", loom_errmsg());
            CHECK(loom_step_graph_run(sg, in, tg, B, T, accum, &opt, 1e-3f, s + 1, NULL, &r) == LOOM_OK, "device step: %s", loom_errmsg());
            CHECK(fabsf(r.loss - lh) <= 1e-5f * lh, "accum %d step %d: loss %.7g vs %.7g", accum, s + 1, r.loss, lh);
            CHECK(fabsf(r.grad_norm - nh) <= 1e-4f * nh, "accum %d step %d: grad norm %.7g vs %.7g", accum, s + 1, r.grad_norm, nh);
            CHECK(!r.skipped && !r.replayed, "skipped %d replayed %d", r.skipped, r.replayed);
        }
        double e = check_rel_err(d->params, h->params, h->num_params);
        CHECK(e < 1e-5, "accum %d: parameters after 3 steps differ: %.3g", accum, e);
        loom_step_graph_free(sg);
        loom_gpt_free(h);
        loom_gpt_free(d);
    }
}

static void device_step_overflow_skips(void) {
    const loom_backend_t *be = sim_backend();
    loom_gpt_t *m = model(be, 67);
    if (!m) return;
    loom_step_graph_t *sg;
    CHECK(loom_step_graph_init(&sg, m, 0) == LOOM_OK, "init: %s", loom_errmsg());
    int in[BT], tg[BT];
    batch(in, tg, BT, cfg().vocab_size, 5);
    float *before = malloc(m->num_params * sizeof(float));
    memcpy(before, m->params, m->num_params * sizeof(float));
    loom_loss_scaler_t ls;
    loom_loss_scaler_init(&ls, 1e38f, 2000); /* float overflows in backward */
    loom_step_result_t r;
    CHECK(loom_step_graph_run(sg, in, tg, B, T, 1, &opt, 1e-3f, 1, &ls, &r) == LOOM_OK, "overflowing step: %s", loom_errmsg());
    CHECK(r.skipped && !isfinite(r.grad_norm) && isfinite(r.loss), "skipped %d, norm %g, loss %g", r.skipped, r.grad_norm, r.loss);
    CHECK(memcmp(before, m->params, m->num_params * sizeof(float)) == 0, "a skipped step changed the parameters");
    CHECK(ls.skipped == 1 && ls.scale == 5e37f, "scale after the skip: %g", ls.scale);
    loom_loss_scaler_init(&ls, 1024.0f, 2000);
    CHECK(loom_step_graph_run(sg, in, tg, B, T, 1, &opt, 1e-3f, 2, &ls, &r) == LOOM_OK, "scaled step: %s", loom_errmsg());
    CHECK(!r.skipped && isfinite(r.grad_norm), "a finite step was skipped");
    CHECK(memcmp(before, m->params, m->num_params * sizeof(float)) != 0, "the step after the skip did not update");
    /* Overflow again: skipped again, counted by the scaler. */
    loom_loss_scaler_init(&ls, 1e38f, 2000);
    loom_status st = loom_step_graph_run(sg, in, tg, B, T, 1, &opt, 1e-3f, 3, &ls, &r);
    CHECK(st == LOOM_OK && r.skipped && ls.skipped == 1, "second overflow: %s", loom_errmsg());
    free(before);
    loom_step_graph_free(sg);
    loom_gpt_free(m);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"loss_scaler_policy", loss_scaler_policy},
    {"device_step_matches_host_step", device_step_matches_host_step},
    {"device_step_overflow_skips", device_step_overflow_skips},
    {"sim_graph_replay_matches_plain", sim_graph_replay_matches_plain},
    {"sim_graph_capture_failure_falls_back", sim_graph_capture_failure_falls_back},
    {"sim_bf16_model_matches_fp32", sim_bf16_model_matches_fp32},
    {"sim_fp16_model_matches_fp32", sim_fp16_model_matches_fp32},
    {"sim_bf16_training_tracks_fp32", sim_bf16_training_tracks_fp32},
    {"sim_fp16_training_tracks_fp32", sim_fp16_training_tracks_fp32},
    {"sim_bf16_graph_replay_matches_plain", sim_bf16_graph_replay_matches_plain},
    {"sim_bf16_tp2_matches_one", sim_bf16_tp2_matches_one},
    {"sim_bf16_pp2_matches_one", sim_bf16_pp2_matches_one},
    {"cuda_model_matches_cpu_fp32", cuda_model_matches_cpu_fp32},
    {"cuda_model_matches_cpu_bf16", cuda_model_matches_cpu_bf16},
    {"cuda_model_matches_cpu_fp16", cuda_model_matches_cpu_fp16},
    {"cuda_training_tracks_cpu", cuda_training_tracks_cpu},
    {"cuda_training_tracks_cpu_fp16", cuda_training_tracks_cpu_fp16},
    {"cuda_graph_replay_matches_plain", cuda_graph_replay_matches_plain},
    {"cuda_graph_replay_matches_plain_bf16", cuda_graph_replay_matches_plain_bf16},
    {"cuda_graph_replay_matches_plain_fp16", cuda_graph_replay_matches_plain_fp16},
    {"cuda_fp16_loss_scaling", cuda_fp16_loss_scaling},
    {"cuda_recompute_all_matches_none", cuda_recompute_all_matches_none},
};
static const char *case_name(int i) { return cases[i].name; }
static void run_case(int i) { check_run(cases[i].name, cases[i].fn); }

/* In each child of check_run_isolated (OpenMP's pool and a CUDA context
 * do not survive fork, so nothing opens in the parent). */
static void open_cpu(void) {
    if (loom_backend_cpu_init(&cpu, 2) != LOOM_OK) {
        printf("FAIL cpu backend: %s\n", loom_errmsg());
        _exit(1);
    }
}

int main(void) {
    const char *par = getenv("LOOM_TEST_SIM_PAR");
    if (par) return sim_par_rank(par); /* a rank of sim_bf16_on_2_ranks */
    /* isolated: a case that panics or faults the GPU fails alone */
    check_run_isolated((int)(sizeof cases / sizeof cases[0]), case_name, open_cpu, run_case);
    return check_main_end();
}
