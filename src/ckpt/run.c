#define _GNU_SOURCE
#include "run.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The model's shape, as both config files write it (Hugging Face keys). */
static void model_to_json(cJSON *j, const loom_gpt_config_t *c) {
    cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(j, "n_head", c->n_head);
    cJSON_AddNumberToObject(j, "n_embd", c->channels);
    cJSON_AddNumberToObject(j, "n_positions", c->max_seq_len);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
}

static int json_int(const cJSON *o, const char *k, int *out) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return 0;
    *out = v->valueint;
    return 1;
}

/* The model's shape from either config file; `path` for the message. */
static loom_status model_from_json(const cJSON *j, const char *path, loom_gpt_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    int ok = j && json_int(j, "vocab_size", &cfg->vocab_size) && json_int(j, "n_positions", &cfg->max_seq_len) &&
             json_int(j, "n_embd", &cfg->channels) && json_int(j, "n_layer", &cfg->n_layer) && json_int(j, "n_head", &cfg->n_head);
    if (!ok) return loom_error(LOOM_EFORMAT, "%s: missing or malformed model fields (vocab_size, n_positions, n_embd, n_layer, n_head)", path);
    return loom_gpt_config_finish(cfg);
}

static cJSON *hf_config(const loom_gpt_config_t *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    model_to_json(j, c);
    cJSON_AddNumberToObject(j, "n_ctx", c->max_seq_len);
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

/* ---- the run's config.json: one table drives the writer and the reader ---- */

typedef enum { F_STR, F_INT, F_LL, F_DBL, F_BOOL, F_HASH, F_MODEL } field_type;
typedef struct {
    const char *key;
    field_type type;
    size_t off, size;
} field_t;

#define RC_FIELD(key, type, member) {key, type, offsetof(loom_run_config_t, member), sizeof(((loom_run_config_t *)0)->member)}
static const field_t run_fields[] = {
    RC_FIELD("format", F_STR, format), RC_FIELD("data", F_STR, data),
    RC_FIELD("data_description", F_STR, data_description), RC_FIELD("val_fraction", F_DBL, val_fraction),
    RC_FIELD("model", F_STR, model), RC_FIELD("model_config", F_MODEL, model_cfg),
    RC_FIELD("device", F_STR, device), RC_FIELD("dtype", F_STR, dtype), RC_FIELD("dtype_source", F_STR, dtype_source),
    RC_FIELD("loss_scaling", F_STR, loss_scaling), RC_FIELD("recompute", F_STR, recompute),
    RC_FIELD("cuda_graphs", F_BOOL, cuda_graphs), RC_FIELD("step", F_STR, step), RC_FIELD("threads", F_INT, threads),
    RC_FIELD("batch", F_INT, batch), RC_FIELD("seq", F_INT, seq), RC_FIELD("grad_accum", F_INT, grad_accum),
    RC_FIELD("world_size", F_INT, world_size), RC_FIELD("zero", F_INT, zero), RC_FIELD("grad_dtype", F_STR, grad_dtype),
    RC_FIELD("steps", F_LL, steps), RC_FIELD("lr", F_DBL, lr), RC_FIELD("min_lr_ratio", F_DBL, min_lr_ratio),
    RC_FIELD("warmup", F_INT, warmup), RC_FIELD("weight_decay", F_DBL, weight_decay), RC_FIELD("clip", F_DBL, clip),
    RC_FIELD("beta1", F_DBL, beta1), RC_FIELD("beta2", F_DBL, beta2), RC_FIELD("seed", F_LL, seed),
    RC_FIELD("tokenizer_hash", F_HASH, tokenizer_hash), RC_FIELD("peak_flops_source", F_STR, peak_flops_source),
};
#define N_RUN_FIELDS (sizeof run_fields / sizeof run_fields[0])

void loom_run_config_defaults(loom_run_config_t *c) {
    memset(c, 0, sizeof *c);
    c->val_fraction = 0.1; /* what `loom train` held out before the key was written */
    c->world_size = 1;
    c->grad_accum = 1;
}

static void field_to_json(cJSON *j, const field_t *f, const loom_run_config_t *c) {
    const char *p = (const char *)c + f->off;
    char hash[32];
    switch (f->type) {
    case F_STR: cJSON_AddStringToObject(j, f->key, p); break;
    case F_INT: cJSON_AddNumberToObject(j, f->key, *(const int *)p); break;
    case F_LL: cJSON_AddNumberToObject(j, f->key, (double)*(const long long *)p); break;
    case F_DBL: cJSON_AddNumberToObject(j, f->key, *(const double *)p); break;
    case F_BOOL: cJSON_AddBoolToObject(j, f->key, *(const int *)p); break;
    case F_HASH:
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)*(const uint64_t *)p);
        cJSON_AddStringToObject(j, f->key, hash);
        break;
    case F_MODEL: {
        const loom_gpt_config_t *m = (const loom_gpt_config_t *)p;
        cJSON *mc = cJSON_AddObjectToObject(j, f->key);
        model_to_json(mc, m);
        cJSON_AddNumberToObject(mc, "padded_vocab_size", m->padded_vocab_size);
        cJSON_AddNumberToObject(mc, "parameters", (double)loom_gpt_num_params(m));
        break;
    }
    }
}

