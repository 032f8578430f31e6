/* Whole-model tests: finite-difference gradients on a tiny GPT, the
 * determinism of training for a fixed seed and thread count, gradient
 * accumulation equivalence, the LR schedule and checkpoint round trips. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "model/gpt.h"
#include "train/step.h"
#include "train/train.h"

static loom_gpt_config_t tiny(void) {
    loom_gpt_config_t c = {.max_seq_len = 8, .vocab_size = 23, .n_layer = 2, .n_head = 2, .channels = 16};
    return c;
}


/* Loss in double from a float forward: fine for central differences with
 * a step large enough to dominate float rounding. */
static double loss_at(loom_gpt_t *m, const int *in, const int *tg, int B, int T) {
    float l;
    loom_gpt_forward(m, in, tg, B, T, 0.0f, &l);
    return l;
}

static void finite_difference_gradients(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 1);
    loom_gpt_config_t c = tiny();
    loom_gpt_t *m;
    CHECK(loom_gpt_init(&m, &c, be, 7) == LOOM_OK, "init: %s", loom_errmsg());
    /* Larger weights than GPT-2's init so that every path carries signal
     * (but not so large that the loss turns too curved for a 1e-2 step). */
    for (size_t i = 0; i < m->num_params; i++) m->params[i] *= 3.0f;
    for (int t = LOOM_LN1W; t < LOOM_NPARAMS; t++) { /* perturb LN and biases off 1/0 too */
        float tmp[512];
        size_t n = m->ptable[t].numel < 512 ? m->ptable[t].numel : 512;
        check_fill(tmp, n, 0.3f, (unsigned)t);
        for (size_t i = 0; i < n; i++) m->param[t][i] += tmp[i];
    }
    int B = 2, T = 7, in[14], tg[14];
    check_tokens(in, B * T, c.vocab_size, 1);
    check_tokens(tg, B * T, c.vocab_size, 2);
    CHECK(loom_gpt_alloc_train(m) == LOOM_OK, "alloc");
    loom_gpt_zero_grad(m);
    float l;
    loom_gpt_forward(m, in, tg, B, T, 1.0f / (B * T), &l);
    loom_gpt_backward(m, B, T);
    /* For each tensor: a few elements, central differences. Bound: 2e-2
     * relative per element (float32 forward, step 1e-2), or an absolute
     * 2e-4 where the gradient is tiny. */
    const float h = 1e-2f;
    int checked = 0;
    for (int t = 0; t < LOOM_NPARAMS; t++) {
        size_t n = m->ptable[t].numel;
        if (t == LOOM_WTE) n = (size_t)c.vocab_size * c.channels;
        if (!n) continue; /* not in this variant */
        for (int k = 0; k < 6; k++) {
            size_t i = (size_t)((k * 2654435761u + (unsigned)t * 40503u) % n);
            float *p = &m->param[t][i], old = *p;
            *p = old + h;
            double lp = loss_at(m, in, tg, B, T);
            *p = old - h;
            double lm = loss_at(m, in, tg, B, T);
            *p = old;
            double fd = (lp - lm) / (2 * h), an = m->grad[t][i];
            double err = fabs(fd - an);
            CHECK(err < 2e-2 * fabs(fd) || err < 2e-4, "%s[%zu]: analytic %.6g vs finite difference %.6g", m->ptable[t].name, i, an, fd);
            checked++;
        }
    }
    int present = 0;
    for (int t = 0; t < LOOM_NPARAMS; t++) present += m->ptable[t].numel > 0;
    CHECK(checked == 6 * present, "checked %d elements", checked);
    loom_gpt_free(m);
}

/* Gradient accumulation over K micro-batches equals one batch of K*B. */
static void grad_accum_matches_big_batch(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 1);
    loom_gpt_config_t c = tiny();
    loom_gpt_t *a, *b;
    loom_gpt_init(&a, &c, be, 3);
    loom_gpt_init(&b, &c, be, 3);
    int in[32], tg[32];
    check_tokens(in, 32, c.vocab_size, 5);
    check_tokens(tg, 32, c.vocab_size, 6);
    loom_optim_t opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    float la, lb, na, nb;
    CHECK(loom_train_step(a, in, tg, 4, 8, 1, &opt, 1e-3f, 1, &la, &na) == LOOM_OK, "step a");
    CHECK(loom_train_step(b, in, tg, 2, 8, 2, &opt, 1e-3f, 1, &lb, &nb) == LOOM_OK, "step b");
    CHECK(fabsf(la - lb) < 1e-5f * fabsf(la), "loss %g vs %g", la, lb);
    CHECK(fabsf(na - nb) < 1e-4f * fabsf(na), "grad norm %g vs %g", na, nb);
    double e = check_rel_err(b->params, a->params, a->num_params);
    CHECK(e < 1e-6, "params after one step differ: %g", e);
    loom_gpt_free(a);
    loom_gpt_free(b);
}

