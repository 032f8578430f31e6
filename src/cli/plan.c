/* loom plan train: memory per GPU from loom's own tensor tables, the
 * largest micro-batch that fits, step and total time from an MFU (given,
 * measured from a run, or the GPU table's default), communication, GPUs
 * for a deadline, on-demand and spot cost. `loom plan serve` and `loom
 * plan mig` live in plan_serve.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/args.h"
#include "ckpt/hf.h"
#include "cli/commands.h"
#include "ckpt/run.h"
#include "cli/plan_report.h"
#include "cli/stats.h"
#include "obs/metrics_log.h"
#include "parallel/dist.h"
#include "plan/layout.h"
#include "plan/plan.h"

/* --config: a Hugging Face config.json, or the folder holding one. */
static loom_status hf_config_file(const char *path, loom_gpt_config_t *cfg) {
    if (loom_path_is_dir(path)) return loom_hf_read_config(path, cfg);
    char *text;
    size_t len;
    if (loom_file_read(path, &text, &len) != LOOM_OK)
        return loom_error(LOOM_EINVAL, "--config %s: cannot read it; name a Hugging Face config.json or its folder", path);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    loom_status s = j ? loom_hf_config_parse(j, path, cfg) : loom_error(LOOM_EFORMAT, "--config %s: not valid JSON", path);
    cJSON_Delete(j);
    return s;
}

loom_status plan_model_config(const plan_model_flags_t *f, loom_gpt_config_t *cfg) {
    if (f->config && f->config[0]) LOOM_TRY(hf_config_file(f->config, cfg));
    else LOOM_TRY(loom_gpt_preset(cfg, f->model));
    if (f->layers) cfg->n_layer = f->layers;
    if (f->heads) cfg->n_head = f->heads, cfg->n_kv_heads = 0;
    if (f->channels) cfg->channels = f->channels, cfg->ffn_hidden = 0;
    if (f->context) cfg->max_seq_len = f->context;
    if (!cfg->vocab_size || loom_args_given("vocab")) cfg->vocab_size = f->vocab;
    cfg->padded_vocab_size = 0;
    return loom_gpt_config_finish(cfg);
}

loom_status plan_gpu_lookup(const loom_gpu_table_t *t, const char *id, int allow_cpu, const loom_gpu_t **out) {
    *out = NULL;
    if (allow_cpu && !strcasecmp(id, "cpu")) return LOOM_OK;
    if ((*out = loom_gpu_find(t, id))) return LOOM_OK;
    char ids[1024];
    loom_gpu_ids(t, ids, sizeof ids);
    return loom_error(LOOM_EINVAL, "--gpu %s: unknown; known: %s%s (add one to %s)", id, ids, allow_cpu ? ", cpu" : "", t->path);
}

double plan_parse_count(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0) return -1;
    static const char suf[] = "KMBGT";
    static const double mul[] = {1e3, 1e6, 1e9, 1e9, 1e12};
    if (*end) {
        const char *p = strchr(suf, end[0] & ~0x20);
        if (!p || end[1]) return -1;
        v *= mul[p - suf];
    }
    return v;
}

int plan_dtype_column(const char *d) {
    static const char *const n[LOOM_PEAK_N] = {"fp32", "tf32", "bf16", "fp16", "int8"};
    for (int i = 0; i < LOOM_PEAK_N; i++)
        if (!strcmp(d, n[i])) return i;
    return -1;
}

int plan_command(const char *cmd, const char *usage, const loom_arg_t *args, int n, int argc, char **argv,
                 loom_status (*run)(void *flags), void *flags) {
    int r = loom_args_parse(cmd, usage, args, n, argc, argv);
    if (r) return r == 1 ? 0 : 2;
    return loom_exit_report(cmd, run(flags));
}

typedef struct {
    plan_model_flags_t mf;
    const char *gpu, *dtype, *recompute, *tokens, *global_batch, *measured, *preempt, *link, *table;
    int gpus, zero, batch, seq, accum, json, grad_dtype; /* grad_dtype: a loom_dist_dtype */
    int tp, pp, vs; /* tp, pp 0: searched; vs: virtual stages, never searched */
    double mfu, mfu_e2e, price, spot_price, ckpt_s, restart_s, ckpt_gbs, deadline_h, link_eff;
} train_flags_t;

/* What the run folder says: its config and the median step of metrics.jsonl. */
typedef struct {
    int have;
    double step_s, mfu, flops_per_s; /* median over steps after the first; achieved per rank */
    int nsteps, world, B, T, accum;
    char device[64], recompute[16]; /* recompute: what f->recompute points at when the run sets it */
} measured_t;

/* Model shape and step settings from RUN/config.json (the one reader,
 * ckpt/run.h), where the flags left them unset. */
static loom_status read_run_config(const char *run, train_flags_t *f, measured_t *m, loom_gpt_config_t *cfg) {
    loom_run_config_t rc;
    if (loom_run_config_read(run, &rc) != LOOM_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_errmsg());
        return loom_error(LOOM_EINVAL, "--measured %s: %s", run, why);
    }
    *cfg = rc.model_cfg;
    m->B = rc.batch > 0 ? rc.batch : 1, m->T = rc.seq > 0 ? rc.seq : cfg->max_seq_len;
    m->accum = rc.grad_accum, m->world = rc.world_size;
    snprintf(m->device, sizeof m->device, "%s", rc.device[0] ? rc.device : "cpu");
    if (!loom_args_given("zero")) f->zero = rc.zero;
    if (!loom_args_given("gpus")) f->gpus = m->world;
    if (!loom_args_given("batch")) f->batch = m->B;
    if (!loom_args_given("seq")) f->seq = m->T;
    if (!loom_args_given("accum") && !loom_args_given("global-batch")) f->accum = m->accum;
    snprintf(m->recompute, sizeof m->recompute, "%s", rc.recompute);
    if (!loom_args_given("recompute") && m->recompute[0]) f->recompute = m->recompute;
    return LOOM_OK;
}

