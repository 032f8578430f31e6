#include "tensormap.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the tensor table ---------------------------------------------------- */

static void add(loom_xtensor_t *x, const char *hf, const char *gguf, int param, int layer, int conv1d,
                size_t rows, size_t cols) {
    snprintf(x->hf, sizeof x->hf, "%s", hf);
    snprintf(x->gguf, sizeof x->gguf, "%s", gguf);
    x->param = param;
    x->layer = layer;
    x->conv1d = conv1d;
    x->row0 = 0;
    x->rows = rows;
    x->cols = cols;
    x->numel = cols ? rows * cols : rows;
}

/* The Llama family's table (tensormap.h); only the tensors the config has. */
static int llama_xtensors(const loom_gpt_config_t *c, loom_xtensor_t **out) {
    size_t C = (size_t)c->channels, KVC = (size_t)c->n_kv_heads * (C / (size_t)c->n_head), H = (size_t)c->ffn_hidden;
    /* a weight (and its bias) per module: loom tensors, first row, rows, cols */
    const struct {
        const char *hf, *gguf;
        int w, b;
        size_t row0, rows, cols;
    } mod[] = {
        {"input_layernorm", "attn_norm", LOOM_LN1W, -1, 0, C, 0},
        {"self_attn.q_proj", "attn_q", LOOM_QKVW, LOOM_QKVB, 0, C, C},
        {"self_attn.k_proj", "attn_k", LOOM_QKVW, LOOM_QKVB, C, KVC, C},
        {"self_attn.v_proj", "attn_v", LOOM_QKVW, LOOM_QKVB, C + KVC, KVC, C},
        {"self_attn.o_proj", "attn_output", LOOM_ATTPROJW, LOOM_ATTPROJB, 0, C, C},
        {"post_attention_layernorm", "ffn_norm", LOOM_LN2W, -1, 0, C, 0},
        {"mlp.gate_proj", "ffn_gate", LOOM_FCW, LOOM_FCB, 0, H, C},
        {"mlp.up_proj", "ffn_up", LOOM_FCW, LOOM_FCB, H, H, C},
        {"mlp.down_proj", "ffn_down", LOOM_FCPROJW, LOOM_FCPROJB, 0, C, H},
    };
    int nm = (int)(sizeof mod / sizeof mod[0]), n = 0;
    loom_xtensor_t *e = loom_calloc((size_t)(3 + 2 * nm * c->n_layer), sizeof *e);
    add(&e[n++], "model.embed_tokens.weight", "token_embd.weight", LOOM_WTE, -1, 0, (size_t)c->vocab_size, C);
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < nm; k++)
            for (int bias = 0; bias < 2; bias++) {
                int prm = bias ? mod[k].b : mod[k].w;
                if (prm < 0 || !loom_gpt_has_param(c, prm)) continue;
                char hf[64], gg[64];
                snprintf(hf, sizeof hf, "model.layers.%d.%s%s", l, mod[k].hf, mod[k].cols ? (bias ? ".bias" : ".weight") : ".weight");
                snprintf(gg, sizeof gg, "blk.%d.%s.%s", l, mod[k].gguf, bias ? "bias" : "weight");
                add(&e[n], hf, gg, prm, l, 0, mod[k].rows, bias ? 0 : mod[k].cols);
                e[n++].row0 = mod[k].row0;
            }
    add(&e[n++], "model.norm.weight", "output_norm.weight", LOOM_LNFW, -1, 0, C, 0);
    if (c->untied_head) add(&e[n++], "lm_head.weight", "output.weight", LOOM_LMHEAD, -1, 0, (size_t)c->vocab_size, C);
    *out = e;
    return n;
}

