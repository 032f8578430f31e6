#define _GNU_SOURCE
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_build.h"
#include "bpe_map.h"
#include "bpe_pretok.h"

#define EOT_TEXT "<|endoftext|>"
#define NO_RANK UINT64_MAX

struct loom_tokenizer {
    int vocab_size;
    int eot;                  /* id of "<|endoftext|>" or -1 */
    unsigned char *bytes;     /* token bytes, all ids back to back */
    size_t *off;              /* (vocab_size + 1) token id -> offset into bytes */
    uint8_t *special;         /* (vocab_size) */
    uint32_t byte_id[256];    /* id of each single-byte token */
    size_t nmerges;
    uint32_t (*merges)[2];    /* (nmerges, 2) in rank order */
    loom_pairmap_t ranks;     /* pair -> rank << 32 | merged id */
    loom_strmap_t vocab;      /* token bytes -> id (non-special tokens) */
    int nspecial;
    uint32_t *special_ids;    /* (nspecial) longest text first */
    int add_prefix_space, ignore_merges, use_regex;
    uint64_t hash;
};

/* ---- construction ------------------------------------------------------ */

static void free_partial(loom_tokenizer_t *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->special);
    free(t->merges);
    free(t->special_ids);
    if (t->ranks.keys) loom_pairmap_free(&t->ranks);
    if (t->vocab.e) loom_strmap_free(&t->vocab);
    free(t);
}

void loom_tokenizer_free(loom_tokenizer_t *t) { free_partial(t); }

static size_t tok_len(const loom_tokenizer_t *t, uint32_t id) { return t->off[id + 1] - t->off[id]; }

/* Printable form of token bytes for messages (escapes non-printables). */
static const char *show(const unsigned char *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < cap; i++) {
        if (s[i] >= 32 && s[i] < 127 && s[i] != '"' && s[i] != '\\') buf[k++] = (char)s[i];
        else k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", s[i]);
    }
    buf[k] = 0;
    return buf;
}

