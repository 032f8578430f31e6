/* tensormap: what the interchange formats (hf.h, gguf.h) share.
 *
 * 1. The tensor table of a config, GPT-2's or the Llama family's (below). GPT-2: each tensor of a loom model under its Hugging
 *    Face name (GPT2Model, `h.0.attn.c_attn.weight`) and its llama.cpp GGUF
 *    name (`blk.0.attn_qkv.weight`), with loom's layout: a matrix is
 *    (rows, cols) = (out, in), cols contiguous, which is torch's nn.Linear
 *    layout and GGUF's [ne0 = cols, ne1 = rows]. Hugging Face's Conv1D
 *    matrices (c_attn, c_proj, c_fc) are stored (in, out), i.e. transposed.
 *    wte holds the V real rows; the padding rows up to Vp are loom's own.
 *
 *      loom      Hugging Face            GGUF (gpt2)              loom shape
 *      wte       wte.weight              token_embd.weight        (V, C)
 *      wpe       wpe.weight              position_embd.weight     (maxT, C)
 *      ln1w/b    h.N.ln_1.weight/bias    blk.N.attn_norm.*        (C)
 *      qkvw/b    h.N.attn.c_attn.*       blk.N.attn_qkv.*         (3C, C) / (3C)
 *      attprojw/b h.N.attn.c_proj.*      blk.N.attn_output.*      (C, C) / (C)
 *      ln2w/b    h.N.ln_2.*              blk.N.ffn_norm.*         (C)
 *      fcw/b     h.N.mlp.c_fc.*          blk.N.ffn_up.*           (4C, C) / (4C)
 *      fcprojw/b h.N.mlp.c_proj.*        blk.N.ffn_down.*         (C, 4C) / (C)
 *      lnfw/b    ln_f.weight/bias        output_norm.weight/bias  (C)
 *
 *    The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
 *    all use these names): a Hugging Face tensor is a range of rows
 *    [row0, row0 + rows) of one layer's slice of a loom tensor; q, k and v
 *    are the three row ranges of qkvw (and qkvb), gate and up the two of
 *    fcw. nn.Linear layout, nothing transposed. GGUF names are llama.cpp's
 *    "llama" architecture; its converter permutes q and k rows for its
 *    interleaved rotary pairing, which the GGUF reader/writer applies.
 *
 *      loom        Hugging Face (model. prefix)       GGUF            rows, cols
 *      wte         embed_tokens.weight                token_embd      V, C
 *      ln1w        layers.N.input_layernorm.weight    blk.N.attn_norm C
 *      qkvw/b      layers.N.self_attn.q_proj.*        blk.N.attn_q    C, C   (row0 0)
 *                  layers.N.self_attn.k_proj.*        blk.N.attn_k    KVhs, C (row0 C)
 *                  layers.N.self_attn.v_proj.*        blk.N.attn_v    KVhs, C (row0 C + KVhs)
 *      attprojw/b  layers.N.self_attn.o_proj.*        blk.N.attn_output C, C
 *      ln2w        layers.N.post_attention_layernorm  blk.N.ffn_norm  C
 *      fcw/b       layers.N.mlp.gate_proj.*           blk.N.ffn_gate  H, C (row0 0)
 *                  layers.N.mlp.up_proj.*             blk.N.ffn_up    H, C (row0 H)
 *      fcprojw/b   layers.N.mlp.down_proj.*           blk.N.ffn_down  C, H
 *      lnfw        norm.weight                        output_norm     C
 *      lm_head     lm_head.weight (no prefix)         output          V, C (untied only)
 *
 *    Biases exist as the config's `bias` says (Qwen2: q, k, v).
 *
 * 2. Element encodings: f32, f16 (IEEE half, round to nearest even), bf16
 *    (round to nearest even), q8_0 (llama.cpp's: blocks of 32 values stored
 *    as one fp16 scale d = max|x|/127 then 32 int8 q = round(x/d), 34 bytes).
 *
 * 3. A read-only, mmap'd view of a safetensors file, so that exporting a
 *    checkpoint holds one tensor at a time in memory. */
