/* bpe_hf: tokenizer files: Hugging Face tokenizer.json (read and written),
 * GPT-2's vocab.json + merges.txt, tokenizer_config.json, and a tokenizer
 * built from a vocabulary held in memory (GGUF). Each component of a
 * tokenizer.json is either mapped onto loom's options (bpe_build.h) or
 * refused with its name; docs/tokenizer.md lists both. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_build.h"
#include "bpe_map.h"
#include "bpe_pretok.h"

#define SP_SPACE "\xe2\x96\x81" /* "▁", U+2581 */
#define EOT_TEXT "<|endoftext|>"

static size_t tok_len(const loom_tokenizer_t *t, uint32_t id) { return LOOM_TOK_LEN(t, id); }

/* ---- names ----------------------------------------------------------------- */

/* GPT-2's reversible map from bytes to printable unicode code points. */
static void byte_to_unicode(int cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : 256 + n++;
    }
}

static int utf8_put(char *s, int cp) {
    if (cp < 0x80) { s[0] = (char)cp; return 1; }
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 63));
    return 2; /* the map's code points are all below 0x800 */
}

/* Token bytes -> the byte-level string that names it in vocab files. */
static char *bytes_to_name(const unsigned char *s, size_t n) {
    int cp[256];
    byte_to_unicode(cp);
    char *out = loom_malloc(2 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)utf8_put(out + k, cp[s[i]]);
    out[k] = 0;
    return out;
}

/* The byte-level name -> bytes (into out, at most strlen(name) bytes); -1
 * when a character is outside the byte map. */
static long name_to_bytes(const char *name, unsigned char *out) {
    static int inv[512];
    static int ready;
    if (!ready) { /* idempotent, so a race only repeats the same stores */
        int cp[256];
        byte_to_unicode(cp);
        for (int i = 0; i < 512; i++) inv[i] = -1;
        for (int b = 0; b < 256; b++) inv[cp[b]] = b;
        ready = 1;
    }
    const unsigned char *s = (const unsigned char *)name;
    size_t len = strlen(name), k = 0;
    for (size_t i = 0; i < len;) {
        unsigned c;
        int n = loom_utf8_next(s, len, i, &c);
        if (c >= 512 || inv[c] < 0) return -1;
        out[k++] = (unsigned char)inv[c];
        i += (size_t)n;
    }
    return (long)k;
}

/* SentencePiece names: "▁" in the file is a space in loom (bpe_build.h). */
static char *sp_bytes_to_name(const unsigned char *s, size_t n) {
    char *out = loom_malloc(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(out + k, SP_SPACE, 3);
            k += 3;
        } else {
            out[k++] = (char)s[i];
        }
    }
    out[k] = 0;
    return out;
}

static long sp_name_to_bytes(const char *name, unsigned char *out) {
    size_t k = 0;
    for (const char *p = name; *p;) {
        if (!strncmp(p, SP_SPACE, 3)) {
            out[k++] = ' ';
            p += 3;
        } else {
            out[k++] = (unsigned char)*p++;
        }
    }
    return (long)k;
}

/* The byte of a byte-fallback token's name "<0xNN>" (as HF writes it), or -1. */
static int byte_token_value(const char *name) {
    const char *hex = "0123456789ABCDEF";
    if (strlen(name) != 6 || strncmp(name, "<0x", 3) || name[5] != '>' || !name[3] || !name[4]) return -1;
    const char *h = strchr(hex, name[3]), *l = strchr(hex, name[4]);
    return h && l ? (int)((h - hex) * 16 + (l - hex)) : -1;
}

/* The name of a token in vocab files, malloc'd. */
static char *name_of(int sp, const unsigned char *s, size_t n, uint8_t flags) {
    if (flags & LOOM_TOK_BYTE) {
        char *b = loom_malloc(8);
        snprintf(b, 8, "<0x%02X>", s[0]);
        return b;
    }
    if (flags & LOOM_TOK_ADDED) {
        char *c = loom_malloc(n + 1);
        memcpy(c, s, n);
        c[n] = 0;
        return c;
    }
    return sp ? sp_bytes_to_name(s, n) : bytes_to_name(s, n);
}

char *loom_tokenizer_token_name(const loom_tokenizer_t *t, uint32_t id) {
    return name_of(t->st.sentencepiece, t->bytes + t->off[id], tok_len(t, id), t->special[id]);
}

/* ---- writing tokenizer.json -------------------------------------------------- */

static cJSON *added_token(int id, const unsigned char *content, size_t n, uint8_t flags) {
    cJSON *a = cJSON_CreateObject();
    char *c = name_of(0, content, n, LOOM_TOK_ADDED);
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", c);
    free(c);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", (flags & LOOM_TOK_NORMALIZED) != 0);
    cJSON_AddBoolToObject(a, "special", !(flags & LOOM_TOK_PLAIN));
    return a;
}

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *byte_level(const char *type, int add_prefix_space, int use_regex) {
    cJSON *o = typed(type);
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

/* {type, pattern: {String|Regex: pattern}, [content]} as Replace and Split write it. */
static cJSON *patterned(const char *type, const char *kind, const char *pattern) {
    cJSON *o = typed(type);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "pattern"), kind, pattern);
    return o;
}

static cJSON *sequence(const char *type, const char *key, cJSON *a, cJSON *b) {
    cJSON *o = typed(type), *arr = cJSON_AddArrayToObject(o, key);
    cJSON_AddItemToArray(arr, a);
    if (b) cJSON_AddItemToArray(arr, b);
    return o;
}

static cJSON *metaspace(const char *type, int prepend, int split) {
    cJSON *o = typed(type);
    cJSON_AddStringToObject(o, "replacement", SP_SPACE);
    const char *scheme = prepend == LOOM_PREPEND_ALWAYS ? "always" : prepend == LOOM_PREPEND_FIRST ? "first" : "never";
    cJSON_AddStringToObject(o, "prepend_scheme", scheme);
    cJSON_AddBoolToObject(o, "split", split);
    return o;
}

static cJSON *pre_tokenizer_json(const loom_tok_style_t *st) {
    if (st->sentencepiece) return st->prepend == LOOM_PREPEND_NORMALIZER ? cJSON_CreateNull() : metaspace("Metaspace", st->prepend, st->split_spaces);
    if (st->pretok == LOOM_PRETOK_LLAMA3 || st->pretok == LOOM_PRETOK_QWEN2) {
        cJSON *split = patterned("Split", "Regex", st->pretok == LOOM_PRETOK_LLAMA3 ? LOOM_PRETOK_LLAMA3_REGEX : LOOM_PRETOK_QWEN2_REGEX);
        cJSON_AddStringToObject(split, "behavior", "Isolated");
        cJSON_AddBoolToObject(split, "invert", 0);
        return sequence("Sequence", "pretokenizers", split, byte_level("ByteLevel", st->add_prefix_space, 0));
    }
    if (st->pretok == LOOM_PRETOK_DIGITS) {
        cJSON *d = typed("Digits");
        cJSON_AddBoolToObject(d, "individual_digits", 1);
        return sequence("Sequence", "pretokenizers", d, byte_level("ByteLevel", st->add_prefix_space, 1));
    }
    return byte_level("ByteLevel", st->add_prefix_space, st->pretok == LOOM_PRETOK_GPT2);
}

