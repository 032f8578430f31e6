/* quant: int8 weights for inference. At load time each linear layer's
 * weight (OC, C) becomes int8 with one fp32 scale per output channel
 * (scale = max |w[o,:]| / 127; docs/quantization.md says why per channel),
 * or per block of 32 as llama.cpp's Q8_0 (loom_quant_opts_t). The logits
 * product (wte, (Vp, C)) gets its own int8 copy the same way; the
 * embedding lookup, LayerNorms and biases stay fp32. */
#ifndef LOOM_QUANT_H
#define LOOM_QUANT_H

#include "backend/backend.h"
#include "model/gpt.h"

typedef enum {
    LOOM_QUANT_NONE = 0, /* fp32 weights */
    LOOM_QUANT_W8A32,    /* int8 weights dequantized in the kernel, fp32 activations */
    LOOM_QUANT_W8A8,     /* int8 weights and per-token int8 activations, int32 sums */
} loom_quant_mode;

/* The linear layers, in block order. */
enum { LOOM_QLIN_QKV, LOOM_QLIN_ATTPROJ, LOOM_QLIN_FC, LOOM_QLIN_FCPROJ, LOOM_QLIN_COUNT };

typedef struct loom_quant loom_quant_t;

/* "none", "w8a32", "w8a8". */
const char *loom_quant_name(loom_quant_mode q);

/* Quantize w (rows, cols) row by row: q (rows, cols) int8 with
 * q = round(w / s), s[r] = max |w[r,:]| / 127 (1 for an all-zero row), so
 * |w - q * s| <= s / 2. */
void loom_quant_rows(const float *w, long long rows, long long cols, signed char *q, float *s);

/* llama.cpp's Q8_0 quantization of w (rows, cols), cols a multiple of 32:
 * per block of 32, d = max |w| / 127, q = round(w / d), and the scale
 * s = d rounded to fp16 (the value a Q8_0 GGUF stores), so a GGUF written
 * by `loom export --dtype q8_0` holds the same q and s. An all-zero block
 * gets q = 0 and s = 0. s has rows * cols / 32 entries. */
void loom_quant_rows_q8_0(const float *w, long long rows, long long cols, signed char *q, float *s);

typedef struct {
    int block;  /* 0: one scale per output channel (the default); 32: llama.cpp's Q8_0 blocks */
    int logits; /* 1 (the default): the logits product (wte) in int8 too; 0: fp32 */
} loom_quant_opts_t;

/* block 0, logits 1 (docs/quantization.md has the accuracy cost). */
loom_quant_opts_t loom_quant_opts_default(void);

/* The int8 copy of m's linear weights (and wte for the logits, unless
 * opts->logits is 0) in m's backend memory, for `mode` (not NONE); opts
 * NULL: the defaults. A model loaded from a Q8_0 GGUF (loom_quant_file_int8)
 * gets blocks of 32 and the file's own int8 linear weights (and head when
 * q8_0), used in place on a host-memory backend (held once), uploaded to a
 * device's. m must outlive it. LOOM_EINVAL for a block that does
 * not divide the widths, LOOM_ENOMEM when memory is short. */
loom_status loom_quant_create_opts(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode,
                                   const loom_quant_opts_t *opts);
/* loom_quant_create_opts with the defaults. */
loom_status loom_quant_create(loom_quant_t **out, const loom_gpt_t *m, loom_quant_mode mode);
/* Overwrite weight `which` of layer l (LOOM_QLIN_*; or the logits weight:
 * which LOOM_QLIN_COUNT, l 0) with int8 values q (OC, C) and scales s in
 * q's layout (OC or OC * C / block entries), both host memory: for loaders
 * of already-quantized files (a Q8_0 GGUF into a block-32 copy). */
loom_status loom_quant_set(loom_quant_t *q, int which, int l, const signed char *vals, const float *scales);
void loom_quant_free(loom_quant_t *q);
/* A Q8_0 GGUF's linear weights as it stored them: m->file_q's (L, 4)
 * tensors (gpt.h) when every one is int8 with a scale per block of 32,
 * else NULL. The one copy of those bytes: the default forward runs them,
 * and --quant runs them too. */
const loom_tensor_t *loom_quant_file_int8(const loom_gpt_t *m);
/* What a copy of the linear weights holds (this int8 copy, the 2:4 copy of
 * sparse24.h): its tensor table `w` and its one allocation `mem` on m's
 * backend (NULL: none yet); both freed. */
void loom_linear_copy_release(const loom_gpt_t *m, loom_tensor_t *w, void *mem);
loom_quant_mode loom_quant_mode_of(const loom_quant_t *q);
/* Layer l's weight `which` (LOOM_QLIN_*): int8, rows OC, cols C, block 0
 * or 32. */
const loom_tensor_t *loom_quant_weight(const loom_quant_t *q, int which, int l);
/* The logits weight: int8 (Vp, C), or NULL when the logits stay fp32. */
const loom_tensor_t *loom_quant_logits(const loom_quant_t *q);
/* Bytes of weights a decode step reads per token for a model of config c:
 * every matrix once (wte for the logits), int8 plus scales where `mode`
 * (not NONE) quantizes with options o (NULL: defaults), fp32 elsewhere;
 * the position table and the one embedding row are left out. */
size_t loom_quant_decode_bytes(const loom_gpt_config_t *c, loom_quant_mode mode, const loom_quant_opts_t *o);



/* ---- 2:4 structured sparsity ---- */

/* Zero the two smallest-magnitude of every 4 consecutive elements of each
 * row of w (rows, cols), cols a multiple of 4 (the input dimension of a
 * weight (OC, C)); ties keep the earlier element. */
void loom_prune24_rows(float *w, long long rows, long long cols);
/* Groups of 4 of w (rows, cols) with fewer than 2 zeros (0: 2:4 sparse). */
long long loom_prune24_violations(const float *w, long long rows, long long cols);
/* Prune every linear layer's weight of m (embeddings, LayerNorms, biases
 * stay dense). LOOM_EINVAL when a width is not a multiple of 4. */
loom_status loom_prune24_model(loom_gpt_t *m);

/* The zeros of m's linear weights, held through fine-tuning
 * (`loom train --keep-sparsity`): taken once, re-applied after every
 * optimizer step so that pruned weights stay zero. */
typedef struct loom_sparsity_mask loom_sparsity_mask_t;
loom_sparsity_mask_t *loom_sparsity_mask_take(const loom_gpt_t *m);
/* Zero the masked weights of m again; returns how many were non-zero. */
long long loom_sparsity_mask_apply(const loom_sparsity_mask_t *k, loom_gpt_t *m);
/* Share of the linear weights that are masked (0..1). */
double loom_sparsity_mask_share(const loom_sparsity_mask_t *k);
void loom_sparsity_mask_free(loom_sparsity_mask_t *k);

#endif
