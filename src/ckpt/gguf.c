#include "gguf.h"

#include "backend/qblock.h"
#include "ckpt/gguf_file.h"
#include "ckpt/gguf_map.h"
#include "model/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { GV_U32 = LOOM_GV_U32, GV_I32 = LOOM_GV_I32, GV_F32 = LOOM_GV_F32, GV_BOOL = LOOM_GV_BOOL, GV_STR = LOOM_GV_STR, GV_ARR = LOOM_GV_ARR };
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

static void kv_bool(buf_t *b, const char *key, int v) {
    kv_key(b, key, GV_BOOL);
    unsigned char c = v != 0;
    put(b, &c, 1);
}

/* The merges as "a b" strings (their tokens' names). */
static void put_merges(buf_t *b, const loom_tokenizer_t *t) {
    int nm = loom_tokenizer_merges(t);
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
}

/* The special ids and flags (data/tokenizer.h loom_tokenizer_gguf);
 * returns the keys written. */
static int put_specials(buf_t *b, const loom_tokenizer_gguf_t *g, int sp) {
    static const char *const key[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"};
    int id[3] = {g->bos, g->eos, g->unk}, n = 0;
    if (!sp && g->eos >= 0 && id[0] < 0) id[0] = g->eos, id[2] = g->eos; /* GPT-2's tokenizer_config: all three <|endoftext|> */
    for (int k = 0; k < 3; k++)
        if (id[k] >= 0) kv_u32(b, key[k], (uint32_t)id[k]), n++;
    kv_bool(b, "tokenizer.ggml.add_bos_token", g->add_bos);
    kv_bool(b, "tokenizer.ggml.add_eos_token", g->add_eos);
    if (sp) kv_bool(b, "tokenizer.ggml.add_space_prefix", g->add_space_prefix);
    return n + 2 + sp;
}

/* The tokenizer as llama.cpp's converter embeds it: byte-level BPE as model
 * "gpt2" with the pre-tokenizer llama.cpp knows by name and the merges, or
 * SentencePiece-style as "llama" with scores (llama.cpp's tokenizer merges
 * by them; the merges go too, which loom reads first); token types, special
 * ids and flags. Ids past the tokenizer's vocabulary (the model's larger
 * vocab_size) are "[PADi]", unused. */
static int put_tokenizer(buf_t *b, const loom_tokenizer_t *t, int V) {
    int tv = loom_tokenizer_vocab_size(t), n = 5;
    loom_tokenizer_gguf_t g = loom_tokenizer_gguf(t);
    int sp = !strcmp(g.model, "llama");
    kv_str(b, "tokenizer.ggml.model", g.model);
    if (g.pre) kv_str(b, "tokenizer.ggml.pre", g.pre);
    n -= !g.pre;
    kv_array(b, "tokenizer.ggml.tokens", GV_STR, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        char pad[32], *name = NULL;
        if (i < tv) name = loom_tokenizer_token_name(t, (uint32_t)i);
        else snprintf(pad, sizeof pad, "[PAD%d]", i);
        put_str(b, name ? name : pad);
        free(name);
    }
    kv_array(b, "tokenizer.ggml.token_type", GV_I32, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        int32_t type = i < tv ? loom_tokenizer_gguf_type(t, (uint32_t)i) : TOKEN_UNUSED;
        put(b, &type, 4);
    }
    if (sp) {
        float *sc = loom_malloc((size_t)V * sizeof(float));
        loom_tokenizer_gguf_scores(t, sc);
        for (int i = tv; i < V; i++) sc[i] = -1e9f;
        kv_array(b, "tokenizer.ggml.scores", GV_F32, (uint64_t)V);
        put(b, sc, (size_t)V * sizeof(float));
        free(sc);
        n++;
    }
    put_merges(b, t);
    return n + put_specials(b, &g, sp);
}

/* The architecture a config is written as: gpt2, llama (no biases) or
 * qwen2 (q, k, v biases); NULL when GGUF has none for it. */
static const char *arch_of(const loom_gpt_config_t *c) {
    if (!strcmp(loom_gpt_family(c), "gpt2")) return c->n_kv_heads == c->n_head && c->bias == LOOM_BIAS_ALL && !c->untied_head ? "gpt2" : NULL;
    if (c->norm != LOOM_NORM_RMSNORM || c->pos != LOOM_POS_ROPE || c->mlp != LOOM_MLP_SWIGLU) return NULL;
    return c->bias == LOOM_BIAS_NONE ? "llama" : c->bias == LOOM_BIAS_QKV ? "qwen2" : NULL;
}

/* The architecture's keys (`arch`.*); returns their count. */
static int put_arch(buf_t *b, const char *arch, const loom_gpt_config_t *c) {
    char k[96];
#define ARCH_U32(key, v) (snprintf(k, sizeof k, "%s." key, arch), kv_u32(b, k, (uint32_t)(v)))
#define ARCH_F32(key, v) (snprintf(k, sizeof k, "%s." key, arch), kv_f32(b, k, (float)(v)))
    ARCH_U32("block_count", c->n_layer);
    ARCH_U32("context_length", c->max_seq_len);
    ARCH_U32("embedding_length", c->channels);
    ARCH_U32("feed_forward_length", c->ffn_hidden);
    ARCH_U32("attention.head_count", c->n_head);
    if (!strcmp(arch, "gpt2")) {
        ARCH_F32("attention.layer_norm_epsilon", 1e-5f);
        return 6;
    }
    ARCH_U32("attention.head_count_kv", c->n_kv_heads);
    ARCH_F32("attention.layer_norm_rms_epsilon", c->norm_eps > 0 ? c->norm_eps : 1e-5f);
    ARCH_F32("rope.freq_base", c->rope_theta > 0 ? c->rope_theta : 10000.0f);
    ARCH_U32("rope.dimension_count", c->channels / c->n_head);
    ARCH_U32("vocab_size", c->vocab_size);
    if (c->rope_scaling.kind != LOOM_ROPE_SCALING_LINEAR) return 10;
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    kv_str(b, k, "linear");
    ARCH_F32("rope.scaling.factor", c->rope_scaling.factor);
    return 12;
#undef ARCH_U32
#undef ARCH_F32
}

/* The metadata section; returns the number of key-value pairs. */
static uint64_t put_metadata(buf_t *b, const loom_gguf_write_opts_t *o, const char *arch) {
    static const uint32_t file_type[] = {0, 1, 32, 7}; /* ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0 */
    kv_str(b, "general.architecture", arch);
    kv_str(b, "general.type", "model");
    kv_str(b, "general.name", o->name && *o->name ? o->name : "loom");
    int n = put_arch(b, arch, o->cfg);
    kv_u32(b, "general.file_type", file_type[o->dtype]);
    kv_u32(b, "general.quantization_version", 2);
    uint64_t ntok = o->tok ? (uint64_t)put_tokenizer(b, o->tok, o->cfg->vocab_size) : 0;
    if (o->chat_template && *o->chat_template) kv_str(b, "tokenizer.chat_template", o->chat_template), ntok++;
    return 5 + (uint64_t)n + ntok;
}

static loom_xdtype tensor_dtype(const loom_gguf_map_t *x, loom_xdtype want) {
    if (!x->cols) return LOOM_XDT_F32;
    if (want == LOOM_XDT_Q8_0 && x->cols % 32) return LOOM_XDT_F16;
    return want;
}

static size_t numel_of(const loom_gguf_map_t *x) { return x->rows * (x->cols ? x->cols : 1); }

static size_t align_up(size_t n) { return (n + LOOM_GGUF_ALIGN - 1) / LOOM_GGUF_ALIGN * LOOM_GGUF_ALIGN; }

/* Header, metadata and tensor infos, padded to the data section. */
static buf_t gguf_head(const loom_gguf_write_opts_t *o, const char *arch, const loom_gguf_map_t *x, int n) {
    buf_t kv = {0}, b = {0};
    uint64_t nkv = put_metadata(&kv, o, arch);
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
        off = align_up(off + loom_xdtype_bytes(t, numel_of(&x[i])));
    }
    static const unsigned char zero[LOOM_GGUF_ALIGN];
    put(&b, zero, align_up(b.n) - b.n);
    return b;
}

