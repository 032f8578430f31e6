/* model: one decoder-only transformer description, as calls to the backend
 * op table. GPT-2 and the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM2)
 * are instances of it: a block is the same sequence of ops with other
 * choices (loom_gpt_config_t below), never a second forward pass.
 *
 *   x = embed(tokens) [+ wpe[pos] when positions are learned]
 *   per block: x += attn_proj(attention(rope?(qkv(norm1(x)))))
 *              x += fc_proj(act(fc(norm2(x))))
 *   logits = normf(x) @ (wte or lm_head)^T
 *
 * The vocabulary is padded to a multiple of 64 (Vp); padded rows of wte
 * (and lm_head) stay zero and padded logits are ignored by the loss.
 *
 * Parameters, gradients, AdamW moments and activations each live in one
 * backend allocation, laid out by walking a {name, shape} table built from
 * the config; a tensor a variant does not have (wpe under RoPE, biases in
 * Llama, lm_head when tied) has no storage (numel 0). */
#ifndef LOOM_GPT_H
#define LOOM_GPT_H

#include <stddef.h>

#include "../backend/backend.h"
#include "../core/core.h"

/* Every enum's 0 is GPT-2's choice, so a config that sets only the six
 * shape fields (the presets, the tests, older run folders) is GPT-2. */
typedef enum {
    LOOM_NORM_LAYERNORM = 0, /* (x - mean) * rstd * w + b; GPT-2 */
    LOOM_NORM_RMSNORM,       /* x * rsqrt(mean(x^2) + eps) * w, no bias; Llama */
} loom_norm_kind;

typedef enum {
    LOOM_POS_LEARNED = 0, /* wpe (maxT, C) added to the token embedding; GPT-2 */
    LOOM_POS_ROPE,        /* rotary embedding of q and k in each block, no table; Llama */
} loom_pos_kind;

typedef enum {
    LOOM_MLP_GELU = 0, /* fc (H, C) -> tanh GELU -> fc_proj (C, H); GPT-2 */
    LOOM_MLP_SWIGLU,   /* fc holds gate (H, C) then up (H, C) -> silu(gate) * up -> fc_proj (C, H); Llama */
} loom_mlp_kind;

/* Which linear layers carry a bias (the norms' biases follow the norm kind). */
typedef enum {
    LOOM_BIAS_ALL = 0, /* qkv, attn proj, fc, fc proj; GPT-2 */
    LOOM_BIAS_NONE,    /* none; Llama, Mistral, SmolLM2 */
    LOOM_BIAS_QKV,     /* q, k and v only; Qwen2 */
} loom_bias_kind;

/* Rotary frequency scaling, as Hugging Face's rope_scaling. */
typedef enum {
    LOOM_ROPE_SCALING_NONE = 0,
    LOOM_ROPE_SCALING_LINEAR, /* every frequency divided by factor */
    LOOM_ROPE_SCALING_LLAMA3, /* Llama 3.1's: low frequencies / factor, high kept, smooth between */
} loom_rope_scaling_kind;

typedef struct {
    /* shape */
    int max_seq_len; /* T: positions the model knows */
    int vocab_size;  /* V: exact, any value; the table pads it */
    int padded_vocab_size; /* Vp = V rounded up to 64; derived by loom_gpt_config_finish */
    int n_layer;     /* L */
    int n_head;      /* NH: query heads; head size hs = C / NH */
    int channels;    /* C */
    int n_kv_heads;  /* KV: key/value heads, dividing NH (KV = NH: multi-head, 1: multi-query,
                      * else grouped-query); 0 = NH, filled by loom_gpt_config_finish */
    int ffn_hidden;  /* H: the MLP's hidden width; 0 = 4C (GPT-2), filled by finish */
    int head_dim;    /* hs when it is not C / NH (a tensor-parallel rank's shard holds NH/N
                      * heads of the whole model's size: parallel/tp.h); 0 = C / NH */

    /* block variant */
    loom_norm_kind norm;
    float norm_eps;  /* 0 = 1e-5; LayerNorm takes 1e-5 only (the fused kernels assume it) */
    loom_pos_kind pos;
    float rope_theta; /* RoPE base; 0 = 10000 */
    struct {
        loom_rope_scaling_kind kind;
        float factor;           /* linear and llama3 */
        float low_freq_factor;  /* llama3 */
        float high_freq_factor; /* llama3 */
        int original_max_pos;   /* llama3: original_max_position_embeddings */
    } rope_scaling;
    loom_mlp_kind mlp;
    loom_bias_kind bias;
    int untied_head; /* 1: the output head is its own (Vp, C) lm_head; 0: logits use wte (tied) */

    /* A pipeline stage (train/pipeline.h) that runs no embedding / no head:
     * wpe (and wte, unless the head reads a tied one) / lm_head and the
     * (B, T, Vp) logits get no storage. 0 for a whole model. */
    int stage_no_embed, stage_no_head;
} loom_gpt_config_t;

