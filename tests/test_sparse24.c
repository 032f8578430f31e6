/* 2:4 sparse weights run compressed (model/sparse24.h,
 * backend/cpu/cpu_paged.c):
 * - compression round-trips: the compressed tensor dequantizes to the
 *   pruned dense weight exactly, groups with 3 or 4 zeros included;
 * - the kernel (AVX2 and portable) equals a double-precision dense product
 *   on the same pruned weights, odd sizes, N = 1, 17 and 70, bias and
 *   GELU epilogues;
 * - a pruned model's logits through the compressed path equal the dense
 *   path's within fp32 rounding (prefill and decode rows), its greedy
 *   tokens are identical on a few prompts, also with the dense weights
 *   given back (long prefill runs decompress for the GEMM), and `--sparse auto` picks the
 *   compressed path only for a 2:4 model on a backend with the kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_paged.h"
#include "check.h"
#include "model/generate.h"
#include "model/infer.h"
#include "model/quant.h"
#include "model/sparse24.h"

/* A pruned (rows, cols) weight with some groups of 3 and 4 zeros. */
static float *pruned(long long rows, long long cols, unsigned seed) {
    float *w = check_rand((size_t)(rows * cols), 0.5f, seed);
    loom_prune24_rows(w, rows, cols);
    for (long long c = 0; c < cols; c++) w[c] = 0.0f;   /* an all-zero row */
    if (rows > 2) w[2 * cols + 1] = w[2 * cols + 2] = w[2 * cols + 3] = 0.0f, w[2 * cols] = 1.5f;
    return w;
}

static loom_tensor_t compressed(const float *w, long long rows, long long cols, float **vals, unsigned char **meta) {
    *vals = malloc(sizeof(float) * (size_t)(rows * cols / 2));
    *meta = malloc((size_t)(rows * ((cols + 7) / 8)));
    loom_sparse24_compress(w, rows, cols, *vals, *meta);
    return (loom_tensor_t){.data = *vals, .dtype = LOOM_FP32, .rows = rows, .cols = cols,
                           .layout = LOOM_LAYOUT_SPARSE24, .meta = *meta};
}

static void compress_round_trip(void) {
    const long long shapes[3][2] = {{13, 36}, {5, 8}, {7, 100}};
    for (int s = 0; s < 3; s++) {
        long long R = shapes[s][0], C = shapes[s][1];
        float *w = pruned(R, C, 3 + s), *vals, *back = malloc(sizeof(float) * (size_t)(R * C));
        unsigned char *meta;
        loom_tensor_t t = compressed(w, R, C, &vals, &meta);
        CHECK(loom_tensor_check(&t, "w") == LOOM_OK, "%s", loom_errmsg());
        loom_tensor_dequantize(&t, back);
        CHECK(!memcmp(back, w, sizeof(float) * (size_t)(R * C)), "%lld x %lld: the round trip differs", R, C);
        free(w), free(vals), free(meta), free(back);
    }
    float dense[8] = {1, 2, 0, 3, 0, 0, 4, 5};
    CHECK(loom_prune24_violations(dense, 1, 8) == 1, "a group of 3 non-zeros is not found");
}

/* The kernel against a double dense reference on the same pruned weights. */
static void kernel_case(int N, int C, int OC, int gelu, int with_bias) {
    float *w = pruned(OC, C, 11), *x = check_rand((size_t)N * C, 1.0f, 12), *vals;
    float *bias = with_bias ? check_rand((size_t)OC, 0.5f, 13) : NULL, *out = malloc(sizeof(float) * N * OC);
    float *dense = malloc(sizeof(float) * N * OC);
    double *ref = malloc(sizeof(double) * N * OC);
    unsigned char *meta;
    loom_tensor_t t = compressed(w, OC, C, &vals, &meta);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double v = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) v += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
            ref[(size_t)n * OC + o] = gelu ? 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) : v;
        }
    for (int scalar = 1; scalar >= 0; scalar--) { /* the portable loop, then the best the CPU has */
        const char *why = "";
        CHECK(loom_cpu_gemm_select(scalar ? "scalar" : NULL, &why) == 0, "%s", why);
        loom_cpu_matmul_forward_s24(out, x, &t, bias, N, C, OC, gelu);
        double e = check_rel_err_d(out, ref, (size_t)N * OC);
        CHECK(e < 1e-6, "%s N=%d C=%d OC=%d gelu=%d bias=%d: normalized error %.3g (bound 1e-6)",
              loom_cpu_s24_avx2() ? "avx2" : "portable", N, C, OC, gelu, with_bias, e);
    }
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    be->matmul_forward_rows(dense, x, w, bias, N, C, OC, gelu);
    double d = check_rel_err(out, dense, (size_t)N * OC);
    CHECK(d < 1e-6, "N=%d C=%d OC=%d: %.3g from the dense kernel on the same weights", N, C, OC, d);
    printf("  N=%d C=%d OC=%d gelu=%d bias=%d: vs double %.2g, vs the dense kernel %.2g\n", N, C, OC, gelu,
           with_bias, check_rel_err_d(out, ref, (size_t)N * OC), d);
    free(w), free(x), free(vals), free(meta), free(bias), free(out), free(dense), free(ref);
}

