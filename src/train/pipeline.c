/* pipeline: the 1F1B schedule, the stage's slice of the model, and the
 * gather/scatter that keeps checkpoints in the single-model layout. */
#include "train/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/optim.h"
#include "ckpt/safetensors.h"
#include "core/mem.h"
#include "parallel/tp.h"

/* One micro-batch's activations (its block, tokens, targets). */
typedef struct {
    float *acts;
    int *tokens, *targets;
} slot_t;

struct loom_pp {
    loom_dist_t *d;
    loom_dist_t *dpg;           /* this stage's data-parallel group (D > 1 or ZeRO), else NULL */
    loom_dp_t *dpm;             /* the reduction (bucketed, overlapped) and ZeRO over dpg, else NULL */
    loom_dist_t *tpg;           /* pp x tp: this stage's tensor-parallel group, else NULL */
    loom_tp_t *tp;              /* pp x tp: the stage's shard (m is its model), else NULL */
    int tpn, ti;                /* tensor-parallel width (1: none) and this rank's index in it */
    loom_pp_opts_t o;
    int n, s, dp, rank;         /* stages, this stage, data-parallel width, this rank */
    int prev, next;             /* neighbouring stages' ranks, -1 at the ends */
    int parts;                  /* LOOM_STAGE_EMBED / HEAD of this stage */
    loom_gpt_config_t cfg;      /* the whole model, finished */
    loom_tensor_info_t (*tables)[LOOM_NPARAMS]; /* every stage's parameter table */
    size_t *nparams;            /* every stage's parameter floats */
    loom_gpt_t *m;              /* this stage */
    const loom_backend_t *host; /* the CPU backend of the whole model */
    loom_gpt_t *full;           /* rank 0: the whole model for checkpoints (host memory) */
    float *fm, *fv;             /* rank 0: its AdamW moments, gathered at checkpoints */
    slot_t *slots;              /* in-flight micro-batches; slots[0] is the model's own block */
    int nslots;
    float *wte_peer;            /* tied head: the other end's wte gradient (backend memory) */
    double loss_sum;            /* last stage: this step's micro-batch losses */
    const int *tok, *tgt;       /* this step's micro-batches */
    float dloss;
    double comm_s, fastest, sched_s, bubble_s, dp_s, tp_s;
    int msgs;
};

void loom_pp_split(int L, int n, int s, int *first, int *count) {
    int base = L / n, extra = L % n;
    *count = base + (s < extra);
    *first = s * base + (s < extra ? s : extra);
}

double loom_pp_bubble_formula(int stages, int micro) { return (double)(stages - 1) / (double)(micro + stages - 1); }

const loom_gpt_config_t *loom_pp_config(const loom_pp_t *pp) { return &pp->cfg; }
int loom_pp_stage(const loom_pp_t *pp) { return pp->s; }
loom_dp_t *loom_pp_dp(const loom_pp_t *pp) { return pp ? pp->dpm : NULL; }

double loom_pp_last_dp_wait(const loom_pp_t *pp) { return pp ? pp->dp_s : 0; }
double loom_pp_last_tp_wait(const loom_pp_t *pp) { return pp ? pp->tp_s : 0; }

void loom_pp_last_times(const loom_pp_t *pp, double *comm_s, double *bubble_s, double *sched_s) {
    *comm_s = pp ? pp->comm_s : 0;
    *bubble_s = pp ? pp->bubble_s : 0;
    *sched_s = pp ? pp->sched_s : 0;
}

/* ---------------- the stage's slice of the whole model ---------------- */

static int per_layer(int i) { return i != LOOM_WTE && i != LOOM_WPE && i != LOOM_LMHEAD && i != LOOM_LNFW && i != LOOM_LNFB; }

/* Stage s holds tensor i's only copy that counts (its gradient in the norm,
 * its weights in a checkpoint): its layers, the embedding on the first
 * stage, the final norm and the head on the last. A tied wte is the first
 * stage's (the last stage keeps an identical copy). */
static int owns(const loom_pp_t *pp, int s, int i) {
    if (per_layer(i)) return 1;
    if (i == LOOM_WTE || i == LOOM_WPE) return s == 0;
    return s == pp->n - 1;
}

/* Copy between a whole-model block `full` and stage s's block `st`
 * (to_stage: full -> st). A layer tensor moves the stage's rows; the
 * others move whole, into every stage on the way in (`all`) or from their
 * owner on the way out. */
