/* tp: a rank's shard of the model, the hooks its forward and backward
 * call (parallel/tp.h), and the map between the shard's parameter block
 * and the whole model's that checkpoints, the gradient norm and the
 * shared kv heads walk. */
#include "tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct loom_tp {
    loom_gpt_config_t full, local;
    loom_tensor_info_t ftab[LOOM_NPARAMS]; /* the whole model's parameter table */
    size_t full_params;
    loom_gpt_t *m;        /* this rank's shard */
    loom_dist_t *g, *dp;  /* tp group; dp group or NULL */
    int rank, n, dp_n, gpu;
    loom_dist_elem act;   /* the activations' element type: the hooks' all-reduces sum them as stored */
    int kv_split;         /* 1: KV/N kv heads per rank; 0: one kv head shared by N/KV ranks */
    int vs, v0, nv;       /* vocabulary rows per rank, this rank's first, how many of them are real (< V) */
    loom_gpt_tp_hooks_t hooks;
    float *stats;         /* (n, rows, 3) for the cross-entropy, backend memory */
    size_t stats_rows;
    loom_status err;      /* the first error a hook met */
    char errmsg[512];
};

enum { SEG_SHARD, SEG_REPL, SEG_KV, SEG_RANK0 };

/* One piece of rank r's shard: n floats at local_off of its block are the
 * whole model's at full_off. kind: SHARD (no other rank has them), REPL
 * (every rank has them), KV (the ranks sharing a kv head have them),
 * RANK0 (a row-parallel bias: only rank 0's block holds it). */
typedef void (*seg_fn)(void *ctx, size_t full_off, size_t local_off, size_t n, int kind);

/* The full index of rank r's first kv head. */
static int kv_first(const loom_tp_t *tp, int r) {
    const loom_gpt_config_t *f = &tp->full, *l = &tp->local;
    return tp->kv_split ? r * l->n_kv_heads : r * l->n_head / (f->n_head / f->n_kv_heads);
}

/* qkv weight (rowlen C) or bias (rowlen 1), layer by layer: q heads, k heads, v heads. */
static void qkv_segments(const loom_tp_t *tp, int r, size_t fo, size_t lo, size_t rowlen, seg_fn fn, void *ctx) {
    const loom_gpt_config_t *f = &tp->full, *l = &tp->local;
    size_t hs = (size_t)loom_gpt_head_size(f), NH = (size_t)f->n_head, KV = (size_t)f->n_kv_heads;
    size_t NHl = (size_t)l->n_head, KVl = (size_t)l->n_kv_heads, kf = (size_t)kv_first(tp, r);
    size_t QR = (size_t)loom_gpt_qkv_rows(f), QRl = (size_t)loom_gpt_qkv_rows(l);
    int kv = tp->kv_split ? SEG_SHARD : SEG_KV;
    for (size_t L = 0; L < (size_t)f->n_layer; L++) {
        size_t fb = fo + L * QR * rowlen, lb = lo + L * QRl * rowlen;
        fn(ctx, fb + (size_t)r * NHl * hs * rowlen, lb, NHl * hs * rowlen, SEG_SHARD);
        fn(ctx, fb + (NH + kf) * hs * rowlen, lb + NHl * hs * rowlen, KVl * hs * rowlen, kv);
        fn(ctx, fb + (NH + KV + kf) * hs * rowlen, lb + (NHl + KVl) * hs * rowlen, KVl * hs * rowlen, kv);
    }
}

/* fc weight or bias: the hidden units r*Hl.., of gate and of up under SwiGLU. */
static void fc_segments(const loom_tp_t *tp, int r, size_t fo, size_t lo, size_t rowlen, seg_fn fn, void *ctx) {
    const loom_gpt_config_t *f = &tp->full;
    size_t H = (size_t)f->ffn_hidden, Hl = (size_t)tp->local.ffn_hidden;
    size_t FR = (size_t)loom_gpt_fc_rows(f), FRl = (size_t)loom_gpt_fc_rows(&tp->local);
    for (size_t L = 0; L < (size_t)f->n_layer; L++) {
        size_t fb = fo + L * FR * rowlen, lb = lo + L * FRl * rowlen;
        fn(ctx, fb + (size_t)r * Hl * rowlen, lb, Hl * rowlen, SEG_SHARD);
        if (f->mlp == LOOM_MLP_SWIGLU) fn(ctx, fb + (H + (size_t)r * Hl) * rowlen, lb + Hl * rowlen, Hl * rowlen, SEG_SHARD);
    }
}

