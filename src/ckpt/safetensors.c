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
        s = loom_error(LOOM_EIO, "%s: cannot create: %s", tmp, strerror(errno));
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
        s = loom_error(LOOM_EIO, "%s: write failed: %s (disk full?); the previous %s is untouched", tmp, strerror(err), path);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        s = loom_error(LOOM_EIO, "%s: rename failed: %s", path, strerror(errno));
    }
done:
    free(json);
    free(e);
    return s;
}

/* Bytes per element of a safetensors dtype name; 0 for an unknown one. */
static size_t dtype_bytes(const char *d) {
    static const struct { const char *name; size_t bytes; } t[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"F16", 2}, {"BF16", 2},
        {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(d, t[i].name)) return t[i].bytes;
    return 0;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static int whole(const cJSON *v, double *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= 0 && x <= 9007199254740992.0) || x != (double)(long long)x) return 0;
    *out = x;
    return 1;
}

typedef struct { double lo, hi; const char *name; } span_t;

static int span_cmp(const void *a, const void *b) {
    double x = ((const span_t *)a)->lo, y = ((const span_t *)b)->lo;
    return x < y ? -1 : x > y;
}

/* One header entry: dtype known, shape whole numbers, exactly two data
 * offsets inside the data section whose span fits dtype x shape. */
static loom_status check_entry(const cJSON *t, const char *path, size_t body_len, span_t *sp) {
    const char *nm = t->string;
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsObject(t) || !cJSON_IsString(dt) || !dtype_bytes(dt->valuestring))
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: no known \"dtype\"", path, nm);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > 8)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: \"shape\" is not a list of at most 8 sizes", path, nm);
    double numel = 1, d, b0, b1;
    cJSON *x;
    cJSON_ArrayForEach(x, shape) {
        if (!whole(x, &d)) return loom_error(LOOM_EFORMAT, "%s: tensor %s: a \"shape\" entry is not a whole number", path, nm);
        numel *= d;
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !whole(cJSON_GetArrayItem(offs, 0), &b0) ||
        !whole(cJSON_GetArrayItem(offs, 1), &b1))
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: \"data_offsets\" must be two whole numbers [begin, end]", path, nm);
    if (b0 > b1 || b1 > (double)body_len)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: data offsets [%.0f, %.0f] lie outside the %zu-byte data section; the file is truncated or corrupt",
                          path, nm, b0, b1, body_len);
    if (b1 - b0 != numel * (double)dtype_bytes(dt->valuestring))
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: %.0f bytes of data for %.0f elements of %s", path, nm, b1 - b0, numel, dt->valuestring);
    *sp = (span_t){b0, b1, nm};
    return LOOM_OK;
}

/* Every entry of a parsed header, then that no two tensors overlap. */
static loom_status check_header(const cJSON *hdr, const char *path, size_t body_len) {
    if (!cJSON_IsObject(hdr)) return loom_error(LOOM_EFORMAT, "%s: safetensors header is not a JSON object", path);
    int n = cJSON_GetArraySize(hdr), k = 0;
    span_t *sp = loom_calloc((size_t)n + 1, sizeof *sp);
    loom_status s = LOOM_OK;
    const cJSON *t;
    cJSON_ArrayForEach(t, hdr) {
        if (!strcmp(t->string, "__metadata__")) {
            const cJSON *v;
            if (!cJSON_IsObject(t)) s = loom_error(LOOM_EFORMAT, "%s: __metadata__ is not an object", path);
            else cJSON_ArrayForEach(v, t) if (!cJSON_IsString(v)) s = loom_error(LOOM_EFORMAT, "%s: __metadata__.%s is not a string", path, v->string);
        } else {
            s = check_entry(t, path, body_len, &sp[k++]);
        }
        if (s != LOOM_OK) break;
    }
    if (s == LOOM_OK) {
        qsort(sp, (size_t)k, sizeof *sp, span_cmp);
        for (int i = 1; i < k && s == LOOM_OK; i++)
            if (sp[i].lo < sp[i - 1].hi)
                s = loom_error(LOOM_EFORMAT, "%s: tensors %s and %s overlap in the data section; the file is corrupt", path, sp[i - 1].name, sp[i].name);
    }
    free(sp);
    return s;
}

/* Entry `x` of a checked header against the model: dtype and shape. */
static loom_status match_entry(const cJSON *t, const st_entry_t *x, const char *path) {
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    if (strcmp(dt->valuestring, "F32") != 0)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s has dtype %s; loom reads F32", path, x->name, dt->valuestring);
    int ok = cJSON_GetArraySize(shape) == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = (size_t)cJSON_GetArrayItem(shape, d)->valuedouble == x->shape[d];
    if (ok) return LOOM_OK;
    char *got = cJSON_PrintUnformatted(shape);
    loom_status s = loom_error(LOOM_EFORMAT, "%s: tensor %s has shape %s, the model expects [%zu%s%.0zu]; the checkpoint's config does not match",
                               path, x->name, got ? got : "?", x->shape[0], x->ndim == 2 ? "," : "", x->ndim == 2 ? x->shape[1] : 0);
    free(got);
    return s;
}

loom_status loom_safetensors_load_gpt(loom_gpt_t *m, const char *path) {
    char *data;
    size_t size;
    LOOM_TRY(loom_file_read(path, &data, &size));
    uint64_t hlen = 0;
    if (size >= 8) memcpy(&hlen, data, 8);
    if (size < 8 || hlen < 2 || hlen > size - 8) {
        free(data);
        return loom_error(LOOM_EFORMAT, "%s: not a safetensors file (header length %llu, file %zu bytes)", path, (unsigned long long)hlen, size);
    }
    cJSON *hdr = cJSON_ParseWithLength(data + 8, (size_t)hlen);
    const char *body = data + 8 + hlen;
    size_t body_len = size - 8 - hlen;
    loom_status s = hdr ? check_header(hdr, path, body_len) : loom_error(LOOM_EFORMAT, "%s: safetensors header is not valid JSON", path);
    st_entry_t *e;
    int n = build_entries(&m->cfg, &e);
    float *host = loom_calloc(m->num_params, sizeof(float));
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        char alt[80];
        snprintf(alt, sizeof alt, "transformer.%s", e[i].name);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(hdr, e[i].name);
        if (!t) t = cJSON_GetObjectItemCaseSensitive(hdr, alt);
        if (!t) {
            s = loom_error(LOOM_EFORMAT, "%s: tensor %s is missing; is this a checkpoint of a model with the same config?", path, e[i].name);
            break;
        }
        if ((s = match_entry(t, &e[i], path)) != LOOM_OK) break;
        size_t b0 = (size_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(t, "data_offsets"), 0)->valuedouble;
        float *buf = loom_malloc(e[i].numel * sizeof(float));
        memcpy(buf, body + b0, e[i].numel * sizeof(float));
        s = loom_check_finite(buf, e[i].numel, e[i].name, path);
        convert(&e[i], buf, loom_view(m, host, &e[i]), 0);
        free(buf);
    }
    if (s == LOOM_OK) m->be->upload(m->params, host, m->num_params * sizeof(float));
    free(host);
    free(e);
    cJSON_Delete(hdr);
    free(data);
    return s;
}
