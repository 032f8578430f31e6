/* paged: the types of the inference engine's paged KV cache (PagedAttention);
 * the ops over it are entries of the one op list (ops.h, backend.h).
 *
 * The KV cache of one layer is a pool of fixed-size blocks; a sequence owns
 * a list of blocks (its block table) and its token at position p lives in
 * block table[p / block_size], at offset p % block_size. A batch mixes rows
 * of many sequences at different positions: prefill (many rows of one
 * prompt) and decode (one row each of many sequences) run in the same call.
 *
 * A loom_kv_layer_t is a host struct holding backend pointers. */
#ifndef LOOM_PAGED_H
#define LOOM_PAGED_H

#include <stddef.h>

/* Element type of the cache. Only F32 exists today; an INT8 cache adds
 * per-block-per-head scales (k_scale, v_scale below) without changing the
 * layout of the blocks or the ops' signatures. */
typedef enum { LOOM_KV_F32 = 0 } loom_kv_dtype;

/* Bytes of one cache element. */
#define LOOM_KV_ELEM_BYTES(d) ((size_t)((d) == LOOM_KV_F32 ? 4 : 1))

/* One layer's cache. */
typedef struct {
    void *k, *v;              /* (num_blocks, NH, block_size, hs) elements of dtype */
    float *k_scale, *v_scale; /* (num_blocks, NH) dequantization scales; NULL for F32 */
    loom_kv_dtype dtype;
    int num_blocks, block_size, NH, hs;
} loom_kv_layer_t;

#endif
