#define _GNU_SOURCE
#include "hf.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* A number field, `dflt` when absent or null, NAN when not a number. */
static double num_field(const cJSON *j, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A bool field (false when absent). */
static int bool_field(const cJSON *j, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
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

/* GPT2Config's keys (also the model_config of run folders loom wrote
 * before the Llama family, which have no model_type). */
static loom_status parse_gpt2(const cJSON *j, const char *path, loom_gpt_config_t *cfg) {
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
    int *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->channels, &cfg->max_seq_len, &cfg->vocab_size};
    for (int i = 0; i < 5; i++) {
        *dst[i] = int_field(j, keys[i], i == 3 ? int_field(j, "n_ctx", -1) : -1);
        if (*dst[i] < 0) return loom_error(LOOM_EFORMAT, "%s: %s is missing or not a positive integer", path, keys[i]);
    }
    LOOM_TRY(check_variant(path, j, cfg->channels));
    if (cfg->channels % cfg->n_head)
        return loom_error(LOOM_EFORMAT, "%s: n_embd %d is not a multiple of n_head %d", path, cfg->channels, cfg->n_head);
    return LOOM_OK;
}

/* The Llama family's architectures, their model_type, and the bias each implies. */
static const struct {
    const char *arch, *type;
} llama_archs[] = {{"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"}};
enum { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_GPT2, ARCH_NONE };

/* Which architecture a config names: architectures[0], else model_type;
 * a config with n_embd and neither is GPT-2 (loom's older run folders). */
static int config_arch(const cJSON *j, const char **name) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *an = cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0)) ? cJSON_GetArrayItem(a, 0)->valuestring : NULL;
    const char *tn = cJSON_IsString(t) ? t->valuestring : NULL;
    *name = an ? an : tn;
    for (int i = 0; i < 3; i++)
        if ((an && !strcmp(an, llama_archs[i].arch)) || (!an && tn && !strcmp(tn, llama_archs[i].type))) return i;
    if ((an && !strcmp(an, "GPT2LMHeadModel")) || (!an && tn && !strcmp(tn, "gpt2"))) return ARCH_GPT2;
    if (!an && !tn && cJSON_GetObjectItemCaseSensitive(j, "n_embd")) return ARCH_GPT2;
    return ARCH_NONE;
}

/* rope_scaling: null, "default", "linear" or "llama3" (rope_type, or type in older files). */
static loom_status parse_rope_scaling(const cJSON *j, const char *path, loom_gpt_config_t *cfg) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return LOOM_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "(missing)";
    if (!strcmp(t, "default")) return LOOM_OK;
    cfg->rope_scaling.factor = (float)num_field(rs, "factor", NAN);
    if (!strcmp(t, "linear")) {
        cfg->rope_scaling.kind = LOOM_ROPE_SCALING_LINEAR;
    } else if (!strcmp(t, "llama3")) {
        cfg->rope_scaling.kind = LOOM_ROPE_SCALING_LLAMA3;
        cfg->rope_scaling.low_freq_factor = (float)num_field(rs, "low_freq_factor", NAN);
        cfg->rope_scaling.high_freq_factor = (float)num_field(rs, "high_freq_factor", NAN);
        cfg->rope_scaling.original_max_pos = int_field(rs, "original_max_position_embeddings", -1);
    } else {
        return loom_error(LOOM_EUNAVAIL, "%s: rope_scaling.rope_type \"%s\" is not supported; loom computes linear and llama3 (docs/llama.md)", path, t);
    }
    if (!(cfg->rope_scaling.factor >= 1))
        return loom_error(LOOM_EFORMAT, "%s: rope_scaling.factor is missing or below 1", path);
    return LOOM_OK;
}

