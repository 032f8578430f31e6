#define _GNU_SOURCE
#include "hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- reading ------------------------------------------------------------- */

static loom_status read_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    LOOM_TRY(loom_file_read(path, &text, &len));
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out) return loom_error(LOOM_EFORMAT, "%s: not valid JSON", path);
    return LOOM_OK;
}

/* An integer field, or `dflt` when absent and dflt >= 0; -1 otherwise. */
static int int_field(const cJSON *j, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    return cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= (1 << 24) ? v->valueint : -1;
}

/* Refuse settings loom does not compute. */
static loom_status check_variant(const char *path, const cJSON *j, int C) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        return loom_error(LOOM_EUNAVAIL, "%s: activation_function %s is not supported; loom's GPT-2 uses the tanh GELU (gelu_new)", path,
                          cJSON_IsString(act) ? act->valuestring : "?");
    int inner = int_field(j, "n_inner", 4 * C);
    if (inner != 4 * C)
        return loom_error(LOOM_EUNAVAIL, "%s: n_inner %d is not supported; loom's GPT-2 MLP is 4 x n_embd = %d", path, inner, 4 * C);
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(j, "layer_norm_epsilon");
    if (eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - 1e-5) > 1e-9))
        return loom_error(LOOM_EUNAVAIL, "%s: layer_norm_epsilon %g is not supported; loom uses 1e-5", path, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    static const char *const must_be_false[] = {"scale_attn_by_inverse_layer_idx", "add_cross_attention", "reorder_and_upcast_attn"};
    for (int i = 0; i < 3; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, must_be_false[i])))
            return loom_error(LOOM_EUNAVAIL, "%s: %s is true; loom's GPT-2 does not support it", path, must_be_false[i]);
    static const char *const must_be_true[] = {"scale_attn_weights", "tie_word_embeddings"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, must_be_true[i]);
        if (v && cJSON_IsFalse(v)) return loom_error(LOOM_EUNAVAIL, "%s: %s is false; loom's GPT-2 needs it true", path, must_be_true[i]);
    }
    return LOOM_OK;
}

loom_status loom_hf_read_config(const char *dir, loom_gpt_config_t *cfg) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!loom_path_is_dir(dir))
        return loom_error(LOOM_EINVAL, "%s: not a folder; pass a Hugging Face model folder (config.json, model.safetensors, tokenizer)", dir);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: no config.json; pass a Hugging Face model folder (save_pretrained writes one)", dir);
    cJSON *j;
    LOOM_TRY(read_json(path, &j));
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2")) {
        loom_status s = loom_error(LOOM_EUNAVAIL, "%s: model_type %s is not supported; loom fine-tunes GPT-2 models (model_type \"gpt2\") only", path,
                                   cJSON_IsString(mt) ? mt->valuestring : "(missing)");
        cJSON_Delete(j);
        return s;
    }
    memset(cfg, 0, sizeof *cfg);
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
    int *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->channels, &cfg->max_seq_len, &cfg->vocab_size};
    loom_status s = LOOM_OK;
    for (int i = 0; i < 5 && s == LOOM_OK; i++) {
        *dst[i] = int_field(j, keys[i], i == 3 ? int_field(j, "n_ctx", -1) : -1);
        if (*dst[i] < 0) s = loom_error(LOOM_EFORMAT, "%s: %s is missing or not a positive integer", path, keys[i]);
    }
    if (s == LOOM_OK) s = check_variant(path, j, cfg->channels);
    cJSON_Delete(j);
    LOOM_TRY(s);
    if (cfg->channels % cfg->n_head)
        return loom_error(LOOM_EFORMAT, "%s: n_embd %d is not a multiple of n_head %d", path, cfg->channels, cfg->n_head);
    return loom_gpt_config_finish(cfg);
}

