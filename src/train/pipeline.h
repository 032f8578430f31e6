/* pipeline: pipeline-parallel training (`loom train --pp N`).
 *
 * The layers are split into N stages of consecutive layers (balanced: the
 * first L mod N stages hold one more); rank r runs stage r mod N of
 * pipeline r / N (parallel/dist.h's placement), so with D = world / N > 1
 * pipelines (pp x dp) a stage's D replicas average their gradients over a
 * process group during the backward passes (train/step.h's bucketed,
 * overlapped reduction; --zero 1/2/3 shards the stage's block over the D
 * replicas: ZeRO-3 each stage its own layers' weights). The
 * first stage also holds the embedding (wte, wpe), the last the final
 * norm, the head and the loss. With a tied head wte lives on both, and
 * their two gradients are summed between them after the backward passes
 * (Megatron's embedding group), so both copies take the same AdamW step.
 *
 * A stage is a loom_gpt_t whose n_layer is its own layer count (so its
 * parameters, gradients, AdamW state and activations are its share), run
 * through loom_gpt_forward_stage / loom_gpt_backward_stage with the
 * residual stream handed between stages by point-to-point sends.
 *
 * Schedule: 1F1B over the step's M micro-batches (--grad-accum M): stage s
 * runs min(N-s-1, M) warm-up forwards, then alternates one forward and one
 * backward, then the remaining backwards. A stage keeps the activations of
 * at most N-s micro-batches in flight (one activation block each). Bubble:
 * (N-1)/(M+N-1) of the step in the ideal schedule.
 *
 * pp x tp (--tp T): every stage is a tensor-parallel group of T
 * consecutive ranks, rank = (dp x N + stage) x T + tp index; the stage
 * model is the tp shard of the stage's layers (the tp hooks run inside
 * its forward and backward), and tp rank i of stage s exchanges the
 * residual stream with tp rank i of stages s-1 and s+1 (the stream is
 * replicated over a tp group: each rank sends its own copy, no broadcast).
 *
 * Checkpoints are always the single-model layout: on save the stages'
 * layers are gathered into a whole model on rank 0 (host memory), which
 * writes model.safetensors and one AdamW file like a 1-process run; on load
 * every rank reads the whole checkpoint and keeps its stage's slice. */
#ifndef LOOM_PIPELINE_H
#define LOOM_PIPELINE_H

#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/dist.h"
#include "train/eval.h"
#include "train/step.h"

typedef struct loom_pp loom_pp_t;

typedef struct {
    int stages;                  /* N >= 2 */
    int tp;                      /* > 1: each stage is a tensor-parallel group of tp ranks (parallel/tp.h) */
    int B, T, micro;             /* micro-batch shape and micro-batches per step (M) */
    loom_recompute recompute;
    unsigned long long seed;     /* the whole model's init (every rank draws the same, then slices) */
    loom_dp_opts_t dpo;          /* the stage replicas' reduction: ZeRO 0-3 over the dp group, overlap, buckets */
} loom_pp_opts_t;

/* The layers of stage s of n over L layers: [*first, *first + *count). */
void loom_pp_split(int L, int n, int s, int *first, int *count);

/* Build this rank's stage of the model `cfg` (unfinished is fine) on `be`
 * over `d`: parameters initialized as the whole model's from o->seed, then
 * sliced; gradients, AdamW state and the in-flight activation blocks
 * allocated. Prints the split. *stage_model is owned by the pipeline. */
loom_status loom_pp_init(loom_pp_t **out, loom_dist_t *d, const loom_gpt_config_t *cfg, const loom_backend_t *be,
                         const loom_pp_opts_t *o, loom_gpt_t **stage_model);
void loom_pp_free(loom_pp_t *pp);

/* The whole model's finished config, and this rank's stage. */
const loom_gpt_config_t *loom_pp_config(const loom_pp_t *pp);
int loom_pp_stage(const loom_pp_t *pp);
/* The stage replicas' data-parallel reduction (train/step.h), NULL without replicas or ZeRO. */
struct loom_dp *loom_pp_dp(const loom_pp_t *pp);

/* One optimizer step over M micro-batches (host tokens/targets, M*(B*T)
 * each, the same on every stage): the loss is the global one (the last
 * stage's, broadcast), the gradient norm the whole model's. */
loom_status loom_pp_step(loom_pp_t *pp, const int *tokens, const int *targets, const loom_optim_t *opt, float lr, int t,
                         float *loss, float *grad_norm);

/* The last step's time: blocked in pipeline send/receive and in the
 * barrier that ends the schedule (comm_s: idle on a neighbour plus
 * transfer), of which idle (bubble_s: comm_s less an estimate of the
 * transfers, each message at the fastest one's time; the barrier's wait is
 * the tail a stage idles while the others finish), and the schedule's wall
 * time with that barrier (sched_s). */
void loom_pp_last_times(const loom_pp_t *pp, double *comm_s, double *bubble_s, double *sched_s);
/* pp x dp: seconds the last step waited on the data-parallel reduction
 * (train/step.h's, over the stage's replicas: overlapped with the backward
 * passes, ZeRO 1/2/3 sharding the stage's block). */
double loom_pp_last_dp_wait(const loom_pp_t *pp);
/* pp x tp: seconds the last step's forward and backward waited on the stage's tp group. */
double loom_pp_last_tp_wait(const loom_pp_t *pp);
/* The 1F1B formula's bubble fraction (N-1)/(M+N-1). */
double loom_pp_bubble_formula(int stages, int micro);

/* Every rank: the validation loss (loom_eval_loss's batches and mean), each
 * batch forward through the stages; the result on every rank. */
loom_status loom_pp_eval(loom_pp_t *pp, const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_result_t *out);

/* Checkpoints. The model the writer saves: rank 0's whole model (host
 * memory), the stage model on other ranks (they write nothing). */
loom_gpt_t *loom_pp_ckpt_model(loom_pp_t *pp);
/* Every rank: gather the stages' parameters and AdamW moments; on rank 0
 * the whole model's parameters are in loom_pp_ckpt_model and *m, *v point
 * at its whole moments (host memory, P floats). */
loom_status loom_pp_gather(loom_pp_t *pp, float **m, float **v);
/* Every rank: load the single-model checkpoint in `dir` (any layout wrote
 * it) and keep this stage's slice of weights and AdamW state. */
loom_status loom_pp_load(loom_pp_t *pp, const char *dir, long long step);
/* Every rank: `load` fills a whole model (host memory, the seed's weights
 * in it; --init-from's Hugging Face folder, --init-from-run's checkpoint)
 * and this stage keeps its slice of the weights (fresh AdamW state). */
loom_status loom_pp_load_weights(loom_pp_t *pp, loom_status (*load)(void *ctx, loom_gpt_t *whole), void *ctx);

#endif
