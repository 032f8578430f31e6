/* INT8 weights for inference (model/quant.h, backend/cpu/cpu_int8.c):
 * - the per-channel round trip stays within half a step of each row;
 * - the Q8_0 (block 32) round trip within half a step plus fp16 rounding;
 * - the W8A32 and W8A8 kernels, on every instruction set this CPU has,
 *   equal a double-precision reference on the same quantized inputs
 *   (int32-exact sums, then fp32 rounding), per row and per block scales,
 *   odd sizes; W8A32 gives the fp32 kernel's bits on the dequantized
 *   weight; a row's result does not depend on the batch (Q8_0 blocks on
 *   AVX2 and AVX-512 VNNI: below loom_cpu_kq_gemm_rows; from there on the prefill
 *   tile of cpu_kquant_gemm.c, checked against the same reference);
 * - a small model trained briefly on a synthetic Markov language keeps its
 *   perplexity (KV-cached inference path): W8A32 within 1% of fp32, W8A8
 *   within 2%, int8 KV within 1%, per channel and in Q8_0 blocks, with the
 *   logits product in int8 (the default) and in fp32; the share of greedy
 *   tokens equal to fp32's over 20 prompts x 50 tokens is printed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_kquant_gemm.h"
#include "backend/cpu/cpu_paged.h"
#include "check.h"
#include "model/infer.h"
#include "model/quant.h"

static void round_trip(void) {
    const int R = 37, C = 96;
    float *w = check_rand((size_t)R * C, 0.3f, 5), s[37];
    signed char *q = malloc((size_t)R * C);
    w[3] = 0.0f;
    for (int c = 0; c < C; c++) w[5 * C + c] = 0.0f; /* an all-zero row */
    loom_quant_rows(w, R, C, q, s);
    int worst_row = -1, has127 = 1;
    double worst = 0;
    for (int r = 0; r < R; r++) {
        int mx = 0;
        for (int c = 0; c < C; c++) {
            double e = fabs((double)w[r * C + c] - (double)q[r * C + c] * s[r]) / s[r];
            if (e > worst) worst = e, worst_row = r;
            if (abs(q[r * C + c]) > mx) mx = abs(q[r * C + c]);
        }
        if (r != 5 && mx != 127) has127 = 0;
    }
    CHECK(worst <= 0.5 + 1e-5, "row %d: error %.6f steps (bound 0.5)", worst_row, worst);
    CHECK(has127, "a row's largest element does not map to 127");
    printf("  worst round-trip error %.4f steps\n", worst);
    free(w), free(q);
}

/* Q8_0 form: blocks of 32, scales rounded to fp16 as the GGUF stores them:
 * within half a step of the unrounded scale plus the fp16 rounding
 * (127 * 2^-11 of a step), and an all-zero block gives zeros. */
static void round_trip_q8_0(void) {
    const int R = 5, C = 96;
    float *w = check_rand((size_t)R * C, 0.3f, 6), s[5 * 3];
    signed char *q = malloc((size_t)R * C);
    for (int c = 32; c < 64; c++) w[c] = 0.0f; /* row 0, block 1 */
    loom_quant_rows_q8_0(w, R, C, q, s);
    double worst = 0;
    for (int b = 0; b < R * C / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(w[b * 32 + i]));
        double d = amax / 127.0;
        for (int i = 0; i < 32 && d > 0; i++) {
            double e = fabs((double)w[b * 32 + i] - (double)q[b * 32 + i] * s[b]) / d;
            worst = e > worst ? e : worst;
        }
        CHECK(fabs(s[b] - d) <= d / 1024 + 1e-30, "block %d: scale %g is not fp16(%g)", b, s[b], d);
    }
    CHECK(s[1] == 0.0f && q[40] == 0, "an all-zero block: scale %g, value %d", s[1], q[40]);
    CHECK(worst <= 0.5 + 127.0 / 2048, "error %.4f steps (bound 0.5 + 127 * 2^-11)", worst);
    printf("  q8_0 worst round-trip error %.4f steps\n", worst);
    free(w), free(q);
}

/* A random int8 in [-127, 127]. */
static signed char rand_i8(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    return (signed char)((int)(*seed >> 16) % 255 - 127);
}

typedef struct {
    int N, C, OC, gelu, block;
    signed char *wq, *xq;
    float *ws, *xs, *x, *bias;
} gcase_t;

