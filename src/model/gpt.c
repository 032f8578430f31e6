#include "gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

typedef struct {
    const char *name;
    int L, C, NH, T;
} preset_t;

static const preset_t presets[] = {
    {"gpt2-tiny", 4, 256, 4, 256},
    {"gpt2-small", 12, 768, 12, 1024},
    {"gpt2-medium", 24, 1024, 16, 1024},
    {"gpt2-large", 36, 1280, 20, 1024},
    {"gpt2-xl", 48, 1600, 25, 1024},
};

const char *const loom_gpt_preset_names[] = {"gpt2-tiny", "gpt2-small", "gpt2-medium",
                                             "gpt2-large", "gpt2-xl", NULL};

loom_status loom_gpt_preset(loom_gpt_config_t *cfg, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->n_layer = presets[i].L;
        cfg->channels = presets[i].C;
        cfg->n_head = presets[i].NH;
        cfg->max_seq_len = presets[i].T;
        return LOOM_OK;
    }
    return loom_error(LOOM_EINVAL, "--model %s: unknown model; choose gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large or gpt2-xl", name);
}

loom_status loom_gpt_config_finish(loom_gpt_config_t *cfg) {
    if (cfg->n_layer < 1 || cfg->n_layer > 1024)
        return loom_error(LOOM_EINVAL, "model: %d layers; expected 1 to 1024", cfg->n_layer);
    if (cfg->n_head < 1 || cfg->channels < 1 || cfg->channels % cfg->n_head != 0)
        return loom_error(LOOM_EINVAL, "model: %d channels do not split into %d heads; channels must be a multiple of heads", cfg->channels, cfg->n_head);
    if (cfg->max_seq_len < 1 || cfg->max_seq_len > 1 << 20)
        return loom_error(LOOM_EINVAL, "model: sequence length %d; expected 1 to 1048576", cfg->max_seq_len);
    if (cfg->vocab_size < 2 || cfg->vocab_size > 1 << 30)
        return loom_error(LOOM_EINVAL, "model: vocabulary size %d; expected 2 to 2^30", cfg->vocab_size);
    cfg->padded_vocab_size = (cfg->vocab_size + 63) / 64 * 64;
    return LOOM_OK;
}

void loom_gpt_param_table(const loom_gpt_config_t *cfg, loom_tensor_info_t t[LOOM_NPARAMS],
                          size_t *total) {
    int L = cfg->n_layer, C = cfg->channels, Vp = cfg->padded_vocab_size, maxT = cfg->max_seq_len;
    const struct {
        const char *name;
        int ndim, s0, s1, s2;
    } spec[LOOM_NPARAMS] = {
        [LOOM_WTE] = {"wte", 2, Vp, C, 0},
        [LOOM_WPE] = {"wpe", 2, maxT, C, 0},
        [LOOM_QKVW] = {"qkvw", 3, L, 3 * C, C},
        [LOOM_ATTPROJW] = {"attprojw", 3, L, C, C},
        [LOOM_FCW] = {"fcw", 3, L, 4 * C, C},
        [LOOM_FCPROJW] = {"fcprojw", 3, L, C, 4 * C},
        [LOOM_LN1W] = {"ln1w", 2, L, C, 0},
        [LOOM_LN1B] = {"ln1b", 2, L, C, 0},
        [LOOM_QKVB] = {"qkvb", 2, L, 3 * C, 0},
        [LOOM_ATTPROJB] = {"attprojb", 2, L, C, 0},
        [LOOM_LN2W] = {"ln2w", 2, L, C, 0},
        [LOOM_LN2B] = {"ln2b", 2, L, C, 0},
        [LOOM_FCB] = {"fcb", 2, L, 4 * C, 0},
        [LOOM_FCPROJB] = {"fcprojb", 2, L, C, 0},
        [LOOM_LNFW] = {"lnfw", 1, C, 0, 0},
        [LOOM_LNFB] = {"lnfb", 1, C, 0, 0},
    };
    size_t off = 0;
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        t[i].name = spec[i].name;
        t[i].ndim = spec[i].ndim;
        t[i].shape[0] = spec[i].s0;
        t[i].shape[1] = spec[i].s1;
        t[i].shape[2] = spec[i].s2;
        t[i].numel = 1;
        for (int d = 0; d < t[i].ndim; d++) t[i].numel *= (size_t)t[i].shape[d];
        /* Keep every tensor 64-byte aligned for vector loads. */
        off = (off + 15) / 16 * 16;
        t[i].offset = off;
        off += t[i].numel;
    }
    *total = (off + 15) / 16 * 16;
}

