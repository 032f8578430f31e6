/* bpe_map: the two hash tables BPE needs, open addressing with linear
 * probing, growing at 50% load.
 *   loom_pairmap_t: 64-bit key (a pair of ids, a << 32 | b) -> 64-bit value.
 *   loom_strmap_t: byte string -> 64-bit value; keys are copied into the
 *   map's own pool, so callers may pass pointers into temporary buffers. */
#ifndef LOOM_BPE_MAP_H
#define LOOM_BPE_MAP_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_PAIR(a, b) (((uint64_t)(a) << 32) | (uint32_t)(b))

typedef struct {
    uint64_t *keys; /* LOOM_PAIRMAP_EMPTY where unused */
    uint64_t *vals;
    size_t cap, n;  /* cap is a power of two */
} loom_pairmap_t;
#define LOOM_PAIRMAP_EMPTY UINT64_MAX

void loom_pairmap_init(loom_pairmap_t *m, size_t expect);
void loom_pairmap_free(loom_pairmap_t *m);
/* Pointer to the value of `key`, or NULL when absent. */
uint64_t *loom_pairmap_get(const loom_pairmap_t *m, uint64_t key);
/* Pointer to the value of `key`, inserted as `init` when absent. The
 * pointer is valid until the next insertion. */
uint64_t *loom_pairmap_put(loom_pairmap_t *m, uint64_t key, uint64_t init);

typedef struct {
    uint64_t hash;
    size_t off;   /* key bytes at pool + off */
    uint32_t len;
    uint32_t used;
    uint64_t val;
} loom_strmap_entry_t;

typedef struct {
    loom_strmap_entry_t *e;
    size_t cap, n;
    unsigned char *pool;
    size_t pool_len, pool_cap;
} loom_strmap_t;

uint64_t loom_bytes_hash(const void *p, size_t n);
void loom_strmap_init(loom_strmap_t *m, size_t expect);
void loom_strmap_free(loom_strmap_t *m);
/* Forget every key but keep the memory. */
void loom_strmap_clear(loom_strmap_t *m);
/* The entry of the key (hash = loom_bytes_hash(key, len)), or NULL. */
loom_strmap_entry_t *loom_strmap_get(const loom_strmap_t *m, const void *key, size_t len, uint64_t hash);
/* The entry of the key, inserted with value `init` when absent (*added set to
 * 1 then). Valid until the next insertion. */
loom_strmap_entry_t *loom_strmap_put(loom_strmap_t *m, const void *key, size_t len, uint64_t hash,
                                     uint64_t init, int *added);
/* Bytes used by the map, for memory accounting. */
size_t loom_strmap_bytes(const loom_strmap_t *m);

#endif
