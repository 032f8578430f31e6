#include "step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "parallel/shard.h"
#include "train/zero3.h"

struct loom_dp {
    loom_gpt_t *m;
    loom_dist_t *d;
    loom_dp_opts_t o;
    int world, rank, gpu;
    size_t *lo, *hi;    /* every rank's shard, world + 1 boundaries in lo */
    float *am, *av;     /* AdamW moments of this rank's shard (ZeRO >= 1) */
    size_t per_layer;   /* gradient floats of one block */
    int issued_lo;      /* layers >= issued_lo have been handed over */
    int reducing;       /* this micro-batch's gradients are reduced */
    float scale;        /* applied by this micro-batch's reductions */
    loom_status hook_err;
    int pending, trim;  /* a micro-batch's reduction not yet waited for; then zero the rest (ZeRO-2) */
    double last_wait;
    loom_zero3_t *z3;   /* ZeRO-3: the parameters are sharded too */
};

/* Per-layer tensors: block l of each lives at offset + l * numel / L. */
static const int layer_tensors[] = {LOOM_QKVW, LOOM_ATTPROJW, LOOM_FCW, LOOM_FCPROJW, LOOM_LN1W, LOOM_LN1B,
                                    LOOM_QKVB, LOOM_ATTPROJB, LOOM_LN2W, LOOM_LN2B, LOOM_FCB, LOOM_FCPROJB};
#define NLT ((int)(sizeof layer_tensors / sizeof layer_tensors[0]))

/* Hand gradient floats [a, b) of the block to the communication thread. */
static loom_status reduce_range(loom_dp_t *dp, size_t a, size_t b) {
    if (b <= a) return LOOM_OK;
    float *g = dp->m->grads + a;
    if (dp->o.zero == 0) return loom_dist_iallreduce(dp->d, g, b - a, dp->o.grad_dtype, dp->scale);
    size_t counts[dp->world];
    for (int r = 0; r < dp->world; r++) {
        size_t x = a > dp->lo[r] ? a : dp->lo[r], y = b < dp->lo[r + 1] ? b : dp->lo[r + 1];
        counts[r] = y > x ? y - x : 0;
    }
    return loom_dist_ireduce_scatter(dp->d, g, counts, dp->o.grad_dtype, dp->scale);
}

/* Layers [lo, hi) of every per-layer tensor. */
static loom_status reduce_layers(loom_dp_t *dp, int lo, int hi) {
    const loom_gpt_t *m = dp->m;
    int L = m->cfg.n_layer;
    for (int i = 0; i < NLT; i++) {
        const loom_tensor_info_t *ti = &m->ptable[layer_tensors[i]];
        size_t per = ti->numel / (size_t)L;
        LOOM_TRY(reduce_range(dp, ti->offset + (size_t)lo * per, ti->offset + (size_t)hi * per));
    }
    return LOOM_OK;
}

static void on_layer_done(void *ctx, int layer) {
    loom_dp_t *dp = ctx;
    if (!dp->reducing || dp->hook_err != LOOM_OK) return;
    const loom_gpt_t *m = dp->m;
    size_t bucket = dp->o.bucket_floats ? dp->o.bucket_floats : (size_t)1 << 20;
    loom_status s = LOOM_OK;
    if (layer >= 0) {
        if (layer > 0 && (size_t)(dp->issued_lo - layer) * dp->per_layer < bucket) return;
        if (dp->gpu) m->be->sync(); /* NCCL's stream must see finished gradients */
        s = reduce_layers(dp, layer, dp->issued_lo);
        dp->issued_lo = layer;
    } else {
        if (dp->gpu) m->be->sync();
        s = reduce_range(dp, 0, m->ptable[LOOM_QKVW].offset); /* wte, wpe */
        if (s == LOOM_OK) /* an untied lm_head (empty for GPT-2) */
            s = reduce_range(dp, m->ptable[LOOM_LMHEAD].offset, m->ptable[LOOM_LMHEAD].offset + m->ptable[LOOM_LMHEAD].numel);
        if (s == LOOM_OK) s = reduce_range(dp, m->ptable[LOOM_LNFW].offset, m->num_params);
    }
    dp->hook_err = s;
}