static cJSON *normalizer_json(const loom_tok_style_t *st) {
    if (st->nfc) return typed("NFC");
    if (!st->sentencepiece || st->prepend != LOOM_PREPEND_NORMALIZER) return cJSON_CreateNull();
    cJSON *p = typed("Prepend"), *r = patterned("Replace", "String", " ");
    cJSON_AddStringToObject(p, "prepend", SP_SPACE);
    cJSON_AddStringToObject(r, "content", SP_SPACE);
    return sequence("Sequence", "normalizers", p, r);
}

static cJSON *decoder_json(const loom_tok_style_t *st) {
    if (!st->sentencepiece) return byte_level("ByteLevel", 1, 1);
    if (st->strip_decode < 0) return metaspace("Metaspace", st->prepend == LOOM_PREPEND_NONE ? LOOM_PREPEND_NONE : LOOM_PREPEND_ALWAYS, 1);
    cJSON *r = patterned("Replace", "String", SP_SPACE);
    cJSON_AddStringToObject(r, "content", " ");
    cJSON *o = sequence("Sequence", "decoders", r, typed("ByteFallback"));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "decoders"), typed("Fuse"));
    if (st->strip_decode > 0) {
        cJSON *s = typed("Strip");
        cJSON_AddStringToObject(s, "content", " ");
        cJSON_AddNumberToObject(s, "start", st->strip_decode);
        cJSON_AddNumberToObject(s, "stop", 0);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "decoders"), s);
    }
    return o;
}

static void template_item(cJSON *arr, const char *kind, const char *id, int type_id) {
    cJSON *item = cJSON_CreateObject(), *body = cJSON_AddObjectToObject(item, kind);
    cJSON_AddStringToObject(body, "id", id);
    cJSON_AddNumberToObject(body, "type_id", type_id);
    cJSON_AddItemToArray(arr, item);
}

/* TemplateProcessing with the BOS/EOS the tokenizer adds
 * (single: [BOS] $A [EOS]; pair: the same for A then B), or null. */
static cJSON *post_processor_json(const loom_tokenizer_t *t) {
    const loom_tok_style_t *st = &t->st;
    if (!st->add_bos && !st->add_eos) return cJSON_CreateNull();
    int ids[2] = {st->add_bos ? st->bos : -1, st->add_eos ? st->eos : -1};
    char *names[2] = {NULL, NULL};
    cJSON *o = typed("TemplateProcessing"), *single = cJSON_AddArrayToObject(o, "single"), *pair = cJSON_AddArrayToObject(o, "pair");
    cJSON *sp = cJSON_AddObjectToObject(o, "special_tokens");
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        names[k] = loom_tokenizer_token_name(t, (uint32_t)ids[k]);
        if (cJSON_GetObjectItemCaseSensitive(sp, names[k])) continue;
        cJSON *e = cJSON_AddObjectToObject(sp, names[k]);
        cJSON_AddStringToObject(e, "id", names[k]);
        cJSON_AddItemToObject(e, "ids", cJSON_CreateIntArray(&ids[k], 1));
        cJSON_AddItemToObject(e, "tokens", cJSON_CreateStringArray((const char *const *)&names[k], 1));
    }
    for (int seq = 0; seq < 2; seq++) {
        for (int p = 0; p < 1 + seq; p++) { /* single holds A; pair holds A and B */
            cJSON *arr = seq ? pair : single;
            if (names[0]) template_item(arr, "SpecialToken", names[0], p);
            template_item(arr, "Sequence", p ? "B" : "A", p);
            if (names[1]) template_item(arr, "SpecialToken", names[1], p);
        }
    }
    free(names[0]);
    free(names[1]);
    return o;
}

static cJSON *model_json(const loom_tokenizer_t *t) {
    const loom_tok_style_t *st = &t->st;
    cJSON *model = cJSON_CreateObject();
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    char *unk = st->unk >= 0 ? loom_tokenizer_token_name(t, (uint32_t)st->unk) : NULL;
    if (unk) cJSON_AddStringToObject(model, "unk_token", unk);
    else cJSON_AddNullToObject(model, "unk_token");
    free(unk);
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", st->fuse_unk);
    int fallback = 0;
    for (int b = 0; b < 256 && st->sentencepiece; b++) fallback |= t->byte_id[b] != UINT32_MAX;
    cJSON_AddBoolToObject(model, "byte_fallback", fallback);
    cJSON_AddBoolToObject(model, "ignore_merges", st->ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; i < t->vocab_size; i++) {
        char *name = loom_tokenizer_token_name(t, (uint32_t)i);
        cJSON_AddNumberToObject(vocab, name, i);
        free(name);
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (size_t i = 0; i < t->nmerges; i++) {
        char *na = loom_tokenizer_token_name(t, t->merges[i][0]), *nb = loom_tokenizer_token_name(t, t->merges[i][1]);
        size_t la = strlen(na), lb = strlen(nb);
        char *m = loom_malloc(la + lb + 2);
        memcpy(m, na, la);
        m[la] = ' ';
        memcpy(m + la + 1, nb, lb + 1);
        cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        free(m);
        free(na);
        free(nb);
    }
    return model;
}

loom_status loom_tokenizer_save(const loom_tokenizer_t *t, const char *path) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->vocab_size; i++)
        if (t->special[i] & LOOM_TOK_ADDED)
            cJSON_AddItemToArray(added, added_token(i, t->bytes + t->off[i], tok_len(t, (uint32_t)i), t->special[i]));
    cJSON_AddItemToObject(root, "normalizer", normalizer_json(&t->st));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer_json(&t->st));
    cJSON_AddItemToObject(root, "post_processor", post_processor_json(t));
    cJSON_AddItemToObject(root, "decoder", decoder_json(&t->st));
    cJSON_AddItemToObject(root, "model", model_json(t));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return loom_error(LOOM_ENOMEM, "%s: could not format the tokenizer as JSON", path);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

static void line_col(const char *text, size_t at, long *line, long *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && text[i]; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static cJSON *parse_json(const char *path, loom_status *st) {
    char *text;
    size_t len;
    *st = loom_file_read(path, &text, &len);
    if (*st != LOOM_OK) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        long line, col;
        size_t at = end ? (size_t)(end - text) : 0;
        line_col(text, at, &line, &col);
        *st = loom_error(LOOM_EFORMAT, "%s:%ld:%ld: not valid JSON", path, line, col);
    }
    free(text);
    return root;
}

