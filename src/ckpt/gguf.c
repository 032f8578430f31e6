#include "gguf.h"

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

/* GGUF metadata value types (gguf-py GGUFValueType). */
enum { GV_U8, GV_I8, GV_U16, GV_I16, GV_U32, GV_I32, GV_F32, GV_BOOL, GV_STR, GV_ARR, GV_U64, GV_I64, GV_F64 };
/* ggml tensor types and llama.cpp file types (LlamaFileType). */
enum { GT_F32 = 0, GT_F16 = 1, GT_Q8_0 = 8, GT_BF16 = 30 };
enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_UNUSED = 5 };

static int ggml_type_of(loom_xdtype t) {
    static const int map[] = {GT_F32, GT_F16, GT_BF16, GT_Q8_0};
    return map[t];
}

static int xdtype_of(uint32_t ggml_type) {
    switch (ggml_type) {
    case GT_F32: return LOOM_XDT_F32;
    case GT_F16: return LOOM_XDT_F16;
    case GT_BF16: return LOOM_XDT_BF16;
    case GT_Q8_0: return LOOM_XDT_Q8_0;
    }
    return -1;
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

typedef struct {
    const char *key;
    size_t key_len;
    uint32_t type;
    const unsigned char *val; /* the value; for arrays, its first element */
    uint32_t elem;            /* arrays: element type */
    uint64_t count;           /* arrays: element count */
} kv_t;

typedef struct {
    char name[96];
    uint32_t ndim, type;
    uint64_t ne[4], offset;
} tinfo_t;

typedef struct {
    const char *path;
    const unsigned char *p;
    size_t size, at;
    int short_read;
    uint32_t version;
    uint64_t nkv, nt;
    kv_t *kv;
    tinfo_t *t;
    size_t data; /* start of the data section */
} gguf_t;

static const unsigned char *take(gguf_t *g, size_t n) {
    if (g->short_read || n > g->size - g->at) {
        g->short_read = 1;
        return NULL;
    }
    const unsigned char *q = g->p + g->at;
    g->at += n;
    return q;
}
static uint32_t get_u32(gguf_t *g) {
    uint32_t v = 0;
    const unsigned char *q = take(g, 4);
    if (q) memcpy(&v, q, 4);
    return v;
}
static uint64_t get_u64(gguf_t *g) {
    uint64_t v = 0;
    const unsigned char *q = take(g, 8);
    if (q) memcpy(&v, q, 8);
    return v;
}

static size_t scalar_size(uint32_t type) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type <= GV_F64 ? sz[type] : 0;
}

/* Step over one value of `type` (strings and nested arrays included). */
static int skip_value(gguf_t *g, uint32_t type, int depth) {
    if (type == GV_STR) return take(g, get_u64(g)) != NULL;
    if (type == GV_ARR) {
        uint32_t elem = get_u32(g);
        uint64_t n = get_u64(g);
        if (depth > 4 || elem > GV_F64) return 0;
        if (elem != GV_STR && elem != GV_ARR) return n <= g->size && take(g, n * scalar_size(elem)) != NULL;
        for (uint64_t i = 0; i < n && !g->short_read; i++)
            if (!skip_value(g, elem, depth + 1)) return 0;
        return !g->short_read;
    }
    return scalar_size(type) && take(g, scalar_size(type)) != NULL;
}

static loom_status parse_kv(gguf_t *g) {
    g->kv = loom_calloc(g->nkv ? g->nkv : 1, sizeof *g->kv);
    for (uint64_t i = 0; i < g->nkv; i++) {
        kv_t *k = &g->kv[i];
        k->key_len = get_u64(g);
        k->key = (const char *)take(g, k->key_len);
        k->type = get_u32(g);
        if (g->short_read) break;
        k->val = g->p + g->at;
        if (k->type == GV_ARR) {
            size_t save = g->at;
            k->elem = get_u32(g);
            k->count = get_u64(g);
            k->val = g->p + g->at;
            g->at = save;
        }
        if (!skip_value(g, k->type, 0))
            return loom_error(LOOM_EFORMAT, "%s: metadata %.*s (type %u) is malformed or cut short; the file is truncated or not GGUF", g->path,
                              (int)(k->key ? k->key_len : 0), k->key ? k->key : "", k->type);
    }
    if (g->short_read) return loom_error(LOOM_EFORMAT, "%s: the metadata ends past the end of the file (%zu bytes); the file is truncated", g->path, g->size);
    return LOOM_OK;
}

static const kv_t *kv_find(const gguf_t *g, const char *key) {
    for (uint64_t i = 0; i < g->nkv; i++)
        if (g->kv[i].key_len == strlen(key) && !memcmp(g->kv[i].key, key, g->kv[i].key_len)) return &g->kv[i];
    return NULL;
}

