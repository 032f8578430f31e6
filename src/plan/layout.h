/* layout: `loom plan train`'s search over tensor parallel (tp) x pipeline
 * parallel (pp) x data parallel (dp) x ZeRO stage x micro-batch x
 * recompute for the fastest layout that fits a GPU's memory.
 *
 * Memory per GPU comes from loom's own tables (the parameter table split
 * into per-layer and shared tensors; the activation table at the backend's
 * activation width), divided the way Megatron-LM divides them (Narayanan et
 * al. 2021; activations per Korthikanti et al. 2022). Time per step is
 * compute (the trainer's FLOPs per token, 8/6 of it under full recompute),
 * tp all-reduces inside the NVLink domain, pp point-to-point transfers, dp
 * reduce-scatter/all-gather, and the 1F1B bubble: (p-1)/m of the
 * pipeline's busy time, (p-1)/(V m) with V virtual stages (Megatron's
 * interleaved schedule, Narayanan et al. 2021 section 2.2.2). docs/planning.md gives every formula.
 *
 * The rate is the model's FLOP/s while computing (docs/planning.md, "What
 * --mfu means"); which layouts loom's trainer runs is cli/plan_layout.c's
 * to say. */
#ifndef LOOM_PLAN_LAYOUT_H
#define LOOM_PLAN_LAYOUT_H

#include "model/gpt.h"

/* Floats of one layer's tensors and of the shared ones (embeddings, head,
 * final norm, padding) in loom's parameter table: the units ZeRO-3
 * gathers (train/zero3.h). */
void loom_layout_split_params(const loom_gpt_config_t *cfg, double *per_layer, double *shared);

typedef struct {
    int tp, pp, dp, zero;
    int vs;           /* virtual stages (model chunks) per pipeline stage: 1 = plain 1F1B, V > 1 = Megatron's interleaved 1F1B */
    int micro;        /* micro-batch: sequences per GPU per forward */
    int m;            /* micro-batches per optimizer step (accumulation / pipeline depth) */
    loom_recompute rc;
} loom_layout_t;

typedef struct {
    /* bytes per GPU on the fullest stage (the first: embedding + ceil(L/pp) layers) */
    double params, grads, optim, gather, acts, batch, runtime, mem;
    /* seconds per optimizer step */
    double compute_s, tp_s, pp_s, dp_s, dp_exposed_s, bubble_s, step_s;
    double bubble_frac; /* (p-1)/(V m + p-1): the share of the step the pipeline idles */
    double tokens;      /* per optimizer step: dp x micro x T x m */
} loom_layout_cost_t;

/* The model and machine a layout is costed on. */
typedef struct {
    const loom_gpt_config_t *cfg; /* finished */
    int T, gpus;
    double global_tokens;  /* target tokens per optimizer step */
    double rate;           /* achieved FLOP/s per GPU (peak x MFU) */
    double act_bytes;      /* 2 at bf16/fp16 (the CUDA backend's ACT tensors), 4 at fp32/tf32 */
    double grad_bytes;     /* 4, or 2 with --grad-dtype bf16 */
    double capacity;       /* bytes of one GPU */
    double runtime;        /* bytes per GPU for context, libraries, workspaces */
    double nvlink_gbs, ib_gbs; /* per direction per GPU, before link_eff */
    int nvlink_domain;     /* GPUs one NVLink fabric joins: 8 (HGX), 2 (H100 NVL pairs) */
    double link_eff, latency_s;
} loom_layout_env_t;

/* Micro-batches per optimizer step that reach e->global_tokens with l's
 * dp x micro (a multiple of pp under interleaving). */
int loom_layout_micro_batches(const loom_layout_env_t *e, const loom_layout_t *l);

/* Memory and time of one layout. */
void loom_layout_cost(const loom_layout_env_t *e, const loom_layout_t *l, loom_layout_cost_t *out);

/* Why a layout was set aside. */
enum {
    LOOM_DISCARD_TP_HEADS,  /* tp does not divide the heads */
    LOOM_DISCARD_TP_DOMAIN, /* tp larger than the NVLink domain */
    LOOM_DISCARD_PP_LAYERS, /* more stages than layers */
    LOOM_DISCARD_VSTAGES,   /* pp x virtual stages does not divide the layers */
    LOOM_DISCARD_BATCH,     /* global batch more than 25% above the target */
    LOOM_DISCARD_MEMORY,    /* does not fit */
    LOOM_DISCARD_SLOWER,    /* fits, but slower than the ones listed */
    LOOM_DISCARD_N
};
const char *loom_layout_discard_name(int why);

#define LOOM_LAYOUT_TOP 5
typedef struct {
    loom_layout_t l;
    loom_layout_cost_t c;
} loom_layout_row_t;
typedef struct {
    loom_layout_row_t top[LOOM_LAYOUT_TOP]; /* fastest first (seconds per token) */
    int ntop;
    long count[LOOM_DISCARD_N];
    loom_layout_row_t example[LOOM_DISCARD_N]; /* the first of each kind (memory: the smallest) */
    long considered;
} loom_layout_search_t;

/* What the user fixed: 0 (tp, pp, micro) or -1 (zero, rc) = search it. */
typedef struct {
    int tp, pp, zero, micro, rc;
    int vs; /* virtual stages: never searched (loom's trainer runs plain 1F1B); 1 unless given */
} loom_layout_fix_t;

/* Every layout with tp x pp x dp = gpus (tp, pp divisors), ZeRO 0-3,
 * micro-batches 1, 2, 4, ... 256 and the three recompute modes. */
void loom_layout_search(const loom_layout_env_t *e, const loom_layout_fix_t *fix, loom_layout_search_t *out);

#endif