/* Vocabulary entries, gathered by id before building. */
/* ---- reading ------------------------------------------------------------------ */

/* Vocabulary entries, gathered by id before building. */
typedef struct {
    int n;                  /* vocab size (max id + 1) */
    int sp;                 /* names are SentencePiece's */
    unsigned char **tok;
    size_t *len;
    uint8_t *special;       /* LOOM_TOK_* */
} vocab_t;

static void vocab_free(vocab_t *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->special);
}

static void vocab_alloc(vocab_t *v, int n) {
    v->n = n;
    v->tok = loom_calloc((size_t)n + 1, sizeof *v->tok);
    v->len = loom_calloc((size_t)n + 1, sizeof *v->len);
    v->special = loom_calloc((size_t)n + 1, 1);
}

static loom_status vocab_set(vocab_t *v, const char *path, long id, const unsigned char *s, size_t n, uint8_t flags) {
    if (id < 0 || id >= v->n) return loom_error(LOOM_EFORMAT, "%s: token id %ld is out of range", path, id);
    if (v->tok[id]) {
        if (v->len[id] == n && !memcmp(v->tok[id], s, n) && v->special[id] == flags) return LOOM_OK;
        if ((flags & LOOM_TOK_ADDED) && !(v->special[id] & LOOM_TOK_ADDED)) { /* an added token also listed in the vocab */
            free(v->tok[id]);
        } else {
            return loom_error(LOOM_EFORMAT, "%s: token id %ld is given twice", path, id);
        }
    }
    v->tok[id] = loom_malloc(n ? n : 1);
    memcpy(v->tok[id], s, n);
    v->len[id] = n;
    v->special[id] = flags;
    return LOOM_OK;
}

/* A vocabulary name (not an added token) into v as token `id`. */
static loom_status vocab_set_name(vocab_t *v, const char *path, long id, const char *name) {
    if (v->special[id] & LOOM_TOK_ADDED) return LOOM_OK;
    int b = v->sp ? byte_token_value(name) : -1;
    if (b >= 0) {
        unsigned char c = (unsigned char)b;
        return vocab_set(v, path, id, &c, 1, LOOM_TOK_BYTE);
    }
    unsigned char *buf = loom_malloc(strlen(name) + 1);
    long k = v->sp ? sp_name_to_bytes(name, buf) : name_to_bytes(name, buf);
    loom_status s = k > 0 ? vocab_set(v, path, id, buf, (size_t)k, 0)
                          : loom_error(LOOM_EFORMAT, "%s: vocabulary entry \"%s\" (id %ld) is not a byte-level token (a character outside GPT-2's byte map)", path, name, id);
    free(buf);
    return s;
}

static int json_id(const cJSON *x, long *id) {
    if (!cJSON_IsNumber(x)) return 0;
    double d = x->valuedouble;
    if (d < 0 || d > 4294967294.0 || d != (double)(long)d) return 0;
    *id = (long)d;
    return 1;
}

/* LOOM_TOK_* flags of an added_tokens entry; refuses what loom does not do. */
static loom_status added_flags(const char *path, const cJSON *x, const char *content, uint8_t *flags) {
    const char *unsupported[] = {"single_word", "lstrip", "rstrip"};
    for (int f = 0; f < 3; f++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, unsupported[f])))
            return loom_error(LOOM_EUNAVAIL, "%s: added token \"%s\" sets %s, which loom does not support", path, content, unsupported[f]);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(x, "special"), *norm = cJSON_GetObjectItemCaseSensitive(x, "normalized");
    int special = sp ? cJSON_IsTrue(sp) : 1;
    int normalized = norm ? cJSON_IsTrue(norm) : !special; /* HF's default */
    *flags = (uint8_t)(LOOM_TOK_ADDED | (special ? 0 : LOOM_TOK_PLAIN) | (normalized ? LOOM_TOK_NORMALIZED : 0));
    return LOOM_OK;
}

/* Fill *v from a vocab object (name -> id) plus added tokens (content, id). */
static loom_status vocab_from_json(vocab_t *v, const char *path, const cJSON *vocab, const cJSON *added) {
    long maxid = -1, id = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        if (!json_id(x, &id)) return loom_error(LOOM_EFORMAT, "%s: vocabulary entry \"%s\": the id is not a non-negative integer", path, x->string);
        if (id > maxid) maxid = id;
    }
    cJSON_ArrayForEach(x, added) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(x, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!json_id(i, &id) || !cJSON_IsString(c) || !c->valuestring[0])
            return loom_error(LOOM_EFORMAT, "%s: an added_tokens entry lacks an integer \"id\" or a \"content\" string", path);
        uint8_t f;
        LOOM_TRY(added_flags(path, x, c->valuestring, &f));
        if (id > maxid) maxid = id;
    }
    /* The table is sized by the largest id: ids far beyond the entry count
     * (a sparse or hostile file) would allocate gigabytes for nothing. */
    long entries = cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added);
    if (maxid + 1 > 0x7fffffff || maxid >= 2 * entries + 1024)
        return loom_error(LOOM_EFORMAT, "%s: token id %ld is far above the file's %ld tokens; a tokenizer's ids run 0..N-1 "
                          "(this file is damaged or not a tokenizer.json)", path, maxid, entries);
    vocab_alloc(v, (int)(maxid + 1));
    cJSON_ArrayForEach(x, added) {
        json_id(cJSON_GetObjectItemCaseSensitive(x, "id"), &id);
        const char *c = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
        uint8_t f;
        added_flags(path, x, c, &f);
        LOOM_TRY(vocab_set(v, path, id, (const unsigned char *)c, strlen(c), f));
    }
    cJSON_ArrayForEach(x, vocab) {
        json_id(x, &id);
        LOOM_TRY(vocab_set_name(v, path, id, x->string));
    }
    return LOOM_OK;
}

/* Resolve "a b" (or ["a", "b"]) merges to id pairs through the names. */
static loom_status merges_to_ids(const char *path, const vocab_t *v, const char *const *a, const char *const *b, size_t n,
                                 long line0, uint32_t (*out)[2]) {
    loom_strmap_t names;
    loom_strmap_init(&names, (size_t)v->n);
    for (int i = 0; i < v->n; i++) {
        if (!v->tok[i] || (v->special[i] & LOOM_TOK_ADDED)) continue;
        char *nm = name_of(v->sp, v->tok[i], v->len[i], v->special[i]);
        size_t l = strlen(nm);
        loom_strmap_put(&names, nm, l, loom_bytes_hash(nm, l), (uint64_t)i, NULL);
        free(nm);
    }
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        const char *part[2] = {a[i], b[i]};
        for (int k = 0; k < 2; k++) {
            size_t l = strlen(part[k]);
            loom_strmap_entry_t *e = loom_strmap_get(&names, part[k], l, loom_bytes_hash(part[k], l));
            if (!e) {
                if (line0 > 0) st = loom_error(LOOM_EFORMAT, "%s: line %ld: unknown token \"%s\" in merge \"%s %s\"", path, line0 + (long)i, part[k], a[i], b[i]);
                else st = loom_error(LOOM_EFORMAT, "%s: merge %zu: unknown token \"%s\" in merge \"%s %s\"", path, i, part[k], a[i], b[i]);
                break;
            }
            out[i][k] = (uint32_t)e->val;
        }
    }
    loom_strmap_free(&names);
    return st;
}