/* The step times and MFUs of metrics.jsonl, in file order. */
typedef struct {
    double *step_s, *mfu;
    int n, cap;
} steps_t;

static void add_step(void *ctx, const loom_metrics_row_t *r) {
    steps_t *t = ctx;
    if (isnan(r->step_s)) return;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->step_s = realloc(t->step_s, (size_t)t->cap * sizeof *t->step_s);
        t->mfu = realloc(t->mfu, (size_t)t->cap * sizeof *t->mfu);
        if (!t->step_s || !t->mfu) loom_panic(__FILE__, __LINE__, "out of memory reading metrics.jsonl");
    }
    t->step_s[t->n] = r->step_s;
    t->mfu[t->n++] = isnan(r->mfu) ? -1 : r->mfu;
}

/* Median step time and MFU of RUN/metrics.jsonl (the first step, with its
 * one-time allocations, left out when there are more). */
static loom_status read_run_metrics(const char *run, const loom_gpt_config_t *cfg, measured_t *m) {
    char path[4200];
    steps_t t = {0};
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    if (!loom_path_exists(path)) return loom_error(LOOM_EINVAL, "--measured %s: no metrics.jsonl; the run has not taken a step", run);
    LOOM_TRY(loom_metrics_log_scan(path, add_step, &t));
    if (t.n == 0) return loom_error(LOOM_EINVAL, "--measured %s: metrics.jsonl has no step_s lines", run);
    int k = t.n > 1 ? 1 : 0;
    m->nsteps = t.n - k;
    m->step_s = loom_median(t.step_s + k, t.n - k);
    m->mfu = loom_median(t.mfu + k, t.n - k);
    m->flops_per_s = loom_gpt_flops_per_token(cfg, m->T) * (double)m->B * m->T * m->accum / m->step_s;
    m->have = 1;
    free(t.step_s), free(t.mfu);
    return LOOM_OK;
}

/* The trainer's own function (loom_gpt_flops_per_token), so MFU means the same in both. */
static void print_flops_row(plan_report_t *r, const loom_gpt_config_t *cfg, int T) {
    double v = loom_gpt_flops_per_token(cfg, T);
    plan_report_num(r, "flops_per_token", v, "FLOPs per token", "%.4g (6N + 6LCT, N = %.4gM without wpe; the trainer's MFU formula)",
                    v, ((double)loom_gpt_num_params(cfg) - (double)cfg->max_seq_len * cfg->channels) / 1e6);
}

/* The training plan's inputs after resolution. */
typedef struct {
    loom_gpt_config_t cfg;
    const loom_gpu_t *gpu; /* NULL: the CPU */
    int dt, rc, T, B, accum;
    double capacity, runtime, rate; /* bytes per device; bytes; achieved FLOP/s per rank */
    char rate_source[512];
} train_ctx_t;

static double mem_need(const train_ctx_t *c, const train_flags_t *f, int B, loom_plan_mem_t *m) {
    loom_plan_train_memory(&c->cfg, (loom_recompute)c->rc, f->zero, f->gpus, B, c->T, c->accum > 0 ? c->accum : 1,
                           plan_act_bytes(c->gpu != NULL, c->dt), c->runtime, m);
    return c->gpu ? m->device : m->host_peak;
}

/* What would fit instead: more ZeRO, recompute, or a bigger GPU of the table. */
static loom_status no_fit(const train_ctx_t *c, const train_flags_t *f, const loom_gpu_table_t *t, int B, double need) {
    char hint[1024] = "", nb[32], cb[32];
    int k = 0;
    train_ctx_t d = *c;
    train_flags_t g = *f;
    loom_plan_mem_t m;
    if (B > 1 && mem_need(&d, f, 1, &m) <= c->capacity) {
        int lo = 1;
        while (lo < B && mem_need(&d, f, lo + 1, &m) <= c->capacity) lo++;
        k += snprintf(hint + k, sizeof hint - k, "; --batch %d fits", lo);
    }
    if (f->zero < 2) {
        g.zero = 2;
        if (mem_need(&d, &g, 1, &m) <= c->capacity) k += snprintf(hint + k, sizeof hint - k, "; --zero 2 fits");
    }
    g = *f, d.rc = LOOM_RECOMPUTE_ALL;
    if (c->rc != LOOM_RECOMPUTE_ALL && mem_need(&d, &g, 1, &m) <= c->capacity)
        k += snprintf(hint + k, sizeof hint - k, "; --recompute all fits");
    d = *c;
    for (int i = 0; i < t->n && c->gpu; i++) {
        if (mem_need(&d, f, 1, &m) <= t->gpus[i].memory_gb * 1e9 && t->gpus[i].memory_gb > c->gpu->memory_gb)
            k += snprintf(hint + k, sizeof hint - k, "%s%s", strstr(hint, "fits on") ? ", " : "; fits on ", t->gpus[i].id);
    }
    if (!k && c->gpu) { /* nothing listed fits: the deepest model of this width that fits the largest GPU */
        const loom_gpu_t *big = &t->gpus[0];
        for (int i = 1; i < t->n; i++)
            if (t->gpus[i].memory_gb > big->memory_gb) big = &t->gpus[i];
        d = *c;
        d.capacity = big->memory_gb * 1e9;
        int L = c->cfg.n_layer;
        while (L > 1 && (d.cfg.n_layer = --L) && mem_need(&d, f, 1, &m) > d.capacity) {}
        snprintf(hint, sizeof hint, "; nothing in the GPU table fits it; at most %d layers of this width fit on %s", L, big->id);
    }
    return loom_error(LOOM_EINVAL, "does not fit: batch %d x %d needs %s per %s, which has %s%s", B, c->T, plan_bytes(need, nb, 32),
                      c->gpu ? c->gpu->id : "host", plan_bytes(c->capacity, cb, 32), hint);
}

