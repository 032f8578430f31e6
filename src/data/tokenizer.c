#define _GNU_SOURCE
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "bpe_build.h"
#include "bpe_map.h"
#include "bpe_nfc.h"
#include "bpe_pretok.h"

#define EOT_TEXT "<|endoftext|>"
#define NO_RANK UINT64_MAX

/* ---- construction ------------------------------------------------------ */

static void free_partial(loom_tokenizer_t *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->special);
    free(t->merges);
    free(t->special_ids);
    free(t->norm_ids);
    if (t->ranks.keys) loom_pairmap_free(&t->ranks);
    if (t->vocab.e) loom_strmap_free(&t->vocab);
    free(t);
}

void loom_tokenizer_free(loom_tokenizer_t *t) { free_partial(t); }

static size_t tok_len(const loom_tokenizer_t *t, uint32_t id) { return LOOM_TOK_LEN(t, id); }

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
    int canonical = t->vocab_size == 257 && t->eot == 256 && t->nmerges == 0 && t->nspecial == 1 && !t->st.add_prefix_space &&
                    !t->st.sentencepiece;
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
    const loom_tok_style_t *st = &t->st;
    int flags[3] = {st->add_prefix_space, st->ignore_merges, st->pretok == LOOM_PRETOK_GPT2};
    h = loom_fnv1a(flags, sizeof flags, h);
    /* Options after GPT-2's enter only when set, so GPT-2-style hashes (in
     * checkpoints) stay as they were. */
    int more[8] = {st->pretok > LOOM_PRETOK_GPT2 ? st->pretok : 0, st->sentencepiece, st->prepend, st->split_spaces,
                   st->strip_decode, st->sentencepiece ? st->unk : 0, st->fuse_unk, st->nfc};
    int any = 0;
    for (int k = 0; k < 8; k++) any |= more[k];
    if (any) h = loom_fnv1a(more, sizeof more, h);
    t->hash = h;
}

static loom_status merge_error(const loom_bpe_spec_t *sp, size_t i, const char *fmt, const char *a, const char *b) {
    char where[64];
    if (sp->merge_line0 > 0) snprintf(where, sizeof where, "line %ld", sp->merge_line0 + (long)i);
    else snprintf(where, sizeof where, "merge %zu", i);
    char what[256];
    snprintf(what, sizeof what, fmt, a, b);
    return loom_error(LOOM_EFORMAT, "%s: %s: %s", sp->merges_origin ? sp->merges_origin : sp->origin, where, what);
}

/* The ids of the added tokens with (`norm` 1) or without the NORMALIZED
 * flag, longest text first (HF matches leftmost, then longest). */
static uint32_t *added_list(loom_tokenizer_t *t, int norm, int *n) {
    int normalizer = t->st.prepend == LOOM_PREPEND_NORMALIZER || t->st.nfc;
    uint32_t *ids = loom_malloc(((size_t)t->vocab_size + 1) * sizeof *ids);
    *n = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        uint8_t f = t->special[i];
        if ((f & LOOM_TOK_ADDED) && (normalizer && (f & LOOM_TOK_NORMALIZED)) == norm) ids[(*n)++] = (uint32_t)i;
    }
    qsort_r(ids, (size_t)*n, sizeof *ids, by_length_desc, t);
    return ids;
}

/* SentencePiece without Metaspace split: is there no regular token with a
 * space after a non-space (then words may be cut before such spaces)? */
static int spaces_start_words(const loom_tokenizer_t *t) {
    for (int i = 0; i < t->vocab_size; i++) {
        if (t->special[i]) continue;
        const unsigned char *b = t->bytes + t->off[i];
        for (size_t k = 1; k < tok_len(t, (uint32_t)i); k++)
            if (b[k] == ' ' && b[k - 1] != ' ') return 0;
    }
    return 1;
}

/* Token i of `sp`: a regular token into the vocabulary map, a byte token
 * into byte_id; errors name the id. */
