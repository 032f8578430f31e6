/* safetensors: GPT-2 weights in the format the ecosystem reads.
 *
 * Tensor names follow Hugging Face's GPT2Model (`wte.weight`,
 * `h.0.attn.c_attn.weight`, ...); the four projection matrices are stored
 * in Conv1D layout (in, out), i.e. transposed from loom's (out, in); `wte`
 * holds the V real rows, not the padding. float32 only. A file with those
 * names loads in `transformers.GPT2LMHeadModel`. */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include "model/gpt.h"

/* Write the model's parameters to `path` atomically. */
loom_status loom_safetensors_save_gpt(const loom_gpt_t *m, const char *path);
/* The same from a host copy of the parameter block (m->num_params floats),
 * so a background thread can write while training changes m->params. */
loom_status loom_safetensors_save_gpt_host(const loom_gpt_t *m, const float *host, const char *path);
/* Read parameters from `path` into an allocated model of the same config;
 * missing tensors, wrong shapes, dtypes or a truncated file are errors
 * naming the tensor. */
loom_status loom_safetensors_load_gpt(loom_gpt_t *m, const char *path);

#endif
