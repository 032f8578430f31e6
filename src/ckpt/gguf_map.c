#include "gguf_map.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qblock.h"
#include "ckpt/tensormap.h"
#include "model/quant.h"

/* ---- the config ---- */

/* Integer metadata `arch`.`key`, required positive (and <= 2^24). */
static loom_status meta_int(const loom_gguf_t *g, const char *arch, const char *key, int required, int *out) {
    char k[128];
    long long v = 0;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (!loom_gguf_int(g, k, &v)) {
        if (!required) return LOOM_OK;
        return loom_error(LOOM_EFORMAT, "%s: metadata %s is missing; a %s GGUF has it (convert the model again)", loom_gguf_path(g), k, arch);
    }
    if (v <= 0 || v > (1 << 24)) return loom_error(LOOM_EFORMAT, "%s: metadata %s is %lld, not a positive integer", loom_gguf_path(g), k, v);
    *out = (int)v;
    return LOOM_OK;
}

static loom_status gpt2_config(const loom_gguf_t *g, loom_gpt_config_t *c) {
    int ff = 0;
    LOOM_TRY(meta_int(g, "gpt2", "block_count", 1, &c->n_layer));
    LOOM_TRY(meta_int(g, "gpt2", "context_length", 1, &c->max_seq_len));
    LOOM_TRY(meta_int(g, "gpt2", "embedding_length", 1, &c->channels));
    LOOM_TRY(meta_int(g, "gpt2", "attention.head_count", 1, &c->n_head));
    LOOM_TRY(meta_int(g, "gpt2", "feed_forward_length", 0, &ff));
    if (ff && ff != 4 * c->channels)
        return loom_error(LOOM_EUNAVAIL, "%s: feed_forward_length %d is not 4 x embedding_length (%d); loom's GPT-2 has that MLP only",
                          loom_gguf_path(g), ff, 4 * c->channels);
    return LOOM_OK;
}

void loom_gguf_rope_divisors(const loom_gpt_config_t *c, float *out) {
    int half = loom_gpt_head_size(c) / 2;
    float *plain = loom_malloc((size_t)half * sizeof(float));
    loom_gpt_config_t u = *c;
    u.rope_scaling.kind = LOOM_ROPE_SCALING_NONE;
    loom_gpt_rope_freqs(&u, plain);
    loom_gpt_rope_freqs(c, out);
    for (int i = 0; i < half; i++) out[i] = plain[i] / out[i];
    free(plain);
}

/* Llama 3's low and high frequency factors from the divisors between 1
 * and the factor, whose smoothing s = 1/f's share is linear in
 * 1/wavelength: s = orig / ((high - low) wl) - low / (high - low). Only
 * the ratios to the original context are in the file (llama.cpp uses no
 * more), so that context is taken as Llama 3's 8192. Two such divisors
 * are needed; with fewer, Llama 3's own 1 and 4 stand. */
static void fit_llama3(const float *f, int half, double base, loom_gpt_config_t *c) {
    double fac = c->rope_scaling.factor, s[2] = {0}, iw[2] = {0};
    int k = 0;
    for (int i = 0; i < half; i++) {
        if (!(f[i] > 1 + 1e-4 && f[i] < fac * (1 - 1e-4))) continue;
        int at = k ? 1 : 0; /* the first and the last such divisor */
        s[at] = (1 / f[i] - 1 / fac) / (1 - 1 / fac), iw[at] = 1 / (2 * M_PI * pow(base, 2.0 * i / (2 * half)));
        k++;
    }
    if (k < 2 || iw[0] == iw[1]) return;
    double a = (s[0] - s[1]) / (iw[0] - iw[1]), b = s[0] - a * iw[0], orig = 8192;
    if (!(a > 0) || !(b < 0)) return;
    c->rope_scaling.low_freq_factor = (float)(-b * orig / a), c->rope_scaling.high_freq_factor = (float)((1 - b) * orig / a);
}

/* Llama 3's rope_freqs.weight (the converter's per-frequency divisors)
 * as loom's llama3 scaling: factor the largest divisor, the frequency
 * factors fitted (fit_llama3), then checked by recomputing every divisor. */
