#define _GNU_SOURCE
#include "run.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static int rm_rf(const char *path) {
    if (!loom_path_exists(path)) return 0;
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

loom_status loom_run_prepare(const char *dir, int force) {
    if (loom_path_exists(dir) && !loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "--out %s: exists and is not a folder; choose another --out", dir);
    if (loom_path_is_dir(dir) && !dir_is_empty(dir)) {
        if (!force)
            return loom_error(LOOM_EINVAL, "--out %s: the folder already exists and is not empty; pass --force to replace its run, or choose another --out", dir);
        static const char *const ours[] = {"config.json", "metrics.jsonl", "loss.svg", "tokenizer.json", "latest", "checkpoints"};
        for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", dir, ours[i]);
            if (rm_rf(p) != 0) return loom_error(LOOM_EIO, "%s: cannot remove: %s", p, strerror(errno));
        }
    }
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    return loom_mkdir_p(ck);
}

static loom_status write_json(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

static cJSON *hf_config(const loom_gpt_config_t *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_embd", c->channels);
    cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(j, "n_head", c->n_head);
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

loom_status loom_run_save_checkpoint(const char *dir, const loom_gpt_t *m,
                                     const loom_ckpt_state_t *st, int keep) {
    return loom_run_save_checkpoint_with(dir, m, st, keep, NULL, NULL);
}

loom_status loom_run_write_ckpt_meta(const char *tmp, const loom_gpt_config_t *cfg, const loom_ckpt_state_t *st) {
    char path[4200];
    cJSON *hf = hf_config(cfg);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    loom_status s = write_json(path, hf);
    cJSON_Delete(hf);
    LOOM_TRY(s);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "train_loss", st->train_loss);
    if (st->val_loss >= 0) cJSON_AddNumberToObject(j, "val_loss", st->val_loss);
    cJSON_AddNumberToObject(j, "data_position", (double)st->data_pos);
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)st->tokenizer_hash);
    cJSON_AddStringToObject(j, "tokenizer_hash", hash);
    cJSON_AddNumberToObject(j, "padded_vocab_size", cfg->padded_vocab_size);
    if (st->world_size > 0) { /* what the global batch was made of */
        cJSON_AddNumberToObject(j, "world_size", st->world_size);
        cJSON_AddNumberToObject(j, "zero", st->zero);
        cJSON_AddNumberToObject(j, "batch", st->batch);
        cJSON_AddNumberToObject(j, "seq", st->seq);
        cJSON_AddNumberToObject(j, "grad_accum", st->grad_accum);
    }
    snprintf(path, sizeof path, "%s/state.json", tmp);
    s = write_json(path, j);
    cJSON_Delete(j);
    return s;
}

loom_status loom_run_save_checkpoint_with(const char *dir, const loom_gpt_t *m,
                                          const loom_ckpt_state_t *st, int keep,
                                          loom_status (*extra)(const char *tmp_dir, void *ctx), void *ctx) {
    char tmp[4096], path[4200];
    LOOM_TRY(loom_ckpt_begin(dir, st->step, tmp, sizeof tmp));
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    LOOM_TRY(loom_safetensors_save_gpt(m, path));
    LOOM_TRY(loom_run_write_ckpt_meta(tmp, &m->cfg, st));
    if (extra) LOOM_TRY(extra(tmp, ctx));
    return loom_ckpt_commit(dir, st->step, keep);
}

static int json_int(cJSON *o, const char *k, int *out) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)v->valueint || v->valueint <= 0) return 0;
    *out = v->valueint;
    return 1;
}

/* A whole number in [lo, hi] stored under `k`; 0 when absent or not one. */
static int json_whole(cJSON *o, const char *k, double lo, double hi, double *out) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi) || x != (double)(long long)x) return 0;
    *out = x;
    return 1;
}

/* state.json, trusted no further than it checks: the step must be the one
 * in the folder's name, positions and losses in range. */
