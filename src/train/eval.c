#include "train/eval.h"

#include <stdlib.h>

loom_status loom_eval_loss(loom_gpt_t *m, const loom_dataset_t *ds, int B, int T, int max_batches,
                           loom_eval_result_t *out) {
    size_t nval = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL);
    if (nval < 2) return loom_error(LOOM_EINVAL, "no validation tokens to score (the validation split holds %zu)", nval);
    size_t per = (size_t)B * T;
    if (nval - 1 < per) { /* shrink to what the split holds */
        B = 1;
        if ((size_t)T > nval - 1) T = (int)(nval - 1);
        per = (size_t)T;
    }
    int nb = (int)((nval - 1) / per);
    if (max_batches > 0 && max_batches < nb) nb = max_batches;
    int *in = loom_malloc(per * sizeof(int)), *tg = loom_malloc(per * sizeof(int));
    double sum = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < nb && s == LOOM_OK; i++) {
        float l;
        loom_dataset_batch(ds, LOOM_SPLIT_VAL, (size_t)i * per, B, T, in, tg);
        s = loom_gpt_forward(m, in, tg, B, T, 0.0f, &l);
        sum += l;
    }
    free(in);
    free(tg);
    *out = (loom_eval_result_t){sum / nb, nb, B, T};
    return s;
}
