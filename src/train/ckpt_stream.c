/* ckpt_stream: a sharded run's checkpoint, unit by unit (ckpt_stream.h). */
#include "train/ckpt_stream.h"

#include <stdlib.h>

#include "ckpt/optim.h"
#include "ckpt/safetensors.h"
#include "ckpt/tensormap.h"
#include <string.h>

int loom_ckpt_unit_per_layer(int i) {
    return i != LOOM_WTE && i != LOOM_WPE && i != LOOM_LMHEAD && i != LOOM_LNFW && i != LOOM_LNFB;
}

size_t loom_ckpt_unit_floats(const loom_tensor_info_t *table, int i, int layer, size_t *offset) {
    const loom_tensor_info_t *t = &table[i];
    size_t per = loom_ckpt_unit_per_layer(i) ? t->numel / (size_t)t->shape[0] : t->numel;
    *offset = t->offset + (layer > 0 ? (size_t)layer * per : 0);
    return per;
}

/* Where rank 0 puts one gathered unit. */
typedef struct {
    loom_st_writer_t *st;     /* the parameters */
    loom_optim_stream_t *opt; /* m, then v */
    loom_status err;          /* the first write error; the gathers go on */
} sink_t;

/* The optimizer file holds the whole block, the alignment gaps between
 * tensors (zero in m and v: no gradient reaches them) included: zeros up
 * to float `to`. */
static void pad_to(sink_t *k, size_t *at, size_t to) {
    static const float zeros[64];
    while (k->err == LOOM_OK && *at < to) {
        size_t n = to - *at < 64 ? to - *at : 64;
        k->err = loom_optim_stream_put(k->opt, zeros, n);
        *at += n;
    }
}

/* Every unit of block `which`, in block order, gathered and (rank 0) written. */
static loom_status one_block(const loom_ckpt_stream_t *cs, const loom_tensor_info_t *tab, size_t P, int which, sink_t *k, float *buf) {
    size_t at = 0; /* the optimizer file's next float */
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        if (!tab[i].numel) continue;
        int layers = loom_ckpt_unit_per_layer(i) ? cs->cfg.n_layer : 1;
        for (int l = 0; l < layers; l++) {
            size_t off, n = loom_ckpt_unit_floats(tab, i, loom_ckpt_unit_per_layer(i) ? l : -1, &off);
            LOOM_TRY(cs->gather(cs->ctx, which, i, loom_ckpt_unit_per_layer(i) ? l : -1, buf));
            if (!buf || k->err != LOOM_OK) continue;
            if (which == LOOM_UNIT_PARAMS) {
                k->err = loom_safetensors_stream_put(k->st, off, off + n, buf);
                continue;
            }
            pad_to(k, &at, off);
            if (k->err == LOOM_OK) k->err = loom_optim_stream_put(k->opt, buf, n);
            at = off + n;
        }
    }
    if (buf && which != LOOM_UNIT_PARAMS) pad_to(k, &at, P);
    return LOOM_OK;
}

/* The largest unit, in floats. */
static size_t largest_unit(const loom_tensor_info_t *tab) {
    size_t most = 0, off;
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        size_t n = tab[i].numel ? loom_ckpt_unit_floats(tab, i, 0, &off) : 0;
        most = n > most ? n : most;
    }
    return most;
}

loom_status loom_ckpt_stream_write(const loom_ckpt_stream_t *cs, const char *dir, long long step) {
    loom_tensor_info_t tab[LOOM_NPARAMS];
    size_t P;
    loom_gpt_param_table(&cs->cfg, tab, &P);
    sink_t k = {0};
    float *buf = NULL;
    if (cs->lead) {
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        k.err = loom_safetensors_stream_open(&k.st, &cs->cfg, path);
        loom_optim_shard_path(path, sizeof path, dir, 0, 1);
        loom_optim_shard_t h = {0, 1, (uint32_t)cs->zero, P, 0, P, (uint64_t)step};
        if (k.err == LOOM_OK) k.err = loom_optim_stream_open(&k.opt, path, &h);
        buf = loom_malloc(largest_unit(tab) * sizeof(float));
    }
    loom_status s = LOOM_OK;
    for (int which = LOOM_UNIT_PARAMS; which <= LOOM_UNIT_V && s == LOOM_OK; which++) s = one_block(cs, tab, P, which, &k, buf);
    free(buf);
    if (k.st) {
        loom_status c = loom_safetensors_stream_close(k.st, s == LOOM_OK && k.err == LOOM_OK);
        if (k.err == LOOM_OK) k.err = c;
    }
    if (k.opt) {
        loom_status c = loom_optim_stream_close(k.opt, s == LOOM_OK && k.err == LOOM_OK);
        if (k.err == LOOM_OK) k.err = c;
    }
    if (s != LOOM_OK) return s;
    return k.err; /* its message is the writer's */
}

