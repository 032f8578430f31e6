#include "layout.h"

#include <math.h>
#include <string.h>

#include "plan/plan.h"

void loom_layout_split_params(const loom_gpt_config_t *cfg, double *per_layer, double *shared) {
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t P;
    loom_gpt_param_table(cfg, t, &P);
    double layers = 0;
    for (int i = 0; i < LOOM_NPARAMS; i++)
        if (i != LOOM_WTE && i != LOOM_WPE && i != LOOM_LMHEAD && i != LOOM_LNFW && i != LOOM_LNFB) layers += (double)t[i].numel;
    *per_layer = layers / cfg->n_layer;
    *shared = (double)P - layers;
}

/* Bytes of activations one stage keeps: the layer tensors for its layers
 * and the micro-batches in flight, and the shared tensors (logits,
 * backward scratch) once. Tensor parallel splits a layer's activations as
 * Korthikanti et al. 2022 (eq. 2) count them without sequence parallel:
 * of 34 sbh + 5 a s^2 b, the 10 sbh of the norms and dropouts stay whole
 * on every tp rank; under full recompute only each layer's input is kept,
 * whole on every tp rank. */
static double stage_acts(const loom_layout_env_t *e, const loom_layout_t *l, int layers, int in_flight) {
    loom_act_info_t a[LOOM_ACT_MAX];
    int na;
    loom_gpt_act_table(e->cfg, l->rc, l->micro, e->T, a, &na);
    double per_layer = 0, shared = 0;
    for (int i = 0; i < na; i++) {
        double w = a[i].f32 ? 4 : e->act_bytes;
        if (a[i].slices > 1) per_layer += (double)a[i].slice_floats * w;
        else shared += (double)a[i].floats * w;
    }
    double h = e->cfg->channels, as_h = 5.0 * e->cfg->n_head * e->T / h;
    double split = l->rc == LOOM_RECOMPUTE_ALL ? 1 : (10 + 24.0 / l->tp + as_h / l->tp) / (34 + as_h);
    return per_layer * split * layers * in_flight + shared / l->tp;
}

static void layout_memory(const loom_layout_env_t *e, const loom_layout_t *l, loom_layout_cost_t *o) {
    double pl, sh;
    loom_layout_split_params(e->cfg, &pl, &sh);
    int layers = (e->cfg->n_layer + l->pp - 1) / l->pp;
    /* The first stage holds the embedding; with a tied head the last
     * stage holds a copy of it too (Megatron's layout), so the fullest
     * stage has ceil(L/pp) layers and every shared tensor. */
    double Ps = (layers * pl + sh) / l->tp;
    double whole = l->zero == 3 ? Ps / l->dp : Ps;
    o->params = 4 * whole; /* fp32 masters, as loom keeps them */
    o->grads = 4 * whole;  /* whole below ZeRO-3: backward writes every gradient */
    o->optim = 8 * (l->zero >= 1 ? Ps / l->dp : Ps);
    /* ZeRO-3 gathers one layer's weights and gradients at a time, with
     * the next layer's prefetched: two layers' whole tensors, and the
     * shared tensors while the embedding and head run. */
    o->gather = l->zero == 3 ? 8 * (2 * pl + sh) / l->tp : 0;
    int in_flight = l->m < l->pp ? l->m : l->pp; /* 1F1B: stage 0 holds p micro-batches */
    o->acts = stage_acts(e, l, layers, in_flight);
    /* Interleaved 1F1B warms up with (p-1)/V more chunks in flight on the
     * first stage: 1 + (p-1)/(pV) times 1F1B's (Korthikanti et al. 2022,
     * section 4.2.3). */
    if (l->vs > 1) o->acts *= 1 + (double)(l->pp - 1) / ((double)l->pp * l->vs);
    o->batch = 12.0 * l->micro * e->T;
    o->runtime = e->runtime;
    o->mem = o->params + o->grads + o->optim + o->gather + o->acts + o->batch + o->runtime;
}

/* Seconds for `bytes` point to point at gbs GB/s. */
static double p2p_s(double bytes, double gbs, double latency_s) { return bytes / (gbs * 1e9) + latency_s; }