static loom_status index_token(loom_tokenizer_t *t, const loom_bpe_spec_t *sp, int i) {
    size_t n = sp->tok_len[i];
    char sb[160];
    if (n == 0) return loom_error(LOOM_EFORMAT, "%s: token id %d is empty or missing; ids must run 0..%d without gaps", sp->origin, i, sp->vocab_size - 1);
    if (t->special[i] & LOOM_TOK_ADDED) {
        if (n == strlen(EOT_TEXT) && !memcmp(sp->tok[i], EOT_TEXT, n)) t->eot = i;
        return LOOM_OK;
    }
    if (t->special[i] & LOOM_TOK_BYTE) {
        if (!t->st.sentencepiece || n != 1) return loom_error(LOOM_EFORMAT, "%s: token id %d: a byte-fallback token outside a SentencePiece-style vocabulary", sp->origin, i);
        t->byte_id[sp->tok[i][0]] = (uint32_t)i;
        return LOOM_OK;
    }
    int added;
    loom_strmap_entry_t *e = loom_strmap_put(&t->vocab, sp->tok[i], n, loom_bytes_hash(sp->tok[i], n), (uint64_t)i, &added);
    if (!added)
        return loom_error(LOOM_EFORMAT, "%s: ids %d and %d are the same token \"%s\"", sp->origin, (int)e->val, i, show(sp->tok[i], n, sb, sizeof sb));
    if (n == 1 && !t->st.sentencepiece) t->byte_id[sp->tok[i][0]] = (uint32_t)i;
    return LOOM_OK;
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
    for (int i = 0; i < V; i++) {
        t->off[i] = o;
        memcpy(t->bytes + o, sp->tok[i], sp->tok_len[i]);
        o += sp->tok_len[i];
        t->special[i] = sp->special[i];
        LOOM_TRY(index_token(t, sp, i));
    }
    t->off[V] = o;
    for (int b = 0; b < 256 && !t->st.sentencepiece; b++)
        if (t->byte_id[b] == UINT32_MAX)
            return loom_error(LOOM_EFORMAT, "%s: no token for byte 0x%02x; a byte-level BPE vocabulary has all 256 bytes", sp->origin, b);
    t->special_ids = added_list(t, 0, &t->nspecial);
    t->norm_ids = added_list(t, 1, &t->nnorm);
    t->words_at_spaces = t->st.sentencepiece && !t->st.split_spaces && spaces_start_words(t);
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
    if (V < 256 && !sp->style.sentencepiece)
        return loom_error(LOOM_EFORMAT, "%s: %d tokens; a byte-level vocabulary needs at least 256", sp->origin, V);
    if (V < 1) return loom_error(LOOM_EFORMAT, "%s: the vocabulary is empty", sp->origin);
    const loom_tok_style_t *st = &sp->style;
    int ids[4] = {st->unk, st->bos, st->eos, 0};
    const char *what[3] = {"unknown", "BOS", "EOS"};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= V) return loom_error(LOOM_EFORMAT, "%s: the %s token id %d is beyond the vocabulary (%d)", sp->origin, what[k], ids[k], V);
    loom_tokenizer_t *t = loom_calloc(1, sizeof *t);
    t->vocab_size = V;
    t->eot = -1;
    t->st = *st;
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

loom_tok_style_t loom_tok_style_gpt2(void) {
    return (loom_tok_style_t){.pretok = LOOM_PRETOK_GPT2, .unk = -1, .bos = -1, .eos = -1};
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
                          .style = loom_tok_style_gpt2(), .origin = "byte-level tokenizer"};
    return loom_tokenizer_build(out, &sp);
}