loom_status loom_hf_tokenizer(const char *dir, loom_tokenizer_t **tok) {
    char tj[4200], vj[4200], mt[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(vj, sizeof vj, "%s/vocab.json", dir);
    snprintf(mt, sizeof mt, "%s/merges.txt", dir);
    if (loom_path_exists(tj)) return loom_tokenizer_load(tok, tj);
    if (loom_path_exists(vj) && loom_path_exists(mt)) return loom_tokenizer_load_gpt2(tok, vj, mt);
    *tok = NULL;
    return loom_error(LOOM_EINVAL, "%s: no tokenizer (tokenizer.json, or vocab.json and merges.txt); save the tokenizer into the folder too", dir);
}

loom_status loom_hf_check_data(const char *dir, const char *data, const loom_tokenizer_t *data_tok, int data_vocab,
                               loom_gpt_config_t *cfg) {
    loom_gpt_config_t hc;
    LOOM_TRY(loom_hf_read_config(dir, &hc));
    loom_tokenizer_t *tok;
    LOOM_TRY(loom_hf_tokenizer(dir, &tok));
    int tv = loom_tokenizer_vocab_size(tok);
    int same = data_tok && loom_tokenizer_hash(data_tok) == loom_tokenizer_hash(tok);
    loom_tokenizer_free(tok);
    if (tv > hc.vocab_size)
        return loom_error(LOOM_EFORMAT, "%s: the tokenizer has %d tokens but config.json's vocab_size is %d", dir, tv, hc.vocab_size);
    if (data_tok && !same)
        return loom_error(LOOM_EINVAL, "--data %s was made with another tokenizer than %s's; tokenize with the model's: "
                          "loom tokenize --input TEXT --tokenizer %s/tokenizer.json --out data/NAME", data, dir, dir);
    if (!data_tok) {
        if (data_vocab > hc.vocab_size)
            return loom_error(LOOM_EINVAL, "--data %s: ids up to %d, beyond the model's vocabulary of %d", data, data_vocab, hc.vocab_size);
        loom_warn("--data %s has no tokenizer.json; assuming its ids are %s's tokenizer's", data, dir);
    }
    cfg->vocab_size = hc.vocab_size;
    return loom_gpt_config_finish(cfg);
}

/* The weights file of a folder, or an error saying what to do. */
static loom_status weights_path(const char *dir, char *path, size_t cap) {
    snprintf(path, cap, "%s/model.safetensors", dir);
    if (loom_path_exists(path)) return LOOM_OK;
    char alt[4200];
    snprintf(alt, sizeof alt, "%s/model.safetensors.index.json", dir);
    if (loom_path_exists(alt))
        return loom_error(LOOM_EUNAVAIL, "%s: sharded weights are not supported; save one file with save_pretrained(..., max_shard_size=\"100GB\")", alt);
    snprintf(alt, sizeof alt, "%s/pytorch_model.bin", dir);
    if (loom_path_exists(alt))
        return loom_error(LOOM_EUNAVAIL, "%s: PyTorch pickle weights are out of scope; convert them to model.safetensors with "
                          "GPT2LMHeadModel.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)", alt);
    return loom_error(LOOM_EINVAL, "%s: no model.safetensors in this folder", dir);
}

loom_status loom_hf_load_weights(loom_gpt_t *m, const char *dir) {
    char path[4200];
    LOOM_TRY(weights_path(dir, path, sizeof path));
    loom_stview_t *v;
    LOOM_TRY(loom_stview_open(&v, path));
    loom_status s = loom_xload(m, loom_xsource_safetensors, v);
    loom_stview_close(v);
    return s;
}

/* ---- writing ------------------------------------------------------------- */

static loom_status write_json(const char *path, cJSON *j) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

static loom_status write_config(const char *dir, const loom_gpt_config_t *c, const loom_tokenizer_t *tok, loom_xdtype dt) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "architectures"), cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_embd", c->channels);
    cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(j, "n_head", c->n_head);
    cJSON_AddNullToObject(j, "n_inner");
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    if (loom_tokenizer_eot(tok) >= 0) {
        cJSON_AddNumberToObject(j, "bos_token_id", loom_tokenizer_eot(tok));
        cJSON_AddNumberToObject(j, "eos_token_id", loom_tokenizer_eot(tok));
    }
    cJSON_AddStringToObject(j, "torch_dtype", dt == LOOM_XDT_F16 ? "float16" : dt == LOOM_XDT_BF16 ? "bfloat16" : "float32");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_json(path, j);
}

/* tokenizer.json, vocab.json + merges.txt, and the two small files that
 * tell AutoTokenizer which class and special tokens to use. */
static loom_status write_tokenizer(const char *dir, const loom_tokenizer_t *t, int n_ctx) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    LOOM_TRY(loom_tokenizer_save(t, path));
    cJSON *vocab = cJSON_CreateObject();
    for (int i = 0; i < loom_tokenizer_vocab_size(t); i++) {
        char *name = loom_tokenizer_token_name(t, (uint32_t)i);
        cJSON_AddNumberToObject(vocab, name, i);
        free(name);
    }
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    LOOM_TRY(write_json(path, vocab));
    size_t cap = 64, len = 0;
    char *m = loom_malloc(cap);
    len += (size_t)snprintf(m, cap, "#version: 0.2\n");
    for (int i = 0; i < loom_tokenizer_merges(t); i++) {
        uint32_t a, b;
        loom_tokenizer_merge(t, (size_t)i, &a, &b);
        char *na = loom_tokenizer_token_name(t, a), *nb = loom_tokenizer_token_name(t, b);
        size_t need = strlen(na) + strlen(nb) + 3;
        if (len + need >= cap) m = realloc(m, cap = (len + need) * 2);
        len += (size_t)snprintf(m + len, cap - len, "%s %s\n", na, nb);
        free(na);
        free(nb);
    }
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    loom_status s = loom_file_write_atomic(path, m, len);
    free(m);
    LOOM_TRY(s);
    const char *eot = loom_tokenizer_eot(t) >= 0 ? "<|endoftext|>" : NULL;
    cJSON *tc = cJSON_CreateObject(), *sp = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "tokenizer_class", "GPT2Tokenizer");
    cJSON_AddNumberToObject(tc, "model_max_length", n_ctx);
    cJSON_AddBoolToObject(tc, "add_prefix_space", 0);
    if (eot) {
        static const char *const roles[] = {"bos_token", "eos_token", "unk_token"};
        for (int i = 0; i < 3; i++) {
            cJSON_AddStringToObject(tc, roles[i], eot);
            cJSON_AddStringToObject(sp, roles[i], eot);
        }
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    LOOM_TRY(write_json(path, tc));
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    return write_json(path, sp);
}

