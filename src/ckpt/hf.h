/* hf: Hugging Face folders, in and out: GPT-2 and the Llama family.
 *
 * A folder holds config.json, the weights and the tokenizer (tokenizer.json,
 * or GPT-2's vocab.json + merges.txt). config.json's `architectures`
 * chooses the model: GPT2LMHeadModel (GPT2Config keys), LlamaForCausalLM,
 * MistralForCausalLM or Qwen2ForCausalLM (LlamaConfig keys; Qwen2 adds
 * q/k/v biases). Weights: model.safetensors, or shards named by
 * model.safetensors.index.json; tensor names as in tensormap.h (GPT-2 with
 * or without the "transformer." prefix); F32, F16 or BF16.
 * pytorch_model.bin (a Python pickle) is not read: the error says how to
 * convert it.
 *
 * loom reads what it computes (docs/llama.md): GPT-2 with tanh GELU, MLP
 * of 4 x n_embd, tied head, LayerNorm epsilon 1e-5; the Llama family with
 * silu, head_dim = hidden_size / heads, rope_scaling none, linear or
 * llama3, no sliding window (Mistral's is honoured by capping the
 * context). A config asking for anything else is refused, naming the file
 * and the field. The export writes config.json, model.safetensors, the
 * tokenizer, tokenizer_config.json and special_tokens_map.json, so
 * `AutoTokenizer` and `AutoModelForCausalLM` load it unchanged. */
#ifndef LOOM_HF_H
#define LOOM_HF_H

#include "ckpt/tensormap.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

/* Read DIR/config.json into a loom config (padded vocabulary derived).
 * Errors name the file and the field. */
loom_status loom_hf_read_config(const char *dir, loom_gpt_config_t *cfg);
/* The same from parsed JSON (`path` for messages): a Hugging Face config,
 * or the model_config of a loom run folder (older ones: GPT-2 keys only). */
struct cJSON;
loom_status loom_hf_config_parse(const struct cJSON *j, const char *path, loom_gpt_config_t *cfg);
/* A config as Hugging Face config.json keys (new cJSON object; the caller
 * adds token ids and torch_dtype, and frees it). */
struct cJSON *loom_hf_config_json(const loom_gpt_config_t *cfg);
/* The folder's tokenizer (tokenizer.json, else vocab.json + merges.txt). */
loom_status loom_hf_tokenizer(const char *dir, loom_tokenizer_t **tok);
/* For `loom train --init-from DIR --data DATA`: check that the data was
 * made with DIR's tokenizer (`data_tok`, NULL when the data has none, and
 * its vocabulary `data_vocab`) and set cfg->vocab_size to the model's. */
loom_status loom_hf_check_data(const char *dir, const char *data, const loom_tokenizer_t *data_tok, int data_vocab,
                               loom_gpt_config_t *cfg);
/* Load DIR's weights (model.safetensors or the shards its index names)
 * into `m` (allocated with DIR's config): Conv1D matrices transposed,
 * q/k/v and gate/up placed in their row ranges, padded vocabulary rows
 * zero. A missing tensor, a missing shard or a shape that disagrees with
 * config.json is an error naming the file and the tensor. */
loom_status loom_hf_load_weights(loom_gpt_t *m, const char *dir);

/* 1 when `dir` is a folder holding config.json (a model an export may
 * replace with --force) or an empty folder; 0 otherwise. */
int loom_hf_model_or_empty_folder(const char *dir);
/* Write a Hugging Face folder at `dir` (built in DIR.tmp, then renamed; an
 * existing `dir` is replaced only when `force`): config.json,
 * model.safetensors in `dtype` (f32, f16 or bf16), tokenizer.json, vocab.json,
 * merges.txt, tokenizer_config.json, special_tokens_map.json. */
loom_status loom_hf_write(const char *dir, int force, const loom_gpt_config_t *cfg, const loom_tokenizer_t *tok,
                          loom_xdtype dtype, loom_xsource_fn src, void *src_ctx);

#endif