/* Inputs on the int8 grid: x = xq * xs[n][b] with 127 first in each of a
 * row's nb blocks (the whole row without blocks), so that W8A8's
 * quantization (per token, or per block of the weight's size) gives back
 * exactly xq and xs. */
static void gcase_init(gcase_t *g, unsigned seed) {
    int N = g->N, C = g->C, OC = g->OC, nb = g->block ? C / g->block : 1, blk = C / nb;
    g->wq = malloc((size_t)OC * C), g->xq = malloc((size_t)N * C);
    g->ws = malloc(sizeof(float) * OC * nb), g->xs = malloc(sizeof(float) * N * nb), g->x = malloc(sizeof(float) * N * C);
    g->bias = check_rand((size_t)OC, 0.5f, 9);
    for (size_t i = 0; i < (size_t)OC * C; i++) g->wq[i] = rand_i8(&seed);
    for (size_t i = 0; i < (size_t)N * C; i++) g->xq[i] = rand_i8(&seed);
    for (int i = 0; i < OC * nb; i++) g->ws[i] = 0.001f * (1 + i % 7);
    for (int n = 0; n < N; n++)
        for (int b = 0; b < nb; b++) {
            g->xq[(size_t)n * C + (size_t)b * blk] = 127;
            g->xs[n * nb + b] = 0.01f * (1 + (n + b) % 3);
            for (int c = b * blk; c < (b + 1) * blk; c++) g->x[(size_t)n * C + c] = (float)g->xq[(size_t)n * C + c] * g->xs[n * nb + b];
        }
}

static void gcase_free(gcase_t *g) { free(g->wq), free(g->xq), free(g->ws), free(g->xs), free(g->x), free(g->bias); }

/* The double reference: w8a8 sums xq . wq exactly per block, w8a32 sums
 * x . wq; then the scales (weight, and w8a8's activation block), bias and
 * GELU in double. */
static void gcase_ref(const gcase_t *g, int a8, double *ref) {
    int C = g->C, blk = g->block ? g->block : C, nb = C / blk;
    for (int n = 0; n < g->N; n++)
        for (int o = 0; o < g->OC; o++) {
            double v = 0;
            for (int b = 0; b < nb; b++) {
                double acc = 0;
                for (int c = b * blk; c < (b + 1) * blk; c++)
                    acc += (a8 ? (double)g->xq[(size_t)n * C + c] : (double)g->x[(size_t)n * C + c]) * g->wq[(size_t)o * C + c];
                v += acc * g->ws[(size_t)o * nb + b] * (a8 ? g->xs[(size_t)n * nb + b] : 1.0);
            }
            v += g->bias[o];
            ref[(size_t)n * g->OC + o] = g->gelu ? 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) : v;
        }
}

static const char *const isas[] = {"portable", "avx2", "avxvnni", "avx512vnni"};

/* Both kernels on every instruction set this CPU has against the double
 * reference; W8A32 also bit for bit against the fp32 kernel on the
 * dequantized weight, and one row alone against the batch (no dependence
 * on N). */