/* Same seed, same threads, same data: the same losses, bit for bit. */
static void training_is_deterministic(void) {
    float losses[2][5];
    for (int run = 0; run < 2; run++) {
        const loom_backend_t *be;
        loom_backend_cpu_init(&be, 2);
        loom_gpt_config_t c = {.max_seq_len = 16, .vocab_size = 50, .n_layer = 2, .n_head = 4, .channels = 32};
        loom_gpt_t *m;
        loom_gpt_init(&m, &c, be, 11);
        int in[64], tg[64];
        loom_optim_t opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        check_tokens(in, 64, c.vocab_size, 100);
        check_tokens(tg, 64, c.vocab_size, 200);
        for (int s = 0; s < 5; s++) { /* one batch, so the loss must fall */
            float norm;
            loom_train_step(m, in, tg, 4, 16, 1, &opt, 1e-3f, s + 1, &losses[run][s], &norm);
        }
        loom_gpt_free(m);
    }
    CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0, "losses differ between identical runs: %.9g vs %.9g",
          losses[0][4], losses[1][4]);
    CHECK(losses[0][4] < losses[0][0], "loss did not fall: %g -> %g", losses[0][0], losses[0][4]);
}

static void lr_schedule(void) {
    CHECK(fabs(loom_lr_at(1, 100, 10, 1.0, 0.1) - 0.1) < 1e-12, "warmup start");
    CHECK(fabs(loom_lr_at(10, 100, 10, 1.0, 0.1) - 1.0) < 1e-12, "warmup end");
    CHECK(fabs(loom_lr_at(55, 100, 10, 1.0, 0.1) - 0.55) < 1e-12, "cosine midpoint: %g", loom_lr_at(55, 100, 10, 1.0, 0.1));
    CHECK(fabs(loom_lr_at(100, 100, 10, 1.0, 0.1) - 0.1) < 1e-12, "cosine end");
}

/* Save, reload into a fresh model: identical parameters and logits; and a
 * truncated file is refused with the tensor named. */
static void checkpoint_round_trip(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 1);
    loom_gpt_config_t c = {.max_seq_len = 12, .vocab_size = 70, .n_layer = 2, .n_head = 2, .channels = 24};
    loom_gpt_t *a, *b;
    loom_gpt_init(&a, &c, be, 9);
    loom_gpt_create(&b, &c, be);
    char dir[] = "/tmp/loom-test-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(loom_run_prepare(dir, 1) == LOOM_OK, "prepare: %s", loom_errmsg());
    FILE *f = fopen(strcat(strcpy((char[4200]){0}, dir), "/config.json"), "w");
    fputs("{}", f);
    fclose(f);
    loom_ckpt_state_t st = {.step = 42, .train_loss = 1.5, .val_loss = 1.6, .data_pos = 1000, .tokenizer_hash = 0xabcdef};
    CHECK(loom_run_save_checkpoint(dir, a, &st, 2) == LOOM_OK, "save: %s", loom_errmsg());
    char ck[4096];
    loom_gpt_config_t c2;
    loom_ckpt_state_t st2;
    CHECK(loom_run_latest(dir, ck, sizeof ck, &c2, &st2) == LOOM_OK, "latest: %s", loom_errmsg());
    CHECK(c2.n_layer == 2 && c2.channels == 24 && c2.vocab_size == 70 && c2.max_seq_len == 12, "config");
    CHECK(st2.step == 42 && st2.data_pos == 1000 && st2.tokenizer_hash == 0xabcdef, "state");
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    CHECK(loom_safetensors_load_gpt(b, path) == LOOM_OK, "load: %s", loom_errmsg());
    CHECK(memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0, "parameters differ after reload");
    /* Truncate by 100 bytes: the load must fail and name a tensor. */
    CHECK(truncate(path, 4000) == 0, "truncate");
    loom_status s = loom_safetensors_load_gpt(b, path);
    CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), "truncated"), "truncated file: status %d, %s", s, loom_errmsg());
    /* Older checkpoints beyond `keep` are removed, the newest stays. */
    for (int k = 1; k <= 3; k++) {
        st.step = 100 + k;
        loom_run_save_checkpoint(dir, a, &st, 2);
    }
    snprintf(path, sizeof path, "%s/checkpoints/step_00000042", dir);
    CHECK(!loom_path_exists(path), "old checkpoint kept");
    snprintf(path, sizeof path, "%s/checkpoints/step_00000103/model.safetensors", dir);
    CHECK(loom_path_exists(path), "newest checkpoint missing");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    loom_gpt_free(a);
    loom_gpt_free(b);
}

