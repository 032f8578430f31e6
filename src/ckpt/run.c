#define _GNU_SOURCE
#include "run.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"


/* What loom train writes at the top of a run folder. config.json goes
 * last when a run is cleared, so a folder cleared halfway still reads as a
 * run; NAME.tmp is what an atomic write of NAME leaves when it is cut short. */
static const char *const run_files[] = {"metrics.jsonl", "loss.svg", "tokenizer.json", "latest",
                                        "checkpoints", "events.jsonl", "config.json"};
#define N_RUN_FILES (sizeof run_files / sizeof run_files[0])

/* Entries of `dir` other than . and .. (0 when it cannot be read). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* An entry that holds nothing of value: NAME.tmp of a run file, or an
 * empty checkpoints/ (made just before config.json is written). */
static int is_leftover(const char *dir, const char *name) {
    if (!strcmp(name, LOOM_RUN_LOCK)) return 1; /* the writer's lock (loom_run_lock) */
    for (size_t i = 0; i < N_RUN_FILES; i++) {
        size_t n = strlen(run_files[i]);
        if (!strncmp(name, run_files[i], n) && !strcmp(name + n, ".tmp")) return 1;
    }
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return !strcmp(name, "checkpoints") && loom_path_is_dir(p) && count_entries(p) == 0;
}

/* 1 when `dir` holds nothing, or only what a run killed while its folder
 * was being made leaves (is_leftover): a new run may take it. */
static int holds_nothing(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int nothing = 1;
    while (nothing && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !is_leftover(dir, e->d_name)) nothing = 0;
    closedir(d);
    return nothing;
}

/* Remove the run files of `dir` and their .tmp leftovers; the user's own
 * files stay. */
static loom_status remove_run_files(const char *dir) {
    for (size_t i = 0; i < N_RUN_FILES; i++) {
        for (int t = 0; t < 2; t++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s%s", dir, run_files[i], t ? "" : ".tmp");
            if (!loom_path_exists(p)) continue;
            if (loom_ckpt_remove_tree(p) != 0) return loom_error(LOOM_EIO, "%s: cannot remove: %s", p, strerror(errno));
            loom_ckpt_test_point("run_prepare");
        }
    }
    return LOOM_OK;
}

/* The holder's PID as the lock file says it, or 0. */
static long lock_holder(int fd) {
    char buf[32] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    return n > 0 ? strtol(buf, NULL, 10) : 0;
}

loom_status loom_run_lock(const char *dir, int *fd_out) {
    *fd_out = -1;
    if (loom_path_exists(dir) && !loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "--out %s: exists and is not a folder; choose another --out", dir);
    LOOM_TRY(loom_mkdir_p(dir));
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, LOOM_RUN_LOCK);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return loom_error(LOOM_EIO, "%s: cannot create the run's lock file: %s", p, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        long pid = lock_holder(fd);
        close(fd);
        if (errno != EWOULDBLOCK) return loom_error(LOOM_EIO, "%s: cannot lock: %s", p, strerror(errno));
        return loom_error(LOOM_EINVAL,
                          "--out %s: another loom train (PID %ld) is writing this run folder; wait for it to end or stop it "
                          "(kill -TERM %ld keeps its newest checkpoint), then start again", dir, pid, pid);
    }
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) loom_warn("%s: cannot record this PID in the lock file", p);
    *fd_out = fd;
    return LOOM_OK;
}

/* 1 when a new run may replace what `dir` holds without --force: a run
 * that ended before its first checkpoint has nothing to keep. */
static int replaceable(const char *dir) {
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    return loom_path_exists(cfg) && !loom_ckpt_any(dir);
}

loom_status loom_run_check_new(const char *dir, int force) {
    if (loom_path_exists(dir) && !loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "--out %s: exists and is not a folder; choose another --out", dir);
    if (loom_path_is_dir(dir) && !force && !replaceable(dir) && !holds_nothing(dir))
        return loom_error(LOOM_EINVAL, "--out %s: the folder already exists and is not empty; pass --force to replace its run, or choose another --out", dir);
    return LOOM_OK;
}

