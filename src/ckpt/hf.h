/* hf: Hugging Face GPT-2 folders, in and out.
 *
 * A folder holds config.json (GPT2Config: model_type "gpt2", n_layer,
 * n_head, n_embd, n_positions, vocab_size), model.safetensors (GPT2Model
 * names as in tensormap.h, with or without the "transformer." prefix;
 * F32, F16 or BF16) and the tokenizer: tokenizer.json, or GPT-2's
 * vocab.json + merges.txt. pytorch_model.bin (a Python pickle) and
 * sharded weights are not read: the error says how to convert them.
 *
 * loom reads the GPT-2 variant it computes: tanh GELU ("gelu_new"), MLP of
 * 4 x n_embd, tied output head, LayerNorm epsilon 1e-5, attention scaled by
 * 1/sqrt(head size); a config asking for anything else is refused, naming
 * the field. The export writes those files plus tokenizer_config.json and
 * special_tokens_map.json, so `AutoTokenizer` and `GPT2LMHeadModel` load it. */
#ifndef LOOM_HF_H
#define LOOM_HF_H

#include "ckpt/tensormap.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

/* Read DIR/config.json into a loom config (padded vocabulary derived).
 * Errors name the file and the field. */
loom_status loom_hf_read_config(const char *dir, loom_gpt_config_t *cfg);
/* The folder's tokenizer (tokenizer.json, else vocab.json + merges.txt). */
loom_status loom_hf_tokenizer(const char *dir, loom_tokenizer_t **tok);
/* For `loom train --init-from DIR --data DATA`: check that the data was
 * made with DIR's tokenizer (`data_tok`, NULL when the data has none, and
 * its vocabulary `data_vocab`) and set cfg->vocab_size to the model's. */
loom_status loom_hf_check_data(const char *dir, const char *data, const loom_tokenizer_t *data_tok, int data_vocab,
                               loom_gpt_config_t *cfg);
/* Load DIR/model.safetensors into `m` (allocated with DIR's config):
 * Conv1D matrices transposed, padded vocabulary rows zero. A missing
 * tensor or a shape that disagrees with config.json is an error naming the
 * file and the tensor. */
loom_status loom_hf_load_weights(loom_gpt_t *m, const char *dir);

/* Write a Hugging Face folder at `dir` (built in DIR.tmp, then renamed; an
 * existing `dir` is replaced only when `force`): config.json,
 * model.safetensors in `dtype` (f32, f16 or bf16), tokenizer.json, vocab.json,
 * merges.txt, tokenizer_config.json, special_tokens_map.json. */
loom_status loom_hf_write(const char *dir, int force, const loom_gpt_config_t *cfg, const loom_tokenizer_t *tok,
                          loom_xdtype dtype, loom_xsource_fn src, void *src_ctx);

#endif
