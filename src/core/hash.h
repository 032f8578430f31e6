/* hash: XXH64, a fast non-cryptographic 64-bit hash (Yann Collet's
 * xxHash, 64-bit variant, written from its specification). It runs at
 * memory speed and catches bit flips and truncation; it is no defence
 * against someone who edits a file on purpose. Results equal `xxhsum -H1`
 * and python's xxhash.xxh64, so files can be checked with other tools. */
#ifndef LOOM_HASH_H
#define LOOM_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* Incremental state: feed bytes with _update in any chunking, read the
 * hash with _digest (which does not change the state). */
typedef struct {
    uint64_t total, v[4];
    unsigned char buf[32];
    size_t fill;
    uint64_t seed;
} loom_hash64_t;

void loom_hash64_init(loom_hash64_t *h, uint64_t seed);
void loom_hash64_update(loom_hash64_t *h, const void *data, size_t n);
uint64_t loom_hash64_digest(const loom_hash64_t *h);
/* One-shot XXH64 of `n` bytes. */
uint64_t loom_hash64(const void *data, size_t n, uint64_t seed);
/* XXH64 (seed 0) of a whole file, read in 1 MB blocks; *bytes gets its size. */
loom_status loom_hash64_file(const char *path, uint64_t *hash, uint64_t *bytes);

#endif
