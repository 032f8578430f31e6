#include "gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/mem.h"

/* The Llama family's block: RMSNorm, RoPE, SwiGLU (biases are each preset's). */
#define LLAMA .norm = LOOM_NORM_RMSNORM, .pos = LOOM_POS_ROPE, .mlp = LOOM_MLP_SWIGLU
#define LLAMA3_SCALING(f) .rope_scaling = {LOOM_ROPE_SCALING_LLAMA3, f, 1.0f, 4.0f, 8192}

/* Real models' shapes come from their published config.json files
 * (docs/llama.md cites each); vocab_size is the model's own. */
static const struct {
    const char *name;
    loom_gpt_config_t c;
} presets[] = {
    {"gpt2-tiny", {.n_layer = 4, .channels = 256, .n_head = 4, .max_seq_len = 256}},
    {"gpt2-small", {.n_layer = 12, .channels = 768, .n_head = 12, .max_seq_len = 1024}},
    {"gpt2-medium", {.n_layer = 24, .channels = 1024, .n_head = 16, .max_seq_len = 1024}},
    {"gpt2-large", {.n_layer = 36, .channels = 1280, .n_head = 20, .max_seq_len = 1024}},
    {"gpt2-xl", {.n_layer = 48, .channels = 1600, .n_head = 25, .max_seq_len = 1024}},
    {"llama-tiny", {.n_layer = 4, .channels = 256, .n_head = 4, .n_kv_heads = 2, .ffn_hidden = 688,
                    .max_seq_len = 256, LLAMA, .bias = LOOM_BIAS_NONE, .norm_eps = 1e-5f, .rope_theta = 10000.0f}},
    {"smollm2-135m", {.n_layer = 30, .channels = 576, .n_head = 9, .n_kv_heads = 3, .ffn_hidden = 1536,
                      .max_seq_len = 8192, .vocab_size = 49152, LLAMA, .bias = LOOM_BIAS_NONE, .norm_eps = 1e-5f, .rope_theta = 100000.0f}},
    {"llama-3.2-1b", {.n_layer = 16, .channels = 2048, .n_head = 32, .n_kv_heads = 8, .ffn_hidden = 8192,
                      .max_seq_len = 131072, .vocab_size = 128256, LLAMA, .bias = LOOM_BIAS_NONE, .norm_eps = 1e-5f,
                      .rope_theta = 500000.0f, LLAMA3_SCALING(32.0f)}},
    {"llama-3.1-8b", {.n_layer = 32, .channels = 4096, .n_head = 32, .n_kv_heads = 8, .ffn_hidden = 14336,
                      .max_seq_len = 131072, .vocab_size = 128256, LLAMA, .bias = LOOM_BIAS_NONE, .norm_eps = 1e-5f,
                      .rope_theta = 500000.0f, LLAMA3_SCALING(8.0f), .untied_head = 1}},
    {"qwen2.5-0.5b", {.n_layer = 24, .channels = 896, .n_head = 14, .n_kv_heads = 2, .ffn_hidden = 4864,
                      .max_seq_len = 32768, .vocab_size = 151936, LLAMA, .bias = LOOM_BIAS_QKV,
                      .norm_eps = 1e-6f, .rope_theta = 1000000.0f}},
    {"mistral-7b", {.n_layer = 32, .channels = 4096, .n_head = 32, .n_kv_heads = 8, .ffn_hidden = 14336,
                    .max_seq_len = 32768, .vocab_size = 32768, LLAMA, .bias = LOOM_BIAS_NONE, .norm_eps = 1e-5f,
                    .rope_theta = 1000000.0f, .untied_head = 1}},
};

const char *const loom_gpt_preset_names[] = {"gpt2-tiny",    "gpt2-small",   "gpt2-medium",  "gpt2-large",
                                             "gpt2-xl",      "llama-tiny",   "smollm2-135m", "llama-3.2-1b",
                                             "llama-3.1-8b", "qwen2.5-0.5b", "mistral-7b",   NULL};

loom_status loom_gpt_preset(loom_gpt_config_t *cfg, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        *cfg = presets[i].c;
        return LOOM_OK;
    }
    return loom_error(LOOM_EINVAL, "--model %s: unknown model; choose gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, "
                      "llama-tiny, smollm2-135m, llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b or mistral-7b", name);
}

int loom_gpt_head_size(const loom_gpt_config_t *c) { return c->head_dim ? c->head_dim : c->channels / c->n_head; }
int loom_gpt_attn_width(const loom_gpt_config_t *c) { return c->n_head * loom_gpt_head_size(c); }
/* Both read 0 (an unfinished config) as its default, so a caller that
 * fills only the six shape fields gets GPT-2's table. */
int loom_gpt_qkv_rows(const loom_gpt_config_t *c) {
    int kv = c->n_kv_heads ? c->n_kv_heads : c->n_head;
    return c->n_head ? (c->n_head + 2 * kv) * loom_gpt_head_size(c) : c->channels;
}
int loom_gpt_fc_rows(const loom_gpt_config_t *c) {
    int H = c->ffn_hidden ? c->ffn_hidden : 4 * c->channels;
    return c->mlp == LOOM_MLP_SWIGLU ? 2 * H : H;
}
const char *loom_gpt_family(const loom_gpt_config_t *c) {
    return c->norm == LOOM_NORM_LAYERNORM && c->pos == LOOM_POS_LEARNED && c->mlp == LOOM_MLP_GELU ? "gpt2" : "llama";
}

/* The block-variant fields: defaults for 0, then the combinations loom computes. */
static loom_status finish_variant(loom_gpt_config_t *cfg) {
    if (cfg->n_kv_heads == 0) cfg->n_kv_heads = cfg->n_head;
    if (cfg->n_kv_heads < 1 || cfg->n_head % cfg->n_kv_heads != 0)
        return loom_error(LOOM_EINVAL, "model: %d key/value heads do not divide %d query heads; n_kv_heads must divide n_heads",
                          cfg->n_kv_heads, cfg->n_head);
    if (cfg->ffn_hidden == 0) cfg->ffn_hidden = 4 * cfg->channels;
    if (cfg->ffn_hidden < 1 || cfg->ffn_hidden > LOOM_GPT_MAX_FFN)
        return loom_error(LOOM_EINVAL, "model: MLP hidden size %d; expected 1 to %d", cfg->ffn_hidden, LOOM_GPT_MAX_FFN);
    if (cfg->norm_eps == 0) cfg->norm_eps = 1e-5f;
    if (!(cfg->norm_eps > 0 && cfg->norm_eps < 1))
        return loom_error(LOOM_EINVAL, "model: norm epsilon %g; expected above 0 and below 1", (double)cfg->norm_eps);
    if (cfg->norm == LOOM_NORM_LAYERNORM && cfg->norm_eps != 1e-5f)
        return loom_error(LOOM_EUNAVAIL, "model: LayerNorm epsilon %g; loom's LayerNorm uses 1e-5 (RMSNorm takes any)", (double)cfg->norm_eps);
    if (cfg->pos == LOOM_POS_ROPE && cfg->rope_theta == 0) cfg->rope_theta = 10000.0f;
    if (cfg->pos == LOOM_POS_ROPE && (!(cfg->rope_theta > 1) || loom_gpt_head_size(cfg) % 2))
        return loom_error(LOOM_EINVAL, "model: rotary embedding with theta %g and head size %d; theta must be above 1 and the head size even",
                          (double)cfg->rope_theta, loom_gpt_head_size(cfg));
    if (cfg->rope_scaling.kind != LOOM_ROPE_SCALING_NONE && !(cfg->rope_scaling.factor >= 1))
        return loom_error(LOOM_EINVAL, "model: rope_scaling factor %g; expected 1 or more", (double)cfg->rope_scaling.factor);
    if (cfg->rope_scaling.kind == LOOM_ROPE_SCALING_LLAMA3 &&
        (cfg->rope_scaling.original_max_pos < 1 || !(cfg->rope_scaling.high_freq_factor > cfg->rope_scaling.low_freq_factor)))
        return loom_error(LOOM_EINVAL, "model: llama3 rope_scaling needs original_max_position_embeddings >= 1 and high_freq_factor (%g) above low_freq_factor (%g)",
                          (double)cfg->rope_scaling.high_freq_factor, (double)cfg->rope_scaling.low_freq_factor);
    return LOOM_OK;
}

