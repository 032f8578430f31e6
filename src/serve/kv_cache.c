/* kv_cache: block bookkeeping and the prefix cache (see kv_cache.h). */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"

struct loom_kv_pool {
    int total, nfree, debug, cache, bs;
    int *free_list;  /* (total) stack of free block ids, nfree of them */
    int *refs;       /* (total) reference counts */
    /* prefix cache: each block's registration, a hash index, an LRU list */
    char *reg;       /* (total) 1: registered (hash, parent, tokens below are valid) */
    uint64_t *hash, *parent; /* (total) */
    int *tokens;     /* (total, bs) the block's tokens */
    int *hnext;      /* (total) next registered block in the same bucket, -1 */
    int *bucket;     /* (nbucket) first registered block, -1 */
    int nbucket;     /* a power of two, at least total */
    int *prev, *next; /* (total) LRU links of cached unused blocks, -1 */
    int lru_head, lru_tail, ncached; /* head: least recently used (evicted first) */
};

loom_kv_pool_t *loom_kv_pool_new(int num_blocks, int block_size, int cache, int debug) {
    loom_kv_pool_t *p = loom_calloc(1, sizeof *p);
    size_t n = (size_t)num_blocks;
    p->total = p->nfree = num_blocks;
    p->debug = debug;
    p->cache = cache;
    p->bs = block_size;
    p->free_list = loom_malloc(n * sizeof(int));
    p->refs = loom_calloc(n, sizeof(int));
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < num_blocks; i++) p->free_list[i] = num_blocks - 1 - i;
    p->reg = loom_calloc(n, 1);
    p->hash = loom_calloc(n, sizeof(uint64_t));
    p->parent = loom_calloc(n, sizeof(uint64_t));
    p->tokens = loom_calloc(cache ? n * (size_t)block_size : 1, sizeof(int));
    p->hnext = loom_malloc(n * sizeof(int));
    p->prev = loom_malloc(n * sizeof(int));
    p->next = loom_malloc(n * sizeof(int));
    for (p->nbucket = 1; p->nbucket < num_blocks; p->nbucket *= 2) {}
    p->bucket = loom_malloc((size_t)p->nbucket * sizeof(int));
    for (int i = 0; i < p->nbucket; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return p;
}

void loom_kv_pool_free(loom_kv_pool_t *p) {
    if (!p) return;
    void *v[] = {p->free_list, p->refs, p->reg, p->hash, p->parent, p->tokens, p->hnext, p->prev, p->next, p->bucket};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
    free(p);
}

/* ---- the LRU list of cached blocks nobody holds ---- */

static void lru_push(loom_kv_pool_t *p, int b) {
    p->prev[b] = p->lru_tail, p->next[b] = -1;
    if (p->lru_tail >= 0) p->next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->ncached++;
}

static void lru_remove(loom_kv_pool_t *p, int b) {
    if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
    else p->lru_head = p->next[b];
    if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
    else p->lru_tail = p->prev[b];
    p->ncached--;
}

/* ---- the hash index of registered blocks ---- */

static int *bucket_of(loom_kv_pool_t *p, uint64_t hash) { return &p->bucket[hash & (uint64_t)(p->nbucket - 1)]; }

static void unregister(loom_kv_pool_t *p, int b) {
    for (int *at = bucket_of(p, p->hash[b]); *at >= 0; at = &p->hnext[*at])
        if (*at == b) {
            *at = p->hnext[b];
            break;
        }
    p->reg[b] = 0;
}

static int find(loom_kv_pool_t *p, uint64_t hash, uint64_t parent, const int *tokens) {
    for (int b = *bucket_of(p, hash); b >= 0; b = p->hnext[b])
        if (p->hash[b] == hash && p->parent[b] == parent &&
            memcmp(p->tokens + (size_t)b * p->bs, tokens, (size_t)p->bs * sizeof(int)) == 0)
            return b;
    return -1;
}

uint64_t loom_kv_block_hash(uint64_t parent, const int *tokens, int block_size) {
    return loom_hash64(tokens, (size_t)block_size * sizeof(int), parent);
}

int loom_kv_pool_lookup(loom_kv_pool_t *p, uint64_t hash, uint64_t parent, const int *tokens) {
    if (!p->cache) return -1;
    int b = find(p, hash, parent, tokens);
    if (b < 0) return -1;
    if (p->refs[b]++ == 0) lru_remove(p, b);
    return b;
}

