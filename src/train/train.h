/* train: the training loop. Reads batches, runs loom_train_step, follows
 * the learning-rate schedule, evaluates, logs, plots, samples and writes
 * checkpoints into the run folder. */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "core/core.h"

typedef struct {
    const char *data, *model, *out, *device;
    const char *dtype;       /* fp32, tf32, bf16, fp16; NULL or "auto": bf16 on a CUDA GPU that has it, else fp32 */
    const char *cuda_graphs; /* "on" or "off"; NULL = on for CUDA (ignored with a note on the CPU) */
    const char *recompute;   /* activation recompute: none, gelu, all (NULL = none) */
    int layers, heads, channels, context; /* model overrides; 0 = the preset's */
    int batch, seq, grad_accum;           /* seq 0 = the model's context */
    long long steps;
    int warmup;
    double lr, min_lr_ratio, weight_decay, clip, beta1, beta2, val_fraction;
    int eval_every, eval_batches, sample_every, sample_tokens, ckpt_every, keep_ckpts;
    int log_every, threads, force;
    int resume; /* continue the run in `out` from its newest checkpoint */
    const char *init_from; /* Hugging Face GPT-2 folder: architecture and weights (ckpt/hf.h); NULL = a preset */
    long long seed;
    /* Data parallelism. The ranks come from the launch (mpirun, srun, the
     * torchrun environment; see parallel/dist.h); loom_train fills rank and
     * world_size in its own copy. */
    int zero;               /* ZeRO stage 0, 1, 2 */
    const char *grad_dtype; /* gradients on the wire: "fp32" or "bf16" (NULL = fp32) */
    double dist_timeout;    /* seconds a collective may wait for a peer (0 = 300) */
    int no_overlap;         /* reduce after backward instead of during it */
    double bucket_mb;       /* gradient bucket size in MB (0 = 4) */
    int rank, world_size;
} loom_train_opts_t;

/* Learning rate at 1-based step t: linear warmup over `warmup` steps to
 * `lr`, then cosine decay to lr * min_lr_ratio at `steps`. */
double loom_lr_at(long long t, long long steps, int warmup, double lr, double min_lr_ratio);

/* Run a whole training job. SIGINT/SIGTERM stop it after the current step
 * with a final checkpoint. */
loom_status loom_train(const loom_train_opts_t *o);

#endif