static void gemm_case(int N, int C, int OC, int gelu, int block) {
    gcase_t g = {.N = N, .C = C, .OC = OC, .gelu = gelu, .block = block};
    gcase_init(&g, 77 + (unsigned)(N * C + OC));
    float *out = malloc(sizeof(float) * N * OC), *ref32 = malloc(sizeof(float) * N * OC), *one = malloc(sizeof(float) * OC);
    float *deq = malloc(sizeof(float) * OC * C);
    double *ref = malloc(sizeof(double) * N * OC);
    loom_tensor_t w = {.data = g.wq, .dtype = LOOM_INT8, .rows = OC, .cols = C, .scales = g.ws, .block = block};
    CHECK(loom_tensor_check(&w, "w") == LOOM_OK, "%s", loom_errmsg());
    loom_tensor_dequantize(&w, deq);
    for (int a8 = 0; a8 < 2; a8++) {
        gcase_ref(&g, a8, ref);
        for (int i = 0; i < 4; i++) {
            if (!loom_cpu_int8_use(isas[i])) continue;
            if (a8) loom_cpu_matmul_forward_w8a8(out, g.x, &w, g.bias, N, C, OC, gelu);
            else loom_cpu_matmul_forward_w8(out, g.x, &w, g.bias, N, C, OC, gelu);
            double e = check_rel_err_d(out, ref, (size_t)N * OC);
            /* w8a8: exact int32 sums, then fp32 scales (and, per block, an
             * fp32 sum of C/32 terms); w8a32: fp32 sums of C terms */
            double bound = a8 ? (block ? 2e-6 : 1e-6) : 1e-5;
            CHECK(e < bound, "%s %s N=%d C=%d OC=%d gelu=%d block=%d: normalized error %.3g (bound %.0e)",
                  a8 ? "w8a8" : "w8a32", isas[i], N, C, OC, gelu, block, e, bound);
            int r = N / 2;
            /* Q8_0 blocks from loom_cpu_kq_gemm_rows on: the prefill tile (cpu_kquant_gemm.c), its own sums */
            if (a8 && block == 32 && (i == 1 || i == 3) && N >= loom_cpu_kq_gemm_rows(LOOM_INT8)) continue;
            if (a8) loom_cpu_matmul_forward_w8a8(one, g.x + (size_t)r * C, &w, g.bias, 1, C, OC, gelu);
            else loom_cpu_matmul_forward_w8(one, g.x + (size_t)r * C, &w, g.bias, 1, C, OC, gelu);
            CHECK(!memcmp(one, out + (size_t)r * OC, sizeof(float) * OC), "%s %s: row %d alone differs from the batch of %d",
                  a8 ? "w8a8" : "w8a32", isas[i], r, N);
        }
        if (!a8) {
            loom_cpu_matmul_forward_rows(ref32, g.x, deq, g.bias, N, C, OC, gelu);
            CHECK(!memcmp(ref32, out, sizeof(float) * N * OC), "w8a32 N=%d C=%d block=%d: not the fp32 kernel's bits on the dequantized weight",
                  N, C, block);
        }
    }
    loom_cpu_int8_use(NULL);
    gcase_free(&g);
    free(out), free(ref32), free(one), free(deq), free(ref);
}

/* Per-token quantization on every instruction set equals C's roundf
 * (ties away from zero) on a row whose scale is exactly 1: ties, values a
 * hair below a tie, the clamp, and a tail that is not a multiple of 8. */
static void quantize_ties(void) {
    enum { C = 45 };
    float x[C], s;
    signed char q[C];
    const float fixed[] = {127.0f, 0.5f, -0.5f, 1.5f, -2.5f, 126.5f, -126.5f, 0.49999997f, -0.49999997f, 2.4999998f, 0.0f, -0.0f};
    int nf = (int)(sizeof fixed / sizeof fixed[0]);
    for (int c = 0; c < C; c++) x[c] = c < nf ? fixed[c] : (float)((c * 37) % 255 - 127) * 0.5f;
    x[C - 1] = 3.5f; /* a tie in the tail */
    for (int i = 0; i < 4; i++) {
        if (!loom_cpu_int8_use(isas[i])) continue;
        loom_cpu_quantize_rows(x, 1, C, q, &s);
        CHECK(s == 1.0f, "%s: scale %g, expected 1", isas[i], s);
        for (int c = 0; c < C; c++)
            CHECK(q[c] == (signed char)roundf(x[c]), "%s: x[%d] = %.8g -> %d, roundf gives %.0f", isas[i], c, x[c], q[c],
                  roundf(x[c]));
    }
    loom_cpu_int8_use(NULL);
}

/* Extreme values: every product +-127 * +-127 and sums near the largest a
 * row can reach; with unit scales the outputs are the integers
 * themselves, exactly (|sum| < 2^24). vpmaddubsw would saturate here if
 * the sign trick were wrong. */
static void int32_exact(void) {
    enum { N = 3, C = 1000, OC = 9 };
    signed char wq[OC * C], xq[N * C];
    float x[N * C], ws[OC], out[N * OC];
    for (int o = 0; o < OC; o++) ws[o] = 1.0f;
    for (int i = 0; i < OC * C; i++) wq[i] = (signed char)(i / C % 3 == 0 ? 127 : i / C % 3 == 1 ? -127 : (i % 2 ? 127 : -127));
    for (int i = 0; i < N * C; i++) xq[i] = (signed char)(i / C == 0 ? 127 : i / C == 1 ? -127 : (i % 3 ? -127 : 127)), x[i] = xq[i];
    loom_tensor_t w = {.data = wq, .dtype = LOOM_INT8, .rows = OC, .cols = C, .scales = ws};
    for (int i = 0; i < 4; i++) {
        if (!loom_cpu_int8_use(isas[i])) continue;
        loom_cpu_matmul_forward_w8a8(out, x, &w, NULL, N, C, OC, 0);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                long long d = 0;
                for (int c = 0; c < C; c++) d += (long long)xq[n * C + c] * wq[o * C + c];
                CHECK(out[n * OC + o] == (float)d, "%s: row %d output %d: %.1f, exact %lld", isas[i], n, o, out[n * OC + o], d);
            }
    }
    loom_cpu_int8_use(NULL);
}