static int by_length_desc(const void *a, const void *b, void *tok) {
    size_t la = tok_len(tok, *(const uint32_t *)a), lb = tok_len(tok, *(const uint32_t *)b);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static void compute_hash(loom_tokenizer_t *t) {
    int canonical = t->vocab_size == 257 && t->eot == 256 && t->nmerges == 0 && t->nspecial == 1 && !t->add_prefix_space;
    for (int b = 0; b < 256 && canonical; b++) canonical = t->byte_id[b] == (uint32_t)b;
    if (canonical) { /* the byte-level tokenizer's fingerprint from before BPE */
        uint64_t h = loom_fnv1a("bytes", 5, LOOM_FNV_INIT);
        t->hash = loom_fnv1a(&t->vocab_size, sizeof t->vocab_size, h);
        return;
    }
    uint64_t h = loom_fnv1a("bpe1", 4, LOOM_FNV_INIT);
    for (int i = 0; i < t->vocab_size; i++) {
        uint64_t n = tok_len(t, (uint32_t)i);
        h = loom_fnv1a(&n, sizeof n, h);
        h = loom_fnv1a(t->bytes + t->off[i], n, h);
        h = loom_fnv1a(&t->special[i], 1, h);
    }
    h = loom_fnv1a(t->merges, t->nmerges * sizeof *t->merges, h);
    int flags[3] = {t->add_prefix_space, t->ignore_merges, t->use_regex};
    t->hash = loom_fnv1a(flags, sizeof flags, h);
}

static loom_status merge_error(const loom_bpe_spec_t *sp, size_t i, const char *fmt, const char *a, const char *b) {
    char where[64];
    if (sp->merge_line0 > 0) snprintf(where, sizeof where, "line %ld", sp->merge_line0 + (long)i);
    else snprintf(where, sizeof where, "merge %zu", i);
    char what[256];
    snprintf(what, sizeof what, fmt, a, b);
    return loom_error(LOOM_EFORMAT, "%s: %s: %s", sp->merges_origin ? sp->merges_origin : sp->origin, where, what);
}

/* The tokens of `sp` into t (bytes, offsets, the vocabulary map, specials,
 * byte ids); errors name the bad id. */
static loom_status build_vocab(loom_tokenizer_t *t, const loom_bpe_spec_t *sp) {
    int V = sp->vocab_size;
    t->off = loom_malloc(((size_t)V + 1) * sizeof *t->off);
    t->special = loom_calloc((size_t)V, 1);
    size_t total = 0;
    for (int i = 0; i < V; i++) total += sp->tok_len[i];
    t->bytes = loom_malloc(total ? total : 1);
    loom_strmap_init(&t->vocab, (size_t)V);
    for (int b = 0; b < 256; b++) t->byte_id[b] = UINT32_MAX;
    size_t o = 0;
    char sb[160];
    for (int i = 0; i < V; i++) {
        size_t n = sp->tok_len[i];
        t->off[i] = o;
        memcpy(t->bytes + o, sp->tok[i], n);
        o += n;
        t->special[i] = sp->special[i];
        if (n == 0) return loom_error(LOOM_EFORMAT, "%s: token id %d is empty or missing; ids must run 0..%d without gaps", sp->origin, i, V - 1);
        if (t->special[i]) {
            t->nspecial++;
            if (n == strlen(EOT_TEXT) && !memcmp(sp->tok[i], EOT_TEXT, n)) t->eot = i;
            continue;
        }
        int added;
        loom_strmap_entry_t *e = loom_strmap_put(&t->vocab, sp->tok[i], n, loom_bytes_hash(sp->tok[i], n), (uint64_t)i, &added);
        if (!added)
            return loom_error(LOOM_EFORMAT, "%s: ids %d and %d are the same token \"%s\"", sp->origin, (int)e->val, i, show(sp->tok[i], n, sb, sizeof sb));
        if (n == 1) t->byte_id[sp->tok[i][0]] = (uint32_t)i;
    }
    t->off[V] = o;
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] == UINT32_MAX)
            return loom_error(LOOM_EFORMAT, "%s: no token for byte 0x%02x; a byte-level BPE vocabulary has all 256 bytes", sp->origin, b);
    t->special_ids = loom_malloc(((size_t)t->nspecial + 1) * sizeof *t->special_ids);
    int k = 0;
    for (int i = 0; i < V; i++)
        if (t->special[i]) t->special_ids[k++] = (uint32_t)i;
    qsort_r(t->special_ids, (size_t)t->nspecial, sizeof *t->special_ids, by_length_desc, t);
    return LOOM_OK;
}