/* Derived sizes of a finished config. */
int loom_gpt_head_size(const loom_gpt_config_t *c); /* hs = head_dim, or C / NH */
/* Width of attention's output, NH * hs: C unless head_dim says otherwise. */
int loom_gpt_attn_width(const loom_gpt_config_t *c);
/* Rows of one layer's fused qkv weight: NH*hs queries, then KV*hs keys, then KV*hs values. */
int loom_gpt_qkv_rows(const loom_gpt_config_t *c);
/* Rows of one layer's fc weight: H (GELU), or gate then up, 2H (SwiGLU). */
int loom_gpt_fc_rows(const loom_gpt_config_t *c);
/* The name of the family for messages: "gpt2" or "llama". */
const char *loom_gpt_family(const loom_gpt_config_t *c);

/* Fill `cfg` from a preset name (gpt2-tiny, gpt2-small, gpt2-medium,
 * gpt2-large, gpt2-xl); vocab_size is left for the caller (the tokenizer's). */
loom_status loom_gpt_preset(loom_gpt_config_t *cfg, const char *name);
/* The preset names, NULL-terminated, for help text. */
extern const char *const loom_gpt_preset_names[];
/* The bounds every config is held to, whichever way it arrives (the CLI's
 * flags, a run's or checkpoint's config.json, a Hugging Face folder, a
 * GGUF): within them every size loom derives (3C, 4C, QR * C, L * QR * C)
 * fits its type, and tensor element counts are computed in size_t. */
enum {
    LOOM_GPT_MAX_LAYERS = 1024,
    LOOM_GPT_MAX_HEADS = 1024,
    LOOM_GPT_MAX_CHANNELS = 65536,
    LOOM_GPT_MAX_CONTEXT = 1 << 20,
    LOOM_GPT_MAX_FFN = 1 << 20,
    LOOM_GPT_MAX_VOCAB = 1 << 30,
};
/* Check a config against those bounds and derive padded_vocab_size. */
loom_status loom_gpt_config_finish(loom_gpt_config_t *cfg);

/* The parameter tensors in memory order. Decayed tensors (matrices and
 * embeddings) come first, so AdamW runs as two contiguous calls. Shapes
 * with QR = loom_gpt_qkv_rows (3C for GPT-2), FR = loom_gpt_fc_rows (4C
 * for GPT-2), H = ffn_hidden; "-" marks when a variant has no storage. */
enum {
    LOOM_WTE,      /* (Vp, C) */
    LOOM_WPE,      /* (maxT, C); - under RoPE */
    LOOM_QKVW,     /* (L, QR, C): q rows, then k, then v */
    LOOM_ATTPROJW, /* (L, C, AW), AW = loom_gpt_attn_width (C) */
    LOOM_FCW,      /* (L, FR, C): GELU's fc, or SwiGLU's gate then up */
    LOOM_FCPROJW,  /* (L, C, H) */
    LOOM_LMHEAD,   /* (Vp, C); - when the head is tied to wte */
    LOOM_LN1W,     /* (L, C) ... no decay from here on */
    LOOM_LN1B,     /* (L, C); - under RMSNorm */
    LOOM_QKVB,     /* (L, QR); - under LOOM_BIAS_NONE */
    LOOM_ATTPROJB, /* (L, C); - unless LOOM_BIAS_ALL */
    LOOM_LN2W,     /* (L, C) */
    LOOM_LN2B,     /* (L, C); - under RMSNorm */
    LOOM_FCB,      /* (L, FR); - unless LOOM_BIAS_ALL */
    LOOM_FCPROJB,  /* (L, C); - unless LOOM_BIAS_ALL */
    LOOM_LNFW,     /* (C) */
    LOOM_LNFB,     /* (C); - under RMSNorm */
    LOOM_NPARAMS
};
#define LOOM_FIRST_NODECAY LOOM_LN1W