/* model.safetensors in `dt`, one tensor in memory at a time. */
static loom_status write_weights(const char *path, const loom_gpt_config_t *c, loom_xdtype dt, loom_xsource_fn src, void *ctx) {
    static const char *const st_name[] = {"F32", "F16", "BF16"};
    loom_xtensor_t *x;
    int n = loom_xtensors(c, &x);
    cJSON *hdr = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(hdr, "__metadata__"), "format", "pt");
    size_t off = 0, most = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(hdr, x[i].hf), *sh = cJSON_AddArrayToObject(t, "shape"), *of;
        cJSON_AddStringToObject(t, "dtype", st_name[dt]);
        size_t d0 = x[i].conv1d ? x[i].cols : x[i].rows, d1 = x[i].conv1d ? x[i].rows : x[i].cols;
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)d0));
        if (d1) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)d1));
        of = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += loom_xdtype_bytes(dt, x[i].numel);
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        most = x[i].numel > most ? x[i].numel : most;
    }
    char *json = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    size_t jlen = strlen(json);
    uint64_t padded = (jlen + 7) / 8 * 8;
    json = realloc(json, padded);
    memset(json + jlen, ' ', padded - jlen);
    FILE *f = fopen(path, "wb");
    loom_status s = f ? LOOM_OK : loom_error(LOOM_EIO, "%s: cannot create: %s", path, strerror(errno));
    if (s == LOOM_OK && (fwrite(&padded, 8, 1, f) != 1 || fwrite(json, 1, padded, f) != padded))
        s = loom_error(LOOM_EIO, "%s: write failed: %s", path, strerror(errno));
    float *vals = loom_malloc(most * sizeof(float)), *hf = loom_malloc(most * sizeof(float));
    void *enc = loom_malloc(most * sizeof(float));
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if ((s = src(ctx, &x[i], vals)) != LOOM_OK) break;
        const float *out = vals;
        if (x[i].conv1d) { /* loom (out, in) -> Conv1D (in, out) */
            for (size_t o = 0; o < x[i].rows; o++)
                for (size_t k = 0; k < x[i].cols; k++) hf[k * x[i].rows + o] = vals[o * x[i].cols + k];
            out = hf;
        }
        loom_xencode(dt, out, x[i].numel, enc);
        size_t bytes = loom_xdtype_bytes(dt, x[i].numel);
        if (fwrite(enc, 1, bytes, f) != bytes) s = loom_error(LOOM_EIO, "%s: write failed at %s: %s (disk full?)", path, x[i].hf, strerror(errno));
    }
    if (f && s == LOOM_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) s = loom_error(LOOM_EIO, "%s: write failed: %s", path, strerror(errno));
    if (f) fclose(f);
    free(vals);
    free(hf);
    free(enc);
    free(json);
    free(x);
    return s;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

loom_status loom_hf_write(const char *dir, int force, const loom_gpt_config_t *cfg, const loom_tokenizer_t *tok,
                          loom_xdtype dtype, loom_xsource_fn src, void *src_ctx) {
    if (dtype == LOOM_XDT_Q8_0)
        return loom_error(LOOM_EINVAL, "--dtype q8_0 is a GGUF type; a Hugging Face folder takes f32, f16 or bf16");
    if (loom_path_exists(dir) && !force)
        return loom_error(LOOM_EINVAL, "--out %s already exists; pass --force to replace it, or choose another --out", dir);
    char tmp[4200], path[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    LOOM_TRY(loom_mkdir_p(tmp));
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    loom_status s = write_weights(path, cfg, dtype, src, src_ctx);
    if (s == LOOM_OK) s = write_config(tmp, cfg, tok, dtype);
    if (s == LOOM_OK) s = write_tokenizer(tmp, tok, cfg->max_seq_len);
    if (s == LOOM_OK) {
        loom_fsync_dir(tmp);
        if (loom_path_exists(dir)) nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        if (rename(tmp, dir) != 0) s = loom_error(LOOM_EIO, "%s: rename failed: %s", dir, strerror(errno));
    }
    if (s != LOOM_OK) nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return s;
}
