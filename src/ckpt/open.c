#include "ckpt/open.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "model/quant.h"
#include "model/sparse24.h"

const char *loom_source_name(loom_source_kind k) {
    static const char *const names[] = {"run folder", "checkpoint", "Hugging Face folder", "GGUF file"};
    return k >= LOOM_SOURCE_RUN && k <= LOOM_SOURCE_GGUF ? names[k] : "?";
}

loom_open_opts_t loom_open_opts_default(void) {
    return (loom_open_opts_t){.device = "cpu", .step = -1, .weights = {.sparse = LOOM_SPARSE_AUTO}, .kv_dtype = LOOM_FP32};
}

/* 1 when `dir`/`name` exists. */
static int has(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return loom_path_exists(p);
}

static int gguf_magic(const char *path) {
    unsigned char b[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(b, 1, 4, f) : 0;
    if (f) fclose(f);
    return n == 4 && (b[0] | b[1] << 8 | b[2] << 16 | (unsigned)b[3] << 24) == LOOM_GGUF_MAGIC;
}

loom_status loom_open_detect(const char *path, loom_source_kind *kind) {
    if (!path || !*path) return loom_error(LOOM_EINVAL, "no --run; pass the folder of a `loom train --out` (or a checkpoint, a Hugging Face folder or a GGUF file)");
    size_t n = strlen(path);
    if (!loom_path_exists(path) && n > 5 && !strcasecmp(path + n - 5, ".gguf")) /* a file name: no run to train */
        return loom_error(LOOM_EINVAL, "%s: no such file; check the path, or write one with `loom export --run RUN --format gguf --out %s`", path, path);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: no such folder or file; train a run with `loom train --out %s`, or pass a checkpoint, a Hugging Face folder or a GGUF file", path, path);
    int dir = loom_path_is_dir(path);
    if (dir && has(path, "state.json")) *kind = LOOM_SOURCE_CHECKPOINT;
    else if (dir && has(path, "config.json")) *kind = has(path, "checkpoints") ? LOOM_SOURCE_RUN : LOOM_SOURCE_HF;
    else if (!dir && gguf_magic(path)) *kind = LOOM_SOURCE_GGUF;
    else
        return loom_error(LOOM_EINVAL, "%s is neither a run folder (config.json, checkpoints/), a checkpoint (state.json), a Hugging Face folder (config.json) nor a GGUF file; "
                          "pass the --out folder of a `loom train`, one of its checkpoints/step_N, a save_pretrained folder or a .gguf file", path);
    return LOOM_OK;
}

/* `dir`/tokenizer.json when it exists (*tok NULL otherwise), checked
 * against the hash the checkpoint recorded (0: not recorded). */
static loom_status run_tokenizer(const char *dir, uint64_t want, loom_tokenizer_t **tok) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    *tok = NULL;
    if (!loom_path_exists(path)) return LOOM_OK;
    LOOM_TRY(loom_tokenizer_load(tok, path));
    uint64_t have = loom_tokenizer_hash(*tok);
    if (!want || have == want) return LOOM_OK;
    loom_tokenizer_free(*tok);
    *tok = NULL;
    return loom_error(LOOM_EFORMAT, "%s: this tokenizer (hash %016llx) is not the one the run trained with (%016llx); restore the run's tokenizer.json",
                      path, (unsigned long long)have, (unsigned long long)want);
}

/* A run folder: its newest checkpoint, or o->step's. */
static loom_status describe_run(const char *run, const loom_open_opts_t *o, loom_opened_t *r) {
    char which[64] = "", ck[4200];
    if (o->step >= 0) { /* checked here: loom_ckpt_find's message speaks of --resume */
        snprintf(which, sizeof which, "step_%08lld", o->step);
        snprintf(ck, sizeof ck, "%s/checkpoints/%s", run, which);
        if (!loom_path_is_dir(ck))
            return loom_error(LOOM_EINVAL, "--step %lld: %s has no checkpoint of that step (see %s/checkpoints)", o->step, run, run);
    }
    LOOM_TRY(loom_run_find(run, which[0] ? which : NULL, r->weights_path, sizeof r->weights_path, &r->cfg, &r->state));
    return run_tokenizer(run, r->state.tokenizer_hash, &r->tok);
}

