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
    const unsigned char *prefill; /* (N) host, or NULL: 1 for a row to run through the packed
                                     GEMM (a prompt row), 0 for the row kernel (a decoded
                                     token); NULL: the rows of a sequence with at least 8
                                     rows in the batch take the GEMM */
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

/* What the inference forward runs instead of the dense fp32 linear
 * weights: an int8 copy (quant) or, without one, a 2:4 compressed copy
 * (s24); both NULL: the fp32 weights. One function decides which, for
 * every path that opens a model for inference (ckpt/open.h, the benches). */
typedef struct {
    int quant;       /* loom_quant_mode (model/quant.h); LOOM_QUANT_NONE: no int8 copy */
    int block;       /* int8 scales: 0 per output channel, 32 per block (Q8_0) */
    int fp32_logits; /* 1: the logits product stays fp32 under quant */
    int sparse;      /* LOOM_SPARSE_AUTO or LOOM_SPARSE_OFF (model/sparse24.h); used without quant */
} loom_infer_weights_opts_t;

typedef struct {
    struct loom_quant *quant;  /* int8 linear weights, or NULL */
    struct loom_sparse24 *s24; /* 2:4 compressed linear weights, or NULL */
} loom_infer_weights_t;

/* The copies `o` asks for, in m's backend memory (m must outlive them):
 * int8 when o->quant is not NONE, else 2:4 when o->sparse is AUTO and
 * every linear weight of m is 2:4 (loom_sparse24_auto says which on
 * stderr). *w is zeroed on an error. */
loom_status loom_infer_weights_create(loom_infer_weights_t *w, const loom_gpt_t *m, const loom_infer_weights_opts_t *o);
void loom_infer_weights_free(loom_infer_weights_t *w);
/* Give back the memory of m's fp32 weights that nothing on the inference
 * path reads: a linear weight whose every layer runs on w's int8 copy (w
 * may be NULL) or on the file's own stored weight (gpt.h file_q) that the
 * backend runs; the embedding and the head when the file's own rows serve
 * them (norms and biases stay), when m lives in CPU memory: their pages
 * are returned to the system (madvise), so the resident memory is what
 * the model computes with. Afterwards those weights read as zeros: only
 * the inference path (with w set) may run m. Returns the bytes given back
 * (0 when nothing is replaced, or on a device). */
size_t loom_infer_weights_release_fp32(loom_gpt_t *m, const loom_infer_weights_t *w);
/* loom_infer_set_quant and loom_infer_set_sparse24 with w's copies (NULL: fp32). */
void loom_infer_set_weights(loom_infer_t *inf, const loom_infer_weights_t *w);

/* Copy cache block src to dst in every layer (copy-on-write of a shared block). */
void loom_infer_copy_block(loom_infer_t *inf, int src, int dst);

#endif
