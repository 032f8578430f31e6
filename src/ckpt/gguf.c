#include "gguf.h"

#include "backend/qblock.h"
#include "ckpt/gguf_file.h"
#include "ckpt/gguf_map.h"
#include "model/quant.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { GV_U32 = LOOM_GV_U32, GV_I32 = LOOM_GV_I32, GV_F32 = LOOM_GV_F32, GV_STR = LOOM_GV_STR, GV_ARR = LOOM_GV_ARR };
enum { GT_F32 = LOOM_GT_F32, GT_F16 = LOOM_GT_F16, GT_Q8_0 = LOOM_GT_Q8_0, GT_BF16 = LOOM_GT_BF16 };
enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_UNUSED = 5 };

static int ggml_type_of(loom_xdtype t) {
    static const int map[] = {GT_F32, GT_F16, GT_BF16, GT_Q8_0};
    return map[t];
}

/* ---- writing ------------------------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 4096;
        b->p = realloc(b->p, b->cap);
        LOOM_ASSERT(b->p);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_key(buf_t *b, const char *key, uint32_t type) {
    put_str(b, key);
    put_u32(b, type);
}
static void kv_str(buf_t *b, const char *key, const char *v) {
    kv_key(b, key, GV_STR);
    put_str(b, v);
}
static void kv_u32(buf_t *b, const char *key, uint32_t v) {
    kv_key(b, key, GV_U32);
    put_u32(b, v);
}
static void kv_f32(buf_t *b, const char *key, float v) {
    kv_key(b, key, GV_F32);
    put(b, &v, 4);
}
static void kv_array(buf_t *b, const char *key, uint32_t elem, uint64_t n) {
    kv_key(b, key, GV_ARR);
    put_u32(b, elem);
    put_u64(b, n);
}

/* The tokenizer as llama.cpp's converter embeds a GPT-2 BPE: ids past the
 * tokenizer's vocabulary (the model's larger vocab_size) are "[PADi]". */
static int put_tokenizer(buf_t *b, const loom_tokenizer_t *t, int V) {
    int tv = loom_tokenizer_vocab_size(t), nm = loom_tokenizer_merges(t);
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    kv_str(b, "tokenizer.ggml.pre", "gpt-2");
    kv_array(b, "tokenizer.ggml.tokens", GV_STR, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        char pad[32], *name = NULL;
        if (i < tv) name = loom_tokenizer_token_name(t, (uint32_t)i);
        else snprintf(pad, sizeof pad, "[PAD%d]", i);
        put_str(b, name ? name : pad);
        free(name);
    }
    int nspecial = loom_tokenizer_nspecial(t);
    kv_array(b, "tokenizer.ggml.token_type", GV_I32, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        int32_t type = i < tv ? TOKEN_NORMAL : TOKEN_UNUSED;
        for (int k = 0; k < nspecial && i < tv; k++) {
            uint32_t id;
            loom_tokenizer_special(t, k, &id);
            if (id == (uint32_t)i) type = TOKEN_CONTROL;
        }
        put(b, &type, 4);
    }
    kv_array(b, "tokenizer.ggml.merges", GV_STR, (uint64_t)nm);
    for (int i = 0; i < nm; i++) {
        uint32_t x, y;
        loom_tokenizer_merge(t, (size_t)i, &x, &y);
        char *na = loom_tokenizer_token_name(t, x), *nb = loom_tokenizer_token_name(t, y);
        size_t la = strlen(na), lb = strlen(nb);
        put_u64(b, la + 1 + lb);
        put(b, na, la);
        put(b, " ", 1);
        put(b, nb, lb);
        free(na);
        free(nb);
    }
    int n = 5;
    if (loom_tokenizer_eot(t) >= 0) {
        kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)loom_tokenizer_eot(t));
        kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)loom_tokenizer_eot(t));
        kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)loom_tokenizer_eot(t)); /* as GPT-2's tokenizer_config says */
        n += 3;
    }
    return n;
}

/* The metadata section; returns the number of key-value pairs. */
static uint64_t put_metadata(buf_t *b, const loom_gguf_write_opts_t *o) {
    static const uint32_t file_type[] = {0, 1, 32, 7}; /* ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0 */
    const loom_gpt_config_t *c = o->cfg;
    kv_str(b, "general.architecture", "gpt2");
    kv_str(b, "general.type", "model");
    kv_str(b, "general.name", o->name && *o->name ? o->name : "loom");
    kv_u32(b, "gpt2.block_count", (uint32_t)c->n_layer);
    kv_u32(b, "gpt2.context_length", (uint32_t)c->max_seq_len);
    kv_u32(b, "gpt2.embedding_length", (uint32_t)c->channels);
    kv_u32(b, "gpt2.feed_forward_length", (uint32_t)(4 * c->channels));
    kv_u32(b, "gpt2.attention.head_count", (uint32_t)c->n_head);
    kv_f32(b, "gpt2.attention.layer_norm_epsilon", 1e-5f);
    kv_u32(b, "general.file_type", file_type[o->dtype]);
    kv_u32(b, "general.quantization_version", 2);
    return 11 + (uint64_t)put_tokenizer(b, o->tok, c->vocab_size);
}