static void gemm_vs_double(void) {
    printf("  int8 kernels: %s on this CPU (all it has are tested)\n", loom_cpu_int8_isa());
    gemm_case(1, 64, 48, 0, 0);
    gemm_case(5, 100, 33, 1, 0);  /* C not a multiple of 32 or 64: the tail */
    gemm_case(17, 256, 70, 0, 0); /* N odd, OC not a multiple of the tile */
    gemm_case(1, 96, 37, 0, 32);  /* Q8_0 blocks: an odd number of blocks */
    gemm_case(17, 256, 70, 1, 32);
    gemm_case(40, 96, 37, 0, 32); /* the prefill tile: 3 input tiles, the last partial; OC not a multiple of 8 */
    gemm_case(3, 128, 8, 0, 64);  /* blocks of 64 */
    gemm_case(4, 40, 6, 0, 8);    /* blocks of 8: the portable path */
}

/* The int8 cache ops: after writes into one block (the second token twice
 * as large as the first, so the scale is raised once), each row
 * dequantizes to the written values within one step of its scale (half a
 * step when never raised), and int8 attention equals fp32 attention over
 * the dequantized cache. */
static void kv_int8_ops(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    enum { NH = 2, hs = 32, C = NH * hs, bs = 8, nb = 3, N = 6 };
    size_t rows = (size_t)nb * 2 * NH, cols = (size_t)bs * hs;
    signed char *q8 = calloc(rows * cols, 1);
    float *sc = calloc(rows, sizeof(float)), *deq = malloc(sizeof(float) * rows * cols);
    float *qkv = check_rand((size_t)N * 3 * C, 1.0f, 21), o8[N * C], o32[N * C];
    for (int i = 0; i < 3 * C; i++) qkv[3 * C + i] *= 2.0f; /* token 1: twice token 0 */
    int slot[N] = {8, 9, 10, 11, 12, 13}, pos[N] = {0, 1, 2, 3, 4, 5}, seq[N] = {0}, table[2] = {1, 0};
    loom_tensor_t k8 = {.data = q8, .dtype = LOOM_INT8, .rows = (long long)rows, .cols = (long long)cols, .scales = sc};
    be->kv_write(&k8, qkv, slot, N, NH, NH, bs);
    CHECK(loom_tensor_check(&k8, "cache") == LOOM_OK, "%s", loom_errmsg());
    loom_tensor_dequantize(&k8, deq);
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int w = 0; w < 2; w++)
            for (int h = 0; h < NH; h++) {
                size_t r = ((size_t)1 * 2 + w) * NH + h;
                for (int e = 0; e < hs; e++) {
                    double err = fabs(deq[r * cols + (size_t)i * hs + e] - qkv[(size_t)i * 3 * C + (1 + w) * C + h * hs + e]) / sc[r];
                    worst = err > worst ? err : worst;
                }
            }
    CHECK(worst <= 1.0 + 1e-4, "int8 cache: error %.4f steps (bound 1)", worst);
    loom_tensor_t k32 = {.data = deq, .dtype = LOOM_FP32, .rows = (long long)rows, .cols = (long long)cols};
    be->paged_attention(o8, qkv, &k8, pos, seq, table, 2, N, NH, NH, bs);
    be->paged_attention(o32, qkv, &k32, pos, seq, table, 2, N, NH, NH, bs);
    double e = check_rel_err(o8, o32, (size_t)N * C);
    CHECK(e < 1e-5, "int8 attention vs fp32 attention on the dequantized cache: normalized error %.3g", e);
    printf("  int8 cache worst error %.3f steps; attention vs dequantized fp32 %.2g\n", worst, e);
    be->kv_copy_block(&k8, 1, 2, NH);
    CHECK(!memcmp(q8 + 2 * 2 * NH * cols, q8 + 1 * 2 * NH * cols, 2 * NH * cols) &&
          !memcmp(sc + 2 * 2 * NH, sc + 2 * NH, 2 * NH * sizeof(float)), "kv_copy_block: data or scales differ");
    free(q8), free(sc), free(deq), free(qkv);
}

