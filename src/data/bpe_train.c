/* BPE training: count pre-tokenized words, then merge the most frequent
 * adjacent pair until the vocabulary is full.
 *
 * The merge loop touches only the words that hold the chosen pair: each pair
 * keeps the list of words it occurs in and its count, updated by the local
 * change of every merge, and a max-heap with lazy deletion (a popped entry
 * whose count is stale is pushed back with the current count) picks the next
 * pair. The cost per merge is proportional to the occurrences it changes, not
 * to the corpus. */
#define _GNU_SOURCE
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_build.h"
#include "bpe_map.h"
#include "bpe_pretok.h"
#include "tokenizer.h"

struct loom_bpe_counter {
    int nspecial;
    char **special;
    size_t *special_len;
    int nmaps;
    loom_strmap_t *maps; /* one per thread: word bytes -> count */
};

loom_status loom_bpe_counter_new(loom_bpe_counter_t **out, const char *const *specials, int n) {
    loom_bpe_counter_t *c = loom_calloc(1, sizeof *c);
    c->nspecial = n;
    c->special = loom_calloc((size_t)n + 1, sizeof *c->special);
    c->special_len = loom_calloc((size_t)n + 1, sizeof *c->special_len);
    for (int i = 0; i < n; i++) {
        if (!specials[i][0]) {
            loom_bpe_counter_free(c);
            return loom_error(LOOM_EINVAL, "special token %d is empty", i + 1);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(specials[i], specials[j])) {
                loom_bpe_counter_free(c);
                return loom_error(LOOM_EINVAL, "special token \"%s\" is given twice", specials[i]);
            }
        c->special[i] = loom_strdup(specials[i]);
        c->special_len[i] = strlen(specials[i]);
    }
    *out = c;
    return LOOM_OK;
}

void loom_bpe_counter_free(loom_bpe_counter_t *c) {
    if (!c) return;
    for (int i = 0; i < c->nspecial; i++) free(c->special[i]);
    free(c->special);
    free(c->special_len);
    for (int i = 0; i < c->nmaps; i++) loom_strmap_free(&c->maps[i]);
    free(c->maps);
    free(c);
}

size_t loom_bpe_counter_words(const loom_bpe_counter_t *c) {
    size_t n = 0;
    for (int i = 0; i < c->nmaps; i++) n += c->maps[i].n;
    return n;
}

size_t loom_bpe_counter_bytes(const loom_bpe_counter_t *c) {
    size_t n = 0;
    for (int i = 0; i < c->nmaps; i++) n += loom_strmap_bytes(&c->maps[i]);
    return n;
}

static void count_plain(loom_strmap_t *m, const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t j = loom_pretok_next(s, len, i);
        loom_strmap_entry_t *e = loom_strmap_put(m, s + i, j - i, loom_bytes_hash(s + i, j - i), 0, NULL);
        e->val++;
        i = j;
    }
}

/* Count the words of s[0..len), skipping the special tokens in it. */
static void count_piece(const loom_bpe_counter_t *c, loom_strmap_t *m, const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        size_t best = len, blen = 0;
        for (int k = 0; k < c->nspecial; k++) {
            const unsigned char *p = memmem(s + i, len - i, c->special[k], c->special_len[k]);
            if (p && ((size_t)(p - s) < best || ((size_t)(p - s) == best && c->special_len[k] > blen))) {
                best = (size_t)(p - s);
                blen = c->special_len[k];
            }
        }
        count_plain(m, s + i, best - i);
        i = best + blen;
    }
}

void loom_bpe_count_add(loom_bpe_counter_t *c, const char *text, size_t len, int threads) {
    if (threads < 1) threads = 1;
    if (c->nmaps < threads) {
        c->maps = realloc(c->maps, (size_t)threads * sizeof *c->maps);
        if (!c->maps) loom_panic(__FILE__, __LINE__, "out of memory");
        for (int i = c->nmaps; i < threads; i++) loom_strmap_init(&c->maps[i], 1 << 16);
        c->nmaps = threads;
    }
    const unsigned char *s = (const unsigned char *)text;
    /* Split into one piece per thread at cuts that change no word. */
    size_t *cut = loom_malloc(((size_t)threads + 1) * sizeof *cut);
    cut[0] = 0;
    for (int k = 1; k < threads; k++) {
        size_t want = len / (size_t)threads * (size_t)k, p = want > cut[k - 1] ? loom_pretok_safe_cut(s, len, want) : 0;
        cut[k] = p > cut[k - 1] ? p : cut[k - 1];
    }
    cut[threads] = len;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int k = 0; k < threads; k++) count_piece(c, &c->maps[k], s + cut[k], cut[k + 1] - cut[k]);
    free(cut);
}