#ifndef LOOM_TENSORMAP_H
#define LOOM_TENSORMAP_H

#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"

typedef struct {
    char hf[64];       /* Hugging Face name (GPT-2: without the "transformer." prefix) */
    char gguf[64];     /* llama.cpp name */
    int param, layer;  /* loom parameter (LOOM_WTE ...) and layer, -1 when not per-layer */
    int conv1d;        /* stored (in, out) by Hugging Face */
    size_t row0;       /* first row of the layer's slice of `param` it holds (q, k, v; gate, up) */
    size_t rows, cols; /* loom layout; cols = 0 for a vector of `rows` values */
    size_t numel;
} loom_xtensor_t;

/* The tensor table of a config, in Hugging Face file order; *out is
 * malloc'd, caller frees. Returns the count. */
int loom_xtensors(const loom_gpt_config_t *cfg, loom_xtensor_t **out);
/* Where tensor `x` starts in a parameter block laid out by `table`
 * (its numel floats follow contiguously). */
size_t loom_xtensor_offset(const loom_tensor_info_t *table, const loom_xtensor_t *x);
/* Where tensor `x` lives in a host copy of m's parameter block. */
float *loom_xtensor_view(const loom_gpt_t *m, float *host, const loom_xtensor_t *x);

/* Element encodings of exported tensors. */
typedef enum { LOOM_XDT_F32 = 0, LOOM_XDT_F16, LOOM_XDT_BF16, LOOM_XDT_Q8_0 } loom_xdtype;
/* Parse "f32", "f16", "bf16", "q8_0"; -1 if unknown. */
int loom_xdtype_parse(const char *s);
const char *loom_xdtype_name(loom_xdtype t);
/* Bytes of n values (q8_0: n must be a multiple of 32). */
size_t loom_xdtype_bytes(loom_xdtype t, size_t n);
/* Encode n floats into dst / decode n values into floats. */
void loom_xencode(loom_xdtype t, const float *src, size_t n, void *dst);
void loom_xdecode(loom_xdtype t, const void *src, size_t n, float *dst);
/* The first NaN or infinity of a tensor read from `path` is an error naming
 * the tensor and the element: every weight loader (safetensors checkpoints,
 * Hugging Face folders, GGUF, export) refuses such weights before any math. */
loom_status loom_check_finite(const float *p, size_t n, const char *name, const char *path);
uint16_t loom_f32_to_f16(float f);
float loom_f16_to_f32(uint16_t h);

/* Where a writer gets tensor x's values, in loom layout (x->numel floats). */
typedef loom_status (*loom_xsource_fn)(void *ctx, const loom_xtensor_t *x, float *out);

/* Fill m's parameters from `src` one tensor at a time (the padding rows of
 * wte stay zero) and upload them; the first failing tensor's error returns. */
loom_status loom_xload(loom_gpt_t *m, loom_xsource_fn src, void *ctx);

/* A mmap'd safetensors file. */
typedef struct loom_stview loom_stview_t;
/* Map `path` and parse its header; errors name the file. */
loom_status loom_stview_open(loom_stview_t **out, const char *path);
void loom_stview_close(loom_stview_t *v);
/* Read tensor `name` (or "transformer." + name) of the given shape (ndim
 * 1 or 2) as floats in the file's layout; F32, F16 and BF16 are read.
 * A missing tensor, another shape or data outside the file is an error
 * naming the file and the tensor. */
loom_status loom_stview_read(const loom_stview_t *v, const char *name, int ndim, const size_t shape[2], float *out);
/* A loom_xsource_fn over a Hugging Face GPT-2 safetensors file (ctx: the
 * view): reads x->hf and transposes Conv1D matrices into loom's layout. */
loom_status loom_xsource_safetensors(void *ctx, const loom_xtensor_t *x, float *out);

#endif