/* An integer metadata value of any integer type; 0 when absent. */
static int kv_int(const gguf_t *g, const char *key, long long *out) {
    const kv_t *k = kv_find(g, key);
    if (!k) return 0;
    uint64_t u = 0;
    switch (k->type) {
    case GV_U8: u = k->val[0]; break;
    case GV_U16: { uint16_t v; memcpy(&v, k->val, 2); u = v; break; }
    case GV_U32: { uint32_t v; memcpy(&v, k->val, 4); u = v; break; }
    case GV_I32: { int32_t v; memcpy(&v, k->val, 4); u = (uint64_t)(int64_t)v; break; }
    case GV_U64: case GV_I64: memcpy(&u, k->val, 8); break;
    default: return 0;
    }
    *out = (long long)u;
    return 1;
}

/* A string value as a malloc'd C string, or NULL. */
static char *kv_string(const gguf_t *g, const char *key) {
    const kv_t *k = kv_find(g, key);
    if (!k || k->type != GV_STR) return NULL;
    uint64_t n;
    memcpy(&n, k->val, 8);
    char *s = loom_malloc(n + 1);
    memcpy(s, k->val + 8, n);
    s[n] = 0;
    return s;
}

static loom_status parse_tensors(gguf_t *g) {
    g->t = loom_calloc(g->nt ? g->nt : 1, sizeof *g->t);
    for (uint64_t i = 0; i < g->nt && !g->short_read; i++) {
        tinfo_t *t = &g->t[i];
        uint64_t n = get_u64(g);
        const unsigned char *name = take(g, n);
        if (name) snprintf(t->name, sizeof t->name, "%.*s", (int)(n < 95 ? n : 95), name);
        t->ndim = get_u32(g);
        if (t->ndim > 4) return loom_error(LOOM_EFORMAT, "%s: tensor %s has %u dimensions; GGUF allows 4", g->path, t->name, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) t->ne[d] = get_u64(g);
        t->type = get_u32(g);
        t->offset = get_u64(g);
    }
    if (g->short_read) return loom_error(LOOM_EFORMAT, "%s: the tensor list ends past the end of the file (%zu bytes); the file is truncated", g->path, g->size);
    long long align = LOOM_GGUF_ALIGN;
    kv_int(g, "general.alignment", &align);
    if (align <= 0) align = LOOM_GGUF_ALIGN;
    g->data = (g->at + (size_t)align - 1) / (size_t)align * (size_t)align;
    return LOOM_OK;
}

static loom_status parse_head(gguf_t *g) {
    uint32_t magic = get_u32(g);
    if (g->short_read || magic != LOOM_GGUF_MAGIC)
        return loom_error(LOOM_EFORMAT, "%s: not a GGUF file (magic %08x, expected %08x \"GGUF\")", g->path, magic, LOOM_GGUF_MAGIC);
    g->version = get_u32(g);
    if (g->version != 2 && g->version != 3)
        return loom_error(LOOM_EFORMAT, "%s: GGUF version %u is not supported; loom reads versions 2 and 3 (convert it again with a current llama.cpp)",
                          g->path, g->version);
    g->nt = get_u64(g);
    g->nkv = get_u64(g);
    if (g->short_read || g->nt > g->size || g->nkv > g->size)
        return loom_error(LOOM_EFORMAT, "%s: the GGUF header is cut short or corrupt (%llu tensors, %llu metadata entries)", g->path,
                          (unsigned long long)g->nt, (unsigned long long)g->nkv);
    LOOM_TRY(parse_kv(g));
    return parse_tensors(g);
}

/* The model config from gpt2.* metadata and the embedding's shape. */
static loom_status read_config(const gguf_t *g, loom_gpt_config_t *c) {
    char *arch = kv_string(g, "general.architecture");
    if (!arch || strcmp(arch, "gpt2")) {
        loom_status s = loom_error(LOOM_EUNAVAIL, "%s: architecture %s is not supported; loom reads gpt2 (GPT-2) models", g->path,
                                   arch ? arch : "(general.architecture missing)");
        free(arch);
        return s;
    }
    free(arch);
    static const char *const keys[] = {"gpt2.block_count", "gpt2.context_length", "gpt2.embedding_length", "gpt2.attention.head_count"};
    long long v[4], ff = 0;
    for (int i = 0; i < 4; i++)
        if (!kv_int(g, keys[i], &v[i]) || v[i] <= 0 || v[i] > (1 << 24))
            return loom_error(LOOM_EFORMAT, "%s: metadata %s is missing or not a positive integer", g->path, keys[i]);
    memset(c, 0, sizeof *c);
    c->n_layer = (int)v[0];
    c->max_seq_len = (int)v[1];
    c->channels = (int)v[2];
    c->n_head = (int)v[3];
    if (kv_int(g, "gpt2.feed_forward_length", &ff) && ff != 4LL * c->channels)
        return loom_error(LOOM_EUNAVAIL, "%s: feed_forward_length %lld is not 4 x embedding_length (%d); loom's GPT-2 has that MLP only", g->path,
                          ff, 4 * c->channels);
    for (uint64_t i = 0; i < g->nt; i++)
        if (!strcmp(g->t[i].name, "token_embd.weight")) c->vocab_size = (int)g->t[i].ne[1];
    if (c->vocab_size <= 0) return loom_error(LOOM_EFORMAT, "%s: tensor token_embd.weight is missing; a gpt2 GGUF has it", g->path);
    return loom_gpt_config_finish(c);
}