int loom_xtensors(const loom_gpt_config_t *c, loom_xtensor_t **out) {
    if (strcmp(loom_gpt_family(c), "gpt2") != 0) return llama_xtensors(c, out);
    /* Each block's modules, in Hugging Face file order: a weight then its
     * bias (a vector of the weight's rows). Shapes in units of C; cols 0: a
     * vector (the LayerNorms' weights). */
    static const struct {
        const char *hf, *gguf;
        int weight, bias, conv1d, rows_mult, cols_mult;
    } mod[] = {
        {"ln_1", "attn_norm", LOOM_LN1W, LOOM_LN1B, 0, 1, 0},
        {"attn.c_attn", "attn_qkv", LOOM_QKVW, LOOM_QKVB, 1, 3, 1},
        {"attn.c_proj", "attn_output", LOOM_ATTPROJW, LOOM_ATTPROJB, 1, 1, 1},
        {"ln_2", "ffn_norm", LOOM_LN2W, LOOM_LN2B, 0, 1, 0},
        {"mlp.c_fc", "ffn_up", LOOM_FCW, LOOM_FCB, 1, 4, 1},
        {"mlp.c_proj", "ffn_down", LOOM_FCPROJW, LOOM_FCPROJB, 1, 1, 4},
    };
    int nm = (int)(sizeof mod / sizeof mod[0]), n = 0;
    size_t C = (size_t)c->channels;
    loom_xtensor_t *e = loom_calloc((size_t)(4 + 2 * nm * c->n_layer), sizeof *e);
    add(&e[n++], "wte.weight", "token_embd.weight", LOOM_WTE, -1, 0, (size_t)c->vocab_size, C);
    add(&e[n++], "wpe.weight", "position_embd.weight", LOOM_WPE, -1, 0, (size_t)c->max_seq_len, C);
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < nm; k++)
            for (int bias = 0; bias < 2; bias++) {
                char hf[64], gg[64];
                snprintf(hf, sizeof hf, "h.%d.%s.%s", l, mod[k].hf, bias ? "bias" : "weight");
                snprintf(gg, sizeof gg, "blk.%d.%s.%s", l, mod[k].gguf, bias ? "bias" : "weight");
                add(&e[n++], hf, gg, bias ? mod[k].bias : mod[k].weight, l, bias ? 0 : mod[k].conv1d, mod[k].rows_mult * C,
                    bias ? 0 : mod[k].cols_mult * C);
            }
    add(&e[n++], "ln_f.weight", "output_norm.weight", LOOM_LNFW, -1, 0, C, 0);
    add(&e[n++], "ln_f.bias", "output_norm.bias", LOOM_LNFB, -1, 0, C, 0);
    *out = e;
    return n;
}

size_t loom_xtensor_offset(const loom_tensor_info_t *table, const loom_xtensor_t *x) {
    const loom_tensor_info_t *t = &table[x->param];
    size_t off = t->offset;
    if (x->layer >= 0) off += (size_t)x->layer * (t->numel / (size_t)t->shape[0]);
    return off + x->row0 * (x->cols ? x->cols : 1);
}

float *loom_xtensor_view(const loom_gpt_t *m, float *host, const loom_xtensor_t *x) { return host + loom_xtensor_offset(m->ptable, x); }

loom_status loom_xload(loom_gpt_t *m, loom_xsource_fn src, void *ctx) {
    loom_xtensor_t *x;
    int n = loom_xtensors(&m->cfg, &x);
    float *host = loom_calloc(m->num_params, sizeof(float));
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) s = src(ctx, &x[i], loom_xtensor_view(m, host, &x[i]));
    if (s == LOOM_OK) m->be->upload(m->params, host, m->num_params * sizeof(float));
    free(host);
    free(x);
    return s;
}

/* ---- encodings ----------------------------------------------------------- */

int loom_xdtype_parse(const char *s) {
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0"};
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, names[i])) return i;
    return -1;
}

const char *loom_xdtype_name(loom_xdtype t) {
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0"};
    return (unsigned)t < 4 ? names[t] : "?";
}

size_t loom_xdtype_bytes(loom_xdtype t, size_t n) {
    switch (t) {
    case LOOM_XDT_F32: return 4 * n;
    case LOOM_XDT_F16:
    case LOOM_XDT_BF16: return 2 * n;
    case LOOM_XDT_Q8_0: return n / 32 * 34;
    }
    return 0;
}