static loom_status build_from(loom_tokenizer_t **out, const char *path, const char *mpath, vocab_t *v, uint32_t (*merges)[2], size_t nm,
                              long line0, const loom_tok_style_t *style) {
    const unsigned char **tok = loom_malloc(((size_t)v->n + 1) * sizeof *tok);
    for (int i = 0; i < v->n; i++) tok[i] = v->tok[i] ? v->tok[i] : (const unsigned char *)"";
    loom_bpe_spec_t sp = {.vocab_size = v->n, .tok = tok, .tok_len = v->len, .special = v->special,
                          .merges = (const uint32_t(*)[2])merges, .nmerges = nm, .style = *style,
                          .origin = path, .merges_origin = mpath, .merge_line0 = line0};
    loom_status s = loom_tokenizer_build(out, &sp);
    free(tok);
    return s;
}

/* ---- tokenizer.json components ------------------------------------------------ */

static const cJSON *get(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

static const char *type_of(const cJSON *o) {
    const cJSON *t = get(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "(no type)";
}

static int str_is(const cJSON *o, const char *key, const char *want) {
    const cJSON *x = get(o, key);
    return cJSON_IsString(x) && !strcmp(x->valuestring, want);
}

/* The steps of a component: the list of a Sequence (under `list`), or the
 * component itself; at most 8. */
static int steps_of(const cJSON *c, const char *list, const cJSON *steps[8]) {
    if (!c || cJSON_IsNull(c)) return 0;
    if (str_is(c, "type", "Sequence")) {
        int n = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, get(c, list)) {
            if (n == 8) return -1;
            steps[n++] = x;
        }
        return n;
    }
    steps[0] = c;
    return 1;
}

/* Normalizers: SentencePiece's Prepend("▁") and Replace(" ", "▁") only. */
static loom_status read_normalizer(const char *path, const cJSON *norm, loom_tok_style_t *st) {
    const cJSON *steps[8];
    int n = steps_of(norm, "normalizers", steps), replace = 0;
    for (int k = 0; k < n; k++) {
        const cJSON *s = steps[k];
        const cJSON *pat = get(s, "pattern");
        if (str_is(s, "type", "Prepend") && str_is(s, "prepend", SP_SPACE) && !replace) {
            st->prepend = LOOM_PREPEND_NORMALIZER;
        } else if (str_is(s, "type", "Replace") && str_is(pat, "String", " ") && str_is(s, "content", SP_SPACE)) {
            replace = 1;
        } else if (str_is(s, "type", "NFC") && n == 1) {
            st->nfc = 1;
            return LOOM_OK;
        } else {
            return loom_error(LOOM_EUNAVAIL, "%s: normalizer %s is not supported; loom reads the Prepend(\"▁\") and Replace(\" \", \"▁\") "
                              "normalizers of SentencePiece-style tokenizers (Llama 2) and NFC alone (Qwen2), and none else", path, type_of(s));
        }
    }
    if (n < 0 || (n > 0 && !replace))
        return loom_error(LOOM_EUNAVAIL, "%s: this normalizer sequence is not supported; loom reads Prepend(\"▁\") then Replace(\" \", \"▁\")", path);
    st->sentencepiece |= replace;
    return LOOM_OK;
}

/* One Split step: the pattern must be one of the regexes loom implements. */
static loom_status read_split(const char *path, const cJSON *s, loom_tok_style_t *st) {
    const cJSON *re = get(get(s, "pattern"), "Regex");
    const char *pat = cJSON_IsString(re) ? re->valuestring : "(not a regex)";
    if (!strcmp(pat, LOOM_PRETOK_LLAMA3_REGEX)) st->pretok = LOOM_PRETOK_LLAMA3;
    else if (!strcmp(pat, LOOM_PRETOK_QWEN2_REGEX)) st->pretok = LOOM_PRETOK_QWEN2;
    else if (!strcmp(pat, LOOM_PRETOK_GPT2_REGEX)) st->pretok = LOOM_PRETOK_GPT2;
    else return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer Split with pattern %s is not supported; loom implements the regexes of "
                           "GPT-2, Llama 3 and Qwen2", path, pat);
    if (!str_is(s, "behavior", "Isolated") || cJSON_IsTrue(get(s, "invert")))
        return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer Split: only behavior \"Isolated\" without invert is supported", path);
    return LOOM_OK;
}

static loom_status read_metaspace(const char *path, const cJSON *s, loom_tok_style_t *st) {
    if (!str_is(s, "replacement", SP_SPACE)) return loom_error(LOOM_EUNAVAIL, "%s: Metaspace with a replacement other than \"▁\" is not supported", path);
    const cJSON *scheme = get(s, "prepend_scheme"), *split = get(s, "split");
    const char *sc = cJSON_IsString(scheme) ? scheme->valuestring : cJSON_IsFalse(get(s, "add_prefix_space")) ? "never" : "always";
    if (!strcmp(sc, "always")) st->prepend = LOOM_PREPEND_ALWAYS;
    else if (!strcmp(sc, "first")) st->prepend = LOOM_PREPEND_FIRST;
    else if (!strcmp(sc, "never")) st->prepend = LOOM_PREPEND_NONE;
    else return loom_error(LOOM_EUNAVAIL, "%s: Metaspace prepend_scheme \"%s\" is not supported", path, sc);
    st->split_spaces = split ? cJSON_IsTrue(split) : 1;
    st->sentencepiece = 1;
    return LOOM_OK;
}

/* Pre-tokenizers: ByteLevel, alone or after a Split with a known regex or
 * after Digits(individual_digits); or SentencePiece's Metaspace. */