/* A row-parallel weight (L, C, K) -> (L, C, K/N): each row's column slice. */
static void col_segments(const loom_tp_t *tp, int r, size_t fo, size_t lo, size_t K, size_t Kl, seg_fn fn, void *ctx) {
    size_t rows = (size_t)tp->full.n_layer * (size_t)tp->full.channels;
    for (size_t i = 0; i < rows; i++) fn(ctx, fo + i * K + (size_t)r * Kl, lo + i * Kl, Kl, SEG_SHARD);
}

/* Every piece of rank r's shard, in the order of its block. */
static void segments(const loom_tp_t *tp, int r, seg_fn fn, void *ctx) {
    const loom_tensor_info_t *lt = tp->m->ptable;
    size_t C = (size_t)tp->full.channels;
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *F = &tp->ftab[i];
        if (!F->numel) continue;
        size_t fo = F->offset, lo = lt[i].offset;
        switch (i) {
        case LOOM_WTE: case LOOM_LMHEAD: { /* the last ranks' rows may lie past Vp: padding nobody stores */
            long rows = (long)tp->full.padded_vocab_size - (long)r * tp->vs;
            rows = rows < 0 ? 0 : rows > tp->vs ? tp->vs : rows;
            if (rows) fn(ctx, fo + (size_t)r * tp->vs * C, lo, (size_t)rows * C, SEG_SHARD);
            break;
        }
        case LOOM_QKVW: qkv_segments(tp, r, fo, lo, C, fn, ctx); break;
        case LOOM_QKVB: qkv_segments(tp, r, fo, lo, 1, fn, ctx); break;
        case LOOM_FCW: fc_segments(tp, r, fo, lo, C, fn, ctx); break;
        case LOOM_FCB: fc_segments(tp, r, fo, lo, 1, fn, ctx); break;
        case LOOM_ATTPROJW:
            col_segments(tp, r, fo, lo, (size_t)loom_gpt_attn_width(&tp->full), (size_t)loom_gpt_attn_width(&tp->local), fn, ctx);
            break;
        case LOOM_FCPROJW:
            col_segments(tp, r, fo, lo, (size_t)tp->full.ffn_hidden, (size_t)tp->local.ffn_hidden, fn, ctx);
            break;
        case LOOM_ATTPROJB: case LOOM_FCPROJB:
            if (r == 0) fn(ctx, fo, lo, F->numel, SEG_RANK0);
            break;
        default: /* norms, wpe */
            fn(ctx, fo, lo, F->numel, SEG_REPL);
            break;
        }
    }
}

loom_status loom_tp_local_config(const loom_gpt_config_t *full, int n, loom_gpt_config_t *local) {
    const loom_gpt_config_t *f = full;
    if (n < 1) return loom_error(LOOM_EINVAL, "--tp %d: use 1 or more", n);
    if (f->n_head % n)
        return loom_error(LOOM_EINVAL, "--tp %d: the model's %d attention heads do not split over %d ranks; use a --tp that divides %d", n,
                          f->n_head, n, f->n_head);
    if (f->n_kv_heads % n && n % f->n_kv_heads)
        return loom_error(LOOM_EINVAL, "--tp %d: %d key/value heads neither split over %d ranks nor are shared evenly by them; use a --tp that divides or is a multiple of %d",
                          n, f->n_kv_heads, n, f->n_kv_heads);
    if (f->ffn_hidden % n)
        return loom_error(LOOM_EINVAL, "--tp %d: the MLP's %d hidden units do not split over %d ranks", n, f->ffn_hidden, n);
    *local = *f;
    local->n_head = f->n_head / n;
    local->head_dim = loom_gpt_head_size(f);
    local->n_kv_heads = f->n_kv_heads % n == 0 ? f->n_kv_heads / n : 1;
    local->ffn_hidden = f->ffn_hidden / n;
    int per = (f->vocab_size + 64 * n - 1) / (64 * n) * 64; /* a multiple of 64: the shard's own padding is none */
    local->vocab_size = per;
    local->padded_vocab_size = 0;
    return loom_gpt_config_finish(local);
}

loom_status loom_tp_act_elem(loom_dtype act, loom_dist_elem *elem) {
    switch (act) {
    case LOOM_FP32: *elem = LOOM_DIST_ELEM_FP32; return LOOM_OK;
    case LOOM_BF16: *elem = LOOM_DIST_ELEM_BF16; return LOOM_OK;
    case LOOM_FP16: *elem = LOOM_DIST_ELEM_FP16; return LOOM_OK;
    default:
        return loom_error(LOOM_EUNAVAIL, "--tp: activations at %s; tensor parallelism reduces fp32, bf16 or fp16 activations: use --dtype fp32, bf16 or fp16",
                          loom_dtype_name(act));
    }
}

