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
/* The same written range by range, for a model no process holds whole
 * (tensor and pipeline parallel checkpoints, train/ckpt_stream.h): open
 * writes the header; put takes floats [a, b) of the whole model's
 * parameter block (the config's table) and writes every tensor that lies
 * wholly inside it, so ranges must not cut a tensor; close(commit = 1)
 * syncs and renames into place, close(0) drops the file. */
typedef struct loom_st_writer loom_st_writer_t;
loom_status loom_safetensors_stream_open(loom_st_writer_t **w, const loom_gpt_config_t *cfg, const char *path);
loom_status loom_safetensors_stream_put(loom_st_writer_t *w, size_t a, size_t b, const float *x);
loom_status loom_safetensors_stream_close(loom_st_writer_t *w, int commit);
/* Read parameters from `path` into an allocated model of the same config;
 * missing tensors, wrong shapes, dtypes or a truncated file are errors
 * naming the tensor. */
loom_status loom_safetensors_load_gpt(loom_gpt_t *m, const char *path);

#endif