loom_status loom_gpt_config_finish(loom_gpt_config_t *cfg) {
    if (cfg->n_layer < 1 || cfg->n_layer > LOOM_GPT_MAX_LAYERS)
        return loom_error(LOOM_EINVAL, "model: %d layers; expected 1 to %d", cfg->n_layer, LOOM_GPT_MAX_LAYERS);
    if (cfg->n_head < 1 || cfg->n_head > LOOM_GPT_MAX_HEADS)
        return loom_error(LOOM_EINVAL, "model: %d heads; expected 1 to %d", cfg->n_head, LOOM_GPT_MAX_HEADS);
    if (cfg->channels < 1 || cfg->channels > LOOM_GPT_MAX_CHANNELS)
        return loom_error(LOOM_EINVAL, "model: %d channels; expected 1 to %d", cfg->channels, LOOM_GPT_MAX_CHANNELS);
    if (cfg->head_dim < 0 || cfg->head_dim > LOOM_GPT_MAX_CHANNELS)
        return loom_error(LOOM_EINVAL, "model: head size %d; expected 0 (channels / heads) to %d", cfg->head_dim, LOOM_GPT_MAX_CHANNELS);
    if (!cfg->head_dim && cfg->channels % cfg->n_head != 0)
        return loom_error(LOOM_EINVAL, "model: %d channels do not split into %d heads; channels must be a multiple of heads", cfg->channels, cfg->n_head);
    if (cfg->max_seq_len < 1 || cfg->max_seq_len > LOOM_GPT_MAX_CONTEXT)
        return loom_error(LOOM_EINVAL, "model: sequence length %d; expected 1 to %d", cfg->max_seq_len, LOOM_GPT_MAX_CONTEXT);
    if (cfg->vocab_size < 2 || cfg->vocab_size > LOOM_GPT_MAX_VOCAB)
        return loom_error(LOOM_EINVAL, "model: vocabulary size %d; expected 2 to 2^30", cfg->vocab_size);
    LOOM_TRY(finish_variant(cfg));
    cfg->padded_vocab_size = (cfg->vocab_size + 63) / 64 * 64;
    return LOOM_OK;
}

int loom_gpt_has_param(const loom_gpt_config_t *c, int i) {
    switch (i) {
    case LOOM_WTE: return !c->stage_no_embed || (!c->stage_no_head && !c->untied_head);
    case LOOM_WPE: return c->pos == LOOM_POS_LEARNED && !c->stage_no_embed;
    case LOOM_LMHEAD: return c->untied_head && !c->stage_no_head;
    case LOOM_LN1B: case LOOM_LN2B: case LOOM_LNFB: return c->norm == LOOM_NORM_LAYERNORM;
    case LOOM_QKVB: return c->bias != LOOM_BIAS_NONE;
    case LOOM_ATTPROJB: case LOOM_FCB: case LOOM_FCPROJB: return c->bias == LOOM_BIAS_ALL;
    default: return i >= 0 && i < LOOM_NPARAMS;
    }
}

void loom_gpt_param_table(const loom_gpt_config_t *cfg, loom_tensor_info_t t[LOOM_NPARAMS],
                          size_t *total) {
    int L = cfg->n_layer, C = cfg->channels, Vp = cfg->padded_vocab_size, maxT = cfg->max_seq_len;
    int QR = loom_gpt_qkv_rows(cfg), FR = loom_gpt_fc_rows(cfg), H = cfg->ffn_hidden ? cfg->ffn_hidden : 4 * C;
    const struct {
        const char *name;
        int ndim, s0, s1, s2;
    } spec[LOOM_NPARAMS] = {
        [LOOM_WTE] = {"wte", 2, Vp, C, 0},
        [LOOM_WPE] = {"wpe", 2, maxT, C, 0},
        [LOOM_QKVW] = {"qkvw", 3, L, QR, C},
        [LOOM_ATTPROJW] = {"attprojw", 3, L, C, loom_gpt_attn_width(cfg)},
        [LOOM_FCW] = {"fcw", 3, L, FR, C},
        [LOOM_FCPROJW] = {"fcprojw", 3, L, C, H},
        [LOOM_LMHEAD] = {"lm_head", 2, Vp, C, 0},
        [LOOM_LN1W] = {"ln1w", 2, L, C, 0},
        [LOOM_LN1B] = {"ln1b", 2, L, C, 0},
        [LOOM_QKVB] = {"qkvb", 2, L, QR, 0},
        [LOOM_ATTPROJB] = {"attprojb", 2, L, C, 0},
        [LOOM_LN2W] = {"ln2w", 2, L, C, 0},
        [LOOM_LN2B] = {"ln2b", 2, L, C, 0},
        [LOOM_FCB] = {"fcb", 2, L, FR, 0},
        [LOOM_FCPROJB] = {"fcprojb", 2, L, C, 0},
        [LOOM_LNFW] = {"lnfw", 1, C, 0, 0},
        [LOOM_LNFB] = {"lnfb", 1, C, 0, 0},
    };
    size_t off = 0;
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        int has = loom_gpt_has_param(cfg, i);
        t[i].name = spec[i].name;
        t[i].ndim = has ? spec[i].ndim : 0;
        t[i].shape[0] = has ? spec[i].s0 : 0;
        t[i].shape[1] = has ? spec[i].s1 : 0;
        t[i].shape[2] = has ? spec[i].s2 : 0;
        t[i].numel = has;
        for (int d = 0; d < t[i].ndim; d++) t[i].numel *= (size_t)t[i].shape[d];
        /* Keep every tensor 64-byte aligned for vector loads. */
        off = (off + 15) / 16 * 16;
        t[i].offset = off;
        off += t[i].numel;
    }
    *total = (off + 15) / 16 * 16;
}