static void map_block(const loom_pp_t *pp, int s, float *full, float *st, int to_stage) {
    int first, count, L = pp->cfg.n_layer;
    loom_pp_split(L, pp->n, s, &first, &count);
    loom_tensor_info_t ft[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(&pp->cfg, ft, &total);
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *a = &ft[i], *b = &pp->tables[s][i];
        if (!a->numel || (!to_stage && !owns(pp, s, i))) continue;
        size_t per = per_layer(i) ? a->numel / (size_t)L : a->numel;
        size_t off = per_layer(i) ? (size_t)first * per : 0, n = per_layer(i) ? (size_t)count * per : a->numel;
        if (to_stage) memcpy(st + b->offset, full + a->offset + off, n * sizeof(float));
        else memcpy(full + a->offset + off, st + b->offset, n * sizeof(float));
    }
}

/* Stage s's config: the whole model's with its own layer count. */
static loom_gpt_config_t stage_config(const loom_pp_t *pp, int s) {
    loom_gpt_config_t c = pp->cfg;
    int first;
    loom_pp_split(c.n_layer, pp->n, s, &first, &c.n_layer);
    return c;
}

/* Upload host blocks (whole-model layout) into this stage's parameters and
 * AdamW moments; m, v may be NULL (fresh state). */
static loom_status scatter_host(loom_pp_t *pp, float *params, float *m, float *v) {
    loom_gpt_t *sm = pp->m;
    size_t n = sm->num_params;
    /* the stage's block, then (pp x tp) this rank's shard of it; then (ZeRO) this replica's part */
    float *h = loom_calloc(pp->nparams[pp->s], sizeof(float)), *l = loom_malloc(3 * n * sizeof(float) + 1);
    float *src[3] = {params, m, v}, *loc[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        if (!src[k]) continue;
        map_block(pp, pp->s, src[k], h, 1);
        loc[k] = l + k * n;
        if (pp->tp) loom_tp_slice(pp->tp, h, loc[k]);
        else memcpy(loc[k], h, n * sizeof(float));
    }
    loom_status s = loom_dp_load_block(pp->dpm, sm, loc[0], loc[1], loc[2]);
    free(l);
    free(h);
    return s;
}

/* ---------------- setup ---------------- */

static loom_status check_layout(loom_pp_t *pp, int world) {
    int L = pp->cfg.n_layer;
    if (pp->n < 2 || world % (pp->n * pp->tpn))
        return loom_error(LOOM_EINVAL, "--pp %d with %d ranks: the ranks must be a multiple of the stages x --tp %d (e.g. --nproc %d)", pp->n, world,
                          pp->tpn, pp->n * pp->tpn);
    if (L < pp->n)
        return loom_error(LOOM_EINVAL, "--pp %d: the model has %d layers; each stage needs at least one (use --pp %d or fewer)", pp->n, L, L);
    return LOOM_OK;
}

/* The in-flight activation blocks beyond the model's own. */
static loom_status alloc_slots(loom_pp_t *pp) {
    loom_gpt_t *m = pp->m;
    int n = pp->n - pp->s < pp->o.micro ? pp->n - pp->s : pp->o.micro;
    pp->nslots = n;
    pp->slots = loom_calloc((size_t)n, sizeof *pp->slots);
    pp->slots[0] = (slot_t){m->acts, m->tokens, m->targets};
    size_t BT = (size_t)pp->o.B * pp->o.T;
    for (int i = 1; i < n; i++) {
        slot_t *sl = &pp->slots[i];
        sl->acts = m->be->alloc(m->act_bytes);
        sl->tokens = m->be->alloc(BT * sizeof(int));
        sl->targets = m->be->alloc(BT * sizeof(int));
        if (!sl->acts || !sl->tokens || !sl->targets)
            return loom_error(LOOM_ENOMEM, "--pp: cannot allocate %.1f MB of activations for micro-batch %d in flight on %s; lower --batch or --seq",
                              m->act_bytes / 1e6, i + 1, m->be->name);
        loom_mem_count(LOOM_MEM_ACTS, (long long)m->act_bytes);
    }
    return LOOM_OK;
}

/* pp x tp: the stage's tp shard, cut from a stage-shaped host model (its
 * parameters are written by scatter_host after). */
