/* gguf: GPT-2 and Llama-family (llama, qwen2) models as GGUF v3 files for llama.cpp, written and read.
 *
 * The format (all little-endian; strings are a uint64 length then bytes):
 *   uint32 magic "GGUF" (0x46554747), uint32 version (3),
 *   uint64 tensor count, uint64 metadata count,
 *   metadata: string key, uint32 value type, value (arrays: uint32 element
 *             type, uint64 count, elements),
 *   tensor infos: string name, uint32 n_dims, uint64 ne[n_dims] (ne[0] the
 *             contiguous dimension, so loom's (rows, cols) is [cols, rows]),
 *             uint32 ggml type, uint64 offset into the data section,
 *   padding to general.alignment (32), then the data section, each tensor
 *   starting on a multiple of 32.
 *
 * What loom writes is what llama.cpp's convert_hf_to_gguf.py writes for
 * GPT2LMHeadModel: general.architecture "gpt2", gpt2.{block_count,
 * context_length, embedding_length, feed_forward_length,
 * attention.head_count, attention.layer_norm_epsilon}, general.file_type,
 * the tokenizer as tokenizer.ggml.{model, pre, tokens, token_type, merges,
 * bos_token_id, eos_token_id, unknown_token_id, add_bos_token,
 * add_eos_token}: a byte-level BPE as model "gpt2" with the pre-tokenizer
 * named as llama.cpp knows its split (gpt-2, llama-bpe, qwen2, smollm), a
 * SentencePiece-style one as model "llama" with scores and
 * add_space_prefix (data/tokenizer.h loom_tokenizer_gguf);
 * tokenizer.chat_template when the run has one; and the tensors named in
 * tensormap.h (no output.weight: llama.cpp ties it to token_embd). Vectors
 * stay f32 in every file type; with q8_0 a matrix whose rows are not a
 * multiple of 32 is written f16 (as the converter falls back).
 *
 * The reader takes loom's files and the converter's (gpt2, llama, qwen2):
 * the types gguf_file.h lists; a wrong magic, a version other than 2 or 3,
 * another architecture, a missing or misshapen tensor or a tensor past the
 * end of the file are errors naming the file and the tensor. */
#ifndef LOOM_GGUF_H
#define LOOM_GGUF_H

#include "ckpt/tensormap.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

#define LOOM_GGUF_MAGIC 0x46554747u /* "GGUF" */
#define LOOM_GGUF_VERSION 3
#define LOOM_GGUF_ALIGN 32

typedef struct {
    const loom_gpt_config_t *cfg;
    const loom_tokenizer_t *tok; /* embedded; its vocabulary <= cfg->vocab_size; NULL: none (token ids only) */
    loom_xdtype dtype;           /* matrices: f32, f16, bf16 or q8_0 */
    const char *name;            /* general.name */
    loom_xsource_fn src;         /* the weights, one tensor at a time (GPT-2's table) */
    void *src_ctx;
    const float *params;         /* or, when set: the model's host parameter block (loom_gpt_param_table's
                                  * layout); required for the Llama family */
    const char *chat_template;   /* tokenizer.chat_template (Jinja), or NULL: none */
} loom_gguf_write_opts_t;

/* Write a GGUF file to PATH.tmp, one tensor in memory at a time, then fsync
 * and rename it to `path`. The architecture follows the config: gpt2, llama
 * (RMSNorm, RoPE, SwiGLU, no biases; q and k rows in llama.cpp's rotary
 * order, gguf_map.h) or qwen2 (with q, k, v biases); the llama.* keys are
 * what convert_hf_to_gguf.py writes for LlamaForCausalLM (block_count,
 * context_length, embedding_length, feed_forward_length,
 * attention.head_count, attention.head_count_kv,
 * attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
 * vocab_size, and rope.scaling.* when linear). Llama 3's RoPE scaling is
 * the converter's rope_freqs.weight (f32, head size / 2 divisors of the
 * frequencies), which the reader turns back into the scaling. */
loom_status loom_gguf_write(const char *path, const loom_gguf_write_opts_t *o);

/* Load a GGUF file (gpt2, llama, qwen2; gguf_map.h): a new model on `be`
 * and the embedded tokenizer (*tok NULL when it has none; one loom does not
 * implement is said and left out). The tokenizer is built from
 * tokenizer.ggml.* as llama.cpp's converter writes them: model "gpt2"
 * (byte-level BPE split as tokenizer.ggml.pre says: gpt-2/default,
 * llama-bpe, qwen2, smollm) with its merges, or "llama" (SentencePiece-
 * style BPE, merges made from tokenizer.ggml.scores, <0xNN> byte
 * fallback, add_space_prefix); token_type, bos/eos/unknown ids and
 * add_bos_token/add_eos_token (llama.cpp's defaults when absent). The
 * linear layers' block formats are kept as stored (model->file_q; q8_0
 * as int8 with a scale per block of 32, held once: model/quant.h's
 * loom_quant_file_int8), so that
 * they run on the file's own blocks rather than quantized again; the
 * parameter block holds every weight in fp32 as well. */
loom_status loom_gguf_load(const char *path, const loom_backend_t *be, loom_gpt_t **model, loom_tokenizer_t **tok);
/* loom_gguf_load, where fp32_all 0 leaves out the fp32 values of the
 * weights the file's stored ones serve on the CPU's inference path (their
 * part of the parameter block stays unwritten and costs no resident
 * memory; reading them gives zeros): a quantized file then holds its
 * blocks once, plus fp32 norms and whatever is not stored in blocks.
 * loom_gguf_fp32 makes them when something else needs them. On a device,
 * or a backend without the block kernels, everything is fp32 as with 1. */
loom_status loom_gguf_load_opts(const char *path, const loom_backend_t *be, int fp32_all, loom_gpt_t **model, loom_tokenizer_t **tok);
/* The fp32 values loom_gguf_load_opts left out, made from the model's
 * stored weights (m->file_q; nothing without), bit for bit those of
 * loom_gguf_load; ends_only: the embedding and the head only. */
void loom_gguf_fp32(loom_gpt_t *m, int ends_only);

/* The string metadata `key` of the GGUF at `path` (e.g.
 * "tokenizer.chat_template"): *out malloc'd, or NULL when the file has no
 * such string. Errors are the file's (gguf_file.h). */
loom_status loom_gguf_read_str(const char *path, const char *key, char **out);

#endif