int loom_tokenizer_vocab_size(const loom_tokenizer_t *t) { return t->vocab_size; }
int loom_tokenizer_eot(const loom_tokenizer_t *t) { return t->eot; }
uint64_t loom_tokenizer_hash(const loom_tokenizer_t *t) { return t->hash; }
int loom_tokenizer_merges(const loom_tokenizer_t *t) { return (int)t->nmerges; }
int loom_tokenizer_nspecial(const loom_tokenizer_t *t) { return t->nspecial + t->nnorm; }
int loom_tokenizer_bos(const loom_tokenizer_t *t) { return t->st.bos; }
int loom_tokenizer_eos(const loom_tokenizer_t *t) { return t->st.eos >= 0 ? t->st.eos : t->eot; }

int loom_tokenizer_is_control(const loom_tokenizer_t *t, uint32_t id) {
    return id < (uint32_t)t->vocab_size && (t->special[id] & (LOOM_TOK_ADDED | LOOM_TOK_PLAIN)) == LOOM_TOK_ADDED;
}

int loom_tokenizer_find(const loom_tokenizer_t *t, const char *text) {
    size_t n = strlen(text);
    for (int k = 0; k < t->nspecial + t->nnorm; k++) {
        uint32_t id = k < t->nspecial ? t->special_ids[k] : t->norm_ids[k - t->nspecial];
        if (tok_len(t, id) == n && !memcmp(t->bytes + t->off[id], text, n)) return (int)id;
    }
    loom_strmap_entry_t *e = loom_strmap_get(&t->vocab, text, n, loom_bytes_hash(text, n));
    return e ? (int)e->val : -1;
}

loom_status loom_tokenizer_set_specials(loom_tokenizer_t *t, int bos, int eos, int add_bos, int add_eos) {
    if (bos >= t->vocab_size || eos >= t->vocab_size)
        return loom_error(LOOM_EINVAL, "BOS %d / EOS %d: beyond the vocabulary (%d)", bos, eos, t->vocab_size);
    if (bos >= -1) t->st.bos = bos;
    if (eos >= -1) t->st.eos = eos;
    if (add_bos >= 0) t->st.add_bos = add_bos;
    if (add_eos >= 0) t->st.add_eos = add_eos;
    if (t->st.add_bos && t->st.bos < 0) return loom_error(LOOM_EINVAL, "the tokenizer adds a BOS token but has none");
    if (t->st.add_eos && t->st.eos < 0) return loom_error(LOOM_EINVAL, "the tokenizer adds an EOS token but has none");
    return LOOM_OK;
}

const unsigned char *loom_tokenizer_token(const loom_tokenizer_t *t, uint32_t id, size_t *len) {
    if (id >= (uint32_t)t->vocab_size) return NULL;
    *len = tok_len(t, id);
    return t->bytes + t->off[id];
}

const char *loom_tokenizer_special(const loom_tokenizer_t *t, int i, uint32_t *id) {
    static _Thread_local char buf[256];
    uint32_t s = i < t->nspecial ? t->special_ids[i] : t->norm_ids[i - t->nspecial];
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
    /* scratch for a word of up to cap symbols, one allocation (at rank):
     * rank (cap), heap (2 cap), then sym, prev, next (cap each) */
    uint64_t *rank;           /* packed rank of (sym[i], sym[i+1]) */
    uint64_t *heap;           /* long words */
    uint32_t *sym;            /* symbol ids */
    int32_t *prev, *next;     /* long words */
    size_t cap;
    size_t *at_raw, *at_norm; /* (nspecial), (nnorm): next known occurrence of each added token */
    unsigned char *norm;      /* scratch: the normalized text (SentencePiece) */
    size_t norm_cap;
};

loom_encoder_t *loom_encoder_new(const loom_tokenizer_t *t) {
    loom_encoder_t *e = loom_calloc(1, sizeof *e);
    e->t = t;
    loom_strmap_init(&e->cache, 4096);
    e->at_raw = loom_calloc((size_t)t->nspecial + 1, sizeof *e->at_raw);
    e->at_norm = loom_calloc((size_t)t->nnorm + 1, sizeof *e->at_norm);
    return e;
}