typedef struct {
    const char *name; /* loom's own name, e.g. "qkvw" */
    int ndim;         /* 0 (and numel 0) for a tensor this config does not have */
    int shape[3];
    size_t numel;
    size_t offset; /* in floats from the start of the parameter block */
} loom_tensor_info_t;

/* Parameter table for a config; total float count in *total. A tensor the
 * config does not have gets ndim 0, numel 0 and no storage (its offset is
 * the next tensor's), so GPT-2's layout is what it always was. */
void loom_gpt_param_table(const loom_gpt_config_t *cfg, loom_tensor_info_t table[LOOM_NPARAMS],
                          size_t *total);
/* 1 when parameter `i` (LOOM_WTE ...) has storage under this config. */
int loom_gpt_has_param(const loom_gpt_config_t *cfg, int i);

/* Activation recompute, trading backward compute for activation memory:
 * NONE keeps every activation; GELU keeps no per-layer GELU output (one
 * (B,T,4C) buffer serves all layers, backward recomputes gelu(fch));
 * ALL keeps only each block's input on the residual stream and recomputes
 * the block's forward (up to the GELU) in backward. Gradients are those of
 * NONE up to float rounding (ALL recomputes ln1 unfused). */
typedef enum { LOOM_RECOMPUTE_NONE = 0, LOOM_RECOMPUTE_GELU, LOOM_RECOMPUTE_ALL } loom_recompute;
/* Parse "none", "gelu", "all"; -1 if unknown. */
int loom_recompute_parse(const char *s);
const char *loom_recompute_name(loom_recompute r);

typedef struct loom_gpt loom_gpt_t;
struct loom_gpt {
    loom_gpt_config_t cfg;
    const loom_backend_t *be;
    loom_tensor_info_t ptable[LOOM_NPARAMS];
    size_t num_params;       /* floats in the parameter block (with padding rows) */
    float *params;           /* backend memory, num_params */
    float *param[LOOM_NPARAMS]; /* views into params */
    float *grads;            /* NULL until loom_gpt_alloc_train */
    float *grad[LOOM_NPARAMS];
    float *m, *v;            /* AdamW moments, NULL until loom_gpt_alloc_train */

    /* Activations, sized for (B, T) at loom_gpt_alloc_acts; any smaller
     * B*T fits too. */
    int act_B, act_T;
    loom_recompute recompute; /* decides the activation layout; set with loom_gpt_set_recompute */
    float *acts;             /* one backend allocation; ACT tensors at be->act_dtype */
    size_t num_acts;         /* elements in the block (loom_gpt_act_table's total) */
    size_t act_bytes;        /* its bytes: 2 per ACT element at a 16-bit act_dtype */
    int *tokens, *targets;   /* backend memory, (B, T) int32 */
    int *pos;                /* backend memory, (B, T) int32: each row's position t (RoPE only, else NULL) */
    float *rope_freq;        /* backend memory, (hs/2): rotary inverse frequencies (RoPE only, else NULL) */
    float *loss_host;        /* (B*T) host copy of per-position losses */

    /* Called during backward as gradients become final for this
     * micro-batch: with layer = l after block l's backward (l = L-1 .. 0),
     * then with layer = -1 once wte, wpe, lnfw and lnfb are done. The
     * distributed layer starts reducing those gradients while backward
     * goes on. NULL = no hook. */
    void (*grad_hook)(void *ctx, int layer);
    void *grad_hook_ctx;

    /* Tensor parallelism (parallel/tp.h), or NULL: the model is then one
     * rank's shard and these hooks do what a shard cannot alone. */
    const struct loom_gpt_tp_hooks *tp;