/* Tensor i's values: from the source (GPT-2's table, xt[i]) or from the
 * host parameter block, rows in the file's order. */
static loom_status tensor_values(const loom_gguf_write_opts_t *o, const loom_gguf_map_t *x, const loom_xtensor_t *xt,
                                 const loom_tensor_info_t *pt, float *vals) {
    if (x->param < 0) { /* rope_freqs.weight: no parameter of the model's */
        loom_gguf_rope_divisors(o->cfg, vals);
        return LOOM_OK;
    }
    if (!o->params) return o->src(o->src_ctx, xt, vals);
    size_t w = x->cols ? x->cols : 1;
    const float *from = o->params + loom_gguf_param_at(x, o->cfg, pt);
    for (size_t r = 0; r < x->rows; r++) memcpy(vals + loom_gguf_file_row(x, r) * w, from + r * w, w * sizeof(float));
    return LOOM_OK;
}

static loom_status write_tensors(FILE *f, const char *tmp, const loom_gguf_write_opts_t *o, const loom_gguf_map_t *x,
                                 const loom_xtensor_t *xt, int n) {
    size_t most = 0;
    for (int i = 0; i < n; i++) most = numel_of(&x[i]) > most ? numel_of(&x[i]) : most;
    float *vals = loom_malloc(most * sizeof(float));
    unsigned char *enc = loom_malloc(most * 4);
    loom_tensor_info_t pt[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(o->cfg, pt, &total);
    static const unsigned char zero[LOOM_GGUF_ALIGN];
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if ((s = tensor_values(o, &x[i], xt ? &xt[i] : NULL, pt, vals)) != LOOM_OK) break;
        loom_xdtype t = tensor_dtype(&x[i], o->dtype);
        size_t bytes = loom_xdtype_bytes(t, numel_of(&x[i]));
        loom_xencode(t, vals, numel_of(&x[i]), enc);
        if (fwrite(enc, 1, bytes, f) != bytes || fwrite(zero, 1, align_up(bytes) - bytes, f) != align_up(bytes) - bytes)
            s = loom_error(LOOM_EWRITE, "%s: write failed at tensor %s: %s (disk full?)", tmp, x[i].gguf, strerror(errno));
    }
    free(vals);
    free(enc);
    return s;
}

