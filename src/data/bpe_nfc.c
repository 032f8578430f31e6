#include "bpe_nfc.h"

#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "bpe_pretok.h"

/* Hangul syllables (UAX #15, "Hangul"). */
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21, T_COUNT = 28,
       N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

#define INVALID_BYTE 0x80000000u /* a byte that is not UTF-8, kept as 0x80000000 | byte */

static int ccc_of(uint32_t cp) { return loom_unicode_range_find(loom_nfc_cccs, loom_nfc_ncccs, cp, 0); }

static const loom_nfc_decomp_t *decomp_of(uint32_t cp) {
    int lo = 0, hi = loom_nfc_ndecomps - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < loom_nfc_decomps[mid].cp) hi = mid - 1;
        else if (cp > loom_nfc_decomps[mid].cp) lo = mid + 1;
        else return &loom_nfc_decomps[mid];
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT) return a + (b - T_BASE);
    int lo = 0, hi = loom_nfc_ncomps - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const loom_nfc_comp_t *c = &loom_nfc_comps[mid];
        if (a < c->a || (a == c->a && b < c->b)) hi = mid - 1;
        else if (a > c->a || b > c->b) lo = mid + 1;
        else return c->c;
    }
    return 0;
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
} cps_t;

static void push(cps_t *c, uint32_t cp) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->v = realloc(c->v, c->cap * sizeof *c->v);
        if (!c->v) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    c->v[c->n++] = cp;
}

/* Canonical decomposition of s, then canonical ordering (a stable sort of
 * each run of non-starters by combining class). */
static void decompose(const unsigned char *s, size_t n, cps_t *out) {
    for (size_t i = 0; i < n;) {
        unsigned cp;
        int k = loom_utf8_next(s, n, i, &cp);
        if (cp == 0xFFFFFFFFu) push(out, INVALID_BYTE | s[i]);
        else if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
            uint32_t x = cp - S_BASE;
            push(out, L_BASE + x / N_COUNT);
            push(out, V_BASE + (x % N_COUNT) / T_COUNT);
            if (x % T_COUNT) push(out, T_BASE + x % T_COUNT);
        } else {
            const loom_nfc_decomp_t *d = decomp_of(cp);
            if (!d) push(out, cp);
            else
                for (uint32_t j = 0; j < d->len; j++) push(out, loom_nfc_pool[d->off + j]);
        }
        i += (size_t)k;
    }
    for (size_t i = 1; i < out->n; i++) { /* insertion sort within runs of non-starters */
        uint32_t x = out->v[i];
        int cx = x & INVALID_BYTE ? 0 : ccc_of(x);
        if (!cx) continue;
        size_t j = i;
        while (j > 0 && !(out->v[j - 1] & INVALID_BYTE) && ccc_of(out->v[j - 1]) > cx) {
            out->v[j] = out->v[j - 1];
            j--;
        }
        out->v[j] = x;
    }
}

/* Canonical composition in place (UAX #15's algorithm); returns the length. */
static size_t recompose(uint32_t *v, size_t n) {
    if (n == 0) return 0;
    size_t starter = 0, out = 1;
    int last = v[0] & INVALID_BYTE ? 256 : ccc_of(v[0]);
    if (last) last = 256; /* no starter yet */
    for (size_t i = 1; i < n; i++) {
        uint32_t ch = v[i];
        int cc = ch & INVALID_BYTE ? 256 : ccc_of(ch);
        uint32_t c = (ch & INVALID_BYTE) || (v[starter] & INVALID_BYTE) ? 0 : compose(v[starter], ch);
        if (c && (last < cc || last == 0)) {
            v[starter] = c;
            continue;
        }
        if (cc == 0) starter = out;
        last = cc;
        v[out++] = ch;
    }
    return out;
}

static size_t put_utf8(unsigned char *o, uint32_t cp) {
    if (cp & INVALID_BYTE) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    return loom_utf8_put(o, cp);
}

size_t loom_nfc(const unsigned char *s, size_t n, unsigned char **out, size_t *cap) {
    size_t ascii = 0;
    while (ascii < n && s[ascii] < 0x80) ascii++;
    if (ascii > 0 && ascii < n) ascii--; /* the last ASCII letter may compose with what follows */
    cps_t c = {0};
    if (ascii < n) {
        decompose(s + ascii, n - ascii, &c);
        c.n = recompose(c.v, c.n);
    }
    size_t need = ascii + 4 * c.n + 1;
    if (need > *cap) {
        *cap = 2 * need;
        free(*out);
        *out = loom_malloc(*cap);
    }
    memcpy(*out, s, ascii);
    size_t k = ascii;
    for (size_t i = 0; i < c.n; i++) k += put_utf8(*out + k, c.v[i]);
    free(c.v);
    return k;
}
