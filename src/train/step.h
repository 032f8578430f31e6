/* step: one optimizer step of the training math, shared by `loom train`,
 * the oracle tests and the benchmarks: zero the gradients, forward and
 * backward over `accum` micro-batches, global-norm clipping, AdamW. */
#ifndef LOOM_STEP_H
#define LOOM_STEP_H

#include "parallel/dist.h"
#include "model/gpt.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; 0 = no clipping */
} loom_optim_t;

/* tokens, targets: host int32, accum micro-batches of (B, T) back to back.
 * lr: this step's learning rate; t: 1-based step number.
 * Returns the mean loss over all micro-batches and the global gradient norm
 * before clipping (of the mean gradient). Clipping follows PyTorch's
 * clip_grad_norm_: scale = min(1, clip / (norm + 1e-6)). */
loom_status loom_train_step(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                            int accum, const loom_optim_t *opt, float lr, int t, float *loss,
                            float *grad_norm);

/* ---- Data parallelism ----
 * Each rank runs loom_train_step_dp on its own slice of the global batch;
 * gradients are averaged over ranks so that N ranks take the same step
 * as one rank with N times the batch (up to float summation order).
 *
 * With overlap on, the backward hook hands finished layers' gradients to
 * the communication thread in buckets of about `bucket_floats`, so the
 * reduction runs while backward goes on.
 *
 * ZeRO: stage 0 all-reduces gradients and every rank runs AdamW on all
 * parameters. Stage 1 reduce-scatters gradients; rank r keeps AdamW moments
 * only for its contiguous shard of the parameter block, updates that shard,
 * and all-gathers the parameters. Stage 2 also reduces after every
 * micro-batch, so the accumulated gradient lives only in the rank's shard
 * (the rest of the gradient block is a working buffer that backward
 * writes, zeroed after each micro-batch). Stage 3 shards the parameters
 * as well (same ranges): train/zero3.h gathers each block's weights just
 * before its forward and backward and reduce-scatters its gradients as
 * soon as its backward ends; with overlap on, the next block's gather is
 * prefetched while this one computes. */
typedef struct {
    int zero;                   /* 0, 1, 2, or 3 (train/zero3.h: the parameters sharded too) */
    loom_dist_dtype grad_dtype; /* gradients on the wire */
    int overlap;                /* 1: reduce buckets during backward */
    size_t bucket_floats;       /* 0 = 1M floats (4 MB) */
} loom_dp_opts_t;

typedef struct loom_dp loom_dp_t;

/* Set up data parallelism for model `m` (gradients allocated here) over
 * `d`. With ZeRO >= 1 the model's full AdamW moments are released and a
 * shard-sized pair is kept instead. */
loom_status loom_dp_init(loom_dp_t **out, loom_gpt_t *m, loom_dist_t *d, const loom_dp_opts_t *o);
void loom_dp_free(loom_dp_t *dp);

/* This rank's shard of the parameter block, [*lo, *hi) in floats (the whole
 * block for ZeRO 0), and its AdamW moments (host or device memory, hi-lo
 * floats each; for ZeRO 0 the model's own m->m, m->v from offset 0). */
void loom_dp_shard(const loom_dp_t *dp, size_t *lo, size_t *hi, float **adam_m, float **adam_v);

/* Bytes this rank holds for model state, and what the ZeRO paper's
 * formula says it should hold (params 4P, grads 4P, AdamW 8P; stage 1:
 * 4P + 4P + 8P/N; stage 2: 4P + 4P/N + 8P/N). formula_text: e.g. "4P+4P+8P/N". */
typedef struct {
    double params, grads, optim, total;
    double formula;
    const char *formula_text;
} loom_dp_memory_t;
void loom_dp_memory(const loom_dp_t *dp, loom_dp_memory_t *out);

/* ZeRO-3's state (train/zero3.h), NULL under the other stages. */
struct loom_zero3 *loom_dp_zero3(const loom_dp_t *dp);

/* Seconds the last step spent blocked waiting for communication. */
double loom_dp_last_wait(const loom_dp_t *dp);

/* loom_train_step over ranks: the same contract, with the returned loss
 * the mean over every rank's micro-batches. dp == NULL is loom_train_step. */
loom_status loom_train_step_dp(loom_gpt_t *m, loom_dp_t *dp, const int *tokens, const int *targets,
                               int B, int T, int accum, const loom_optim_t *opt, float lr, int t,
                               float *loss, float *grad_norm);

/* ---- A step's parts, for steps that run their own forward and backward
 * (tensor parallel, train/step_tp.c; the pipeline, train/pipeline.c) over
 * the local parameter set (a tp shard, a stage's layers) and a
 * data-parallel process group: dp from loom_dp_init(m = that local model,
 * d = the dp group). The same bucketed, overlapped reduction and ZeRO
 * 1/2/3 as loom_train_step_dp, which is built from these. dp == NULL: one
 * replica, no ZeRO (the model's own whole block).
 *
 *   loom_dp_zero_grads                      start of the step
 *   forward; loom_dp_before_backward(k);    micro-batch k of accum (any
 *   backward; loom_dp_after_backward        order of forwards between)
 *   loom_dp_grads_ready                     the step's gradient is reduced:
 *   loom_dp_grads -> [lo, hi)               this rank's floats of it
 *   loom_dp_update                          AdamW (and the ZeRO-1/2 all-gather) */
void loom_dp_zero_grads(loom_dp_t *dp, loom_gpt_t *m);
loom_status loom_dp_before_backward(loom_dp_t *dp, int k, int accum);
loom_status loom_dp_after_backward(loom_dp_t *dp);
loom_status loom_dp_grads_ready(loom_dp_t *dp);
/* 1 when this rank holds only its shard [lo, hi) of the reduced gradient
 * (ZeRO >= 1): sums over it (the norm) are summed over the dp group. */
int loom_dp_sharded(const loom_dp_t *dp);
/* This rank's reduced gradient floats [*lo, *hi) of the local block
 * (backend memory; index 0 = float lo). */
float *loom_dp_grads(const loom_dp_t *dp, const loom_gpt_t *m, size_t *lo, size_t *hi);
/* v (n doubles) summed over the dp group when sharded (else unchanged). */
loom_status loom_dp_sum_sharded(loom_dp_t *dp, double *v, int n);
loom_status loom_dp_update(loom_dp_t *dp, loom_gpt_t *m, const loom_adamw_t *hp);
/* Checkpoints and resumes in the single-model layout. gather: the whole
 * local block's parameters, AdamW m and v into out[0..2] (backend memory
 * allocated here, P floats each; the caller frees them with be->free);
 * a collective over the dp group. load: host blocks of the whole local
 * block (params or am/av may be NULL: kept) into the model, this rank's
 * shard of them under ZeRO. */
loom_status loom_dp_gather_state(loom_dp_t *dp, loom_gpt_t *m, float *out[3]);
loom_status loom_dp_load_block(loom_dp_t *dp, loom_gpt_t *m, const float *params, const float *am, const float *av);

/* ---- Tensor parallelism (parallel/tp.h; train/step_tp.c) ----
 * The same contract on a rank of a tp group: every rank of the group
 * passes the same micro-batches (dp groups their own slices); the loss and
 * the gradient norm are the whole model's. dp: the data-parallel replicas
 * (loom_dp_init over the tp shard and the dp group), or NULL. */
struct loom_tp;
loom_status loom_train_step_tp(struct loom_tp *tp, loom_dp_t *dp, const int *tokens, const int *targets, int B, int T, int accum,
                               const loom_optim_t *opt, float lr, int t, float *loss, float *grad_norm);

#endif
