/* plan: memory, time and cost of training and serving a loom model, from
 * loom's own tensor tables (model/gpt.h: the parameter table and the
 * activation layout; parallel/shard.h: the ZeRO shard layout) and the trainer's
 * FLOPs-per-token formula, so that the plan and the trainer cannot drift.
 * docs/planning.md gives every formula with its source. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "model/gpt.h"
#include "plan/gpus.h"

/* Memory of one rank (the largest: rank 0), in bytes. "Device" is the
 * GPU's memory, or the host's on the CPU. */
typedef struct {
    double params;     /* the fp32 parameter block (loom keeps fp32 masters at every dtype) */
    double grads;      /* the fp32 gradient block, whole at every ZeRO stage (backward writes it) */
    double optim;      /* AdamW m and v: whole (ZeRO 0) or this rank's shard */
    double master;     /* a separate master copy: 0, the parameters are the masters */
    double acts;       /* the activation block, loom_gpt_act_table, at its widths */
    double acts_per_layer; /* of which one block keeps (times L in acts) */
    double batch;      /* token and target ids (device) and per-position losses (host) */
    double comm;       /* separate communication buffers: 0, gradients reduce in place */
    double runtime;    /* code, libraries, context, workspaces (GPU table / measured CPU figure) */
    double device;     /* params + grads + optim + acts + batch + comm + runtime */
    double staging;    /* checkpoint staging on the host: 4P copy of the weights + 8 x shard of AdamW */
    double host_buffers; /* the trainer's host token buffers for one step */
    double host_peak;  /* CPU: device + staging + host buffers */
    size_t num_params; /* floats in the parameter block */
    size_t shard;      /* floats of this rank's AdamW shard */
} loom_plan_mem_t;

/* Memory of rank 0 for a config (cfg finished: padded vocab set);
 * act_bytes: the width of ACT tensors, 4 on the CPU and at fp32/tf32, 2
 * at bf16/fp16 on CUDA. */
void loom_plan_train_memory(const loom_gpt_config_t *cfg, loom_recompute rc, int zero, int world,
                            int B, int T, int accum, double act_bytes, double runtime_bytes, loom_plan_mem_t *out);

/* Spot training under exponential preemptions with mean time between
 * preemptions M, checkpoint write time C and restart time R, for `work_s`
 * seconds of useful compute. */
typedef struct {
    double young_s;    /* Young (1974): sqrt(2 C M) */
    double interval_s; /* Daly (2006) higher-order optimum: the interval used */
    double wall_s;     /* expected wall time: (W/tau) e^{R/M} M (e^{(tau+C)/M} - 1) */
    double goodput;    /* work_s / wall_s */
    double preemptions;/* expected: wall_s / M */
} loom_plan_spot_t;
void loom_plan_spot(double work_s, double ckpt_s, double restart_s, double mtbp_s, loom_plan_spot_t *out);
/* Expected wall time for `work_s` of compute with a checkpoint every tau_s
 * (the closed form above; the test checks it against a simulation). */
double loom_plan_spot_wall(double work_s, double tau_s, double ckpt_s, double restart_s, double mtbp_s);

/* Seconds of a ring all-reduce of `bytes` over n ranks at `gbs` GB/s per
 * direction: 2 (n-1)/n bytes / bw (Patarasuk & Yuan 2009) plus 2 (n-1)
 * hops of latency_s. Reduce-scatter and all-gather are half of it each. */
double loom_plan_allreduce_s(double bytes, int n, double gbs, double latency_s);

/* Step time of data-parallel training. */
typedef struct {
    double compute_s;  /* accum micro-batches of forward + backward + AdamW */
    double comm_s;     /* all collectives of a step */
    double exposed_s;  /* communication not hidden behind backward */
    double step_s;     /* compute_s + exposed_s */
} loom_plan_step_t;
/* flops_per_s: achieved FLOP/s of one rank (peak x MFU, or measured);
 * link_gbs: per-direction bandwidth of the slowest link in the ring
 * (already times its efficiency); grad_bytes per element 4 (fp32) or 2. */
void loom_plan_step_time(double flops_per_token, double tokens_per_rank_step, int accum, int world, int zero,
                         size_t num_params, double grad_bytes, double flops_per_s, double link_gbs,
                         double latency_s, loom_plan_step_t *out);

/* Serving one model replica on `mem_gb` of memory at `hbm_gbs`. */
typedef struct {
    double weight_bytes;   /* parameters at the serving dtype */
    double kv_per_token;   /* 2 (K and V) x L x C x bytes of the KV dtype */
    double kv_per_seq;     /* kv_per_token x (prompt + output) */
    int max_seqs;          /* sequences of prompt+output that fit beside the weights */
    int seqs;              /* min(max_seqs, clients) running at once per replica */
    double decode_step_s;  /* floor: (weights + KV read) / bandwidth for `seqs` sequences */
    double prefill_s;      /* floor for one prompt: 2 N prompt + attention FLOPs / peak */
    double tokens_per_s;   /* seqs / decode_step_s */
    double latency_s;      /* prefill_s + output x decode_step_s, one request */
    int replicas;          /* to serve `clients` at once */
} loom_plan_serve_t;
/* wbytes: bytes per weight (4 fp32, 2 bf16, 1 int8 plus a scale per row);
 * kvbytes: bytes per KV element. */
loom_status loom_plan_serve(const loom_gpt_config_t *cfg, double wbytes, double kvbytes, double mem_gb,
                            double reserve_bytes, double hbm_gbs, double peak_flops, int clients,
                            int prompt, int output, loom_plan_serve_t *out);

#endif
