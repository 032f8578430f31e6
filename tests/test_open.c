/* One call opens a model for inference (ckpt/open.h):
 *   - which kind a path is: run folder, checkpoint, Hugging Face folder,
 *     GGUF file, and the errors for a missing path and for anything else;
 *   - a run opens its newest checkpoint, --step an older one, and a
 *     checkpoint folder itself: the weights are the ones saved (bit for
 *     bit), the state is the checkpoint's;
 *   - config_only describes without a model; a checkpoint whose weights
 *     were changed after it was written is refused, with nothing left to free;
 *   - the int8 or 2:4 copies the options ask for, the KV cache type.
 * Hugging Face folders and GGUF files against transformers and the gguf
 * reader: tests/test_interop.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt/open.h"
#include "ckpt/run.h"
#include "model/quant.h"
#include "model/sparse24.h"

static const loom_backend_t *be;
static loom_gpt_t *saved[2]; /* the weights of step 1 and step 2 */
static char run[4096];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* A run with checkpoints of step 1 and step 2 (different weights; the
 * step-2 model is 2:4 pruned, the step-1 model dense). */
static void make_run(void) {
    loom_gpt_config_t c = {.max_seq_len = 16, .vocab_size = 70, .n_layer = 2, .n_head = 2, .channels = 32};
    loom_gpt_config_finish(&c);
    snprintf(run, sizeof run, "%s", check_tmp_path("run"));
    LOOM_ASSERT(loom_run_prepare(run, 1) == LOOM_OK);
    loom_run_config_t rc;
    loom_run_config_defaults(&rc);
    snprintf(rc.format, sizeof rc.format, "%s", LOOM_RUN_FORMAT);
    rc.model_cfg = c;
    LOOM_ASSERT(loom_run_config_write(run, &rc) == LOOM_OK);
    for (int k = 0; k < 2; k++) {
        LOOM_ASSERT(loom_gpt_init(&saved[k], &c, be, 7 + (uint64_t)k) == LOOM_OK);
        if (k == 1) LOOM_ASSERT(loom_prune24_model(saved[k]) == LOOM_OK);
        loom_ckpt_state_t st = {.step = k + 1, .train_loss = 2.5 - k, .val_loss = -1, .data_pos = 100 * ((unsigned long long)k + 1)};
        LOOM_ASSERT(loom_run_save_checkpoint(run, saved[k], &st, 2) == LOOM_OK);
    }
}

static int same_weights(const loom_gpt_t *a, const loom_gpt_t *b) {
    return a && b && a->num_params == b->num_params && !memcmp(a->params, b->params, a->num_params * sizeof(float));
}

static void detects_each_kind(void) {
    const char *hf = check_tmp_path("hf"), *gg = check_tmp_path("m.gguf"), *txt = check_tmp_path("notes.txt");
    char p[4200];
    loom_mkdir_p(hf);
    snprintf(p, sizeof p, "%s/config.json", hf);
    write_file(p, "{\"model_type\": \"gpt2\"}");
    write_file(gg, "GGUF\003\0\0\0");
    write_file(txt, "hello");
    snprintf(p, sizeof p, "%s/checkpoints/step_00000002", run);
    struct {
        const char *path;
        loom_source_kind kind;
    } ok[] = {{run, LOOM_SOURCE_RUN}, {p, LOOM_SOURCE_CHECKPOINT}, {hf, LOOM_SOURCE_HF}, {gg, LOOM_SOURCE_GGUF}};
    for (int i = 0; i < 4; i++) {
        loom_source_kind k = (loom_source_kind)-1;
        loom_status s = loom_open_detect(ok[i].path, &k);
        CHECK(s == LOOM_OK && k == ok[i].kind, "%s: status %d, kind %d, want %s: %s", ok[i].path, s, (int)k,
              loom_source_name(ok[i].kind), loom_errmsg());
    }
    loom_source_kind k;
    CHECK(loom_open_detect(txt, &k) == LOOM_EINVAL && strstr(loom_errmsg(), "is neither a run folder") &&
              strstr(loom_errmsg(), "nor a GGUF file"),
          "a text file: %s", loom_errmsg());
    CHECK(loom_open_detect(check_tmp_path("absent"), &k) == LOOM_EINVAL && strstr(loom_errmsg(), "no such folder or file"),
          "a missing path: %s", loom_errmsg());
    CHECK(loom_open_detect(NULL, &k) == LOOM_EINVAL && strstr(loom_errmsg(), "no --run"), "no path: %s", loom_errmsg());
}

