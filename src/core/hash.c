#include "core/hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only, like the rest of loom's formats */
    return v;
}
static inline uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
static inline uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }

void loom_hash64_init(loom_hash64_t *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
}

/* The 32-byte stripe loop; returns the bytes consumed (a multiple of 32). */
static size_t stripes(uint64_t v[4], const unsigned char *p, size_t n) {
    size_t done = 0;
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    for (; done + 32 <= n; done += 32, p += 32) {
        a = round64(a, rd64(p));
        b = round64(b, rd64(p + 8));
        c = round64(c, rd64(p + 16));
        d = round64(d, rd64(p + 24));
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
    return done;
}

void loom_hash64_update(loom_hash64_t *h, const void *data, size_t n) {
    const unsigned char *p = data;
    h->total += n;
    if (h->fill) {
        size_t take = 32 - h->fill < n ? 32 - h->fill : n;
        memcpy(h->buf + h->fill, p, take);
        h->fill += take;
        p += take;
        n -= take;
        if (h->fill < 32) return;
        stripes(h->v, h->buf, 32);
        h->fill = 0;
    }
    size_t done = stripes(h->v, p, n);
    if (n > done) memcpy(h->buf, p + done, n - done); /* p may be NULL when n is 0 */
    h->fill = n - done;
}

uint64_t loom_hash64_digest(const loom_hash64_t *h) {
    uint64_t acc;
    if (h->total >= 32) {
        const uint64_t *v = h->v;
        acc = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++) acc = merge64(acc, v[i]);
    } else {
        acc = h->seed + P5;
    }
    acc += h->total;
    const unsigned char *p = h->buf, *end = h->buf + h->fill;
    for (; p + 8 <= end; p += 8) acc = rotl(acc ^ round64(0, rd64(p)), 27) * P1 + P4;
    if (p + 4 <= end) {
        acc = rotl(acc ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) acc = rotl(acc ^ (uint64_t)*p * P5, 11) * P1;
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

uint64_t loom_hash64(const void *data, size_t n, uint64_t seed) {
    loom_hash64_t h;
    loom_hash64_init(&h, seed);
    loom_hash64_update(&h, data, n);
    return loom_hash64_digest(&h);
}

loom_status loom_hash64_file(const char *path, uint64_t *hash, uint64_t *bytes) {
    FILE *f;
    size_t size;
    LOOM_TRY(loom_file_open_regular(path, &f, &size));
    loom_hash64_t h;
    loom_hash64_init(&h, 0);
    size_t cap = 1 << 20, n;
    unsigned char *buf = loom_malloc(cap);
    while ((n = fread(buf, 1, cap, f)) > 0) loom_hash64_update(&h, buf, n);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return loom_error(LOOM_EIO, "%s: read failed", path);
    *hash = loom_hash64_digest(&h);
    if (bytes) *bytes = h.total;
    return LOOM_OK;
}