static loom_status read_state(const char *path, long long folder_step, int padded_vocab, loom_ckpt_state_t *st) {
    char *text;
    size_t len;
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    memset(st, 0, sizeof *st);
    st->val_loss = -1;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return loom_error(LOOM_EFORMAT, "%s: not a JSON object", path);
    }
    double step = 0, pos = 0, pv = 0;
    cJSON *v, *tl = cJSON_GetObjectItemCaseSensitive(j, "train_loss"), *vl = cJSON_GetObjectItemCaseSensitive(j, "val_loss");
    cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "tokenizer_hash");
    loom_status s = LOOM_OK;
    char *end = NULL;
    if (!json_whole(j, "step", 1, 9007199254740992.0, &step))
        s = loom_error(LOOM_EFORMAT, "%s: \"step\" is missing or not a whole number from 1 to 2^53", path);
    else if ((long long)step != folder_step)
        s = loom_error(LOOM_EFORMAT, "%s: \"step\" is %.0f but the folder is the checkpoint of step %lld; the file was edited or mixed up",
                       path, step, folder_step);
    else if (!json_whole(j, "data_position", 0, 9007199254740992.0, &pos))
        s = loom_error(LOOM_EFORMAT, "%s: \"data_position\" is missing or not a whole number from 0 to 2^53", path);
    else if ((tl && !cJSON_IsNull(tl) && (!cJSON_IsNumber(tl) || !isfinite(tl->valuedouble))) ||
             (vl && (!cJSON_IsNumber(vl) || !isfinite(vl->valuedouble) || vl->valuedouble < 0)))
        s = loom_error(LOOM_EFORMAT, "%s: \"train_loss\" or \"val_loss\" is not a finite number", path);
    else if (th && (!cJSON_IsString(th) || strlen(th->valuestring) != 16 || (strtoull(th->valuestring, &end, 16), *end)))
        s = loom_error(LOOM_EFORMAT, "%s: \"tokenizer_hash\" is not 16 hex digits", path);
    else if ((v = cJSON_GetObjectItemCaseSensitive(j, "padded_vocab_size")) &&
             (!json_whole(j, "padded_vocab_size", 1, 1 << 30, &pv) || (int)pv != padded_vocab))
        s = loom_error(LOOM_EFORMAT, "%s: \"padded_vocab_size\" does not match the checkpoint's model (%d)", path, padded_vocab);
    if (s == LOOM_OK) {
        st->step = (long long)step;
        st->data_pos = (unsigned long long)pos;
        st->train_loss = cJSON_IsNumber(tl) ? tl->valuedouble : NAN;
        static const char *const shape[] = {"world_size", "zero", "batch", "seq", "grad_accum"};
        int *dst[] = {&st->world_size, &st->zero, &st->batch, &st->seq, &st->grad_accum};
        for (int i = 0; i < 5; i++) {
            double x;
            if (json_whole(j, shape[i], i == 1 ? 0 : 1, 1 << 30, &x)) *dst[i] = (int)x;
        }
        if (vl) st->val_loss = vl->valuedouble;
        if (th) st->tokenizer_hash = strtoull(th->valuestring, NULL, 16);
    }
    cJSON_Delete(j);
    return s;
}

loom_status loom_run_find(const char *dir, const char *which, char *ckpt_dir, size_t cap,
                          loom_gpt_config_t *cfg, loom_ckpt_state_t *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "%s: no such folder; train one with `loom train --out %s`", dir, dir);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: not a loom run (no config.json); pass the --out folder of a `loom train`", dir);
    long long folder_step;
    LOOM_TRY(loom_ckpt_find(dir, which, ckpt_dir, cap, &folder_step));
    char *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", ckpt_dir);
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    memset(cfg, 0, sizeof *cfg);
    int ok = j && json_int(j, "vocab_size", &cfg->vocab_size) && json_int(j, "n_positions", &cfg->max_seq_len) &&
             json_int(j, "n_embd", &cfg->channels) && json_int(j, "n_layer", &cfg->n_layer) && json_int(j, "n_head", &cfg->n_head);
    cJSON_Delete(j);
    if (!ok) return loom_error(LOOM_EFORMAT, "%s: missing or malformed model fields (vocab_size, n_positions, n_embd, n_layer, n_head: positive whole numbers)", path);
    LOOM_TRY(loom_gpt_config_finish(cfg));
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    return read_state(path, folder_step, cfg->padded_vocab_size, st);
}

loom_status loom_run_latest(const char *dir, char *ckpt_dir, size_t cap, loom_gpt_config_t *cfg,
                            loom_ckpt_state_t *st) {
    return loom_run_find(dir, NULL, ckpt_dir, cap, cfg, st);
}