void loom_encoder_free(loom_encoder_t *e) {
    if (!e) return;
    loom_strmap_free(&e->cache);
    loom_ids_free(&e->cache_ids);
    free(e->rank);
    free(e->at_raw);
    free(e->at_norm);
    free(e->norm);
    free(e);
}

static void scratch(loom_encoder_t *e, size_t n) {
    if (n <= e->cap) return;
    e->cap = n * 2;
    free(e->rank);
    e->rank = loom_malloc(e->cap * (3 * sizeof(uint64_t) + sizeof(uint32_t) + 2 * sizeof(int32_t)));
    e->heap = e->rank + e->cap;
    e->sym = (uint32_t *)(e->heap + 2 * e->cap);
    e->prev = (int32_t *)(e->sym + e->cap);
    e->next = e->prev + e->cap;
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

/* The first symbols of word w into e->sym, and their count: one per byte
 * (byte-level), or one per character (SentencePiece: the character's token,
 * else the <0xNN> tokens of its bytes, else the unknown token, a run of
 * unknowns fused into one when fuse_unk is set; else nothing, as HF does). */
static size_t first_symbols(loom_encoder_t *e, const unsigned char *w, size_t n) {
    const loom_tokenizer_t *t = e->t;
    scratch(e, n);
    if (!t->st.sentencepiece) {
        for (size_t i = 0; i < n; i++) e->sym[i] = t->byte_id[w[i]];
        return n;
    }
    size_t m = 0;
    int unk_before = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t k = (size_t)loom_utf8_next(w, n, i, &cp), b = 0;
        loom_strmap_entry_t *v = loom_strmap_get(&t->vocab, w + i, k, loom_bytes_hash(w + i, k));
        while (!v && b < k && t->byte_id[w[i + b]] != UINT32_MAX) b++;
        if (v) {
            e->sym[m++] = (uint32_t)v->val;
        } else if (b == k) {
            for (b = 0; b < k; b++) e->sym[m++] = t->byte_id[w[i + b]];
        } else if (t->st.unk >= 0 && !(unk_before && t->st.fuse_unk)) {
            e->sym[m++] = (uint32_t)t->st.unk;
        }
        unk_before = !v && b < k;
        i += k;
    }
    return m;
}