void loom_kv_pool_register(loom_kv_pool_t *p, int b, uint64_t hash, uint64_t parent, const int *tokens) {
    if (p->debug && (b < 0 || b >= p->total || p->refs[b] < 1))
        loom_panic(__FILE__, __LINE__, "KV block %d registered while not owned", b);
    if (!p->cache || p->reg[b] || find(p, hash, parent, tokens) >= 0) return;
    p->reg[b] = 1;
    p->hash[b] = hash, p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * p->bs, tokens, (size_t)p->bs * sizeof(int));
    int *head = bucket_of(p, hash);
    p->hnext[b] = *head;
    *head = b;
}

/* ---- blocks ---- */

int loom_kv_pool_alloc(loom_kv_pool_t *p) {
    int b;
    if (p->nfree > 0) {
        b = p->free_list[--p->nfree];
    } else if (p->ncached > 0) { /* evict the least recently used cached block */
        b = p->lru_head;
        lru_remove(p, b);
        unregister(p, b);
    } else {
        return -1;
    }
    if (p->debug && p->refs[b] != 0)
        loom_panic(__FILE__, __LINE__, "KV block %d handed out while %d owner(s) still hold it", b, p->refs[b]);
    p->refs[b] = 1;
    return b;
}

void loom_kv_pool_ref(loom_kv_pool_t *p, int block) {
    if (p->debug && (block < 0 || block >= p->total || p->refs[block] < 1))
        loom_panic(__FILE__, __LINE__, "KV block %d shared while not owned", block);
    p->refs[block]++;
}

void loom_kv_pool_release(loom_kv_pool_t *p, int block) {
    if (block < 0 || block >= p->total || p->refs[block] < 1)
        loom_panic(__FILE__, __LINE__, "KV block %d released more often than it was taken", block);
    if (--p->refs[block] > 0) return;
    if (p->reg[block]) lru_push(p, block);
    else p->free_list[p->nfree++] = block;
}

int loom_kv_pool_refs(const loom_kv_pool_t *p, int block) { return p->refs[block]; }
int loom_kv_pool_free_count(const loom_kv_pool_t *p) { return p->nfree + p->ncached; }
int loom_kv_pool_cached_count(const loom_kv_pool_t *p) { return p->ncached; }

/* ---- audit ---- */

/* The free list, the LRU list and the index against the counts. */
static loom_status audit_lists(const loom_kv_pool_t *p) {
    for (int i = 0; i < p->nfree; i++) {
        int b = p->free_list[i];
        if (p->refs[b] != 0 || p->reg[b])
            return loom_error(LOOM_EINTERNAL, "KV block %d is on the free list but owned (%d) or registered (%d)", b, p->refs[b], p->reg[b]);
    }
    int n = 0;
    for (int b = p->lru_head; b >= 0 && n <= p->total; b = p->next[b], n++)
        if (p->refs[b] != 0 || !p->reg[b])
            return loom_error(LOOM_EINTERNAL, "KV block %d is cached unused but owned (%d) or not registered", b, p->refs[b]);
    if (n != p->ncached) return loom_error(LOOM_EINTERNAL, "KV cache: %d blocks on the LRU list, %d counted", n, p->ncached);
    for (int b = 0; b < p->total; b++)
        if (p->reg[b] && find((loom_kv_pool_t *)p, p->hash[b], p->parent[b], p->tokens + (size_t)b * p->bs) < 0)
            return loom_error(LOOM_EINTERNAL, "KV block %d is registered but not found under its hash", b);
    return LOOM_OK;
}

loom_status loom_kv_pool_audit(const loom_kv_pool_t *p, const int *const *tables, const int *lens,
                               int n) {
    int *seen = loom_calloc((size_t)p->total, sizeof(int)), owned = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++)
        for (int k = 0; k < lens[i]; k++) {
            int b = tables[i][k];
            if (b < 0 || b >= p->total) {
                s = loom_error(LOOM_EINTERNAL, "block table %d entry %d names block %d, outside the pool (%d)", i, k, b, p->total);
                break;
            }
            seen[b]++;
        }
    for (int b = 0; b < p->total && s == LOOM_OK; b++) {
        if (seen[b] != p->refs[b])
            s = loom_error(LOOM_EINTERNAL, "KV block %d: %d reference(s) counted, %d block-table entries name it", b, p->refs[b], seen[b]);
        owned += p->refs[b] > 0;
    }
    if (s == LOOM_OK && owned + p->nfree + p->ncached != p->total)
        s = loom_error(LOOM_EINTERNAL, "KV pool: %d owned + %d free + %d cached blocks != %d in total", owned, p->nfree,
                       p->ncached, p->total);
    if (s == LOOM_OK) s = audit_lists(p);
    free(seen);
    return s;
}