static void kernel_vs_double(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    CHECK(be->matmul_forward_s24 != NULL, "the CPU backend has no matmul_forward_s24");
    printf("  AVX2 kernel: %s\n", loom_cpu_s24_avx2() ? "used" : "not on this CPU (portable path only)");
    kernel_case(1, 36, 13, 0, 1);   /* C % 8 == 4: the last group alone */
    kernel_case(17, 64, 37, 1, 1);  /* GELU; OC % 4 != 0: edge outputs */
    kernel_case(17, 100, 5, 0, 0);  /* no bias */
    kernel_case(1, 768, 70, 1, 1);
    kernel_case(70, 40, 9, 0, 1);   /* a second pass of 64 input rows */
}

/* ---- a small model ---- */

/* Sequences where each token mostly follows from the last: next =
 * (5 t + 3) mod V, one in 8 random. */
static void walk(int *x, int n, int V, unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    x[0] = (int)(*seed >> 16) % V;
    for (int i = 1; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        x[i] = (*seed >> 16) % 8 ? (5 * x[i - 1] + 3) % V : (int)(*seed >> 20) % V;
    }
}

/* C = 68 (not a multiple of 8) and 4 heads of 17; trained 60 steps, then pruned. */
static loom_gpt_t *pruned_model(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    loom_gpt_config_t c = {.max_seq_len = 64, .vocab_size = 64, .n_layer = 2, .n_head = 4, .channels = 68};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m = NULL;
    if (loom_gpt_init(&m, &c, be, 5) != LOOM_OK || loom_gpt_alloc_train(m) != LOOM_OK) return NULL;
    int in[4 * 64], tg[4 * 64], tok[65];
    unsigned seed = 7;
    float loss = 0;
    for (int step = 1; step <= 60; step++) {
        for (int b = 0; b < 4; b++) {
            walk(tok, 65, c.vocab_size, &seed);
            memcpy(in + b * 64, tok, sizeof(int) * 64);
            memcpy(tg + b * 64, tok + 1, sizeof(int) * 64);
        }
        loom_gpt_zero_grad(m);
        if (loom_gpt_forward(m, in, tg, 4, 64, 1.0f / 256, &loss) != LOOM_OK) return NULL;
        loom_gpt_backward(m, 4, 64);
        loom_adamw_t hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f, .t = step};
        be->adamw(m->params, m->grads, m->m, m->v, m->num_params, &hp);
    }
    printf("  trained 60 steps, training loss %.3f (uniform %.3f)\n", loss, log(64.0));
    return loom_prune24_model(m) == LOOM_OK ? m : NULL;
}

/* Logits of all 64 rows of one sequence, prefilled in chunks of 8 rows
 * (the compressed path's largest batch, LOOM_SPARSE24_MAX_ROWS), then of 8
 * decode steps after its first 56 tokens, into out (64 + 8, Vp). */