/* The description: GPT-2's table is the formula it always was; a Llama
 * variant's table has the shapes its config asks for and no storage for
 * the tensors it lacks; a config loom cannot compute is refused. */
static void model_description(void) {
    loom_gpt_config_t g = {.max_seq_len = 32, .vocab_size = 100, .n_layer = 3, .n_head = 4, .channels = 32};
    CHECK(loom_gpt_config_finish(&g) == LOOM_OK, "gpt2 config");
    size_t C = 32, L = 3;
    CHECK(loom_gpt_num_params(&g) == 100 * C + 32 * C + L * (12 * C * C + 13 * C) + 2 * C, "gpt2 parameter count %zu",
          loom_gpt_num_params(&g));
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(&g, t, &total);
    for (int i = 0; i < LOOM_NPARAMS; i++) CHECK((t[i].numel > 0) == (i != LOOM_LMHEAD), "gpt2 has %s: %zu", t[i].name, t[i].numel);

    loom_gpt_config_t q;
    CHECK(loom_gpt_preset(&q, "qwen2.5-0.5b") == LOOM_OK, "preset");
    q.n_layer = 2, q.max_seq_len = 64, q.vocab_size = 1000; /* keep it small */
    CHECK(loom_gpt_config_finish(&q) == LOOM_OK, "qwen config: %s", loom_errmsg());
    loom_gpt_param_table(&q, t, &total);
    int hs = 896 / 14;
    CHECK(t[LOOM_QKVW].shape[1] == 896 + 2 * 2 * hs && t[LOOM_QKVW].shape[2] == 896, "qkvw rows %d", t[LOOM_QKVW].shape[1]);
    CHECK(t[LOOM_QKVB].numel == 2 * (size_t)(896 + 4 * hs), "qkvb %zu", t[LOOM_QKVB].numel);
    CHECK(t[LOOM_FCW].shape[1] == 2 * 4864 && t[LOOM_FCPROJW].shape[2] == 4864, "swiglu shapes");
    static const int absent[] = {LOOM_WPE, LOOM_LMHEAD, LOOM_LN1B, LOOM_LN2B, LOOM_LNFB, LOOM_ATTPROJB, LOOM_FCB, LOOM_FCPROJB};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        CHECK(t[absent[i]].numel == 0 && (absent[i] + 1 == LOOM_NPARAMS || t[absent[i]].offset == t[absent[i] + 1].offset), "qwen has no %s", t[absent[i]].name);
    CHECK(q.norm_eps == 1e-6f && q.rope_theta == 1e6f, "qwen eps/theta");

    loom_gpt_config_t l;
    CHECK(loom_gpt_preset(&l, "llama-3.1-8b") == LOOM_OK, "preset");
    CHECK(loom_gpt_config_finish(&l) == LOOM_OK, "llama config");
    size_t n = loom_gpt_num_params(&l);
    CHECK(n > 8000000000ull && n < 8100000000ull, "llama-3.1-8b: %zu parameters (8.03B published)", n);
    l.n_kv_heads = 5;
    CHECK(loom_gpt_config_finish(&l) == LOOM_EINVAL && strstr(loom_errmsg(), "n_kv_heads must divide"), "kv heads: %s", loom_errmsg());
}

int main(void) {
    RUN(model_description);
    RUN(finite_difference_gradients);
    RUN(grad_accum_matches_big_batch);
    RUN(training_is_deterministic);
    RUN(lr_schedule);
    RUN(checkpoint_round_trip);
    return check_main_end();
}