    /* Fully sharded data parallel (train/zero3.h): no rank holds the whole
     * parameter block, so forward and backward read every weight and write
     * every gradient through view(ctx, i, l, grad): tensor i's slice for
     * block l (l = 0 for the tensors that are not per layer) in a gathered
     * copy. layer_hook(ctx, l, backward) runs before block l's forward
     * (backward 0) or backward (1), and with l = -1 before the embeddings
     * and before the head's backward: where the weights are gathered and
     * the next block's gather is issued. NULL = m->param and m->grad. */
    float *(*view)(void *ctx, int i, int l, int grad);
    void (*layer_hook)(void *ctx, int l, int backward);
    void *view_ctx;

    /* Linear weights in llama.cpp's block formats (backend/qblock.h) as a
     * GGUF stored them, or NULL: host memory, one malloc, (L, 4) tensors
     * in LOOM_QLIN_* order then their bytes; a tensor whose file type is
     * not a block format has data NULL (q8_0 ones are int8 with an fp32
     * scale per block of 32: loom_quant_file_int8 in model/quant.h). params holds the same values dequantized; the
     * inference forward runs these on a backend with matmul_forward_kq
     * (docs/quantization.md). Two more tensors follow the (L, 4): the
     * token embedding and the head as stored (LOOM_FILE_Q_EMBED,
     * LOOM_FILE_Q_HEAD; data NULL when not a block format or q8_0); the
     * inference forward looks its rows up and computes the logits on them.
     * Then LOOM_FILE_Q_PARTS part slots per (layer, linear weight): the
     * parts of a fused weight stored in differing block types (slot data
     * NULL), each run on its own blocks. Freed with the model. */
    loom_tensor_t *file_q;
};

/* What a tensor-parallel shard's forward and backward call out to
 * (parallel/tp.c fills it). The shard's wte / lm_head rows are a slice
 * of the vocabulary, so the embedding, the head's input gradient and the
 * cross-entropy need the other ranks; the row-parallel matmuls' outputs
 * and the column-parallel ones' input gradients are sums over ranks. */
typedef struct loom_gpt_tp_hooks {
    void *ctx;
    int vocab_size; /* the whole model's V: tokens and targets are checked against it */
    /* buf (n ACT elements, backend memory) = its sum over the group. */
    void (*allreduce)(void *ctx, float *buf, size_t n);
    /* out (B,T,C) = the embedding of m->tokens (+ wpe). */
    void (*embed_forward)(void *ctx, float *out, int B, int T);
    /* wte's (and wpe's) gradient from dout (B,T,C). */
    void (*embed_backward)(void *ctx, const float *dout, int B, int T);
    /* crossentropy's contract on the shard's logits (N, Vp of the shard). */
    void (*crossentropy)(void *ctx, float *losses, float *logits, int N, float dloss);
} loom_gpt_tp_hooks_t;

/* Layer l's slice of tensor i (LOOM_WTE ...) in `views` (m->param,
 * m->grad, or views laid out like them): the whole tensor for the ones
 * that are not per layer; NULL when the config has no such tensor (a bias
 * of the Llama family), which every matmul op takes as "no bias". */
float *loom_gpt_slice(const loom_gpt_t *m, float *const *views, int i, int l);
/* Tensor i of block l (its weights, or with grad its gradient): the
 * model's own, or a ZeRO-3 gathered copy through m->view (what the tp
 * hooks read, so they work under ZeRO-3 too). */
float *loom_gpt_weight(const loom_gpt_t *m, int i, int l, int grad);
/* The output head's tensor: LOOM_WTE when tied, else LOOM_LMHEAD. */
int loom_gpt_head_param(const loom_gpt_config_t *c);

/* Allocate a model with parameters initialized GPT-2 style from `seed`
 * (normal 0.02, residual projections scaled by 1/sqrt(2L), LayerNorm 1/0). */
loom_status loom_gpt_init(loom_gpt_t **out, const loom_gpt_config_t *cfg,
                          const loom_backend_t *be, unsigned long long seed);