static const tinfo_t *find_tensor(const gguf_t *g, const char *name) {
    for (uint64_t i = 0; i < g->nt; i++)
        if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

/* A loom_xsource_fn over a parsed GGUF file (ctx: the gguf_t). */
static loom_status read_tensor(void *ctx, const loom_xtensor_t *x, float *out) {
    const gguf_t *g = ctx;
    const tinfo_t *t = find_tensor(g, x->gguf);
    if (!t) return loom_error(LOOM_EFORMAT, "%s: tensor %s is missing; a gpt2 GGUF has it", g->path, x->gguf);
    uint64_t want0 = x->cols ? x->cols : x->rows, want1 = x->cols ? x->rows : 1;
    uint64_t got1 = t->ndim >= 2 ? t->ne[1] : 1;
    if (t->ndim < 1 || t->ndim > 2 || t->ne[0] != want0 || got1 != want1)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s has shape [%llu, %llu], the metadata implies [%llu, %llu]", g->path, x->gguf,
                          (unsigned long long)t->ne[0], (unsigned long long)got1, (unsigned long long)want0, (unsigned long long)want1);
    int xt = xdtype_of(t->type);
    if (xt < 0 || (xt == LOOM_XDT_Q8_0 && t->ne[0] % 32))
        return loom_error(LOOM_EUNAVAIL, "%s: tensor %s has ggml type %u; loom reads f32 (0), f16 (1), q8_0 (8) and bf16 (30)", g->path, x->gguf, t->type);
    size_t bytes = loom_xdtype_bytes((loom_xdtype)xt, x->numel);
    if (t->offset > g->size || g->data + t->offset > g->size || bytes > g->size - g->data - t->offset)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: its %zu bytes at offset %llu end past the end of the file (%zu bytes); the file is truncated",
                          g->path, x->gguf, bytes, (unsigned long long)(g->data + t->offset), g->size);
    loom_xdecode((loom_xdtype)xt, g->p + g->data + t->offset, x->numel, out);
    return loom_check_finite(out, x->numel, x->gguf, g->path);
}

/* Which LOOM_QLIN_* a parameter is, -1 for the others. */
static int qlin_of(int param) {
    return param == LOOM_QKVW ? LOOM_QLIN_QKV : param == LOOM_ATTPROJW ? LOOM_QLIN_ATTPROJ
         : param == LOOM_FCW ? LOOM_QLIN_FC : param == LOOM_FCPROJW ? LOOM_QLIN_FCPROJ : -1;
}

/* The file's Q8_0 linear weights as m->file_int8, their bytes as stored:
 * int8 values copied, each block's fp16 scale widened to fp32 (exact);
 * only when every linear matrix is q8_0 (one block size for the int8
 * copy). Called after read_tensor checked every tensor's shape, type and
 * extent. */
static void read_int8(const gguf_t *g, loom_gpt_t *m) {
    loom_xtensor_t *x;
    int n = loom_xtensors(&m->cfg, &x);
    size_t head = (size_t)m->cfg.n_layer * LOOM_QLIN_COUNT * sizeof(loom_tensor_t), bytes = 0;
    int found = 0;
    for (int i = 0; i < n; i++)
        if (qlin_of(x[i].param) >= 0 && find_tensor(g, x[i].gguf)->type == GT_Q8_0) bytes += x[i].numel + x[i].numel / 8, found++;
    char *mem = found == m->cfg.n_layer * LOOM_QLIN_COUNT ? loom_calloc(1, head + bytes) : NULL, *at = mem ? mem + head : NULL;
    for (int i = 0; i < n && mem; i++) {
        const tinfo_t *t = find_tensor(g, x[i].gguf);
        if (qlin_of(x[i].param) < 0 || t->type != GT_Q8_0) continue;
        size_t nb = x[i].numel / 32;
        float *sc = (float *)at; /* nb scales, then numel int8: alignment kept (numel % 32 == 0) */
        signed char *q = (signed char *)(sc + nb);
        const unsigned char *src = g->p + g->data + t->offset;
        for (size_t b = 0; b < nb; b++) {
            uint16_t h;
            memcpy(&h, src + 34 * b, 2);
            sc[b] = loom_f16_to_f32(h);
            memcpy(q + 32 * b, src + 34 * b + 2, 32);
        }
        ((loom_tensor_t *)mem)[x[i].layer * LOOM_QLIN_COUNT + qlin_of(x[i].param)] = (loom_tensor_t){
            .data = q, .dtype = LOOM_INT8, .rows = (long long)x[i].rows, .cols = (long long)x[i].cols, .scales = sc, .block = 32};
        at += x[i].numel + nb * sizeof(float);
    }
    m->file_int8 = (loom_tensor_t *)mem;
    free(x);
}

