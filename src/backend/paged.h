/* paged: the inference engine's ops over a paged KV cache (PagedAttention).
 *
 * The KV cache of one layer is a pool of fixed-size blocks; a sequence owns
 * a list of blocks (its block table) and its token at position p lives in
 * block table[p / block_size], at offset p % block_size. A batch mixes rows
 * of many sequences at different positions: prefill (many rows of one
 * prompt) and decode (one row each of many sequences) run in the same call.
 *
 * Conventions as in backend.h: fp32 activations, backend memory for every
 * pointer (the loom_kv_layer_t and loom_paged_batch_t structs themselves are
 * host structs holding backend pointers). C channels, NH heads, hs = C/NH,
 * N rows of the batch, S sequences.
 *
 * Every op computes each output row from its own input row (and its own
 * sequence's cache) only, in an order that does not depend on N, on the
 * other rows or on the thread count: on the CPU a sequence's tokens are
 * bitwise the same whether it runs alone or in a batch. */
#ifndef LOOM_PAGED_H
#define LOOM_PAGED_H

#include <stddef.h>

/* Element type of the cache. Only F32 exists today; an INT8 cache adds
 * per-block-per-head scales (k_scale, v_scale below) without changing the
 * layout of the blocks or the ops' signatures. */
typedef enum { LOOM_KV_F32 = 0 } loom_kv_dtype;

/* Bytes of one cache element. */
static inline size_t loom_kv_elem_bytes(loom_kv_dtype d) { return d == LOOM_KV_F32 ? 4 : 1; }

/* One layer's cache. */
typedef struct {
    void *k, *v;              /* (num_blocks, NH, block_size, hs) elements of dtype */
    float *k_scale, *v_scale; /* (num_blocks, NH) dequantization scales; NULL for F32 */
    loom_kv_dtype dtype;
    int num_blocks, block_size, NH, hs;
} loom_kv_layer_t;

/* Where the rows of a batch belong. */
typedef struct {
    int N;                   /* rows */
    const int *pos;          /* (N) position of the row's token in its sequence */
    const int *seq;          /* (N) the row's sequence: its row in block_tables */
    const int *slot;         /* (N) block * block_size + offset where the row's K, V go */
    const int *block_tables; /* (S, max_blocks) block ids of each sequence, in order */
    int max_blocks;
    int max_pos;             /* largest pos in the batch (sizes scratch) */
} loom_paged_batch_t;

typedef struct loom_paged_ops {
    /* out (N,C) = wte[tokens[i]] + wpe[pos[i]]; tokens, pos (N). */
    void (*embed)(float *out, const int *tokens, const int *pos, const float *wte,
                  const float *wpe, int N, int C);
    /* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC, may be NULL), then
     * GELU (tanh) when gelu != 0. Each weight is read from memory once per
     * call whatever N (the matrix-vector path of decode). */
    void (*linear)(float *out, const float *inp, const float *w, const float *bias, int N,
                   int C, int OC, int gelu);
    /* Store the K and V parts of qkv (N,3C) (q, k, v side by side, NH heads
     * each) into the cache at each row's slot. */
    void (*kv_write)(const loom_kv_layer_t *kv, const float *qkv, const loom_paged_batch_t *b);
    /* out (N,C): causal attention of each row's q (in qkv (N,3C)) over keys
     * and values 0..pos[i] of its sequence, read from the cache through its
     * block table (kv_write first). Scale 1/sqrt(hs). */
    void (*attention)(float *out, const float *qkv, const loom_kv_layer_t *kv,
                      const loom_paged_batch_t *b);
    /* out (R,C) = inp[rows[r]] for r < R; rows (R). */
    void (*gather_rows)(float *out, const float *inp, const int *rows, int R, int C);
    /* Copy cache block src to block dst (every head, K and V): copy-on-write. */
    void (*kv_copy_block)(const loom_kv_layer_t *kv, int src, int dst);
} loom_paged_ops_t;

#endif