static loom_status read_pre_tokenizer(const char *path, const cJSON *pre, loom_tok_style_t *st, int *byte_level) {
    const cJSON *steps[8];
    int n = steps_of(pre, "pretokenizers", steps), split = 0, digits = 0;
    if (n < 0) return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer is a Sequence of more than 8 steps", path);
    st->pretok = LOOM_PRETOK_NONE;
    for (int k = 0; k < n; k++) {
        const cJSON *s = steps[k];
        const char *ty = type_of(s);
        if (!strcmp(ty, "Split") && !*byte_level && !split && !digits) {
            LOOM_TRY(read_split(path, s, st));
            split = 1;
        } else if (!strcmp(ty, "Digits") && !*byte_level && !split && !digits && cJSON_IsTrue(get(s, "individual_digits"))) {
            digits = 1;
        } else if (!strcmp(ty, "ByteLevel") && !*byte_level) {
            *byte_level = 1;
            st->add_prefix_space = cJSON_IsTrue(get(s, "add_prefix_space"));
            const cJSON *r = get(s, "use_regex");
            int regex = r ? cJSON_IsTrue(r) : 1;
            if (regex == split) return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer: ByteLevel %s use_regex after %s is not supported", path,
                                                  regex ? "with" : "without", split ? "a Split" : "no Split");
            if (regex) st->pretok = digits ? LOOM_PRETOK_DIGITS : LOOM_PRETOK_GPT2;
        } else if (!strcmp(ty, "Metaspace") && n == 1) {
            LOOM_TRY(read_metaspace(path, s, st));
        } else {
            return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer %s is not supported here; loom reads ByteLevel (alone, after a Split with "
                              "GPT-2's, Llama 3's or Qwen2's regex, or after Digits) and Metaspace", path, ty);
        }
    }
    if ((split || digits) && !*byte_level) return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer: Split or Digits without ByteLevel is not supported", path);
    return LOOM_OK;
}

/* Decoders: ByteLevel (byte-level BPE); for SentencePiece, Replace("▁", " "),
 * ByteFallback, Fuse, Strip(" ", n, 0), or the Metaspace decoder. */
static loom_status read_decoder(const char *path, const cJSON *dec, loom_tok_style_t *st, int byte_fallback) {
    const cJSON *steps[8];
    int n = steps_of(dec, "decoders", steps), replace = 0, fallback = 0;
    for (int k = 0; k < n; k++) {
        const cJSON *s = steps[k];
        const char *ty = type_of(s);
        if (!strcmp(ty, "ByteLevel") && !st->sentencepiece) continue;
        if (!strcmp(ty, "Replace") && str_is(get(s, "pattern"), "String", SP_SPACE) && str_is(s, "content", " ")) replace = 1;
        else if (!strcmp(ty, "ByteFallback")) fallback = 1;
        else if (!strcmp(ty, "Fuse")) continue;
        else if (!strcmp(ty, "Strip") && str_is(s, "content", " ") && cJSON_IsNumber(get(s, "start")) && cJSON_IsNumber(get(s, "stop")) &&
                 get(s, "stop")->valueint == 0 && k == n - 1)
            st->strip_decode = get(s, "start")->valueint;
        else if (!strcmp(ty, "Metaspace") && n == 1 && str_is(s, "replacement", SP_SPACE)) {
            replace = 1;
            st->strip_decode = str_is(s, "prepend_scheme", "never") || cJSON_IsFalse(get(s, "add_prefix_space")) ? 0 : -1;
        } else
            return loom_error(LOOM_EUNAVAIL, "%s: decoder %s is not supported for this %s tokenizer", path, ty,
                              st->sentencepiece ? "SentencePiece-style" : "byte-level");
    }
    if (n < 0) return loom_error(LOOM_EUNAVAIL, "%s: decoder is a Sequence of more than 8 steps", path);
    if (st->sentencepiece && !replace)
        return loom_error(LOOM_EUNAVAIL, "%s: a SentencePiece-style tokenizer needs a decoder that turns \"▁\" into spaces (Replace or Metaspace)", path);
    if (byte_fallback && !fallback)
        return loom_error(LOOM_EUNAVAIL, "%s: model.byte_fallback is set but the decoder has no ByteFallback step", path);
    return LOOM_OK;
}

/* The id a TemplateProcessing names: special_tokens[name].ids[0]. */
static int template_id(const cJSON *pp, const cJSON *item) {
    const cJSON *name = get(get(item, "SpecialToken"), "id");
    const cJSON *ids = cJSON_IsString(name) ? get(get(get(pp, "special_tokens"), name->valuestring), "ids") : NULL;
    return cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)) ? cJSON_GetArrayItem(ids, 0)->valueint : -1;
}

/* Post-processors: ByteLevel (changes no id) and TemplateProcessing whose
 * single template is [BOS] $A [EOS]: the BOS/EOS a model's input gets. */
static loom_status read_post_processor(const char *path, const cJSON *pp, loom_tok_style_t *st) {
    const cJSON *steps[8];
    int n = steps_of(pp, "processors", steps);
    for (int k = 0; k < n; k++) {
        const cJSON *s = steps[k];
        if (str_is(s, "type", "ByteLevel")) continue;
        if (!str_is(s, "type", "TemplateProcessing"))
            return loom_error(LOOM_EUNAVAIL, "%s: post_processor %s is not supported; loom reads ByteLevel and TemplateProcessing", path, type_of(s));
        const cJSON *single = get(s, "single");
        int m = cJSON_GetArraySize(single), a = -1;
        for (int i = 0; i < m; i++)
            if (get(cJSON_GetArrayItem(single, i), "Sequence")) a = i;
        int before = a == 1 ? template_id(s, cJSON_GetArrayItem(single, 0)) : -1, after = a == m - 2 ? template_id(s, cJSON_GetArrayItem(single, m - 1)) : -1;
        if (a < 0 || a > 1 || m - a > 2 || (a == 1 && before < 0) || (a == m - 2 && after < 0))
            return loom_error(LOOM_EUNAVAIL, "%s: post_processor TemplateProcessing: loom reads a single template of the form [special] $A [special]", path);
        st->bos = a == 1 ? before : st->bos;
        st->add_bos = a == 1;
        st->eos = a == m - 2 ? after : st->eos;
        st->add_eos = a == m - 2;
    }
    if (n < 0) return loom_error(LOOM_EUNAVAIL, "%s: post_processor is a Sequence of more than 8 steps", path);
    return LOOM_OK;
}

/* The model's own options; refuses those loom does not implement. */
static loom_status read_model(const char *path, const cJSON *model, loom_tok_style_t *st, int *byte_fallback) {
    const char *unsupported[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 3; k++) {
        const cJSON *x = get(model, unsupported[k]);
        if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0]))
            return loom_error(LOOM_EUNAVAIL, "%s: model.%s is set; loom does not support it", path, unsupported[k]);
    }
    st->ignore_merges = cJSON_IsTrue(get(model, "ignore_merges"));
    st->fuse_unk = cJSON_IsTrue(get(model, "fuse_unk"));
    *byte_fallback = cJSON_IsTrue(get(model, "byte_fallback"));
    st->sentencepiece |= *byte_fallback;
    return LOOM_OK;
}