static loom_xdtype tensor_dtype(const loom_xtensor_t *x, loom_xdtype want) {
    if (!x->cols) return LOOM_XDT_F32;
    if (want == LOOM_XDT_Q8_0 && x->cols % 32) return LOOM_XDT_F16;
    return want;
}

static size_t align_up(size_t n) { return (n + LOOM_GGUF_ALIGN - 1) / LOOM_GGUF_ALIGN * LOOM_GGUF_ALIGN; }

/* Header, metadata and tensor infos, padded to the data section. */
static buf_t gguf_head(const loom_gguf_write_opts_t *o, const loom_xtensor_t *x, int n) {
    buf_t kv = {0}, b = {0};
    uint64_t nkv = put_metadata(&kv, o);
    put_u32(&b, LOOM_GGUF_MAGIC);
    put_u32(&b, LOOM_GGUF_VERSION);
    put_u64(&b, (uint64_t)n);
    put_u64(&b, nkv);
    put(&b, kv.p, kv.n);
    free(kv.p);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        loom_xdtype t = tensor_dtype(&x[i], o->dtype);
        put_str(&b, x[i].gguf);
        put_u32(&b, x[i].cols ? 2 : 1);
        put_u64(&b, x[i].cols ? x[i].cols : x[i].rows);
        if (x[i].cols) put_u64(&b, x[i].rows);
        put_u32(&b, (uint32_t)ggml_type_of(t));
        put_u64(&b, off);
        off = align_up(off + loom_xdtype_bytes(t, x[i].numel));
    }
    static const unsigned char zero[LOOM_GGUF_ALIGN];
    put(&b, zero, align_up(b.n) - b.n);
    return b;
}

static loom_status write_tensors(FILE *f, const char *tmp, const loom_gguf_write_opts_t *o, const loom_xtensor_t *x, int n) {
    size_t most = 0;
    for (int i = 0; i < n; i++) most = x[i].numel > most ? x[i].numel : most;
    float *vals = loom_malloc(most * sizeof(float));
    unsigned char *enc = loom_malloc(most * 4);
    static const unsigned char zero[LOOM_GGUF_ALIGN];
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if ((s = o->src(o->src_ctx, &x[i], vals)) != LOOM_OK) break;
        loom_xdtype t = tensor_dtype(&x[i], o->dtype);
        size_t bytes = loom_xdtype_bytes(t, x[i].numel);
        loom_xencode(t, vals, x[i].numel, enc);
        if (fwrite(enc, 1, bytes, f) != bytes || fwrite(zero, 1, align_up(bytes) - bytes, f) != align_up(bytes) - bytes)
            s = loom_error(LOOM_EIO, "%s: write failed at tensor %s: %s (disk full?)", tmp, x[i].gguf, strerror(errno));
    }
    free(vals);
    free(enc);
    return s;
}

