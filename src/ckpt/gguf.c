#include "gguf.h"

#include "backend/qblock.h"
#include "ckpt/gguf_file.h"
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

/* The model config from gpt2.* metadata and the embedding's shape. */
static loom_status read_config(const loom_gguf_t *g, loom_gpt_config_t *c) {
    const char *path = loom_gguf_path(g);
    char *arch = loom_gguf_str(g, "general.architecture");
    if (!arch || strcmp(arch, "gpt2")) {
        loom_status s = loom_error(LOOM_EUNAVAIL, "%s: architecture %s is not supported; loom reads gpt2 (GPT-2) models", path,
                                   arch ? arch : "(general.architecture missing)");
        free(arch);
        return s;
    }
    free(arch);
    static const char *const keys[] = {"gpt2.block_count", "gpt2.context_length", "gpt2.embedding_length", "gpt2.attention.head_count"};
    long long v[4], ff = 0;
    for (int i = 0; i < 4; i++)
        if (!loom_gguf_int(g, keys[i], &v[i]) || v[i] <= 0 || v[i] > (1 << 24))
            return loom_error(LOOM_EFORMAT, "%s: metadata %s is missing or not a positive integer", path, keys[i]);
    memset(c, 0, sizeof *c);
    c->n_layer = (int)v[0];
    c->max_seq_len = (int)v[1];
    c->channels = (int)v[2];
    c->n_head = (int)v[3];
    if (loom_gguf_int(g, "gpt2.feed_forward_length", &ff) && ff != 4LL * c->channels)
        return loom_error(LOOM_EUNAVAIL, "%s: feed_forward_length %lld is not 4 x embedding_length (%d); loom's GPT-2 has that MLP only", path,
                          ff, 4 * c->channels);
    const loom_gguf_tensor_t *e = loom_gguf_find(g, "token_embd.weight");
    if (!e || e->ndim != 2 || e->ne[1] > (1 << 24))
        return loom_error(LOOM_EFORMAT, "%s: tensor token_embd.weight is missing or not a matrix; a gpt2 GGUF has it", path);
    c->vocab_size = (int)e->ne[1];
    return loom_gpt_config_finish(c);
}

/* A loom_xsource_fn over an opened GGUF file (ctx: the loom_gguf_t). */
static loom_status read_tensor(void *ctx, const loom_xtensor_t *x, float *out) {
    const loom_gguf_t *g = ctx;
    const loom_gguf_tensor_t *t = loom_gguf_find(g, x->gguf);
    if (!t) return loom_error(LOOM_EFORMAT, "%s: tensor %s is missing; a gpt2 GGUF has it", loom_gguf_path(g), x->gguf);
    uint64_t want0 = x->cols ? x->cols : x->rows, want1 = x->cols ? x->rows : 1;
    uint64_t got1 = t->ndim >= 2 ? t->ne[1] : 1;
    if (t->ndim > 2 || t->ne[0] != want0 || got1 != want1)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s has shape [%llu, %llu], the metadata implies [%llu, %llu]", loom_gguf_path(g), x->gguf,
                          (unsigned long long)t->ne[0], (unsigned long long)got1, (unsigned long long)want0, (unsigned long long)want1);
    loom_gguf_values(t, out);
    return LOOM_OK;
}

/* Which LOOM_QLIN_* a parameter is, -1 for the others. */
static int qlin_of(int param) {
    return param == LOOM_QKVW ? LOOM_QLIN_QKV : param == LOOM_ATTPROJW ? LOOM_QLIN_ATTPROJ
         : param == LOOM_FCW ? LOOM_QLIN_FC : param == LOOM_FCPROJW ? LOOM_QLIN_FCPROJ : -1;
}

/* A q8_0 tensor's blocks as int8 values q (numel) and fp32 scales sc
 * (numel / 32): the int8 copied, each fp16 scale widened (exact). */
static void q8_0_split(const loom_gguf_tensor_t *t, signed char *q, float *sc) {
    const unsigned char *src = t->data;
    for (size_t b = 0; b < t->numel / 32; b++) {
        uint16_t h;
        memcpy(&h, src + 34 * b, 2);
        sc[b] = loom_f16_to_f32(h);
        memcpy(q + 32 * b, src + 34 * b + 2, 32);
    }
}

