/* safetensors: checkpoint weights in the format the ecosystem reads.
 *
 * Tensor names and layouts are tensormap.h's table: for GPT-2 Hugging
 * Face's GPT2Model (`wte.weight`, `h.0.attn.c_attn.weight`, ...; the four
 * projection matrices in Conv1D layout (in, out), transposed from loom's
 * (out, in)), for the Llama family LlamaForCausalLM's (`model.layers.0.
 * self_attn.q_proj.weight`, ...). `wte` holds the V real rows, not the
 * padding. float32 only. */
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
