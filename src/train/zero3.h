/* zero3: fully sharded data parallel (ZeRO stage 3, PyTorch's FSDP).
 *
 * Rank r keeps persistently only floats [lo_r, hi_r) of the parameter
 * block: the same contiguous ranges ZeRO-1/2 shard the AdamW moments by
 * (parallel/shard.h), so a checkpoint written by any stage and world size
 * loads into any other by slicing. The gradient shard has the same range.
 *
 * The block is cut into L + 1 units: block l's twelve per-layer slices
 * (strided across tensor kinds in the block, see model/gpt.h) and the
 * non-layer tensors (wte, wpe, lm_head, lnf). A unit's gather buffer holds
 * its slices back to back in block order, so rank r's part of a unit (its
 * range intersected with the slices) is one contiguous segment of the
 * buffer, and one all-gather per unit assembles it (dist.h's counts
 * layout). Two layer buffers: block l computes from one while block l+1's
 * gather (or l-1's in backward) runs into the other (prefetch); the
 * non-layer unit is gathered once per step and kept. Gradients: each
 * block's backward writes a layer-sized buffer (two, alternating), which
 * is reduce-scattered as soon as the block is done; the own segment is
 * added into the gradient shard when the next-but-one block needs the
 * buffer again. The model reads all of this through gpt.h's view and
 * layer_hook; its own m->params is released. */
#ifndef LOOM_ZERO3_H
#define LOOM_ZERO3_H

#include "model/gpt.h"
#include "parallel/dist.h"
#include "train/eval.h"

typedef struct loom_zero3 loom_zero3_t;

/* Shard m over d: rank r keeps [bounds[r], bounds[r+1]) (bounds has
 * world + 1 entries). m->params must hold the whole block (initialized or
 * loaded); it is released. prefetch 0: each gather and reduce-scatter is
 * waited for where it is issued (a baseline for measuring the overlap). */
loom_status loom_zero3_init(loom_zero3_t **out, loom_gpt_t *m, loom_dist_t *d, const size_t *bounds,
                            loom_dist_dtype grad_dtype, int prefetch);
/* Detach from the model and free everything (the model keeps no weights). */
void loom_zero3_free(loom_zero3_t *z);

/* Give the model a whole (zeroed) parameter block again, to load a
 * checkpoint into; loom_zero3_adopt keeps this rank's shard of it and
 * releases it. */
loom_status loom_zero3_unshard(loom_zero3_t *z);
loom_status loom_zero3_adopt(loom_zero3_t *z);

/* This rank's parameter and gradient shards (backend memory, index 0 =
 * float lo of the block). */
float *loom_zero3_params(const loom_zero3_t *z);
float *loom_zero3_grads(const loom_zero3_t *z);

/* A step's parts: zero the gradient shard; each micro-batch's reductions
 * scale by `scale`; after a micro-batch's backward, wait for its
 * reductions and add them into the shard (the first error of the hooks);
 * after AdamW changed the shard, forget every gathered copy. */
void loom_zero3_zero_grads(loom_zero3_t *z, float scale);
loom_status loom_zero3_finish_backward(loom_zero3_t *z);
void loom_zero3_params_changed(loom_zero3_t *z);
/* Validation on every rank (each layer's weights are gathered from all of
 * them): train/eval.h's loss, failing with the first gather or wait that
 * failed inside the forward. */
loom_status loom_zero3_eval_loss(loom_zero3_t *z, const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_result_t *out);

/* The whole parameter block into `host` on rank 0 (P floats; other ranks
 * pass NULL), unit by unit through the gather buffers: no rank holds a
 * second whole copy. Collective: every rank calls it. */
loom_status loom_zero3_gather_host(loom_zero3_t *z, float *host);

/* Bytes this rank holds: shards and gather buffers of parameters and of
 * gradients. */
void loom_zero3_bytes(const loom_zero3_t *z, double *params, double *grads);

#endif