/* A first-order Markov language over V tokens: each token has 3 likely
 * successors. */
static void markov(int *x, int n, int V, unsigned *seed) {
    int t = (int)(*seed % (unsigned)V);
    for (int i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        unsigned r = (*seed >> 8) % 100;
        x[i] = t;
        t = r < 60 ? (t * 7 + 3) % V : r < 85 ? (t * 13 + 1) % V : r < 95 ? (t + 5) % V : (int)((*seed >> 4) % (unsigned)V);
    }
}

static loom_gpt_t *trained_model(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    loom_gpt_config_t c = {.max_seq_len = 64, .vocab_size = 64, .n_layer = 2, .n_head = 4, .channels = 64};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m = NULL;
    if (loom_gpt_init(&m, &c, be, 3) != LOOM_OK || loom_gpt_alloc_train(m) != LOOM_OK) return NULL;
    const int B = 4, T = 64;
    int tok[8 * 65], in[8 * 64], tg[8 * 64];
    unsigned seed = 1;
    float loss = 0;
    for (int step = 1; step <= 100; step++) {
        for (int b = 0; b < B; b++) {
            markov(tok + b * 65, 65, c.vocab_size, &seed);
            memcpy(in + b * T, tok + b * 65, sizeof(int) * T);
            memcpy(tg + b * T, tok + b * 65 + 1, sizeof(int) * T);
        }
        loom_gpt_zero_grad(m);
        if (loom_gpt_forward(m, in, tg, B, T, 1.0f / (B * T), &loss) != LOOM_OK) return NULL;
        loom_gpt_backward(m, B, T);
        loom_adamw_t hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f,
                           .grad_scale = 1.0f, .t = step};
        be->adamw(m->params, m->grads, m->m, m->v, m->num_params, &hp);
    }
    printf("  trained 100 steps, last training loss %.3f (uniform: %.3f)\n", loss, log(64.0));
    return m;
}

/* Mean loss of the next token over `ns` held-out sequences of 64, through
 * the paged-cache inference path. */
static double infer_loss(loom_infer_t *inf, const int *seqs, int ns, int Vp) {
    float *logits = malloc(sizeof(float) * 64 * Vp);
    int pos[64], seq[64], rows[64], table[64];
    for (int i = 0; i < 64; i++) pos[i] = i, seq[i] = 0, rows[i] = i, table[i] = i;
    double sum = 0;
    for (int s = 0; s < ns; s++) {
        loom_infer_batch_t b = {.n_tokens = 64, .tokens = seqs + s * 65, .pos = pos, .seq = seq, .n_seqs = 1,
                                .block_tables = table, .n_logits = 63, .logit_rows = rows};
        if (loom_infer_forward(inf, &b, logits) != LOOM_OK) return NAN;
        for (int p = 0; p < 63; p++) {
            const float *l = logits + (size_t)p * Vp;
            double mx = -1e30, z = 0;
            for (int v = 0; v < 64; v++) mx = l[v] > mx ? l[v] : mx;
            for (int v = 0; v < 64; v++) z += exp(l[v] - mx);
            sum += log(z) + mx - l[seqs[s * 65 + p + 1]];
        }
    }
    free(logits);
    return sum / (ns * 63.0);
}

/* Greedy continuation: 50 tokens after an 8-token prompt. */
static void greedy(loom_infer_t *inf, const int *prompt, int *out, int Vp) {
    float *logits = malloc(sizeof(float) * Vp);
    int pos[8], seq[8] = {0}, table[64], row = 7;
    for (int i = 0; i < 64; i++) table[i] = i;
    for (int i = 0; i < 8; i++) pos[i] = i;
    loom_infer_batch_t b = {.n_tokens = 8, .tokens = prompt, .pos = pos, .seq = seq, .n_seqs = 1,
                            .block_tables = table, .n_logits = 1, .logit_rows = &row};
    for (int k = 0; k < 50; k++) {
        if (loom_infer_forward(inf, &b, logits) != LOOM_OK) break;
        int best = 0;
        for (int v = 1; v < 64; v++) best = logits[v] > logits[best] ? v : best;
        out[k] = best;
        pos[0] = 8 + k, row = 0;
        b = (loom_infer_batch_t){.n_tokens = 1, .tokens = &out[k], .pos = pos, .seq = seq, .n_seqs = 1,
                                 .block_tables = table, .n_logits = 1, .logit_rows = &row};
    }
    free(logits);
}

