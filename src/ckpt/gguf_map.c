#include "gguf_map.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* 1 when the fp32 values of entry m are not read because the file's own
 * stored weight (file_q, gpt.h) serves every use of them on the inference
 * path (model/infer.c): a linear weight stored whole or by parts, the
 * head, and the embedding of a rotary model (a learned position table is
 * added to fp32 rows of the embedding). */
static int served_by_blocks(const loom_tensor_t *fq, const loom_gpt_config_t *c, const loom_gguf_map_t *m) {
    if (!fq) return 0;
    size_t nq = (size_t)c->n_layer * LOOM_QLIN_COUNT;
    if (m->qlin >= 0 && m->layer >= 0) {
        size_t s = (size_t)m->layer * LOOM_QLIN_COUNT + (size_t)m->qlin;
        return fq[s].data || fq[nq + 2 + s * LOOM_FILE_Q_PARTS].data;
    }
    if (m->param == LOOM_WTE) return fq[nq].data && c->pos == LOOM_POS_ROPE;
    return m->param == LOOM_LMHEAD && fq[nq + 1].data;
}

loom_status loom_gguf_read_params_except(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable,
                                         float *host, const loom_tensor_t *stored, size_t *floats) {
    char *arch = loom_gguf_str(g, "general.architecture");
    loom_gguf_map_t *map;
    int n = loom_gguf_map(c, arch ? arch : "gpt2", &map);
    free(arch);
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        const loom_gguf_tensor_t *t = NULL;
        if ((s = check_shape(g, &map[i], &t)) != LOOM_OK) break;
        if (served_by_blocks(stored, c, &map[i])) continue;
        if (floats) *floats += (size_t)t->numel;
        size_t w = map[i].cols ? map[i].cols : 1;
        float *dst = host + loom_gguf_param_at(&map[i], c, ptable);
        float *tmp = map[i].rope_heads > 0 ? loom_malloc(t->numel * sizeof(float)) : dst; /* rows in the file's order: in place */
        loom_gguf_values(t, tmp);
        s = loom_check_finite(tmp, (size_t)t->numel, map[i].gguf, loom_gguf_path(g)); /* NaN/Inf never reach the math */
        for (size_t r = 0; tmp != dst && s == LOOM_OK && r < map[i].rows; r++)
            memcpy(dst + r * w, tmp + loom_gguf_file_row(&map[i], r) * w, w * sizeof(float));
        if (tmp != dst) free(tmp);
    }
    free(map);
    return s;
}

loom_status loom_gguf_read_params(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable,
                                  float *host) {
    return loom_gguf_read_params_except(g, c, ptable, host, NULL, NULL);
}

/* ---- the file's own linear weights ---- */

/* Bytes of one row of t as held: the block bytes, or q8_0 as int8 plus
 * fp32 scales (cols + cols / 8). */
static size_t held_row(const loom_gguf_tensor_t *t) {
    int d = loom_qblock_of_ggml(t->type);
    return d >= 0 ? loom_qblock_row_bytes((loom_dtype)d, (long long)t->ne[0]) : (size_t)t->ne[0] + (size_t)t->ne[0] / 8;
}

/* The byte offsets of a block's fp16 scale fields (n of them) for GGUF
 * type `ggml` (qblock.h's layouts; q8_0: d then 32 int8). Every value of a
 * block is its scales times small integers, plus a scaled min: finite
 * scales make every value finite, and a NaN or infinite scale makes at
 * least one value NaN or infinite (x * 0 is NaN for x infinite). So
 * checking the scales is checking every dequantized value, without
 * unpacking them. */
static int scale_fields(uint32_t ggml, int off[2]) {
    int d = loom_qblock_of_ggml(ggml); /* -1: q8_0 */
    off[0] = d == LOOM_Q6_K ? 208 : 0, off[1] = 2;  /* q6_K: d last; the rest: d first */
    return d == LOOM_Q4_1 || d == LOOM_Q5_1 || d == LOOM_Q4_K || d == LOOM_Q5_K ? 2 : 1; /* then m or dmin */
}

/* The first of nb blocks of `bytes` at p with a NaN or infinite fp16
 * scale, or -1. */
static long long bad_scale(const unsigned char *p, size_t nb, int bytes, uint32_t ggml) {
    int off[2], n = scale_fields(ggml, off);
    for (size_t b = 0; b < nb; b++)
        for (int k = 0; k < n; k++) {
            uint16_t h;
            memcpy(&h, p + b * (size_t)bytes + off[k], 2);
            if ((h & 0x7c00) == 0x7c00) return (long long)b;
        }
    return -1;
}