loom_status loom_dp_init(loom_dp_t **out, loom_gpt_t *m, loom_dist_t *d, const loom_dp_opts_t *o) {
    *out = NULL;
    if (o->zero < 0 || o->zero > 3) return loom_error(LOOM_EINVAL, "--zero %d: use 0, 1, 2 or 3", o->zero);
    /* ZeRO >= 1 never allocates the whole-model moments, so a model whose
     * full AdamW state would not fit still starts; ZeRO-3 no whole gradient
     * block either (train/zero3.h keeps a shard and two layers' worth). */
    if (o->zero < 3) LOOM_TRY(o->zero >= 1 ? loom_gpt_alloc_grads(m) : loom_gpt_alloc_train(m));
    loom_dp_t *dp = loom_calloc(1, sizeof *dp);
    dp->m = m;
    dp->d = d;
    dp->o = *o;
    dp->world = loom_dist_size(d);
    dp->rank = loom_dist_rank(d);
    dp->gpu = (m->be->caps & LOOM_CAP_DEVICE_MEMORY) != 0;
    dp->lo = loom_malloc(((size_t)dp->world + 1) * sizeof(size_t));
    size_t N = m->num_params, hi_r;
    for (int r = 0; r < dp->world; r++) loom_dp_shard_range(N, dp->world, r, &dp->lo[r], &hi_r);
    dp->lo[dp->world] = N;
    dp->hi = dp->lo + 1;
    size_t per = 0;
    for (int i = 0; i < NLT; i++) per += m->ptable[layer_tensors[i]].numel / (size_t)m->cfg.n_layer;
    dp->per_layer = per;
    /* ZeRO-3 first: the whole parameter block is released before the
     * moments' shard is allocated, so setup's peak stays below training's. */
    if (o->zero == 3) {
        loom_gpt_free_grads(m); /* one a tp shard or a pp stage came with: ZeRO-3 keeps a shard and per-layer buffers */
        loom_status s = loom_zero3_init(&dp->z3, m, d, dp->lo, o->grad_dtype, o->overlap);
        if (s != LOOM_OK) {
            loom_dp_free(dp);
            return s;
        }
    }
    if (o->zero >= 1) {
        size_t n = dp->hi[dp->rank] - dp->lo[dp->rank], bytes = (n ? n : 1) * sizeof(float);
        dp->am = m->be->alloc(bytes);
        dp->av = m->be->alloc(bytes);
        if (!dp->am || !dp->av) {
            loom_dp_free(dp);
            return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of sharded AdamW state", 2 * bytes / 1e6);
        }
        loom_mem_count(LOOM_MEM_OPTIM, 2 * (long long)bytes);
        loom_gpt_free_moments(m);
    }
    if (o->zero < 3 && o->overlap && dp->world > 1) {
        m->grad_hook = on_layer_done;
        m->grad_hook_ctx = dp;
    }
    *out = dp;
    return LOOM_OK;
}

void loom_dp_free(loom_dp_t *dp) {
    if (!dp) return;
    loom_zero3_free(dp->z3);
    if (dp->m->grad_hook_ctx == dp) {
        dp->m->grad_hook = NULL;
        dp->m->grad_hook_ctx = NULL;
    }
    if (dp->am) {
        size_t n = dp->hi[dp->rank] - dp->lo[dp->rank];
        dp->m->be->free(dp->am);
        dp->m->be->free(dp->av);
        loom_mem_count(LOOM_MEM_OPTIM, -2 * (long long)((n ? n : 1) * sizeof(float)));
    }
    free(dp->lo);
    free(dp);
}

struct loom_zero3 *loom_dp_zero3(const loom_dp_t *dp) { return dp ? dp->z3 : NULL; }

void loom_dp_shard(const loom_dp_t *dp, size_t *lo, size_t *hi, float **adam_m, float **adam_v) {
    if (dp->o.zero == 0) {
        *lo = 0;
        *hi = dp->m->num_params;
        *adam_m = dp->m->m;
        *adam_v = dp->m->v;
    } else {
        *lo = dp->lo[dp->rank];
        *hi = dp->hi[dp->rank];
        *adam_m = dp->am;
        *adam_v = dp->av;
    }
}

