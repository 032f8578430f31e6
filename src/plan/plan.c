#include "plan.h"

#include <math.h>

#include "parallel/shard.h"
#include "plan/layout.h"

void loom_plan_train_memory(const loom_gpt_config_t *cfg, loom_recompute rc, int zero, int world,
                            int B, int T, int accum, double act_bytes, double runtime_bytes, loom_plan_mem_t *o) {
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t P, lo, hi;
    loom_gpt_param_table(cfg, t, &P);
    /* Rank 0 holds the largest shard (loom_dp_init's layout). */
    loom_dp_shard_range(P, world, 0, &lo, &hi);
    size_t shard = zero >= 1 ? (hi - lo ? hi - lo : 1) : P;
    loom_act_info_t a[LOOM_ACT_MAX];
    int na;
    loom_gpt_act_table(cfg, rc, B, T, a, &na);
    /* ACT tensors at the backend's width (2 bytes at bf16/fp16 on CUDA),
     * statistics and losses at 4. */
    double per_layer = 0, acts = 0;
    for (int i = 0; i < na; i++) {
        double w = a[i].f32 ? 4 : act_bytes;
        acts += (double)a[i].floats * w;
        if (a[i].slices > 1) per_layer += (double)a[i].slice_floats * w;
    }
    size_t BT = (size_t)B * T;
    *o = (loom_plan_mem_t){0};
    o->num_params = P;
    o->shard = shard;
    o->params = 4.0 * P;
    o->grads = 4.0 * P;
    o->optim = 8.0 * shard;
    if (zero == 3) { /* train/zero3.h: shards, and two blocks' weights and gradients plus the shared tensors' gathered */
        double pl, sh;
        loom_layout_split_params(cfg, &pl, &sh);
        o->params = o->grads = 4.0 * shard;
        o->comm = 8.0 * (2 * pl + sh);
    }
    o->acts = acts;
    o->acts_per_layer = per_layer;
    o->batch = 3.0 * 4 * BT;
    o->runtime = runtime_bytes;
    o->device = o->params + o->grads + o->optim + o->master + o->acts + o->batch + o->comm + o->runtime;
    /* Checkpoint writing (src/ckpt/writer.c): rank 0's host copy of the
     * weights and this rank's AdamW shard (m and v), kept between writes
     * by the background writer and written without further copies. */
    o->staging = 4.0 * P + 8.0 * shard;
    /* train.c's host buffers: a step's inputs and targets, one batch for eval. */
    o->host_buffers = 2.0 * 4 * BT * accum + 2.0 * 4 * BT;
    o->host_peak = o->device + o->staging + o->host_buffers;
}

double loom_plan_spot_wall(double work_s, double tau_s, double ckpt_s, double restart_s, double mtbp_s) {
    /* Each segment of tau of work plus its checkpoint is retried until it
     * runs without a preemption; a preemption also costs a restart that
     * can itself be preempted: E[segment] = e^{R/M} M (e^{(tau+C)/M} - 1)
     * (Daly 2006, eq. 7). */
    double M = mtbp_s, segs = work_s / tau_s;
    return segs * exp(restart_s / M) * M * expm1((tau_s + ckpt_s) / M);
}

void loom_plan_spot(double work_s, double ckpt_s, double restart_s, double mtbp_s, loom_plan_spot_t *o) {
    double C = ckpt_s, M = mtbp_s;
    o->young_s = sqrt(2 * C * M);
    /* Daly (2006), eq. 20: the higher-order estimate, valid for C < 2M. */
    o->interval_s = C < 2 * M ? sqrt(2 * C * M) * (1 + sqrt(C / (2 * M)) / 3 + C / (18 * M)) - C : M;
    if (o->interval_s > work_s) o->interval_s = work_s;
    o->wall_s = loom_plan_spot_wall(work_s, o->interval_s, C, restart_s, M);
    o->goodput = work_s / o->wall_s;
    o->preemptions = o->wall_s / M;
}

double loom_plan_allreduce_s(double bytes, int n, double gbs, double latency_s) {
    if (n <= 1 || gbs <= 0) return 0;
    return 2.0 * (n - 1) / n * bytes / (gbs * 1e9) + 2.0 * (n - 1) * latency_s;
}

