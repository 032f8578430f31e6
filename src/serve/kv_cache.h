/* kv_cache: bookkeeping of the paged KV cache's blocks (the storage itself
 * lives in the model's inference context, src/model/infer.h).
 *
 * A pool of num_blocks blocks, each holding block_size tokens' keys and
 * values for every layer. A block has a reference count: a sequence that
 * owns it holds one reference; the n samples of one prompt share the
 * prompt's blocks (one reference each) until one of them writes into a
 * shared block, which it first copies (copy-on-write).
 *
 * Prefix caching (as vLLM's): a full block of prompt tokens can be
 * registered under a hash of its tokens and of every token before it
 * (loom_kv_block_hash chains the blocks). A new sequence whose prompt
 * starts with the same tokens looks its blocks up and shares them instead
 * of computing them again. A registered block nobody holds stays cached,
 * on a least-recently-used list; it counts as free, and is evicted (its
 * registration dropped) only when a block is needed and the plain free
 * list is empty, oldest first. Without the cache a block whose count drops
 * to 0 returns to the free list at once.
 *
 * With `debug` on (the tests turn it on) every allocation and release is
 * checked: a block handed out while still owned, or released more often
 * than it was taken, aborts with the block's id, and loom_kv_pool_audit
 * compares the counts with the block tables that claim them and checks the
 * cache's lists and index. */
#ifndef LOOM_KV_CACHE_H
#define LOOM_KV_CACHE_H

#include <stdint.h>

#include "core/core.h"

typedef struct loom_kv_pool loom_kv_pool_t;

/* A pool of num_blocks free blocks of block_size tokens; `cache` 1 keeps
 * registered blocks for reuse (prefix caching), 0 never caches. */
loom_kv_pool_t *loom_kv_pool_new(int num_blocks, int block_size, int cache, int debug);
void loom_kv_pool_free(loom_kv_pool_t *p);

/* Take a free block (count 1), evicting the least recently used cached
 * block when no block is plainly free; -1 when none is left. */
int loom_kv_pool_alloc(loom_kv_pool_t *p);
/* Add a reference to an owned block (sharing it). */
void loom_kv_pool_ref(loom_kv_pool_t *p, int block);
/* Drop a reference; with none left the block is free again, or cached
 * (most recently used) when it is registered. */
void loom_kv_pool_release(loom_kv_pool_t *p, int block);
/* References a block has (0 = free or cached). */
int loom_kv_pool_refs(const loom_kv_pool_t *p, int block);
/* Blocks an allocation can get now (free plus cached unused). */
int loom_kv_pool_free_count(const loom_kv_pool_t *p);
/* Cached blocks nobody holds (part of the free count). */
int loom_kv_pool_cached_count(const loom_kv_pool_t *p);

/* The hash that names a full block of block_size tokens following the
 * blocks whose hash is `parent` (0 before the first block). */
uint64_t loom_kv_block_hash(uint64_t parent, const int *tokens, int block_size);
/* The cached block registered under (hash, parent, tokens), taken with one
 * more reference (leaving the LRU list if nobody held it); -1 when there
 * is none or the cache is off. Tokens and parent are compared too, so a
 * hash collision is a miss, never a wrong block. */
int loom_kv_pool_lookup(loom_kv_pool_t *p, uint64_t hash, uint64_t parent, const int *tokens);
/* Register owned full block `block` under (hash, parent, tokens) for later
 * lookups. Nothing happens when the cache is off, the block is registered
 * already, or another block holds the hash. */
void loom_kv_pool_register(loom_kv_pool_t *p, int block, uint64_t hash, uint64_t parent, const int *tokens);

/* Check the pool against the block tables that own blocks: tables[i] holds
 * lens[i] block ids. Every block's count must equal the number of table
 * entries naming it; free + cached unused + owned must be the total; a
 * free-listed block is neither owned nor registered; a cached unused block
 * is registered and owned by none; every registered block is found under
 * its hash. LOOM_EINTERNAL with the first difference found. */
loom_status loom_kv_pool_audit(const loom_kv_pool_t *p, const int *const *tables, const int *lens,
                               int n);

#endif