static void layout_dp(const loom_layout_env_t *e, const loom_layout_t *l, double Ps, double t_mb, loom_layout_cost_t *o) {
    /* dp peers sit tp x pp apart (tp innermost, then pp): NVLink while the
     * whole ring stays in one NVLink domain, else InfiniBand. */
    double bw = (l->tp * l->pp * l->dp <= e->nvlink_domain ? e->nvlink_gbs : e->ib_gbs) * e->link_eff;
    double ar = loom_plan_allreduce_s(e->grad_bytes * Ps, l->dp, bw, e->latency_s);
    double rs = ar / 2, ag = loom_plan_allreduce_s(4 * Ps, l->dp, bw, e->latency_s) / 2;
    /* Data parallel alone: the last micro-batch's backward hides the
     * reduction (buckets reduced as they fill). Under a pipeline the
     * replicas reduce after every micro-batch's backward, not overlapped:
     * loom's pipeline (train/pipeline.c, one all-reduce of the stage's
     * block) and Megatron-LM's 2021 local DDP alike. */
    double backward = l->pp > 1 ? 0 : t_mb * 2 / 3;
    if (l->zero == 0) {
        o->dp_s = ar, o->dp_exposed_s = fmax(0, ar - backward);
    } else if (l->zero == 1) {
        o->dp_s = rs + ag, o->dp_exposed_s = fmax(0, rs - backward) + ag;
    } else if (l->zero == 2) {
        o->dp_s = l->m * rs + ag, o->dp_exposed_s = l->m * fmax(0, rs - backward) + ag;
    } else {
        /* ZeRO-3: each micro-batch gathers the weights for its forward and
         * again for its backward and reduce-scatters the gradients, all
         * prefetched behind compute. */
        o->dp_s = l->m * (2 * ag + rs);
        o->dp_exposed_s = fmax(0, o->dp_s - t_mb * l->m);
    }
}

void loom_layout_cost(const loom_layout_env_t *e, const loom_layout_t *l, loom_layout_cost_t *o) {
    memset(o, 0, sizeof *o);
    layout_memory(e, l, o);
    const loom_gpt_config_t *cfg = e->cfg;
    double full = l->rc == LOOM_RECOMPUTE_ALL ? 8.0 / 6.0 : 1; /* a second forward: 8ND, not 6ND */
    o->tokens = (double)l->dp * l->micro * e->T * l->m;
    o->compute_s = loom_gpt_flops_per_token(cfg, e->T) * full * o->tokens / ((double)e->gpus * e->rate);
    int layers = (cfg->n_layer + l->pp - 1) / l->pp;
    double act = (double)l->micro * e->T * cfg->channels * e->act_bytes;
    /* Megatron's tp: two all-reduces per layer in the forward, two in the
     * backward, two more for the recomputed forward; on the critical path. */
    double ars = layers * (double)l->m * (l->rc == LOOM_RECOMPUTE_ALL ? 6 : 4);
    o->tp_s = ars * loom_plan_allreduce_s(act, l->tp, e->nvlink_gbs * e->link_eff, e->latency_s);
    /* pp: each micro-batch sends its activation forward and receives its
     * gradient back at a stage boundary, counted as not overlapped; each
     * tp rank sends 1/tp of it and the next stage all-gathers it over
     * NVLink (Narayanan et al. 2021, the scatter/gather optimization).
     * With V virtual stages a micro-batch crosses V times as many
     * boundaries (ibid., section 2.2.2). */
    double pbw = (l->tp * l->pp <= e->nvlink_domain ? e->nvlink_gbs : e->ib_gbs) * e->link_eff;
    double gather = loom_plan_allreduce_s(act, l->tp, e->nvlink_gbs * e->link_eff, e->latency_s) / 2;
    int V = l->vs > 1 ? l->vs : 1;
    o->pp_s = l->pp > 1 ? 2.0 * V * l->m * (p2p_s(act / l->tp, pbw, e->latency_s) + gather) : 0;
    double busy = o->compute_s + o->tp_s + o->pp_s;
    o->bubble_frac = (double)(l->pp - 1) / ((double)V * l->m + l->pp - 1);
    o->bubble_s = busy * (l->pp - 1) / ((double)V * l->m);
    double pl, sh;
    loom_layout_split_params(cfg, &pl, &sh);
    layout_dp(e, l, (layers * pl + sh) / l->tp, busy / l->m, o);
    o->step_s = busy + o->bubble_s + o->dp_exposed_s;
}

const char *loom_layout_discard_name(int why) {
    static const char *const n[LOOM_DISCARD_N] = {
        "tp does not divide the attention heads", "tp larger than the NVLink domain", "more pipeline stages than layers",
        "pp x --virtual-stages does not divide the layers",
        "global batch more than 25% above --global-batch", "does not fit in memory", "fits, slower than the ones listed"};
    return why >= 0 && why < LOOM_DISCARD_N ? n[why] : "?";
}

static double per_token(const loom_layout_row_t *r) { return r->c.step_s / r->c.tokens; }

/* a before b: faster per token; within 0.1% (the model's MFU does not
 * depend on the micro-batch) the larger micro-batch, which runs the more
 * efficient kernels, then the lower ZeRO stage and the less recompute. */