/* Largest micro-batch that fits (or check the given one). */
static loom_status pick_batch(train_ctx_t *c, const train_flags_t *f, const loom_gpu_table_t *t) {
    loom_plan_mem_t m;
    double need = mem_need(c, f, f->batch > 0 ? f->batch : 1, &m);
    if (need > c->capacity) return no_fit(c, f, t, f->batch > 0 ? f->batch : 1, need);
    if (f->batch > 0) {
        c->B = f->batch;
        return LOOM_OK;
    }
    int lo = 1, hi = 2;
    while (hi < (1 << 20) && mem_need(c, f, hi, &m) <= c->capacity) lo = hi, hi *= 2;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (mem_need(c, f, mid, &m) <= c->capacity) lo = mid;
        else hi = mid;
    }
    c->B = lo;
    return LOOM_OK;
}

/* Achieved FLOP/s per rank: measured, --mfu x peak, or the table's default MFU. */
static loom_status pick_rate(train_ctx_t *c, const train_flags_t *f, const measured_t *m, plan_report_t *r) {
    char v[64];
    double peak = c->gpu ? c->gpu->peak_tflops[c->dt] * 1e12 : 0;
    if (m->have && !c->gpu) {
        if (strcmp(m->device, "cpu"))
            return loom_error(LOOM_EINVAL, "--measured %s ran on %s; plan it with --gpu, not --gpu cpu", f->measured, m->device);
        c->rate = m->flops_per_s;
        snprintf(c->rate_source, sizeof c->rate_source, "measured: %s, median step %.4g s over %d steps (first left out)", f->measured, m->step_s, m->nsteps);
    } else if (m->have) {
        if (!strncmp(m->device, "cpu", 3) || m->mfu <= 0)
            return loom_error(LOOM_EINVAL, "--measured %s ran on %s; its MFU does not carry over to %s; pass --mfu", f->measured, m->device, c->gpu->id);
        c->rate = m->mfu * peak;
        snprintf(c->rate_source, sizeof c->rate_source, "measured: %s, median MFU %.3f over %d steps (first left out)", f->measured, m->mfu, m->nsteps);
    } else if (!c->gpu) {
        return loom_error(LOOM_EINVAL, "--gpu cpu: the CPU's rate is not in the GPU table; pass --measured runs/NAME (a run of `loom train` on this machine)");
    } else {
        double mfu = f->mfu_e2e > 0 ? f->mfu_e2e : f->mfu > 0 ? f->mfu : c->gpu->default_mfu;
        c->rate = mfu * peak;
        snprintf(c->rate_source, sizeof c->rate_source, "%s", f->mfu_e2e > 0 ? "--mfu-end-to-end: the measured run's rate, step included; the compute rate is below"
                                                         : f->mfu > 0 ? "--mfu" : loom_gpu_source(c->gpu, "default_mfu"));
    }
    snprintf(v, sizeof v, "%.4g TFLOP/s per %s", c->rate / 1e12, c->gpu ? "GPU" : "rank");
    plan_report_assume(r, "achieved rate", v, c->rate_source);
    if (c->gpu) {
        snprintf(v, sizeof v, "%.4g TFLOP/s (%s)", peak / 1e12, f->dtype);
        plan_report_assume(r, "peak", v, loom_gpu_source(c->gpu, "peak_tflops"));
    }
    return LOOM_OK;
}

/* Per-direction bandwidth of the ring's slowest link, times its efficiency. */
static double link_gbs(const train_ctx_t *c, const train_flags_t *f, int world, plan_report_t *r) {
    if (!c->gpu || world <= 1) return 0;
    const char *l = f->link;
    if (!strcmp(l, "auto")) l = world <= c->gpu->nvlink_domain ? "nvlink" : world <= c->gpu->gpus_per_node ? "pcie" : "ib";
    double bw = !strcmp(l, "nvlink") ? c->gpu->nvlink_gbs : !strcmp(l, "pcie") ? c->gpu->pcie_gbs : c->gpu->ib_gbs;
    if (r) {
        char v[96];
        snprintf(v, sizeof v, "%s %.4g GB/s per direction x efficiency %.2f", l, bw, f->link_eff);
        plan_report_assume(r, "ring link", v, loom_gpu_source(c->gpu, "interconnect"));
        snprintf(v, sizeof v, "%.2f", f->link_eff);
        plan_report_assume(r, "link efficiency", v, "assumption: ring collectives reach about this share of the link's peak (nccl-tests bus bandwidth); set with --link-eff");
    }
    return bw * f->link_eff;
}

static int accum_for(const train_flags_t *f, int B, int T, int world) {
    if (f->accum > 0) return f->accum;
    double g = plan_parse_count(f->global_batch), per = (double)B * T * world;
    int a = (int)ceil(g / per - 1e-9);
    return a < 1 ? 1 : a;
}

static void step_for(const train_ctx_t *c, const train_flags_t *f, int world, int accum, loom_plan_step_t *s) {
    loom_plan_mem_t m;
    mem_need(c, f, c->B, &m);
    double gb = f->grad_dtype == LOOM_DIST_BF16 ? 2 : 4;
    /* Full recompute runs each forward twice: 8ND, not 6ND. */
    double full = c->rc == LOOM_RECOMPUTE_ALL ? 8.0 / 6.0 : 1;
    loom_plan_step_time(loom_gpt_flops_per_token(&c->cfg, c->T) * full, (double)c->B * c->T * accum, accum, world, f->zero,
                        m.num_params, gb, c->rate, link_gbs(c, f, world, NULL), 10e-6, s);
}