/* ---- the hooks ---- */

static void fail(loom_tp_t *tp, loom_status s) {
    if (s == LOOM_OK || tp->err != LOOM_OK) return;
    tp->err = s;
    snprintf(tp->errmsg, sizeof tp->errmsg, "%s", loom_errmsg());
}

static void hook_allreduce(void *ctx, float *buf, size_t n) {
    loom_tp_t *tp = ctx;
    if (tp->err != LOOM_OK) return;
    if (tp->gpu) tp->m->be->sync(); /* NCCL's stream must see the finished buffer */
    fail(tp, loom_dist_allreduce_elem(tp->g, buf, n, tp->act));
}

static void hook_embed_forward(void *ctx, float *out, int B, int T) {
    loom_tp_t *tp = ctx;
    loom_gpt_t *m = tp->m;
    const float *wpe = tp->rank == 0 ? loom_gpt_weight(m, LOOM_WPE, 0, 0) : NULL; /* added once */
    m->be->vocab_embed_forward(out, m->tokens, loom_gpt_weight(m, LOOM_WTE, 0, 0), wpe, B, T, m->cfg.channels, tp->v0, tp->vs);
    hook_allreduce(tp, out, (size_t)B * T * m->cfg.channels);
}

static void hook_embed_backward(void *ctx, const float *dout, int B, int T) {
    loom_tp_t *tp = ctx;
    loom_gpt_t *m = tp->m;
    m->be->vocab_embed_backward(loom_gpt_weight(m, LOOM_WTE, 0, 1), loom_gpt_weight(m, LOOM_WPE, 0, 1), dout, m->tokens, B, T,
                                m->cfg.channels, tp->v0, tp->vs);
}

static void hook_crossentropy(void *ctx, float *losses, float *logits, int N, float dloss) {
    loom_tp_t *tp = ctx;
    const loom_backend_t *be = tp->m->be;
    if (tp->err != LOOM_OK) return;
    if ((size_t)N > tp->stats_rows) {
        if (tp->stats) be->free(tp->stats);
        tp->stats = be->alloc((size_t)tp->n * N * 3 * sizeof(float));
        tp->stats_rows = tp->stats ? (size_t)N : 0;
        if (!tp->stats) {
            fail(tp, loom_error(LOOM_ENOMEM, "tensor parallel: cannot allocate the cross-entropy's %d x %d statistics", tp->n, N));
            return;
        }
    }
    be->vocab_ce_stats(tp->stats + (size_t)tp->rank * N * 3, logits, tp->m->targets, N, tp->vs, tp->v0, tp->nv);
    if (tp->gpu) be->sync();
    size_t counts[tp->n];
    for (int r = 0; r < tp->n; r++) counts[r] = (size_t)N * 3;
    loom_status s = loom_dist_allgather(tp->g, tp->stats, counts);
    fail(tp, s);
    if (s == LOOM_OK) be->vocab_ce_finish(losses, logits, tp->m->targets, tp->stats, tp->n, N, tp->vs, tp->v0, tp->nv, dloss);
}

/* ---- slicing and gathering ---- */

typedef struct {
    const float *src;
    float *dst;
    int to_full; /* 1: local -> full, else full -> local */
} copy_t;

static void seg_copy(void *ctx, size_t fo, size_t lo, size_t n, int kind) {
    copy_t *c = ctx;
    (void)kind;
    if (c->to_full) memcpy(c->dst + fo, c->src + lo, n * sizeof(float));
    else memcpy(c->dst + lo, c->src + fo, n * sizeof(float));
}

void loom_tp_slice(const loom_tp_t *tp, const float *full, float *local) {
    copy_t c = {full, local, 0};
    memset(local, 0, tp->m->num_params * sizeof(float));
    segments(tp, tp->rank, seg_copy, &c);
}

loom_status loom_tp_gather(loom_tp_t *tp, const float *local, float *full_host) {
    const loom_backend_t *be = tp->m->be;
    size_t P = tp->m->num_params, counts[tp->n];
    for (int r = 0; r < tp->n; r++) counts[r] = P;
    float *all = be->alloc((size_t)tp->n * P * sizeof(float)), *host = NULL;
    if (!all) return loom_error(LOOM_ENOMEM, "tensor parallel: cannot allocate %.1f MB to gather the shards for a checkpoint", tp->n * P * 4e-6);
    be->accumulate(all + (size_t)tp->rank * P, local, P); /* a copy: alloc returns zeros */
    if (tp->gpu) be->sync();
    loom_status s = loom_dist_allgather(tp->g, all, counts);
    if (s == LOOM_OK && full_host) {
        host = loom_malloc((size_t)tp->n * P * sizeof(float));
        be->download(host, all, (size_t)tp->n * P * sizeof(float));
        memset(full_host, 0, tp->full_params * sizeof(float));
        for (int r = 0; r < tp->n; r++) {
            copy_t c = {host + (size_t)r * P, full_host, 1};
            segments(tp, r, seg_copy, &c);
        }
    }
    free(host);
    be->free(all);
    return s;
}