/* A checkpoint folder; the tokenizer is its run's (RUN/checkpoints/step_N),
 * else one beside it. */
static loom_status describe_checkpoint(const char *ck, loom_opened_t *r) {
    snprintf(r->weights_path, sizeof r->weights_path, "%s", ck);
    size_t n = strlen(r->weights_path);
    while (n > 1 && r->weights_path[n - 1] == '/') r->weights_path[--n] = 0;
    LOOM_TRY(loom_run_read_checkpoint(r->weights_path, &r->cfg, &r->state));
    char run[4200];
    snprintf(run, sizeof run, "%s/../..", r->weights_path);
    const char *slash = strrchr(r->weights_path, '/');
    int in_run = slash && slash - r->weights_path >= 11 && !strncmp(slash - 11, "checkpoints", 11) && has(run, "tokenizer.json");
    return run_tokenizer(in_run ? run : r->weights_path, r->state.tokenizer_hash, &r->tok);
}

/* Where the weights are, the config, the tokenizer and the state. */
static loom_status describe(const char *path, const loom_open_opts_t *o, loom_opened_t *r) {
    LOOM_TRY(loom_open_detect(path, &r->kind));
    if (o->step >= 0 && r->kind != LOOM_SOURCE_RUN)
        return loom_error(LOOM_EINVAL, "--step %lld: %s is a %s; only a run folder holds checkpoints of several steps", o->step, path,
                          loom_source_name(r->kind));
    switch (r->kind) {
    case LOOM_SOURCE_RUN: return describe_run(path, o, r);
    case LOOM_SOURCE_CHECKPOINT: return describe_checkpoint(path, r);
    case LOOM_SOURCE_HF:
        snprintf(r->weights_path, sizeof r->weights_path, "%s", path);
        LOOM_TRY(loom_hf_read_config(path, &r->cfg));
        return loom_hf_tokenizer(path, &r->tok);
    case LOOM_SOURCE_GGUF: snprintf(r->weights_path, sizeof r->weights_path, "%s", path); return LOOM_OK;
    }
    return LOOM_OK;
}

/* 1 when a GGUF's every fp32 weight is read at load, the stored ones
 * included: a device computes in fp32, and a caller may keep them. */
static int fp32_at_load(const loom_open_opts_t *o) { return (o->device && strcmp(o->device, "cpu")) || o->keep_fp32; }

/* The weights into a new model on the CPU backend. A GGUF file brings its
 * own config and tokenizer (ckpt/gguf.h). */
static loom_status load_cpu(const loom_open_opts_t *o, loom_opened_t *r) {
    const loom_backend_t *be;
    char path[4200];
    LOOM_TRY(loom_backend_cpu_init(&be, o->threads));
    if (r->kind == LOOM_SOURCE_GGUF) {
        LOOM_TRY(loom_gguf_load_opts(r->weights_path, be, fp32_at_load(o), &r->model, &r->tok)); /* else where needed: gguf_fp32 */
        r->cfg = r->model->cfg;
        return LOOM_OK;
    }
    LOOM_TRY(loom_gpt_create(&r->model, &r->cfg, be));
    if (r->kind == LOOM_SOURCE_HF) return loom_hf_load_weights(r->model, r->weights_path);
    snprintf(path, sizeof path, "%s/model.safetensors", r->weights_path);
    return loom_safetensors_load_gpt(r->model, path);
}

/* The same weights in a new model on `device` (fp32); the CPU copy is freed. */
static loom_status to_device(loom_gpt_t **m, const char *device) {
    if (!device || !strcmp(device, "cpu")) return LOOM_OK;
    const loom_backend_t *be;
    loom_gpt_t *g;
    LOOM_TRY(loom_backend_open(&be, device, 0, LOOM_FP32));
    LOOM_TRY(loom_gpt_create(&g, &(*m)->cfg, be));
    be->upload(g->params, (*m)->params, (*m)->num_params * sizeof(float));
    int q8 = loom_quant_file_int8(*m) != NULL;
    if ((*m)->file_q && !be->matmul_forward_kq) /* docs/quantization.md */
        loom_warn("the %s backend has no kernels for llama.cpp's block formats (q4_K ...): the model runs on its weights "
                  "dequantized to fp32 at load (%.1f MB of device memory), not on the file's blocks%s", be->name,
                  (*m)->num_params * 4.0 / 1e6, q8 ? "; --quant w8a8 runs a Q8_0 file's int8 blocks of 32 instead" : "");
    if (q8 || be->matmul_forward_kq) /* a Q8_0 file's int8 stays in host memory: what --quant uploads (model/quant.h) */
        g->file_q = (*m)->file_q, (*m)->file_q = NULL;
    loom_gpt_free(*m);
    *m = g;
    return LOOM_OK;
}