static loom_status build_tp_shard(loom_pp_t *pp, const loom_backend_t *be, const loom_gpt_config_t *sc) {
    loom_gpt_t *st;
    LOOM_TRY(loom_gpt_create(&st, sc, pp->host));
    loom_status s = loom_tp_init(&pp->tp, st, be, pp->tpg, NULL);
    loom_gpt_free(st);
    if (s == LOOM_OK) pp->m = loom_tp_model(pp->tp);
    return s;
}

/* The stage model: the whole model drawn from the seed on the host, sliced. */
static loom_status build_stage(loom_pp_t *pp, const loom_backend_t *be) {
    pp->tables = loom_calloc((size_t)pp->n, sizeof *pp->tables);
    pp->nparams = loom_calloc((size_t)pp->n, sizeof *pp->nparams);
    for (int s = 0; s < pp->n; s++) {
        loom_gpt_config_t c = stage_config(pp, s);
        loom_gpt_param_table(&c, pp->tables[s], &pp->nparams[s]);
    }
    loom_gpt_config_t sc = stage_config(pp, pp->s);
    LOOM_TRY(loom_backend_cpu_init(&pp->host, 1));
    LOOM_TRY(loom_gpt_init(&pp->full, &pp->cfg, pp->host, pp->o.seed));
    if (pp->tpg) LOOM_TRY(build_tp_shard(pp, be, &sc));
    else LOOM_TRY(loom_gpt_create(&pp->m, &sc, be));
    loom_gpt_set_recompute(pp->m, pp->o.recompute);
    if (!pp->tp) LOOM_TRY(loom_gpt_alloc_train(pp->m)); /* the tp shard comes with its training state */
    LOOM_TRY(scatter_host(pp, pp->full->params, NULL, NULL));
    if (pp->rank != 0) { /* only rank 0 writes checkpoints */
        loom_gpt_free(pp->full);
        pp->full = NULL;
    }
    LOOM_TRY(loom_gpt_alloc_acts(pp->m, pp->o.B, pp->o.T));
    LOOM_TRY(alloc_slots(pp));
    if (!pp->cfg.untied_head && (pp->s == 0 || pp->s == pp->n - 1)) {
        pp->wte_peer = be->alloc(pp->m->ptable[LOOM_WTE].numel * sizeof(float)); /* pp x tp: the shard's rows */
        if (!pp->wte_peer) return loom_error(LOOM_ENOMEM, "--pp: cannot allocate the tied embedding's gradient buffer on %s", be->name);
    }
    return LOOM_OK;
}

/* Placement (parallel/dist.h): rank = (dp_index * N + stage) * T + tp
 * index, so one pipeline is N x T consecutive ranks, a stage's tp group T
 * consecutive ones, its neighbours T away and its replicas N x T apart.
 * The groups: every rank splits in the same order (a collective). */
static loom_status place(loom_pp_t *pp, loom_dist_t *d) {
    int T = pp->tpn, per = pp->n * T;
    pp->ti = pp->rank % T;
    pp->dp = loom_dist_size(d) / per;
    pp->s = pp->rank / T % pp->n;
    pp->prev = pp->s > 0 ? pp->rank - T : -1;
    pp->next = pp->s < pp->n - 1 ? pp->rank + T : -1;
    if (pp->dp > 1 || pp->o.dpo.zero > 0) LOOM_TRY(loom_dist_split(d, pp->rank % per, pp->rank, &pp->dpg));
    if (T > 1) LOOM_TRY(loom_dist_split(d, pp->rank / T, pp->rank, &pp->tpg));
    return LOOM_OK;
}