loom_status loom_run_config_write(const char *dir, const loom_run_config_t *c) {
    cJSON *j = cJSON_CreateObject();
    for (size_t i = 0; i < N_RUN_FIELDS; i++) field_to_json(j, &run_fields[i], c);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    loom_status s = write_json(path, j);
    cJSON_Delete(j);
    return s;
}

/* One field from JSON; a missing or mistyped key leaves the default. */
static loom_status field_from_json(const cJSON *j, const field_t *f, loom_run_config_t *c, const char *path) {
    char *p = (char *)c + f->off;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, f->key);
    if (!v) return LOOM_OK;
    switch (f->type) {
    case F_STR: if (cJSON_IsString(v)) snprintf(p, f->size, "%s", v->valuestring); break;
    case F_INT: if (cJSON_IsNumber(v)) *(int *)p = v->valueint; break;
    case F_LL: if (cJSON_IsNumber(v)) *(long long *)p = (long long)v->valuedouble; break;
    case F_DBL: if (cJSON_IsNumber(v)) *(double *)p = v->valuedouble; break;
    case F_BOOL: if (cJSON_IsBool(v)) *(int *)p = cJSON_IsTrue(v); break;
    case F_HASH: if (cJSON_IsString(v)) *(uint64_t *)p = strtoull(v->valuestring, NULL, 16); break;
    case F_MODEL: return model_from_json(v, path, (loom_gpt_config_t *)p);
    }
    return LOOM_OK;
}

loom_status loom_run_config_read(const char *dir, loom_run_config_t *c) {
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: not a loom run (no config.json); pass the --out folder of a `loom train`", dir);
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return loom_error(LOOM_EFORMAT, "%s: not valid JSON", path);
    loom_run_config_defaults(c);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    loom_status s = LOOM_OK;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, LOOM_RUN_FORMAT))
        s = loom_error(LOOM_EFORMAT, "%s: format %s, expected \"%s\"; this loom reads runs written by `loom train` of its own format",
                       path, cJSON_IsString(fmt) ? fmt->valuestring : "(none)", LOOM_RUN_FORMAT);
    for (size_t i = 0; i < N_RUN_FIELDS && s == LOOM_OK; i++) s = field_from_json(j, &run_fields[i], c, path);
    cJSON_Delete(j);
    return s;
}

static loom_status remove_old(const char *ckdir, int keep) {
    DIR *d = opendir(ckdir);
    if (!d) return LOOM_OK;
    char **names = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        names = realloc(names, (size_t)(n + 1) * sizeof *names);
        names[n++] = loom_strdup(e->d_name);
    }
    closedir(d);
    /* Names are zero-padded, so name order is step order. */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[i], names[j]) > 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    for (int i = 0; i < n; i++) {
        if (i < n - keep) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", ckdir, names[i]);
            rm_rf(p);
        }
        free(names[i]);
    }
    free(names);
    return LOOM_OK;
}

loom_status loom_run_save_checkpoint(const char *dir, const loom_gpt_t *m,
                                     const loom_ckpt_state_t *st, int keep) {
    return loom_run_save_checkpoint_with(dir, m, st, keep, NULL, NULL);
}

