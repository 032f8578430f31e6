/* step: one optimizer step of the training math, shared by `loom train`,
 * the oracle tests and the benchmarks: zero the gradients, forward and
 * backward over `accum` micro-batches, global-norm clipping, AdamW. */
#ifndef LOOM_STEP_H
#define LOOM_STEP_H

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

#endif