static void report_memory(plan_report_t *r, const train_ctx_t *c, const train_flags_t *f) {
    loom_plan_mem_t m;
    char b[8][32];
    mem_need(c, f, c->B, &m);
    plan_report_section(r, "memory", c->gpu ? "memory per GPU (rank 0; loom's tensor tables)" : "memory per process (rank 0; loom's tensor tables)");
    plan_report_num(r, "params", m.params, "weights (fp32 masters)", "%s (%zu floats, padded table%s)", plan_bytes(m.params, b[0], 32), m.num_params,
                    f->zero == 3 ? "; this rank's shard" : "");
    plan_report_num(r, "grads", m.grads, "gradients (fp32)", "%s%s", plan_bytes(m.grads, b[1], 32), f->zero == 2 ? " (whole: backward writes every gradient; the accumulated sum is the shard)" : "");
    plan_report_num(r, "optim", m.optim, "AdamW m and v", "%s (ZeRO-%d%s)", plan_bytes(m.optim, b[2], 32), f->zero, f->zero ? ", this rank's shard" : "");
    plan_report_num(r, "master", m.master, "separate master weights", "0 (the fp32 weights are the masters at %s)", f->dtype);
    plan_report_num(r, "acts", m.acts, "activations", "%s: %s per layer x %d + shared (recompute %s)", plan_bytes(m.acts, b[3], 32),
                    plan_bytes(m.acts_per_layer, b[4], 32), c->cfg.n_layer, loom_recompute_name((loom_recompute)c->rc));
    plan_report_num(r, "batch", m.batch, "token ids, targets, losses", "%s", plan_bytes(m.batch, b[5], 32));
    if (f->zero == 3) plan_report_num(r, "comm", m.comm, "ZeRO-3 gather buffers", "%s (two blocks' weights and gradients, the shared tensors' once each)", plan_bytes(m.comm, b[7], 32));
    else plan_report_num(r, "comm", m.comm, "communication buffers", "0 (gradients reduce in place, in buckets)");
    plan_report_num(r, "runtime", m.runtime, "runtime (context, libraries, workspace)", "%s", plan_bytes(m.runtime, b[6], 32));
    plan_report_num(r, "device", m.device, c->gpu ? "total on the GPU" : "total counted", "%s of %s", plan_bytes(m.device, b[7], 32), plan_bytes(c->capacity, b[0], 32));
    plan_report_num(r, "staging", m.staging, "checkpoint staging (host)", "%s", plan_bytes(m.staging, b[1], 32));
    if (c->gpu) plan_report_num(r, "host", m.staging + m.host_buffers, "host memory beside the runtime", "%s (checkpoint staging, step buffers)", plan_bytes(m.staging + m.host_buffers, b[2], 32));
    else plan_report_num(r, "host_peak", m.host_peak, "peak process memory", "%s (all of the above, staging, step buffers)", plan_bytes(m.host_peak, b[2], 32));
}

/* The same GPU at every ZeRO stage: per-GPU bytes at this micro-batch and
 * the largest micro-batch. Memory does not depend on the dtype in loom
 * (fp32 tensors everywhere; the dtype is the tensor cores' rate). */
static void report_stages(plan_report_t *r, const train_ctx_t *c, const train_flags_t *f, const loom_gpu_table_t *t) {
    plan_report_section(r, "zero_stages", "by ZeRO stage (same micro-batch; the largest that fits)");
    for (int z = 0; z <= 3; z++) {
        train_flags_t g = *f;
        train_ctx_t d = *c;
        loom_plan_mem_t m;
        char key[16], label[64], b[32];
        g.zero = z;
        g.batch = 0;
        double need = mem_need(&d, &g, c->B, &m);
        int fits = pick_batch(&d, &g, t) == LOOM_OK;
        snprintf(key, sizeof key, "zero%d", z);
        snprintf(label, sizeof label, "ZeRO-%d%s", z, z == f->zero ? " (this plan)" : "");
        plan_report_num(r, key, need, label, "%s per GPU at micro-batch %d; the largest that fits: %d", plan_bytes(need, b, 32), c->B, fits ? d.B : 0);
    }
}

static void report_time(plan_report_t *r, const train_ctx_t *c, const train_flags_t *f, double tokens, double *total_s) {
    char b[4][32];
    int accum = accum_for(f, c->B, c->T, f->gpus);
    loom_plan_step_t s;
    step_for(c, f, f->gpus, accum, &s);
    double per_step = (double)c->B * c->T * accum * f->gpus, steps = ceil(tokens / per_step);
    plan_report_section(r, "batch", "batch");
    plan_report_num(r, "micro_batch", c->B, "micro-batch per GPU", "%d x %d tokens%s", c->B, c->T, f->batch > 0 ? "" : " (the largest that fits)");
    plan_report_num(r, "accum", accum, "gradient accumulation", "%d (global batch %.4g tokens)", accum, per_step);
    plan_batch_overshoot(r, per_step, plan_parse_count(f->global_batch), f->gpus, (double)c->B * c->T);
    plan_report_section(r, "time", "time");
    print_flops_row(r, &c->cfg, c->T);
    if (c->gpu) plan_report_num(r, "mfu", c->rate / (c->gpu->peak_tflops[c->dt] * 1e12), "MFU", "%.3f", c->rate / (c->gpu->peak_tflops[c->dt] * 1e12));
    plan_report_num(r, "compute_s", s.compute_s, "compute per step", "%s", plan_duration(s.compute_s, b[0], 32));
    plan_report_num(r, "comm_s", s.comm_s, "communication per step", "%s (%s not hidden behind backward)", plan_duration(s.comm_s, b[1], 32), plan_duration(s.exposed_s, b[2], 32));
    plan_report_num(r, "step_s", s.step_s, "step time", "%s", plan_duration(s.step_s, b[3], 32));
    plan_report_num(r, "steps", steps, "steps", "%.0f for %.4g tokens", steps, tokens);
    *total_s = steps * s.step_s;
    plan_report_num(r, "total_s", *total_s, "total time", "%s", plan_duration(*total_s, b[0], 32));
    plan_report_num(r, "gpu_hours", *total_s / 3600 * f->gpus, "GPU-hours", "%.1f", *total_s / 3600 * f->gpus);
    if (f->deadline_h > 0) {
        int n = 1;
        for (; n <= 65536; n++) {
            int a = accum_for(f, c->B, c->T, n);
            step_for(c, f, n, a, &s);
            if (ceil(tokens / ((double)c->B * c->T * a * n)) * s.step_s <= f->deadline_h * 3600) break;
        }
        plan_report_num(r, "gpus_for_deadline", n > 65536 ? -1 : n, "GPUs to finish in the deadline", n > 65536 ? "more than 65536 (%d)" : "%d", n);
    }
}