uint16_t loom_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0));
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
    if (ax < 0x38800000) {                                   /* below 2^-14: a half subnormal */
        float v;
        memcpy(&v, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(v * 16777216.0f)); /* exact scaling, round to even */
    }
    uint32_t h = (ax - 0x38000000) >> 13, rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float loom_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    x = e == 31 ? sign | 0x7f800000 | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float bf16_to_f32(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* llama.cpp's quantize_row_q8_0_ref: the scale is rounded to fp16 after
 * the values were divided by the exact one. */
static void q8_0_block(const float *x, unsigned char *out) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t dh = loom_f32_to_f16(d);
    memcpy(out, &dh, 2);
    for (int i = 0; i < 32; i++) out[2 + i] = (unsigned char)(int8_t)roundf(x[i] * id);
}

void loom_xencode(loom_xdtype t, const float *src, size_t n, void *dst) {
    uint16_t *h = dst;
    switch (t) {
    case LOOM_XDT_F32: memcpy(dst, src, n * 4); break;
    case LOOM_XDT_F16: for (size_t i = 0; i < n; i++) h[i] = loom_f32_to_f16(src[i]); break;
    case LOOM_XDT_BF16: for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]); break;
    case LOOM_XDT_Q8_0:
        for (size_t b = 0; b < n / 32; b++) q8_0_block(src + 32 * b, (unsigned char *)dst + 34 * b);
        break;
    }
}

void loom_xdecode(loom_xdtype t, const void *src, size_t n, float *dst) {
    const unsigned char *p = src;
    uint16_t h;
    switch (t) {
    case LOOM_XDT_F32: memcpy(dst, src, n * 4); break;
    case LOOM_XDT_F16:
        for (size_t i = 0; i < n; i++) memcpy(&h, p + 2 * i, 2), dst[i] = loom_f16_to_f32(h);
        break;
    case LOOM_XDT_BF16:
        for (size_t i = 0; i < n; i++) memcpy(&h, p + 2 * i, 2), dst[i] = bf16_to_f32(h);
        break;
    case LOOM_XDT_Q8_0:
        for (size_t b = 0; b < n / 32; b++) {
            memcpy(&h, p + 34 * b, 2);
            float d = loom_f16_to_f32(h);
            for (int i = 0; i < 32; i++) dst[32 * b + i] = d * (float)(int8_t)p[34 * b + 2 + i];
        }
        break;
    }
}

loom_status loom_check_finite(const float *p, size_t n, const char *name, const char *path) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return loom_error(LOOM_EFORMAT, "%s: tensor %s holds %s at element %zu; the weights are unusable (a diverged run or a corrupt file): "
                              "use an earlier checkpoint or another copy", path, name, isnan(p[i]) ? "NaN" : "infinity", i);
    return LOOM_OK;
}

/* ---- safetensors view ---------------------------------------------------- */

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


struct loom_stview {
    char *path;
    const unsigned char *map;
    size_t size;
    const unsigned char *body;
    size_t body_len;
    cJSON *hdr;
};

loom_status loom_stview_open(loom_stview_t **out, const char *path) {
    *out = NULL;
    int fd;
    size_t size;
    LOOM_TRY(loom_file_open_fd(path, &fd, &size));
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return loom_error(LOOM_EFORMAT, "%s: empty or unreadable file; not a safetensors file", path);
    uint64_t hlen = 0;
    if (size >= 8) memcpy(&hlen, map, 8);
    cJSON *hdr = size >= 8 && hlen <= size - 8 ? cJSON_ParseWithLength((const char *)map + 8, (size_t)hlen) : NULL;
    if (!hdr) {
        munmap(map, size);
        return loom_error(LOOM_EFORMAT, "%s: not a safetensors file (header of %llu bytes in a %zu-byte file is not JSON)", path,
                          (unsigned long long)hlen, size);
    }
    loom_status s = check_header(hdr, path, size - 8 - hlen);
    if (s != LOOM_OK) {
        cJSON_Delete(hdr);
        munmap(map, size);
        return s;
    }
    loom_stview_t *v = loom_calloc(1, sizeof *v);
    v->path = loom_strdup(path);
    v->map = map;
    v->size = size;
    v->body = (const unsigned char *)map + 8 + hlen;
    v->body_len = size - 8 - hlen;
    v->hdr = hdr;
    *out = v;
    return LOOM_OK;
}