/* Encode one pre-token. */
static void encode_word(loom_encoder_t *e, const unsigned char *w, size_t n, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    if (n == 0) return;
    if (!t->st.sentencepiece && (n == 1 || t->nmerges == 0)) {
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
    if (t->st.ignore_merges) {
        loom_strmap_entry_t *v = loom_strmap_get(&t->vocab, w, n, h);
        if (v) {
            loom_ids_push(out, (uint32_t)v->val);
            return;
        }
    }
    size_t m = first_symbols(e, w, n);
    if (m > 1) m = m <= SHORT_WORD ? bpe_short(e, m) : bpe_long(e, m);
    for (size_t i = 0; i < m; i++) loom_ids_push(out, e->sym[i]);
    if (m >= 0xffffff) return;
    if (e->cache.n >= CACHE_MAX_WORDS || e->cache_ids.n + m > CACHE_MAX_IDS) {
        loom_strmap_clear(&e->cache);
        e->cache_ids.n = 0;
    }
    loom_strmap_put(&e->cache, w, n, h, ((uint64_t)e->cache_ids.n << 24) | m, NULL);
    for (size_t i = 0; i < m; i++) loom_ids_push(&e->cache_ids, e->sym[i]);
}

/* Text between added tokens: `seg_start` says it follows one or starts the
 * text at a document start, `first` that it starts the text. */
typedef void (*plain_fn)(loom_encoder_t *e, const unsigned char *s, size_t len, int seg_start, int first, loom_ids_t *out);

#define AT_UNKNOWN (SIZE_MAX - 1)

/* Cut the added tokens `ids` (n, longest first) out of s[0..len): the
 * leftmost, the longest among those at one place, as HF does; the text
 * between them goes to `plain`. `at` is scratch for n positions. */
static void split_added(loom_encoder_t *e, const uint32_t *ids, int n, size_t *at, const unsigned char *s, size_t len,
                        int at_start, plain_fn plain, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    for (int k = 0; k < n; k++) at[k] = AT_UNKNOWN;
    size_t i = 0;
    int first = at_start;
    while (i < len) {
        size_t best = len;
        int which = -1;
        for (int k = 0; k < n; k++) {
            size_t tl = tok_len(t, ids[k]);
            if (at[k] == AT_UNKNOWN || at[k] < i) {
                const unsigned char *p = memmem(s + i, len - i, t->bytes + t->off[ids[k]], tl);
                at[k] = p ? (size_t)(p - s) : SIZE_MAX;
            }
            if (at[k] < best) {
                best = at[k];
                which = k;
            }
        }
        if (best > i) plain(e, s + i, best - i, at_start, first && i == 0, out);
        if (which < 0) break;
        loom_ids_push(out, ids[which]);
        i = best + tok_len(t, ids[which]);
        at_start = 1;
    }
}

/* Words of SentencePiece text: Metaspace split starts a word at every
 * space; else the text is one word, which is cut before a space that
 * follows a non-space when no token could span that place (same ids,
 * and the word cache works). */
static void sp_words(loom_encoder_t *e, const unsigned char *s, size_t len, int seg_start, int first, loom_ids_t *out) {
    (void)seg_start, (void)first;
    const loom_tokenizer_t *t = e->t;
    if (!t->st.split_spaces && !t->words_at_spaces) {
        encode_word(e, s, len, out);
        return;
    }
    size_t w = 0;
    for (size_t i = 1; i < len; i++)
        if (s[i] == ' ' && (t->st.split_spaces || s[i - 1] != ' ')) {
            encode_word(e, s + w, i - w, out);
            w = i;
        }
    encode_word(e, s + w, len - w, out);
}

/* SentencePiece text between raw added tokens: the space that Prepend or
 * Metaspace puts first, "▁" read as a space, then the normalized added
 * tokens cut out of that. */
static void sp_plain(loom_encoder_t *e, const unsigned char *s, size_t len, int seg_start, int first, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    if (len + 1 > e->norm_cap) {
        e->norm_cap = 2 * (len + 1);
        free(e->norm);
        e->norm = loom_malloc(e->norm_cap);
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == 0xE2 && i + 2 < len && s[i + 1] == 0x96 && s[i + 2] == 0x81) { /* U+2581 */
            e->norm[k++] = ' ';
            i += 2;
        } else {
            e->norm[k++] = s[i];
        }
    }
    int p = t->st.prepend;
    int lead = (p == LOOM_PREPEND_NORMALIZER && seg_start) || (p == LOOM_PREPEND_ALWAYS && seg_start && e->norm[0] != ' ') ||
               (p == LOOM_PREPEND_FIRST && first && e->norm[0] != ' ');
    if (lead) {
        memmove(e->norm + 1, e->norm, k);
        e->norm[0] = ' ';
        k++;
    }
    if (t->nnorm) split_added(e, t->norm_ids, t->nnorm, e->at_norm, e->norm, k, 0, sp_words, out);
    else sp_words(e, e->norm, k, 0, 0, out);
}

/* Byte-level text between added tokens: the prefix space, then pieces. */
static void bl_words(loom_encoder_t *e, const unsigned char *s, size_t len, int seg_start, int first, loom_ids_t *out) {
    (void)first;
    const loom_tokenizer_t *t = e->t;
    unsigned char *tmp = NULL;
    if (t->st.add_prefix_space && seg_start && s[0] != ' ') {
        tmp = loom_malloc(len + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, len);
        s = tmp;
        len++;
    }
    for (size_t i = 0; i < len;) {
        size_t j = loom_pretok_next_kind(t->st.pretok, s, len, i);
        encode_word(e, s + i, j - i, out);
        i = j;
    }
    free(tmp);
}