/* The preemption rate: "0.1/h", "2/day" or a number per hour. */
static double parse_rate(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0) return -1;
    if (!*end || !strcmp(end, "/h")) return v;
    if (!strcmp(end, "/day") || !strcmp(end, "/d")) return v / 24;
    return -1;
}

static loom_status report_cost(plan_report_t *r, const train_ctx_t *c, const train_flags_t *f, double total_s, double ckpt_s) {
    double price = f->price >= 0 ? f->price : c->gpu ? c->gpu->price : -1;
    double spot = f->spot_price >= 0 ? f->spot_price : c->gpu ? c->gpu->spot_price : -1;
    char v[96], b[2][32];
    plan_report_section(r, "cost", "cost");
    if (price >= 0) {
        snprintf(v, sizeof v, "$%.2f per GPU-hour", price);
        plan_report_assume(r, "on-demand price", v, f->price >= 0 ? "--price" : loom_gpu_source(c->gpu, "price_per_hour"));
        plan_report_num(r, "on_demand", price * f->gpus * total_s / 3600, "on demand", "$%.0f", price * f->gpus * total_s / 3600);
    } else {
        plan_report_str(r, "on_demand_note", "no price in the table for this GPU; pass --price", "on demand");
    }
    if (!f->preempt) return LOOM_OK;
    double rate = parse_rate(f->preempt);
    if (rate <= 0) return loom_error(LOOM_EINVAL, "--preempt-rate %s: write preemptions per hour of one node, e.g. 0.1/h or 2/day", f->preempt);
    int nodes = c->gpu ? (f->gpus + c->gpu->gpus_per_node - 1) / c->gpu->gpus_per_node : 1;
    double M = 3600 / (rate * nodes);
    loom_plan_spot_t sp;
    loom_plan_spot(total_s, ckpt_s, f->restart_s, M, &sp);
    snprintf(v, sizeof v, "%.3g/h per node x %d node%s: one every %s", rate, nodes, nodes == 1 ? "" : "s", plan_duration(M, b[0], 32));
    plan_report_assume(r, "preemptions", v, "--preempt-rate, exponential inter-arrival times");
    plan_report_num(r, "mtbp_s", M, "mean time between preemptions", "%s", plan_duration(M, b[0], 32));
    plan_report_num(r, "young_s", sp.young_s, "checkpoint interval, Young sqrt(2CM)", "%s", plan_duration(sp.young_s, b[0], 32));
    plan_report_num(r, "interval_s", sp.interval_s, "checkpoint interval used (Daly 2006)", "%s", plan_duration(sp.interval_s, b[0], 32));
    plan_report_num(r, "goodput", sp.goodput, "goodput on spot", "%.3f (%.1f expected preemptions)", sp.goodput, sp.preemptions);
    plan_report_num(r, "spot_wall_s", sp.wall_s, "wall time on spot", "%s", plan_duration(sp.wall_s, b[1], 32));
    if (spot >= 0) {
        snprintf(v, sizeof v, "$%.2f per GPU-hour", spot);
        plan_report_assume(r, "spot price", v, f->spot_price >= 0 ? "--spot-price" : loom_gpu_source(c->gpu, "spot_price_per_hour"));
        plan_report_num(r, "spot", spot * f->gpus * sp.wall_s / 3600, "on spot, with rework and restarts", "$%.0f", spot * f->gpus * sp.wall_s / 3600);
    }
    return LOOM_OK;
}

/* Resolve the flags into ctx: table, GPU, model (from flags or --measured), dtype. */
static loom_status train_setup(train_flags_t *f, loom_gpu_table_t *t, train_ctx_t *c, measured_t *m, plan_report_t *r) {
    LOOM_TRY(loom_gpu_table_load(t, f->table));
    LOOM_TRY(plan_gpu_lookup(t, f->gpu, 1, &c->gpu));
    if (f->measured) LOOM_TRY(read_run_config(f->measured, f, m, &c->cfg));
    else LOOM_TRY(plan_model_config(&f->mf, &c->cfg));
    if (f->gpus < 1) return loom_error(LOOM_EINVAL, "--gpus %d: plan at least one GPU", f->gpus);
    if (f->zero < 0 || f->zero > 3) return loom_error(LOOM_EINVAL, "--zero %d: use 0, 1, 2 or 3", f->zero);
    if ((f->tp > 1 || f->pp > 1) && !c->gpu) return loom_error(LOOM_EINVAL, "--tp/--pp: the layout search plans GPUs; pass --gpu");
    if (!f->dtype) f->dtype = c->gpu ? "bf16" : "fp32";
    c->dt = plan_dtype_column(f->dtype);
    if (c->dt < 0 || c->dt == LOOM_PEAK_INT8 || (!c->gpu && c->dt != LOOM_PEAK_FP32))
        return loom_error(LOOM_EINVAL, "--dtype %s: training runs at fp32, tf32, bf16 or fp16 (the CPU: fp32)", f->dtype);
    c->rc = loom_recompute_parse(f->recompute);
    if (c->rc < 0) return loom_error(LOOM_EINVAL, "--recompute %s: use none, gelu or all", f->recompute);
    c->T = f->seq > 0 ? f->seq : c->cfg.max_seq_len;
    if (c->T > c->cfg.max_seq_len) return loom_error(LOOM_EINVAL, "--seq %d is above the model's context of %d", c->T, c->cfg.max_seq_len);
    if (!strcmp(f->global_batch, "") || plan_parse_count(f->global_batch) <= 0)
        return loom_error(LOOM_EINVAL, "--global-batch %s: a token count like 0.5M", f->global_batch);
    if (strcmp(f->link, "auto") && strcmp(f->link, "nvlink") && strcmp(f->link, "pcie") && strcmp(f->link, "ib"))
        return loom_error(LOOM_EINVAL, "--link %s: use auto, nvlink, pcie or ib", f->link);
    char v[96];
    if (c->gpu) {
        c->capacity = c->gpu->memory_gb * 1e9;
        c->runtime = c->gpu->runtime_mb * 1e6;
        snprintf(v, sizeof v, "%.0f MB", c->gpu->runtime_mb);
        plan_report_assume(r, "runtime per GPU", v, loom_gpu_source(c->gpu, "runtime_mb"));
        snprintf(v, sizeof v, "%.0f GB", c->gpu->memory_gb);
        plan_report_assume(r, "GPU memory", v, loom_gpu_source(c->gpu, "memory"));
    } else {
        c->capacity = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        c->runtime = t->cpu_runtime_mb * 1e6;
        snprintf(v, sizeof v, "%.0f MB", t->cpu_runtime_mb);
        plan_report_assume(r, "runtime per process", v, t->cpu_runtime_source);
    }
    c->accum = f->accum > 0 ? f->accum : 1;
    if (f->preempt && parse_rate(f->preempt) <= 0)
        return loom_error(LOOM_EINVAL, "--preempt-rate %s: write preemptions per hour of one node, e.g. 0.1/h or 2/day", f->preempt);
    return LOOM_OK;
}