/* Merge i of `sp` (ids a, b) into t's ranks; `cat` is scratch. */
static loom_status add_merge(loom_tokenizer_t *t, const loom_bpe_spec_t *sp, size_t i, unsigned char **cat, size_t *catcap) {
    uint32_t a = sp->merges[i][0], b = sp->merges[i][1];
    char s1[160], s2[160];
    if (a >= (uint32_t)t->vocab_size || b >= (uint32_t)t->vocab_size || t->special[a] || t->special[b]) {
        snprintf(s1, sizeof s1, "%u", a);
        snprintf(s2, sizeof s2, "%u", b);
        return merge_error(sp, i, "merge of ids %s and %s: not regular tokens of the vocabulary", s1, s2);
    }
    size_t la = tok_len(t, a), lb = tok_len(t, b);
    if (la + lb > *catcap) {
        *catcap = 2 * (la + lb);
        *cat = realloc(*cat, *catcap);
        if (!*cat) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    memcpy(*cat, t->bytes + t->off[a], la);
    memcpy(*cat + la, t->bytes + t->off[b], lb);
    loom_strmap_entry_t *e = loom_strmap_get(&t->vocab, *cat, la + lb, loom_bytes_hash(*cat, la + lb));
    show(t->bytes + t->off[a], la, s1, sizeof s1);
    show(t->bytes + t->off[b], lb, s2, sizeof s2);
    if (!e) return merge_error(sp, i, "merge \"%s\" + \"%s\": the merged token is not in the vocabulary", s1, s2);
    if (loom_pairmap_get(&t->ranks, LOOM_PAIR(a, b))) return merge_error(sp, i, "merge \"%s\" + \"%s\" appears twice", s1, s2);
    loom_pairmap_put(&t->ranks, LOOM_PAIR(a, b), ((uint64_t)i << 32) | e->val);
    t->merges[i][0] = a;
    t->merges[i][1] = b;
    return LOOM_OK;
}

static loom_status build_merges(loom_tokenizer_t *t, const loom_bpe_spec_t *sp) {
    t->nmerges = sp->nmerges;
    t->merges = loom_malloc((sp->nmerges ? sp->nmerges : 1) * sizeof *t->merges);
    loom_pairmap_init(&t->ranks, sp->nmerges);
    unsigned char *cat = NULL;
    size_t catcap = 0;
    loom_status s = LOOM_OK;
    for (size_t i = 0; i < sp->nmerges && s == LOOM_OK; i++) s = add_merge(t, sp, i, &cat, &catcap);
    free(cat);
    return s;
}

loom_status loom_tokenizer_build(loom_tokenizer_t **out, const loom_bpe_spec_t *sp) {
    *out = NULL;
    int V = sp->vocab_size;
    if (V < 256) return loom_error(LOOM_EFORMAT, "%s: %d tokens; a byte-level vocabulary needs at least 256", sp->origin, V);
    loom_tokenizer_t *t = loom_calloc(1, sizeof *t);
    t->vocab_size = V;
    t->eot = -1;
    t->add_prefix_space = sp->add_prefix_space;
    t->ignore_merges = sp->ignore_merges;
    t->use_regex = sp->use_regex;
    loom_status s = build_vocab(t, sp);
    if (s == LOOM_OK) s = build_merges(t, sp);
    if (s != LOOM_OK) {
        free_partial(t);
        return s;
    }
    compute_hash(t);
    *out = t;
    return LOOM_OK;
}

loom_status loom_tokenizer_bytes(loom_tokenizer_t **out) {
    unsigned char bytes[256];
    const unsigned char *tok[257];
    size_t len[257];
    uint8_t special[257] = {0};
    for (int b = 0; b < 256; b++) {
        bytes[b] = (unsigned char)b;
        tok[b] = &bytes[b];
        len[b] = 1;
    }
    tok[256] = (const unsigned char *)EOT_TEXT;
    len[256] = strlen(EOT_TEXT);
    special[256] = 1;
    loom_bpe_spec_t sp = {.vocab_size = 257, .tok = tok, .tok_len = len, .special = special,
                          .use_regex = 1, .origin = "byte-level tokenizer"};
    return loom_tokenizer_build(out, &sp);
}

int loom_tokenizer_vocab_size(const loom_tokenizer_t *t) { return t->vocab_size; }
int loom_tokenizer_eot(const loom_tokenizer_t *t) { return t->eot; }
uint64_t loom_tokenizer_hash(const loom_tokenizer_t *t) { return t->hash; }
int loom_tokenizer_merges(const loom_tokenizer_t *t) { return (int)t->nmerges; }
int loom_tokenizer_nspecial(const loom_tokenizer_t *t) { return t->nspecial; }

const unsigned char *loom_tokenizer_token(const loom_tokenizer_t *t, uint32_t id, size_t *len) {
    if (id >= (uint32_t)t->vocab_size) return NULL;
    *len = tok_len(t, id);
    return t->bytes + t->off[id];
}

const char *loom_tokenizer_special(const loom_tokenizer_t *t, int i, uint32_t *id) {
    static _Thread_local char buf[256];
    uint32_t s = t->special_ids[i];
    size_t n = tok_len(t, s);
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, t->bytes + t->off[s], n);
    buf[n] = 0;
    if (id) *id = s;
    return buf;
}

/* ---- ids ----------------------------------------------------------------- */

void loom_ids_push(loom_ids_t *ids, uint32_t id) {
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? 2 * ids->cap : 1024;
        uint32_t *v = realloc(ids->v, ids->cap * sizeof *v);
        if (!v) loom_panic(__FILE__, __LINE__, "out of memory for %zu token ids", ids->cap);
        ids->v = v;
    }
    ids->v[ids->n++] = id;
}