size_t loom_gpt_num_params(const loom_gpt_config_t *cfg) {
    /* from the table, which reads an unfinished config's zeros as their
     * defaults (no loom_gpt_config_finish here: its error would replace the
     * message a caller is about to report) */
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t total, n = 0;
    loom_gpt_param_table(cfg, t, &total);
    for (int i = 0; i < LOOM_NPARAMS; i++) /* the vocabulary's padding rows are not parameters */
        n += i == LOOM_WTE || i == LOOM_LMHEAD ? (loom_gpt_has_param(cfg, i) ? (size_t)cfg->vocab_size * cfg->channels : 0)
                                               : t[i].numel;
    return n;
}

double loom_gpt_flops_per_token(const loom_gpt_config_t *cfg, int T) {
    /* 6 flops per parameter per token (forward 2, backward 4), the position
     * embedding excluded as a lookup, plus attention's QK^T and AV: 6*L*C*T
     * for a full T x T score matrix per token (PaLM's convention; with
     * grouped-query attention the query side is still C wide). */
    double wpe = cfg->pos == LOOM_POS_LEARNED ? (double)cfg->max_seq_len * cfg->channels : 0.0;
    double n = (double)loom_gpt_num_params(cfg) - wpe;
    return 6.0 * n + 6.0 * cfg->n_layer * cfg->channels * (double)T;
}

/* The parameter block. On the CPU: zero pages that the system hands out
 * on first touch (the block's whole pages given back with MADV_DONTNEED,
 * the partial ones at its ends zeroed), so that a block mostly left
 * unwritten (a quantized GGUF's weights, which run on the file's own
 * blocks: ckpt/gguf.h) costs resident memory only where written; the
 * backend's alloc would zero, and so touch, every page. freed by be->free
 * (the CPU's is free()). */
static float *param_block(const loom_backend_t *be, size_t bytes) {
    void *p = NULL;
    if ((be->caps & LOOM_CAP_DEVICE_MEMORY) || strcmp(be->name, "cpu") || bytes < ((size_t)1 << 20)) return be->alloc(bytes);
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b <= a || madvise((void *)a, b - a, MADV_DONTNEED) != 0) {
        memset(p, 0, bytes);
        return p;
    }
    memset(p, 0, a - (uintptr_t)p);
    memset((void *)b, 0, (uintptr_t)p + bytes - b);
    return p;
}

static loom_status create(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be) {
    loom_gpt_config_t c = *cfg;
    LOOM_TRY(loom_gpt_config_finish(&c));
    loom_gpt_t *m = loom_calloc(1, sizeof *m);
    m->cfg = c;
    m->be = be;
    loom_gpt_param_table(&m->cfg, m->ptable, &m->num_params);
    m->params = param_block(be, m->num_params * sizeof(float));
    if (!m->params) {
        double mb = m->num_params * 4.0 / 1e6;
        free(m);
        return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of parameters on %s", mb, be->name);
    }
    loom_mem_count(LOOM_MEM_PARAMS, (long long)(m->num_params * sizeof(float)));
    for (int i = 0; i < LOOM_NPARAMS; i++) m->param[i] = m->params + m->ptable[i].offset;
    if (c.pos == LOOM_POS_ROPE) {
        int half = loom_gpt_head_size(&c) / 2;
        float freq[512];
        if (half > 512) {
            loom_gpt_free(m);
            return loom_error(LOOM_EUNAVAIL, "model: head size %d; rotary embedding takes head sizes up to 1024", 2 * half);
        }
        loom_gpt_rope_freqs(&c, freq);
        m->rope_freq = be->alloc((size_t)half * sizeof(float));
        be->upload(m->rope_freq, freq, (size_t)half * sizeof(float));
    }
    *out = m;
    return LOOM_OK;
}

void loom_gpt_rope_freqs(const loom_gpt_config_t *c, float *out) {
    int hs = loom_gpt_head_size(c);
    const double pi = 3.14159265358979323846;
    for (int j = 0; j < hs / 2; j++) {
        /* float32 as Hugging Face computes it: 1 / theta ** (2j / hs) */
        float f = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)hs);
        if (c->rope_scaling.kind == LOOM_ROPE_SCALING_LINEAR) {
            f /= c->rope_scaling.factor;
        } else if (c->rope_scaling.kind == LOOM_ROPE_SCALING_LLAMA3) {
            double fac = c->rope_scaling.factor, lo = c->rope_scaling.low_freq_factor, hi = c->rope_scaling.high_freq_factor;
            double old = c->rope_scaling.original_max_pos, wavelen = 2 * pi / f;
            if (wavelen > old / lo) { /* low frequency: scaled */
                f = (float)(f / fac);
            } else if (wavelen >= old / hi) { /* between: interpolated */
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (float)((1 - smooth) * f / fac + smooth * f);
            }
        }
        out[j] = f;
    }
}

loom_status loom_gpt_create(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be) {
    return create(out, cfg, be);
}

loom_status loom_gpt_init(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be,
                          unsigned long long seed) {
    loom_gpt_t *m = NULL;
    LOOM_TRY(create(&m, cfg, be));
    float *host = loom_calloc(m->num_params, sizeof(float));
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    float resid_std = 0.02f / sqrtf(2.0f * m->cfg.n_layer);
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *t = &m->ptable[i];
        float *p = host + t->offset;
        if (!t->numel) continue; /* not in this variant */
        switch (i) {
        case LOOM_WTE: case LOOM_LMHEAD: /* padded rows stay zero */
            loom_rng_fill_normal(&rng, p, (size_t)m->cfg.vocab_size * m->cfg.channels, 0.02f);
            break;
        case LOOM_WPE: case LOOM_QKVW: case LOOM_FCW:
            loom_rng_fill_normal(&rng, p, t->numel, 0.02f);
            break;
        case LOOM_ATTPROJW: case LOOM_FCPROJW:
            loom_rng_fill_normal(&rng, p, t->numel, resid_std);
            break;
        case LOOM_LN1W: case LOOM_LN2W: case LOOM_LNFW:
            for (size_t k = 0; k < t->numel; k++) p[k] = 1.0f;
            break;
        default: /* biases */
            break;
        }
    }
    be->upload(m->params, host, m->num_params * sizeof(float));
    free(host);
    *out = m;
    return LOOM_OK;
}

loom_status loom_gpt_alloc_grads(loom_gpt_t *m) {
    if (m->grads) return LOOM_OK;
    size_t bytes = m->num_params * sizeof(float);
    m->grads = m->be->alloc(bytes);
    if (!m->grads)
        return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of gradients on %s", bytes / 1e6, m->be->name);
    loom_mem_count(LOOM_MEM_GRADS, (long long)bytes);
    for (int i = 0; i < LOOM_NPARAMS; i++) m->grad[i] = m->grads + m->ptable[i].offset;
    return LOOM_OK;
}