/* Allocate a model whose parameters are all zero (to be loaded). */
loom_status loom_gpt_create(loom_gpt_t **out, const loom_gpt_config_t *cfg,
                            const loom_backend_t *be);
void loom_gpt_free(loom_gpt_t *m);

/* Allocate gradients and AdamW state (nothing when gradients exist). */
loom_status loom_gpt_alloc_train(loom_gpt_t *m);
/* Allocate the gradients only (ZeRO >= 1 keeps a shard of the moments
 * instead of the whole; see train/step.h). */
loom_status loom_gpt_alloc_grads(loom_gpt_t *m);
/* Release the whole-model AdamW moments (m->m, m->v); nothing if absent. */
void loom_gpt_free_moments(loom_gpt_t *m);
/* Release the whole gradient block (ZeRO-3 writes gradients into its own
 * per-layer buffers, train/zero3.h). */
void loom_gpt_free_grads(loom_gpt_t *m);
/* One tensor of the activation block (loom_gpt_act_table). */
typedef struct {
    const char *name;    /* e.g. "qkv", "d_fch" (backward scratch) */
    size_t slice_floats; /* one slice: one layer's for layer tensors */
    size_t slices;       /* L when the recompute mode keeps every layer's, else 1 */
    size_t floats;       /* slice_floats * slices, padded to 64 bytes as allocated */
    int per_layer;       /* 1 for the tensors each block writes */
    int f32;             /* 1: always fp32 (statistics, losses); 0: an ACT tensor,
                          * stored at the backend's act_dtype (2 bytes at bf16) */
} loom_act_info_t;
#define LOOM_ACT_MAX 32
#define LOOM_FILE_Q_PARTS 3 /* loom_gpt_t.file_q: part slots per linear weight (q, k, v) */
/* The activation block loom_gpt_alloc_acts allocates for (B, T) under
 * recompute mode `rc`: fills out[0..*n) when out is non-NULL and returns
 * the block's total floats. The planner reads the same table. */
size_t loom_gpt_act_table(const loom_gpt_config_t *cfg, loom_recompute rc, int B, int T,
                          loom_act_info_t out[LOOM_ACT_MAX], int *n);
/* Allocate activations for batches up to (B, T), T <= max_seq_len. */
loom_status loom_gpt_alloc_acts(loom_gpt_t *m, int B, int T);

/* Choose what backward recomputes. Drops the activations (the layout
 * changes); the next forward or loom_gpt_alloc_acts allocates them again. */
void loom_gpt_set_recompute(loom_gpt_t *m, loom_recompute r);

/* Forward pass on host tokens (B,T). When targets (host, B*T) is non-NULL,
 * computes the per-position losses and returns their mean through *loss.
 * When `dloss` != 0, the logits buffer is replaced by d(loss)/d(logits)
 * scaled by dloss, ready for loom_gpt_backward. */
loom_status loom_gpt_forward(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, float *loss);
/* The device-resident step (train/step_graph.c) splits loom_gpt_forward:
 * loom_gpt_set_batch checks host tokens (B,T) and targets (B*T, may be
 * NULL), allocates activations and uploads both into m->tokens and
 * m->targets (always the same buffers, so a captured CUDA graph reads each
 * step's batch); loom_gpt_forward_dev runs the forward on them and the
 * cross-entropy with dloss read from scalars[5] (backend.h, step scalars),
 * leaving the per-position losses in device memory at
 * loom_gpt_losses_dev(m, B, T) (B*T floats). forward_dev launches ops only:
 * no upload, download, sync or allocation. */
loom_status loom_gpt_set_batch(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T);
void loom_gpt_forward_dev(loom_gpt_t *m, int B, int T, const float *scalars);
float *loom_gpt_losses_dev(const loom_gpt_t *m, int B, int T);
/* Backward pass after a forward with dloss != 0; ACCUMULATES into grads. */
void loom_gpt_backward(loom_gpt_t *m, int B, int T);
/* Zero the gradients. */
void loom_gpt_zero_grad(loom_gpt_t *m);
/* Global L2 norm of the gradients. */
float loom_gpt_grad_norm(loom_gpt_t *m);
/* One AdamW step: weight decay on matrices and embeddings only; grads are
 * multiplied by hp->grad_scale first. */