loom_status loom_pp_init(loom_pp_t **out, loom_dist_t *d, const loom_gpt_config_t *cfg, const loom_backend_t *be,
                         const loom_pp_opts_t *o, loom_gpt_t **stage_model) {
    *out = NULL;
    loom_pp_t *pp = loom_calloc(1, sizeof *pp);
    pp->d = d;
    pp->o = *o;
    pp->n = o->stages;
    pp->cfg = *cfg;
    pp->rank = loom_dist_rank(d);
    pp->tpn = o->tp > 1 ? o->tp : 1;
    loom_status s = loom_gpt_config_finish(&pp->cfg);
    if (s == LOOM_OK) s = check_layout(pp, loom_dist_size(d));
    if (s == LOOM_OK) s = place(pp, d);
    if (s != LOOM_OK) {
        loom_pp_free(pp);
        return s;
    }
    pp->parts = (pp->s == 0 ? LOOM_STAGE_EMBED : 0) | (pp->s == pp->n - 1 ? LOOM_STAGE_HEAD : 0);
    s = build_stage(pp, be);
    /* After the stage holds its weights: ZeRO-3 keeps this replica's shard of them. */
    if (s == LOOM_OK && pp->dpg) s = loom_dp_init(&pp->dpm, pp->m, pp->dpg, &o->dpo);
    if (s != LOOM_OK) {
        loom_pp_free(pp);
        return s;
    }
    char split[512];
    size_t used = 0;
    for (int st = 0; st < pp->n && used < sizeof split - 32; st++) {
        int first, count;
        loom_pp_split(pp->cfg.n_layer, pp->n, st, &first, &count);
        used += (size_t)snprintf(split + used, sizeof split - used, "%s%d:[%d,%d)", st ? " " : "", st, first, first + count);
    }
    char tpw[96] = "";
    if (pp->tp) snprintf(tpw, sizeof tpw, "; each stage a tensor-parallel group of %d ranks", pp->tpn);
    loom_info("loom train: pipeline %d stages over %d layers, stage:[layers) %s; embedding on stage 0, head on stage %d%s%s; "
              "1F1B over %d micro-batches, bubble (N-1)/(M+N-1) = %.3f", pp->n, pp->cfg.n_layer, split, pp->n - 1, tpw,
              pp->cfg.untied_head ? "" : " (tied: wte on both ends, gradients summed)", o->micro, loom_pp_bubble_formula(pp->n, o->micro));
    *stage_model = pp->m;
    *out = pp;
    return LOOM_OK;
}

void loom_pp_free(loom_pp_t *pp) {
    if (!pp) return;
    loom_dp_free(pp->dpm); /* before the stage model it reduces */
    if (pp->m) {
        const loom_backend_t *be = pp->m->be;
        for (int i = 1; i < pp->nslots; i++) {
            if (pp->slots[i].acts) loom_mem_count(LOOM_MEM_ACTS, -(long long)pp->m->act_bytes);
            be->free(pp->slots[i].acts);
            be->free(pp->slots[i].tokens);
            be->free(pp->slots[i].targets);
        }
        if (pp->slots) { /* the model frees its own block */
            pp->m->acts = pp->slots[0].acts;
            pp->m->tokens = pp->slots[0].tokens;
            pp->m->targets = pp->slots[0].targets;
        }
        if (pp->wte_peer) be->free(pp->wte_peer);
        if (pp->tp) loom_tp_free(pp->tp); /* the shard is the tp's */
        else loom_gpt_free(pp->m);
    }
    loom_gpt_free(pp->full);
    loom_dist_free(pp->dpg);
    loom_dist_free(pp->tpg);
    free(pp->fm);
    free(pp->fv);
    free(pp->slots);
    free(pp->tables);
    free(pp->nparams);
    free(pp);
}

/* ---------------- the schedule ---------------- */

static void use_slot(loom_pp_t *pp, int k) {
    const slot_t *sl = &pp->slots[k % pp->nslots];
    pp->m->acts = sl->acts;
    pp->m->tokens = sl->tokens;
    pp->m->targets = sl->targets;
}

static loom_status fwd(loom_pp_t *pp, int k) {
    size_t BT = (size_t)pp->o.B * pp->o.T;
    float l = 0;
    use_slot(pp, k);
    LOOM_TRY(loom_gpt_forward_stage(pp->m, pp->tok + k * BT, pp->tgt + k * BT, pp->o.B, pp->o.T, pp->parts, pp->dloss, &l));
    pp->loss_sum += l;
    return LOOM_OK;
}

/* The backward of micro-batch k, the j-th of the step's M (the dp
 * reduction of the last one, or of every one at ZeRO-2/3, runs during it). */
static loom_status bwd(loom_pp_t *pp, int k) {
    use_slot(pp, k);
    LOOM_TRY(loom_dp_before_backward(pp->dpm, k, pp->o.micro));
    loom_gpt_backward_stage(pp->m, pp->o.B, pp->o.T, pp->parts);
    return loom_dp_after_backward(pp->dpm);
}

/* The residual stream of micro-batch k at `which` in its slot. */
static float *stream(loom_pp_t *pp, int k, loom_gpt_stream_kind which) {
    use_slot(pp, k);
    return loom_gpt_stream(pp->m, pp->o.B, pp->o.T, which);
}