/* ---- the merge loop ---- */

typedef struct {
    uint32_t *v;
    uint32_t n, cap;
} wlist_t;

typedef struct {
    uint32_t a, b;
    int64_t count;
    wlist_t words;  /* words that hold (or held) the pair; may repeat */
    uint32_t stamp; /* merge step that last touched it */
} pair_t;

typedef struct {
    int64_t count;
    uint32_t pair;
} entry_t;

typedef struct {
    pair_t *p;
    size_t n, cap;
    loom_pairmap_t index; /* (a, b) -> pair number */
    entry_t *heap;
    size_t hn, hcap;
    uint32_t *touched;
    size_t ntouched, touched_cap;
    uint32_t step;
} pairs_t;

static void wlist_add(wlist_t *l, uint32_t w) {
    if (l->n && l->v[l->n - 1] == w) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) loom_panic(__FILE__, __LINE__, "out of memory for BPE word lists");
    }
    l->v[l->n++] = w;
}

/* a before b in the heap: more frequent first, then smaller ids. */
static inline int above(const pairs_t *P, entry_t a, entry_t b) {
    if (a.count != b.count) return a.count > b.count;
    return LOOM_PAIR(P->p[a.pair].a, P->p[a.pair].b) < LOOM_PAIR(P->p[b.pair].a, P->p[b.pair].b);
}

static void heap_push(pairs_t *P, uint32_t pair) {
    if (P->hn == P->hcap) {
        P->hcap = P->hcap ? 2 * P->hcap : 1024;
        P->heap = realloc(P->heap, P->hcap * sizeof *P->heap);
        if (!P->heap) loom_panic(__FILE__, __LINE__, "out of memory for the BPE heap");
    }
    entry_t v = {P->p[pair].count, pair};
    size_t i = P->hn++;
    while (i > 0 && above(P, v, P->heap[(i - 1) / 2])) {
        P->heap[i] = P->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    P->heap[i] = v;
}

static entry_t heap_pop(pairs_t *P) {
    entry_t top = P->heap[0], v = P->heap[--P->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= P->hn) break;
        if (c + 1 < P->hn && above(P, P->heap[c + 1], P->heap[c])) c++;
        if (!above(P, P->heap[c], v)) break;
        P->heap[i] = P->heap[c];
        i = c;
    }
    P->heap[i] = v;
    return top;
}

static uint32_t pair_get(pairs_t *P, uint32_t a, uint32_t b) {
    uint64_t *slot = loom_pairmap_put(&P->index, LOOM_PAIR(a, b), UINT64_MAX);
    if (*slot != UINT64_MAX) return (uint32_t)*slot;
    if (P->n == P->cap) {
        P->cap = P->cap ? 2 * P->cap : 4096;
        P->p = realloc(P->p, P->cap * sizeof *P->p);
        if (!P->p) loom_panic(__FILE__, __LINE__, "out of memory for BPE pairs");
    }
    pair_t *p = &P->p[P->n];
    memset(p, 0, sizeof *p);
    p->a = a;
    p->b = b;
    *slot = P->n;
    return (uint32_t)P->n++;
}

static void pair_add(pairs_t *P, uint32_t a, uint32_t b, int64_t f, uint32_t word) {
    uint32_t k = pair_get(P, a, b);
    P->p[k].count += f;
    if (f > 0) {
        wlist_add(&P->p[k].words, word);
        if (P->p[k].stamp != P->step) {
            P->p[k].stamp = P->step;
            if (P->ntouched == P->touched_cap) {
                P->touched_cap = P->touched_cap ? 2 * P->touched_cap : 1024;
                P->touched = realloc(P->touched, P->touched_cap * sizeof *P->touched);
                if (!P->touched) loom_panic(__FILE__, __LINE__, "out of memory");
            }
            P->touched[P->ntouched++] = k;
        }
    }
}

/* Replace every (a, b) in word w by c, updating the pair counts by the
 * local change: the neighbours' pairs lose f and the new pairs gain f. */