static loom_status rope_freqs(const loom_gguf_t *g, loom_gpt_config_t *c) {
    const loom_gguf_tensor_t *t = loom_gguf_find(g, "rope_freqs.weight");
    if (!t) return LOOM_OK;
    int half = c->channels / c->n_head / 2;
    if (t->numel != (uint64_t)half || t->type != LOOM_GT_F32)
        return loom_error(LOOM_EFORMAT, "%s: tensor rope_freqs.weight has %llu values (%s); the heads need %d f32", loom_gguf_path(g),
                          (unsigned long long)t->numel, loom_gguf_type_name(t->type), half);
    float *f = loom_malloc((size_t)half * 2 * sizeof(float)), *want = f + half, mx = 0;
    memcpy(f, t->data, (size_t)half * sizeof(float));
    for (int i = 0; i < half; i++) mx = fmaxf(mx, f[i]);
    loom_gpt_config_t k = *c;
    k.rope_scaling.kind = LOOM_ROPE_SCALING_LLAMA3, k.rope_scaling.factor = mx;
    k.rope_scaling.low_freq_factor = 1, k.rope_scaling.high_freq_factor = 4, k.rope_scaling.original_max_pos = 8192;
    if (!k.rope_theta) k.rope_theta = 10000.0f;
    fit_llama3(f, half, k.rope_theta, &k);
    loom_gguf_rope_divisors(&k, want);
    loom_status s = LOOM_OK;
    for (int i = 0; i < half && s == LOOM_OK; i++)
        if (!(fabsf(want[i] - f[i]) <= 1e-4f * want[i]))
            s = loom_error(LOOM_EUNAVAIL, "%s: rope_freqs.weight[%d] is %g, not Llama 3's scaling (%g for factor %g); loom knows that scaling only",
                           loom_gguf_path(g), i, f[i], want[i], mx);
    if (s == LOOM_OK && mx > 1) c->rope_scaling = k.rope_scaling; /* all 1: no scaling */
    free(f);
    return s;
}

/* llama.* / qwen2.*: RMSNorm, RoPE, SwiGLU, no biases (qwen2: q, k, v). */
static loom_status llama_config(const loom_gguf_t *g, const char *arch, loom_gpt_config_t *c) {
    const char *path = loom_gguf_path(g);
    int rope_dim = 0;
    LOOM_TRY(meta_int(g, arch, "block_count", 1, &c->n_layer));
    LOOM_TRY(meta_int(g, arch, "context_length", 1, &c->max_seq_len));
    LOOM_TRY(meta_int(g, arch, "embedding_length", 1, &c->channels));
    LOOM_TRY(meta_int(g, arch, "attention.head_count", 1, &c->n_head));
    LOOM_TRY(meta_int(g, arch, "attention.head_count_kv", 0, &c->n_kv_heads));
    LOOM_TRY(meta_int(g, arch, "feed_forward_length", 1, &c->ffn_hidden));
    LOOM_TRY(meta_int(g, arch, "rope.dimension_count", 0, &rope_dim));
    if (rope_dim && rope_dim * c->n_head != c->channels)
        return loom_error(LOOM_EUNAVAIL, "%s: %s.rope.dimension_count %d is not the head size %d; loom rotates whole heads only", path, arch,
                          rope_dim, c->channels / c->n_head);
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    c->norm_eps = loom_gguf_float(g, key, &v) ? (float)v : 1e-5f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    c->rope_theta = loom_gguf_float(g, key, &v) ? (float)v : 10000.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char *scaling = loom_gguf_str(g, key);
    int linear = scaling && !strcmp(scaling, "linear"), none = !scaling || !strcmp(scaling, "none");
    free(scaling);
    if (!linear && !none)
        return loom_error(LOOM_EUNAVAIL, "%s: %s is not linear; loom's RoPE scales linearly or as Llama 3", path, key);
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    if (linear && loom_gguf_float(g, key, &v)) c->rope_scaling.kind = LOOM_ROPE_SCALING_LINEAR, c->rope_scaling.factor = (float)v;
    c->norm = LOOM_NORM_RMSNORM, c->pos = LOOM_POS_ROPE, c->mlp = LOOM_MLP_SWIGLU;
    c->bias = loom_gguf_find(g, "blk.0.attn_q.bias") ? LOOM_BIAS_QKV : LOOM_BIAS_NONE;
    c->untied_head = loom_gguf_find(g, "output.weight") != NULL;
    return rope_freqs(g, c);
}