/* Send micro-batch ks's `sw` to rank dst while receiving micro-batch kr's
 * `rw` from rank src (either side may be absent: rank -1 or k < 0). */
static loom_status xfer(loom_pp_t *pp, int dst, int ks, loom_gpt_stream_kind sw, int src, int kr, loom_gpt_stream_kind rw) {
    if (ks < 0) dst = -1;
    if (kr < 0) src = -1;
    if (dst < 0 && src < 0) return LOOM_OK;
    size_t bytes = loom_backend_act_bytes(pp->m->be, (size_t)pp->o.B * pp->o.T * pp->cfg.channels);
    void *sb = dst >= 0 ? stream(pp, ks, sw) : NULL, *rb = src >= 0 ? stream(pp, kr, rw) : NULL;
    pp->m->be->sync(); /* a device transport reads what the compute stream wrote */
    double t0 = loom_now();
    LOOM_TRY(loom_dist_sendrecv(pp->d, sb, bytes, dst, rb, bytes, src));
    double dt = loom_now() - t0;
    pp->comm_s += dt;
    if (pp->msgs++ == 0 || dt < pp->fastest) pp->fastest = dt;
    return LOOM_OK;
}

/* 1F1B on this stage: warm-up forwards, one forward one backward, the
 * remaining backwards. Activations go to `next` after a forward, their
 * gradients to `prev` after a backward; a stage receives what it needs
 * just before, paired with the send it makes at the same point, so two
 * neighbours exchanging never both block in a send. */
static loom_status schedule(loom_pp_t *pp) {
    int M = pp->o.micro, warm = pp->n - pp->s - 1 < M ? pp->n - pp->s - 1 : M, rem = M - warm;
    const loom_gpt_stream_kind IN = LOOM_STREAM_IN, OUT = LOOM_STREAM_OUT, G = LOOM_STREAM_GRAD;
    for (int i = 0; i < warm; i++) {
        LOOM_TRY(xfer(pp, -1, -1, OUT, pp->prev, i, IN));
        LOOM_TRY(fwd(pp, i));
        LOOM_TRY(xfer(pp, pp->next, i, OUT, -1, -1, IN));
    }
    if (rem > 0) LOOM_TRY(xfer(pp, -1, -1, OUT, pp->prev, warm, IN));
    for (int j = 0; j < rem; j++) {
        int k = warm + j;
        LOOM_TRY(fwd(pp, k));
        LOOM_TRY(xfer(pp, pp->next, k, OUT, pp->next, j, G));
        LOOM_TRY(bwd(pp, j));
        LOOM_TRY(xfer(pp, pp->prev, j, G, pp->prev, j + 1 < rem ? k + 1 : -1, IN));
    }
    for (int j = rem; j < M; j++) {
        LOOM_TRY(xfer(pp, -1, -1, G, pp->next, j, G));
        LOOM_TRY(bwd(pp, j));
        LOOM_TRY(xfer(pp, pp->prev, j, G, -1, -1, IN));
    }
    return LOOM_OK;
}

/* The step's reduced gradient on this rank: floats [lo, hi) of the stage
 * block (all of it, or this replica's ZeRO shard), g[0] = float lo. */
typedef struct {
    float *g;
    size_t lo, hi;
} window_t;

/* Tensor i's floats within the window: *at (into w.g) and the count. */
static size_t in_window(const loom_pp_t *pp, const window_t *w, int i, float **at) {
    size_t a = pp->m->ptable[i].offset, b = a + pp->m->ptable[i].numel;
    a = a > w->lo ? a : w->lo;
    b = b < w->hi ? b : w->hi;
    *at = w->g + (a - w->lo);
    return b > a ? b - a : 0;
}

/* A tied head: wte's gradient is the first stage's (embedding) plus the
 * last stage's (head). Both ends add the other's to their own; a + b is
 * b + a in floating point, so the two copies stay identical. Under ZeRO
 * the ends' replicas first assemble the whole wte gradient from their
 * shards (the stages' blocks differ, so their shards do), then each keeps
 * its part of the sum. */
