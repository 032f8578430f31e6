#include "zero3.h"

#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

/* A gather or gradient buffer: which unit it holds (-1 none) and the
 * dist mark its collective completes at (0: nothing outstanding). */
typedef struct {
    float *buf;
    int unit;
    long mark;
} slot_t;

struct loom_zero3 {
    loom_gpt_t *m;
    const loom_backend_t *be;
    loom_dist_t *d;
    int world, rank, L, gpu, prefetch;
    loom_dist_dtype gdt;
    size_t *bounds;            /* world + 1 */
    size_t lo, hi;             /* this rank's range of the block */
    float *p, *g;              /* parameter and gradient shards */
    size_t boff[LOOM_NPARAMS]; /* tensor i's slice within its unit's buffer */
    size_t unit_floats[2];     /* a layer's, the non-layer tensors' */
    size_t *counts;            /* (L + 1) x world: each rank's part of each unit */
    slot_t ps[2], gs[2];       /* layer params (block l in ps[l % 2]), layer grads */
    slot_t pn, gn;             /* the non-layer unit's params and grads */
    float scale;               /* this micro-batch's reductions */
    loom_status err;           /* first failure inside a hook */
};

static int is_layer_tensor(int i) {
    return i != LOOM_WTE && i != LOOM_WPE && i != LOOM_LMHEAD && i != LOOM_LNFW && i != LOOM_LNFB;
}

/* Tensor i's piece of unit u, [*a, *a + *n) of the block; 0 when it has none. */
static int piece(const loom_zero3_t *z, int u, int i, size_t *a, size_t *n) {
    const loom_tensor_info_t *t = &z->m->ptable[i];
    if (!t->numel || is_layer_tensor(i) != (u < z->L)) return 0;
    *n = u < z->L ? t->numel / (size_t)z->L : t->numel;
    *a = t->offset + (u < z->L ? (size_t)u * *n : 0);
    return 1;
}

/* Record a hook's failure; the step returns the first. */
static void fail(loom_zero3_t *z, loom_status s) {
    if (s != LOOM_OK && z->err == LOOM_OK) z->err = s;
}

static void dev_copy(const loom_zero3_t *z, float *dst, const float *src, size_t n) {
    if (!z->gpu) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    z->be->zero(dst, n * sizeof(float));
    z->be->accumulate(dst, src, n);
}

/* This rank's part of unit u between its shard and the unit's buffer:
 * dir 0 copies the parameter shard in, dir 1 adds the buffer into the
 * gradient shard. */
static void own_part(loom_zero3_t *z, int u, float *buf, int dir) {
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        size_t a, n;
        if (!piece(z, u, i, &a, &n)) continue;
        size_t x0 = a > z->lo ? a : z->lo, x1 = a + n < z->hi ? a + n : z->hi;
        if (x1 <= x0) continue;
        float *b = buf + z->boff[i] + (x0 - a);
        if (dir == 0) dev_copy(z, b, z->p + (x0 - z->lo), x1 - x0);
        else z->be->accumulate(z->g + (x0 - z->lo), b, x1 - x0);
    }
}

static slot_t *param_slot(loom_zero3_t *z, int u) { return u == z->L ? &z->pn : &z->ps[u % 2]; }

/* Issue unit u's gather unless its slot holds it already. */
static slot_t *ensure(loom_zero3_t *z, int u) {
    slot_t *s = param_slot(z, u);
    if (s->unit == u) return s;
    own_part(z, u, s->buf, 0);
    if (z->gpu) z->be->sync(); /* the gather's stream must see the copy, and block u-2 must be done with the slot */
    fail(z, loom_dist_iallgather(z->d, s->buf, z->counts + (size_t)u * z->world));
    s->unit = u;
    s->mark = loom_dist_mark(z->d);
    return s;
}

static slot_t *ready(loom_zero3_t *z, slot_t *s) {
    if (s->mark > 0) fail(z, loom_dist_wait_mark(z->d, s->mark));
    s->mark = 0;
    return s;
}