/* All components of a tokenizer.json into *st. */
static loom_status read_style(const char *path, const cJSON *root, loom_tok_style_t *st) {
    *st = loom_tok_style_gpt2();
    int byte_level = 0, byte_fallback = 0;
    LOOM_TRY(read_model(path, get(root, "model"), st, &byte_fallback));
    LOOM_TRY(read_normalizer(path, get(root, "normalizer"), st));
    LOOM_TRY(read_pre_tokenizer(path, get(root, "pre_tokenizer"), st, &byte_level));
    if (byte_level && st->sentencepiece)
        return loom_error(LOOM_EUNAVAIL, "%s: a ByteLevel pre-tokenizer with SentencePiece-style parts (a \"▁\" normalizer, Metaspace or byte_fallback) is not supported", path);
    if (!byte_level && !st->sentencepiece)
        return loom_error(LOOM_EUNAVAIL, "%s: no ByteLevel pre-tokenizer and no SentencePiece-style parts; loom supports byte-level BPE and SentencePiece-style BPE", path);
    LOOM_TRY(read_decoder(path, get(root, "decoder"), st, byte_fallback));
    return read_post_processor(path, get(root, "post_processor"), st);
}

/* The merges of a tokenizer.json ("a b" or ["a", "b"]) as name pairs; the
 * strings point into `merges` or into own[] (caller frees). */
static loom_status merge_names(const char *path, const cJSON *merges, const char **a, const char **b, char **own) {
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m)) {
            own[i] = loom_strdup(m->valuestring);
            char *sp = strchr(own[i], ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == own[i] || !sp[1])
                return loom_error(LOOM_EFORMAT, "%s: merge %zu \"%s\": expected two tokens separated by one space", path, i, m->valuestring);
            *sp = 0;
            a[i] = own[i];
            b[i] = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a[i] = cJSON_GetArrayItem(m, 0)->valuestring;
            b[i] = cJSON_GetArrayItem(m, 1)->valuestring;
        } else {
            return loom_error(LOOM_EFORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        i++;
    }
    return LOOM_OK;
}

/* model.unk_token's id (-1 when null). */
static loom_status unk_id(const char *path, const cJSON *model, const vocab_t *v, int *id) {
    *id = -1;
    const cJSON *u = get(model, "unk_token");
    if (!u || cJSON_IsNull(u)) return LOOM_OK;
    const cJSON *x = cJSON_IsString(u) ? get(get(model, "vocab"), u->valuestring) : NULL;
    long k;
    if (!x || !json_id(x, &k) || k >= v->n) return loom_error(LOOM_EFORMAT, "%s: model.unk_token is not in the vocabulary", path);
    *id = (int)k;
    return LOOM_OK;
}

static loom_status load_json(loom_tokenizer_t **out, const char *path, cJSON *root) {
    const cJSON *model = get(root, "model"), *vocab = get(model, "vocab"), *merges = get(model, "merges"), *type = get(model, "type");
    if (!cJSON_IsObject(model) || !cJSON_IsObject(vocab) || !cJSON_IsArray(merges) ||
        (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE"))))
        return loom_error(LOOM_EFORMAT, "%s: not a BPE tokenizer.json (needs model.type \"BPE\", model.vocab and model.merges)", path);
    loom_tok_style_t st;
    LOOM_TRY(read_style(path, root, &st));
    const cJSON *added = get(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) return loom_error(LOOM_EFORMAT, "%s: added_tokens is not an array", path);

    vocab_t v = {.sp = st.sentencepiece};
    loom_status s = vocab_from_json(&v, path, vocab, cJSON_IsArray(added) ? added : NULL);
    if (s == LOOM_OK) s = unk_id(path, model, &v, &st.unk);
    size_t nm = (size_t)cJSON_GetArraySize(merges);
    const char **a = loom_calloc(nm + 1, sizeof *a), **b = loom_calloc(nm + 1, sizeof *b);
    char **own = loom_calloc(nm + 1, sizeof *own);
    uint32_t(*ids)[2] = loom_malloc((nm + 1) * sizeof *ids);
    if (s == LOOM_OK) s = merge_names(path, merges, a, b, own);
    if (s == LOOM_OK) s = merges_to_ids(path, &v, a, b, nm, 0, ids);
    if (s == LOOM_OK) s = build_from(out, path, NULL, &v, ids, nm, 0, &st);
    for (size_t k = 0; k < nm; k++) free(own[k]);
    free(own);
    free(a);
    free(b);
    free(ids);
    vocab_free(&v);
    return s;
}

loom_status loom_tokenizer_load(loom_tokenizer_t **out, const char *path) {
    *out = NULL;
    loom_status s;
    cJSON *root = parse_json(path, &s);
    if (!root) return s;
    s = load_json(out, path, root);
    cJSON_Delete(root);
    return s;
}

loom_status loom_tokenizer_parse(loom_tokenizer_t **out, const char *origin, const char *json, size_t len) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return loom_error(LOOM_EFORMAT, "%s: the embedded tokenizer is not valid JSON", origin);
    loom_status s = load_json(out, origin, root);
    cJSON_Delete(root);
    return s;
}

loom_status loom_tokenizer_load_gpt2(loom_tokenizer_t **out, const char *vocab_path, const char *merges_path) {
    *out = NULL;
    loom_status s;
    cJSON *root = parse_json(vocab_path, &s);
    if (!root) return s;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_error(LOOM_EFORMAT, "%s: not a vocab.json (expected an object of token -> id)", vocab_path);
    }
    /* "<|endoftext|>" is GPT-2's one special token. */
    cJSON *added = cJSON_CreateArray();
    const cJSON *eot = cJSON_GetObjectItemCaseSensitive(root, EOT_TEXT);
    if (eot) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddItemToObject(a, "id", cJSON_Duplicate(eot, 1));
        cJSON_AddStringToObject(a, "content", EOT_TEXT);
        cJSON_AddItemToArray(added, a);
    }
    vocab_t v = {0};
    s = vocab_from_json(&v, vocab_path, root, added);
    cJSON_Delete(added);
    cJSON_Delete(root);
    char *text = NULL;
    size_t len = 0;
    if (s == LOOM_OK) s = loom_file_read(merges_path, &text, &len);
    if (s != LOOM_OK) {
        vocab_free(&v);
        return s;
    }
    size_t cap = 1024, n = 0;
    const char **a = loom_malloc(cap * sizeof *a), **b = loom_malloc(cap * sizeof *b);
    long first_line = 0, line = 0;
    char *p = text, *end = text + len;
    while (p < end && s == LOOM_OK) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        line++;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        *e = 0;
        char *ln = p;
        p = nl ? nl + 1 : end;
        if (line == 1 && !strncmp(ln, "#version", 8)) continue;
        if (!ln[0]) {
            if (p >= end) break; /* a final newline */
            s = loom_error(LOOM_EFORMAT, "%s: line %ld: empty line", merges_path, line);
            break;
        }
        char *sp = strchr(ln, ' ');
        if (!sp || sp == ln || !sp[1] || strchr(sp + 1, ' ')) {
            s = loom_error(LOOM_EFORMAT, "%s: line %ld: \"%s\": expected two tokens separated by one space", merges_path, line, ln);
            break;
        }
        if (!first_line) first_line = line;
        if ((long)n != line - first_line) {
            s = loom_error(LOOM_EFORMAT, "%s: line %ld: empty line before it", merges_path, line);
            break;
        }
        *sp = 0;
        if (n == cap) {
            cap *= 2;
            a = realloc(a, cap * sizeof *a);
            b = realloc(b, cap * sizeof *b);
            if (!a || !b) loom_panic(__FILE__, __LINE__, "out of memory");
        }
        a[n] = ln;
        b[n] = sp + 1;
        n++;
    }
    uint32_t(*ids)[2] = loom_malloc((n + 1) * sizeof *ids);
    if (!first_line) first_line = 1;
    if (s == LOOM_OK) s = merges_to_ids(merges_path, &v, a, b, n, first_line, ids);
    loom_tok_style_t st = loom_tok_style_gpt2();
    if (s == LOOM_OK) s = build_from(out, vocab_path, merges_path, &v, ids, n, first_line, &st);
    free(ids);
    free(a);
    free(b);
    free(text);
    vocab_free(&v);
    return s;
}