/* The error for tensor t's first block with a NaN or infinite scale. */
static loom_status scale_error(const loom_gguf_t *g, const loom_gguf_tensor_t *t) {
    int d = loom_qblock_of_ggml(t->type), bytes = d >= 0 ? loom_qblock_info((loom_dtype)d)->bytes : 34;
    int block = d >= 0 ? loom_qblock_info((loom_dtype)d)->block : 32;
    long long b = bad_scale(t->data, (size_t)(t->numel / (uint64_t)block), bytes, t->type);
    return loom_error(LOOM_EFORMAT, "%s: tensor %s holds a NaN or infinite scale in block %lld (elements %lld to %lld, %s); the weights are unusable "
                      "(a corrupt file): fetch or convert the model again", loom_gguf_path(g), t->name, b, b * block, (b + 1) * block - 1,
                      loom_gguf_type_name(t->type));
}

/* File row fr of src (bb bytes a block: a block format's row of rb
 * bytes, or q8_0's cols / 32 blocks of 34) into row r of the destination:
 * the same bytes at `at`, or q8_0's scales as fp32 into sc and its int8
 * into q. 1 when a scale of the row is NaN or infinite. */
static int gather_row(const unsigned char *src, uint32_t type, int bb, size_t fr, size_t r, size_t cols, size_t rb, char *at,
                      float *sc, signed char *q) {
    if (!sc) {
        memcpy(at + r * rb, src + fr * rb, rb);
        return bad_scale((const unsigned char *)at + r * rb, rb / (size_t)bb, bb, type) >= 0;
    }
    int bad = 0;
    for (size_t b = 0; b < cols / 32; b++) {
        const unsigned char *blk = src + (fr * (cols / 32) + b) * 34;
        uint16_t h;
        memcpy(&h, blk, 2);
        bad |= (h & 0x7c00) == 0x7c00;
        sc[r * (cols / 32) + b] = loom_f16_to_f32(h);
        memcpy(q + r * cols + b * 32, blk + 2, 32);
    }
    return bad;
}

/* The parts [p0, p1) of one fused weight, in one type: its tensor *v,
 * data laid out at `at` (rows in loom's order; one thread: the copy is
 * bound by memory, and a team's wake-ups per tensor cost more on a
 * loaded machine than they gain on an idle one), every block's scales
 * checked (a NaN or infinite one is an error naming the
 * tensor and the block); *used += the bytes taken. */