void loom_gpt_adamw(loom_gpt_t *m, const loom_adamw_t *hp);
/* The same through the backend's adamw_dev: lr, grad_scale, t, clipping
 * and the skip on a non-finite gradient norm come from device `scalars`. */
void loom_gpt_adamw_dev(loom_gpt_t *m, const loom_adamw_t *hp, const float *scalars);
/* Pipeline stages (train/pipeline.h) run a model whose n_layer is the
 * stage's own run of consecutive layers. `parts` says which ends it holds:
 * LOOM_STAGE_EMBED embeds m->tokens into the residual stream (else the
 * caller wrote the stream's input first), LOOM_STAGE_HEAD runs the final
 * norm, the head and, with targets, the loss. LOOM_STAGE_ALL is the whole
 * model: loom_gpt_forward / loom_gpt_backward are these with it. */
enum { LOOM_STAGE_EMBED = 1, LOOM_STAGE_HEAD = 2, LOOM_STAGE_ALL = 3 };
loom_status loom_gpt_forward_stage(loom_gpt_t *m, const int *tokens, const int *targets, int B, int T, int parts,
                                   float dloss, float *loss);
/* Backward of a stage; without LOOM_STAGE_HEAD the caller first writes the
 * gradient of the stream's output into LOOM_STREAM_GRAD. Afterwards that
 * buffer holds the gradient of the stream's input. ACCUMULATES into grads. */
void loom_gpt_backward_stage(loom_gpt_t *m, int B, int T, int parts);
/* The residual stream at a stage's ends, B*T*C activation elements (at the
 * backend's act_dtype) in the current activation block: IN the input of
 * the first block (the embedding's output), OUT the last block's output,
 * GRAD the gradient along the stream (see loom_gpt_backward_stage). */
typedef enum { LOOM_STREAM_IN, LOOM_STREAM_OUT, LOOM_STREAM_GRAD } loom_gpt_stream_kind;
float *loom_gpt_stream(const loom_gpt_t *m, int B, int T, loom_gpt_stream_kind which);
/* Copy the logits (B,T,Vp) of the last forward to host memory `out`. Only
 * meaningful after a forward with dloss == 0. */
void loom_gpt_logits(const loom_gpt_t *m, float *out, int B, int T);
/* res (N,C) = a + b_res, then out, mean, rstd = layernorm(res) with w, b:
 * the backend's fused entry when it has one, else the two ops. Used by
 * the forward here and by the inference path (model/infer.c). */
void loom_gpt_residual_layernorm(const loom_backend_t *be, float *res, float *out, float *mean,
                                 float *rstd, const float *a, const float *b_res, const float *w,
                                 const float *b, int N, int C);
/* The same with the config's norm: LayerNorm as above, or the residual add
 * then RMSNorm (mean unused). */
void loom_gpt_residual_norm(const loom_gpt_config_t *c, const loom_backend_t *be, float *res, float *out, float *mean,
                            float *rstd, const float *a, const float *b_res, const float *w, const float *b, int N);
/* out, mean, rstd = the config's norm of inp (N, C) with w, b (b NULL under RMSNorm). */
void loom_gpt_norm(const loom_gpt_config_t *c, const loom_backend_t *be, float *out, float *mean, float *rstd,
                   const float *inp, const float *w, const float *b, int N);
/* Rotary inverse frequencies (hs/2 floats) of a RoPE config: Hugging
 * Face's inv_freq = 1 / theta^(2j/hs), then rope_scaling (linear: / factor;
 * llama3: low frequencies / factor, high kept, smooth between). */
void loom_gpt_rope_freqs(const loom_gpt_config_t *c, float *out);
/* Model FLOPs per token for training (6N plus attention), N excluding the
 * position embedding, for MFU. */
double loom_gpt_flops_per_token(const loom_gpt_config_t *cfg, int T);
/* Non-padding parameter count (what users call the model size). */
size_t loom_gpt_num_params(const loom_gpt_config_t *cfg);

#endif