/* ---- gradients ---- */

/* Sum of squares of the runs of the block this rank counts, within the
 * window [lo, hi) of it that `g` holds (g[0] = float lo): contiguous
 * pieces are merged so each tensor is one or a few calls. */
typedef struct {
    const loom_tp_t *tp;
    const float *g;
    size_t lo, hi;
    size_t run_lo, run_n;
    double ss;
} norm_t;

static void norm_flush(norm_t *x) {
    if (x->run_n) x->ss += x->tp->m->be->sumsq(x->g + (x->run_lo - x->lo), x->run_n);
    x->run_n = 0;
}

/* [*a, *a + *n) clipped to [lo, hi); 0 when nothing is left. */
static int clip(size_t lo, size_t hi, size_t *a, size_t *n) {
    size_t x0 = *a > lo ? *a : lo, x1 = *a + *n < hi ? *a + *n : hi;
    if (x1 <= x0) return 0;
    *n = x1 - x0;
    *a = x0;
    return 1;
}

static void seg_norm(void *ctx, size_t fo, size_t lo, size_t n, int kind) {
    norm_t *x = ctx;
    const loom_tp_t *tp = x->tp;
    int share = tp->kv_split ? 1 : tp->n / tp->full.n_kv_heads;
    (void)fo;
    int counted = kind == SEG_SHARD || kind == SEG_RANK0 || (kind == SEG_REPL && tp->rank == 0) ||
                  (kind == SEG_KV && tp->rank % share == 0);
    if (!counted || !clip(x->lo, x->hi, &lo, &n)) return;
    if (x->run_n && x->run_lo + x->run_n == lo) {
        x->run_n += n;
        return;
    }
    norm_flush(x);
    x->run_lo = lo;
    x->run_n = n;
}

loom_status loom_tp_grad_sumsq(loom_tp_t *tp, const float *g, size_t lo, size_t hi, double *ss) {
    norm_t x = {.tp = tp, .g = g, .lo = lo, .hi = hi};
    segments(tp, tp->rank, seg_norm, &x);
    norm_flush(&x);
    *ss = x.ss;
    return loom_dist_allreduce_f64(tp->g, ss, 1);
}

/* The shared kv heads: each rank's kv rows (within the window) go to
 * their head's slot of a whole-model-sized scratch, the group sums it, each
 * takes its slot back. The ranks of a group hold the same window: their
 * shards have one shape, and the dp index (the ZeRO shard) is theirs. */
typedef struct {
    const loom_backend_t *be;
    float *g, *scratch;
    size_t lo, hi; /* the window g holds (g[0] = float lo) */
    int back;
} kvsum_t;

static void seg_kv(void *ctx, size_t fo, size_t lo, size_t n, int kind) {
    kvsum_t *k = ctx;
    size_t a = lo;
    if (kind != SEG_KV || !clip(k->lo, k->hi, &a, &n)) return;
    float *slot = k->scratch + fo + (a - lo), *mine = k->g + (a - k->lo);
    if (k->back) k->be->zero(mine, n * sizeof(float));
    k->be->accumulate(k->back ? mine : slot, k->back ? slot : mine, n); /* a copy into zeros */
}

static loom_status sum_shared_kv(loom_tp_t *tp, float *g, size_t lo, size_t hi) {
    const loom_backend_t *be = tp->m->be;
    float *scratch = be->alloc(tp->full_params * sizeof(float));
    if (!scratch) return loom_error(LOOM_ENOMEM, "tensor parallel: cannot allocate %.1f MB to sum the shared kv heads' gradients", tp->full_params * 4e-6);
    kvsum_t k = {be, g, scratch, lo, hi, 0};
    segments(tp, tp->rank, seg_kv, &k);
    if (tp->gpu) be->sync();
    loom_status s = loom_dist_allreduce(tp->g, scratch, tp->full_params, LOOM_DIST_FP32, 1.0f);
    k.back = 1;
    if (s == LOOM_OK) segments(tp, tp->rank, seg_kv, &k);
    be->free(scratch);
    return s;
}