loom_status loom_gguf_config(const loom_gguf_t *g, loom_gpt_config_t *c) {
    char *arch = loom_gguf_str(g, "general.architecture");
    memset(c, 0, sizeof *c);
    loom_status s;
    if (arch && !strcmp(arch, "gpt2")) s = gpt2_config(g, c);
    else if (arch && (!strcmp(arch, "llama") || !strcmp(arch, "qwen2"))) s = llama_config(g, arch, c);
    else
        s = loom_error(LOOM_EUNAVAIL, "%s: architecture %s is not supported; loom reads gpt2, llama and qwen2 models", loom_gguf_path(g),
                       arch ? arch : "(general.architecture missing)");
    free(arch);
    if (s != LOOM_OK) return s;
    const loom_gguf_tensor_t *e = loom_gguf_find(g, "token_embd.weight");
    if (!e || e->ndim != 2 || e->ne[1] > (1 << 24) || e->ne[0] != (uint64_t)c->channels)
        return loom_error(LOOM_EFORMAT, "%s: tensor token_embd.weight is missing or not a (vocabulary, %d) matrix", loom_gguf_path(g), c->channels);
    c->vocab_size = (int)e->ne[1];
    return loom_gpt_config_finish(c);
}

/* ---- the tensor map ---- */

static int qlin_of(int param) {
    return param == LOOM_QKVW ? LOOM_QLIN_QKV : param == LOOM_ATTPROJW ? LOOM_QLIN_ATTPROJ
         : param == LOOM_FCW ? LOOM_QLIN_FC : param == LOOM_FCPROJW ? LOOM_QLIN_FCPROJ : -1;
}

static void put(loom_gguf_map_t *e, int *n, int layer, const char *what, int param, size_t row0, size_t rows, size_t cols, int rope) {
    loom_gguf_map_t *x = &e[(*n)++];
    if (layer >= 0) snprintf(x->gguf, sizeof x->gguf, "blk.%d.%s", layer, what);
    else snprintf(x->gguf, sizeof x->gguf, "%s", what);
    x->param = param, x->layer = layer, x->row0 = row0, x->rows = rows, x->cols = cols, x->rope_heads = rope;
    x->qlin = cols ? qlin_of(param) : -1;
}

static int llama_map(const loom_gpt_config_t *c, int permute, loom_gguf_map_t *e) {
    size_t C = (size_t)c->channels, hs = C / (size_t)c->n_head, q = hs * (size_t)c->n_head, kv = hs * (size_t)c->n_kv_heads;
    size_t H = (size_t)c->ffn_hidden, V = (size_t)c->vocab_size;
    int n = 0, qh = permute ? c->n_head : 0, kh = permute ? c->n_kv_heads : 0;
    put(e, &n, -1, "token_embd.weight", LOOM_WTE, 0, V, C, 0);
    if (c->untied_head) put(e, &n, -1, "output.weight", LOOM_LMHEAD, 0, V, C, 0);
    put(e, &n, -1, "output_norm.weight", LOOM_LNFW, 0, C, 0, 0);
    for (int l = 0; l < c->n_layer; l++) {
        put(e, &n, l, "attn_norm.weight", LOOM_LN1W, 0, C, 0, 0);
        put(e, &n, l, "attn_q.weight", LOOM_QKVW, 0, q, C, qh);
        put(e, &n, l, "attn_k.weight", LOOM_QKVW, q, kv, C, kh);
        put(e, &n, l, "attn_v.weight", LOOM_QKVW, q + kv, kv, C, 0);
        if (c->bias == LOOM_BIAS_QKV) {
            put(e, &n, l, "attn_q.bias", LOOM_QKVB, 0, q, 0, qh);
            put(e, &n, l, "attn_k.bias", LOOM_QKVB, q, kv, 0, kh);
            put(e, &n, l, "attn_v.bias", LOOM_QKVB, q + kv, kv, 0, 0);
        }
        put(e, &n, l, "attn_output.weight", LOOM_ATTPROJW, 0, C, C, 0);
        put(e, &n, l, "ffn_norm.weight", LOOM_LN2W, 0, C, 0, 0);
        put(e, &n, l, "ffn_gate.weight", LOOM_FCW, 0, H, C, 0);
        put(e, &n, l, "ffn_up.weight", LOOM_FCW, H, H, C, 0);
        put(e, &n, l, "ffn_down.weight", LOOM_FCPROJW, 0, C, H, 0);
    }
    return n;
}

