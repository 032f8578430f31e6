/* infer: the model's inference forward over a paged KV cache.
 *
 * One call runs a batch of rows from many sequences at once: a chunk of a
 * prompt being prefilled (many rows of one sequence) and single decode
 * tokens of other sequences share the same step. Each row's key and value
 * go into the cache at its sequence's block table, and each row attends to
 * positions 0..pos of its own sequence through that table. Logits come
 * back only for the rows asked for (usually each sequence's last row).
 *
 * The cache storage is owned here (the model knows its shape: per layer a
 * typed tensor laid out as backend.h describes, fp32 today); which block
 * belongs to which sequence is the caller's business (src/serve/kv_cache
 * keeps that bookkeeping). Blocks are numbered 0..num_blocks-1. */
#ifndef LOOM_INFER_H
#define LOOM_INFER_H

#include "backend/backend.h"
#include "model/gpt.h"

typedef struct {
    int n_tokens;            /* N rows */
    const int *tokens;       /* (N) host: token ids, checked against the vocabulary */
    const int *pos;          /* (N) host: position of each token in its sequence, < max_seq_len */
    const int *seq;          /* (N) host: the row's sequence, an index into block_tables */
    int n_seqs;              /* S */
    const int *block_tables; /* (S, max_blocks) host; max_blocks = loom_infer_max_blocks() */
    int n_logits;            /* R */
    const int *logit_rows;   /* (R) host: rows whose logits are returned, in this order */
} loom_infer_batch_t;

typedef struct loom_infer loom_infer_t;

/* Bytes of cache one block takes over all layers (K and V). */
size_t loom_infer_block_bytes(const loom_gpt_config_t *cfg, int block_size, loom_dtype dtype);

/* Create an inference context for model `m` (which must outlive it): a
 * cache of num_blocks blocks of block_size tokens (1..256) in the model's
 * backend memory, and activations for batches of up to max_tokens rows,
 * max_seqs sequences and max_logits logit rows. Fails with
 * LOOM_ENOMEM when memory is short. */
loom_status loom_infer_create(loom_infer_t **out, loom_gpt_t *m, int num_blocks, int block_size,
                              loom_dtype dtype, int max_tokens, int max_seqs, int max_logits);
void loom_infer_free(loom_infer_t *inf);

/* Block-table width: ceil(max_seq_len / block_size). */
int loom_infer_max_blocks(const loom_infer_t *inf);

/* Run the batch; logits (R, Vp) host floats receive the logit rows.
 * LOOM_EINVAL (nothing run) for a token outside the vocabulary, a position
 * outside the model, a block id outside the cache or a batch larger than
 * the context was created for. */
loom_status loom_infer_forward(loom_infer_t *inf, const loom_infer_batch_t *b, float *logits);

struct loom_quant;
/* Run the linear layers (and the logits product when q has an int8 wte)
 * on q's int8 weights (model/quant.h; NULL: fp32).
 * q must outlive its use here. */
void loom_infer_set_quant(loom_infer_t *inf, const struct loom_quant *q);

struct loom_sparse24;
/* Run the linear layers on s's 2:4 compressed weights (model/sparse24.h;
 * NULL: dense) where no int8 copy is set, for batches of up to
 * LOOM_SPARSE24_MAX_ROWS rows. s must outlive its use here. */
void loom_infer_set_sparse24(loom_infer_t *inf, const struct loom_sparse24 *s);

/* out (N, OC) = inp (N, C) @ w^T + bias (GELU when gelu) on a weight
 * as a file stored it (gpt.h file_q: a block format, or int8 from q8_0)
 * with the backend's op for its type: 1, or 0 (nothing run) when the
 * backend has none (then the caller runs the dequantized fp32 weight). */
int loom_infer_file_weight(const loom_backend_t *be, const loom_tensor_t *w, float *out, const float *inp,
                           const float *bias, int N, int C, int OC, int gelu);

/* Copy cache block src to dst in every layer (copy-on-write of a shared block). */
void loom_infer_copy_block(loom_infer_t *inf, int src, int dst);

#endif
