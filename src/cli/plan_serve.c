/* loom plan serve (weights, KV cache, concurrency, decode and prefill
 * floors, replicas; per GPU and per MIG slice) and loom plan mig (the
 * layout that hosts several services, as a table, a mig-parted config or
 * Kubernetes resource requests). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/plan_report.h"
#include "plan/mig.h"
#include "plan/plan.h"

typedef struct {
    plan_model_flags_t mf;
    const char *gpu, *dtype, *table, *mig;
    int clients, prompt, output, json;
} serve_flags_t;

/* Bytes per weight and per KV element for a serving dtype. */
static int serve_bytes(const char *dtype, int C, double *wb, double *kvb, const char **why) {
    if (!strcmp(dtype, "fp32")) *wb = 4, *kvb = 4, *why = "fp32 weights and KV cache";
    else if (!strcmp(dtype, "bf16") || !strcmp(dtype, "fp16")) *wb = 2, *kvb = 2, *why = "16-bit weights and KV cache";
    else if (!strcmp(dtype, "int8")) *wb = 1 + 4.0 / C, *kvb = 2, *why = "int8 weights with one fp32 scale per row of C, bf16 KV cache";
    else return -1;
    return 0;
}

static void serve_rows(plan_report_t *r, const char *key, const char *title, const loom_plan_serve_t *p, int clients) {
    char b[4][32];
    plan_report_section(r, key, title);
    plan_report_num(r, "weights", p->weight_bytes, "weights", "%s", plan_bytes(p->weight_bytes, b[0], 32));
    plan_report_num(r, "kv_per_token", p->kv_per_token, "KV cache per token", "%s (2 x L x kv heads x head size x bytes)", plan_bytes(p->kv_per_token, b[1], 32));
    plan_report_num(r, "kv_per_seq", p->kv_per_seq, "KV cache per sequence", "%s", plan_bytes(p->kv_per_seq, b[2], 32));
    plan_report_num(r, "max_seqs", p->max_seqs, "sequences that fit", "%d", p->max_seqs);
    plan_report_num(r, "decode_step_s", p->decode_step_s, "decode step floor (memory bandwidth)", "%s at %d sequences", plan_duration(p->decode_step_s, b[3], 32), p->seqs);
    plan_report_num(r, "prefill_s", p->prefill_s, "prefill floor per prompt (FLOPs)", "%s", plan_duration(p->prefill_s, b[0], 32));
    plan_report_num(r, "tokens_per_s", p->tokens_per_s, "decode tokens/s bound", "%.0f", p->tokens_per_s);
    plan_report_num(r, "latency_s", p->latency_s, "request latency bound", "%s", plan_duration(p->latency_s, b[1], 32));
    plan_report_num(r, "replicas", p->replicas, "replicas for the clients", "%d for %d concurrent clients", p->replicas, clients);
}

/* Each MIG profile as a replica: memory, bandwidth by memory slices,
 * FLOPs by compute slices. */
static void serve_mig(plan_report_t *r, const serve_flags_t *f, const loom_gpt_config_t *cfg, const loom_gpu_t *g,
                      double wb, double kvb, int col) {
    for (int i = 0; i < g->nprofiles; i++) {
        const loom_mig_profile_t *p = &g->profiles[i];
        if (f->mig && strcasecmp(f->mig, p->name)) continue;
        loom_plan_serve_t s;
        char key[64], title[128];
        snprintf(key, sizeof key, "mig_%s", p->name);
        /* FLOPs scale with the slice's SMs out of the whole GPU's (a 7g
         * A100 slice has 98 of 108), not with compute slices / 7. */
        double share = g->sms > 0 && p->sms > 0 ? (double)p->sms / g->sms : p->compute_slices / 7.0;
        snprintf(title, sizeof title, "per MIG slice %s (%d/8 of the bandwidth, %d of %d SMs of the FLOPs)", p->name, p->memory_slices, p->sms, g->sms);
        if (loom_plan_serve(cfg, wb, kvb, p->memory_gb, g->runtime_mb * 1e6, g->hbm_gbs * p->memory_slices / 8,
                            g->peak_tflops[col] * 1e12 * share, f->clients, f->prompt, f->output, &s) != LOOM_OK) {
            plan_report_section(r, key, title);
            plan_report_str(r, "fits", loom_errmsg(), "does not fit");
            continue;
        }
        serve_rows(r, key, title, &s, f->clients);
    }
}