static void run_logits(loom_infer_t *inf, const int *seq, float *out, int Vp) {
    int pos[64], sq[64] = {0}, rows[64], table[4] = {0, 1, 2, 3};
    for (int i = 0; i < 64; i++) pos[i] = i, rows[i] = i % LOOM_SPARSE24_MAX_ROWS;
    loom_infer_batch_t b;
    for (int c = 0; c < 64; c += LOOM_SPARSE24_MAX_ROWS) {
        b = (loom_infer_batch_t){.n_tokens = LOOM_SPARSE24_MAX_ROWS, .tokens = seq + c, .pos = pos + c, .seq = sq,
                                 .n_seqs = 1, .block_tables = table, .n_logits = LOOM_SPARSE24_MAX_ROWS,
                                 .logit_rows = rows};
        CHECK(loom_infer_forward(inf, &b, out + (size_t)c * Vp) == LOOM_OK, "%s", loom_errmsg());
    }
    for (int k = 0; k < 8; k++) {
        b = (loom_infer_batch_t){.n_tokens = 1, .tokens = seq + 56 + k, .pos = &pos[56 + k], .seq = sq, .n_seqs = 1,
                                 .block_tables = table, .n_logits = 1, .logit_rows = rows};
        CHECK(loom_infer_forward(inf, &b, out + (size_t)(64 + k) * Vp) == LOOM_OK, "%s", loom_errmsg());
    }
}

static int emit_token(int token, void *ctx) {
    int *o = ctx;
    o[1 + o[0]++] = token;
    return 0;
}

/* Greedy continuations of 4 prompts, dense and compressed, must agree. */
static void greedy_same(loom_gpt_t *m, const loom_sparse24_t *s24) {
    int same = 0, total = 0;
    for (int p = 0; p < 4; p++) {
        uint32_t prompt[6];
        for (int i = 0; i < 6; i++) prompt[i] = (uint32_t)((p * 11 + 5 * i) % 64);
        int got[2][41] = {{0}};
        for (int k = 0; k < 2; k++) {
            loom_sampling_t sp = {.temperature = 0, .top_k = 0, .top_p = 1};
            loom_rng_t rng;
            loom_rng_seed(&rng, 1);
            CHECK(loom_gpt_generate_with(m, NULL, k ? s24 : NULL, LOOM_FP32, prompt, 6, 40, &sp, &rng, emit_token,
                                         got[k]) == LOOM_OK, "%s", loom_errmsg());
        }
        for (int i = 0; i < 40; i++) same += got[0][1 + i] == got[1][1 + i];
        total += 40;
    }
    CHECK(same == total, "greedy tokens: %d of %d equal", same, total);
    printf("  greedy tokens equal, dense vs compressed: %d of %d\n", same, total);
}

/* With the dense linear weights given back (as `loom serve` does; their
 * pages read as zeros afterwards), the same 64 rows prefilled in one batch
 * (the GEMM on weights decompressed one at a time) and 8 decode rows give
 * the dense path's logits within fp32 rounding. */
static void dense_gone_same(loom_gpt_t *m, loom_sparse24_t *s24, const int *seq, const float *dense) {
    loom_infer_weights_t w = {NULL, s24};
    size_t given = loom_infer_weights_release_fp32(m, &w);
    const float *qkv = m->param[LOOM_QKVW];
    int zeros = 1, Vp = m->cfg.padded_vocab_size, pos[64], sq[64] = {0}, rows[64], table[4] = {0, 1, 2, 3};
    for (int i = 1024; i < 2048; i++) zeros &= qkv[i] == 0.0f;
    CHECK(given > 0 && zeros && loom_sparse24_dense_gone(s24), "%zu bytes given back, dense reads zero %d", given, zeros);
    float *lg = malloc(sizeof(float) * 72 * Vp);
    loom_infer_t *inf = NULL;
    CHECK(loom_infer_create(&inf, m, 4, 16, LOOM_FP32, 64, 1, 64) == LOOM_OK, "%s", loom_errmsg());
    loom_infer_set_sparse24(inf, s24);
    for (int i = 0; i < 64; i++) pos[i] = rows[i] = i;
    loom_infer_batch_t b = {.n_tokens = 64, .tokens = seq, .pos = pos, .seq = sq, .n_seqs = 1, .block_tables = table,
                            .n_logits = 64, .logit_rows = rows};
    CHECK(loom_infer_forward(inf, &b, lg) == LOOM_OK, "%s", loom_errmsg());
    for (int k = 0; k < 8; k++) {
        b = (loom_infer_batch_t){.n_tokens = 1, .tokens = seq + 56 + k, .pos = &pos[56 + k], .seq = sq, .n_seqs = 1,
                                 .block_tables = table, .n_logits = 1, .logit_rows = rows};
        CHECK(loom_infer_forward(inf, &b, lg + (size_t)(64 + k) * Vp) == LOOM_OK, "%s", loom_errmsg());
    }
    double e = check_rel_err(lg, dense, (size_t)72 * Vp);
    CHECK(e < 1e-5, "logits without the dense weights vs dense: normalized difference %.3g (bound 1e-5)", e);
    printf("  dense weights given back (%zu bytes): 64-row prefill + 8 decode rows vs dense, normalized %.2g\n", given, e);
    loom_infer_free(inf);
    free(lg);
}

