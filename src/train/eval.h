/* eval: validation loss, the one rule shared by `loom train` (its periodic
 * and final validation) and `loom eval`. */
#ifndef LOOM_EVAL_H
#define LOOM_EVAL_H

#include "data/dataset.h"
#include "model/gpt.h"

typedef struct {
    double loss;  /* mean over the scored batches */
    int batches;  /* batches scored */
    int B, T;     /* batch shape used (smaller than asked when the split is short) */
} loom_eval_result_t;

/* The batches loom_eval_loss scores: (B, T) shrunk to a short split, and
 * their count *nb (at most max_batches, 0 = all); batch i starts at token
 * i * B * T of the validation split. */
loom_status loom_eval_plan(const loom_dataset_t *ds, int *B, int *T, int max_batches, int *nb);

/* The mean of score()'s losses over those batches: what loom_eval_loss
 * runs with one forward per batch, and a pipeline with its stages'. */
typedef loom_status (*loom_eval_score_fn)(void *ctx, const int *in, const int *tg, int B, int T, float *loss);
loom_status loom_eval_batches(const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_score_fn score, void *ctx,
                              loom_eval_result_t *out);

/* Mean loss of model `m` over consecutive (B, T) batches from the start of
 * the validation split: as many as fit without a target wrapping past the
 * split's end, at most `max_batches` (0 = all). A split shorter than one
 * batch is scored as one sequence of what it holds. Fails when the split
 * has fewer than two tokens. */
loom_status loom_eval_loss(loom_gpt_t *m, const loom_dataset_t *ds, int B, int T, int max_batches,
                           loom_eval_result_t *out);

struct loom_quant;
/* The same batches and mean loss as loom_eval_loss, scored through the
 * inference forward (model/infer.h: the paged KV cache, the kernels that
 * sample and serve run), one sequence at a time: with the int8 linear
 * weights q (model/quant.h; NULL: fp32) and a KV cache of kv_dtype (fp32
 * or int8). What `loom eval --quant/--kv-dtype` reports. */
loom_status loom_eval_loss_infer(loom_gpt_t *m, const struct loom_quant *q, loom_dtype kv_dtype, const loom_dataset_t *ds,
                                 int B, int T, int max_batches, loom_eval_result_t *out);

#endif