void loom_stview_close(loom_stview_t *v) {
    if (!v) return;
    munmap((void *)v->map, v->size);
    cJSON_Delete(v->hdr);
    free(v->path);
    free(v);
}

loom_status loom_stview_read(const loom_stview_t *v, const char *name, int ndim, const size_t shape[2], float *out) {
    char alt[96];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v->hdr, name);
    if (!t) t = cJSON_GetObjectItemCaseSensitive(v->hdr, alt);
    if (!t) return loom_error(LOOM_EFORMAT, "%s: tensor %s is missing; a GPT-2 checkpoint has it", v->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"),
                *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const char *dts = cJSON_IsString(dt) ? dt->valuestring : "?";
    int xt = !strcmp(dts, "F32") ? LOOM_XDT_F32 : !strcmp(dts, "F16") ? LOOM_XDT_F16 : !strcmp(dts, "BF16") ? LOOM_XDT_BF16 : -1;
    if (xt < 0) return loom_error(LOOM_EFORMAT, "%s: tensor %s has dtype %s; loom reads F32, F16 and BF16", v->path, name, dts);
    int ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == ndim;
    size_t n = 1;
    for (int d = 0; ok && d < ndim; d++) {
        ok = (size_t)cJSON_GetArrayItem(sh, d)->valuedouble == shape[d];
        n *= shape[d];
    }
    if (!ok) {
        char *got = cJSON_PrintUnformatted(sh);
        loom_status s = loom_error(LOOM_EFORMAT, "%s: tensor %s has shape %s but the config says [%zu%s%.0zu]; config.json and the weights disagree",
                                   v->path, name, got ? got : "?", shape[0], ndim == 2 ? "," : "", ndim == 2 ? shape[1] : 0);
        free(got);
        return s;
    }
    double b0 = cJSON_IsArray(of) && cJSON_GetArraySize(of) == 2 ? cJSON_GetArrayItem(of, 0)->valuedouble : -1;
    double b1 = cJSON_IsArray(of) && cJSON_GetArraySize(of) == 2 ? cJSON_GetArrayItem(of, 1)->valuedouble : -1;
    if (b0 < 0 || b1 - b0 != (double)loom_xdtype_bytes((loom_xdtype)xt, n) || b1 > (double)v->body_len)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: data [%.0f, %.0f) does not fit the %zu-byte data section; the file is truncated or corrupt",
                          v->path, name, b0, b1, v->body_len);
    loom_xdecode((loom_xdtype)xt, v->body + (size_t)b0, n, out);
    return loom_check_finite(out, n, name, v->path);
}

loom_status loom_xsource_safetensors(void *ctx, const loom_xtensor_t *x, float *out) {
    const loom_stview_t *v = ctx;
    if (!x->conv1d) {
        size_t shape[2] = {x->rows, x->cols};
        return loom_stview_read(v, x->hf, x->cols ? 2 : 1, shape, out);
    }
    size_t shape[2] = {x->cols, x->rows}; /* Conv1D: (in, out) */
    float *tmp = loom_malloc(x->numel * sizeof(float));
    loom_status s = loom_stview_read(v, x->hf, 2, shape, tmp);
    for (size_t o = 0; s == LOOM_OK && o < x->rows; o++)
        for (size_t i = 0; i < x->cols; i++) out[o * x->cols + i] = tmp[i * x->rows + o];
    free(tmp);
    return s;
}