loom_status loom_gpt_alloc_train(loom_gpt_t *m) {
    if (m->grads) return LOOM_OK;
    LOOM_TRY(loom_gpt_alloc_grads(m));
    size_t bytes = m->num_params * sizeof(float);
    m->m = m->be->alloc(bytes);
    m->v = m->be->alloc(bytes);
    if (!m->m || !m->v)
        return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of optimizer state on %s", 2 * bytes / 1e6, m->be->name);
    loom_mem_count(LOOM_MEM_OPTIM, 2 * (long long)bytes);
    return LOOM_OK;
}

void loom_gpt_free_moments(loom_gpt_t *m) {
    if (!m->m) return;
    m->be->free(m->m);
    m->be->free(m->v);
    m->m = m->v = NULL;
    loom_mem_count(LOOM_MEM_OPTIM, -2 * (long long)(m->num_params * sizeof(float)));
}

void loom_gpt_free_grads(loom_gpt_t *m) {
    if (!m->grads) return;
    m->be->free(m->grads);
    m->grads = NULL;
    for (int i = 0; i < LOOM_NPARAMS; i++) m->grad[i] = NULL;
    loom_mem_count(LOOM_MEM_GRADS, -(long long)(m->num_params * sizeof(float)));
}

/* Activation layout for (B, T): one allocation split by this table. Layer
 * tensors (A_LN1 .. A_RESIDUAL3) hold L slices back to back, one per layer,
 * or a single slice all layers share when the recompute mode does not keep
 * them; the backward scratch buffers are shared by every layer. */
enum {
    A_ENCODED,   /* (B,T,C) */
    A_LN1,       /* (L,B,T,C) */
    A_LN1_MEAN,  /* (L,B,T) */
    A_LN1_RSTD,  /* (L,B,T) */
    A_QKV,       /* (L,B,T,QR): q, k, v rows (rotated q and k under RoPE) */
    A_ATTY,      /* (L,B,T,C) */
    A_ATT_LSE,   /* (L,B,NH,T) */
    A_ATTPROJ,   /* (L,B,T,C) */
    A_RESIDUAL2, /* (L,B,T,C) */
    A_LN2,       /* (L,B,T,C) */
    A_LN2_MEAN,  /* (L,B,T) */
    A_LN2_RSTD,  /* (L,B,T) */
    A_FCH,       /* (L,B,T,FR): fc output (SwiGLU: gate then up) */
    A_FCH_GELU,  /* (L,B,T,H): the MLP's activation, gelu(fch) or silu(gate)*up */
    A_FCPROJ,    /* (L,B,T,C) */
    A_RESIDUAL3, /* (L,B,T,C) */
    A_LNF,       /* (B,T,C) */
    A_LNF_MEAN,  /* (B,T) */
    A_LNF_RSTD,  /* (B,T) */
    A_LOGITS,    /* (B,T,Vp); the gradient overwrites it in place */
    A_LOSSES,    /* (B,T) */
    G_RESIDUAL,  /* (B,T,C) gradient along the residual stream */
    G_BTC,       /* (B,T,C) scratch: d ln1, d atty, d ln2, d lnf */
    G_QKV,       /* (B,T,QR) */
    G_FCH,       /* (B,T,FR) */
    G_ACT,       /* (B,T,H) d silu(gate)*up (SwiGLU; empty for GELU, whose backward works in place) */
    A_COUNT
};

/* sz: floats of one slice (one layer's, for layer tensors); nl: slices kept. */
static void act_sizes(const loom_gpt_config_t *c, loom_recompute rc, int B, int T, size_t sz[A_COUNT],
                      size_t nl[A_COUNT]) {
    size_t BT = (size_t)B * T, C = c->channels, NH = c->n_head, AW = (size_t)loom_gpt_attn_width(c);
    size_t QR = (size_t)loom_gpt_qkv_rows(c), FR = (size_t)loom_gpt_fc_rows(c);
    size_t H = (size_t)(c->ffn_hidden ? c->ffn_hidden : 4 * c->channels);
    sz[A_ENCODED] = BT * C;
    sz[A_LN1] = BT * C;
    sz[A_LN1_MEAN] = sz[A_LN1_RSTD] = BT;
    sz[A_QKV] = BT * QR;
    sz[A_ATTY] = BT * AW;
    sz[A_ATT_LSE] = NH * BT;
    sz[A_ATTPROJ] = sz[A_RESIDUAL2] = sz[A_LN2] = BT * C;
    sz[A_LN2_MEAN] = sz[A_LN2_RSTD] = BT;
    sz[A_FCH] = BT * FR;
    sz[A_FCH_GELU] = BT * H;
    sz[A_FCPROJ] = sz[A_RESIDUAL3] = BT * C;
    sz[A_LNF] = BT * C;
    sz[A_LNF_MEAN] = sz[A_LNF_RSTD] = BT;
    sz[A_LOGITS] = c->stage_no_head ? 0 : BT * c->padded_vocab_size;
    sz[A_LOSSES] = BT;
    sz[G_RESIDUAL] = sz[G_BTC] = BT * C;
    sz[G_QKV] = BT * QR;
    sz[G_FCH] = BT * FR;
    sz[G_ACT] = c->mlp == LOOM_MLP_SWIGLU ? BT * H : 0;
    for (int i = 0; i < A_COUNT; i++) {
        int keep = rc == LOOM_RECOMPUTE_NONE || (rc == LOOM_RECOMPUTE_GELU && i != A_FCH_GELU) || i == A_RESIDUAL3;
        nl[i] = i >= A_LN1 && i <= A_RESIDUAL3 && keep ? (size_t)c->n_layer : 1;
    }
}

/* The statistics and the losses are fp32 on every backend (tagged F32 in
 * ops.h); every other tensor of the block is an ACT tensor, stored at the
 * backend's act_dtype (bf16 on CUDA at --dtype bf16). */
static int act_is_f32(int i) {
    return i == A_LN1_MEAN || i == A_LN1_RSTD || i == A_ATT_LSE || i == A_LN2_MEAN || i == A_LN2_RSTD ||
           i == A_LNF_MEAN || i == A_LNF_RSTD || i == A_LOSSES;
}
static size_t act_elem(loom_dtype act, int i) { return act_is_f32(i) ? sizeof(float) : loom_dtype_size(act); }
/* Bytes of tensor i in the block: 64-byte aligned (16 floats, as before
 * typed activations, so the fp32 layout is unchanged). */
static size_t act_padded_bytes(size_t elems, size_t esz) { return (elems * esz + 63) / 64 * 64; }

/* Views into the activation block for the current (B, T). */
typedef struct {
    float *a[A_COUNT];      /* ACT tensors point at act_dtype elements */
    size_t stride[A_COUNT]; /* bytes between layers' slices; 0 = shared */
} acts_t;