static int before(const loom_layout_row_t *a, const loom_layout_row_t *b) {
    double x = per_token(a), y = per_token(b);
    if (fabs(x - y) > 1e-3 * y) return x < y;
    if (a->l.micro != b->l.micro) return a->l.micro > b->l.micro;
    if (a->l.zero != b->l.zero) return a->l.zero < b->l.zero;
    return a->l.rc < b->l.rc;
}

/* Keep the fastest LOOM_LAYOUT_TOP; what falls off counts as slower. */
static void keep(loom_layout_search_t *s, const loom_layout_row_t *r) {
    int i = s->ntop;
    if (i == LOOM_LAYOUT_TOP) {
        if (!before(r, &s->top[i - 1])) {
            s->count[LOOM_DISCARD_SLOWER]++;
            return;
        }
        s->count[LOOM_DISCARD_SLOWER]++;
        i--;
    } else {
        s->ntop++;
    }
    while (i > 0 && before(r, &s->top[i - 1])) s->top[i] = s->top[i - 1], i--;
    s->top[i] = *r;
}

static void discard(loom_layout_search_t *s, int why, const loom_layout_row_t *r) {
    int better = why == LOOM_DISCARD_MEMORY && s->count[why] && r->c.mem < s->example[why].c.mem;
    if (!s->count[why] || better) s->example[why] = *r;
    s->count[why]++;
}

/* A structural reason to skip (tp, pp), or -1. */
static int shape_discard(const loom_layout_env_t *e, int tp, int pp, int vs) {
    if (e->cfg->n_head % tp) return LOOM_DISCARD_TP_HEADS;
    if (tp > e->nvlink_domain) return LOOM_DISCARD_TP_DOMAIN;
    if (pp > e->cfg->n_layer) return LOOM_DISCARD_PP_LAYERS;
    if (vs > 1 && (pp == 1 || e->cfg->n_layer % (pp * vs))) return LOOM_DISCARD_VSTAGES;
    return -1;
}

int loom_layout_micro_batches(const loom_layout_env_t *e, const loom_layout_t *l) {
    int m = (int)fmax(1, ceil(e->global_tokens / ((double)l->dp * l->micro * e->T) - 1e-9));
    /* The interleaved schedule runs micro-batches in groups of p (Megatron
     * refuses any other count), so round up; the search's batch check says
     * when that overshoots. */
    return l->vs > 1 ? (m + l->pp - 1) / l->pp * l->pp : m;
}

static void try_layout(const loom_layout_env_t *e, loom_layout_t l, loom_layout_search_t *s) {
    loom_layout_row_t r = {.l = l};
    r.l.m = loom_layout_micro_batches(e, &l);
    loom_layout_cost(e, &r.l, &r.c);
    s->considered++;
    if (r.c.tokens > 1.25 * e->global_tokens) discard(s, LOOM_DISCARD_BATCH, &r);
    else if (r.c.mem > e->capacity) discard(s, LOOM_DISCARD_MEMORY, &r);
    else keep(s, &r);
}

void loom_layout_search(const loom_layout_env_t *e, const loom_layout_fix_t *fix, loom_layout_search_t *s) {
    memset(s, 0, sizeof *s);
    for (int tp = 1; tp <= e->gpus; tp++) {
        if (e->gpus % tp || (fix->tp && tp != fix->tp)) continue;
        for (int pp = 1; pp <= e->gpus / tp; pp++) {
            if ((e->gpus / tp) % pp || (fix->pp && pp != fix->pp)) continue;
            loom_layout_t l = {.tp = tp, .pp = pp, .dp = e->gpus / tp / pp, .vs = fix->vs > 1 ? fix->vs : 1};
            int why = shape_discard(e, tp, pp, l.vs);
            if (why >= 0) {
                loom_layout_row_t r = {.l = l};
                r.l.micro = 1, r.l.m = 1;
                discard(s, why, &r);
                continue;
            }
            for (l.zero = 0; l.zero <= 3; l.zero++) {
                if (fix->zero >= 0 && l.zero != fix->zero) continue;
                if (l.dp == 1 && l.zero && fix->zero < 0) continue; /* one dp rank: every stage is ZeRO-0 */
                for (int rc = 0; rc <= LOOM_RECOMPUTE_ALL; rc++) {
                    if (fix->rc >= 0 && rc != fix->rc) continue;
                    l.rc = (loom_recompute)rc;
                    for (l.micro = fix->micro ? fix->micro : 1; l.micro <= (fix->micro ? fix->micro : 256); l.micro *= 2)
                        try_layout(e, l, s);
                }
            }
        }
    }
}