int loom_gguf_map(const loom_gpt_config_t *c, const char *arch, loom_gguf_map_t **out) {
    loom_gguf_map_t *e = loom_calloc((size_t)(3 + 16 * c->n_layer) + 64, sizeof *e);
    int n = 0;
    if (!strcmp(arch, "gpt2")) {
        loom_xtensor_t *x;
        int nx = loom_xtensors(c, &x);
        for (int i = 0; i < nx; i++) {
            loom_gguf_map_t *m = &e[n++];
            snprintf(m->gguf, sizeof m->gguf, "%s", x[i].gguf);
            m->param = x[i].param, m->layer = x[i].layer, m->rows = x[i].rows, m->cols = x[i].cols;
            m->qlin = x[i].cols ? qlin_of(x[i].param) : -1;
        }
        free(x);
    } else {
        n = llama_map(c, !strcmp(arch, "llama"), e);
    }
    *out = e;
    return n;
}

/* ---- reading ---- */

size_t loom_gguf_file_row(const loom_gguf_map_t *m, size_t r) {
    if (m->rope_heads <= 0) return r;
    size_t hs = m->rows / (size_t)m->rope_heads, h = r / hs, k = r % hs;
    return h * hs + 2 * (k % (hs / 2)) + k / (hs / 2);
}

size_t loom_gguf_param_at(const loom_gguf_map_t *m, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable) {
    const loom_tensor_info_t *p = &ptable[m->param];
    size_t per = m->layer >= 0 ? p->numel / (size_t)c->n_layer : 0, w = m->cols ? m->cols : 1;
    return p->offset + (m->layer >= 0 ? (size_t)m->layer * per : 0) + m->row0 * w;
}

static loom_status check_shape(const loom_gguf_t *g, const loom_gguf_map_t *m, const loom_gguf_tensor_t **out) {
    const loom_gguf_tensor_t *t = loom_gguf_find(g, m->gguf);
    if (!t) return loom_error(LOOM_EFORMAT, "%s: tensor %s is missing; the metadata's model has it", loom_gguf_path(g), m->gguf);
    uint64_t want0 = m->cols ? m->cols : m->rows, want1 = m->cols ? m->rows : 1, got1 = t->ndim >= 2 ? t->ne[1] : 1;
    if (t->ndim > 2 || t->ne[0] != want0 || got1 != want1)
        return loom_error(LOOM_EFORMAT, "%s: tensor %s has shape [%llu, %llu], the metadata implies [%llu, %llu]", loom_gguf_path(g), m->gguf,
                          (unsigned long long)t->ne[0], (unsigned long long)got1, (unsigned long long)want0, (unsigned long long)want1);
    if (m->rope_heads > 0 && (m->rows % (size_t)m->rope_heads || (m->rows / (size_t)m->rope_heads) % 2))
        return loom_error(LOOM_EFORMAT, "%s: tensor %s: %zu rows are not %d heads of an even size", loom_gguf_path(g), m->gguf, m->rows,
                          m->rope_heads);
    *out = t;
    return LOOM_OK;
}

loom_status loom_gguf_read_params(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable,
                                  float *host) {
    char *arch = loom_gguf_str(g, "general.architecture");
    loom_gguf_map_t *map;
    int n = loom_gguf_map(c, arch ? arch : "gpt2", &map);
    free(arch);
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        const loom_gguf_tensor_t *t = NULL;
        if ((s = check_shape(g, &map[i], &t)) != LOOM_OK) break;
        size_t w = map[i].cols ? map[i].cols : 1;
        float *tmp = loom_malloc(t->numel * sizeof(float)), *dst = host + loom_gguf_param_at(&map[i], c, ptable);
        loom_gguf_values(t, tmp);
        s = loom_check_finite(tmp, (size_t)t->numel, map[i].gguf, loom_gguf_path(g)); /* NaN/Inf never reach the math */
        for (size_t r = 0; s == LOOM_OK && r < map[i].rows; r++) memcpy(dst + r * w, tmp + loom_gguf_file_row(&map[i], r) * w, w * sizeof(float));
        free(tmp);
    }
    free(map);
    return s;
}

