#include "step_graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PART_ZERO = 1, PART_MICRO = 2, PART_OPT = 4 };

/* Step scalars (backend.h): indices into the device array. */
enum { SC_LR, SC_GRAD_SCALE, SC_T, SC_MAX_NORM, SC_SUMSQ, SC_DLOSS, SC_COUNT = 8 };

struct loom_step_graph {
    loom_gpt_t *m;
    const loom_backend_t *be;
    int graphs;
    /* Device: SC_COUNT step scalars, then the per-position loss summed over
     * the micro-batches (cap floats), so one download returns both. */
    float *dev, *host;
    size_t cap;
    /* The shape and buffers the graphs were captured with; any change
     * drops them and starts a new warm-up. */
    int B, T, accum;
    const float *acts;
    const int *tokens;
    int plain_steps; /* plain steps run at this shape */
    unsigned captured; /* bit k set: graph key k is captured */
    long long skipped; /* updates skipped; AdamW's bias correction counts applied ones */
};

void loom_loss_scaler_init(loom_loss_scaler_t *s, float initial, int interval) {
    s->scale = initial >= 1 ? initial : 1;
    s->interval = interval > 0 ? interval : 2000;
    s->good = 0;
    s->skipped = 0;
}

int loom_loss_scaler_update(loom_loss_scaler_t *s, int overflow) {
    if (overflow) {
        s->skipped++;
        s->good = 0;
        if (s->scale <= 1) return 0;
        s->scale = s->scale / 2 < 1 ? 1 : s->scale / 2;
        return -1;
    }
    if (++s->good < s->interval) return 0;
    s->good = 0;
    if (s->scale >= 16777216.0f) return 0;
    s->scale *= 2;
    return 1;
}

int loom_step_graph_supported(const loom_backend_t *be, char *why, size_t why_size) {
    const char *missing = !be->sumsq_dev ? "sumsq_dev" : !be->adamw_dev ? "adamw_dev" : !be->crossentropy_dev ? "crossentropy_dev" : NULL;
    if (missing && why) snprintf(why, why_size, "the %s backend has no %s", be->name, missing);
    return missing == NULL;
}

loom_status loom_step_graph_init(loom_step_graph_t **out, loom_gpt_t *m, int graphs) {
    *out = NULL;
    char why[128];
    if (!loom_step_graph_supported(m->be, why, sizeof why))
        return loom_error(LOOM_EINVAL, "device-resident step: %s", why);
    if (m->grad_hook)
        return loom_error(LOOM_EINVAL, "device-resident step: the model has a gradient hook (data parallelism), which synchronizes inside backward");
    LOOM_TRY(loom_gpt_alloc_train(m));
    loom_step_graph_t *sg = loom_calloc(1, sizeof *sg);
    sg->m = m;
    sg->be = m->be;
    sg->graphs = graphs && m->be->graph_begin && m->be->graph_end && m->be->graph_replay && m->be->graph_reset;
    *out = sg;
    return LOOM_OK;
}

static void drop_graphs(loom_step_graph_t *sg) {
    if (sg->captured) sg->be->graph_reset();
    sg->captured = 0;
    sg->plain_steps = 0;
}

void loom_step_graph_free(loom_step_graph_t *sg) {
    if (!sg) return;
    drop_graphs(sg);
    if (sg->dev) sg->be->free(sg->dev);
    free(sg->host);
    free(sg);
}

int loom_step_graph_uses_graphs(const loom_step_graph_t *sg) { return sg->graphs; }

/* The launches of `parts` of a step. Nothing here synchronizes with the
 * host or allocates, so it can be captured. */
static void run_parts(loom_step_graph_t *sg, int parts, int B, int T, const loom_adamw_t *hp) {
    loom_gpt_t *m = sg->m;
    const loom_backend_t *be = sg->be;
    float *sc = sg->dev, *loss_sum = sg->dev + SC_COUNT;
    size_t BT = (size_t)B * T;
    if (parts & PART_ZERO) {
        loom_gpt_zero_grad(m);
        be->zero(loss_sum, BT * sizeof(float));
    }
    if (parts & PART_MICRO) {
        loom_gpt_forward_dev(m, B, T, sc);
        be->accumulate(loss_sum, loom_gpt_losses_dev(m, B, T), BT);
        loom_gpt_backward(m, B, T);
    }
    if (parts & PART_OPT) {
        be->zero(sc + SC_SUMSQ, sizeof(float));
        be->sumsq_dev(sc + SC_SUMSQ, m->grads, m->num_params);
        loom_gpt_adamw_dev(m, hp, sc);
    }
}

static loom_status capture(loom_step_graph_t *sg, int parts, int B, int T, const loom_adamw_t *hp) {
    LOOM_TRY(sg->be->graph_begin(parts));
    run_parts(sg, parts, B, T, hp);
    LOOM_TRY(sg->be->graph_end(parts));
    sg->captured |= 1u << parts;
    return LOOM_OK;
}

/* A failed capture: nothing captured ran, so run `parts` plainly, and use
 * plain launches from now on instead of ending the run. */
