/* sparse24: 2:4-sparse linear weights run compressed at inference.
 *
 * A run pruned by `loom prune` (and fine-tuned with --keep-sparsity) still
 * stores dense fp32 weights with 2 zeros in every 4. When every linear
 * weight of the model (qkv, attention projection, fc, fc projection) has at
 * least 2 zeros in each group of 4 consecutive input columns, each weight
 * w (OC, C) gets a compressed copy, a typed tensor of layout
 * LOOM_LAYOUT_SPARSE24 (backend.h):
 *
 *   values (OC, C/2) fp32   the 2 kept of every 4, in column order
 *   meta   (OC, (C+7)/8)    4 bits per group: the two kept columns' 2-bit
 *                           positions (first in bits 0-1, first < second),
 *                           two groups per byte, the even group low
 *
 * 2 + 1/8 bytes per weight instead of 4. A group with 3 or 4 zeros keeps
 * its non-zeros and then its first zero columns, so the copy decompresses
 * to the dense weight exactly. The model's dense weights stay (the
 * training forward and a backend without the kernel use them) unless the
 * caller gives them back (model/infer.h loom_infer_weights_release_fp32,
 * as `loom serve` does); the inference forward reads the copy through
 * matmul_forward_s24, and once the dense weights are gone, a long prefill
 * run decompresses one weight at a time for the GEMM.
 * docs/quantization.md says why fp32 values and 4-bit groups. */
#ifndef LOOM_SPARSE24_H
#define LOOM_SPARSE24_H

#include "backend/backend.h"
#include "model/gpt.h"

typedef struct loom_sparse24 loom_sparse24_t;

/* Batches of more rows than this run the dense weights: on a CPU the
 * compressed kernel pays only where reading weights is the cost (decode);
 * with many rows the arithmetic is (docs/perf.md, bench/sparse24-kernel.sh). */
#define LOOM_SPARSE24_MAX_ROWS 8

/* --sparse: off runs pruned weights dense; auto compresses them when the
 * model is 2:4 (the default). */
enum { LOOM_SPARSE_OFF = 0, LOOM_SPARSE_AUTO = 1 };

/* Compress w (rows, cols), cols a multiple of 4 and w 2:4 sparse
 * (loom_prune24_violations of model/quant.h 0): values (rows, cols/2), meta (rows,
 * (cols + 7) / 8), the layout above. */
void loom_sparse24_compress(const float *w, long long rows, long long cols, float *values, unsigned char *meta);

/* The compressed copy of m's linear weights, in m's backend memory. m must
 * outlive it. LOOM_EINVAL naming the first weight that is not 2:4 (and
 * `loom prune`) when one is not; LOOM_ENOMEM when memory is short. */
loom_status loom_sparse24_create(loom_sparse24_t **out, const loom_gpt_t *m);
/* For --sparse `mode`: with LOOM_SPARSE_AUTO, the compressed copy when
 * every linear weight of m is 2:4 and m's backend has matmul_forward_s24
 * (said on stderr); else *out = NULL and LOOM_OK (the dense weights run;
 * a 2:4 model on a backend without the kernel says so on stderr). */
loom_status loom_sparse24_auto(loom_sparse24_t **out, const loom_gpt_t *m, int mode);
void loom_sparse24_free(loom_sparse24_t *s);

/* Layer l's linear weight `which` (LOOM_QLIN_* of model/quant.h): rows OC,
 * cols C, fp32 values, layout LOOM_LAYOUT_SPARSE24. */
const loom_tensor_t *loom_sparse24_weight(const loom_sparse24_t *s, int which, int l);
/* Bytes of the compressed values and index bits (all layers). */
size_t loom_sparse24_bytes(const loom_sparse24_t *s);
/* The dense weight of compressed w (host memory, fp32 2:4) into out (rows x cols). */
void loom_sparse24_decompress(const loom_tensor_t *w, float *out);
/* Record that the model's dense linear weights were given back; whether
 * they were (0 for NULL): then only the compressed copy may be read. */
void loom_sparse24_set_dense_gone(loom_sparse24_t *s);
int loom_sparse24_dense_gone(const loom_sparse24_t *s);

#endif