loom_status loom_run_prepare(const char *dir, int force) {
    LOOM_TRY(loom_run_check_new(dir, force));
    if (!force && replaceable(dir)) {
        loom_info("loom: %s holds a run without a checkpoint (it stopped before the first one); replacing it", dir);
        force = 1;
    }
    if (loom_path_is_dir(dir)) LOOM_TRY(remove_run_files(dir));
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    LOOM_TRY(loom_mkdir_p(ck));
    loom_ckpt_test_point("run_prepare"); /* the folder is there, its config.json not yet */
    return LOOM_OK;
}

static loom_status write_json(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* The model's description from either config file (Hugging Face keys,
 * ckpt/hf.c); `path` for the message. */
static loom_status model_from_json(const cJSON *j, const char *path, loom_gpt_config_t *cfg) {
    if (!cJSON_IsObject(j)) return loom_error(LOOM_EFORMAT, "%s: model_config is missing or not an object", path);
    return loom_hf_config_parse(j, path, cfg);
}

static cJSON *hf_config(const loom_gpt_config_t *c) {
    cJSON *j = loom_hf_config_json(c);
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
    RC_FIELD("data_resolved", F_STR, data_resolved), RC_FIELD("init_from_run", F_STR, init_from_run),
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
        cJSON *mc = loom_hf_config_json(m);
        cJSON_AddItemToObject(j, f->key, mc);
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
    if (st->loss_scale > 0) {
        cJSON_AddNumberToObject(j, "loss_scale", st->loss_scale);
        cJSON_AddNumberToObject(j, "loss_scale_good_steps", st->loss_scale_good);
        cJSON_AddNumberToObject(j, "loss_scale_skipped_steps", (double)st->loss_scale_skipped);
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
 * in the folder's name (folder_step < 0: a folder not named step_N),
 * positions and losses in range. */
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
    else if (folder_step >= 0 && (long long)step != folder_step)
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
        double x;
        cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "loss_scale");
        if (cJSON_IsNumber(ls) && isfinite(ls->valuedouble) && ls->valuedouble > 0 && ls->valuedouble < 3.4e38) st->loss_scale = (float)ls->valuedouble;
        if (json_whole(j, "loss_scale_good_steps", 0, 1 << 30, &x)) st->loss_scale_good = (int)x;
        if (json_whole(j, "loss_scale_skipped_steps", 0, 9007199254740992.0, &x)) st->loss_scale_skipped = (long long)x;
    }
    cJSON_Delete(j);
    return s;
}

/* A checkpoint folder's config.json (the model) and state.json. */
static loom_status read_ckpt_meta(const char *ckpt_dir, long long folder_step, loom_gpt_config_t *cfg, loom_ckpt_state_t *st) {
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", ckpt_dir);
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    loom_status ms = model_from_json(j, path, cfg);
    cJSON_Delete(j);
    LOOM_TRY(ms);
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    return read_state(path, folder_step, cfg->padded_vocab_size, st);
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
    return read_ckpt_meta(ckpt_dir, folder_step, cfg, st);
}

loom_status loom_run_read_checkpoint(const char *ckpt_dir, loom_gpt_config_t *cfg, loom_ckpt_state_t *st) {
    int verified;
    LOOM_TRY(loom_ckpt_verify(ckpt_dir, &verified));
    const char *base = strrchr(ckpt_dir, '/') ? strrchr(ckpt_dir, '/') + 1 : ckpt_dir;
    char *end = NULL;
    long long step = strncmp(base, "step_", 5) ? -1 : strtoll(base + 5, &end, 10);
    if (end && (*end || end == base + 5)) step = -1;
    return read_ckpt_meta(ckpt_dir, step, cfg, st);
}

loom_status loom_run_latest(const char *dir, char *ckpt_dir, size_t cap, loom_gpt_config_t *cfg,
                            loom_ckpt_state_t *st) {
    return loom_run_find(dir, NULL, ckpt_dir, cap, cfg, st);
}