loom_status loom_gguf_write(const char *path, const loom_gguf_write_opts_t *o) {
    if (loom_tokenizer_vocab_size(o->tok) > o->cfg->vocab_size)
        return loom_error(LOOM_EINVAL, "%s: the tokenizer has %d tokens but the model only %d", path,
                          loom_tokenizer_vocab_size(o->tok), o->cfg->vocab_size);
    loom_xtensor_t *x;
    int n = loom_xtensors(o->cfg, &x);
    if (o->dtype == LOOM_XDT_Q8_0 && o->cfg->channels % 32)
        loom_warn("%s: q8_0 needs rows that are a multiple of 32 values; the width %d is not, so those matrices are written f16",
                  path, o->cfg->channels);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(x);
        return loom_error(LOOM_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    buf_t head = gguf_head(o, x, n);
    loom_status s = LOOM_OK;
    if (fwrite(head.p, 1, head.n, f) != head.n) s = loom_error(LOOM_EIO, "%s: write failed: %s", tmp, strerror(errno));
    free(head.p);
    if (s == LOOM_OK) s = write_tensors(f, tmp, o, x, n);
    if (s == LOOM_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        s = loom_error(LOOM_EIO, "%s: write failed: %s (disk full?)", tmp, strerror(errno));
    if (fclose(f) != 0 && s == LOOM_OK) s = loom_error(LOOM_EIO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == LOOM_OK && rename(tmp, path) != 0) s = loom_error(LOOM_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (s != LOOM_OK) unlink(tmp);
    free(x);
    return s;
}

/* ---- reading ------------------------------------------------------------- */

/* The embedded GPT-2 BPE tokenizer as tokenizer.json text. */
static loom_status read_tokenizer(const loom_gguf_t *g, loom_tokenizer_t **tok) {
    *tok = NULL;
    char *model = loom_gguf_str(g, "tokenizer.ggml.model");
    loom_gguf_array_t toks, types, merges;
    int has_types = loom_gguf_array(g, "tokenizer.ggml.token_type", &types);
    if (!model || !loom_gguf_array(g, "tokenizer.ggml.tokens", &toks)) {
        free(model);
        return LOOM_OK; /* no tokenizer: ids only */
    }
    int gpt2 = !strcmp(model, "gpt2");
    free(model);
    if (!gpt2 || toks.elem != GV_STR || !loom_gguf_array(g, "tokenizer.ggml.merges", &merges) || merges.elem != GV_STR)
        return loom_error(LOOM_EUNAVAIL, "%s: the embedded tokenizer is not GPT-2 BPE (tokenizer.ggml.model \"gpt2\" with merges); loom reads that one",
                          loom_gguf_path(g));
    const unsigned char *type = has_types && types.elem == GV_I32 && types.count == toks.count ? types.val : NULL;
    uint64_t n = toks.count;
    while (n > 0 && type) { /* trailing padding ids are the model's, not the tokenizer's */
        int32_t ty;
        memcpy(&ty, type + 4 * (n - 1), 4);
        if (ty != TOKEN_UNUSED) break;
        n--;
    }
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON_AddBoolToObject(pre, "use_regex", 1);
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab"), *ml = cJSON_AddArrayToObject(m, "merges");
    const unsigned char *cur = toks.val, *s;
    uint64_t len;
    char *name = NULL;
    for (uint64_t i = 0; i < n && (s = loom_gguf_next_str(g, &cur, &len)); i++) {
        name = realloc(name, len + 1);
        memcpy(name, s, len);
        name[len] = 0;
        cJSON_AddNumberToObject(vocab, name, (double)i);
        int32_t ty = TOKEN_NORMAL;
        if (type) memcpy(&ty, type + 4 * i, 4);
        if (ty == TOKEN_CONTROL || ty == TOKEN_UNUSED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", name);
            cJSON_AddBoolToObject(a, "special", 1);
            cJSON_AddItemToArray(added, a);
        }
    }
    cur = merges.val;
    for (uint64_t i = 0; i < merges.count && (s = loom_gguf_next_str(g, &cur, &len)); i++) {
        name = realloc(name, len + 1);
        memcpy(name, s, len);
        name[len] = 0;
        cJSON_AddItemToArray(ml, cJSON_CreateString(name));
    }
    free(name);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    loom_status st = loom_tokenizer_parse(tok, loom_gguf_path(g), text, strlen(text));
    free(text);
    return st;
}

/* Say which weights run as stored and which were dequantized. */
static void say_block_weights(const char *path, const loom_gpt_t *m, const loom_backend_t *be, int mixed) {
    if (!m->file_q) return;
    size_t bytes = 0;
    for (int i = 0; i < m->cfg.n_layer * LOOM_QLIN_COUNT; i++) {
        const loom_tensor_t *t = &m->file_q[i];
        if (t->data) bytes += loom_qblock_info(t->dtype) ? loom_qblock_row_bytes(t->dtype, t->cols) * (size_t)t->rows : (size_t)(t->rows * t->cols);
    }
    if (be->matmul_forward_kq)
        loom_info("%s: the linear layers run on the file's own quantized blocks (%.1f MB); the fp32 copy of every weight "
                  "is kept too (%.1f MB) for the embedding, the logits and `loom eval`", path, bytes / 1e6,
                  m->num_params * 4.0 / 1e6);
    if (mixed)
        loom_info("%s: %d fused weights (q, k, v or gate, up) mix block types; those run on their fp32 values dequantized at load",
                  path, mixed);
}

/* Config, tokenizer and weights of an opened file into a new model. */
static loom_status load(const loom_gguf_t *g, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok) {
    const char *path = loom_gguf_path(g);
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_gguf_config(g, &cfg));
    LOOM_TRY(read_tokenizer(g, tok));
    if (*tok && loom_tokenizer_vocab_size(*tok) > cfg.vocab_size)
        return loom_error(LOOM_EFORMAT, "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                          loom_tokenizer_vocab_size(*tok), cfg.vocab_size);
    LOOM_TRY(loom_gpt_create(model, &cfg, be));
    loom_gpt_t *m = *model;
    float *host = loom_calloc(m->num_params, sizeof(float));
    loom_status s = loom_gguf_read_params(g, &m->cfg, m->ptable, host);
    if (s == LOOM_OK) be->upload(m->params, host, m->num_params * sizeof(float));
    free(host);
    if (s != LOOM_OK) return s;
    int mixed;
    m->file_int8 = loom_gguf_file_weights(g, &m->cfg, 0, &mixed);
    m->file_q = loom_gguf_file_weights(g, &m->cfg, 1, &mixed);
    say_block_weights(path, m, be, m->file_q ? mixed : 0);
    return LOOM_OK;
}

loom_status loom_gguf_load(const char *path, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok) {
    *model = NULL;
    *tok = NULL;
    loom_gguf_t *g;
    LOOM_TRY(loom_gguf_open(&g, path));
    loom_status s = load(g, be, model, tok);
    if (s != LOOM_OK) {
        if (*model) loom_gpt_free(*model);
        if (*tok) loom_tokenizer_free(*tok);
        *model = NULL;
        *tok = NULL;
    }
    loom_gguf_close(g);
    return s;
}