void loom_dp_memory(const loom_dp_t *dp, loom_dp_memory_t *out) {
    double P = (double)dp->m->num_params, N = dp->world;
    double shard = (double)(dp->hi[dp->rank] - dp->lo[dp->rank]);
    out->params = 4 * P;
    out->grads = 4 * P; /* backward writes the whole block in stages 0-2 */
    if (dp->z3) loom_zero3_bytes(dp->z3, &out->params, &out->grads); /* shards + gather buffers */
    out->optim = dp->o.zero == 0 ? 8 * P : 8 * shard;
    out->total = out->params + out->grads + out->optim;
    static const char *const text[] = {"4P+4P+8P", "4P+4P+8P/N", "4P+4P/N+8P/N", "16P/N"};
    static const double gradf[] = {4, 4, 0, 0}, optf[] = {8, 0, 0, 0};
    int z = dp->o.zero;
    out->formula = (z < 3 ? 4 * P : 4 * P / N) + gradf[z] * P + (z >= 2 ? 4 * P / N : 0) + optf[z] * P + (z >= 1 ? 8 * P / N : 0);
    out->formula_text = text[z];
}

double loom_dp_last_wait(const loom_dp_t *dp) { return dp ? dp->last_wait : 0; }


/* ---- a step's parts (step.h), shared by loom_train_step_dp and the tp
 * and pp steps ---- */

void loom_dp_zero_grads(loom_dp_t *dp, loom_gpt_t *m) {
    if (dp && dp->z3) loom_zero3_zero_grads(dp->z3, 1.0f / (float)dp->world);
    else loom_gpt_zero_grad(m);
}

/* Wait for the last reducing micro-batch's collectives; ZeRO-2 keeps only
 * the own shard's running sum; ZeRO-3 adds its segments into the shard. */
static loom_status settle(loom_dp_t *dp) {
    if (!dp || !dp->pending) return LOOM_OK;
    dp->pending = 0;
    if (dp->z3) return loom_zero3_finish_backward(dp->z3);
    loom_status s = dp->hook_err;
    dp->hook_err = LOOM_OK;
    LOOM_TRY(s);
    LOOM_TRY(loom_dist_wait(dp->d));
    if (dp->trim) {
        size_t lo = dp->lo[dp->rank], hi = dp->hi[dp->rank];
        dp->m->be->zero(dp->m->grads, lo * sizeof(float));
        dp->m->be->zero(dp->m->grads + hi, (dp->m->num_params - hi) * sizeof(float));
    }
    return LOOM_OK;
}

loom_status loom_dp_before_backward(loom_dp_t *dp, int k, int accum) {
    LOOM_TRY(settle(dp));
    if (!dp || dp->z3 || dp->world < 2) return LOOM_OK;
    int last = k == accum - 1;
    /* ZeRO-2 reduces every micro-batch; the intermediate sums stay unscaled. */
    dp->reducing = last || dp->o.zero == 2;
    dp->trim = !last && dp->o.zero == 2;
    dp->scale = last ? 1.0f / (float)dp->world : 1.0f;
    dp->issued_lo = dp->m->cfg.n_layer;
    dp->hook_err = LOOM_OK;
    return LOOM_OK;
}

loom_status loom_dp_after_backward(loom_dp_t *dp) {
    if (!dp) return LOOM_OK;
    if (dp->z3) {
        dp->pending = 1;
        return LOOM_OK;
    }
    if (dp->world < 2 || !dp->reducing) return LOOM_OK;
    dp->pending = 1;
    if (dp->o.overlap) return LOOM_OK; /* the hook handed the buckets over during backward */
    if (dp->gpu) dp->m->be->sync();
    return reduce_range(dp, 0, dp->m->num_params);
}

loom_status loom_dp_grads_ready(loom_dp_t *dp) { return settle(dp); }

int loom_dp_sharded(const loom_dp_t *dp) { return dp && dp->o.zero >= 1; }

float *loom_dp_grads(const loom_dp_t *dp, const loom_gpt_t *m, size_t *lo, size_t *hi) {
    int sharded = loom_dp_sharded(dp);
    *lo = sharded ? dp->lo[dp->rank] : 0;
    *hi = sharded ? dp->hi[dp->rank] : m->num_params;
    return dp && dp->z3 ? loom_zero3_grads(dp->z3) : m->grads + *lo;
}

