/* step_tp: one optimizer step on a tensor-parallel rank (train/step.h):
 * the shard's forward and backward (their collectives run inside, through
 * the model's tp hooks) with the data-parallel replicas' reduction
 * overlapped (train/step.h's parts over the dp group, ZeRO 0-3 over the
 * shard), the gradients made whole-model, the whole model's norm for
 * clipping, AdamW on this rank's part. */
#include <math.h>

#include "parallel/tp.h"
#include "train/step.h"

loom_status loom_train_step_tp(struct loom_tp *tp, loom_dp_t *dp, const int *tokens, const int *targets, int B, int T, int accum,
                               const loom_optim_t *opt, float lr, int t, float *loss, float *grad_norm) {
    loom_gpt_t *m = loom_tp_model(tp);
    loom_dp_zero_grads(dp, m);
    size_t BT = (size_t)B * T;
    float dloss = 1.0f / ((float)BT * (float)accum);
    double sum = 0;
    for (int k = 0; k < accum; k++) {
        float l = 0;
        LOOM_TRY(loom_gpt_forward(m, tokens + k * BT, targets + k * BT, B, T, dloss, &l));
        LOOM_TRY(loom_dp_before_backward(dp, k, accum));
        loom_gpt_backward(m, B, T);
        LOOM_TRY(loom_dp_after_backward(dp));
        sum += l;
    }
    LOOM_TRY(loom_dp_grads_ready(dp));
    size_t lo, hi;
    float *g = loom_dp_grads(dp, m, &lo, &hi);
    LOOM_TRY(loom_tp_finish_grads(tp, g, lo, hi));
    double ss;
    LOOM_TRY(loom_tp_grad_sumsq(tp, g, lo, hi, &ss));
    LOOM_TRY(loom_dp_sum_sharded(dp, &ss, 1)); /* ZeRO: each replica holds a part */
    float norm = (float)sqrt(ss), scale = 1.0f;
    if (opt->clip > 0 && norm > opt->clip) scale = opt->clip / (norm + 1e-6f);
    loom_adamw_t hp = {.lr = lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                       .weight_decay = opt->weight_decay, .grad_scale = scale, .t = t};
    LOOM_TRY(loom_dp_update(dp, m, &hp));
    LOOM_TRY(loom_tp_dp_mean(tp, &sum, 1));
    *loss = (float)(sum / accum);
    *grad_norm = norm;
    if (!isfinite(*loss) || !isfinite(norm))
        return loom_error(LOOM_EINTERNAL, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup", t, *loss, norm);
    return LOOM_OK;
}