/* A gradient slot's reduction done and its own segment in the shard. */
static void drain(loom_zero3_t *z, slot_t *s) {
    if (s->unit < 0) return;
    ready(z, s);
    own_part(z, s->unit, s->buf, 1);
    s->unit = -1;
}

static float *view(void *ctx, int i, int l, int grad) {
    loom_zero3_t *z = ctx;
    if (!z->m->ptable[i].numel) return NULL;
    int u = is_layer_tensor(i) ? l : z->L;
    if (grad) return (u == z->L ? z->gn.buf : z->gs[u % 2].buf) + z->boff[i];
    return ready(z, ensure(z, u))->buf + z->boff[i];
}

static void layer_hook(void *ctx, int l, int backward) {
    loom_zero3_t *z = ctx;
    if (l < 0) {
        ready(z, ensure(z, z->L));
        if (backward) {
            z->be->zero(z->gn.buf, z->unit_floats[1] * sizeof(float));
            z->gn.unit = z->L;
        }
        if (z->prefetch) ensure(z, backward ? z->L - 1 : 0);
        return;
    }
    ensure(z, l);
    int next = backward ? l - 1 : l + 1;
    if (z->prefetch && next >= 0 && next < z->L) ensure(z, next);
    if (!z->prefetch) ready(z, param_slot(z, l));
    if (!backward) return;
    slot_t *gs = &z->gs[l % 2];
    drain(z, gs); /* block l + 2's reduction */
    z->be->zero(gs->buf, z->unit_floats[0] * sizeof(float));
    gs->unit = l;
}

/* Block l's gradients (l = -1: the non-layer ones) are final for this
 * micro-batch: reduce-scatter them while backward goes on. */
static void grad_done(void *ctx, int l) {
    loom_zero3_t *z = ctx;
    int u = l < 0 ? z->L : l;
    slot_t *s = l < 0 ? &z->gn : &z->gs[l % 2];
    if (z->gpu) z->be->sync();
    fail(z, loom_dist_ireduce_scatter(z->d, s->buf, z->counts + (size_t)u * z->world, z->gdt, z->scale));
    s->mark = loom_dist_mark(z->d);
    if (!z->prefetch) drain(z, s);
}

/* Buffer offsets and every rank's part of every unit. */
static void lay_out_units(loom_zero3_t *z) {
    size_t off[2] = {0, 0};
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *t = &z->m->ptable[i];
        int k = !is_layer_tensor(i);
        z->boff[i] = off[k];
        off[k] += k ? t->numel : t->numel / (size_t)z->L;
    }
    z->unit_floats[0] = off[0];
    z->unit_floats[1] = off[1];
    z->counts = loom_calloc((size_t)(z->L + 1) * z->world, sizeof(size_t));
    for (int u = 0; u <= z->L; u++)
        for (int i = 0; i < LOOM_NPARAMS; i++) {
            size_t a, n;
            if (!piece(z, u, i, &a, &n)) continue;
            for (int r = 0; r < z->world; r++) {
                size_t x0 = a > z->bounds[r] ? a : z->bounds[r], x1 = a + n < z->bounds[r + 1] ? a + n : z->bounds[r + 1];
                if (x1 > x0) z->counts[(size_t)u * z->world + r] += x1 - x0;
            }
        }
}

/* Backend memory of n floats (at least one), counted as `kind`. */
static float *zalloc(loom_zero3_t *z, size_t n, loom_mem_kind kind) {
    size_t bytes = (n ? n : 1) * sizeof(float);
    float *p = z->be->alloc(bytes);
    if (p) loom_mem_count(kind, (long long)bytes);
    return p;
}

static void zfree(loom_zero3_t *z, float *p, size_t n, loom_mem_kind kind) {
    if (!p) return;
    z->be->free(p);
    loom_mem_count(kind, -(long long)((n ? n : 1) * sizeof(float)));
}