loom_status loom_dp_sum_sharded(loom_dp_t *dp, double *v, int n) {
    if (!loom_dp_sharded(dp) || dp->world < 2) return LOOM_OK;
    return loom_dist_allreduce_f64(dp->d, v, (size_t)n);
}

/* AdamW on floats [a, b) of the block; p, g, am, av hold the floats from
 * `base` on (the whole block at base 0, or a shard). */
static void adamw_range(loom_gpt_t *m, float *p, float *g, float *am, float *av, size_t base, size_t a, size_t b,
                        const loom_adamw_t *hp) {
    size_t split = m->ptable[LOOM_FIRST_NODECAY].offset;
    size_t d1 = b < split ? b : split;
    if (d1 > a) m->be->adamw(p + (a - base), g + (a - base), am + (a - base), av + (a - base), d1 - a, hp);
    size_t n0 = a > split ? a : split;
    if (b > n0) {
        loom_adamw_t nodecay = *hp;
        nodecay.weight_decay = 0.0f;
        m->be->adamw(p + (n0 - base), g + (n0 - base), am + (n0 - base), av + (n0 - base), b - n0, &nodecay);
    }
}

loom_status loom_dp_update(loom_dp_t *dp, loom_gpt_t *m, const loom_adamw_t *hp) {
    if (!loom_dp_sharded(dp)) {
        loom_gpt_adamw(m, hp);
        return LOOM_OK;
    }
    size_t lo = dp->lo[dp->rank], hi = dp->hi[dp->rank];
    if (dp->z3) {
        adamw_range(m, loom_zero3_params(dp->z3), loom_zero3_grads(dp->z3), dp->am, dp->av, lo, lo, hi, hp);
        loom_zero3_params_changed(dp->z3); /* gathered when the next forward needs them */
        return LOOM_OK;
    }
    adamw_range(m, m->params + lo, m->grads + lo, dp->am, dp->av, lo, lo, hi, hp);
    if (dp->world < 2) return LOOM_OK;
    size_t counts[dp->world];
    for (int r = 0; r < dp->world; r++) counts[r] = dp->hi[r] - dp->lo[r];
    if (dp->gpu) m->be->sync();
    return loom_dist_allgather(dp->d, m->params, counts);
}

/* The whole block of n floats from every rank's [lo_r, hi_r) of it: `own`
 * (this rank's shard) copied into place, the rest all-gathered. */
static loom_status assemble(loom_dp_t *dp, float *whole, const float *own) {
    size_t lo = dp->lo[dp->rank], hi = dp->hi[dp->rank], counts[dp->world];
    if (hi > lo) dp->m->be->accumulate(whole + lo, own, hi - lo); /* a copy: whole is zeroed */
    for (int r = 0; r < dp->world; r++) counts[r] = dp->hi[r] - dp->lo[r];
    if (dp->gpu) dp->m->be->sync();
    return dp->world > 1 ? loom_dist_allgather(dp->d, whole, counts) : LOOM_OK;
}

loom_status loom_dp_gather_state(loom_dp_t *dp, loom_gpt_t *m, float *out[3]) {
    size_t P = m->num_params, bytes = P * sizeof(float);
    int sharded = loom_dp_sharded(dp);
    const float *src[3] = {m->params, sharded ? dp->am : m->m, sharded ? dp->av : m->v};
    if (dp && dp->z3) src[0] = loom_zero3_params(dp->z3);
    loom_status s = LOOM_OK;
    for (int k = 0; k < 3; k++) out[k] = NULL;
    for (int k = 0; k < 3 && s == LOOM_OK; k++) {
        out[k] = m->be->alloc(bytes ? bytes : 4);
        if (!out[k]) {
            s = loom_error(LOOM_ENOMEM, "checkpoint: cannot allocate %.1f MB to assemble this rank's parameters and AdamW state", 3 * bytes / 1e6);
            break;
        }
        m->be->zero(out[k], bytes);
        int whole = !sharded || (k == 0 && !dp->z3); /* ZeRO-1/2 hold every parameter */
        if (whole) m->be->accumulate(out[k], src[k], P);
        else s = assemble(dp, out[k], src[k]);
    }
    if (s != LOOM_OK)
        for (int k = 0; k < 3; k++) {
            if (out[k]) m->be->free(out[k]);
            out[k] = NULL;
        }
    return s;
}