/* What the Llama family's configs may hold that loom does not compute. */
static loom_status llama_refusals(const cJSON *j, const char *path, int arch, loom_gpt_config_t *cfg) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return loom_error(LOOM_EUNAVAIL, "%s: hidden_act %s is not supported; loom's SwiGLU uses silu", path, cJSON_IsString(act) ? act->valuestring : "?");
    int hd = int_field(j, "head_dim", cfg->channels / cfg->n_head);
    if (hd != cfg->channels / cfg->n_head)
        return loom_error(LOOM_EUNAVAIL, "%s: head_dim %d is not hidden_size / num_attention_heads = %d; loom needs them equal", path, hd,
                          cfg->channels / cfg->n_head);
    int ab = bool_field(j, "attention_bias", 0), mb = bool_field(j, "mlp_bias", 0);
    if (arch == ARCH_QWEN2 ? mb : ab != mb)
        return loom_error(LOOM_EUNAVAIL, "%s: attention_bias %s with mlp_bias %s is not supported; loom has biases on every linear, on q/k/v only (Qwen2) or none",
                          path, ab ? "true" : "false", mb ? "true" : "false");
    cfg->bias = arch == ARCH_QWEN2 ? LOOM_BIAS_QKV : ab ? LOOM_BIAS_ALL : LOOM_BIAS_NONE;
    if (bool_field(j, "use_sliding_window", 0))
        return loom_error(LOOM_EUNAVAIL, "%s: use_sliding_window is true; loom attends over the whole context (docs/llama.md)", path);
    int sw = arch == ARCH_MISTRAL ? int_field(j, "sliding_window", 0) : 0;
    if (sw > 0 && sw < cfg->max_seq_len) { /* a window as long as the context changes nothing */
        loom_warn("%s: sliding_window %d: loom attends over the whole context, so the context is capped at %d tokens", path, sw, sw);
        cfg->max_seq_len = sw;
    }
    return LOOM_OK;
}

/* LlamaConfig / MistralConfig / Qwen2Config keys. */
static loom_status parse_llama(const cJSON *j, const char *path, int arch, loom_gpt_config_t *cfg) {
    static const char *const keys[] = {"num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings",
                                       "vocab_size", "intermediate_size"};
    int *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->channels, &cfg->max_seq_len, &cfg->vocab_size, &cfg->ffn_hidden};
    for (int i = 0; i < 6; i++)
        if ((*dst[i] = int_field(j, keys[i], -1)) < 0) return loom_error(LOOM_EFORMAT, "%s: %s is missing or not a positive integer", path, keys[i]);
    cfg->n_kv_heads = int_field(j, "num_key_value_heads", cfg->n_head);
    if (cfg->n_kv_heads < 0 || cfg->n_head % cfg->n_kv_heads)
        return loom_error(LOOM_EFORMAT, "%s: num_key_value_heads %d does not divide num_attention_heads %d", path, cfg->n_kv_heads, cfg->n_head);
    if (cfg->channels % cfg->n_head)
        return loom_error(LOOM_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", path, cfg->channels, cfg->n_head);
    cfg->norm = LOOM_NORM_RMSNORM;
    cfg->pos = LOOM_POS_ROPE;
    cfg->mlp = LOOM_MLP_SWIGLU;
    double eps = num_field(j, "rms_norm_eps", 1e-6), theta = num_field(j, "rope_theta", 10000.0);
    if (!(eps > 0 && eps < 1)) return loom_error(LOOM_EFORMAT, "%s: rms_norm_eps is not a number between 0 and 1", path);
    if (!(theta > 1)) return loom_error(LOOM_EFORMAT, "%s: rope_theta is not a number above 1", path);
    cfg->norm_eps = (float)eps;
    cfg->rope_theta = (float)theta;
    cfg->untied_head = !bool_field(j, "tie_word_embeddings", 0);
    LOOM_TRY(parse_rope_scaling(j, path, cfg));
    return llama_refusals(j, path, arch, cfg);
}

/* architectures and model_type, when both are there, must name the same model. */
static loom_status check_model_type(const cJSON *j, const char *path, int arch) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *want = arch == ARCH_GPT2 ? "gpt2" : llama_archs[arch].type;
    if (!cJSON_IsString(t) || !strcmp(t->valuestring, want)) return LOOM_OK;
    return loom_error(LOOM_EFORMAT, "%s: model_type %s does not match architectures %s (model_type \"%s\"); fix config.json", path,
                      t->valuestring, arch == ARCH_GPT2 ? "GPT2LMHeadModel" : llama_archs[arch].arch, want);
}

loom_status loom_hf_config_parse(const cJSON *j, const char *path, loom_gpt_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    const char *name;
    int arch = config_arch(j, &name);
    if (arch != ARCH_NONE) LOOM_TRY(check_model_type(j, path, arch));
    if (arch == ARCH_NONE)
        return loom_error(LOOM_EUNAVAIL, "%s: architectures %s is not supported; loom reads GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM and "
                          "Qwen2ForCausalLM (docs/llama.md)", path, name ? name : "(missing)");
    LOOM_TRY(arch == ARCH_GPT2 ? parse_gpt2(j, path, cfg) : parse_llama(j, path, arch, cfg));
    loom_status s = loom_gpt_config_finish(cfg);
    if (s != LOOM_OK) return loom_error(s, "%s: %s", path, loom_errmsg());
    return LOOM_OK;
}

