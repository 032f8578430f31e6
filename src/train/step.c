#include "step.h"

#include <math.h>

loom_status loom_train_step(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                            int accum, const loom_optim_t *opt, float lr, int t, float *loss,
                            float *grad_norm) {
    LOOM_TRY(loom_gpt_alloc_train(m));
    loom_gpt_zero_grad(m);
    size_t BT = (size_t)B * T;
    /* Each micro-batch's loss is a mean over B*T; the step's loss is the
     * mean over micro-batches, so each contributes 1/accum of its gradient. */
    float dloss = 1.0f / ((float)BT * (float)accum);
    double sum = 0;
    for (int k = 0; k < accum; k++) {
        float l;
        LOOM_TRY(loom_gpt_forward(m, tokens + k * BT, targets + k * BT, B, T, dloss, &l));
        loom_gpt_backward(m, B, T);
        sum += l;
    }
    float norm = loom_gpt_grad_norm(m);
    float scale = 1.0f;
    if (opt->clip > 0 && norm > opt->clip) scale = opt->clip / (norm + 1e-6f);
    loom_adamw_t hp = {.lr = lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                       .weight_decay = opt->weight_decay, .grad_scale = scale, .t = t};
    loom_gpt_adamw(m, &hp);
    *loss = (float)(sum / accum);
    *grad_norm = norm;
    if (!isfinite(*loss) || !isfinite(norm))
        return loom_error(LOOM_EINTERNAL, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup", t, *loss, norm);
    return LOOM_OK;
}