/* The checks before a file is begun. */
static loom_status write_check(const char *path, const loom_gguf_write_opts_t *o, const char *arch) {
    const loom_gpt_config_t *c = o->cfg;
    if (o->tok && loom_tokenizer_vocab_size(o->tok) > c->vocab_size)
        return loom_error(LOOM_EINVAL, "%s: the tokenizer has %d tokens but the model only %d", path, loom_tokenizer_vocab_size(o->tok),
                          c->vocab_size);
    if (!arch)
        return loom_error(LOOM_EUNAVAIL, "%s: this model (%s blocks, biases kind %d) has no GGUF architecture loom writes (gpt2, llama, qwen2)",
                          path, loom_gpt_family(c), (int)c->bias);
    if (strcmp(arch, "gpt2") && !o->params)
        return loom_error(LOOM_EINVAL, "%s: a %s GGUF is written from the model's parameters (loom_gguf_write_opts_t.params)", path, arch);
    if (o->dtype == LOOM_XDT_Q8_0 && c->channels % 32)
        loom_warn("%s: q8_0 needs rows that are a multiple of 32 values; the width %d is not, so those matrices are written f16",
                  path, c->channels);
    return LOOM_OK;
}

loom_status loom_gguf_write(const char *path, const loom_gguf_write_opts_t *o) {
    const char *arch = arch_of(o->cfg);
    LOOM_TRY(write_check(path, o, arch));
    loom_gguf_map_t *x;
    loom_xtensor_t *xt = NULL;
    int n = loom_gguf_map(o->cfg, arch, &x);
    if (!o->params) loom_xtensors(o->cfg, &xt); /* the source's table: the same order as the map */
    if (o->cfg->rope_scaling.kind == LOOM_ROPE_SCALING_LLAMA3) /* as llama.cpp's converter: one more tensor, last */
        x[n++] = (loom_gguf_map_t){.gguf = "rope_freqs.weight", .param = -1, .layer = -1, .rows = (size_t)loom_gpt_head_size(o->cfg) / 2, .qlin = -1};
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path); /* a fresh name: no file of the user's is truncated */
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0) fchmod(fd, 0644); /* mkstemp's 0600 would make the export private */
    if (!f) {
        if (fd >= 0) close(fd), unlink(tmp);
        free(x), free(xt);
        return loom_error(LOOM_EWRITE, "%s: cannot create: %s", tmp, strerror(errno));
    }
    buf_t head = gguf_head(o, arch, x, n);
    loom_status s = LOOM_OK;
    if (fwrite(head.p, 1, head.n, f) != head.n) s = loom_error(LOOM_EWRITE, "%s: write failed: %s", tmp, strerror(errno));
    free(head.p);
    if (s == LOOM_OK) s = write_tensors(f, tmp, o, x, xt, n);
    if (s == LOOM_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        s = loom_error(LOOM_EWRITE, "%s: write failed: %s (disk full?)", tmp, strerror(errno));
    if (fclose(f) != 0 && s == LOOM_OK) s = loom_error(LOOM_EWRITE, "%s: close failed: %s", tmp, strerror(errno));
    if (s == LOOM_OK && rename(tmp, path) != 0) s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", path, strerror(errno));
    if (s != LOOM_OK) unlink(tmp);
    free(x), free(xt);
    return s;
}