static loom_status sum_tied(loom_pp_t *pp, const window_t *w) {
    if (!pp->wte_peer) return LOOM_OK;
    loom_gpt_t *m = pp->m;
    size_t n = m->ptable[LOOM_WTE].numel;
    int peer = pp->s == 0 ? pp->rank + (pp->n - 1) * pp->tpn : pp->rank - (pp->n - 1) * pp->tpn; /* the same tp index */
    int sharded = loom_dp_sharded(pp->dpm);
    float *mine, *wte = sharded ? m->be->alloc(n * sizeof(float)) : m->grad[LOOM_WTE];
    size_t own = in_window(pp, w, LOOM_WTE, &mine), off = (size_t)(mine - w->g) + w->lo - m->ptable[LOOM_WTE].offset;
    if (!wte) return loom_error(LOOM_ENOMEM, "--pp: cannot allocate the tied embedding's gradient (%.1f MB) on %s", n * 4e-6, m->be->name);
    loom_status st = LOOM_OK;
    if (sharded) {
        m->be->zero(wte, n * sizeof(float));
        if (own) m->be->accumulate(wte + off, mine, own); /* a copy into zeros */
        m->be->sync();
        st = loom_dist_allreduce(pp->dpg, wte, n, LOOM_DIST_FP32, 1.0f); /* disjoint parts: exact */
    }
    m->be->sync();
    double t0 = loom_now();
    if (st == LOOM_OK) st = loom_dist_sendrecv(pp->d, wte, n * sizeof(float), peer, pp->wte_peer, n * sizeof(float), peer);
    pp->comm_s += loom_now() - t0;
    float *a = st == LOOM_OK ? loom_malloc(2 * n * sizeof(float)) : NULL;
    if (a) {
        m->be->download(a, wte, n * sizeof(float));
        m->be->download(a + n, pp->wte_peer, n * sizeof(float));
        for (size_t i = 0; i < n; i++) a[i] += a[n + i];
        if (!sharded) m->be->upload(wte, a, n * sizeof(float));
        else if (own) m->be->upload(mine, a + off, own * sizeof(float));
    }
    free(a);
    if (sharded) m->be->free(wte);
    return st;
}

/* pp x tp: the stage's sum of squares (every shard's tensors once, over
 * the tp group), on tp index 0 only. A stage's tensors it does not own
 * have zero gradients but for the last stage's copy of a tied wte, taken
 * off (its rows are split over the group: their sums add up). */
static loom_status tp_sumsq(loom_pp_t *pp, const window_t *w, double *ss) {
    const loom_gpt_t *m = pp->m;
    LOOM_TRY(loom_tp_grad_sumsq(pp->tp, w->g, w->lo, w->hi, ss));
    if (m->ptable[LOOM_WTE].numel && !owns(pp, pp->s, LOOM_WTE)) {
        float *at;
        size_t n = in_window(pp, w, LOOM_WTE, &at);
        double x = n ? m->be->sumsq(at, n) : 0;
        LOOM_TRY(loom_dist_allreduce_f64(pp->tpg, &x, 1));
        *ss -= x;
    }
    if (pp->ti) *ss = 0;
    return LOOM_OK;
}

/* The whole model's gradient norm: each stage's owned tensors, summed over
 * every rank. Without ZeRO the D replicas of a stage hold the same
 * averaged gradient, so that sum is D times the model's; with it each
 * holds its own part. */
static loom_status grad_norm(loom_pp_t *pp, const window_t *w, float *norm) {
    double ss = 0;
    if (pp->tp) LOOM_TRY(tp_sumsq(pp, w, &ss));
    else
        for (int i = 0; i < LOOM_NPARAMS; i++) {
            float *at;
            size_t n = owns(pp, pp->s, i) ? in_window(pp, w, i, &at) : 0;
            if (n) ss += pp->m->be->sumsq(at, n);
        }
    LOOM_TRY(loom_dist_allreduce_f64(pp->d, &ss, 1));
    *norm = (float)sqrt(ss / (loom_dp_sharded(pp->dpm) ? 1 : pp->dp));
    return LOOM_OK;
}

/* After the schedule: the dp reduction waited for (it ran during the
 * backward passes, train/step.h), then the tp group's finish and the tied
 * sum on this rank's window of the reduced gradient. */
static loom_status finish_grads(loom_pp_t *pp, window_t *w) {
    LOOM_TRY(loom_dp_grads_ready(pp->dpm));
    w->g = loom_dp_grads(pp->dpm, pp->m, &w->lo, &w->hi);
    if (pp->tp) LOOM_TRY(loom_tp_finish_grads(pp->tp, w->g, w->lo, w->hi)); /* the hooks' error, rank-0 biases, shared kv heads */
    return sum_tied(pp, w);
}