loom_status loom_zero3_init(loom_zero3_t **out, loom_gpt_t *m, loom_dist_t *d, const size_t *bounds,
                            loom_dist_dtype grad_dtype, int prefetch) {
    *out = NULL;
    loom_zero3_t *z = loom_calloc(1, sizeof *z);
    *z = (loom_zero3_t){.m = m, .be = m->be, .d = d, .world = loom_dist_size(d), .rank = loom_dist_rank(d),
                        .L = m->cfg.n_layer, .gpu = (m->be->caps & LOOM_CAP_DEVICE_MEMORY) != 0, .prefetch = prefetch,
                        .gdt = grad_dtype, .scale = 1.0f};
    z->bounds = loom_malloc(((size_t)z->world + 1) * sizeof(size_t));
    memcpy(z->bounds, bounds, ((size_t)z->world + 1) * sizeof(size_t));
    z->lo = bounds[z->rank];
    z->hi = bounds[z->rank + 1];
    lay_out_units(z);
    size_t n = z->hi - z->lo, lu = z->unit_floats[0], nu = z->unit_floats[1];
    /* The shard first and the whole block released, then the rest: the
     * block and the buffers are never held at once. */
    z->p = zalloc(z, n, LOOM_MEM_PARAMS);
    loom_status s = z->p ? loom_zero3_adopt(z) : LOOM_OK;
    if (s != LOOM_OK) {
        loom_zero3_free(z);
        return s;
    }
    z->g = zalloc(z, n, LOOM_MEM_GRADS);
    z->pn.buf = zalloc(z, nu, LOOM_MEM_PARAMS);
    z->gn.buf = zalloc(z, nu, LOOM_MEM_GRADS);
    int ok = z->p && z->g && z->pn.buf && z->gn.buf;
    for (int k = 0; k < 2; k++) {
        z->ps[k].buf = zalloc(z, lu, LOOM_MEM_PARAMS);
        z->gs[k].buf = zalloc(z, lu, LOOM_MEM_GRADS);
        ok = ok && z->ps[k].buf && z->gs[k].buf;
    }
    if (!ok) {
        loom_zero3_free(z);
        return loom_error(LOOM_ENOMEM, "--zero 3: cannot allocate this rank's shards (%.1f MB) and gather buffers (%.1f MB); use more ranks or a smaller model",
                          8.0 * (double)n / 1e6, 8.0 * (double)(2 * lu + nu) / 1e6);
    }
    m->view = view, m->layer_hook = layer_hook, m->view_ctx = z; /* the model reads its weights through the gathers */
    m->grad_hook = grad_done, m->grad_hook_ctx = z;                /* and hands each block's gradients over */
    *out = z;
    return LOOM_OK;
}

void loom_zero3_free(loom_zero3_t *z) {
    if (!z) return;
    loom_gpt_t *m = z->m;
    if (m->view_ctx == z) m->view = NULL, m->layer_hook = NULL, m->view_ctx = NULL;
    if (m->grad_hook_ctx == z) m->grad_hook = NULL, m->grad_hook_ctx = NULL;
    loom_dist_wait(z->d); /* no collective may still write a buffer freed here */
    size_t n = z->hi - z->lo;
    zfree(z, z->p, n, LOOM_MEM_PARAMS);
    zfree(z, z->g, n, LOOM_MEM_GRADS);
    zfree(z, z->pn.buf, z->unit_floats[1], LOOM_MEM_PARAMS);
    zfree(z, z->gn.buf, z->unit_floats[1], LOOM_MEM_GRADS);
    for (int k = 0; k < 2; k++) {
        zfree(z, z->ps[k].buf, z->unit_floats[0], LOOM_MEM_PARAMS);
        zfree(z, z->gs[k].buf, z->unit_floats[0], LOOM_MEM_GRADS);
    }
    free(z->counts);
    free(z->bounds);
    free(z);
}