static void opens_run_step_and_checkpoint(void) {
    loom_open_opts_t o = loom_open_opts_default();
    o.threads = 1;
    loom_opened_t r;
    CHECK(loom_open(run, &o, &r) == LOOM_OK, "%s", loom_errmsg());
    CHECK(r.kind == LOOM_SOURCE_RUN && r.state.step == 2 && r.state.data_pos == 200 && same_weights(r.model, saved[1]) && !r.tok,
          "newest: kind %d, step %lld", r.kind, r.state.step);
    loom_open_close(&r);
    o.step = 1;
    CHECK(loom_open(run, &o, &r) == LOOM_OK, "%s", loom_errmsg());
    CHECK(r.state.step == 1 && r.state.train_loss == 2.5 && same_weights(r.model, saved[0]), "--step 1: step %lld", r.state.step);
    CHECK(strstr(r.weights_path, "checkpoints/step_00000001") != NULL, "weights from %s", r.weights_path);
    loom_open_close(&r);
    o.step = 5;
    CHECK(loom_open(run, &o, &r) == LOOM_EINVAL && strstr(loom_errmsg(), "--step 5") && !r.model,
          "a missing step: %s", loom_errmsg());
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints/step_00000001/", run);
    o.step = -1;
    CHECK(loom_open(ck, &o, &r) == LOOM_OK, "%s", loom_errmsg());
    CHECK(r.kind == LOOM_SOURCE_CHECKPOINT && r.state.step == 1 && same_weights(r.model, saved[0]), "checkpoint folder: step %lld",
          r.state.step);
    loom_open_close(&r);
    o.step = 1;
    CHECK(loom_open(ck, &o, &r) == LOOM_EINVAL && strstr(loom_errmsg(), "only a run folder"), "--step on a checkpoint: %s",
          loom_errmsg());
}

static void config_only_and_a_changed_checkpoint(void) {
    loom_open_opts_t o = loom_open_opts_default();
    o.config_only = 1;
    loom_opened_t r;
    CHECK(loom_open(run, &o, &r) == LOOM_OK && !r.model && r.cfg.channels == 32 && r.cfg.n_layer == 2 && r.state.step == 2,
          "config only: %s", loom_errmsg());
    loom_open_close(&r);
    /* One weight byte changed after the checkpoint was written: its manifest refuses it. */
    char copy[4200], cmd[9000], path[4300];
    snprintf(copy, sizeof copy, "%s", check_tmp_path("changed"));
    snprintf(cmd, sizeof cmd, "cp -r '%s/checkpoints/step_00000001' '%s'", run, copy);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/model.safetensors", copy);
    FILE *f = fopen(path, "r+b");
    if (f) fseek(f, -4, SEEK_END), fputc(0x5a, f), fclose(f);
    o.config_only = 0;
    loom_status s = loom_open(copy, &o, &r);
    CHECK(s != LOOM_OK && !r.model && !r.tok, "a changed checkpoint opened (status %d)", s);
    CHECK(strstr(loom_errmsg(), "model.safetensors") != NULL, "the error names the file: %s", loom_errmsg());
}

static void weights_copies_and_kv(void) {
    loom_open_opts_t o = loom_open_opts_default();
    loom_opened_t r;
    CHECK(loom_open(run, &o, &r) == LOOM_OK && r.weights.s24 && !r.weights.quant && r.kv_dtype == LOOM_FP32,
          "a 2:4 model under --sparse auto: s24 %p, quant %p", (void *)r.weights.s24, (void *)r.weights.quant);
    loom_open_close(&r);
    o.weights.sparse = LOOM_SPARSE_OFF;
    CHECK(loom_open(run, &o, &r) == LOOM_OK && !r.weights.s24 && !r.weights.quant, "--sparse off made a copy");
    loom_open_close(&r);
    o.weights.quant = LOOM_QUANT_W8A8, o.weights.sparse = LOOM_SPARSE_AUTO, o.kv_dtype = LOOM_INT8;
    CHECK(loom_open(run, &o, &r) == LOOM_OK && r.weights.quant && !r.weights.s24 &&
              loom_quant_mode_of(r.weights.quant) == LOOM_QUANT_W8A8 && r.kv_dtype == LOOM_INT8,
          "--quant w8a8 --kv-dtype int8: %s", loom_errmsg());
    loom_open_close(&r);
    o.step = 1, o.weights.quant = LOOM_QUANT_NONE;
    CHECK(loom_open(run, &o, &r) == LOOM_OK && !r.weights.s24, "a dense model got a 2:4 copy");
    loom_open_close(&r);
    o.kv_dtype = LOOM_BF16;
    CHECK(loom_open(run, &o, &r) == LOOM_EINVAL && strstr(loom_errmsg(), "fp32 or int8"), "a bf16 cache: %s", loom_errmsg());
}

int main(void) {
    LOOM_ASSERT(loom_backend_cpu_init(&be, 1) == LOOM_OK);
    make_run();
    RUN(detects_each_kind);
    RUN(opens_run_step_and_checkpoint);
    RUN(config_only_and_a_changed_checkpoint);
    RUN(weights_copies_and_kv);
    loom_gpt_free(saved[0]);
    loom_gpt_free(saved[1]);
    return check_main_end();
}