/* ---- the file's own linear weights ---- */

/* Bytes of one row of t as held: the block bytes, or q8_0 as int8 plus
 * fp32 scales (cols + cols / 8). */
static size_t held_row(const loom_gguf_tensor_t *t) {
    int d = loom_qblock_of_ggml(t->type);
    return d >= 0 ? loom_qblock_row_bytes((loom_dtype)d, (long long)t->ne[0]) : (size_t)t->ne[0] + (size_t)t->ne[0] / 8;
}

/* The parts [p0, p1) of one fused weight, in one type: its tensor, data
 * laid out at `at` (rows in loom's order). Returns the bytes used. */
static size_t gather(const loom_gguf_t *g, const loom_gguf_map_t *map, int p0, int p1, char *at, loom_tensor_t *v) {
    const loom_gguf_tensor_t *t0 = loom_gguf_find(g, map[p0].gguf);
    int d = loom_qblock_of_ggml(t0->type);
    size_t R = 0, cols = map[p0].cols, rb = held_row(t0);
    for (int k = p0; k < p1; k++) R += map[k].rows;
    float *sc = d < 0 ? (float *)at : NULL; /* q8_0: R * cols / 32 scales, then R * cols int8 */
    signed char *q = d < 0 ? (signed char *)(sc + R * cols / 32) : NULL;
    size_t r = 0;
    for (int k = p0; k < p1; k++) {
        const unsigned char *src = loom_gguf_find(g, map[k].gguf)->data;
        for (size_t i = 0; i < map[k].rows; i++, r++) {
            size_t fr = loom_gguf_file_row(&map[k], i);
            if (d >= 0) {
                memcpy(at + r * rb, src + fr * rb, rb);
                continue;
            }
            for (size_t b = 0; b < cols / 32; b++) {
                const unsigned char *blk = src + (fr * (cols / 32) + b) * 34;
                uint16_t h;
                memcpy(&h, blk, 2);
                sc[r * (cols / 32) + b] = loom_f16_to_f32(h);
                memcpy(q + r * cols + b * 32, blk + 2, 32);
            }
        }
    }
    if (d >= 0) *v = (loom_tensor_t){.data = at, .dtype = (loom_dtype)d, .rows = (long long)R, .cols = (long long)cols};
    else *v = (loom_tensor_t){.data = q, .dtype = LOOM_INT8, .rows = (long long)R, .cols = (long long)cols, .scales = sc, .block = 32};
    return (R * rb + 63) / 64 * 64;
}

/* 1 when every entry of [p0, p1) is in a block format or q8_0. */
static int all_stored(const loom_gguf_t *g, const loom_gguf_map_t *map, int p0, int p1) {
    int ok = 1;
    for (int k = p0; k < p1; k++) {
        uint32_t t = loom_gguf_find(g, map[k].gguf)->type;
        ok &= loom_qblock_of_ggml(t) >= 0 || t == LOOM_GT_Q8_0;
    }
    return ok;
}

/* Entries [p0, p1) of map: one fused weight. 1 when every part has one
 * type, a block format or q8_0. *mixed counts those whose parts differ and
 * that stay fp32 (parts all stored in blocks run part by part instead:
 * split_parts). */
static int parts_fit(const loom_gguf_t *g, const loom_gguf_map_t *map, int p0, int p1, int *mixed) {
    uint32_t type = loom_gguf_find(g, map[p0].gguf)->type;
    int same = 1;
    for (int k = p0; k < p1; k++) same &= loom_gguf_find(g, map[k].gguf)->type == type;
    if (!same && !all_stored(g, map, p0, p1)) ++*mixed;
    return same && (loom_qblock_of_ggml(type) >= 0 || type == LOOM_GT_Q8_0);
}

/* A fused weight whose parts differ in type but are each stored in
 * blocks: each part as its own tensor in file_q's part slots. */