loom_status loom_run_save_checkpoint_with(const char *dir, const loom_gpt_t *m,
                                          const loom_ckpt_state_t *st, int keep,
                                          loom_status (*extra)(const char *tmp_dir, void *ctx), void *ctx) {
    char name[64], tmp[4096], final[4096], path[4096], ckdir[4096];
    snprintf(name, sizeof name, "step_%08lld", st->step);
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", ckdir, name);
    snprintf(final, sizeof final, "%s/%s", ckdir, name);
    rm_rf(tmp);
    LOOM_TRY(loom_mkdir_p(tmp));
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    LOOM_TRY(loom_safetensors_save_gpt(m, path));
    cJSON *hf = hf_config(&m->cfg);
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
    cJSON_AddNumberToObject(j, "padded_vocab_size", m->cfg.padded_vocab_size);
    if (st->loss_scale > 0) {
        cJSON_AddNumberToObject(j, "loss_scale", st->loss_scale);
        cJSON_AddNumberToObject(j, "loss_scale_good_steps", st->loss_scale_good);
        cJSON_AddNumberToObject(j, "loss_scale_skipped_steps", (double)st->loss_scale_skipped);
    }
    snprintf(path, sizeof path, "%s/state.json", tmp);
    s = write_json(path, j);
    cJSON_Delete(j);
    LOOM_TRY(s);
    if (extra) LOOM_TRY(extra(tmp, ctx));
    loom_fsync_dir(tmp);
    rm_rf(final);
    if (rename(tmp, final) != 0) return loom_error(LOOM_EIO, "%s: rename failed: %s", final, strerror(errno));
    loom_fsync_dir(ckdir);
    snprintf(path, sizeof path, "%s/latest", dir);
    char line[80];
    int n = snprintf(line, sizeof line, "%s\n", name);
    LOOM_TRY(loom_file_write_atomic(path, line, (size_t)n));
    return remove_old(ckdir, keep < 1 ? 1 : keep);
}

loom_status loom_run_latest(const char *dir, char *ckpt_dir, size_t cap, loom_gpt_config_t *cfg,
                            loom_ckpt_state_t *st) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "--run %s: no such folder; train one with `loom train --out %s`", dir, dir);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "--run %s: not a loom run (no config.json); pass the --out folder of a `loom train`", dir);
    snprintf(path, sizeof path, "%s/latest", dir);
    char *text;
    size_t len;
    if (loom_file_read(path, &text, &len) != LOOM_OK)
        return loom_error(LOOM_EINVAL, "--run %s: the run has no checkpoint yet (no 'latest' file); wait for the first checkpoint or train longer", dir);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
    if (strncmp(text, "step_", 5) != 0 || strchr(text, '/')) {
        loom_status s = loom_error(LOOM_EFORMAT, "%s: names '%s', not a checkpoint", path, text);
        free(text);
        return s;
    }
    snprintf(ckpt_dir, cap, "%s/checkpoints/%s", dir, text);
    free(text);
    snprintf(path, sizeof path, "%s/config.json", ckpt_dir);
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    loom_status ms = model_from_json(j, path, cfg);
    cJSON_Delete(j);
    LOOM_TRY(ms);
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    LOOM_TRY(loom_file_read(path, &text, &len));
    j = cJSON_Parse(text);
    free(text);
    memset(st, 0, sizeof *st);
    st->val_loss = -1;
    if (!j) return loom_error(LOOM_EFORMAT, "%s: not valid JSON", path);
    cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "step")) && cJSON_IsNumber(v)) st->step = (long long)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "train_loss")) && cJSON_IsNumber(v)) st->train_loss = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "val_loss")) && cJSON_IsNumber(v)) st->val_loss = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "data_position")) && cJSON_IsNumber(v)) st->data_pos = (unsigned long long)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "tokenizer_hash")) && cJSON_IsString(v)) st->tokenizer_hash = strtoull(v->valuestring, NULL, 16);
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "loss_scale")) && cJSON_IsNumber(v)) st->loss_scale = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "loss_scale_good_steps")) && cJSON_IsNumber(v)) st->loss_scale_good = (int)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "loss_scale_skipped_steps")) && cJSON_IsNumber(v)) st->loss_scale_skipped = (long long)v->valuedouble;
    cJSON_Delete(j);
    return LOOM_OK;
}