/* j[key] = f as a JSON float: the shortest decimal that reads back as it
 * (1e-05, not 9.99999974737875e-06), with a point (4.0, not 4: transformers
 * checks rope_scaling's factors are floats). */
static void add_float(cJSON *j, const char *key, float f) {
    char b[40];
    snprintf(b, sizeof b, "%.7g", (double)f);
    if (!strpbrk(b, ".en")) strcat(b, ".0");
    cJSON_AddRawToObject(j, key, b);
}

/* j[keys[i]] = vals[i], integers. */
static void add_ints(cJSON *j, const char *const *keys, const int *vals, int n) {
    for (int i = 0; i < n; i++) cJSON_AddNumberToObject(j, keys[i], vals[i]);
}

static void llama_config_json(cJSON *j, const loom_gpt_config_t *c) {
    int qwen = c->bias == LOOM_BIAS_QKV;
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "architectures"), cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", qwen ? "qwen2" : "llama");
    static const char *const keys[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "num_key_value_heads", "max_position_embeddings"};
    const int vals[] = {c->vocab_size, c->channels, c->ffn_hidden, c->n_layer, c->n_head, c->n_kv_heads, c->max_seq_len};
    add_ints(j, keys, vals, 7);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    add_float(j, "rms_norm_eps", c->norm_eps);
    add_float(j, "rope_theta", c->rope_theta);
    if (c->rope_scaling.kind == LOOM_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        int l3 = c->rope_scaling.kind == LOOM_ROPE_SCALING_LLAMA3;
        cJSON_AddStringToObject(rs, "rope_type", l3 ? "llama3" : "linear");
        add_float(rs, "factor", c->rope_scaling.factor);
        if (l3) {
            add_float(rs, "low_freq_factor", c->rope_scaling.low_freq_factor);
            add_float(rs, "high_freq_factor", c->rope_scaling.high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_scaling.original_max_pos);
        }
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", !c->untied_head);
    if (qwen) {
        cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    } else {
        cJSON_AddBoolToObject(j, "attention_bias", c->bias == LOOM_BIAS_ALL);
        cJSON_AddBoolToObject(j, "mlp_bias", c->bias == LOOM_BIAS_ALL);
    }
}

cJSON *loom_hf_config_json(const loom_gpt_config_t *c) {
    cJSON *j = cJSON_CreateObject();
    if (strcmp(loom_gpt_family(c), "gpt2")) {
        llama_config_json(j, c);
        return j;
    }
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "architectures"), cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_ctx"};
    const int vals[] = {c->n_layer, c->n_head, c->channels, c->max_seq_len, c->vocab_size, c->max_seq_len};
    add_ints(j, keys, vals, 6);
    cJSON_AddNullToObject(j, "n_inner");
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    static const char *const drop[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    for (int i = 0; i < 3; i++) cJSON_AddNumberToObject(j, drop[i], 0.0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    return j;
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
    loom_status s = loom_hf_config_parse(j, path, cfg);
    cJSON_Delete(j);
    return s;
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

/* A folder's weights: model.safetensors, or the shards an index names
 * (model.safetensors.index.json's weight_map: tensor name -> file), each
 * mapped when a tensor first needs it. */
typedef struct {
    const char *dir;
    char index[4200];       /* the index's path, "" for one file */
    cJSON *map;             /* weight_map, or NULL */
    int n;                  /* files opened */
    char *names[256];
    loom_stview_t *views[256];
} hf_weights_t;

static void weights_close(hf_weights_t *w) {
    for (int i = 0; i < w->n; i++) {
        loom_stview_close(w->views[i]);
        free(w->names[i]);
    }
    cJSON_Delete(w->map);
}

/* The view of file `name` in the folder, opened once. */
static loom_status weights_file(hf_weights_t *w, const char *name, const char *tensor, loom_stview_t **out) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->names[i], name)) return *out = w->views[i], LOOM_OK;
    if (w->n == 256) return loom_error(LOOM_EUNAVAIL, "%s: more than 256 shard files", w->index);
    if (strchr(name, '/') || !strcmp(name, ".."))
        return loom_error(LOOM_EFORMAT, "%s: weight_map names file \"%s\" for %s; shards must be files in the folder", w->index, name, tensor);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    if (w->map && !loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: shard %s, named by the index for %s, is missing from the folder", w->index, name, tensor);
    LOOM_TRY(loom_stview_open(&w->views[w->n], path));
    w->names[w->n] = loom_strdup(name);
    *out = w->views[w->n++];
    return LOOM_OK;
}

/* loom_xsource_fn over the folder: the file holding x (by the index), then
 * tensormap's reader. */
