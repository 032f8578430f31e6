/* kv_cache: bookkeeping of the paged KV cache's blocks (the storage itself
 * lives in the model's inference context, src/model/infer.h).
 *
 * A pool of num_blocks blocks, each holding block_size tokens' keys and
 * values for every layer. A block has a reference count: a sequence that
 * owns it holds one reference; the n samples of one prompt share the
 * prompt's blocks (one reference each) until one of them writes into a
 * shared block, which it first copies (copy-on-write). A block whose count
 * drops to 0 returns to the free list at once.
 *
 * With `debug` on (the tests turn it on) every allocation and release is
 * checked: a block handed out while still owned, or released more often
 * than it was taken, aborts with the block's id, and loom_kv_pool_audit
 * compares the counts with the block tables that claim them. */
#ifndef LOOM_KV_CACHE_H
#define LOOM_KV_CACHE_H

#include "core/core.h"

typedef struct loom_kv_pool loom_kv_pool_t;

/* A pool of num_blocks free blocks. */
loom_kv_pool_t *loom_kv_pool_new(int num_blocks, int debug);
void loom_kv_pool_free(loom_kv_pool_t *p);

/* Take a free block (count 1); -1 when none is free. */
int loom_kv_pool_alloc(loom_kv_pool_t *p);
/* Add a reference to an owned block (sharing it). */
void loom_kv_pool_ref(loom_kv_pool_t *p, int block);
/* Drop a reference; the block is free again when none is left. */
void loom_kv_pool_release(loom_kv_pool_t *p, int block);
/* References a block has (0 = free). */
int loom_kv_pool_refs(const loom_kv_pool_t *p, int block);
/* Free blocks now. */
int loom_kv_pool_free_count(const loom_kv_pool_t *p);

/* Check the pool against the block tables that own blocks: tables[i] holds
 * lens[i] block ids. Every block's count must equal the number of table
 * entries naming it, and free + owned must be the total. LOOM_EINTERNAL
 * with the first difference found. */
loom_status loom_kv_pool_audit(const loom_kv_pool_t *p, const int *const *tables, const int *lens,
                               int n);

#endif