/* The i-th string of a string array (ptr, len) by walking; arrays are walked
 * once in order by the caller, so `cur` keeps the position. */
static const unsigned char *next_str(const gguf_t *g, const unsigned char **cur, uint64_t *len) {
    if ((size_t)(*cur - g->p) + 8 > g->size) return NULL;
    memcpy(len, *cur, 8);
    const unsigned char *s = *cur + 8;
    *cur = s + *len;
    return s;
}

/* The embedded GPT-2 BPE tokenizer as tokenizer.json text. */
static loom_status read_tokenizer(const gguf_t *g, loom_tokenizer_t **tok) {
    *tok = NULL;
    char *model = kv_string(g, "tokenizer.ggml.model");
    const kv_t *toks = kv_find(g, "tokenizer.ggml.tokens"), *types = kv_find(g, "tokenizer.ggml.token_type"),
               *merges = kv_find(g, "tokenizer.ggml.merges");
    if (!model || !toks) {
        free(model);
        return LOOM_OK; /* no tokenizer: ids only */
    }
    int gpt2 = !strcmp(model, "gpt2");
    free(model);
    if (!gpt2 || toks->elem != GV_STR || !merges || merges->elem != GV_STR)
        return loom_error(LOOM_EUNAVAIL, "%s: the embedded tokenizer is not GPT-2 BPE (tokenizer.ggml.model \"gpt2\" with merges); loom reads that one", g->path);
    int32_t *type = NULL;
    if (types && types->elem == GV_I32 && types->count == toks->count) type = (int32_t *)types->val;
    uint64_t n = toks->count;
    while (n > 0 && type) { /* trailing padding ids are the model's, not the tokenizer's */
        int32_t ty;
        memcpy(&ty, &type[n - 1], 4);
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
    const unsigned char *cur = toks->val, *s;
    uint64_t len;
    char *name = NULL;
    for (uint64_t i = 0; i < n && (s = next_str(g, &cur, &len)); i++) {
        name = realloc(name, len + 1);
        memcpy(name, s, len);
        name[len] = 0;
        cJSON_AddNumberToObject(vocab, name, (double)i);
        int32_t ty = TOKEN_NORMAL;
        if (type) memcpy(&ty, &type[i], 4);
        if (ty == TOKEN_CONTROL || ty == TOKEN_UNUSED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", name);
            cJSON_AddBoolToObject(a, "special", 1);
            cJSON_AddItemToArray(added, a);
        }
    }
    cur = merges->val;
    for (uint64_t i = 0; i < merges->count && (s = next_str(g, &cur, &len)); i++) {
        name = realloc(name, len + 1);
        memcpy(name, s, len);
        name[len] = 0;
        cJSON_AddItemToArray(ml, cJSON_CreateString(name));
    }
    free(name);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    loom_status st = loom_tokenizer_parse(tok, g->path, text, strlen(text));
    free(text);
    return st;
}

loom_status loom_gguf_load(const char *path, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok) {
    *model = NULL;
    *tok = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    fstat(fd, &sb);
    gguf_t g = {.path = path, .size = (size_t)sb.st_size};
    void *map = g.size ? mmap(NULL, g.size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return loom_error(LOOM_EFORMAT, "%s: empty or unreadable; not a GGUF file", path);
    g.p = map;
    loom_gpt_config_t cfg;
    loom_status s = parse_head(&g);
    if (s == LOOM_OK) s = read_config(&g, &cfg);
    if (s == LOOM_OK) s = read_tokenizer(&g, tok);
    if (s == LOOM_OK && *tok && loom_tokenizer_vocab_size(*tok) > cfg.vocab_size)
        s = loom_error(LOOM_EFORMAT, "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                       loom_tokenizer_vocab_size(*tok), cfg.vocab_size);
    if (s == LOOM_OK) s = loom_gpt_create(model, &cfg, be);
    if (s == LOOM_OK) s = loom_xload(*model, read_tensor, &g);
    if (s == LOOM_OK) read_int8(&g, *model);
    if (s != LOOM_OK) {
        if (*model) loom_gpt_free(*model);
        if (*tok) loom_tokenizer_free(*tok);
        *model = NULL;
        *tok = NULL;
    }
    free(g.kv);
    free(g.t);
    munmap(map, g.size);
    return s;
}