/* Bytes a linear weight takes as m->file_int8 / m->file_q hold it. */
static size_t held_bytes(const loom_gguf_tensor_t *t) {
    return t->type == GT_Q8_0 ? t->numel + t->numel / 8 : t->bytes;
}

/* The file's own linear weights (model/gpt.h), host memory, one malloc:
 * the (L, 4) tensors, then their bytes. `block` 0: every linear matrix
 * is q8_0, held as m->file_int8 (int8, block-32 fp32 scales); 1: the
 * matrices in llama.cpp's block formats as stored, as m->file_q (q8_0
 * ones as int8 again, f32/f16/bf16 ones left out: data NULL). Called
 * after every tensor's shape was checked. */
static loom_tensor_t *file_weights(const loom_gguf_t *g, const loom_gpt_t *m, int block) {
    loom_xtensor_t *x;
    int n = loom_xtensors(&m->cfg, &x), found = 0, want = 0;
    size_t head = (size_t)m->cfg.n_layer * LOOM_QLIN_COUNT * sizeof(loom_tensor_t), bytes = 0;
    for (int i = 0; i < n; i++) {
        const loom_gguf_tensor_t *t = loom_gguf_find(g, x[i].gguf);
        if (qlin_of(x[i].param) < 0) continue;
        int kq = loom_qblock_of_ggml(t->type) >= 0, take = kq || t->type == GT_Q8_0;
        found += kq, want += take, bytes += take ? (held_bytes(t) + 63) / 64 * 64 : 0;
    }
    int use = block ? found > 0 : want == m->cfg.n_layer * LOOM_QLIN_COUNT && found == 0;
    char *mem = use ? loom_calloc(1, head + bytes) : NULL, *at = mem ? mem + head : NULL;
    for (int i = 0; i < n && mem; i++) {
        const loom_gguf_tensor_t *t = loom_gguf_find(g, x[i].gguf);
        int d = loom_qblock_of_ggml(t->type);
        if (qlin_of(x[i].param) < 0 || (d < 0 && t->type != GT_Q8_0)) continue;
        loom_tensor_t v = {.data = at, .dtype = (loom_dtype)d, .rows = (long long)x[i].rows, .cols = (long long)x[i].cols};
        if (d >= 0) {
            memcpy(at, t->data, t->bytes);
        } else { /* nb scales, then numel int8: alignment kept (numel % 32 == 0) */
            float *sc = (float *)at;
            v = (loom_tensor_t){.data = sc + t->numel / 32, .dtype = LOOM_INT8, .rows = v.rows, .cols = v.cols, .scales = sc, .block = 32};
            q8_0_split(t, v.data, sc);
        }
        ((loom_tensor_t *)mem)[x[i].layer * LOOM_QLIN_COUNT + qlin_of(x[i].param)] = v;
        at += (held_bytes(t) + 63) / 64 * 64;
    }
    free(x);
    return (loom_tensor_t *)mem;
}

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
static void say_block_weights(const char *path, const loom_gpt_t *m, const loom_backend_t *be) {
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
}

loom_status loom_gguf_load(const char *path, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok) {
    *model = NULL;
    *tok = NULL;
    loom_gguf_t *g;
    LOOM_TRY(loom_gguf_open(&g, path));
    loom_gpt_config_t cfg;
    loom_status s = read_config(g, &cfg);
    if (s == LOOM_OK) s = read_tokenizer(g, tok);
    if (s == LOOM_OK && *tok && loom_tokenizer_vocab_size(*tok) > cfg.vocab_size)
        s = loom_error(LOOM_EFORMAT, "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                       loom_tokenizer_vocab_size(*tok), cfg.vocab_size);
    if (s == LOOM_OK) s = loom_gpt_create(model, &cfg, be);
    if (s == LOOM_OK) s = loom_xload(*model, read_tensor, g);
    if (s == LOOM_OK) {
        (*model)->file_int8 = file_weights(g, *model, 0);
        (*model)->file_q = file_weights(g, *model, 1);
        say_block_weights(path, *model, be);
    }
    if (s != LOOM_OK) {
        if (*model) loom_gpt_free(*model);
        if (*tok) loom_tokenizer_free(*tok);
        *model = NULL;
        *tok = NULL;
    }
    loom_gguf_close(g);
    return s;
}