void loom_plan_step_time(double flops_per_token, double tokens_per_rank_step, int accum, int world, int zero,
                         size_t num_params, double grad_bytes, double flops_per_s, double link_gbs,
                         double latency_s, loom_plan_step_t *o) {
    o->compute_s = flops_per_token * tokens_per_rank_step / flops_per_s;
    double mb = o->compute_s / accum, backward = mb * 2.0 / 3.0; /* backward: 4 of the 6 FLOPs per parameter */
    double ar = loom_plan_allreduce_s(grad_bytes * (double)num_params, world, link_gbs, latency_s);
    double rs = ar / 2, ag = loom_plan_allreduce_s(4.0 * (double)num_params, world, link_gbs, latency_s) / 2;
    /* Reductions overlap the backward that produces them (loom's bucketed
     * hook); ZeRO's parameter all-gather follows AdamW and overlaps nothing. */
    if (zero == 0) {
        o->comm_s = ar;
        o->exposed_s = fmax(0, ar - backward);
    } else if (zero == 1) {
        o->comm_s = rs + ag;
        o->exposed_s = fmax(0, rs - backward) + ag;
    } else if (zero == 2) {
        o->comm_s = accum * rs + ag;
        o->exposed_s = accum * fmax(0, rs - backward) + ag;
    } else {
        /* ZeRO-3 (train/zero3.h): every micro-batch gathers the weights for
         * its forward and again for its backward and reduce-scatters the
         * gradients, each prefetched or issued behind a block's compute. */
        o->comm_s = accum * (2 * ag + rs);
        o->exposed_s = fmax(0, o->comm_s - o->compute_s);
    }
    o->step_s = o->compute_s + o->exposed_s;
}

loom_status loom_plan_serve(const loom_gpt_config_t *cfg, double wbytes, double kvbytes, double mem_gb,
                            double reserve_bytes, double hbm_gbs, double peak_flops, int clients,
                            int prompt, int output, loom_plan_serve_t *o) {
    loom_tensor_info_t t[LOOM_NPARAMS];
    size_t P;
    loom_gpt_param_table(cfg, t, &P);
    *o = (loom_plan_serve_t){0};
    int L = cfg->n_layer, C = cfg->channels, S = prompt + output;
    o->weight_bytes = wbytes * (double)P;
    int KV = cfg->n_kv_heads ? cfg->n_kv_heads : cfg->n_head; /* grouped-query: the cache holds KV heads */
    o->kv_per_token = 2.0 * L * KV * (C / cfg->n_head) * kvbytes;
    o->kv_per_seq = o->kv_per_token * S;
    double free_b = mem_gb * 1e9 - o->weight_bytes - reserve_bytes;
    o->max_seqs = free_b > 0 ? (int)floor(free_b / o->kv_per_seq) : 0;
    if (o->max_seqs < 1)
        return loom_error(LOOM_EINVAL, "%.2f GB of weights and one %d-token sequence (%.2f MB of KV cache) do not fit in %.1f GB",
                          o->weight_bytes / 1e9, S, o->kv_per_seq / 1e6, mem_gb);
    o->seqs = o->max_seqs < clients ? o->max_seqs : clients;
    /* Decode reads every weight once per step and each sequence's KV
     * cache, on average half way through its output. */
    double kv_read = o->seqs * o->kv_per_token * (prompt + output / 2.0);
    o->decode_step_s = (o->weight_bytes + kv_read) / (hbm_gbs * 1e9);
    double n = (double)loom_gpt_num_params(cfg) - (cfg->pos == LOOM_POS_LEARNED ? (double)cfg->max_seq_len * C : 0.0);
    o->prefill_s = (2.0 * n * prompt + 2.0 * L * C * (double)prompt * prompt) / peak_flops;
    o->tokens_per_s = o->seqs / o->decode_step_s;
    o->latency_s = o->prefill_s + output * o->decode_step_s;
    o->replicas = (clients + o->seqs - 1) / o->seqs;
    return LOOM_OK;
}
