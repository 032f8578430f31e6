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

/* Mean loss of model `m` over consecutive (B, T) batches from the start of
 * the validation split: as many as fit without a target wrapping past the
 * split's end, at most `max_batches` (0 = all). A split shorter than one
 * batch is scored as one sequence of what it holds. Fails when the split
 * has fewer than two tokens. */
loom_status loom_eval_loss(loom_gpt_t *m, const loom_dataset_t *ds, int B, int T, int max_batches,
                           loom_eval_result_t *out);

#endif
