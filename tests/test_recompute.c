/* test_recompute: activation recompute (--recompute gelu|all) gives the
 * gradients of keeping every activation, in less activation memory, on the
 * CPU reference backend. `gelu` recomputes with the same op on the same
 * input, so its gradients must be bit-identical; `all` recomputes ln1
 * unfused where the forward fused it with the residual add, so it gets a
 * normalized-error bound of 1e-6 per tensor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/gpt.h"
#include "train/step.h"

static const loom_backend_t *be;

static loom_gpt_config_t cfg(void) {
    loom_gpt_config_t c = {.max_seq_len = 16, .vocab_size = 61, .n_layer = 3, .n_head = 4, .channels = 32};
    return c;
}


/* One forward + backward at recompute mode r; gradients copied to *grads,
 * loss and activation floats returned. */
static void grads_at(loom_recompute r, float **grads, float *loss, size_t *num_acts, size_t *nparams) {
    loom_gpt_config_t c = cfg();
    loom_gpt_t *m;
    CHECK(loom_gpt_init(&m, &c, be, 21) == LOOM_OK, "init: %s", loom_errmsg());
    loom_gpt_set_recompute(m, r);
    CHECK(loom_gpt_alloc_train(m) == LOOM_OK, "alloc");
    int B = 3, T = 16, in[48], tg[48];
    check_tokens(in, B * T, c.vocab_size, 3);
    check_tokens(tg, B * T, c.vocab_size, 4);
    loom_gpt_zero_grad(m);
    CHECK(loom_gpt_forward(m, in, tg, B, T, 1.0f / (B * T), loss) == LOOM_OK, "forward: %s", loom_errmsg());
    loom_gpt_backward(m, B, T);
    *grads = malloc(m->num_params * sizeof(float));
    memcpy(*grads, m->grads, m->num_params * sizeof(float));
    *num_acts = m->num_acts;
    *nparams = m->num_params;
    loom_gpt_free(m);
}

static void compare(loom_recompute r, double tol) {
    float *g0, *g1, l0, l1;
    size_t a0, a1, n;
    grads_at(LOOM_RECOMPUTE_NONE, &g0, &l0, &a0, &n);
    grads_at(r, &g1, &l1, &a1, &n);
    CHECK(l0 == l1, "%s: loss %.9g vs %.9g without recompute", loom_recompute_name(r), l1, l0);
    CHECK(a1 < a0, "%s: %zu activation floats, not fewer than the %zu without recompute", loom_recompute_name(r), a1, a0);
    printf("  %s: %zu activation floats vs %zu (%.0f%%)\n", loom_recompute_name(r), a1, a0, 100.0 * a1 / a0);
    loom_gpt_config_t c = cfg();
    c.padded_vocab_size = (c.vocab_size + 63) / 64 * 64;
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(&c, t, &total);
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        if (!t[i].numel) continue; /* not in this variant */
        const float *a = g1 + t[i].offset, *b = g0 + t[i].offset;
        if (tol == 0) {
            CHECK(memcmp(a, b, t[i].numel * sizeof(float)) == 0, "%s: gradient of %s not bit-identical", loom_recompute_name(r), t[i].name);
        } else {
            double e = check_rel_err(a, b, t[i].numel);
            CHECK(e <= tol, "%s: gradient of %s: normalized error %.3g > %.3g", loom_recompute_name(r), t[i].name, e, tol);
        }
    }
    free(g0);
    free(g1);
}

static void recompute_gelu_bitwise(void) { compare(LOOM_RECOMPUTE_GELU, 0); }
static void recompute_all_within_1e6(void) { compare(LOOM_RECOMPUTE_ALL, 1e-6); }

/* Five training steps with grad accumulation: the same losses. */
static void recompute_training_steps(void) {
    float losses[3][5];
    for (int r = 0; r < 3; r++) {
        loom_gpt_config_t c = cfg();
        loom_gpt_t *m;
        loom_gpt_init(&m, &c, be, 5);
        loom_gpt_set_recompute(m, (loom_recompute)r);
        int in[64], tg[64];
        check_tokens(in, 64, c.vocab_size, 8);
        check_tokens(tg, 64, c.vocab_size, 9);
        loom_optim_t opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        for (int s = 0; s < 5; s++) {
            float norm;
            CHECK(loom_train_step(m, in, tg, 2, 16, 2, &opt, 1e-3f, s + 1, &losses[r][s], &norm) == LOOM_OK, "step: %s", loom_errmsg());
        }
        loom_gpt_free(m);
    }
    for (int s = 0; s < 5; s++) {
        CHECK(losses[1][s] == losses[0][s], "gelu step %d: loss %.9g vs %.9g", s + 1, losses[1][s], losses[0][s]);
        CHECK(fabsf(losses[2][s] - losses[0][s]) <= 1e-5f * fabsf(losses[0][s]), "all step %d: loss %.9g vs %.9g", s + 1, losses[2][s], losses[0][s]);
    }
}

static void recompute_names(void) {
    CHECK(loom_recompute_parse("none") == LOOM_RECOMPUTE_NONE, "none");
    CHECK(loom_recompute_parse("gelu") == LOOM_RECOMPUTE_GELU, "gelu");
    CHECK(loom_recompute_parse("all") == LOOM_RECOMPUTE_ALL, "all");
    CHECK(loom_recompute_parse("some") == -1, "unknown name accepted");
    CHECK(strcmp(loom_recompute_name(LOOM_RECOMPUTE_ALL), "all") == 0, "name");
}

int main(void) {
    if (loom_backend_cpu_init(&be, 2) != LOOM_OK) {
        printf("FAIL cpu backend: %s\n", loom_errmsg());
        return 1;
    }
    RUN(recompute_gelu_bitwise);
    RUN(recompute_all_within_1e6);
    RUN(recompute_training_steps);
    RUN(recompute_names);
    return check_main_end();
}