/* The layout search's inputs from the resolved plan (GPU plans only). */
static void layout_env(const train_ctx_t *c, const train_flags_t *f, loom_layout_env_t *e, loom_layout_fix_t *fix) {
    *e = (loom_layout_env_t){.cfg = &c->cfg, .T = c->T, .gpus = f->gpus, .global_tokens = plan_parse_count(f->global_batch),
                             .rate = c->rate, .act_bytes = plan_act_bytes(1, c->dt), .grad_bytes = f->grad_dtype == LOOM_DIST_BF16 ? 2 : 4,
                             .capacity = c->capacity, .runtime = c->runtime, .nvlink_gbs = c->gpu->nvlink_gbs, .ib_gbs = c->gpu->ib_gbs,
                             .nvlink_domain = c->gpu->nvlink_domain, .link_eff = f->link_eff, .latency_s = 10e-6};
    *fix = (loom_layout_fix_t){.tp = f->tp, .pp = f->pp, .zero = loom_args_given("zero") ? f->zero : -1,
                               .micro = f->batch, .rc = loom_args_given("recompute") ? c->rc : -1, .vs = f->vs};
}

/* --mfu-end-to-end F: F is what a run of the fixed layout measured end to
 * end (model FLOPs / step time / peak), so its step already holds that
 * layout's tp all-reduces, pp transfers, bubble and exposed reductions.
 * Find the compute rate at which the modelled step of that layout equals
 * the measured one, and plan every layout at it. The step falls
 * monotonically with the rate, so rate *= step / target converges. */
static loom_status calibrate_rate(train_ctx_t *c, const train_flags_t *f, loom_layout_env_t *e, const loom_layout_fix_t *fix,
                                  plan_report_t *r) {
    if (!fix->tp || !fix->pp || !fix->micro || fix->zero < 0 || fix->rc < 0)
        return loom_error(LOOM_EINVAL, "--mfu-end-to-end %g names the layout it was measured on: pass --tp, --pp, --batch, --zero and --recompute "
                          "(and --virtual-stages if it ran interleaved)", f->mfu_e2e);
    if (f->gpus % (fix->tp * fix->pp))
        return loom_error(LOOM_EINVAL, "--mfu-end-to-end: --tp %d x --pp %d does not divide --gpus %d", fix->tp, fix->pp, f->gpus);
    double peak = c->gpu->peak_tflops[c->dt] * 1e12;
    loom_layout_t l = {.tp = fix->tp, .pp = fix->pp, .dp = f->gpus / fix->tp / fix->pp, .zero = fix->zero, .vs = fix->vs > 1 ? fix->vs : 1,
                       .micro = fix->micro, .rc = (loom_recompute)fix->rc};
    l.m = loom_layout_micro_batches(e, &l);
    loom_layout_cost_t k;
    e->rate = f->mfu_e2e * peak;
    loom_layout_cost(e, &l, &k);
    double target = k.compute_s; /* the measured step: the model's FLOPs at F x peak */
    for (int i = 0; i < 200 && fabs(k.step_s / target - 1) > 1e-9 && e->rate <= peak; i++) {
        e->rate *= k.step_s / target;
        loom_layout_cost(e, &l, &k);
    }
    if (e->rate > peak || !(k.step_s < target * 1.001))
        return loom_error(LOOM_EINVAL, "--mfu-end-to-end %g: the modelled communication and bubble of tp%d pp%d alone exceed that step; "
                          "the layout or the links differ from the run's (check --tp/--pp/--virtual-stages/--link-eff)", f->mfu_e2e, l.tp, l.pp);
    c->rate = e->rate;
    char v[160];
    snprintf(v, sizeof v, "%.4g TFLOP/s per GPU while computing (MFU %.3f)", e->rate / 1e12, e->rate / peak);
    plan_report_assume(r, "compute rate from --mfu-end-to-end", v, "the rate at which the given layout's modelled step equals the measured one");
    return LOOM_OK;
}

/* No layout fits: the search's reasons, and for data parallel alone what
 * would fit instead (a smaller batch, more ZeRO, recompute, a bigger GPU). */