static void act_views(const loom_gpt_t *m, int B, int T, acts_t *v) {
    size_t sz[A_COUNT], nl[A_COUNT], off = 0;
    act_sizes(&m->cfg, m->recompute, B, T, sz, nl);
    for (int i = 0; i < A_COUNT; i++) {
        size_t esz = act_elem(m->be->act_dtype, i);
        v->a[i] = (float *)((char *)m->acts + off);
        v->stride[i] = nl[i] > 1 ? sz[i] * esz : 0;
        off += act_padded_bytes(sz[i] * nl[i], esz);
    }
}

/* Layer l's slice of activation tensor i. */
static float *lay(const acts_t *v, int i, int l) { return (float *)((char *)v->a[i] + (size_t)l * v->stride[i]); }

static const char *const recompute_names[] = {"none", "gelu", "all"};

int loom_recompute_parse(const char *s) {
    for (int i = 0; i < 3; i++)
        if (strcmp(s, recompute_names[i]) == 0) return i;
    return -1;
}

const char *loom_recompute_name(loom_recompute r) { return (unsigned)r < 3 ? recompute_names[r] : "?"; }

static const char *const act_names[A_COUNT] = {
    "encoded", "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "att_lse", "attproj", "residual2", "ln2",
    "ln2_mean", "ln2_rstd", "fch", "fch_gelu", "fcproj", "residual3", "lnf", "lnf_mean", "lnf_rstd",
    "logits", "losses", "d_residual", "d_btc", "d_qkv", "d_fch", "d_act"};

size_t loom_gpt_act_table(const loom_gpt_config_t *cfg, loom_recompute rc, int B, int T,
                          loom_act_info_t out[LOOM_ACT_MAX], int *n) {
    size_t sz[A_COUNT], nl[A_COUNT], total = 0;
    act_sizes(cfg, rc, B, T, sz, nl);
    for (int i = 0; i < A_COUNT; i++) {
        size_t padded = (sz[i] * nl[i] + 15) / 16 * 16;
        if (out) out[i] = (loom_act_info_t){act_names[i], sz[i], nl[i], padded, i >= A_LN1 && i <= A_RESIDUAL3, act_is_f32(i)};
        total += padded;
    }
    if (n) *n = A_COUNT;
    return total;
}

/* Bytes of the activation block for (B, T) with ACT tensors of type `act`. */
static size_t act_block_bytes(const loom_gpt_config_t *cfg, loom_recompute rc, loom_dtype act, int B, int T) {
    size_t sz[A_COUNT], nl[A_COUNT], total = 0;
    act_sizes(cfg, rc, B, T, sz, nl);
    for (int i = 0; i < A_COUNT; i++) total += act_padded_bytes(sz[i] * nl[i], act_elem(act, i));
    return total;
}

static void free_acts(loom_gpt_t *m) {
    if (!m->acts) return;
    loom_mem_count(LOOM_MEM_ACTS, -(long long)m->act_bytes);
    loom_mem_count(LOOM_MEM_BATCH, -3 * (long long)((size_t)m->act_B * m->act_T * sizeof(int)));
    m->be->free(m->acts);
    m->be->free(m->tokens);
    m->be->free(m->targets);
    if (m->pos) m->be->free(m->pos);
    m->pos = NULL;
    free(m->loss_host);
    m->acts = NULL;
    m->tokens = m->targets = NULL;
    m->loss_host = NULL;
    m->act_B = m->act_T = 0;
    m->num_acts = m->act_bytes = 0;
}

void loom_gpt_set_recompute(loom_gpt_t *m, loom_recompute r) {
    if (m->recompute == r) return;
    free_acts(m);
    m->recompute = r;
}

loom_status loom_gpt_alloc_acts(loom_gpt_t *m, int B, int T) {
    if (B < 1 || T < 1 || T > m->cfg.max_seq_len)
        return loom_error(LOOM_EINVAL, "batch %d x sequence %d: the sequence must be 1 to %d for this model", B, T, m->cfg.max_seq_len);
    if (m->acts && (size_t)B * T <= (size_t)m->act_B * m->act_T) return LOOM_OK;
    free_acts(m);
    size_t total = loom_gpt_act_table(&m->cfg, m->recompute, B, T, NULL, NULL);
    size_t bytes = act_block_bytes(&m->cfg, m->recompute, m->be->act_dtype, B, T);
    m->acts = m->be->alloc(bytes);
    m->tokens = m->be->alloc((size_t)B * T * sizeof(int));
    m->targets = m->be->alloc((size_t)B * T * sizeof(int));
    if (m->cfg.pos == LOOM_POS_ROPE) m->pos = m->be->alloc((size_t)B * T * sizeof(int));
    if (!m->acts || !m->tokens || !m->targets || (m->cfg.pos == LOOM_POS_ROPE && !m->pos))
        return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of activations for batch %d x %d on %s; lower --batch or --seq",
                          bytes / 1e6, B, T, m->be->name);
    m->num_acts = total;
    m->act_bytes = bytes;
    m->loss_host = loom_calloc((size_t)B * T, sizeof(float));
    loom_mem_count(LOOM_MEM_ACTS, (long long)bytes);
    loom_mem_count(LOOM_MEM_BATCH, 3 * (long long)((size_t)B * T * sizeof(int))); /* tokens, targets, losses */
    m->act_B = B;
    m->act_T = T;
    return LOOM_OK;
}

void loom_gpt_free(loom_gpt_t *m) {
    if (!m) return;
    const loom_backend_t *be = m->be;
    if (m->params) { /* ZeRO-3 releases the block (train/zero3.h) */
        be->free(m->params);
        loom_mem_count(LOOM_MEM_PARAMS, -(long long)(m->num_params * sizeof(float)));
    }
    if (m->grads) {
        be->free(m->grads);
        loom_mem_count(LOOM_MEM_GRADS, -(long long)(m->num_params * sizeof(float)));
    }
    loom_gpt_free_moments(m);
    free_acts(m);
    if (m->rope_freq) be->free(m->rope_freq);
    free(m->file_q);
    free(m);
}

void loom_gpt_residual_layernorm(const loom_backend_t *be, float *res, float *out, float *mean, float *rstd,
                               const float *a, const float *b_res, const float *w, const float *b, int N, int C) {
    if (be->residual_layernorm_forward) {
        be->residual_layernorm_forward(res, out, mean, rstd, a, b_res, w, b, N, C);
        return;
    }
    be->residual_forward(res, a, b_res, (size_t)N * C);
    be->layernorm_forward(out, mean, rstd, res, w, b, N, C);
}

void loom_gpt_residual_norm(const loom_gpt_config_t *c, const loom_backend_t *be, float *res, float *out, float *mean,
                            float *rstd, const float *a, const float *b_res, const float *w, const float *b, int N) {
    if (c->norm == LOOM_NORM_LAYERNORM) {
        loom_gpt_residual_layernorm(be, res, out, mean, rstd, a, b_res, w, b, N, c->channels);
        return;
    }
    be->residual_forward(res, a, b_res, (size_t)N * c->channels);
    be->rmsnorm_forward(out, rstd, res, w, N, c->channels, c->norm_eps);
}