void loom_ids_free(loom_ids_t *ids) {
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

/* ---- encoding ------------------------------------------------------------ */

/* The word cache is dropped when it grows past these, which bounds an
 * encoder's memory on corpora with endless distinct words. */
#define CACHE_MAX_WORDS (1u << 18)
#define CACHE_MAX_IDS (1u << 22)
/* Words longer than this use the heap-ordered merge loop. */
#define SHORT_WORD 128

struct loom_encoder {
    const loom_tokenizer_t *t;
    loom_strmap_t cache;      /* word bytes -> offset << 24 | count into cache_ids */
    loom_ids_t cache_ids;
    uint32_t *sym;            /* scratch: symbol ids */
    uint64_t *rank;           /* scratch: packed rank of (sym[i], sym[i+1]) */
    int32_t *prev, *next;     /* scratch for long words */
    uint64_t *heap;
    size_t cap;
    size_t *special_at;       /* (nspecial) next known occurrence of each special */
};

loom_encoder_t *loom_encoder_new(const loom_tokenizer_t *t) {
    loom_encoder_t *e = loom_calloc(1, sizeof *e);
    e->t = t;
    loom_strmap_init(&e->cache, 4096);
    e->special_at = loom_calloc((size_t)t->nspecial + 1, sizeof *e->special_at);
    return e;
}

void loom_encoder_free(loom_encoder_t *e) {
    if (!e) return;
    loom_strmap_free(&e->cache);
    loom_ids_free(&e->cache_ids);
    free(e->sym);
    free(e->rank);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e->special_at);
    free(e);
}

static void scratch(loom_encoder_t *e, size_t n) {
    if (n <= e->cap) return;
    e->cap = n * 2;
    free(e->sym);
    free(e->rank);
    free(e->prev);
    free(e->next);
    free(e->heap);
    e->sym = loom_malloc(e->cap * sizeof *e->sym);
    e->rank = loom_malloc(e->cap * sizeof *e->rank);
    e->prev = loom_malloc(e->cap * sizeof *e->prev);
    e->next = loom_malloc(e->cap * sizeof *e->next);
    e->heap = loom_malloc(e->cap * 2 * sizeof *e->heap);
}

static inline uint64_t pair_rank(const loom_tokenizer_t *t, uint32_t a, uint32_t b) {
    const uint64_t *r = loom_pairmap_get(&t->ranks, LOOM_PAIR(a, b));
    return r ? *r : NO_RANK;
}

/* Lowest rank first, leftmost first among equals: O(n^2), fast for short words. */
static size_t bpe_short(loom_encoder_t *e, size_t m) {
    const loom_tokenizer_t *t = e->t;
    uint32_t *s = e->sym;
    uint64_t *r = e->rank;
    for (size_t i = 0; i + 1 < m; i++) r[i] = pair_rank(t, s[i], s[i + 1]);
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (r[i] < r[best]) best = i;
        if (r[best] == NO_RANK) break;
        s[best] = (uint32_t)r[best];
        memmove(s + best + 1, s + best + 2, (m - best - 2) * sizeof *s);
        memmove(r + best + 1, r + best + 2, (m - best - 2) * sizeof *r);
        m--;
        if (best > 0) r[best - 1] = pair_rank(t, s[best - 1], s[best]);
        if (best + 1 < m) r[best] = pair_rank(t, s[best], s[best + 1]);
    }
    return m;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* The same order with a heap of (rank, position): O(n log n) for long words. */