static void set_block(loom_gpt_t *m, float *block) {
    m->params = block;
    for (int i = 0; i < LOOM_NPARAMS; i++) m->param[i] = block ? block + m->ptable[i].offset : NULL;
}

loom_status loom_zero3_unshard(loom_zero3_t *z) {
    if (z->m->params) return LOOM_OK;
    float *block = zalloc(z, z->m->num_params, LOOM_MEM_PARAMS);
    if (!block)
        return loom_error(LOOM_ENOMEM, "--zero 3: cannot allocate the whole parameter block (%.1f MB) to load a checkpoint into",
                          4.0 * (double)z->m->num_params / 1e6);
    z->be->zero(block, z->m->num_params * sizeof(float));
    set_block(z->m, block);
    return LOOM_OK;
}

loom_status loom_zero3_adopt(loom_zero3_t *z) {
    loom_gpt_t *m = z->m;
    if (!m->params) return loom_error(LOOM_EINTERNAL, "--zero 3: no whole parameter block to take the shard from");
    if (z->hi > z->lo) dev_copy(z, z->p, m->params + z->lo, z->hi - z->lo);
    z->be->sync();
    zfree(z, m->params, m->num_params, LOOM_MEM_PARAMS);
    set_block(m, NULL);
    loom_zero3_params_changed(z);
    return LOOM_OK;
}

float *loom_zero3_params(const loom_zero3_t *z) { return z->p; }
float *loom_zero3_grads(const loom_zero3_t *z) { return z->g; }

void loom_zero3_zero_grads(loom_zero3_t *z, float scale) {
    z->be->zero(z->g, (z->hi - z->lo) * sizeof(float));
    z->scale = scale;
    z->err = LOOM_OK;
}

loom_status loom_zero3_finish_backward(loom_zero3_t *z) {
    drain(z, &z->gs[0]);
    drain(z, &z->gs[1]);
    drain(z, &z->gn);
    loom_status s = z->err;
    z->err = LOOM_OK;
    return s;
}

/* One evaluation forward: the hooks' failures (a gather that a dead or
 * hung peer never answered) come back as its status, as the step's do,
 * rather than being left for the watchdog. */
static loom_status score_forward(void *vz, const int *in, const int *tg, int B, int T, float *loss) {
    loom_zero3_t *z = vz;
    z->err = LOOM_OK;
    loom_status s = loom_gpt_forward(z->m, in, tg, B, T, 0.0f, loss);
    if (s == LOOM_OK) s = z->err;
    z->err = LOOM_OK;
    return s;
}

loom_status loom_zero3_eval_loss(loom_zero3_t *z, const loom_dataset_t *ds, int B, int T, int max_batches, loom_eval_result_t *out) {
    return loom_eval_batches(ds, B, T, max_batches, score_forward, z, out);
}

void loom_zero3_params_changed(loom_zero3_t *z) {
    z->ps[0].unit = z->ps[1].unit = z->pn.unit = -1;
}

loom_status loom_zero3_gather_host(loom_zero3_t *z, float *host) {
    z->err = LOOM_OK;
    for (int u = 0; u <= z->L; u++) {
        slot_t *s = ready(z, ensure(z, u));
        if (z->err != LOOM_OK) break;
        for (int i = 0; i < LOOM_NPARAMS && host; i++) {
            size_t a, n;
            if (piece(z, u, i, &a, &n)) z->be->download(host + a, s->buf + z->boff[i], n * sizeof(float));
        }
    }
    loom_status s = z->err;
    z->err = LOOM_OK;
    return s;
}

void loom_zero3_bytes(const loom_zero3_t *z, double *params, double *grads) {
    double shard = 4.0 * (double)(z->hi - z->lo), bufs = 4.0 * (double)(2 * z->unit_floats[0] + z->unit_floats[1]);
    *params = shard + bufs;
    *grads = shard + bufs;
}