static int split_parts(const loom_gguf_t *g, const loom_gguf_map_t *map, int p0, int p1) {
    if (p1 - p0 > LOOM_FILE_Q_PARTS || !all_stored(g, map, p0, p1)) return 0;
    uint32_t type = loom_gguf_find(g, map[p0].gguf)->type;
    int same = 1;
    for (int k = p0; k < p1; k++) same &= loom_gguf_find(g, map[k].gguf)->type == type;
    return !same;
}

/* Map entry `param` (LOOM_WTE, LOOM_LMHEAD), or -1. */
static int entry_of(const loom_gguf_map_t *map, int n, int param) {
    for (int i = 0; i < n; i++)
        if (map[i].param == param) return i;
    return -1;
}

/* The embedding and the head kept as stored (file_q's two slots after the
 * layers) when their type is a block format or q8_0; the head is the
 * embedding's tensor when the file ties them. Returns the bytes used. */
static size_t gather_ends(const loom_gguf_t *g, const loom_gguf_map_t *map, int n, char *at, loom_tensor_t *slots) {
    int e = entry_of(map, n, LOOM_WTE), h = entry_of(map, n, LOOM_LMHEAD);
    size_t used = 0;
    for (int k = 0; k < 2; k++) {
        int i = k ? h : e;
        if (i < 0) continue;
        uint32_t type = loom_gguf_find(g, map[i].gguf)->type;
        if (loom_qblock_of_ggml(type) < 0 && type != LOOM_GT_Q8_0) continue;
        used += gather(g, map, i, i + 1, at + used, &slots[k]);
    }
    if (h < 0) slots[1] = slots[0]; /* tied */
    return used;
}

static size_t ends_bytes(const loom_gguf_t *g, const loom_gguf_map_t *map, int n) {
    size_t b = 128;
    for (int i = 0; i < n; i++)
        if (map[i].param == LOOM_WTE || map[i].param == LOOM_LMHEAD) b += map[i].rows * held_row(loom_gguf_find(g, map[i].gguf));
    return b;
}

loom_tensor_t *loom_gguf_file_weights(const loom_gguf_t *g, const loom_gpt_config_t *c, int *mixed) {
    char *arch = loom_gguf_str(g, "general.architecture");
    loom_gguf_map_t *map;
    int n = loom_gguf_map(c, arch ? arch : "gpt2", &map), nq = c->n_layer * LOOM_QLIN_COUNT, fit = 0;
    free(arch);
    *mixed = 0;
    size_t head = (size_t)(nq + 2 + nq * LOOM_FILE_Q_PARTS) * sizeof(loom_tensor_t), bytes = 0;
    for (int i = 0, j; i < n; i = j) { /* a fused weight's parts are adjacent */
        for (j = i + 1; j < n && map[j].qlin >= 0 && map[j].qlin == map[i].qlin && map[j].layer == map[i].layer;) j++;
        if (map[i].qlin < 0) continue;
        int whole = parts_fit(g, map, i, j, mixed), split = split_parts(g, map, i, j);
        if (!whole && !split) continue;
        fit++;
        for (int k = i; k < j; k++) bytes += map[k].rows * held_row(loom_gguf_find(g, map[k].gguf)) + 64;
    }
    if (fit) bytes += ends_bytes(g, map, n);
    char *mem = fit ? loom_calloc(1, head + bytes) : NULL, *at = mem ? mem + head : NULL;
    loom_tensor_t *t = (loom_tensor_t *)mem;
    for (int i = 0, j; i < n && mem; i = j) {
        for (j = i + 1; j < n && map[j].qlin >= 0 && map[j].qlin == map[i].qlin && map[j].layer == map[i].layer;) j++;
        int dummy = 0, slot = map[i].layer * LOOM_QLIN_COUNT + map[i].qlin;
        if (map[i].qlin < 0) continue;
        if (parts_fit(g, map, i, j, &dummy)) at += gather(g, map, i, j, at, &t[slot]);
        else if (split_parts(g, map, i, j))
            for (int k = i; k < j; k++) at += gather(g, map, k, k + 1, at, &t[nq + 2 + slot * LOOM_FILE_Q_PARTS + (k - i)]);
    }
    if (mem) gather_ends(g, map, n, at, t + nq);
    free(map);
    return t;
}