/* describe + load_cpu. A live run prunes old checkpoints while a reader
 * opens the newest: when the checkpoint read from vanished meanwhile (a
 * newer one replaced it), read the run's newest again. */
static loom_status describe_and_load(const char *path, const loom_open_opts_t *o, loom_opened_t *out) {
    loom_status s = LOOM_OK;
    for (int attempt = 0; attempt < 8; attempt++) {
        if (attempt) {
            loom_open_close(out);
            *out = (loom_opened_t){.kv_dtype = o->kv_dtype};
        }
        s = describe(path, o, out);
        if (s == LOOM_OK && !o->config_only) s = load_cpu(o, out);
        if (s == LOOM_OK || out->kind != LOOM_SOURCE_RUN || o->step >= 0 || !out->weights_path[0] ||
            loom_path_is_dir(out->weights_path))
            return s;
    }
    return s;
}

/* A GGUF model loaded with fp32 only where its stored blocks do not
 * serve (ckpt/gguf.h loom_gguf_load_opts): the fp32 of the rest is made
 * when something reads it: a device (it computes in fp32) and a caller
 * that keeps it (o->keep_fp32) at load already (fp32_at_load); --quant's
 * int8 copies here (made from fp32, except a Q8_0 file's own int8, whose
 * head may still be: then the embedding and the head only). Returns 2
 * when all were made, 1 the ends only, 0 none; what was made is given back
 * once the copies exist (loom_open), said when all were (the rest of the
 * block was never resident). The 2:4 check reads every fp32 linear
 * weight: it is skipped when those are not made (*sparse off), as the
 * stored blocks run instead. */
static int gguf_fp32(const loom_open_opts_t *o, loom_gpt_t *m, int *sparse) {
    if (!m->file_q) return 0;
    int quant = o->weights.quant != LOOM_QUANT_NONE, all = fp32_at_load(o) || (quant && !loom_quant_file_int8(m));
    if (!all && !quant) {
        *sparse = LOOM_SPARSE_OFF;
        return 0;
    }
    if (!fp32_at_load(o)) loom_gguf_fp32(m, !all);
    return all ? 2 : 1;
}

loom_status loom_open(const char *path, const loom_open_opts_t *o, loom_opened_t *out) {
    *out = (loom_opened_t){0};
    out->kv_dtype = o->kv_dtype;
    loom_status s = LOOM_OK;
    if (o->kv_dtype != LOOM_FP32 && o->kv_dtype != LOOM_INT8)
        s = loom_error(LOOM_EINVAL, "KV cache type %s: use fp32 or int8", loom_dtype_name(o->kv_dtype));
    if (s == LOOM_OK) s = describe_and_load(path, o, out);
    loom_infer_weights_opts_t wo = o->weights;
    int made = s == LOOM_OK && !o->config_only && out->kind == LOOM_SOURCE_GGUF ? gguf_fp32(o, out->model, &wo.sparse) : 0;
    if (s == LOOM_OK && !o->config_only) s = to_device(&out->model, o->device);
    if (s == LOOM_OK && !o->config_only) s = loom_infer_weights_create(&out->weights, out->model, &wo);
    if (s == LOOM_OK && made && !o->keep_fp32) { /* docs/quantization.md */
        size_t given = loom_infer_weights_release_fp32(out->model, NULL);
        if (given && made == 2)
            loom_info("%s: %.1f MB of fp32 weights that the file's own blocks replace given back to the system", path, given / 1e6);
    }
    if (s != LOOM_OK) loom_open_close(out);
    return s;
}

void loom_open_close(loom_opened_t *r) {
    loom_infer_weights_free(&r->weights);
    if (r->tok) loom_tokenizer_free(r->tok);
    if (r->model) loom_gpt_free(r->model);
    *r = (loom_opened_t){0};
}
