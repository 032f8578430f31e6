/* step_graph: the device-resident training step, for backends with the
 * step-scalar entries (sumsq_dev, adamw_dev, crossentropy_dev; the CUDA
 * backend). The same math as loom_train_step, but nothing the step needs
 * comes back to the host before the optimizer update: lr, gradient scale,
 * step number, clip norm and dloss live in a device array of 8 floats
 * (backend.h, "step scalars"), the gradient norm is summed on the device
 * and AdamW clips with it there. So the whole step can be captured once as
 * a CUDA graph and replayed every step (graph_begin/graph_end/graph_replay):
 * after WARMUP plain steps at a shape, each part of the step is captured
 * under its own key and replayed from then on.
 *
 * Parts of a step, and the graph keys (bit masks) they are captured under:
 * ZERO (gradients and the loss sum to 0), MICRO (forward, loss, backward of
 * one micro-batch), OPT (gradient norm, AdamW). accum 1 is one graph
 * ZERO|MICRO|OPT; accum > 1 is ZERO|MICRO, then MICRO for each middle
 * micro-batch (none when accum is 2), then MICRO|OPT.
 * Each micro-batch's tokens are uploaded into the model's token buffers
 * between replays, outside the graphs.
 *
 * fp16 runs use dynamic loss scaling (loom_loss_scaler_t): the loss
 * gradient is multiplied by the scale, the gradients by its inverse before
 * AdamW; a step whose gradient norm is inf/nan applies no update (adamw_dev
 * skips it on the device), halves the scale and is reported as skipped;
 * after `interval` good steps in a row the scale doubles. */
#ifndef LOOM_STEP_GRAPH_H
#define LOOM_STEP_GRAPH_H

#include "train/step.h"

/* Plain steps at a shape before its graphs are captured: the first sizes
 * the backend's scratch buffers and picks GEMM algorithms. */
#define LOOM_STEP_GRAPH_WARMUP 2

typedef struct {
    float scale;       /* multiplies dloss; the gradients are divided by it */
    int interval;      /* good steps in a row before the scale doubles */
    int good;          /* good steps since the last change */
    long long skipped; /* steps skipped for inf/nan gradients so far */
} loom_loss_scaler_t;

/* Start at `initial` (PyTorch's GradScaler: 65536, interval 2000). */
void loom_loss_scaler_init(loom_loss_scaler_t *s, float initial, int interval);
/* Account one step: overflow = its gradients were inf/nan. Halves the scale
 * (not below 1) on overflow, doubles it (up to 2^24) after `interval` good
 * steps. Returns -1 when it backed off, 1 when it grew, 0 otherwise. */
int loom_loss_scaler_update(loom_loss_scaler_t *s, int overflow);

typedef struct {
    float loss;      /* mean over the micro-batches */
    float grad_norm; /* of the unscaled mean gradient, before clipping; inf/nan when skipped */
    int skipped;     /* inf/nan gradients (fp16 overflow): no update was applied */
    int replayed;    /* the step ran as CUDA graph replays */
} loom_step_result_t;

typedef struct loom_step_graph loom_step_graph_t;

/* Whether backend `be` can run the device-resident step; if not, `why`
 * says which entry it lacks. */
int loom_step_graph_supported(const loom_backend_t *be, char *why, size_t why_size);

/* Set up the device step for model `m` (gradients and AdamW state are
 * allocated here). graphs: capture and replay CUDA graphs; ignored when the
 * backend has no graph entries. The model must have no grad_hook (data
 * parallelism reduces from the host during backward: use loom_train_step_dp). */
loom_status loom_step_graph_init(loom_step_graph_t **out, loom_gpt_t *m, int graphs);
void loom_step_graph_free(loom_step_graph_t *sg);
/* Whether graphs are in use (asked for and available). */
int loom_step_graph_uses_graphs(const loom_step_graph_t *sg);

/* One optimizer step over `accum` micro-batches of (B, T) host tokens and
 * targets back to back, as loom_train_step. ls: dynamic loss scaling (NULL
 * = none); it is updated here. Fails when the loss is inf/nan, or the
 * gradients are without loss scaling (or still at a scale of 1). */
loom_status loom_step_graph_run(loom_step_graph_t *sg, const int *tokens, const int *targets, int B, int T,
                                int accum, const loom_optim_t *opt, float lr, int t, loom_loss_scaler_t *ls,
                                loom_step_result_t *res);

#endif