/* The paths compared with fp32: mode, KV dtype, scale block, int8 logits. */
static const struct {
    const char *name;
    loom_quant_mode mode;
    int kv8, block, logits;
    double bound; /* on |perplexity / fp32's - 1| */
} paths[] = {
    {"fp32", LOOM_QUANT_NONE, 0, 0, 0, 0},
    {"w8a32", LOOM_QUANT_W8A32, 0, 0, 1, 0.01},
    {"w8a8", LOOM_QUANT_W8A8, 0, 0, 1, 0.02},
    {"int8 KV", LOOM_QUANT_NONE, 1, 0, 0, 0.01},
    {"w8a32, fp32 logits", LOOM_QUANT_W8A32, 0, 0, 0, 0.01},
    {"w8a8, fp32 logits", LOOM_QUANT_W8A8, 0, 0, 0, 0.02},
    {"w8a32 Q8_0 blocks", LOOM_QUANT_W8A32, 0, 32, 1, 0.01},
    {"w8a8 Q8_0 blocks", LOOM_QUANT_W8A8, 0, 32, 1, 0.02},
};
#define NPATHS (int)(sizeof paths / sizeof paths[0])

/* Perplexity and 20 greedy continuations of `path` on m. */
static double run_path(loom_gpt_t *m, int path, const int *seqs, int ns, int gen[20][50]) {
    loom_quant_t *q = NULL;
    loom_infer_t *inf = NULL;
    int Vp = m->cfg.padded_vocab_size;
    /* blocks of 16: a block's scale is set by its first token and raised by later ones */
    CHECK(loom_infer_create(&inf, m, 8, 16, paths[path].kv8 ? LOOM_INT8 : LOOM_FP32, 64, 1, 64) == LOOM_OK, "%s",
          loom_errmsg());
    if (!inf) return NAN;
    loom_quant_opts_t o = {.block = paths[path].block, .logits = paths[path].logits};
    if (paths[path].mode != LOOM_QUANT_NONE)
        CHECK(loom_quant_create_opts(&q, m, paths[path].mode, &o) == LOOM_OK, "%s", loom_errmsg());
    loom_infer_set_quant(inf, q);
    double ppl = exp(infer_loss(inf, seqs, ns, Vp));
    for (int p = 0; p < 20; p++) greedy(inf, seqs + (p % ns) * 65 + (p / ns) * 8, gen[p], Vp);
    loom_infer_free(inf);
    loom_quant_free(q);
    return ppl;
}

static void perplexity_bounds(void) {
    loom_gpt_t *m = trained_model();
    CHECK(m != NULL, "training: %s", loom_errmsg());
    if (!m) return;
    int ns = 16, *seqs = malloc(sizeof(int) * 65 * ns), (*gen)[20][50] = malloc(sizeof(int) * NPATHS * 20 * 50);
    unsigned seed = 999;
    for (int s = 0; s < ns; s++) markov(seqs + s * 65, 65, 64, &seed);
    double ppl[NPATHS];
    for (int i = 0; i < NPATHS; i++) ppl[i] = run_path(m, i, seqs, ns, gen[i]);
    CHECK(ppl[0] < 32.0, "the model did not learn (perplexity %.2f of 64)", ppl[0]);
    printf("  perplexity fp32 %.4f\n", ppl[0]);
    for (int i = 1; i < NPATHS; i++) {
        double d = ppl[i] / ppl[0] - 1;
        int same = 0;
        for (int p = 0; p < 20; p++)
            for (int k = 0; k < 50; k++) same += gen[i][p][k] == gen[0][p][k];
        printf("  %-20s perplexity %.4f (%+.3f%%), greedy tokens equal to fp32's: %d of 1000\n", paths[i].name, ppl[i],
               100 * d, same);
        CHECK(fabs(d) < paths[i].bound, "%s perplexity %.4f vs fp32 %.4f: %.3f%% (bound %.0f%%)", paths[i].name, ppl[i],
              ppl[0], 100 * d, 100 * paths[i].bound);
    }
    free(seqs), free(gen);
    loom_gpt_free(m);
}

int main(void) {
    RUN(round_trip);
    RUN(round_trip_q8_0);
    RUN(gemm_vs_double);
    RUN(int32_exact);
    RUN(quantize_ties);
    RUN(kv_int8_ops);
    RUN(perplexity_bounds);
    return check_main_end();
}