size_t loom_gpt_num_params(const loom_gpt_config_t *cfg) {
    size_t L = cfg->n_layer, C = cfg->channels;
    return (size_t)cfg->vocab_size * C + (size_t)cfg->max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double loom_gpt_flops_per_token(const loom_gpt_config_t *cfg, int T) {
    /* 6 flops per parameter per token (forward 2, backward 4), the position
     * embedding excluded as a lookup, plus attention's QK^T and AV: 6*L*C*T
     * for a full T x T score matrix per token (PaLM's convention). */
    double n = (double)loom_gpt_num_params(cfg) - (double)cfg->max_seq_len * cfg->channels;
    return 6.0 * n + 6.0 * cfg->n_layer * cfg->channels * (double)T;
}

static loom_status create(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be) {
    loom_gpt_config_t c = *cfg;
    LOOM_TRY(loom_gpt_config_finish(&c));
    loom_gpt_t *m = loom_calloc(1, sizeof *m);
    m->cfg = c;
    m->be = be;
    loom_gpt_param_table(&m->cfg, m->ptable, &m->num_params);
    m->params = be->alloc(m->num_params * sizeof(float));
    if (!m->params) {
        double mb = m->num_params * 4.0 / 1e6;
        free(m);
        return loom_error(LOOM_ENOMEM, "cannot allocate %.1f MB of parameters on %s", mb, be->name);
    }
    loom_mem_count(LOOM_MEM_PARAMS, (long long)(m->num_params * sizeof(float)));
    for (int i = 0; i < LOOM_NPARAMS; i++) m->param[i] = m->params + m->ptable[i].offset;
    *out = m;
    return LOOM_OK;
}

loom_status loom_gpt_create(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be) {
    return create(out, cfg, be);
}

loom_status loom_gpt_init(loom_gpt_t **out, const loom_gpt_config_t *cfg, const loom_backend_t *be,
                          unsigned long long seed) {
    loom_gpt_t *m;
    LOOM_TRY(create(&m, cfg, be));
    float *host = loom_calloc(m->num_params, sizeof(float));
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    float resid_std = 0.02f / sqrtf(2.0f * m->cfg.n_layer);
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *t = &m->ptable[i];
        float *p = host + t->offset;
        switch (i) {
        case LOOM_WTE: /* padded rows stay zero */
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

/* Activation layout for (B, T): one allocation split by this table. Layer
 * tensors (A_LN1 .. A_RESIDUAL3) hold L slices back to back, one per layer,
 * or a single slice all layers share when the recompute mode does not keep
 * them; the backward scratch buffers are shared by every layer. */
enum {
    A_ENCODED,   /* (B,T,C) */
    A_LN1,       /* (L,B,T,C) */
    A_LN1_MEAN,  /* (L,B,T) */
    A_LN1_RSTD,  /* (L,B,T) */
    A_QKV,       /* (L,B,T,3C) */
    A_ATTY,      /* (L,B,T,C) */
    A_ATT_LSE,   /* (L,B,NH,T) */
    A_ATTPROJ,   /* (L,B,T,C) */
    A_RESIDUAL2, /* (L,B,T,C) */
    A_LN2,       /* (L,B,T,C) */
    A_LN2_MEAN,  /* (L,B,T) */
    A_LN2_RSTD,  /* (L,B,T) */
    A_FCH,       /* (L,B,T,4C) */
    A_FCH_GELU,  /* (L,B,T,4C) */
    A_FCPROJ,    /* (L,B,T,C) */
    A_RESIDUAL3, /* (L,B,T,C) */
    A_LNF,       /* (B,T,C) */
    A_LNF_MEAN,  /* (B,T) */
    A_LNF_RSTD,  /* (B,T) */
    A_LOGITS,    /* (B,T,Vp); the gradient overwrites it in place */
    A_LOSSES,    /* (B,T) */
    G_RESIDUAL,  /* (B,T,C) gradient along the residual stream */
    G_BTC,       /* (B,T,C) scratch: d ln1, d atty, d ln2, d lnf */
    G_QKV,       /* (B,T,3C) */
    G_FCH,       /* (B,T,4C) */
    A_COUNT
};

/* sz: floats of one slice (one layer's, for layer tensors); nl: slices kept. */
static void act_sizes(const loom_gpt_config_t *c, loom_recompute rc, int B, int T, size_t sz[A_COUNT],
                      size_t nl[A_COUNT]) {
    size_t BT = (size_t)B * T, C = c->channels, NH = c->n_head;
    sz[A_ENCODED] = BT * C;
    sz[A_LN1] = BT * C;
    sz[A_LN1_MEAN] = sz[A_LN1_RSTD] = BT;
    sz[A_QKV] = BT * 3 * C;
    sz[A_ATTY] = BT * C;
    sz[A_ATT_LSE] = NH * BT;
    sz[A_ATTPROJ] = sz[A_RESIDUAL2] = sz[A_LN2] = BT * C;
    sz[A_LN2_MEAN] = sz[A_LN2_RSTD] = BT;
    sz[A_FCH] = sz[A_FCH_GELU] = BT * 4 * C;
    sz[A_FCPROJ] = sz[A_RESIDUAL3] = BT * C;
    sz[A_LNF] = BT * C;
    sz[A_LNF_MEAN] = sz[A_LNF_RSTD] = BT;
    sz[A_LOGITS] = BT * c->padded_vocab_size;
    sz[A_LOSSES] = BT;
    sz[G_RESIDUAL] = sz[G_BTC] = BT * C;
    sz[G_QKV] = BT * 3 * C;
    sz[G_FCH] = BT * 4 * C;
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
    "logits", "losses", "d_residual", "d_btc", "d_qkv", "d_fch"};

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
    if (!m->acts || !m->tokens || !m->targets)
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
    be->free(m->params);
    loom_mem_count(LOOM_MEM_PARAMS, -(long long)(m->num_params * sizeof(float)));
    if (m->grads) {
        be->free(m->grads);
        loom_mem_count(LOOM_MEM_GRADS, -(long long)(m->num_params * sizeof(float)));
    }
    loom_gpt_free_moments(m);
    free_acts(m);
    free(m->file_int8);
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

loom_status loom_gpt_set_batch(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T) {
    int V = m->cfg.vocab_size;
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
    return LOOM_OK;
}

/* Block l from its input on the residual stream. Forward (recompute = 0)
 * expects ln1 of block l in place and ends with the residual add fused with
 * the next LayerNorm (block l+1's ln1, or lnf). Recompute (in backward)
 * first computes ln1 (unfused, as no fcproj of block l-1 is kept) and stops
 * after the GELU: what block l's backward reads. */
static void block_forward(loom_gpt_t *m, const acts_t *a, int l, int B, int T, int recompute) {
    const loom_backend_t *be = m->be;
    int L = m->cfg.n_layer, C = m->cfg.channels, NH = m->cfg.n_head;
    size_t N = (size_t)B * T, btc = N * C, lc = (size_t)l * C;
    float *const *p = m->param;
    const float *resid = l == 0 ? a->a[A_ENCODED] : lay(a, A_RESIDUAL3, l - 1);
    float *ln1 = lay(a, A_LN1, l);
    float *qkv = lay(a, A_QKV, l), *atty = lay(a, A_ATTY, l);
    float *lse = lay(a, A_ATT_LSE, l), *attproj = lay(a, A_ATTPROJ, l);
    float *res2 = lay(a, A_RESIDUAL2, l), *ln2 = lay(a, A_LN2, l);
    float *ln2_mean = lay(a, A_LN2_MEAN, l), *ln2_rstd = lay(a, A_LN2_RSTD, l);
    float *fch = lay(a, A_FCH, l), *fch_gelu = lay(a, A_FCH_GELU, l);
    float *fcproj = lay(a, A_FCPROJ, l), *res3 = lay(a, A_RESIDUAL3, l);

    if (recompute)
        be->layernorm_forward(ln1, lay(a, A_LN1_MEAN, l), lay(a, A_LN1_RSTD, l), resid, p[LOOM_LN1W] + lc, p[LOOM_LN1B] + lc, (int)N, C);
    be->matmul_forward(qkv, ln1, p[LOOM_QKVW] + lc * 3 * C, p[LOOM_QKVB] + 3 * lc, (int)N, C, 3 * C);
    be->attention_forward(atty, lse, qkv, B, T, C, NH);
    be->matmul_forward(attproj, atty, p[LOOM_ATTPROJW] + lc * C, p[LOOM_ATTPROJB] + lc, (int)N, C, C);
    loom_gpt_residual_layernorm(be, res2, ln2, ln2_mean, ln2_rstd, resid, attproj, p[LOOM_LN2W] + lc, p[LOOM_LN2B] + lc, (int)N, C);
    if (be->matmul_forward_gelu) {
        be->matmul_forward_gelu(fch_gelu, fch, ln2, p[LOOM_FCW] + lc * 4 * C, p[LOOM_FCB] + 4 * lc, (int)N, C, 4 * C);
    } else {
        be->matmul_forward(fch, ln2, p[LOOM_FCW] + lc * 4 * C, p[LOOM_FCB] + 4 * lc, (int)N, C, 4 * C);
        be->gelu_forward(fch_gelu, fch, 4 * btc);
    }
    if (recompute) return;
    be->matmul_forward(fcproj, fch_gelu, p[LOOM_FCPROJW] + lc * 4 * C, p[LOOM_FCPROJB] + lc, (int)N, 4 * C, C);
    if (l + 1 < L)
        loom_gpt_residual_layernorm(be, res3, lay(a, A_LN1, l + 1), lay(a, A_LN1_MEAN, l + 1), lay(a, A_LN1_RSTD, l + 1), res2, fcproj,
                           p[LOOM_LN1W] + lc + C, p[LOOM_LN1B] + lc + C, (int)N, C);
    else
        loom_gpt_residual_layernorm(be, res3, a->a[A_LNF], a->a[A_LNF_MEAN], a->a[A_LNF_RSTD], res2, fcproj, p[LOOM_LNFW], p[LOOM_LNFB], (int)N, C);
}

/* Embeddings, the blocks, the head: logits of the batch in m->tokens. */
static void forward_body(loom_gpt_t *m, const acts_t *a, int B, int T) {
    const loom_backend_t *be = m->be;
    int C = m->cfg.channels, Vp = m->cfg.padded_vocab_size;
    size_t N = (size_t)B * T;
    float *const *p = m->param;
    be->encoder_forward(a->a[A_ENCODED], m->tokens, p[LOOM_WTE], p[LOOM_WPE], B, T, C);
    /* Each residual add is fused with the LayerNorm that reads it (the next
     * block's ln1 or the final lnf) where the backend offers the fusion. */
    be->layernorm_forward(lay(a, A_LN1, 0), lay(a, A_LN1_MEAN, 0), lay(a, A_LN1_RSTD, 0), a->a[A_ENCODED], p[LOOM_LN1W], p[LOOM_LN1B], (int)N, C);
    for (int l = 0; l < m->cfg.n_layer; l++) block_forward(m, a, l, B, T, 0);
    be->matmul_forward(a->a[A_LOGITS], a->a[A_LNF], p[LOOM_WTE], NULL, (int)N, C, Vp);
}

loom_status loom_gpt_forward(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, float *loss) {
    const loom_backend_t *be = m->be;
    int V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    LOOM_TRY(loom_gpt_set_batch(m, tokens, targets, B, T));
    size_t N = (size_t)B * T;
    acts_t a;
    act_views(m, B, T, &a);
    forward_body(m, &a, B, T);
    if (targets) {
        be->crossentropy(a.a[A_LOSSES], a.a[A_LOGITS], m->targets, (int)N, V, Vp, dloss);
        be->download(m->loss_host, a.a[A_LOSSES], N * sizeof(float));
        double sum = 0;
        for (size_t i = 0; i < N; i++) sum += m->loss_host[i];
        if (loss) *loss = (float)(sum / (double)N);
    }
    return LOOM_OK;
}

void loom_gpt_forward_dev(loom_gpt_t *m, int B, int T, const float *scalars) {
    acts_t a;
    act_views(m, B, T, &a);
    forward_body(m, &a, B, T);
    m->be->crossentropy_dev(a.a[A_LOSSES], a.a[A_LOGITS], m->targets, B * T, m->cfg.vocab_size, m->cfg.padded_vocab_size, scalars);
}

float *loom_gpt_losses_dev(const loom_gpt_t *m, int B, int T) {
    acts_t a;
    act_views(m, B, T, &a);
    return a.a[A_LOSSES];
}

void loom_gpt_backward(loom_gpt_t *m, int B, int T) {
    const loom_backend_t *be = m->be;
    int L = m->cfg.n_layer, C = m->cfg.channels, NH = m->cfg.n_head, Vp = m->cfg.padded_vocab_size;
    size_t N = (size_t)B * T, btc = N * C, btc_bytes = loom_backend_act_bytes(be, btc);
    acts_t a;
    act_views(m, B, T, &a);
    float *const *p = m->param;
    float *const *g = m->grad;
    float *dres = a.a[G_RESIDUAL], *dbtc = a.a[G_BTC], *dqkv = a.a[G_QKV], *dfch = a.a[G_FCH];

    /* Head: logits = lnf @ wte^T, the logits buffer now holds their gradient. */
    be->zero(dbtc, btc_bytes);
    be->matmul_backward(dbtc, g[LOOM_WTE], NULL, a.a[A_LOGITS], a.a[A_LNF], p[LOOM_WTE], (int)N, C, Vp);
    be->zero(dres, btc_bytes);
    const float *last = lay(&a, A_RESIDUAL3, L - 1);
    be->layernorm_backward(dres, g[LOOM_LNFW], g[LOOM_LNFB], dbtc, last, p[LOOM_LNFW], a.a[A_LNF_MEAN], a.a[A_LNF_RSTD], (int)N, C);

    for (int l = L - 1; l >= 0; l--) {
        const float *resid = l == 0 ? a.a[A_ENCODED] : lay(&a, A_RESIDUAL3, l - 1);
        float *ln1 = lay(&a, A_LN1, l), *ln1_mean = lay(&a, A_LN1_MEAN, l), *ln1_rstd = lay(&a, A_LN1_RSTD, l);
        float *qkv = lay(&a, A_QKV, l), *atty = lay(&a, A_ATTY, l);
        float *lse = lay(&a, A_ATT_LSE, l);
        float *res2 = lay(&a, A_RESIDUAL2, l), *ln2 = lay(&a, A_LN2, l);
        float *ln2_mean = lay(&a, A_LN2_MEAN, l), *ln2_rstd = lay(&a, A_LN2_RSTD, l);
        float *fch = lay(&a, A_FCH, l), *fch_gelu = lay(&a, A_FCH_GELU, l);
        size_t lc = (size_t)l * C;

        if (m->recompute == LOOM_RECOMPUTE_ALL) block_forward(m, &a, l, B, T, 1);
        else if (m->recompute == LOOM_RECOMPUTE_GELU) be->gelu_forward(fch_gelu, fch, 4 * btc);

        /* res3 = res2 + fcproj: dres flows to both. */
        if (be->matmul_backward_gelu) {
            be->matmul_backward_gelu(dfch, g[LOOM_FCPROJW] + lc * 4 * C, g[LOOM_FCPROJB] + lc, dres, fch_gelu, fch, p[LOOM_FCPROJW] + lc * 4 * C, (int)N, 4 * C, C);
        } else {
            be->zero(dfch, 4 * btc_bytes);
            be->matmul_backward(dfch, g[LOOM_FCPROJW] + lc * 4 * C, g[LOOM_FCPROJB] + lc, dres, fch_gelu, p[LOOM_FCPROJW] + lc * 4 * C, (int)N, 4 * C, C);
            be->gelu_backward(dfch, fch, dfch, 4 * btc);
        }
        be->zero(dbtc, btc_bytes);
        be->matmul_backward(dbtc, g[LOOM_FCW] + lc * 4 * C, g[LOOM_FCB] + 4 * lc, dfch, ln2, p[LOOM_FCW] + lc * 4 * C, (int)N, C, 4 * C);
        be->layernorm_backward(dres, g[LOOM_LN2W] + lc, g[LOOM_LN2B] + lc, dbtc, res2, p[LOOM_LN2W] + lc, ln2_mean, ln2_rstd, (int)N, C);
        /* res2 = resid + attproj */
        be->zero(dbtc, btc_bytes);
        be->matmul_backward(dbtc, g[LOOM_ATTPROJW] + lc * C, g[LOOM_ATTPROJB] + lc, dres, atty, p[LOOM_ATTPROJW] + lc * C, (int)N, C, C);
        be->attention_backward(dqkv, dbtc, qkv, atty, lse, B, T, C, NH);
        be->zero(dbtc, btc_bytes);
        be->matmul_backward(dbtc, g[LOOM_QKVW] + lc * 3 * C, g[LOOM_QKVB] + 3 * lc, dqkv, ln1, p[LOOM_QKVW] + lc * 3 * C, (int)N, C, 3 * C);
        be->layernorm_backward(dres, g[LOOM_LN1W] + lc, g[LOOM_LN1B] + lc, dbtc, resid, p[LOOM_LN1W] + lc, ln1_mean, ln1_rstd, (int)N, C);
        if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, l);
    }
    be->encoder_backward(g[LOOM_WTE], g[LOOM_WPE], dres, m->tokens, B, T, C);
    if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, -1);
}

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