void loom_gpt_norm(const loom_gpt_config_t *c, const loom_backend_t *be, float *out, float *mean, float *rstd,
                   const float *inp, const float *w, const float *b, int N) {
    if (c->norm == LOOM_NORM_LAYERNORM) be->layernorm_forward(out, mean, rstd, inp, w, b, N, c->channels);
    else be->rmsnorm_forward(out, rstd, inp, w, N, c->channels, c->norm_eps);
}

/* dinp += , dw += , db += : the backward of loom_gpt_norm. */
static void norm_backward(const loom_gpt_config_t *c, const loom_backend_t *be, float *dinp, float *dw, float *db,
                          const float *dout, const float *inp, const float *w, const float *mean, const float *rstd, int N) {
    if (c->norm == LOOM_NORM_LAYERNORM) be->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, c->channels);
    else be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, c->channels);
}

loom_status loom_gpt_set_batch(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T) {
    int V = m->tp ? m->tp->vocab_size : m->cfg.vocab_size;
    if (T > m->cfg.max_seq_len)
        return loom_error(LOOM_EINVAL, "sequence length %d is above the model's %d", T, m->cfg.max_seq_len);
    LOOM_TRY(loom_gpt_alloc_acts(m, B, T));
    size_t N = (size_t)B * T;
    for (size_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return loom_error(LOOM_EINVAL, "token %d at position %zu is outside the model's vocabulary (%d)", tokens[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return loom_error(LOOM_EINVAL, "target %d at position %zu is outside the model's vocabulary (%d)", targets[i], i, V);
    }
    m->be->upload(m->tokens, tokens, N * sizeof(int));
    if (targets) m->be->upload(m->targets, targets, N * sizeof(int));
    if (m->pos) { /* row b*T + t is at position t */
        int *pos = loom_malloc(N * sizeof(int));
        for (size_t i = 0; i < N; i++) pos[i] = (int)(i % (size_t)T);
        m->be->upload(m->pos, pos, N * sizeof(int));
        free(pos);
    }
    return LOOM_OK;
}

float *loom_gpt_slice(const loom_gpt_t *m, float *const *views, int i, int l) {
    const loom_tensor_info_t *t = &m->ptable[i];
    if (!t->numel) return NULL;
    return t->ndim == 1 || i == LOOM_WTE || i == LOOM_WPE || i == LOOM_LMHEAD ? views[i] : views[i] + (size_t)l * (t->numel / (size_t)t->shape[0]);
}
float *loom_gpt_weight(const loom_gpt_t *m, int i, int l, int grad) {
    if (m->view) return m->view(m->view_ctx, i, l, grad);
    return loom_gpt_slice(m, grad ? m->grad : m->param, i, l);
}
#define P(i, l) loom_gpt_weight(m, i, l, 0)
#define G(i, l) loom_gpt_weight(m, i, l, 1)

static void layer_event(const loom_gpt_t *m, int l, int backward) {
    if (m->layer_hook) m->layer_hook(m->view_ctx, l, backward);
}

/* The MLP's activation: fch_gelu (N,H) = gelu(fch) or silu(gate) * up. */
static void mlp_act(const loom_gpt_t *m, float *act, const float *fch, size_t N) {
    if (m->cfg.mlp == LOOM_MLP_SWIGLU) m->be->swiglu_forward(act, fch, (int)N, m->cfg.ffn_hidden);
    else m->be->gelu_forward(act, fch, N * (size_t)m->cfg.ffn_hidden);
}

/* Block l from its input on the residual stream. Forward (recompute = 0)
 * expects ln1 of block l in place and ends with the residual add fused with
 * the next norm (block l+1's ln1, or lnf). Recompute (in backward) first
 * computes ln1 (unfused, as no fcproj of block l-1 is kept) and stops after
 * the MLP's activation: what block l's backward reads. */
static void block_forward(loom_gpt_t *m, const acts_t *a, int l, int B, int T, int recompute) {
    const loom_backend_t *be = m->be;
    const loom_gpt_config_t *c = &m->cfg;
    int L = c->n_layer, C = c->channels, NH = c->n_head, KV = c->n_kv_heads, QR = loom_gpt_qkv_rows(c);
    int FR = loom_gpt_fc_rows(c), H = c->ffn_hidden, hs = loom_gpt_head_size(c), AW = NH * hs;
    size_t N = (size_t)B * T;
    const float *resid = l == 0 ? a->a[A_ENCODED] : lay(a, A_RESIDUAL3, l - 1);
    float *ln1 = lay(a, A_LN1, l);
    float *qkv = lay(a, A_QKV, l), *atty = lay(a, A_ATTY, l);
    float *lse = lay(a, A_ATT_LSE, l), *attproj = lay(a, A_ATTPROJ, l);
    float *res2 = lay(a, A_RESIDUAL2, l), *ln2 = lay(a, A_LN2, l);
    float *ln2_mean = lay(a, A_LN2_MEAN, l), *ln2_rstd = lay(a, A_LN2_RSTD, l);
    float *fch = lay(a, A_FCH, l), *fch_gelu = lay(a, A_FCH_GELU, l);
    float *fcproj = lay(a, A_FCPROJ, l), *res3 = lay(a, A_RESIDUAL3, l);

    if (recompute) loom_gpt_norm(c, be, ln1, lay(a, A_LN1_MEAN, l), lay(a, A_LN1_RSTD, l), resid, P(LOOM_LN1W, l), P(LOOM_LN1B, l), (int)N);
    be->matmul_forward(qkv, ln1, P(LOOM_QKVW, l), P(LOOM_QKVB, l), (int)N, C, QR);
    if (c->pos == LOOM_POS_ROPE) be->rope_forward(qkv, m->pos, m->rope_freq, (int)N, NH, KV, hs);
    be->attention_forward(atty, lse, qkv, B, T, AW, NH, KV);
    be->matmul_forward(attproj, atty, P(LOOM_ATTPROJW, l), P(LOOM_ATTPROJB, l), (int)N, AW, C);
    if (m->tp) m->tp->allreduce(m->tp->ctx, attproj, N * C); /* row-parallel: partial sums */
    loom_gpt_residual_norm(c, be, res2, ln2, ln2_mean, ln2_rstd, resid, attproj, P(LOOM_LN2W, l), P(LOOM_LN2B, l), (int)N);
    if (be->matmul_forward_gelu && c->mlp == LOOM_MLP_GELU) {
        be->matmul_forward_gelu(fch_gelu, fch, ln2, P(LOOM_FCW, l), P(LOOM_FCB, l), (int)N, C, FR);
    } else {
        be->matmul_forward(fch, ln2, P(LOOM_FCW, l), P(LOOM_FCB, l), (int)N, C, FR);
        mlp_act(m, fch_gelu, fch, N);
    }
    if (recompute) return;
    be->matmul_forward(fcproj, fch_gelu, P(LOOM_FCPROJW, l), P(LOOM_FCPROJB, l), (int)N, H, C);
    if (m->tp) m->tp->allreduce(m->tp->ctx, fcproj, N * C);
    if (l + 1 < L)
        loom_gpt_residual_norm(c, be, res3, lay(a, A_LN1, l + 1), lay(a, A_LN1_MEAN, l + 1), lay(a, A_LN1_RSTD, l + 1), res2, fcproj,
                               P(LOOM_LN1W, l + 1), P(LOOM_LN1B, l + 1), (int)N);
    else
        loom_gpt_residual_norm(c, be, res3, a->a[A_LNF], a->a[A_LNF_MEAN], a->a[A_LNF_RSTD], res2, fcproj, P(LOOM_LNFW, 0),
                               P(LOOM_LNFB, 0), (int)N);
}

int loom_gpt_head_param(const loom_gpt_config_t *c) { return c->untied_head ? LOOM_LMHEAD : LOOM_WTE; }
static int head_param(const loom_gpt_t *m) { return loom_gpt_head_param(&m->cfg); }

/* The embeddings (LOOM_STAGE_EMBED; else the caller wrote the stream's
 * input), the blocks, the head (LOOM_STAGE_HEAD): logits of m->tokens. */
static void forward_body(loom_gpt_t *m, const acts_t *a, int B, int T, int parts) {
    const loom_backend_t *be = m->be;
    int C = m->cfg.channels, Vp = m->cfg.padded_vocab_size;
    size_t N = (size_t)B * T;
    layer_event(m, -1, 0);
    if (parts & LOOM_STAGE_EMBED) {
        if (m->tp) m->tp->embed_forward(m->tp->ctx, a->a[A_ENCODED], B, T);
        else be->encoder_forward(a->a[A_ENCODED], m->tokens, P(LOOM_WTE, 0), P(LOOM_WPE, 0), B, T, C);
    }
    /* Each residual add is fused with the LayerNorm that reads it (the next
     * block's ln1 or the final lnf) where the backend offers the fusion. */
    loom_gpt_norm(&m->cfg, be, lay(a, A_LN1, 0), lay(a, A_LN1_MEAN, 0), lay(a, A_LN1_RSTD, 0), a->a[A_ENCODED], P(LOOM_LN1W, 0), P(LOOM_LN1B, 0), (int)N);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        layer_event(m, l, 0);
        block_forward(m, a, l, B, T, 0);
    }
    if (parts & LOOM_STAGE_HEAD) be->matmul_forward(a->a[A_LOGITS], a->a[A_LNF], P(head_param(m), 0), NULL, (int)N, C, Vp);
}

loom_status loom_gpt_forward_stage(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T, int parts,
                                   float dloss, float *loss) {
    const loom_backend_t *be = m->be;
    int V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    LOOM_TRY(loom_gpt_set_batch(m, tokens, targets, B, T));
    size_t N = (size_t)B * T;
    acts_t a;
    act_views(m, B, T, &a);
    forward_body(m, &a, B, T, parts);
    if (targets && (parts & LOOM_STAGE_HEAD)) {
        if (m->tp) m->tp->crossentropy(m->tp->ctx, a.a[A_LOSSES], a.a[A_LOGITS], (int)N, dloss);
        else be->crossentropy(a.a[A_LOSSES], a.a[A_LOGITS], m->targets, (int)N, V, Vp, dloss);
        be->download(m->loss_host, a.a[A_LOSSES], N * sizeof(float));
        double sum = 0;
        for (size_t i = 0; i < N; i++) sum += m->loss_host[i];
        if (loss) *loss = (float)(sum / (double)N);
    }
    return LOOM_OK;
}

loom_status loom_gpt_forward(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, float *loss) {
    return loom_gpt_forward_stage(m, tokens, targets, B, T, LOOM_STAGE_ALL, dloss, loss);
}

float *loom_gpt_stream(const loom_gpt_t *m, int B, int T, loom_gpt_stream_kind which) {
    acts_t a;
    act_views(m, B, T, &a);
    if (which == LOOM_STREAM_IN) return a.a[A_ENCODED];
    if (which == LOOM_STREAM_OUT) return lay(&a, A_RESIDUAL3, m->cfg.n_layer - 1);
    return a.a[G_RESIDUAL];
}

void loom_gpt_forward_dev(loom_gpt_t *m, int B, int T, const float *scalars) {
    acts_t a;
    act_views(m, B, T, &a);
    forward_body(m, &a, B, T, LOOM_STAGE_ALL);
    m->be->crossentropy_dev(a.a[A_LOSSES], a.a[A_LOGITS], m->targets, B * T, m->cfg.vocab_size, m->cfg.padded_vocab_size, scalars);
}

float *loom_gpt_losses_dev(const loom_gpt_t *m, int B, int T) {
    acts_t a;
    act_views(m, B, T, &a);
    return a.a[A_LOSSES];
}

/* Block l's MLP backward: dres (the gradient of res3) flows into fc_proj,
 * the activation, fc and norm2, and accumulates into dres. */
static void mlp_backward(loom_gpt_t *m, const acts_t *a, int l, size_t N) {
    const loom_backend_t *be = m->be;
    const loom_gpt_config_t *c = &m->cfg;
    int C = c->channels, FR = loom_gpt_fc_rows(c), H = c->ffn_hidden;
    float *dres = a->a[G_RESIDUAL], *dbtc = a->a[G_BTC], *dfch = a->a[G_FCH];
    float *res2 = lay(a, A_RESIDUAL2, l), *ln2 = lay(a, A_LN2, l);
    float *fch = lay(a, A_FCH, l), *fch_gelu = lay(a, A_FCH_GELU, l);
    if (c->mlp == LOOM_MLP_SWIGLU) {
        float *dact = a->a[G_ACT];
        be->zero(dact, loom_backend_act_bytes(be, N * H));
        be->matmul_backward(dact, G(LOOM_FCPROJW, l), G(LOOM_FCPROJB, l), dres, fch_gelu, P(LOOM_FCPROJW, l), (int)N, H, C);
        be->swiglu_backward(dfch, fch, dact, (int)N, H);
    } else if (be->matmul_backward_gelu) {
        be->matmul_backward_gelu(dfch, G(LOOM_FCPROJW, l), G(LOOM_FCPROJB, l), dres, fch_gelu, fch, P(LOOM_FCPROJW, l), (int)N, H, C);
    } else {
        be->zero(dfch, loom_backend_act_bytes(be, N * FR));
        be->matmul_backward(dfch, G(LOOM_FCPROJW, l), G(LOOM_FCPROJB, l), dres, fch_gelu, P(LOOM_FCPROJW, l), (int)N, H, C);
        be->gelu_backward(dfch, fch, dfch, N * H);
    }
    be->zero(dbtc, loom_backend_act_bytes(be, N * C));
    be->matmul_backward(dbtc, G(LOOM_FCW, l), G(LOOM_FCB, l), dfch, ln2, P(LOOM_FCW, l), (int)N, C, FR);
    if (m->tp) m->tp->allreduce(m->tp->ctx, dbtc, N * C); /* column-parallel: the input gradient is a sum */
    norm_backward(c, be, dres, G(LOOM_LN2W, l), G(LOOM_LN2B, l), dbtc, res2, P(LOOM_LN2W, l), lay(a, A_LN2_MEAN, l),
                  lay(a, A_LN2_RSTD, l), (int)N);
}

/* Block l's attention backward: res2 = resid + attproj, dres flows to both. */
static void attn_backward(loom_gpt_t *m, const acts_t *a, int l, int B, int T) {
    const loom_backend_t *be = m->be;
    const loom_gpt_config_t *c = &m->cfg;
    int C = c->channels, NH = c->n_head, KV = c->n_kv_heads, QR = loom_gpt_qkv_rows(c);
    int hs = loom_gpt_head_size(c), AW = NH * hs;
    size_t N = (size_t)B * T, btc_bytes = loom_backend_act_bytes(be, N * C);
    float *dres = a->a[G_RESIDUAL], *dbtc = a->a[G_BTC], *dqkv = a->a[G_QKV];
    const float *resid = l == 0 ? a->a[A_ENCODED] : lay(a, A_RESIDUAL3, l - 1);
    float *qkv = lay(a, A_QKV, l), *atty = lay(a, A_ATTY, l);
    be->zero(dbtc, loom_backend_act_bytes(be, N * AW)); /* d atty: AW <= C wide */
    be->matmul_backward(dbtc, G(LOOM_ATTPROJW, l), G(LOOM_ATTPROJB, l), dres, atty, P(LOOM_ATTPROJW, l), (int)N, AW, C);
    be->attention_backward(dqkv, dbtc, qkv, atty, lay(a, A_ATT_LSE, l), B, T, AW, NH, KV);
    if (c->pos == LOOM_POS_ROPE) be->rope_backward(dqkv, m->pos, m->rope_freq, (int)N, NH, KV, hs);
    be->zero(dbtc, btc_bytes);
    be->matmul_backward(dbtc, G(LOOM_QKVW, l), G(LOOM_QKVB, l), dqkv, lay(a, A_LN1, l), P(LOOM_QKVW, l), (int)N, C, QR);
    if (m->tp) m->tp->allreduce(m->tp->ctx, dbtc, N * C);
    norm_backward(c, be, dres, G(LOOM_LN1W, l), G(LOOM_LN1B, l), dbtc, resid, P(LOOM_LN1W, l), lay(a, A_LN1_MEAN, l),
                  lay(a, A_LN1_RSTD, l), (int)N);
}

void loom_gpt_backward_stage(loom_gpt_t *m, int B, int T, int parts) {
    const loom_backend_t *be = m->be;
    const loom_gpt_config_t *c = &m->cfg;
    int L = c->n_layer, C = c->channels, Vp = c->padded_vocab_size;
    size_t N = (size_t)B * T, btc_bytes = loom_backend_act_bytes(be, N * C);
    acts_t a;
    act_views(m, B, T, &a);
    float *dres = a.a[G_RESIDUAL], *dbtc = a.a[G_BTC];

    layer_event(m, -1, 1);
    if (parts & LOOM_STAGE_HEAD) { /* logits = lnf @ head^T, the logits buffer now holds their gradient */
        be->zero(dbtc, btc_bytes);
        be->matmul_backward(dbtc, G(head_param(m), 0), NULL, a.a[A_LOGITS], a.a[A_LNF], P(head_param(m), 0), (int)N, C, Vp);
        if (m->tp) m->tp->allreduce(m->tp->ctx, dbtc, N * C); /* the head is vocabulary-parallel */
        be->zero(dres, btc_bytes);
        norm_backward(c, be, dres, G(LOOM_LNFW, 0), G(LOOM_LNFB, 0), dbtc, lay(&a, A_RESIDUAL3, L - 1), P(LOOM_LNFW, 0),
                      a.a[A_LNF_MEAN], a.a[A_LNF_RSTD], (int)N);
    } /* else the caller wrote the gradient of the stream's output into dres */

    for (int l = L - 1; l >= 0; l--) {
        layer_event(m, l, 1);
        if (m->recompute == LOOM_RECOMPUTE_ALL) block_forward(m, &a, l, B, T, 1);
        else if (m->recompute == LOOM_RECOMPUTE_GELU) mlp_act(m, lay(&a, A_FCH_GELU, l), lay(&a, A_FCH, l), N);
        mlp_backward(m, &a, l, N);
        attn_backward(m, &a, l, B, T);
        if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, l);
    }
    if (parts & LOOM_STAGE_EMBED) {
        if (m->tp) m->tp->embed_backward(m->tp->ctx, dres, B, T);
        else be->encoder_backward(G(LOOM_WTE, 0), G(LOOM_WPE, 0), dres, m->tokens, B, T, C);
    }
    if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, -1);
}