static size_t bpe_long(loom_encoder_t *e, size_t m) {
    const loom_tokenizer_t *t = e->t;
    uint32_t *s = e->sym;
    int32_t *pv = e->prev, *nx = e->next;
    uint64_t *h = e->heap;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        pv[i] = (int32_t)i - 1;
        nx[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < m; i++) {
        uint64_t r = pair_rank(t, s[i], s[i + 1]);
        if (r != NO_RANK) heap_push(h, &hn, (r & 0xffffffff00000000ull) | i);
    }
    while (hn > 0) {
        uint64_t v = heap_pop(h, &hn);
        uint32_t pos = (uint32_t)v, rank = (uint32_t)(v >> 32);
        if (s[pos] == UINT32_MAX || nx[pos] < 0) continue;
        int32_t right = nx[pos];
        uint64_t r = pair_rank(t, s[pos], s[right]);
        if (r == NO_RANK || (uint32_t)(r >> 32) != rank) continue;
        s[pos] = (uint32_t)r;
        s[right] = UINT32_MAX;
        nx[pos] = nx[right];
        if (nx[pos] >= 0) pv[nx[pos]] = (int32_t)pos;
        if (pv[pos] >= 0) {
            uint64_t l = pair_rank(t, s[pv[pos]], s[pos]);
            if (l != NO_RANK) heap_push(h, &hn, (l & 0xffffffff00000000ull) | (uint32_t)pv[pos]);
        }
        if (nx[pos] >= 0) {
            uint64_t q = pair_rank(t, s[pos], s[nx[pos]]);
            if (q != NO_RANK) heap_push(h, &hn, (q & 0xffffffff00000000ull) | pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = nx[i]) s[k++] = s[i];
    return k;
}

/* Encode one pre-token. */
static void encode_word(loom_encoder_t *e, const unsigned char *w, size_t n, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    if (n == 1 || t->nmerges == 0) {
        for (size_t i = 0; i < n; i++) loom_ids_push(out, t->byte_id[w[i]]);
        return;
    }
    uint64_t h = loom_bytes_hash(w, n);
    loom_strmap_entry_t *c = loom_strmap_get(&e->cache, w, n, h);
    if (c) {
        size_t off = c->val >> 24, k = c->val & 0xffffff;
        for (size_t i = 0; i < k; i++) loom_ids_push(out, e->cache_ids.v[off + i]);
        return;
    }
    if (t->ignore_merges) {
        loom_strmap_entry_t *v = loom_strmap_get(&t->vocab, w, n, h);
        if (v) {
            loom_ids_push(out, (uint32_t)v->val);
            return;
        }
    }
    scratch(e, n);
    for (size_t i = 0; i < n; i++) e->sym[i] = t->byte_id[w[i]];
    size_t m = n <= SHORT_WORD ? bpe_short(e, n) : bpe_long(e, n);
    for (size_t i = 0; i < m; i++) loom_ids_push(out, e->sym[i]);
    if (m >= 0xffffff) return;
    if (e->cache.n >= CACHE_MAX_WORDS || e->cache_ids.n + m > CACHE_MAX_IDS) {
        loom_strmap_clear(&e->cache);
        e->cache_ids.n = 0;
    }
    loom_strmap_put(&e->cache, w, n, h, ((uint64_t)e->cache_ids.n << 24) | m, NULL);
    for (size_t i = 0; i < m; i++) loom_ids_push(&e->cache_ids, e->sym[i]);
}

/* Encode text that holds no special token. */
static void encode_plain(loom_encoder_t *e, const unsigned char *s, size_t len, int at_start, loom_ids_t *out) {
    if (len == 0) return;
    const loom_tokenizer_t *t = e->t;
    unsigned char *tmp = NULL;
    if (t->add_prefix_space && at_start && s[0] != ' ') {
        tmp = loom_malloc(len + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, len);
        s = tmp;
        len++;
    }
    if (!t->use_regex) {
        encode_word(e, s, len, out);
    } else {
        for (size_t i = 0; i < len;) {
            size_t j = loom_pretok_next(s, len, i);
            encode_word(e, s + i, j - i, out);
            i = j;
        }
    }
    free(tmp);
}

void loom_encoder_encode(loom_encoder_t *e, const char *text, size_t len, int at_start, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    const unsigned char *s = (const unsigned char *)text;
    for (int k = 0; k < t->nspecial; k++) e->special_at[k] = 0;
    size_t i = 0;
    while (i < len) {
        /* The leftmost special in the text, the longest among those at one place. */
        size_t best = len;
        int which = -1;
        for (int k = 0; k < t->nspecial; k++) {
            uint32_t id = t->special_ids[k];
            size_t n = tok_len(t, id);
            if (e->special_at[k] < i || (e->special_at[k] == 0 && i == 0)) {
                const unsigned char *p = memmem(s + i, len - i, t->bytes + t->off[id], n);
                e->special_at[k] = p ? (size_t)(p - s) : SIZE_MAX;
            }
            if (e->special_at[k] < best) {
                best = e->special_at[k];
                which = k;
            }
        }
        encode_plain(e, s + i, best - i, at_start, out);
        if (which < 0) break;
        uint32_t id = t->special_ids[which];
        loom_ids_push(out, id);
        i = best + tok_len(t, id);
        at_start = 1;
    }
}

loom_status loom_tokenizer_encode(const loom_tokenizer_t *t, const char *text, size_t len,
                                  uint32_t **ids, size_t *n) {
    loom_encoder_t *e = loom_encoder_new(t);
    loom_ids_t out = {0};
    loom_encoder_encode(e, text, len, 1, &out);
    loom_encoder_free(e);
    if (!out.v) out.v = loom_malloc(sizeof *out.v);
    *ids = out.v;
    *n = out.n;
    return LOOM_OK;
}

loom_status loom_tokenizer_decode(const loom_tokenizer_t *t, const uint32_t *ids, size_t n,
                                  char **text, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= (uint32_t)t->vocab_size)
            return loom_error(LOOM_EINVAL, "token %u at position %zu is beyond the vocabulary (%d)", ids[i], i, t->vocab_size);
        total += tok_len(t, ids[i]);
    }
    char *out = loom_malloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m = tok_len(t, ids[i]);
        memcpy(out + k, t->bytes + t->off[ids[i]], m);
        k += m;
    }
    out[k] = 0;
    *text = out;
    *len = k;
    return LOOM_OK;
}