static loom_status weights_source(void *ctx, const loom_xtensor_t *x, float *out) {
    hf_weights_t *w = ctx;
    const char *file = "model.safetensors";
    if (w->map) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(w->map, x->hf);
        if (!f) {
            char alt[96];
            snprintf(alt, sizeof alt, "transformer.%s", x->hf);
            f = cJSON_GetObjectItemCaseSensitive(w->map, alt);
        }
        if (!cJSON_IsString(f))
            return loom_error(LOOM_EFORMAT, "%s: weight_map has no %s; config.json's model has it", w->index, x->hf);
        file = f->valuestring;
    }
    loom_stview_t *v;
    LOOM_TRY(weights_file(w, file, x->hf, &v));
    return loom_xsource_safetensors(v, x, out);
}

/* Open a folder's weights, or say what to do. */
static loom_status weights_open(const char *dir, hf_weights_t *w) {
    memset(w, 0, sizeof *w);
    w->dir = dir;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (loom_path_exists(path)) return LOOM_OK;
    snprintf(w->index, sizeof w->index, "%s/model.safetensors.index.json", dir);
    if (loom_path_exists(w->index)) {
        cJSON *j;
        LOOM_TRY(read_json(w->index, &j));
        w->map = cJSON_DetachItemFromObjectCaseSensitive(j, "weight_map");
        cJSON_Delete(j);
        if (!cJSON_IsObject(w->map)) {
            cJSON_Delete(w->map);
            return loom_error(LOOM_EFORMAT, "%s: no weight_map object; not a safetensors index", w->index);
        }
        return LOOM_OK;
    }
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    if (loom_path_exists(path))
        return loom_error(LOOM_EUNAVAIL, "%s: PyTorch pickle weights are out of scope; convert them to model.safetensors with "
                          "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)", path);
    return loom_error(LOOM_EINVAL, "%s: no model.safetensors (or model.safetensors.index.json) in this folder", dir);
}

loom_status loom_hf_load_weights(loom_gpt_t *m, const char *dir) {
    hf_weights_t w;
    LOOM_TRY(weights_open(dir, &w));
    loom_status s = loom_xload(m, weights_source, &w);
    weights_close(&w);
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
    cJSON *j = loom_hf_config_json(c);
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
    loom_status s = f ? LOOM_OK : loom_error(LOOM_EWRITE, "%s: cannot create: %s", path, strerror(errno));
    if (s == LOOM_OK && (fwrite(&padded, 8, 1, f) != 1 || fwrite(json, 1, padded, f) != padded))
        s = loom_error(LOOM_EWRITE, "%s: write failed: %s", path, strerror(errno));
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
        if (fwrite(enc, 1, bytes, f) != bytes) s = loom_error(LOOM_EWRITE, "%s: write failed at %s: %s (disk full?)", path, x[i].hf, strerror(errno));
    }
    if (f && s == LOOM_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) s = loom_error(LOOM_EWRITE, "%s: write failed: %s", path, strerror(errno));
    if (f) fclose(f);
    free(vals);
    free(hf);
    free(enc);
    free(json);
    free(x);
    return s;
}

int loom_hf_model_or_empty_folder(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (loom_path_exists(path)) return 1;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n == 0;
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
    /* --force replaces a model folder, never whatever else the path names */
    if (loom_path_exists(dir) && !loom_hf_model_or_empty_folder(dir))
        return loom_error(LOOM_EINVAL, "--out %s exists and is not a model folder (no config.json) nor an empty folder; choose another --out", dir);
    /* the staging folder has a fresh name, so no folder of the user's is ever removed */
    snprintf(tmp, sizeof tmp, "%s", dir);
    LOOM_TRY(loom_mkdir_p(dirname(tmp)));
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", dir);
    if (!mkdtemp(tmp)) return loom_error(LOOM_EWRITE, "%s: cannot create a staging folder beside it: %s", dir, strerror(errno));
    chmod(tmp, 0755); /* mkdtemp's 0700 would make the model folder private */
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    loom_status s = write_weights(path, cfg, dtype, src, src_ctx);
    if (s == LOOM_OK) s = write_config(tmp, cfg, tok, dtype);
    if (s == LOOM_OK) s = write_tokenizer(tmp, tok, cfg->max_seq_len);
    if (s == LOOM_OK) {
        loom_fsync_dir(tmp);
        if (loom_path_exists(dir)) nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        if (rename(tmp, dir) != 0) s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", dir, strerror(errno));
    }
    if (s != LOOM_OK) nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return s;
}
