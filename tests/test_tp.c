/* Tensor parallelism (src/parallel/tp.h) on the model variants the CLI's
 * presets do not reach: an untied output head, q/k/v biases (Qwen2's), a
 * vocabulary that is not a multiple of 64 (the last shard part padding),
 * kv heads split over the ranks and one kv head shared by both. Each of 2
 * ranks (forked by loom_launch_local, over TCP) steps its shard and, beside
 * it, the whole model in one piece on the same batch -- the single-process
 * step the trainer's oracle tests check against PyTorch -- and checks that
 * the losses agree to 1e-5 relative and that the shards, gathered into the
 * whole model's layout, agree with the whole model to 1e-5. And the
 * activation dtypes the hooks' all-reduces take. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "parallel/dist.h"
#include "parallel/launch.h"
#include "parallel/tp.h"
#include "train/step.h"

#define B 2
#define T 16
#define STEPS 3

/* 0 when every step's loss and the gathered weights agree; else which check failed. */
static int compare_steps(loom_tp_t *tp, loom_gpt_t *whole, int rank) {
    int tokens[B * T + 1];
    loom_rng_t rng;
    loom_rng_seed(&rng, 9);
    for (int i = 0; i <= B * T; i++) tokens[i] = (int)(loom_rng_u64(&rng) % (uint64_t)whole->cfg.vocab_size);
    loom_optim_t opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};
    for (int s = 1; s <= STEPS; s++) {
        float lw, lt, nw, nt;
        if (loom_train_step(whole, tokens, tokens + 1, B, T, 1, &opt, 1e-3f, s, &lw, &nw) != LOOM_OK) return 10;
        if (loom_train_step_tp(tp, NULL, tokens, tokens + 1, B, T, 1, &opt, 1e-3f, s, &lt, &nt) != LOOM_OK) return 11;
        if (fabsf(lw - lt) > 1e-5f * fabsf(lw) || fabsf(nw - nt) > 1e-4f * nw) {
            fprintf(stderr, "rank %d step %d: loss %.7f vs %.7f, norm %.6f vs %.6f\n", rank, s, lw, lt, nw, nt);
            return 12;
        }
    }
    size_t P = whole->num_params;
    float *gathered = loom_malloc(P * sizeof(float)), *want = loom_malloc(P * sizeof(float));
    int rc = loom_tp_gather(tp, loom_tp_model(tp)->params, rank == 0 ? gathered : NULL) == LOOM_OK ? 0 : 13;
    whole->be->download(want, whole->params, P * sizeof(float));
    for (size_t i = 0; rank == 0 && !rc && i < P; i++)
        if (fabsf(gathered[i] - want[i]) > 1e-5f) {
            fprintf(stderr, "rank 0: gathered weight %zu is %.7f, the whole model's %.7f\n", i, gathered[i], want[i]);
            rc = 14;
        }
    free(gathered);
    free(want);
    return rc;
}

static int rank_main(int rank, void *ctx) {
    const loom_gpt_config_t *cfg = ctx;
    loom_dist_t *d = NULL, *g = NULL;
    loom_dist_opts_t o = {.transport = "tcp", .timeout_s = 600}; /* a guard only */
    const loom_backend_t *be;
    loom_gpt_t *whole = NULL, *start = NULL;
    loom_tp_t *tp = NULL;
    int rc = 2;
    if (loom_dist_init(&d, &o) == LOOM_OK && loom_dist_split(d, 0, rank, &g) == LOOM_OK && loom_backend_cpu_init(&be, 1) == LOOM_OK &&
        loom_gpt_init(&whole, cfg, be, 5) == LOOM_OK && loom_gpt_init(&start, cfg, be, 5) == LOOM_OK &&
        loom_tp_init(&tp, start, be, g, NULL) == LOOM_OK && loom_gpt_alloc_acts(whole, B, T) == LOOM_OK &&
        loom_gpt_alloc_acts(loom_tp_model(tp), B, T) == LOOM_OK)
        rc = compare_steps(tp, whole, rank);
    if (rc == 2) fprintf(stderr, "rank %d: %s\n", rank, loom_errmsg());
    loom_tp_free(tp);
    loom_gpt_free(start);
    loom_gpt_free(whole);
    loom_dist_free(g);
    loom_dist_free(d);
    return rc;
}

static void on_2_ranks(loom_gpt_config_t cfg) {
    loom_launch_t l = {.what = "test_tp", .nproc = 2, .kill_after_s = 600, .run = rank_main, .ctx = &cfg};
    int code = -1;
    loom_status s = loom_launch_local(&l, &code);
    CHECK(s == LOOM_OK && code == 0, "launch %s, exit %d (the rank's message above names the check)",
          s == LOOM_OK ? "ok" : loom_errmsg(), code);
}

/* llama-tiny's block, smaller: RMSNorm, RoPE, SwiGLU, no biases. */
static loom_gpt_config_t llama(int kv_heads) {
    return (loom_gpt_config_t){.max_seq_len = T, .vocab_size = 100, .n_layer = 2, .n_head = 4, .channels = 64,
                               .n_kv_heads = kv_heads, .ffn_hidden = 96, .norm = LOOM_NORM_RMSNORM, .pos = LOOM_POS_ROPE,
                               .mlp = LOOM_MLP_SWIGLU, .bias = LOOM_BIAS_NONE};
}

static void llama_untied_head_kv_split(void) {
    loom_gpt_config_t c = llama(2);
    c.untied_head = 1;
    on_2_ranks(c);
}

static void qwen_qkv_bias_kv_shared(void) {
    loom_gpt_config_t c = llama(1); /* one kv head: both ranks hold it, its gradient summed */
    c.bias = LOOM_BIAS_QKV;
    on_2_ranks(c);
}

static void gpt2_untied_head(void) {
    on_2_ranks((loom_gpt_config_t){.max_seq_len = T, .vocab_size = 100, .n_layer = 2, .n_head = 2, .channels = 32, .untied_head = 1});
}

/* The activation dtypes the hooks' all-reduces take: fp32, bf16 and fp16
 * as stored (on CUDA at those dtypes); another type is refused naming
 * the ones that work. */
static void act_dtypes(void) {
    loom_dist_elem e = (loom_dist_elem)-1;
    CHECK(loom_tp_act_elem(LOOM_FP32, &e) == LOOM_OK && e == LOOM_DIST_ELEM_FP32, "fp32 -> %d", (int)e);
    CHECK(loom_tp_act_elem(LOOM_BF16, &e) == LOOM_OK && e == LOOM_DIST_ELEM_BF16, "bf16 -> %d", (int)e);
    CHECK(loom_tp_act_elem(LOOM_FP16, &e) == LOOM_OK && e == LOOM_DIST_ELEM_FP16, "fp16 -> %d", (int)e);
    loom_status s = loom_tp_act_elem(LOOM_TF32, &e);
    CHECK(s == LOOM_EUNAVAIL && strstr(loom_errmsg(), "--dtype fp32, bf16 or fp16"), "tf32 activations: %d %s", s, loom_errmsg());
}

int main(void) {
    RUN(act_dtypes);
    RUN(llama_untied_head_kv_split);
    RUN(qwen_qkv_bias_kv_shared);
    RUN(gpt2_untied_head);
    return check_main_end();
}