loom_status loom_dp_load_block(loom_dp_t *dp, loom_gpt_t *m, const float *params, const float *am, const float *av) {
    loom_zero3_t *z3 = dp ? dp->z3 : NULL;
    if (params) {
        if (z3) LOOM_TRY(loom_zero3_unshard(z3));
        m->be->upload(m->params, params, m->num_params * sizeof(float));
        if (z3) LOOM_TRY(loom_zero3_adopt(z3));
    }
    if (!am) return LOOM_OK;
    size_t lo = 0, hi = m->num_params;
    float *dm = m->m, *dv = m->v;
    if (dp) loom_dp_shard(dp, &lo, &hi, &dm, &dv);
    if (hi > lo) {
        m->be->upload(dm, am + lo, (hi - lo) * sizeof(float));
        m->be->upload(dv, av + lo, (hi - lo) * sizeof(float));
    }
    return LOOM_OK;
}

/* After the micro-batches: the global gradient norm, clipping and AdamW on
 * this rank's floats [lo, hi) (the whole block without ZeRO), the
 * parameters gathered again (ZeRO-1/2), the loss averaged over ranks.
 * `sum`: this rank's sum of micro-batch losses. */
static loom_status step_tail(loom_gpt_t *m, loom_dp_t *dp, double sum, int accum, const loom_optim_t *opt, float lr, int t,
                             double wait0, float *loss, float *grad_norm) {
    int multi = dp && dp->world > 1;
    size_t lo, hi;
    float *g = loom_dp_grads(dp, m, &lo, &hi);
    float norm;
    if (loom_dp_sharded(dp)) {
        double ss = m->be->sumsq(g, hi - lo);
        LOOM_TRY(loom_dp_sum_sharded(dp, &ss, 1));
        norm = (float)sqrt(ss);
    } else {
        norm = loom_gpt_grad_norm(m);
    }
    float scale = 1.0f;
    if (opt->clip > 0 && norm > opt->clip) scale = opt->clip / (norm + 1e-6f);
    loom_adamw_t hp = {.lr = lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                       .weight_decay = opt->weight_decay, .grad_scale = scale, .t = t};
    LOOM_TRY(loom_dp_update(dp, m, &hp));
    if (multi) {
        LOOM_TRY(loom_dist_allreduce_f64(dp->d, &sum, 1));
        sum /= dp->world;
        dp->last_wait = loom_dist_wait_seconds(dp->d) - wait0;
    }
    *loss = (float)(sum / accum);
    *grad_norm = norm;
    if (!isfinite(*loss) || !isfinite(norm))
        return loom_error(LOOM_EINTERNAL, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup", t, *loss, norm);
    return LOOM_OK;
}

loom_status loom_train_step_dp(loom_gpt_t *m, loom_dp_t *dp, const int *tokens, const int *targets,
                               int B, int T, int accum, const loom_optim_t *opt, float lr, int t,
                               float *loss, float *grad_norm) {
    double sum = 0;
    double wait0 = dp && dp->world > 1 ? loom_dist_wait_seconds(dp->d) : 0;
    if (!(dp && dp->z3)) LOOM_TRY(loom_gpt_alloc_train(m));
    loom_dp_zero_grads(dp, m);
    size_t BT = (size_t)B * T;
    /* Each micro-batch's loss is a mean over B*T; the step's loss is the
     * mean over micro-batches, so each contributes 1/accum of its gradient. */
    float dloss = 1.0f / ((float)BT * (float)accum);
    for (int k = 0; k < accum; k++) {
        float l;
        LOOM_TRY(loom_gpt_forward(m, tokens + k * BT, targets + k * BT, B, T, dloss, &l));
        LOOM_TRY(loom_dp_before_backward(dp, k, accum));
        loom_gpt_backward(m, B, T);
        LOOM_TRY(loom_dp_after_backward(dp));
        sum += l;
    }
    LOOM_TRY(loom_dp_grads_ready(dp));
    return step_tail(m, dp, sum, accum, opt, lr, t, wait0, loss, grad_norm);
}

loom_status loom_train_step(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                            int accum, const loom_optim_t *opt, float lr, int t, float *loss,
                            float *grad_norm) {
    return loom_train_step_dp(m, NULL, tokens, targets, B, T, accum, opt, lr, t, loss, grad_norm);
}
