/* tp: tensor parallelism, Megatron's split of every block over the N
 * ranks of a group (docs/dist.md, "Tensor parallel").
 *
 * Each rank holds a model of its own whose config is the whole model's
 * with NH/N query heads (the head size kept: head_dim), KV/N key/value
 * heads when N divides KV (else the one kv head its query heads read,
 * the same on N/KV ranks, its gradient summed over them), H/N MLP hidden
 * units and Vp/N rows of the vocabulary (Vp padded to a multiple of 64 N
 * for the split; the rows past the model's Vp are zero and never saved):
 *
 *   qkv, fc (SwiGLU: gate and up each)   split by rows (output columns)
 *   attn proj, fc proj                   split by input columns; their
 *                                        biases live on rank 0 (zeros on
 *                                        the others), so the sum adds each once
 *   wte, lm_head                         split by vocabulary rows
 *   norms, wpe                           replicated
 *
 * The forward all-reduces the row-parallel matmuls' outputs, the embedding
 * (each rank looks up its rows, zeros for the others') and, on the sharded
 * logits, three numbers per row (max, sum of exp, target logit) for the
 * cross-entropy; the backward all-reduces the input gradients of the
 * column-parallel matmuls and of the head. Activations are summed at the
 * backend's act_dtype as stored (bf16/fp16 on CUDA: NCCL's native sums),
 * the cross-entropy's statistics in fp32. Every collective runs on the
 * tp group, never the world; a dp group (ranks with the same tp index)
 * averages gradients through train/step.h's data-parallel code (bucketed,
 * overlapped with backward, ZeRO 1/2/3 over the shard).
 *
 * Checkpoints stay in the single-model layout: loom_tp_gather assembles
 * the whole model from the shards, loom_tp_slice cuts a rank's shard from
 * it. */
#ifndef LOOM_TP_H
#define LOOM_TP_H

#include "model/gpt.h"
#include "parallel/dist.h"

typedef struct loom_tp loom_tp_t;

/* The config of one rank's shard of `full` (finished) over n ranks, or an
 * error saying which size n does not divide. */
loom_status loom_tp_local_config(const loom_gpt_config_t *full, int n, loom_gpt_config_t *local);

/* The element type the hooks' all-reduces sum activations at `act` (a
 * backend's act_dtype) in: fp32, bf16 and fp16 as they are stored; any
 * other an error naming the dtypes that work. */
loom_status loom_tp_act_elem(loom_dtype act, loom_dist_elem *elem);

/* Rank loom_dist_rank(group) of a tp group over `group`, its shard
 * cut from `full` (parameters only; any backend); dp: the data-parallel
 * group (NULL or size 1: none). The shard lives on `be` with gradients
 * and AdamW state. Neither group is owned. */
loom_status loom_tp_init(loom_tp_t **out, const loom_gpt_t *full, const loom_backend_t *be, loom_dist_t *group,
                         loom_dist_t *dp);
void loom_tp_free(loom_tp_t *tp);
/* This rank's shard (with the hooks installed). */
loom_gpt_t *loom_tp_model(const loom_tp_t *tp);
/* The whole model's config. */
const loom_gpt_config_t *loom_tp_full_config(const loom_tp_t *tp);

/* Host blocks: `full` (laid out as the whole model's parameter block) to
 * this rank's `local` (the shard's block): parameters, or an AdamW moment
 * (the rank-0-only biases read 0 on the others). */
void loom_tp_slice(const loom_tp_t *tp, const float *full, float *local);
/* A collective over the tp group: every rank's `local` (backend memory,
 * the shard's block) assembled into `full_host` (the whole model's block;
 * NULL on ranks that only give). */
loom_status loom_tp_gather(loom_tp_t *tp, const float *local, float *full_host);

/* After the micro-batches' backward and the data-parallel reduction
 * (train/step.h's loom_dp_*, which averages over the dp group): the first
 * error a hook met (hooks return nothing), then the gradients made
 * whole-model: a shared kv head's summed over its ranks, the rank-0
 * biases' zeroed elsewhere. g holds floats [lo, hi) of the shard's
 * gradient block (the whole block, or this rank's ZeRO shard of it; g[0]
 * = float lo; the ranks of a tp group pass the same window). */
loom_status loom_tp_finish_grads(loom_tp_t *tp, float *g, size_t lo, size_t hi);
/* Sum of squares of the whole model's gradient within the window (each
 * shard counted once, replicated tensors once), summed over the tp group. */
loom_status loom_tp_grad_sumsq(loom_tp_t *tp, const float *g, size_t lo, size_t hi, double *ss);
/* v (n doubles) = its mean over the dp group (losses). */
loom_status loom_tp_dp_mean(loom_tp_t *tp, double *v, int n);
/* Cumulative seconds blocked on the tp group's collectives, and on the dp group's. */
double loom_tp_wait_seconds(const loom_tp_t *tp);
double loom_tp_dp_wait_seconds(const loom_tp_t *tp);

#endif