/* ---- tokenizer_config.json ---------------------------------------------------- */

/* The id of bos_token / eos_token (a string or {"content": ...}); -2 when
 * absent, -1 when null. */
static loom_status config_token(const loom_tokenizer_t *t, const char *path, const cJSON *root, const char *key, int *id) {
    const cJSON *x = get(root, key);
    *id = x ? -1 : -2;
    if (!x || cJSON_IsNull(x)) return LOOM_OK;
    const cJSON *c = cJSON_IsString(x) ? x : get(x, "content");
    if (!cJSON_IsString(c)) return loom_error(LOOM_EFORMAT, "%s: %s is neither a string nor {\"content\": string}", path, key);
    *id = loom_tokenizer_find(t, c->valuestring);
    if (*id < 0) return loom_error(LOOM_EFORMAT, "%s: %s \"%s\" is not a token of the tokenizer", path, key, c->valuestring);
    return LOOM_OK;
}

/* "chat_template": a string, or a list of {name, template} (the "default"). */
static loom_status config_template(const char *path, const cJSON *root, char **out) {
    const cJSON *c = get(root, "chat_template"), *x;
    if (!c || cJSON_IsNull(c)) return LOOM_OK;
    if (cJSON_IsString(c)) {
        *out = loom_strdup(c->valuestring);
        return LOOM_OK;
    }
    cJSON_ArrayForEach(x, c) {
        if (str_is(x, "name", "default") && cJSON_IsString(get(x, "template"))) {
            *out = loom_strdup(get(x, "template")->valuestring);
            return LOOM_OK;
        }
    }
    return loom_error(LOOM_EFORMAT, "%s: chat_template is neither a string nor a list holding a template named \"default\"", path);
}

loom_status loom_tokenizer_apply_config(loom_tokenizer_t *t, const char *path, char **chat_template) {
    if (chat_template) *chat_template = NULL;
    loom_status s;
    cJSON *root = parse_json(path, &s);
    if (!root) return s;
    int bos, eos;
    const cJSON *ab = get(root, "add_bos_token"), *ae = get(root, "add_eos_token");
    s = config_token(t, path, root, "bos_token", &bos);
    if (s == LOOM_OK) s = config_token(t, path, root, "eos_token", &eos);
    if (s == LOOM_OK && chat_template) s = config_template(path, root, chat_template);
    if (s == LOOM_OK) {
        s = loom_tokenizer_set_specials(t, bos, eos, cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : -1, cJSON_IsBool(ae) ? cJSON_IsTrue(ae) : -1);
        if (s != LOOM_OK) s = loom_error(s, "%s: %s", path, loom_errmsg());
    }
    cJSON_Delete(root);
    if (s != LOOM_OK && chat_template) {
        free(*chat_template);
        *chat_template = NULL;
    }
    return s;
}

/* ---- a vocabulary in memory (GGUF) ---------------------------------------------- */

typedef struct {
    float score;
    uint32_t tok, a, b;
} cand_t;

static int by_score(const void *x, const void *y) {
    const cand_t *p = x, *q = y;
    if (p->score != q->score) return p->score > q->score ? -1 : 1;
    if (p->tok != q->tok) return p->tok < q->tok ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

/* SentencePiece models in GGUF carry scores, not merges: a merge a + b for
 * every way to cut a token in two tokens, ranked by the token's score
 * (higher first), then by ids, as transformers' SentencePieceExtractor does. */
static size_t merges_from_scores(const vocab_t *v, const float *scores, uint32_t (**out)[2]) {
    loom_strmap_t map;
    loom_strmap_init(&map, (size_t)v->n);
    for (int i = 0; i < v->n; i++)
        if (v->tok[i] && !v->special[i]) loom_strmap_put(&map, v->tok[i], v->len[i], loom_bytes_hash(v->tok[i], v->len[i]), (uint64_t)i, NULL);
    size_t n = 0, cap = 1024;
    cand_t *c = loom_malloc(cap * sizeof *c);
    for (int i = 0; i < v->n; i++) {
        if (!v->tok[i] || v->special[i]) continue;
        for (size_t k = 1; k < v->len[i]; k++) {
            if ((v->tok[i][k] & 0xC0) == 0x80) continue; /* inside a character */
            loom_strmap_entry_t *l = loom_strmap_get(&map, v->tok[i], k, loom_bytes_hash(v->tok[i], k));
            loom_strmap_entry_t *r = loom_strmap_get(&map, v->tok[i] + k, v->len[i] - k, loom_bytes_hash(v->tok[i] + k, v->len[i] - k));
            if (!l || !r) continue;
            if (n == cap) c = realloc(c, (cap *= 2) * sizeof *c);
            if (!c) loom_panic(__FILE__, __LINE__, "out of memory");
            c[n++] = (cand_t){scores[i], (uint32_t)i, (uint32_t)l->val, (uint32_t)r->val};
        }
    }
    qsort(c, n, sizeof *c, by_score);
    *out = loom_malloc((n + 1) * sizeof **out);
    for (size_t k = 0; k < n; k++) {
        (*out)[k][0] = c[k].a;
        (*out)[k][1] = c[k].b;
    }
    free(c);
    loom_strmap_free(&map);
    return n;
}

/* The style of a GGUF tokenizer.ggml.model / tokenizer.ggml.pre pair. */
static loom_status gguf_style(const loom_tokenizer_vocab_t *g, const char *origin, loom_tok_style_t *st) {
    *st = loom_tok_style_gpt2();
    const char *pre = g->pre ? g->pre : "default";
    if (g->model && !strcmp(g->model, "llama")) {
        st->sentencepiece = 1;
        st->pretok = LOOM_PRETOK_NONE;
        st->prepend = g->add_space_prefix ? LOOM_PREPEND_NORMALIZER : LOOM_PREPEND_NONE;
        st->strip_decode = g->add_space_prefix ? 1 : 0;
    } else if (!g->model || strcmp(g->model, "gpt2")) {
        return loom_error(LOOM_EUNAVAIL, "%s: tokenizer model \"%s\" is not supported; loom reads \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece-style BPE)",
                          origin, g->model ? g->model : "(none)");
    } else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        st->pretok = LOOM_PRETOK_LLAMA3;
        st->ignore_merges = 1;
    } else if (!strcmp(pre, "qwen2")) {
        st->pretok = LOOM_PRETOK_QWEN2;
        st->nfc = 1; /* as Qwen2's tokenizer.json, which the GGUF was converted from */
    } else if (!strcmp(pre, "smollm")) {
        st->pretok = LOOM_PRETOK_DIGITS;
    } else if (strcmp(pre, "default") && strcmp(pre, "gpt2") && strcmp(pre, "gpt-2")) {
        return loom_error(LOOM_EUNAVAIL, "%s: pre-tokenizer \"%s\" is not supported; loom implements default/gpt2, llama-bpe, qwen2 and smollm", origin, pre);
    }
    st->bos = g->bos;
    st->eos = g->eos;
    st->unk = st->sentencepiece ? g->unk : -1;
    st->add_bos = g->add_bos;
    st->add_eos = g->add_eos;
    return LOOM_OK;
}

