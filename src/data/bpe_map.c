#include "bpe_map.h"

#include <stdlib.h>
#include <string.h>

#include "../core/core.h"

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void loom_pairmap_init(loom_pairmap_t *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2);
    m->n = 0;
    m->keys = loom_malloc(m->cap * sizeof *m->keys);
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    m->vals = loom_malloc(m->cap * sizeof *m->vals);
}

void loom_pairmap_free(loom_pairmap_t *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

uint64_t *loom_pairmap_get(const loom_pairmap_t *m, uint64_t key) {
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == key) return &m->vals[i];
        if (m->keys[i] == LOOM_PAIRMAP_EMPTY) return NULL;
    }
}

static void pairmap_grow(loom_pairmap_t *m) {
    loom_pairmap_t g;
    loom_pairmap_init(&g, m->cap);
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != LOOM_PAIRMAP_EMPTY) *loom_pairmap_put(&g, m->keys[i], 0) = m->vals[i];
    loom_pairmap_free(m);
    *m = g;
}

uint64_t *loom_pairmap_put(loom_pairmap_t *m, uint64_t key, uint64_t init) {
    if (2 * (m->n + 1) > m->cap) pairmap_grow(m);
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == key) return &m->vals[i];
        if (m->keys[i] == LOOM_PAIRMAP_EMPTY) {
            m->keys[i] = key;
            m->vals[i] = init;
            m->n++;
            return &m->vals[i];
        }
    }
}

uint64_t loom_bytes_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0x94d049bb133111ebULL;
    return mix64(h);
}

void loom_strmap_init(loom_strmap_t *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2);
    m->e = loom_calloc(m->cap, sizeof *m->e);
    m->pool_cap = 4096;
    m->pool = loom_malloc(m->pool_cap);
}

void loom_strmap_free(loom_strmap_t *m) {
    free(m->e);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

void loom_strmap_clear(loom_strmap_t *m) {
    memset(m->e, 0, m->cap * sizeof *m->e);
    m->n = 0;
    m->pool_len = 0;
}

size_t loom_strmap_bytes(const loom_strmap_t *m) { return m->cap * sizeof *m->e + m->pool_cap; }

loom_strmap_entry_t *loom_strmap_get(const loom_strmap_t *m, const void *key, size_t len, uint64_t hash) {
    size_t mask = m->cap - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        loom_strmap_entry_t *e = &m->e[i];
        if (!e->used) return NULL;
        if (e->hash == hash && e->len == len && memcmp(m->pool + e->off, key, len) == 0) return e;
    }
}

static void strmap_grow(loom_strmap_t *m) {
    size_t cap = m->cap * 2, mask = cap - 1;
    loom_strmap_entry_t *e = loom_calloc(cap, sizeof *e);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].used) continue;
        size_t j = m->e[i].hash & mask;
        while (e[j].used) j = (j + 1) & mask;
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
}

loom_strmap_entry_t *loom_strmap_put(loom_strmap_t *m, const void *key, size_t len, uint64_t hash,
                                     uint64_t init, int *added) {
    if (added) *added = 0;
    loom_strmap_entry_t *e = loom_strmap_get(m, key, len, hash);
    if (e) return e;
    if (2 * (m->n + 1) > m->cap) strmap_grow(m);
    if (m->pool_len + len > m->pool_cap) {
        while (m->pool_len + len > m->pool_cap) m->pool_cap *= 2;
        unsigned char *p = realloc(m->pool, m->pool_cap);
        if (!p) loom_panic(__FILE__, __LINE__, "out of memory growing a %zu-byte string pool", m->pool_cap);
        m->pool = p;
    }
    memcpy(m->pool + m->pool_len, key, len);
    size_t mask = m->cap - 1, i = hash & mask;
    while (m->e[i].used) i = (i + 1) & mask;
    e = &m->e[i];
    e->hash = hash;
    e->off = m->pool_len;
    e->len = (uint32_t)len;
    e->used = 1;
    e->val = init;
    m->pool_len += len;
    m->n++;
    if (added) *added = 1;
    return e;
}
