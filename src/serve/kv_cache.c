#include "kv_cache.h"

#include <stdlib.h>

struct loom_kv_pool {
    int total, nfree, debug;
    int *free_list; /* (total) stack of free block ids, nfree of them */
    int *refs;      /* (total) reference counts */
};

loom_kv_pool_t *loom_kv_pool_new(int num_blocks, int debug) {
    loom_kv_pool_t *p = loom_calloc(1, sizeof *p);
    p->total = p->nfree = num_blocks;
    p->debug = debug;
    p->free_list = loom_malloc((size_t)num_blocks * sizeof(int));
    p->refs = loom_calloc((size_t)num_blocks, sizeof(int));
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < num_blocks; i++) p->free_list[i] = num_blocks - 1 - i;
    return p;
}

void loom_kv_pool_free(loom_kv_pool_t *p) {
    if (!p) return;
    free(p->free_list);
    free(p->refs);
    free(p);
}

int loom_kv_pool_alloc(loom_kv_pool_t *p) {
    if (p->nfree == 0) return -1;
    int b = p->free_list[--p->nfree];
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
    if (--p->refs[block] == 0) p->free_list[p->nfree++] = block;
}

int loom_kv_pool_refs(const loom_kv_pool_t *p, int block) { return p->refs[block]; }
int loom_kv_pool_free_count(const loom_kv_pool_t *p) { return p->nfree; }
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
    if (s == LOOM_OK && owned + p->nfree != p->total)
        s = loom_error(LOOM_EINTERNAL, "KV pool: %d owned + %d free blocks != %d in total", owned, p->nfree, p->total);
    for (int i = 0; i < p->nfree && s == LOOM_OK; i++)
        if (p->refs[p->free_list[i]] != 0)
            s = loom_error(LOOM_EINTERNAL, "KV block %d is on the free list but owned", p->free_list[i]);
    free(seen);
    return s;
}