/* ---- files --------------------------------------------------------------- */

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

/* The byte-level name -> bytes (into out, at most n bytes); -1 when a
 * character is outside the byte map. */
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

static cJSON *added_token(int id, const unsigned char *content, size_t n) {
    cJSON *a = cJSON_CreateObject();
    char *c = loom_malloc(n + 1);
    memcpy(c, content, n);
    c[n] = 0;
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", c);
    free(c);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", 1);
    return a;
}

static cJSON *byte_level(const char *type, int add_prefix_space, int use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

loom_status loom_tokenizer_save(const loom_tokenizer_t *t, const char *path) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->vocab_size; i++)
        if (t->special[i]) cJSON_AddItemToArray(added, added_token(i, t->bytes + t->off[i], tok_len(t, (uint32_t)i)));
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", byte_level("ByteLevel", t->add_prefix_space, t->use_regex));
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", byte_level("ByteLevel", 1, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; i < t->vocab_size; i++) {
        size_t n = tok_len(t, (uint32_t)i);
        char *name;
        if (t->special[i]) {
            name = loom_malloc(n + 1);
            memcpy(name, t->bytes + t->off[i], n);
            name[n] = 0;
        } else {
            name = bytes_to_name(t->bytes + t->off[i], n);
        }
        cJSON_AddNumberToObject(vocab, name, i);
        free(name);
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (size_t i = 0; i < t->nmerges; i++) {
        uint32_t a = t->merges[i][0], b = t->merges[i][1];
        char *na = bytes_to_name(t->bytes + t->off[a], tok_len(t, a));
        char *nb = bytes_to_name(t->bytes + t->off[b], tok_len(t, b));
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
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return loom_error(LOOM_ENOMEM, "%s: could not format the tokenizer as JSON", path);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* Line and column of byte `at` in text, for parse errors. */
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
typedef struct {
    int n;                  /* vocab size (max id + 1) */
    unsigned char **tok;
    size_t *len;
    uint8_t *special;
} vocab_t;

static void vocab_free(vocab_t *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->special);
}

static loom_status vocab_set(vocab_t *v, const char *path, long id, const unsigned char *s, size_t n, int special) {
    if (id < 0 || id >= v->n) return loom_error(LOOM_EFORMAT, "%s: token id %ld is out of range", path, id);
    if (v->tok[id]) {
        if (v->len[id] == n && !memcmp(v->tok[id], s, n) && v->special[id] == special) return LOOM_OK;
        if (special && !v->special[id]) { /* an added token also listed in the vocab */
            free(v->tok[id]);
        } else {
            return loom_error(LOOM_EFORMAT, "%s: token id %ld is given twice", path, id);
        }
    }
    v->tok[id] = loom_malloc(n ? n : 1);
    memcpy(v->tok[id], s, n);
    v->len[id] = n;
    v->special[id] = (uint8_t)special;
    return LOOM_OK;
}