static void merge_word(pairs_t *P, uint32_t *s, uint32_t *len, int64_t f, uint32_t w, uint32_t a, uint32_t b, uint32_t c) {
    uint32_t n = *len, k = 0;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (k > 0) { /* left neighbour: (x, a) becomes (x', c) */
                pair_add(P, s[i - 1], a, -f, w);
                pair_add(P, s[k - 1], c, f, w);
            }
            /* right neighbour, unless it starts another merge (handled there) */
            if (i + 2 < n && !(i + 3 < n && s[i + 2] == a && s[i + 3] == b)) {
                pair_add(P, b, s[i + 2], -f, w);
                pair_add(P, c, s[i + 2], f, w);
            }
            s[k++] = c;
            i += 2;
        } else {
            s[k++] = s[i++];
        }
    }
    *len = k;
}

/* Gather the words of every thread's table into the first. */
static loom_strmap_t *gather_words(loom_bpe_counter_t *c) {
    if (c->nmaps == 0) loom_bpe_count_add(c, "", 0, 1);
    loom_strmap_t *m = &c->maps[0];
    for (int t = 1; t < c->nmaps; t++) {
        loom_strmap_t *x = &c->maps[t];
        for (size_t i = 0; i < x->cap; i++) {
            if (!x->e[i].used) continue;
            loom_strmap_entry_t *e = loom_strmap_put(m, x->pool + x->e[i].off, x->e[i].len, x->e[i].hash, 0, NULL);
            e->val += x->e[i].val;
        }
        loom_strmap_free(x);
    }
    c->nmaps = 1;
    return m;
}

/* The words of two or more bytes as symbol strings (ids of bytes = bytes):
 * word i is sym[woff[i] .. woff[i] + wlen[i]), seen wfreq[i] times. */
typedef struct {
    uint32_t *sym;
    size_t *woff;
    uint32_t *wlen;
    int64_t *wfreq;
    size_t n;
} words_t;

static loom_status words_from_table(words_t *W, const loom_strmap_t *m) {
    size_t nw = 0, nsym = 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].used && m->e[i].len > 1) {
            nw++;
            nsym += m->e[i].len;
        }
    if (nw >= UINT32_MAX) return loom_error(LOOM_EINVAL, "%zu distinct words is more than the trainer handles (2^32)", nw);
    W->sym = loom_malloc((nsym ? nsym : 1) * sizeof *W->sym);
    W->woff = loom_malloc((nw + 1) * sizeof *W->woff);
    W->wlen = loom_malloc((nw + 1) * sizeof *W->wlen);
    W->wfreq = loom_malloc((nw + 1) * sizeof *W->wfreq);
    W->n = nw;
    size_t w = 0, o_ = 0;
    for (size_t i = 0; i < m->cap; i++) {
        const loom_strmap_entry_t *e = &m->e[i];
        if (!e->used || e->len < 2) continue;
        W->woff[w] = o_;
        W->wlen[w] = e->len;
        W->wfreq[w] = (int64_t)e->val;
        for (uint32_t k = 0; k < e->len; k++) W->sym[o_ + k] = m->pool[e->off + k];
        o_ += e->len;
        w++;
    }
    return LOOM_OK;
}

static void words_free(words_t *W) {
    free(W->sym);
    free(W->woff);
    free(W->wlen);
    free(W->wfreq);
}

/* Merge the most frequent pair, over and over, until `want` merges or no
 * pair is at least min_freq frequent. Returns the merges made (*nm). */