void loom_gpt_backward(loom_gpt_t *m, int B, int T) { loom_gpt_backward_stage(m, B, T, LOOM_STAGE_ALL); }

void loom_gpt_zero_grad(loom_gpt_t *m) { m->be->zero(m->grads, m->num_params * sizeof(float)); }

float loom_gpt_grad_norm(loom_gpt_t *m) { return (float)sqrt(m->be->sumsq(m->grads, m->num_params)); }

/* Two calls: decayed tensors, then the rest without weight decay; through
 * adamw_dev when `scalars` is given. */
static void adamw_groups(loom_gpt_t *m, const loom_adamw_t *hp, const float *scalars) {
    const loom_backend_t *be = m->be;
    size_t split = m->ptable[LOOM_FIRST_NODECAY].offset;
    loom_adamw_t nodecay = *hp;
    nodecay.weight_decay = 0.0f;
    if (scalars) {
        be->adamw_dev(m->params, m->grads, m->m, m->v, split, hp, scalars);
        be->adamw_dev(m->params + split, m->grads + split, m->m + split, m->v + split, m->num_params - split, &nodecay, scalars);
    } else {
        be->adamw(m->params, m->grads, m->m, m->v, split, hp);
        be->adamw(m->params + split, m->grads + split, m->m + split, m->v + split, m->num_params - split, &nodecay);
    }
}

void loom_gpt_adamw(loom_gpt_t *m, const loom_adamw_t *hp) { adamw_groups(m, hp, NULL); }

void loom_gpt_adamw_dev(loom_gpt_t *m, const loom_adamw_t *hp, const float *scalars) { adamw_groups(m, hp, scalars); }

void loom_gpt_logits(const loom_gpt_t *m, float *out, int B, int T) {
    acts_t a;
    act_views(m, B, T, &a);
    loom_backend_download_act(m->be, out, a.a[A_LOGITS], (size_t)B * T * m->cfg.padded_vocab_size);
}