static int json_id(const cJSON *x, long *id) {
    if (!cJSON_IsNumber(x)) return 0;
    double d = x->valuedouble;
    if (d < 0 || d > 4294967294.0 || d != (double)(long)d) return 0;
    *id = (long)d;
    return 1;
}

/* Fill *v from a vocab object (name -> id) plus specials (content, id);
 * names of specials are taken as their text, the others through the byte map. */
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
        const char *flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, flags[f])))
                return loom_error(LOOM_EUNAVAIL, "%s: added token \"%s\" sets %s, which loom does not support", path, c->valuestring, flags[f]);
        if (id > maxid) maxid = id;
    }
    if (maxid + 1 > 0x7fffffff) return loom_error(LOOM_EFORMAT, "%s: token id %ld is too large", path, maxid);
    v->n = (int)(maxid + 1);
    v->tok = loom_calloc((size_t)v->n + 1, sizeof *v->tok);
    v->len = loom_calloc((size_t)v->n + 1, sizeof *v->len);
    v->special = loom_calloc((size_t)v->n + 1, 1);
    cJSON_ArrayForEach(x, added) {
        json_id(cJSON_GetObjectItemCaseSensitive(x, "id"), &id);
        const char *c = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
        LOOM_TRY(vocab_set(v, path, id, (const unsigned char *)c, strlen(c), 1));
    }
    unsigned char *buf = NULL;
    size_t cap = 0;
    cJSON_ArrayForEach(x, vocab) {
        json_id(x, &id);
        if (v->special[id]) continue;
        size_t n = strlen(x->string);
        if (n + 1 > cap) {
            cap = 2 * (n + 1);
            free(buf);
            buf = loom_malloc(cap);
        }
        long k = name_to_bytes(x->string, buf);
        if (k <= 0) {
            free(buf);
            return loom_error(LOOM_EFORMAT, "%s: vocabulary entry \"%s\" (id %ld) is not a byte-level token (a character outside GPT-2's byte map)", path, x->string, id);
        }
        loom_status s = vocab_set(v, path, id, buf, (size_t)k, 0);
        if (s != LOOM_OK) {
            free(buf);
            return s;
        }
    }
    free(buf);
    return LOOM_OK;
}