static uint32_t (*merge_pairs(words_t *W, long long base, size_t want, int64_t min_freq, const loom_bpe_train_opts *o,
                              size_t *nm_out))[2] {
    pairs_t P = {0};
    loom_pairmap_init(&P.index, 1 << 16);
    P.step = 1;
    for (size_t i = 0; i < W->n; i++)
        for (uint32_t k = 0; k + 1 < W->wlen[i]; k++) pair_add(&P, W->sym[W->woff[i] + k], W->sym[W->woff[i] + k + 1], W->wfreq[i], (uint32_t)i);
    for (size_t k = 0; k < P.n; k++) heap_push(&P, (uint32_t)k);
    size_t nm = 0, mcap = 1024;
    uint32_t(*merges)[2] = loom_malloc(mcap * sizeof *merges);
    while (nm < want && P.hn > 0) {
        entry_t top = heap_pop(&P);
        pair_t *p = &P.p[top.pair];
        if (top.count != p->count) {
            if (p->count < top.count && p->count >= min_freq) heap_push(&P, top.pair);
            continue;
        }
        if (p->count < min_freq) break;
        uint32_t a = p->a, b = p->b, cid = (uint32_t)(base + (long long)nm);
        if (nm == mcap) {
            mcap *= 2;
            merges = realloc(merges, mcap * sizeof *merges);
            if (!merges) loom_panic(__FILE__, __LINE__, "out of memory");
        }
        merges[nm][0] = a;
        merges[nm][1] = b;
        nm++;
        P.step++;
        P.ntouched = 0;
        wlist_t list = p->words;
        p->words = (wlist_t){0};
        p->count = 0;
        for (uint32_t i = 0; i < list.n; i++) {
            uint32_t wi = list.v[i];
            merge_word(&P, W->sym + W->woff[wi], &W->wlen[wi], W->wfreq[wi], wi, a, b, cid);
        }
        free(list.v);
        P.p[top.pair].count = 0; /* merge_word's own (a, b) bookkeeping is moot */
        for (size_t i = 0; i < P.ntouched; i++)
            if (P.p[P.touched[i]].count >= min_freq) heap_push(&P, P.touched[i]);
        if (o->progress && nm % 256 == 0 && nm != want) o->progress(o->progress_ctx, (long long)nm, (long long)want);
    }
    if (o->progress) o->progress(o->progress_ctx, (long long)nm, (long long)want);
    for (size_t k = 0; k < P.n; k++) free(P.p[k].words.v);
    free(P.p);
    free(P.heap);
    free(P.touched);
    loom_pairmap_free(&P.index);
    *nm_out = nm;
    return merges;
}

/* The vocabulary: bytes, specials, then one token per merge. */
static loom_status build_vocab(loom_tokenizer_t **out, const loom_bpe_counter_t *c, long long base, uint32_t (*merges)[2],
                               size_t nm) {
    size_t V = (size_t)base + nm;
    unsigned char **tok = loom_malloc(V * sizeof *tok);
    size_t *len = loom_malloc(V * sizeof *len);
    uint8_t *special = loom_calloc(V, 1);
    for (int b = 0; b < 256; b++) {
        tok[b] = loom_malloc(1);
        tok[b][0] = (unsigned char)b;
        len[b] = 1;
    }
    for (int k = 0; k < c->nspecial; k++) {
        tok[256 + k] = (unsigned char *)loom_strdup(c->special[k]);
        len[256 + k] = c->special_len[k];
        special[256 + k] = 1;
    }
    for (size_t i = 0; i < nm; i++) {
        size_t id = (size_t)base + i, la = len[merges[i][0]], lb = len[merges[i][1]];
        tok[id] = loom_malloc(la + lb);
        memcpy(tok[id], tok[merges[i][0]], la);
        memcpy(tok[id] + la, tok[merges[i][1]], lb);
        len[id] = la + lb;
    }
    loom_bpe_spec_t sp = {.vocab_size = (int)V, .tok = (const unsigned char *const *)tok, .tok_len = len,
                          .special = special, .merges = (const uint32_t(*)[2])merges, .nmerges = nm,
                          .style = loom_tok_style_gpt2(), .origin = "trained tokenizer"};
    loom_status s = loom_tokenizer_build(out, &sp);
    for (size_t i = 0; i < V; i++) free(tok[i]);
    free(tok);
    free(len);
    free(special);
    return s;
}

loom_status loom_bpe_train(loom_tokenizer_t **out, loom_bpe_counter_t *c, const loom_bpe_train_opts *o) {
    *out = NULL;
    long long base = 256 + c->nspecial;
    if (o->vocab_size < base)
        return loom_error(LOOM_EINVAL, "vocabulary %lld is smaller than the 256 bytes plus %d special token(s)", o->vocab_size, c->nspecial);
    if (o->vocab_size > 0xfffffffeLL) return loom_error(LOOM_EINVAL, "vocabulary %lld is above 2^32 - 2", o->vocab_size);
    int64_t min_freq = o->min_frequency > 1 ? o->min_frequency : 1;
    loom_strmap_t *m = gather_words(c);
    words_t W = {0};
    LOOM_TRY(words_from_table(&W, m));
    /* The counter's table is no longer needed: free it before the pairs. */
    loom_strmap_free(m);
    loom_strmap_init(m, 16);
    size_t nm;
    uint32_t(*merges)[2] = merge_pairs(&W, base, (size_t)(o->vocab_size - base), min_freq, o, &nm);
    words_free(&W);
    loom_status s = build_vocab(out, c, base, merges, nm);
    free(merges);
    return s;
}