static loom_status gather(const loom_gguf_t *g, const loom_gguf_map_t *map, int p0, int p1, char *at, loom_tensor_t *v, size_t *used) {
    const loom_gguf_tensor_t *t0 = loom_gguf_find(g, map[p0].gguf);
    int d = loom_qblock_of_ggml(t0->type), bb = d >= 0 ? loom_qblock_info((loom_dtype)d)->bytes : 34;
    size_t R = 0, cols = map[p0].cols, rb = held_row(t0);
    for (int k = p0; k < p1; k++) R += map[k].rows;
    float *sc = d < 0 ? (float *)at : NULL; /* q8_0: R * cols / 32 scales, then R * cols int8 */
    signed char *q = d < 0 ? (signed char *)(sc + R * cols / 32) : NULL;
    size_t r0 = 0;
    for (int k = p0; k < p1; k++) {
        const loom_gguf_tensor_t *t = loom_gguf_find(g, map[k].gguf);
        const loom_gguf_map_t *m = &map[k];
        const unsigned char *src = t->data;
        size_t frb = t->bytes / m->rows, dropped = 0;
        int bad = 0;
        for (size_t i = 0; i < m->rows; i++) {
            bad |= gather_row(src, t->type, bb, loom_gguf_file_row(m, i), r0 + i, cols, rb, at, sc, q);
            if (!m->rope_heads && (i + 1) % 4096 == 0) /* read once, in file order: the pages passed go back as it goes */
                loom_gguf_drop(src + dropped, (i + 1) * frb - dropped), dropped = (i + 1) * frb;
        }
        if (bad) return scale_error(g, t);
        loom_gguf_drop(src, t->bytes);
        r0 += m->rows;
    }
    if (d >= 0) *v = (loom_tensor_t){.data = at, .dtype = (loom_dtype)d, .rows = (long long)R, .cols = (long long)cols};
    else *v = (loom_tensor_t){.data = q, .dtype = LOOM_INT8, .rows = (long long)R, .cols = (long long)cols, .scales = sc, .block = 32};
    *used += (R * rb + 63) / 64 * 64;
    return LOOM_OK;
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

/* A q4_K, q6_K, 32-value-format or q8_0 weight (linear, head or
 * embedding) of a multiple of 8 rows to 8 rows interleaved (qblock.h): the
 * CPU's one-row products then read 8 rows' blocks at once, their results
 * in the lanes of one vector (cpu_kquant.c, cpu_int8.c). The same bytes in
 * the same place; every reader of single blocks goes through
 * loom_qblock_at, of rows through loom_qblock_row_values. */
static loom_status rows8(loom_tensor_t *t) {
    return loom_tensor_rows8_ok(t) ? loom_tensor_rows8(t) : LOOM_OK;
}

/* The embedding and the head kept as stored (file_q's two slots after the
 * layers) when their type is a block format or q8_0; the head is the
 * embedding's tensor when the file ties them. Their bytes go at
 * at + *used on; *used += the bytes taken. */
static loom_status gather_ends(const loom_gguf_t *g, const loom_gguf_map_t *map, int n, char *at, loom_tensor_t *slots, size_t *used) {
    int e = entry_of(map, n, LOOM_WTE), h = entry_of(map, n, LOOM_LMHEAD);
    for (int k = 0; k < 2; k++) {
        int i = k ? h : e;
        if (i < 0) continue;
        uint32_t type = loom_gguf_find(g, map[i].gguf)->type;
        if (loom_qblock_of_ggml(type) < 0 && type != LOOM_GT_Q8_0) continue;
        LOOM_TRY(gather(g, map, i, i + 1, at + *used, &slots[k], used));
        LOOM_TRY(rows8(&slots[k])); /* the head's product (its rows, one token's embedding: loom_qblock_row_values) */
    }
    if (h < 0) slots[1] = slots[0]; /* tied */
    return LOOM_OK;
}

static size_t ends_bytes(const loom_gguf_t *g, const loom_gguf_map_t *map, int n) {
    size_t b = 128;
    for (int i = 0; i < n; i++)
        if (map[i].param == LOOM_WTE || map[i].param == LOOM_LMHEAD) b += map[i].rows * held_row(loom_gguf_find(g, map[i].gguf));
    return b;
}

/* The end (exclusive) of the fused weight that starts at map entry i: its
 * parts are adjacent. */
static int fused_end(const loom_gguf_map_t *map, int n, int i) {
    int j = i + 1;
    while (j < n && map[j].qlin >= 0 && map[j].qlin == map[i].qlin && map[j].layer == map[i].layer) j++;
    return j;
}

/* The pages of [p, p + n) made resident and writable in one call: a
 * copy into fresh memory otherwise takes a page fault every 4 KiB, which
 * costs more than the copy. A hint: a kernel without it faults as usual. */
static void populate(void *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p, (void)n;
#endif
}

/* [p, p + n) on 2 MiB pages where the system hands them out on request
 * (transparent huge pages in "madvise" mode), asked before the pages are
 * first touched. Decode streams every weight once per token: on 4 KiB
 * pages each page is a TLB miss and a stop for the hardware prefetcher;
 * a q6_K matrix-vector product from memory ran 1.2x as fast on 2 MiB
 * pages (bench/kquant-decode.sh, KQ_BENCH_HUGE=1, one thread, CPU time).
 * A hint: without it the pages are 4 KiB as before. */
static void huge_pages(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)1 << 21, a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)p + n) & ~(huge - 1);
    if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

/* Bytes of the stored linear weights (0: none), *mixed counted. */
static size_t stored_bytes(const loom_gguf_t *g, const loom_gguf_map_t *map, int n, int *mixed) {
    size_t bytes = 0;
    int fit = 0;
    for (int i = 0, j; i < n; i = j) {
        j = fused_end(map, n, i);
        if (map[i].qlin < 0) continue;
        int whole = parts_fit(g, map, i, j, mixed), split = split_parts(g, map, i, j);
        if (!whole && !split) continue;
        fit++;
        for (int k = i; k < j; k++) bytes += map[k].rows * held_row(loom_gguf_find(g, map[k].gguf)) + 64;
    }
    return fit ? bytes + ends_bytes(g, map, n) : 0;
}