/* Byte-level text between raw added tokens: NFC when the tokenizer has that
 * normalizer, then the normalized added tokens cut out of it. */
static void bl_plain(loom_encoder_t *e, const unsigned char *s, size_t len, int seg_start, int first, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    if (t->st.nfc) {
        len = loom_nfc(s, len, &e->norm, &e->norm_cap);
        s = e->norm;
    }
    if (t->nnorm) split_added(e, t->norm_ids, t->nnorm, e->at_norm, s, len, seg_start, bl_words, out);
    else bl_words(e, s, len, seg_start, first, out);
}

void loom_encoder_encode(loom_encoder_t *e, const char *text, size_t len, int at_start, loom_ids_t *out) {
    const loom_tokenizer_t *t = e->t;
    split_added(e, t->special_ids, t->nspecial, e->at_raw, (const unsigned char *)text, len, at_start,
                t->st.sentencepiece ? sp_plain : bl_plain, out);
}

/* Encode in one call; with `special`, the BOS/EOS the tokenizer adds. */
static void encode_all(const loom_tokenizer_t *t, const char *text, size_t len, int special, uint32_t **ids, size_t *n) {
    loom_encoder_t *e = loom_encoder_new(t);
    loom_ids_t out = {0};
    if (special && t->st.add_bos && t->st.bos >= 0) loom_ids_push(&out, (uint32_t)t->st.bos);
    loom_encoder_encode(e, text, len, 1, &out);
    if (special && t->st.add_eos && t->st.eos >= 0) loom_ids_push(&out, (uint32_t)t->st.eos);
    loom_encoder_free(e);
    if (!out.v) out.v = loom_malloc(sizeof *out.v);
    *ids = out.v;
    *n = out.n;
}

loom_status loom_tokenizer_encode(const loom_tokenizer_t *t, const char *text, size_t len, uint32_t **ids, size_t *n) {
    encode_all(t, text, len, 0, ids, n);
    return LOOM_OK;
}

loom_status loom_tokenizer_encode_special(const loom_tokenizer_t *t, const char *text, size_t len, uint32_t **ids, size_t *n) {
    encode_all(t, text, len, 1, ids, n);
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
        const unsigned char *b = t->bytes + t->off[ids[i]];
        size_t m = tok_len(t, ids[i]), j = 0;
        if (i == 0 && t->st.strip_decode < 0 && !(t->special[ids[i]] & LOOM_TOK_ADDED)) {
            for (; j < m; j++) /* the Metaspace decoder drops the first token's "▁"s */
                if (b[j] != ' ') out[k++] = (char)b[j];
            continue;
        }
        memcpy(out + k, b, m);
        k += m;
    }
    size_t lead = 0; /* the Strip decoder drops leading spaces of the whole text */
    while (lead < k && lead < (size_t)(t->st.strip_decode > 0 ? t->st.strip_decode : 0) && out[lead] == ' ') lead++;
    memmove(out, out + lead, k - lead);
    k -= lead;
    out[k] = 0;
    *text = out;
    *len = k;
    return LOOM_OK;
}

void loom_tokenizer_merge(const loom_tokenizer_t *t, size_t i, uint32_t *a, uint32_t *b) {
    *a = t->merges[i][0];
    *b = t->merges[i][1];
}

int loom_text_sink_emit(int token, void *vsink) {
    loom_text_sink_t *sink = vsink;
    size_t len = 0;
    /* the token's own bytes: decode's leading-space strip belongs to a text's start, not to each token */
    const unsigned char *b = loom_tokenizer_token(sink->tok, (uint32_t)token, &len);
    if (b) {
        fwrite(b, 1, len, sink->out);
        fflush(sink->out);
    }
    return 0;
}