loom_status loom_pp_step(loom_pp_t *pp, const int *tokens, const int *targets, const loom_optim_t *opt, float lr, int t,
                         float *loss, float *grad_norm_out) {
    loom_gpt_t *m = pp->m;
    loom_dp_zero_grads(pp->dpm, m);
    pp->tok = tokens;
    pp->tgt = targets;
    pp->dloss = 1.0f / ((float)pp->o.B * (float)pp->o.T * (float)pp->o.micro);
    pp->loss_sum = 0;
    pp->comm_s = pp->fastest = 0;
    pp->msgs = 0;
    double t0 = loom_now(), tp0 = loom_tp_wait_seconds(pp->tp), dp0 = pp->dpg ? loom_dist_wait_seconds(pp->dpg) : 0;
    LOOM_TRY(schedule(pp));
    m->be->sync();
    /* A stage that finishes first idles until the last one does (the
     * schedule's tail, part of the bubble): the barrier measures it. */
    double t1 = loom_now();
    LOOM_TRY(loom_dist_barrier(pp->d));
    double tail = loom_now() - t1;
    pp->sched_s = loom_now() - t0;
    double transfer = pp->fastest * pp->msgs;
    pp->bubble_s = (pp->comm_s > transfer ? pp->comm_s - transfer : 0) + tail;
    pp->comm_s += tail;
    window_t w;
    LOOM_TRY(finish_grads(pp, &w));
    pp->tp_s = loom_tp_wait_seconds(pp->tp) - tp0;
    float norm;
    LOOM_TRY(grad_norm(pp, &w, &norm));
    float scale = opt->clip > 0 && norm > opt->clip ? opt->clip / (norm + 1e-6f) : 1.0f;
    loom_adamw_t hp = {.lr = lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                       .weight_decay = opt->weight_decay, .grad_scale = scale, .t = t};
    LOOM_TRY(loom_dp_update(pp->dpm, m, &hp));
    pp->dp_s = pp->dpg ? loom_dist_wait_seconds(pp->dpg) - dp0 : 0; /* the reduction's waits, the ZeRO gathers' */
    /* The last stages hold their pipelines' losses: their mean, to every rank. */
    double l = pp->s == pp->n - 1 && pp->ti == 0 ? pp->loss_sum / pp->o.micro / pp->dp : 0; /* a tp group's ranks hold one loss */
    LOOM_TRY(loom_dist_allreduce_f64(pp->d, &l, 1));
    *loss = (float)l;
    *grad_norm_out = norm;
    if (!isfinite(*loss) || !isfinite(norm))
        return loom_error(LOOM_EINTERNAL, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup", t, *loss, norm);
    return LOOM_OK;
}

/* ---------------- validation ---------------- */

/* One batch forward through the stages in turn (no backward, no overlap:
 * validation is rare); the last stage's loss, 0 on the others. */
static loom_status eval_batch(void *vpp, const int *in, const int *tg, int B, int T, float *loss) {
    loom_pp_t *pp = vpp;
    loom_gpt_t *m = pp->m;
    size_t bytes = loom_backend_act_bytes(m->be, (size_t)B * T * pp->cfg.channels);
    use_slot(pp, 0);
    if (pp->prev >= 0) LOOM_TRY(loom_dist_recv(pp->d, loom_gpt_stream(m, B, T, LOOM_STREAM_IN), bytes, pp->prev));
    LOOM_TRY(loom_gpt_forward_stage(m, in, tg, B, T, pp->parts, 0.0f, loss));
    m->be->sync();
    if (pp->next >= 0) LOOM_TRY(loom_dist_send(pp->d, loom_gpt_stream(m, B, T, LOOM_STREAM_OUT), bytes, pp->next));
    return LOOM_OK;
}

loom_status loom_pp_eval(loom_pp_t *pp, const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_result_t *out) {
    loom_status s = loom_eval_batches(ds, B, T, max_batches, eval_batch, pp, out);
    /* every pipeline scored the same batches: the last stages' mean, to every rank */
    double v = pp->s == pp->n - 1 && pp->ti == 0 ? out->loss / pp->dp : 0;
    if (s == LOOM_OK) s = loom_dist_allreduce_f64(pp->d, &v, 1);
    out->loss = v;
    return s;
}

/* ---------------- checkpoints ---------------- */

loom_gpt_t *loom_pp_ckpt_model(loom_pp_t *pp) { return pp->full ? pp->full : pp->m; }

/* The first pipeline's ranks (dp index 0): this stage's parameters and
 * AdamW moments in the stage's block layout, 3 x nparams[s] floats, on the
 * stage's root (tp index 0; the others of its tp group give their shards
 * and get NULL). */
static loom_status own_blocks(loom_pp_t *pp, float **out) {
    size_t n = pp->nparams[pp->s], own = pp->m->num_params;
    float *src[3] = {pp->m->params, pp->m->m, pp->m->v}, *whole[3] = {NULL, NULL, NULL};
    *out = NULL;
    if (loom_dp_sharded(pp->dpm)) { /* ZeRO: every replica gives its shards (a collective over the dp group) */
        LOOM_TRY(loom_dp_gather_state(pp->dpm, pp->m, whole));
        for (int k = 0; k < 3; k++) src[k] = whole[k];
    }
    loom_status st = LOOM_OK;
    float *b = NULL;
    if (pp->rank < pp->n * pp->tpn) {
        b = pp->ti == 0 ? loom_malloc(3 * n * sizeof(float)) : NULL;
        for (int k = 0; k < 3 && st == LOOM_OK; k++) {
            if (pp->tp) st = loom_tp_gather(pp->tp, src[k], b ? b + k * n : NULL);
            else pp->m->be->download(b + k * n, src[k], own * sizeof(float));
        }
    }
    for (int k = 0; k < 3; k++)
        if (whole[k]) pp->m->be->free(whole[k]);
    if (st != LOOM_OK) free(b);
    else *out = b;
    return st;
}

loom_status loom_pp_gather(loom_pp_t *pp, float **m, float **v) {
    size_t P = pp->full ? pp->full->num_params : 0, most = 0;
    for (int s = 0; s < pp->n; s++) most = pp->nparams[s] > most ? pp->nparams[s] : most;
    float *mine;
    LOOM_TRY(own_blocks(pp, &mine));
    float *buf = loom_malloc(3 * most * sizeof(float));
    if (pp->full && !pp->fm) {
        pp->fm = loom_calloc(P, sizeof(float));
        pp->fv = loom_calloc(P, sizeof(float));
    }
    float *dst[3] = {pp->full ? pp->full->params : NULL, pp->fm, pp->fv};
    loom_status st = LOOM_OK;
    for (int s = 0; s < pp->n && st == LOOM_OK; s++) {
        size_t n = pp->nparams[s];
        int root = s * pp->tpn; /* stage s of the first pipeline, tp index 0 */
        if (root == pp->rank) memcpy(buf, mine, 3 * n * sizeof(float));
        st = loom_dist_broadcast(pp->d, buf, 3 * n * sizeof(float), root);
        for (int k = 0; k < 3 && st == LOOM_OK && pp->full; k++) map_block(pp, s, dst[k], buf + k * n, 0);
    }
    free(mine);
    free(buf);
    *m = pp->fm;
    *v = pp->fv;
    return st;
}

loom_status loom_pp_load(loom_pp_t *pp, const char *dir, long long step) {
    loom_gpt_t *full = pp->full;
    if (!full) LOOM_TRY(loom_gpt_create(&full, &pp->cfg, pp->host));
    size_t P = full->num_params;
    float *mv = loom_malloc(2 * P * sizeof(float));
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loom_optim_shard_t saved;
    loom_status s = loom_safetensors_load_gpt(full, path);
    if (s == LOOM_OK) s = loom_optim_gather(dir, P, (uint64_t)step, 0, P, mv, mv + P, &saved);
    if (s == LOOM_OK) s = scatter_host(pp, full->params, mv, mv + P);
    free(mv);
    if (full != pp->full) loom_gpt_free(full);
    return s;
}

loom_status loom_pp_load_weights(loom_pp_t *pp, loom_status (*load)(void *ctx, loom_gpt_t *whole), void *ctx) {
    loom_gpt_t *full = pp->full;
    if (!full) LOOM_TRY(loom_gpt_create(&full, &pp->cfg, pp->host));
    loom_status s = load(ctx, full);
    if (s == LOOM_OK) s = scatter_host(pp, full->params, NULL, NULL);
    if (full != pp->full) loom_gpt_free(full);
    return s;
}