/* ---- reading ------------------------------------------------------------- */

/* The names of a string array, NUL-terminated copies (NULL: not a
 * string array, or one cut short by the end of the file). */
static char **str_array(const loom_gguf_t *g, const loom_gguf_array_t *a, uint64_t n) {
    if (a->elem != GV_STR) return NULL;
    char **v = loom_calloc(n + 1, sizeof *v);
    const unsigned char *cur = a->val, *s;
    uint64_t len;
    for (uint64_t i = 0; i < n; i++) {
        if (!(s = loom_gguf_next_str(g, &cur, &len))) {
            for (uint64_t k = 0; k < i; k++) free(v[k]);
            free(v);
            return NULL;
        }
        v[i] = loom_malloc(len + 1);
        memcpy(v[i], s, len);
        v[i][len] = 0;
    }
    return v;
}

static void free_strs(char **v, uint64_t n) {
    for (uint64_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

/* Integer metadata `key`, or `dflt` when absent. */
static int meta_or(const loom_gguf_t *g, const char *key, int dflt) {
    long long v;
    return loom_gguf_int(g, key, &v) && v >= INT32_MIN && v <= INT32_MAX ? (int)v : dflt;
}

/* The tokens, less trailing padding ids (type unused: the model's rows
 * beyond the tokenizer's vocabulary, as loom's own export writes them). */
static uint64_t vocab_count(const loom_gguf_array_t *toks, const int32_t *types) {
    uint64_t n = toks->count;
    while (n > 0 && types && types[n - 1] == TOKEN_UNUSED) n--;
    return n;
}

/* A metadata array of 4-byte elements of type `elem` and `count`
 * elements, copied (aligned); NULL when absent or otherwise. */
static void *array4(const loom_gguf_t *g, const char *key, uint32_t elem, uint64_t count) {
    loom_gguf_array_t a;
    if (!loom_gguf_array(g, key, &a) || a.elem != elem || a.count != count) return NULL;
    void *v = loom_malloc(count * 4 + 4);
    memcpy(v, a.val, count * 4);
    return v;
}

/* The tokenizer in the file's tokenizer.ggml.* keys (as llama.cpp's
 * converter writes them): byte-level BPE ("gpt2", split as
 * tokenizer.ggml.pre names) or SentencePiece-style BPE ("llama", merges
 * made from the scores), built by loom_tokenizer_from_vocab. A
 * pre-tokenizer or model loom does not implement loads the model without
 * a tokenizer, said (token ids only); a malformed vocabulary is an error. */
static loom_status read_tokenizer(const loom_gguf_t *g, loom_tokenizer_t **tok) {
    *tok = NULL;
    loom_gguf_array_t toks, mg;
    char *model = loom_gguf_str(g, "tokenizer.ggml.model");
    if (!model || !loom_gguf_array(g, "tokenizer.ggml.tokens", &toks)) {
        free(model);
        return LOOM_OK; /* no tokenizer: ids only */
    }
    const char *path = loom_gguf_path(g);
    int32_t *types = array4(g, "tokenizer.ggml.token_type", GV_I32, toks.count);
    float *scores = array4(g, "tokenizer.ggml.scores", GV_F32, toks.count);
    uint64_t n = vocab_count(&toks, types), nm = 0;
    int has_mg = loom_gguf_array(g, "tokenizer.ggml.merges", &mg);
    char **names = n <= (1u << 24) ? str_array(g, &toks, n) : NULL, **merges = has_mg ? str_array(g, &mg, nm = mg.count) : NULL;
    char *pre = loom_gguf_str(g, "tokenizer.ggml.pre");
    int llama = !strcmp(model, "llama");
    loom_tokenizer_vocab_t v = {
        .model = model, .pre = pre, .n = (int)n, .tokens = (const char *const *)names, .types = types,
        .merges = (const char *const *)merges, .nmerges = merges ? nm : 0, .scores = scores,
        .bos = meta_or(g, "tokenizer.ggml.bos_token_id", -1), .eos = meta_or(g, "tokenizer.ggml.eos_token_id", -1),
        .unk = meta_or(g, "tokenizer.ggml.unknown_token_id", -1),
        .add_bos = meta_or(g, "tokenizer.ggml.add_bos_token", llama), /* llama.cpp's defaults: SentencePiece adds BOS */
        .add_eos = meta_or(g, "tokenizer.ggml.add_eos_token", 0),
        .add_space_prefix = meta_or(g, "tokenizer.ggml.add_space_prefix", 1), .origin = path};
    loom_status s;
    if (!names || (has_mg && !merges))
        s = loom_error(LOOM_EFORMAT, "%s: tokenizer.ggml.%s is not an array of strings within the file; convert the model again", path,
                       names ? "merges" : "tokens");
    else
        s = loom_tokenizer_from_vocab(tok, &v);
    if (s == LOOM_EUNAVAIL) { /* a tokenizer loom does not implement: the weights still run on token ids */
        loom_warn("%s; the model is loaded without its tokenizer (token ids only)", loom_errmsg());
        s = LOOM_OK;
    }
    free_strs(names, n), free_strs(merges, nm);
    free(types), free(scores), free(pre), free(model);
    return s;
}

/* Say which weights run as stored, what fp32 was made for the rest, and
 * which were dequantized. */
static void say_block_weights(const char *path, const loom_gpt_t *m, const loom_backend_t *be, int mixed, size_t fp32_floats) {
    if (!m->file_q) return;
    int nq = m->cfg.n_layer * LOOM_QLIN_COUNT;
    size_t bytes = 0;
    for (int i = 0; i < nq * (1 + LOOM_FILE_Q_PARTS) + 2; i++)
        if (m->file_q[i].data && (i != nq + 1 || m->file_q[i].data != m->file_q[nq].data)) bytes += loom_qblock_tensor_bytes(&m->file_q[i]);
    char fp32[128] = "";
    if (fp32_floats < m->num_params) /* the rest of the block was never written: no resident memory */
        snprintf(fp32, sizeof fp32, "; fp32 only for the other weights (%.1f MB of %.1f MB)", fp32_floats * 4.0 / 1e6, m->num_params * 4.0 / 1e6);
    if (be->matmul_forward_kq)
        loom_info("%s: the linear layers%s run on the file's own quantized blocks (%.1f MB)%s", path,
                  m->file_q[nq].data || m->file_q[nq + 1].data ? ", the embedding and the head where stored so," : "", bytes / 1e6, fp32);
    if (mixed)
        loom_info("%s: %d fused weights (q, k, v or gate, up) mix block and unquantized types; those run on their fp32 values",
                  path, mixed);
}

/* Config, tokenizer and weights of an opened file into a new model: the
 * stored weights first (read once, checked), then fp32 for the rest, and
 * with fp32_all (or on a device, which computes in fp32) the stored ones
 * dequantized too. */
static loom_status load(const loom_gguf_t *g, const loom_backend_t *be, int fp32_all, loom_gpt_t **model, loom_tokenizer_t **tok) {
    const char *path = loom_gguf_path(g);
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_gguf_config(g, &cfg));
    LOOM_TRY(read_tokenizer(g, tok));
    if (*tok && loom_tokenizer_vocab_size(*tok) > cfg.vocab_size)
        return loom_error(LOOM_EFORMAT, "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                          loom_tokenizer_vocab_size(*tok), cfg.vocab_size);
    LOOM_TRY(loom_gpt_create(model, &cfg, be));
    loom_gpt_t *m = *model;
    int mixed, host_be = !(be->caps & LOOM_CAP_DEVICE_MEMORY); /* read in place: no second fp32 copy at load */
    LOOM_TRY(loom_gguf_file_weights(g, &m->cfg, &m->file_q, &mixed));
    int lazy = host_be && !fp32_all && be->matmul_forward_kq && be->matmul_forward_w8a8; /* what model/infer.c runs stored */
    float *host = host_be ? m->params : loom_calloc(m->num_params, sizeof(float));
    size_t floats = 0;
    loom_status s = loom_gguf_read_params_except(g, &m->cfg, m->ptable, host, m->file_q, &floats);
    if (s == LOOM_OK && !lazy) loom_gguf_blocks_fp32(m->file_q, &m->cfg, m->ptable, host, 0), floats = m->num_params;
    if (s == LOOM_OK && !host_be) be->upload(m->params, host, m->num_params * sizeof(float));
    if (!host_be) free(host);
    if (s == LOOM_OK) say_block_weights(path, m, be, m->file_q ? mixed : 0, floats);
    return s;
}

loom_status loom_gguf_load_opts(const char *path, const loom_backend_t *be, int fp32_all, loom_gpt_t **model, loom_tokenizer_t **tok) {
    *model = NULL;
    *tok = NULL;
    loom_gguf_t *g;
    LOOM_TRY(loom_gguf_open(&g, path));
    loom_status s = load(g, be, fp32_all, model, tok);
    if (s != LOOM_OK) {
        if (*model) loom_gpt_free(*model);
        if (*tok) loom_tokenizer_free(*tok);
        *model = NULL;
        *tok = NULL;
    }
    loom_gguf_close(g);
    return s;
}

loom_status loom_gguf_load(const char *path, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok) {
    return loom_gguf_load_opts(path, be, 1, model, tok);
}

void loom_gguf_fp32(loom_gpt_t *m, int ends_only) {
    if (!(m->be->caps & LOOM_CAP_DEVICE_MEMORY)) loom_gguf_blocks_fp32(m->file_q, &m->cfg, m->ptable, m->params, ends_only);
}

loom_status loom_gguf_read_str(const char *path, const char *key, char **out) {
    *out = NULL;
    loom_gguf_t *g;
    LOOM_TRY(loom_gguf_open(&g, path));
    *out = loom_gguf_str(g, key);
    loom_gguf_close(g);
    return LOOM_OK;
}