/* Zero tensor i's floats within the window. */
static void zero_in(const loom_tp_t *tp, int i, float *g, size_t lo, size_t hi) {
    size_t a = tp->m->ptable[i].offset, n = tp->m->ptable[i].numel;
    if (n && clip(lo, hi, &a, &n)) tp->m->be->zero(g + (a - lo), n * sizeof(float));
}

loom_status loom_tp_finish_grads(loom_tp_t *tp, float *g, size_t lo, size_t hi) {
    if (tp->err != LOOM_OK) {
        loom_status s = tp->err;
        tp->err = LOOM_OK;
        return loom_error(s, "%s", tp->errmsg);
    }
    if (tp->rank != 0) { /* the biases rank 0 adds: the others' copies stay zero */
        zero_in(tp, LOOM_ATTPROJB, g, lo, hi);
        zero_in(tp, LOOM_FCPROJB, g, lo, hi);
    }
    if (!tp->kv_split && tp->n > 1) LOOM_TRY(sum_shared_kv(tp, g, lo, hi));
    return LOOM_OK;
}

loom_status loom_tp_dp_mean(loom_tp_t *tp, double *v, int n) {
    if (tp->dp_n <= 1) return LOOM_OK;
    LOOM_TRY(loom_dist_allreduce_f64(tp->dp, v, (size_t)n));
    for (int i = 0; i < n; i++) v[i] /= tp->dp_n;
    return LOOM_OK;
}

double loom_tp_wait_seconds(const loom_tp_t *tp) { return tp ? loom_dist_wait_seconds(tp->g) : 0; }
double loom_tp_dp_wait_seconds(const loom_tp_t *tp) { return tp && tp->dp_n > 1 ? loom_dist_wait_seconds(tp->dp) : 0; }

/* ---- setup ---- */

loom_status loom_tp_init(loom_tp_t **out, const loom_gpt_t *full, const loom_backend_t *be, loom_dist_t *group,
                         loom_dist_t *dp) {
    *out = NULL;
    loom_dist_elem act = LOOM_DIST_ELEM_FP32;
    LOOM_TRY(loom_tp_act_elem(be->act_dtype, &act));
    loom_tp_t *tp = loom_calloc(1, sizeof *tp);
    tp->act = act;
    tp->full = full->cfg;
    tp->g = group;
    tp->dp = dp;
    tp->n = loom_dist_size(group);
    tp->rank = loom_dist_rank(group);
    tp->dp_n = dp ? loom_dist_size(dp) : 1;
    tp->gpu = (be->caps & LOOM_CAP_DEVICE_MEMORY) != 0;
    loom_gpt_param_table(&tp->full, tp->ftab, &tp->full_params);
    loom_status s = loom_tp_local_config(&tp->full, tp->n, &tp->local);
    if (s == LOOM_OK) s = loom_gpt_create(&tp->m, &tp->local, be);
    if (s == LOOM_OK) s = loom_gpt_alloc_train(tp->m);
    if (s != LOOM_OK) {
        loom_tp_free(tp);
        return s;
    }
    tp->kv_split = tp->full.n_kv_heads % tp->n == 0;
    tp->vs = tp->local.vocab_size;
    tp->v0 = tp->rank * tp->vs;
    int real = tp->full.vocab_size - tp->v0;
    tp->nv = real < 0 ? 0 : real > tp->vs ? tp->vs : real;
    float *fh = loom_malloc(tp->full_params * sizeof(float)), *lh = loom_malloc(tp->m->num_params * sizeof(float));
    full->be->download(fh, full->params, tp->full_params * sizeof(float));
    loom_tp_slice(tp, fh, lh);
    be->upload(tp->m->params, lh, tp->m->num_params * sizeof(float));
    free(fh);
    free(lh);
    tp->hooks = (loom_gpt_tp_hooks_t){.ctx = tp, .vocab_size = tp->full.vocab_size, .allreduce = hook_allreduce,
                                      .embed_forward = hook_embed_forward, .embed_backward = hook_embed_backward,
                                      .crossentropy = hook_crossentropy};
    tp->m->tp = &tp->hooks;
    *out = tp;
    return LOOM_OK;
}

void loom_tp_free(loom_tp_t *tp) {
    if (!tp) return;
    if (tp->stats) tp->m->be->free(tp->stats);
    loom_gpt_free(tp->m);
    free(tp);
}

loom_gpt_t *loom_tp_model(const loom_tp_t *tp) { return tp->m; }
const loom_gpt_config_t *loom_tp_full_config(const loom_tp_t *tp) { return &tp->full; }