static loom_status plain_from_now(loom_step_graph_t *sg, int parts, int B, int T, const loom_adamw_t *hp) {
    loom_warn("CUDA graph capture failed (%s); running the step with plain launches from now on", loom_errmsg());
    drop_graphs(sg);
    sg->graphs = 0;
    run_parts(sg, parts, B, T, hp);
    return LOOM_OK;
}

/* Run `parts` plainly during warm-up, else replay their graph (capturing
 * it the first time). Returns whether it replayed through *replayed. */
static loom_status launch(loom_step_graph_t *sg, int parts, int B, int T, const loom_adamw_t *hp, int *replayed) {
    *replayed = 0;
    if (!sg->graphs || sg->plain_steps < LOOM_STEP_GRAPH_WARMUP) {
        run_parts(sg, parts, B, T, hp);
        return LOOM_OK;
    }
    if (!(sg->captured & (1u << parts)) && capture(sg, parts, B, T, hp) != LOOM_OK) return plain_from_now(sg, parts, B, T, hp);
    loom_status s = sg->be->graph_replay(parts);
    if (s == LOOM_EINVAL) {
        /* The backend dropped its graphs (it had to grow a scratch buffer
         * for a larger op elsewhere, e.g. an evaluation): capture again;
         * nothing of this replay ran. */
        sg->captured = 0;
        if (capture(sg, parts, B, T, hp) != LOOM_OK) return plain_from_now(sg, parts, B, T, hp);
        s = sg->be->graph_replay(parts);
    }
    LOOM_TRY(s);
    *replayed = 1;
    return LOOM_OK;
}

loom_status loom_step_graph_run(loom_step_graph_t *sg, const int *tokens, const int *targets, int B, int T,
                                int accum, const loom_optim_t *opt, float lr, int t, loom_loss_scaler_t *ls,
                                loom_step_result_t *res) {
    loom_gpt_t *m = sg->m;
    const loom_backend_t *be = sg->be;
    size_t BT = (size_t)B * T;
    if (accum < 1) return loom_error(LOOM_EINVAL, "gradient accumulation %d: expected at least 1", accum);
    if (BT > sg->cap) {
        drop_graphs(sg); /* they point at the old buffer */
        if (sg->dev) be->free(sg->dev);
        free(sg->host);
        sg->dev = be->alloc((SC_COUNT + BT) * sizeof(float));
        sg->host = loom_malloc((SC_COUNT + BT) * sizeof(float));
        sg->cap = sg->dev ? BT : 0;
        if (!sg->dev) return loom_error(LOOM_ENOMEM, "cannot allocate %zu floats of step scalars on %s", SC_COUNT + BT, be->name);
    }
    float scale = ls ? ls->scale : 1.0f;
    int tb = t - (int)sg->skipped; /* updates applied so far, this one included */
    if (tb < 1) tb = 1;
    /* Each micro-batch's loss is a mean over B*T and the step's the mean
     * over micro-batches, as in loom_train_step. */
    float s[SC_COUNT] = {[SC_LR] = lr, [SC_GRAD_SCALE] = 1.0f / scale, [SC_T] = (float)tb, [SC_MAX_NORM] = opt->clip,
                         [SC_DLOSS] = scale / ((float)BT * (float)accum)};
    loom_adamw_t hp = {.lr = lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                       .weight_decay = opt->weight_decay, .grad_scale = 1.0f / scale, .t = tb};
    int replayed = 0;
    for (int k = 0; k < accum; k++) {
        LOOM_TRY(loom_gpt_set_batch(m, tokens + k * BT, targets + k * BT, B, T));
        if (k == 0) {
            if (B != sg->B || T != sg->T || accum != sg->accum || m->acts != sg->acts || m->tokens != sg->tokens) {
                drop_graphs(sg);
                sg->B = B, sg->T = T, sg->accum = accum;
                sg->acts = m->acts;
                sg->tokens = m->tokens;
            }
            be->upload(sg->dev, s, sizeof s);
        }
        int parts = PART_MICRO | (k == 0 ? PART_ZERO : 0) | (k == accum - 1 ? PART_OPT : 0);
        LOOM_TRY(launch(sg, parts, B, T, &hp, &replayed));
    }
    if (!replayed) sg->plain_steps++;
    be->download(sg->host, sg->dev, (SC_COUNT + BT) * sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < BT; i++) sum += sg->host[SC_COUNT + i];
    float sumsq = sg->host[SC_SUMSQ];
    res->loss = (float)(sum / ((double)BT * accum));
    res->grad_norm = sqrtf(sumsq) / scale;
    res->skipped = !isfinite(sumsq);
    res->replayed = replayed;
    if (!isfinite(res->loss))
        return loom_error(LOOM_EINTERNAL, "step %d: loss %g: training diverged; lower --lr or raise --warmup", t, res->loss);
    if (res->skipped) {
        sg->skipped++;
        if (!ls || scale <= 1)
            return loom_error(LOOM_EINTERNAL, "step %d: loss %g, gradient norm %g%s: training diverged; lower --lr or raise --warmup",
                              t, res->loss, res->grad_norm, ls ? " at a loss scale of 1" : "");
    }
    if (ls) loom_loss_scaler_update(ls, res->skipped);
    return LOOM_OK;
}