/* Every stored weight of map into file_q t, its bytes from `at`. */
static loom_status gather_all(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_gguf_map_t *map, int n, loom_tensor_t *t,
                              char *at) {
    int nq = c->n_layer * LOOM_QLIN_COUNT;
    size_t used = 0;
    for (int i = 0, j; i < n; i = j) {
        j = fused_end(map, n, i);
        int dummy = 0, slot = map[i].layer * LOOM_QLIN_COUNT + map[i].qlin;
        if (map[i].qlin < 0) continue;
        if (parts_fit(g, map, i, j, &dummy)) {
            LOOM_TRY(gather(g, map, i, j, at + used, &t[slot], &used));
            LOOM_TRY(rows8(&t[slot]));
        } else if (split_parts(g, map, i, j)) {
            for (int k = i; k < j; k++) {
                loom_tensor_t *part = &t[nq + 2 + slot * LOOM_FILE_Q_PARTS + (k - i)];
                LOOM_TRY(gather(g, map, k, k + 1, at + used, part, &used));
                LOOM_TRY(rows8(part));
            }
        }
    }
    return gather_ends(g, map, n, at, t + nq, &used);
}

loom_status loom_gguf_file_weights(const loom_gguf_t *g, const loom_gpt_config_t *c, loom_tensor_t **out, int *mixed) {
    char *arch = loom_gguf_str(g, "general.architecture");
    loom_gguf_map_t *map;
    int n = loom_gguf_map(c, arch ? arch : "gpt2", &map), nq = c->n_layer * LOOM_QLIN_COUNT;
    free(arch);
    *mixed = 0, *out = NULL;
    loom_status s = LOOM_OK;
    const loom_gguf_tensor_t *t;
    for (int i = 0; i < n && s == LOOM_OK; i++) s = check_shape(g, &map[i], &t); /* every tensor there, as the config says */
    size_t head = (size_t)(nq + 2 + nq * LOOM_FILE_Q_PARTS) * sizeof(loom_tensor_t), bytes = s == LOOM_OK ? stored_bytes(g, map, n, mixed) : 0;
    if (bytes) {
        loom_gguf_prefetch(g);
        char *mem = loom_calloc(1, head + bytes); /* fresh pages: each is written once, by the copy */
        huge_pages(mem, head + bytes);
        populate(mem, head + bytes);
        s = gather_all(g, c, map, n, (loom_tensor_t *)mem, mem + head);
        if (s == LOOM_OK) *out = (loom_tensor_t *)mem;
        else free(mem);
    }
    free(map);
    return s;
}

/* t's values (a block format, or int8 with fp32 scales per block) into
 * dst, rows split over the threads: as the file's own dequantization
 * (loom_gguf_values) computes them, bit for bit. */
static void stored_values(const loom_tensor_t *t, float *dst) {
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < t->rows; r++) loom_qblock_row_values(t, r, dst + (size_t)r * (size_t)t->cols);
}

void loom_gguf_blocks_fp32(const loom_tensor_t *fq, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable, float *host,
                           int ends_only) {
    static const int param[LOOM_QLIN_COUNT] = {LOOM_QKVW, LOOM_ATTPROJW, LOOM_FCW, LOOM_FCPROJW};
    size_t L = (size_t)c->n_layer, nq = L * LOOM_QLIN_COUNT;
    if (!fq) return;
    for (size_t s = 0; s < nq && !ends_only; s++) {
        const loom_tensor_info_t *p = &ptable[param[s % LOOM_QLIN_COUNT]];
        float *dst = host + p->offset + s / LOOM_QLIN_COUNT * (p->numel / L);
        const loom_tensor_t *part = &fq[nq + 2 + s * LOOM_FILE_Q_PARTS];
        if (fq[s].data) stored_values(&fq[s], dst);
        for (int k = 0; !fq[s].data && k < LOOM_FILE_Q_PARTS && part[k].data; dst += part[k].rows * part[k].cols, k++)
            stored_values(&part[k], dst);
    }
    if (fq[nq].data && c->pos == LOOM_POS_ROPE) stored_values(&fq[nq], host + ptable[LOOM_WTE].offset); /* as served_by_blocks */
    if (fq[nq + 1].data && c->untied_head) stored_values(&fq[nq + 1], host + ptable[LOOM_LMHEAD].offset);
}