/* The file's tensors and where each starts in the whole block. */
typedef struct {
    loom_stview_t *view;
    loom_xtensor_t *x;
    size_t *at;
    int n;
} files_t;

/* Unit [a, a + n) of the parameters from the safetensors file: every file
 * tensor inside it (the vocabulary's padding rows stay zero). */
static loom_status read_params(const files_t *f, size_t a, size_t n, float *buf) {
    memset(buf, 0, n * sizeof(float));
    for (int k = 0; k < f->n; k++)
        if (f->at[k] >= a && f->at[k] + f->x[k].numel <= a + n) LOOM_TRY(loom_xsource_safetensors(f->view, &f->x[k], buf + (f->at[k] - a)));
    return LOOM_OK;
}

static loom_status read_units(const loom_gpt_config_t *cfg, const loom_tensor_info_t *tab, int blocks, const files_t *f,
                              loom_optim_reader_t *rd, loom_unit_want_fn want, loom_unit_put_fn put, void *ctx) {
    float *buf = loom_malloc(largest_unit(tab) * sizeof(float));
    loom_status s = LOOM_OK;
    for (int which = LOOM_UNIT_PARAMS; which <= LOOM_UNIT_V && s == LOOM_OK; which++) {
        if (!(blocks & (1 << which))) continue;
        for (int i = 0; i < LOOM_NPARAMS && s == LOOM_OK; i++) {
            int layers = tab[i].numel ? loom_ckpt_unit_per_layer(i) ? cfg->n_layer : 1 : 0;
            for (int l = 0; l < layers && s == LOOM_OK; l++) {
                int layer = loom_ckpt_unit_per_layer(i) ? l : -1;
                if (want && !want(ctx, i, layer)) continue;
                size_t off, n = loom_ckpt_unit_floats(tab, i, layer, &off);
                s = which == LOOM_UNIT_PARAMS ? read_params(f, off, n, buf) : loom_optim_reader_read(rd, which == LOOM_UNIT_V, off, off + n, buf);
                if (s == LOOM_OK) s = put(ctx, which, i, layer, buf);
            }
        }
    }
    free(buf);
    return s;
}

loom_status loom_ckpt_stream_read(const loom_gpt_config_t *cfg, const char *dir, long long step, int blocks, loom_unit_want_fn want,
                                  loom_unit_put_fn put, void *ctx, loom_optim_shard_t *saved) {
    loom_tensor_info_t tab[LOOM_NPARAMS];
    size_t P;
    loom_gpt_param_table(cfg, tab, &P);
    files_t f = {0};
    loom_optim_reader_t *rd = NULL;
    loom_status s = LOOM_OK;
    if (blocks & (1 << LOOM_UNIT_PARAMS)) {
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        s = loom_stview_open(&f.view, path);
        if (s == LOOM_OK) {
            f.n = loom_xtensors(cfg, &f.x);
            f.at = loom_calloc((size_t)f.n + 1, sizeof *f.at);
            for (int k = 0; k < f.n; k++) f.at[k] = loom_xtensor_offset(tab, &f.x[k]);
        }
    }
    if (s == LOOM_OK && (blocks & (1 << LOOM_UNIT_M | 1 << LOOM_UNIT_V))) s = loom_optim_reader_open(&rd, dir, P, (uint64_t)step, saved);
    if (s == LOOM_OK) s = read_units(cfg, tab, blocks, &f, rd, want, put, ctx);
    loom_optim_reader_close(rd);
    if (f.view) loom_stview_close(f.view);
    free(f.x);
    free(f.at);
    return s;
}