/* Resolve "a b" (or ["a", "b"]) merges to id pairs through the names. */
static loom_status merges_to_ids(const char *path, const vocab_t *v, const char *const *a, const char *const *b, size_t n,
                                 long line0, uint32_t (*out)[2]) {
    loom_strmap_t names;
    loom_strmap_init(&names, (size_t)v->n);
    for (int i = 0; i < v->n; i++) {
        if (!v->tok[i] || v->special[i]) continue;
        char *nm = bytes_to_name(v->tok[i], v->len[i]);
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
                              long line0, int prefix, int ignore, int regex) {
    const unsigned char **tok = loom_malloc(((size_t)v->n + 1) * sizeof *tok);
    for (int i = 0; i < v->n; i++) tok[i] = v->tok[i] ? v->tok[i] : (const unsigned char *)"";
    loom_bpe_spec_t sp = {.vocab_size = v->n, .tok = tok, .tok_len = v->len, .special = v->special,
                          .merges = (const uint32_t(*)[2])merges, .nmerges = nm, .add_prefix_space = prefix,
                          .ignore_merges = ignore, .use_regex = regex, .origin = path, .merges_origin = mpath,
                          .merge_line0 = line0};
    loom_status s = loom_tokenizer_build(out, &sp);
    free(tok);
    return s;
}

/* The pre-tokenizer must be ByteLevel (alone or as the only step of a
 * Sequence); reads its add_prefix_space and use_regex. */
static loom_status check_pre_tokenizer(const char *path, const cJSON *pre, int *prefix, int *regex) {
    *prefix = 0;
    *regex = 1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence")) {
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        if (cJSON_GetArraySize(steps) != 1)
            return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer is a Sequence of %d steps; loom supports ByteLevel alone", path, cJSON_GetArraySize(steps));
        pre = cJSON_GetArrayItem(steps, 0);
        type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel"))
        return loom_error(LOOM_EUNAVAIL, "%s: pre_tokenizer is %s; loom supports byte-level BPE (ByteLevel) only", path,
                          cJSON_IsString(type) ? type->valuestring : "missing");
    *prefix = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
    *regex = r ? cJSON_IsTrue(r) : 1;
    return LOOM_OK;
}

static loom_status load_json(loom_tokenizer_t **out, const char *path, cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model) || !cJSON_IsObject(vocab) || !cJSON_IsArray(merges) ||
        (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE"))))
        return loom_error(LOOM_EFORMAT, "%s: not a BPE tokenizer.json (needs model.type \"BPE\", model.vocab and model.merges)", path);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        return loom_error(LOOM_EUNAVAIL, "%s: normalizer %s is not supported; loom reads byte-level BPE without a normalizer", path,
                          cJSON_IsString(nt) ? nt->valuestring : "?");
    }
    const char *unsupported[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 3; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, unsupported[k]);
        if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0]))
            return loom_error(LOOM_EUNAVAIL, "%s: model.%s is set; loom does not support it", path, unsupported[k]);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return loom_error(LOOM_EUNAVAIL, "%s: model.byte_fallback is set (a SentencePiece-style BPE); loom supports byte-level BPE", path);
    int prefix = 0, regex = 1;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pre || cJSON_IsNull(pre))
        return loom_error(LOOM_EUNAVAIL, "%s: no pre_tokenizer; loom supports byte-level BPE (ByteLevel pre-tokenizer) only", path);
    LOOM_TRY(check_pre_tokenizer(path, pre, &prefix, &regex));
    int ignore = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) return loom_error(LOOM_EFORMAT, "%s: added_tokens is not an array", path);

    vocab_t v = {0};
    loom_status s = vocab_from_json(&v, path, vocab, cJSON_IsArray(added) ? added : NULL);
    size_t nm = (size_t)cJSON_GetArraySize(merges);
    const char **a = loom_calloc(nm + 1, sizeof *a), **b = loom_calloc(nm + 1, sizeof *b);
    char **own = loom_calloc(nm + 1, sizeof *own);
    uint32_t(*ids)[2] = loom_malloc((nm + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (s != LOOM_OK) break;
        if (cJSON_IsString(m)) {
            own[i] = loom_strdup(m->valuestring);
            char *sp = strchr(own[i], ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == own[i] || !sp[1]) {
                s = loom_error(LOOM_EFORMAT, "%s: merge %zu \"%s\": expected two tokens separated by one space", path, i, m->valuestring);
                break;
            }
            *sp = 0;
            a[i] = own[i];
            b[i] = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a[i] = cJSON_GetArrayItem(m, 0)->valuestring;
            b[i] = cJSON_GetArrayItem(m, 1)->valuestring;
        } else {
            s = loom_error(LOOM_EFORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i);
            break;
        }
        i++;
    }
    if (s == LOOM_OK) s = merges_to_ids(path, &v, a, b, nm, 0, ids);
    if (s == LOOM_OK) s = build_from(out, path, NULL, &v, ids, nm, 0, prefix, ignore, regex);
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

char *loom_tokenizer_token_name(const loom_tokenizer_t *t, uint32_t id) {
    size_t n = tok_len(t, id);
    if (!t->special[id]) return bytes_to_name(t->bytes + t->off[id], n);
    char *name = loom_malloc(n + 1);
    memcpy(name, t->bytes + t->off[id], n);
    name[n] = 0;
    return name;
}

void loom_tokenizer_merge(const loom_tokenizer_t *t, size_t i, uint32_t *a, uint32_t *b) {
    *a = t->merges[i][0];
    *b = t->merges[i][1];
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
    if (s == LOOM_OK) s = build_from(out, vocab_path, merges_path, &v, ids, n, first_line, 0, 0, 1);
    free(ids);
    free(a);
    free(b);
    free(text);
    vocab_free(&v);
    return s;
}

int loom_text_sink_emit(int token, void *vsink) {
    loom_text_sink_t *sink = vsink;
    uint32_t id = (uint32_t)token;
    char *text = NULL;
    size_t len = 0;
    if (loom_tokenizer_decode(sink->tok, &id, 1, &text, &len) == LOOM_OK) {
        fwrite(text, 1, len, sink->out);
        fflush(sink->out);
        free(text);
    }
    return 0;
}