static void model_paths_agree(void) {
    loom_gpt_t *m = pruned_model();
    CHECK(m != NULL, "training or pruning: %s", loom_errmsg());
    if (!m) return;
    int Vp = m->cfg.padded_vocab_size, seq[65];
    unsigned seed = 99;
    walk(seq, 65, 64, &seed);
    loom_sparse24_t *s24 = NULL;
    CHECK(loom_sparse24_auto(&s24, m, LOOM_SPARSE_AUTO) == LOOM_OK && s24, "auto on a pruned model: %s", loom_errmsg());
    if (!s24) return;
    size_t want = 2 * ((size_t)12 * 68 * 68 / 2 * 4 + (size_t)(3 + 1 + 4) * 68 * 9 + 68 * 34);
    CHECK(loom_sparse24_bytes(s24) == want, "%zu bytes, want %zu", loom_sparse24_bytes(s24), want);
    float *lg[2];
    for (int k = 0; k < 2; k++) {
        loom_infer_t *inf = NULL;
        lg[k] = malloc(sizeof(float) * 72 * Vp);
        CHECK(loom_infer_create(&inf, m, 4, 16, LOOM_FP32, 64, 1, 64) == LOOM_OK, "%s", loom_errmsg());
        loom_infer_set_sparse24(inf, k ? s24 : NULL);
        run_logits(inf, seq, lg[k], Vp);
        loom_infer_free(inf);
    }
    double e = check_rel_err(lg[1], lg[0], (size_t)72 * Vp), mx = 0;
    for (size_t i = 0; i < (size_t)72 * Vp; i++) mx = fmax(mx, fabs((double)lg[1][i] - lg[0][i]));
    CHECK(e < 1e-6, "logits compressed vs dense: normalized difference %.3g (bound 1e-6)", e);
    printf("  logits of 64 prefill + 8 decode rows, compressed vs dense: normalized %.2g, largest %.2g\n", e, mx);
    greedy_same(m, s24);
    dense_gone_same(m, s24, seq, lg[0]);
    free(lg[0]), free(lg[1]);
    loom_sparse24_free(s24);
    loom_gpt_free(m);
}

/* --sparse auto: a dense model and --sparse off give no copy; a backend
 * without the kernel gives none either; create names a dense weight. */
static void auto_rules(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    loom_gpt_config_t c = {.max_seq_len = 16, .vocab_size = 32, .n_layer = 1, .n_head = 2, .channels = 32};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m = NULL;
    CHECK(loom_gpt_init(&m, &c, be, 1) == LOOM_OK, "%s", loom_errmsg());
    if (!m) return;
    loom_sparse24_t *s = (loom_sparse24_t *)1;
    CHECK(loom_sparse24_auto(&s, m, LOOM_SPARSE_AUTO) == LOOM_OK && !s, "a dense model got a 2:4 copy");
    CHECK(loom_sparse24_create(&s, m) == LOOM_EINVAL && strstr(loom_errmsg(), "h.0.attn.c_attn.weight") &&
              strstr(loom_errmsg(), "loom prune"), "dense create: %s", loom_errmsg());
    CHECK(loom_prune24_model(m) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_sparse24_auto(&s, m, LOOM_SPARSE_OFF) == LOOM_OK && !s, "--sparse off made a copy");
    loom_backend_t without = *be;
    without.matmul_forward_s24 = NULL;
    m->be = &without;
    CHECK(loom_sparse24_auto(&s, m, LOOM_SPARSE_AUTO) == LOOM_OK && !s, "a backend without the kernel got a copy");
    m->be = be;
    CHECK(loom_sparse24_auto(&s, m, LOOM_SPARSE_AUTO) == LOOM_OK && s, "a pruned model got no copy: %s", loom_errmsg());
    loom_sparse24_free(s);
    loom_gpt_free(m);
}

int main(void) {
    RUN(compress_round_trip);
    RUN(kernel_vs_double);
    RUN(model_paths_agree);
    RUN(auto_rules);
    return check_main_end();
}
