/* test_gpu_check_ckpt: the fp16 loss scaler's state travels through a
 * checkpoint (issue 14, part 4): state.json holds the scale, the good steps
 * since it changed and the skipped steps (read back here with cJSON, not
 * with loom's reader), loom_run_latest returns them for --resume, and a run
 * without loss scaling writes none of them and reads back 0. CPU only. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "ckpt/run.h"
#include "core/core.h"

static char dir[64];

/* Saves a checkpoint of a tiny CPU model with `st`, reads it back into
 * *back; returns its state.json parsed by cJSON. */
static cJSON *save(const loom_ckpt_state_t *st, loom_ckpt_state_t *back) {
    const loom_backend_t *be;
    loom_gpt_config_t c = {.max_seq_len = 8, .vocab_size = 23, .n_layer = 1, .n_head = 2, .channels = 16};
    loom_gpt_t *m = NULL;
    CHECK(loom_backend_cpu_init(&be, 1) == LOOM_OK && loom_gpt_init(&m, &c, be, 5) == LOOM_OK, "model: %s", loom_errmsg());
    if (!m) return NULL;
    CHECK(loom_run_prepare(dir, 1) == LOOM_OK, "prepare: %s", loom_errmsg());
    char cfgpath[128];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir); /* a run folder has one */
    FILE *f = fopen(cfgpath, "w");
    CHECK(f != NULL, "%s", cfgpath);
    if (f) fputs("{}", f), fclose(f);
    CHECK(loom_run_save_checkpoint(dir, m, st, 1) == LOOM_OK, "save: %s", loom_errmsg());
    loom_gpt_free(m);
    char ck[1024];
    loom_gpt_config_t cfg;
    CHECK(loom_run_latest(dir, ck, sizeof ck, &cfg, back) == LOOM_OK, "latest: %s", loom_errmsg());
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.json", ck);
    CHECK(loom_file_read(path, &text, &len) == LOOM_OK, "%s: %s", path, loom_errmsg());
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(j != NULL, "%s: not JSON", path);
    return j;
}

static double num(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static void loss_scale_saved_and_restored(void) {
    loom_ckpt_state_t st = {.step = 40, .train_loss = 3.5, .val_loss = -1, .data_pos = 1234, .tokenizer_hash = 99,
                            .loss_scale = 8192.0f, .loss_scale_good = 17, .loss_scale_skipped = 3};
    loom_ckpt_state_t back;
    cJSON *j = save(&st, &back);
    if (!j) return;
    CHECK(num(j, "loss_scale") == 8192 && num(j, "loss_scale_good_steps") == 17 && num(j, "loss_scale_skipped_steps") == 3,
          "state.json: loss_scale %g, good %g, skipped %g", num(j, "loss_scale"), num(j, "loss_scale_good_steps"),
          num(j, "loss_scale_skipped_steps"));
    CHECK(back.loss_scale == 8192.0f && back.loss_scale_good == 17 && back.loss_scale_skipped == 3 && back.step == 40,
          "read back: scale %g, good %d, skipped %lld, step %lld", back.loss_scale, back.loss_scale_good,
          back.loss_scale_skipped, back.step);
    cJSON_Delete(j);
}

static void no_loss_scale_writes_none(void) {
    loom_ckpt_state_t st = {.step = 5, .train_loss = 4.0, .val_loss = -1, .data_pos = 10, .tokenizer_hash = 1};
    loom_ckpt_state_t back;
    cJSON *j = save(&st, &back);
    if (!j) return;
    CHECK(!cJSON_GetObjectItemCaseSensitive(j, "loss_scale"), "state.json has a loss_scale without loss scaling");
    CHECK(back.loss_scale == 0 && back.loss_scale_good == 0 && back.loss_scale_skipped == 0,
          "read back: scale %g, good %d, skipped %lld", back.loss_scale, back.loss_scale_good, back.loss_scale_skipped);
    cJSON_Delete(j);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/loom-test-ckpt-%d", (int)getpid());
    RUN(loss_scale_saved_and_restored);
    RUN(no_loss_scale_writes_none);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("  could not remove %s\n", dir);
    return check_main_end();
}