loom_tokenizer_gguf_t loom_tokenizer_gguf(const loom_tokenizer_t *t) {
    static const char *const pre[] = {[LOOM_PRETOK_GPT2] = "gpt-2", [LOOM_PRETOK_LLAMA3] = "llama-bpe",
                                      [LOOM_PRETOK_QWEN2] = "qwen2", [LOOM_PRETOK_DIGITS] = "smollm"};
    const loom_tok_style_t *st = &t->st;
    int sp = st->sentencepiece, k = st->pretok;
    return (loom_tokenizer_gguf_t){
        .model = sp ? "llama" : "gpt2", .pre = sp ? NULL : k > 0 && k < (int)(sizeof pre / sizeof *pre) ? pre[k] : "default",
        .bos = st->bos, .eos = loom_tokenizer_eos(t), .unk = sp ? st->unk : -1, .add_bos = st->add_bos, .add_eos = st->add_eos,
        .add_space_prefix = sp && st->prepend != LOOM_PREPEND_NONE};
}

int loom_tokenizer_gguf_type(const loom_tokenizer_t *t, uint32_t id) {
    uint8_t f = t->special[id];
    if (f & LOOM_TOK_BYTE) return 6;
    if ((int)id == t->st.unk) return 2;
    if (f & LOOM_TOK_ADDED) return f & LOOM_TOK_PLAIN ? 4 : 3;
    return 1;
}

void loom_tokenizer_gguf_scores(const loom_tokenizer_t *t, float *scores) {
    for (int i = 0; i < t->vocab_size; i++) scores[i] = -1e9f;
    for (size_t r = t->nmerges; r-- > 0;) { /* from the last: the first merge making a token wins */
        const uint32_t *m = t->merges[r];
        uint64_t *v = loom_pairmap_get(&t->ranks, (uint64_t)m[0] << 32 | m[1]);
        if (v) scores[(uint32_t)*v] = -(float)r - 1.0f;
    }
}

/* Token i of a GGUF vocabulary into v by its type. */
static loom_status gguf_token(vocab_t *v, const char *origin, const loom_tokenizer_vocab_t *g, int i) {
    const char *name = g->tokens[i];
    int type = g->types ? g->types[i] : 1;
    if (!name || !name[0]) return loom_error(LOOM_EFORMAT, "%s: token %d has no text", origin, i);
    if (type == 2 || type == 3 || type == 4) /* unknown, control, user defined: matched in the raw text */
        return vocab_set(v, origin, i, (const unsigned char *)name, strlen(name), (uint8_t)(LOOM_TOK_ADDED | (type == 4 ? LOOM_TOK_PLAIN : 0)));
    if (type == 6 && (!v->sp || byte_token_value(name) < 0))
        return loom_error(LOOM_EFORMAT, "%s: token %d \"%s\" has the byte type but is not a <0xNN> token of a \"llama\" vocabulary", origin, i, name);
    return vocab_set_name(v, origin, i, name);
}

loom_status loom_tokenizer_from_vocab(loom_tokenizer_t **out, const loom_tokenizer_vocab_t *g) {
    *out = NULL;
    const char *origin = g->origin ? g->origin : "tokenizer vocabulary";
    loom_tok_style_t st;
    LOOM_TRY(gguf_style(g, origin, &st));
    if (g->n <= 0 || !g->tokens) return loom_error(LOOM_EFORMAT, "%s: the vocabulary is empty", origin);
    vocab_t v = {.sp = st.sentencepiece};
    vocab_alloc(&v, g->n);
    loom_status s = LOOM_OK;
    for (int i = 0; i < g->n && s == LOOM_OK; i++) s = gguf_token(&v, origin, g, i);
    size_t nm = g->nmerges;
    uint32_t(*ids)[2] = NULL;
    const char **a = loom_calloc(nm + 1, sizeof *a), **b = loom_calloc(nm + 1, sizeof *b);
    char **own = loom_calloc(nm + 1, sizeof *own);
    for (size_t k = 0; k < nm && s == LOOM_OK; k++) {
        own[k] = loom_strdup(g->merges[k] ? g->merges[k] : "");
        char *sp = strchr(own[k], ' ');
        if (!sp || sp == own[k] || !sp[1] || strchr(sp + 1, ' '))
            s = loom_error(LOOM_EFORMAT, "%s: merge %zu \"%s\": expected two tokens separated by one space", origin, k, own[k]);
        else *sp = 0, a[k] = own[k], b[k] = sp + 1;
    }
    if (s == LOOM_OK && nm == 0 && st.sentencepiece && g->scores) {
        nm = merges_from_scores(&v, g->scores, &ids);
    } else {
        ids = loom_malloc((nm + 1) * sizeof *ids);
        if (s == LOOM_OK) s = merges_to_ids(origin, &v, a, b, nm, 0, ids);
    }
    if (s == LOOM_OK) s = build_from(out, origin, NULL, &v, ids, nm, 0, &st);
    for (size_t k = 0; k < g->nmerges; k++) free(own[k]);
    free(own), free(a), free(b), free(ids);
    vocab_free(&v);
    return s;
}