static loom_status no_layout(train_ctx_t *c, const train_flags_t *f, const loom_gpu_table_t *t, const loom_layout_search_t *ls,
                             const loom_layout_env_t *e) {
    char why[2048];
    plan_layouts_none(ls, e);
    snprintf(why, sizeof why, "%s", loom_errmsg());
    if (f->tp > 1 || f->pp > 1 || f->zero == 3 || pick_batch(c, f, t) == LOOM_OK) return loom_error(LOOM_EINVAL, "%s", why);
    char dp[1024];
    snprintf(dp, sizeof dp, "%s", loom_errmsg());
    return loom_error(LOOM_EINVAL, "%s. Data parallel alone %s", why, dp);
}

/* The data-parallel detail (memory by tensor table, ZeRO stages, time):
 * when the layout is data parallel (ZeRO 0-3) and it fits. */
static loom_status dp_detail(train_ctx_t *c, const train_flags_t *f, const loom_gpu_table_t *t, int searched, int *detail) {
    *detail = 0;
    if (f->tp > 1 || f->pp > 1) return LOOM_OK;
    loom_status s = pick_batch(c, f, t);
    if (s != LOOM_OK && searched) return LOOM_OK; /* the layouts above say what fits */
    *detail = s == LOOM_OK;
    return s;
}

static void report_setup(plan_report_t *r, const train_ctx_t *c, const train_flags_t *f, double tokens) {
    if (!f->tokens) plan_report_assume(r, "tokens", "20 x parameters", "compute-optimal ratio, Hoffmann et al. 2022 (Chinchilla); set with --tokens");
    char gname[96];
    snprintf(gname, sizeof gname, "%d x %s", f->gpus, c->gpu ? c->gpu->label : "CPU process");
    double n = (double)loom_gpt_num_params(&c->cfg);
    plan_report_section(r, "setup", "plan");
    plan_report_str(r, "hardware", gname, "hardware");
    plan_report_num(r, "parameters", n, "model parameters", "%.4gM (%d layers, %d heads, %d channels, context %d, vocabulary %d)",
                    n / 1e6, c->cfg.n_layer, c->cfg.n_head, c->cfg.channels, c->cfg.max_seq_len, c->cfg.vocab_size);
    plan_report_num(r, "tokens_per_param", tokens / n, "tokens per parameter", "%.1f (compute-optimal is about 20)", tokens / n);
}

/* The model as `loom train` takes it: the preset and the overrides given.
 * A Hugging Face config.json has no such flags (train takes the folder's
 * weights with --init-from), so it is left for the user to fill in. */
static const char *train_model_flags(const plan_model_flags_t *mf, char *buf, size_t cap) {
    if (mf->config && *mf->config) {
        snprintf(buf, cap, "MODEL_FLAGS");
        return buf;
    }
    snprintf(buf, cap, "--model %s", mf->model);
    const int v[] = {mf->layers, mf->heads, mf->channels, mf->context};
    const char *k[] = {"layers", "heads", "channels", "context"};
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(buf);
        if (v[i] > 0 && n < cap) snprintf(buf + n, cap - n, " --%s %d", k[i], v[i]);
    }
    return buf;
}

/* loom plan train's report; `flags` is a train_flags_t (plan_command's callback). */
static loom_status plan_train(void *flags) {
    train_flags_t *f = flags;
    loom_gpu_table_t t = {0};
    train_ctx_t c = {0};
    measured_t m = {0};
    plan_report_t r;
    loom_layout_search_t ls = {0};
    plan_report_begin(&r, f->json, "train");
    loom_status s = train_setup(f, &t, &c, &m, &r);
    if (s == LOOM_OK && f->measured) s = read_run_metrics(f->measured, &c.cfg, &m);
    if (s == LOOM_OK) s = pick_rate(&c, f, &m, &r);
    /* The model is only known once setup succeeded (an empty config divides by zero heads). */
    double tokens = f->tokens ? plan_parse_count(f->tokens) : s == LOOM_OK ? 20.0 * (double)loom_gpt_num_params(&c.cfg) : 0;
    if (s == LOOM_OK && tokens <= 0) s = loom_error(LOOM_EINVAL, "--tokens %s: a token count like 30B or 2.5e9", f->tokens);
    loom_layout_env_t env;
    loom_layout_fix_t fix;
    if (s == LOOM_OK && c.gpu) {
        layout_env(&c, f, &env, &fix);
        if (f->mfu_e2e > 0) s = calibrate_rate(&c, f, &env, &fix, &r);
    }
    if (s == LOOM_OK && c.gpu) {
        loom_layout_search(&env, &fix, &ls);
        if (!ls.ntop) s = no_layout(&c, f, &t, &ls, &env);
    }
    int detail = 0;
    if (s == LOOM_OK) s = dp_detail(&c, f, &t, c.gpu != NULL, &detail);
    if (detail) c.accum = accum_for(f, c.B, c.T, f->gpus);
    if (s != LOOM_OK) {
        plan_report_discard(&r);
        loom_gpu_table_free(&t);
        return s;
    }
    report_setup(&r, &c, f, tokens);
    char model[256];
    if (c.gpu) plan_report_layouts(&r, &ls, &env, f->dtype, train_model_flags(&f->mf, model, sizeof model));
    double total_s, shard = 0;
    if (detail) {
        link_gbs(&c, f, f->gpus, &r);
        report_memory(&r, &c, f);
        report_stages(&r, &c, f, &t);
        report_time(&r, &c, f, tokens, &total_s);
        loom_plan_mem_t mem;
        mem_need(&c, f, c.B, &mem);
        shard = 8.0 * mem.shard + 4.0 * mem.num_params;
    } else {
        total_s = plan_layout_time(&r, &ls.top[0], tokens, f->gpus);
        shard = ls.top[0].c.params + ls.top[0].c.optim;
    }
    double ckpt_s = f->ckpt_s > 0 ? f->ckpt_s : shard / (f->ckpt_gbs * 1e9);
    char v[96];
    snprintf(v, sizeof v, "%.3g s", ckpt_s);
    plan_report_assume(&r, "checkpoint time C", v, f->ckpt_s > 0 ? "--ckpt-s" : "this rank's weights and AdamW state at --ckpt-gbs (assumption: 1 GB/s to storage)");
    snprintf(v, sizeof v, "%.3g s", f->restart_s);
    plan_report_assume(&r, "restart time R", v, "--restart-s (assumption: 300 s to get a node back and load the checkpoint)");
    s = report_cost(&r, &c, f, total_s, ckpt_s);
    if (s == LOOM_OK) plan_report_end(&r);
    else plan_report_discard(&r);
    loom_gpu_table_free(&t);
    return s;
}