/* loom plan serve's report; `flags` is a serve_flags_t (plan_command's callback). */
static loom_status plan_serve(void *flags) {
    serve_flags_t *f = flags;
    loom_gpu_table_t t;
    const loom_gpu_t *g;
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_gpu_table_load(&t, f->table));
    loom_status s = plan_gpu_lookup(&t, f->gpu, 0, &g);
    if (s == LOOM_OK) s = plan_model_config(&f->mf, &cfg);
    double wb = 0, kvb = 0;
    const char *why = "";
    if (s == LOOM_OK && serve_bytes(f->dtype, cfg.channels, &wb, &kvb, &why))
        s = loom_error(LOOM_EINVAL, "--dtype %s: serve at fp32, bf16, fp16 or int8", f->dtype);
    if (s == LOOM_OK && (f->clients < 1 || f->prompt < 1 || f->output < 1 || f->prompt + f->output > cfg.max_seq_len))
        s = loom_error(LOOM_EINVAL, "--clients, --prompt and --output must be at least 1, and prompt + output at most the model's context %d", cfg.max_seq_len);
    if (s == LOOM_OK && f->mig && !loom_gpu_profile(g, f->mig))
        s = loom_error(LOOM_EINVAL, "--mig %s: %s has no such MIG profile", f->mig, g->id);
    int col = !strcmp(f->dtype, "int8") ? LOOM_PEAK_INT8 : !strcmp(f->dtype, "fp32") ? LOOM_PEAK_FP32 : LOOM_PEAK_BF16;
    loom_plan_serve_t whole;
    if (s == LOOM_OK && !f->mig)
        s = loom_plan_serve(&cfg, wb, kvb, g->memory_gb, g->runtime_mb * 1e6, g->hbm_gbs, g->peak_tflops[col] * 1e12, f->clients, f->prompt, f->output, &whole);
    if (s != LOOM_OK) {
        loom_gpu_table_free(&t);
        return s;
    }
    plan_report_t r;
    char v[96];
    plan_report_begin(&r, f->json, "serve");
    plan_report_assume(&r, "dtype", f->dtype, why);
    snprintf(v, sizeof v, "%.0f GB/s", g->hbm_gbs);
    plan_report_assume(&r, "memory bandwidth", v, loom_gpu_source(g, "hbm_gbs"));
    snprintf(v, sizeof v, "%.4g TFLOP/s", g->peak_tflops[col]);
    plan_report_assume(&r, "peak", v, loom_gpu_source(g, "peak_tflops"));
    snprintf(v, sizeof v, "%.0f MB", g->runtime_mb);
    plan_report_assume(&r, "runtime per replica", v, loom_gpu_source(g, "runtime_mb"));
    plan_report_assume(&r, "floors", "bounds, not predictions", "decode reads every weight and the batch's KV cache once per step at full bandwidth; prefill runs at peak FLOP/s");
    if (!f->mig) serve_rows(&r, "gpu", g->label, &whole, f->clients);
    if (g->nprofiles) {
        plan_report_assume(&r, "MIG slices", "bandwidth x memory slices / 8, FLOPs x the slice's SMs / the GPU's SMs", loom_gpu_source(g, "mig"));
        serve_mig(&r, f, &cfg, g, wb, kvb, col);
    }
    plan_report_end(&r);
    loom_gpu_table_free(&t);
    return LOOM_OK;
}

int cmd_plan_serve(int argc, char **argv) {
    serve_flags_t f = {0};
    const loom_arg_t args[] = {
        PLAN_MODEL_ARGS(f.mf),
        {"mig", ARG_STR, &f.mig, "", 0, 0, "plan one MIG profile only, e.g. 1g.10gb (default: the whole GPU and every profile)"},
        {"clients", ARG_INT, &f.clients, "64", -1e9, 1e9, "concurrent clients"},
        {"prompt", ARG_INT, &f.prompt, "512", -1e9, 1e9, "prompt tokens per request"},
        {"output", ARG_INT, &f.output, "256", -1e9, 1e9, "generated tokens per request"},
        {"dtype", ARG_STR, &f.dtype, "bf16", 0, 0, "weights: fp32, bf16, fp16, int8"},
        PLAN_GPU_ARGS(f.gpu, f.table, f.json),
    };
    return plan_command("plan serve", "loom plan serve --model gpt2-small --gpu h100-80gb --clients 64 --prompt 512 --output 256 [flags]",
                        args, LOOM_ARGS_COUNT(args), argc, argv, plan_serve, &f);
}
