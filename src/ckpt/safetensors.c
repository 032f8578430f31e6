#define _GNU_SOURCE
#include "safetensors.h"

#include "tensormap.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One exported tensor: tensormap.h's entry (which loom parameter, layer
 * and rows), its Hugging Face shape and its place in the file. Matrices
 * marked `conv1d` are stored (in, out): loom's (rows=out, cols=in)
 * transposed. */
typedef struct {
    loom_xtensor_t x;
    const char *name; /* x.hf */
    int conv1d;
    int ndim;
    size_t shape[2];
    size_t numel;
    size_t offset; /* in bytes within the data section */
} st_entry_t;

/* The file's tensors: tensormap.h's table (GPT-2 or the Llama family) in
 * its order, laid out back to back. */
static int build_entries(const loom_gpt_config_t *c, st_entry_t **out) {
    loom_xtensor_t *x;
    int n = loom_xtensors(c, &x);
    st_entry_t *e = loom_calloc((size_t)n, sizeof *e);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        e[i].x = x[i];
        e[i].name = e[i].x.hf;
        e[i].conv1d = x[i].conv1d;
        e[i].ndim = x[i].cols ? 2 : 1;
        e[i].shape[0] = x[i].conv1d ? x[i].cols : x[i].rows;
        e[i].shape[1] = x[i].conv1d ? x[i].rows : x[i].cols;
        e[i].numel = x[i].numel;
        e[i].offset = off;
        off += e[i].numel * sizeof(float);
    }
    free(x);
    *out = e;
    return n;
}


/* Copy between HF layout (dst/src `hf`) and loom layout for one entry. */
static void convert(const st_entry_t *x, float *hf, float *lm, int to_hf) {
    if (!x->conv1d) {
        if (to_hf) memcpy(hf, lm, x->numel * sizeof(float));
        else memcpy(lm, hf, x->numel * sizeof(float));
        return;
    }
    size_t in = x->shape[0], outd = x->shape[1]; /* HF (in, out); loom (out, in) */
    for (size_t o = 0; o < outd; o++)
        for (size_t i = 0; i < in; i++) {
            if (to_hf) hf[i * outd + o] = lm[o * in + i];
            else lm[o * in + i] = hf[i * outd + o];
        }
}

loom_status loom_safetensors_save_gpt(const loom_gpt_t *m, const char *path) {
    float *host = loom_malloc(m->num_params * sizeof(float));
    m->be->download(host, m->params, m->num_params * sizeof(float));
    loom_status s = loom_safetensors_save_gpt_host(m, host, path);
    free(host);
    return s;
}

/* The header: every entry's dtype, shape and place in the data section. */
static char *header_json(const st_entry_t *e, int n) {
    cJSON *hdr = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(hdr, e[i].name);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)e[i].offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(e[i].offset + e[i].numel * 4)));
    }
    char *json = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    return json;
}

struct loom_st_writer {
    char path[4096], tmp[4200];
    FILE *f;
    st_entry_t *e;
    size_t *at;       /* each entry's first float in the parameter block */
    int n, ok, err;
    size_t data0;     /* the data section's first byte in the file */
    float *buf;
    size_t bufn;
};

loom_status loom_safetensors_stream_open(loom_st_writer_t **out, const loom_gpt_config_t *cfg, const char *path) {
    loom_st_writer_t *w = loom_calloc(1, sizeof *w);
    w->n = build_entries(cfg, &w->e);
    loom_tensor_info_t tab[LOOM_NPARAMS];
    size_t P;
    loom_gpt_param_table(cfg, tab, &P);
    w->at = loom_calloc((size_t)w->n + 1, sizeof *w->at);
    for (int i = 0; i < w->n; i++) w->at[i] = loom_xtensor_offset(tab, &w->e[i].x);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    char *json = header_json(w->e, w->n);
    size_t jlen = strlen(json), padded = (jlen + 7) / 8 * 8;
    w->data0 = 8 + padded;
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        loom_status s = loom_error(LOOM_EWRITE, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(json);
        loom_safetensors_stream_close(w, 0);
        return s;
    }
    uint64_t hlen = padded;
    w->ok = fwrite(&hlen, 8, 1, w->f) == 1 && fwrite(json, 1, jlen, w->f) == jlen;
    for (size_t k = jlen; w->ok && k < padded; k++) w->ok = fputc(' ', w->f) != EOF;
    if (!w->ok) w->err = errno;
    free(json);
    *out = w;
    return LOOM_OK;
}

loom_status loom_safetensors_stream_put(loom_st_writer_t *w, size_t a, size_t b, const float *x) {
    for (int i = 0; i < w->n && w->ok; i++) {
        const st_entry_t *e = &w->e[i];
        if (w->at[i] < a || w->at[i] + e->numel > b) continue; /* not (wholly) in this range */
        if (e->numel > w->bufn) {
            free(w->buf);
            w->bufn = e->numel;
            w->buf = loom_malloc(w->bufn * sizeof(float));
        }
        convert(e, w->buf, (float *)x + (w->at[i] - a), 1);
        w->ok = fseeko(w->f, (off_t)(w->data0 + e->offset), SEEK_SET) == 0 && fwrite(w->buf, sizeof(float), e->numel, w->f) == e->numel;
        if (!w->ok) w->err = errno;
    }
    return w->ok ? LOOM_OK : loom_error(LOOM_EWRITE, "%s: write failed: %s (disk full?); the previous %s is untouched", w->tmp, strerror(w->err), w->path);
}

loom_status loom_safetensors_stream_close(loom_st_writer_t *w, int commit) {
    loom_status s = LOOM_OK;
    if (w->f) {
        int ok = w->ok && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
        int err = ok ? 0 : w->err ? w->err : errno;
        if (fclose(w->f) != 0) ok = 0;
        if (commit && !ok) s = loom_error(LOOM_EWRITE, "%s: write failed: %s (disk full?); the previous %s is untouched", w->tmp, strerror(err), w->path);
        if (s == LOOM_OK && commit && rename(w->tmp, w->path) != 0)
            s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", w->path, strerror(errno));
        if (s != LOOM_OK || !commit) unlink(w->tmp);
    }
    free(w->buf);
    free(w->at);
    free(w->e);
    free(w);
    return s;
}

loom_status loom_safetensors_save_gpt_host(const loom_gpt_t *m, const float *host, const char *path) {
    loom_st_writer_t *w;
    LOOM_TRY(loom_safetensors_stream_open(&w, &m->cfg, path));
    loom_status s = loom_safetensors_stream_put(w, 0, m->num_params, host);
    loom_status c = loom_safetensors_stream_close(w, s == LOOM_OK);
    return s != LOOM_OK ? s : c;
}

loom_status loom_safetensors_load_gpt(loom_gpt_t *m, const char *path) {
    /* the one checked reader (tensormap.c's view): header, offsets, dtype,
     * shape and finiteness, as for Hugging Face folders and export */
    loom_stview_t *v;
    LOOM_TRY(loom_stview_open(&v, path));
    loom_status s = loom_xload(m, loom_xsource_safetensors, v);
    loom_stview_close(v);
    return s;
}