static int cmd_plan_train(int argc, char **argv) {
    train_flags_t f = {.mf.vocab = 50257, .price = -1, .spot_price = -1};
    const loom_arg_t args[] = {
        PLAN_MODEL_ARGS(f.mf),
        {"tokens", ARG_STR, &f.tokens, "", 0, 0, "tokens to train on, e.g. 30B (default: 20 per parameter)"},
        {"gpus", ARG_INT, &f.gpus, "1", -1e9, 1e9, "GPUs (data-parallel ranks)"},
        {"dtype", ARG_STR, &f.dtype, "", 0, 0, "matrix precision: fp32, tf32, bf16, fp16 (default bf16 on a GPU, fp32 on the CPU)"},
        {"zero", ARG_INT, &f.zero, "0", 0, 3, "ZeRO stage of the data-parallel plan; given, it also fixes the layout search's"},
        {"tp", ARG_INT, &f.tp, "0", 0, 1 << 20, "tensor-parallel size for the layout search (0 = search)"},
        {"pp", ARG_INT, &f.pp, "0", 0, 1 << 20, "pipeline stages for the layout search (0 = search)"},
        {"recompute", ARG_STR, &f.recompute, "none", 0, 0, "activation recompute: none, gelu, all"},
        {"batch", ARG_INT, &f.batch, "0", 0, 1 << 20, "micro-batch per GPU (0 = the largest that fits)"},
        loom_flag(LOOM_FLAG_SEQ, &f.seq),
        {"accum", ARG_INT, &f.accum, "0", 0, 1 << 20, "gradient accumulation steps (0 = from --global-batch)"},
        {"global-batch", ARG_STR, &f.global_batch, "0.5M", 0, 0, "target tokens per optimizer step"},
        loom_flag(LOOM_FLAG_GRAD_DTYPE, &f.grad_dtype),
        {"mfu", ARG_FLOAT, &f.mfu, "0", 0, 1, "MFU of the math while the GPUs compute, as a data-parallel run measures it; tp, pp, bubble and exposed reductions are added (0 = the GPU table's default; docs/planning.md)"},
        {"mfu-end-to-end", ARG_FLOAT, &f.mfu_e2e, "0", 0, 1, "MFU a run of the layout fixed by --tp/--pp/--batch/--zero/--recompute measured end to end (e.g. a published throughput / peak); the compute rate is derived from it"},
        {"virtual-stages", ARG_INT, &f.vs, "1", 1, 1 << 10, "model chunks per pipeline stage: Megatron's interleaved 1F1B (bubble (p-1)/(V m)); loom's trainer runs 1"},
        {"measured", ARG_STR, &f.measured, "", 0, 0, "run folder of `loom train`: its config, and its median step for the rate"},
        {"link", ARG_STR, &f.link, "auto", 0, 0, "ring link: auto (NVLink within a node, InfiniBand across), nvlink, pcie, ib"},
        {"link-eff", ARG_FLOAT, &f.link_eff, "0.8", 0.01, 1, "share of the link's peak that ring collectives reach"},
        {"price", ARG_FLOAT, &f.price, "", 0, 1e6, "on-demand USD per GPU-hour (default: the GPU table's)"},
        {"spot-price", ARG_FLOAT, &f.spot_price, "", 0, 1e6, "spot USD per GPU-hour"},
        {"preempt-rate", ARG_STR, &f.preempt, "", 0, 0, "spot preemptions per node-hour, e.g. 0.1/h"},
        {"ckpt-s", ARG_FLOAT, &f.ckpt_s, "0", 0, 1e9, "seconds to write a checkpoint (0 = its size at --ckpt-gbs)"},
        {"ckpt-gbs", ARG_FLOAT, &f.ckpt_gbs, "1", 0.001, 1e6, "checkpoint write bandwidth, GB/s"},
        {"restart-s", ARG_FLOAT, &f.restart_s, "300", 0, 1e9, "seconds to restart after a preemption"},
        {"deadline-h", ARG_FLOAT, &f.deadline_h, "0", 0, 1e9, "hours: also say how many GPUs finish by then"},
        PLAN_GPU_ARGS(f.gpu, f.table, f.json),
    };
    return plan_command("plan train", "loom plan train --model gpt2-xl --tokens 30B --gpu a100-80gb --gpus 8 [flags]",
                        args, LOOM_ARGS_COUNT(args), argc, argv, plan_train, &f);
}

int cmd_plan(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "train")) return cmd_plan_train(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "serve")) return cmd_plan_serve(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "mig")) return cmd_plan_mig(argc - 1, argv + 1);
    FILE *out = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) ? stdout : stderr;
    fprintf(out, "usage: loom plan train|serve|mig [flags]   (loom plan train --help lists the flags)\n"
                 "  train  memory per GPU, micro-batch, step and total time, GPUs for a deadline, on-demand and spot cost\n"
                 "  serve  weights and KV cache, concurrent sequences, decode and prefill floors, replicas\n"
                 "  mig    the MIG layout that hosts several services, as a table, mig-parted config or Kubernetes requests\n");
    if (out == stderr && argc >= 1) fprintf(stderr, "loom plan: unknown plan '%s'\n", argv[0]);
    return out == stdout ? 0 : 2;
}
