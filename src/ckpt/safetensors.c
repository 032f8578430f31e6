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

/* Where entry `x` lives in loom's host parameter block. */
static float *loom_view(const loom_gpt_t *m, float *host, const st_entry_t *x) { return loom_xtensor_view(m, host, &x->x); }

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

loom_status loom_safetensors_save_gpt_host(const loom_gpt_t *m, const float *host, const char *path) {
    st_entry_t *e;
    int n = build_entries(&m->cfg, &e);
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
    size_t jlen = strlen(json), padded = (jlen + 7) / 8 * 8;

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    loom_status s = LOOM_OK;
    if (!f) {
        s = loom_error(LOOM_EWRITE, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    uint64_t hlen = padded;
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(json, 1, jlen, f) == jlen;
    for (size_t k = jlen; ok && k < padded; k++) ok = fputc(' ', f) != EOF;
    float *buf = NULL;
    size_t bufn = 0;
    for (int i = 0; ok && i < n; i++) {
        if (e[i].numel > bufn) {
            free(buf);
            bufn = e[i].numel;
            buf = loom_malloc(bufn * sizeof(float));
        }
        convert(&e[i], buf, loom_view(m, (float *)host, &e[i]), 1);
        ok = fwrite(buf, sizeof(float), e[i].numel, f) == e[i].numel;
    }
    free(buf);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        unlink(tmp);
        s = loom_error(LOOM_EWRITE, "%s: write failed: %s (disk full?); the previous %s is untouched", tmp, strerror(err), path);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", path, strerror(errno));
    }
done:
    free(json);
    free(e);
    return s;
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
