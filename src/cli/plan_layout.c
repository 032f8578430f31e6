/* loom plan train's layout section: the fastest layouts the search found
 * (src/plan/layout.c), each with memory per GPU and time per step broken
 * into compute, tp, pp, dp and the pipeline bubble, and why the others
 * were set aside. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/plan_report.h"

double plan_act_bytes(int gpu, int dt) { return gpu && (dt == LOOM_PEAK_BF16 || dt == LOOM_PEAK_FP16) ? 2 : 4; }

void plan_batch_overshoot(plan_report_t *r, double tokens, double target, int gpus, double micro_tokens) {
    if (tokens <= 1.25 * target) return;
    plan_report_num(r, "global_batch_over", tokens / target, "global batch ABOVE the target",
                    "%.4g tokens per step is %.1fx --global-batch %.4g: %d GPUs x %.4g tokens per micro-batch; "
                    "use fewer GPUs, a shorter --seq, or raise --global-batch",
                    tokens, tokens / target, target, gpus, micro_tokens);
}

static const char *rc_name(loom_recompute rc) { return loom_recompute_name(rc); }

static void layout_name(const loom_layout_t *l, char *buf, size_t cap) {
    char v[16] = "";
    if (l->vs > 1) snprintf(v, sizeof v, "v%d ", l->vs);
    snprintf(buf, cap, "tp%d pp%d %sdp%d zero%d mb%d x%d %s", l->tp, l->pp, v, l->dp, l->zero, l->micro, l->m, rc_name(l->rc));
}

loom_status plan_layouts_none(const loom_layout_search_t *s, const loom_layout_env_t *e) {
    char why[2048] = "", name[96], b[2][32];
    int k = 0;
    for (int i = 0; i < LOOM_DISCARD_SLOWER; i++) {
        if (!s->count[i]) continue;
        const loom_layout_row_t *x = &s->example[i];
        layout_name(&x->l, name, sizeof name);
        k += snprintf(why + k, sizeof why - (size_t)k, "; %ld %s (e.g. %s", s->count[i], loom_layout_discard_name(i), name);
        if (i == LOOM_DISCARD_MEMORY)
            k += snprintf(why + k, sizeof why - (size_t)k, ": %s per GPU of %s", plan_bytes(x->c.mem, b[0], 32), plan_bytes(e->capacity, b[1], 32));
        if (i == LOOM_DISCARD_BATCH) k += snprintf(why + k, sizeof why - (size_t)k, ": %.4g tokens per step", x->c.tokens);
        k += snprintf(why + k, sizeof why - (size_t)k, ")");
        if (k >= (int)sizeof why) break;
    }
    return loom_error(LOOM_EINVAL, "no layout of %d GPUs fits and meets --global-batch %.4g%s; try more GPUs, a GPU with more memory, "
                      "a larger --global-batch, or leave --tp/--pp/--zero/--batch to the search", e->gpus, e->global_tokens, why);
}

/* What keeps loom's trainer from running a layout today, every reason
 * joined by "; " into buf (empty: it runs it), as of the trainer's own
 * checks: src/train/setup_tp.c (--tp takes --zero 0; every dtype,
 * parallel/tp.c), src/train/setup.c build_pipeline (--pp takes neither
 * --zero nor --tp), and its 1F1B, never interleaved. */
static const char *not_runnable(const loom_layout_t *l, char *buf, size_t cap) {
    const int hit[] = {l->vs > 1, l->tp > 1 && l->pp > 1, l->tp > 1 && l->zero, l->pp > 1 && l->zero};
    const char *why[] = {"interleaved 1F1B (--virtual-stages): loom's trainer runs plain 1F1B", "tp x pp: --pp with --tp is not built yet",
                         "tp with ZeRO: --tp takes --zero 0 only for now", "pp with ZeRO: --pp takes --zero 0 only for now"};
    buf[0] = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(buf);
        if (hit[i] && n < cap) snprintf(buf + n, cap - n, "%s%s", n ? "; " : "", why[i]);
    }
    return buf[0] ? buf : NULL;
}

/* The `loom train` line that runs layout l: --nproc inside one NVLink
 * domain (one node), mpirun across nodes (docs/dist.md, Launching). */
static void train_command(const loom_layout_row_t *x, const loom_layout_env_t *e, const char *dtype, const char *model, char *buf, size_t cap) {
    const loom_layout_t *l = &x->l;
    int n = l->tp * l->pp * l->dp, k;
    if (n <= e->nvlink_domain) k = snprintf(buf, cap, "loom train --nproc %d", n);
    else k = snprintf(buf, cap, "mpirun -np %d loom train", n);
    if (k < 0 || (size_t)k >= cap) return;
    k += snprintf(buf + k, cap - (size_t)k, " --device cuda --data DATA --out runs/NAME %s --seq %d --dtype %s", model, e->T, dtype);
    if (l->tp > 1 && (size_t)k < cap) k += snprintf(buf + k, cap - (size_t)k, " --tp %d", l->tp);
    if (l->pp > 1 && (size_t)k < cap) k += snprintf(buf + k, cap - (size_t)k, " --pp %d", l->pp);
    if ((size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, " --zero %d --batch %d --grad-accum %d --recompute %s", l->zero, l->micro, l->m, rc_name(l->rc));
}

static cJSON *row_json(const loom_layout_row_t *x) {
    cJSON *o = cJSON_CreateObject();
    const int iv[] = {x->l.tp, x->l.pp, x->l.dp, x->l.zero, x->l.micro, x->l.m, x->l.vs};
    const char *ik[] = {"tp", "pp", "dp", "zero", "micro_batch", "micro_batches", "virtual_stages"};
    for (int i = 0; i < 7; i++) cJSON_AddNumberToObject(o, ik[i], iv[i]);
    cJSON_AddStringToObject(o, "recompute", rc_name(x->l.rc));
    const double dv[] = {x->c.mem, x->c.params, x->c.grads, x->c.optim, x->c.gather, x->c.acts, x->c.step_s, x->c.compute_s,
                         x->c.tp_s, x->c.pp_s, x->c.dp_s, x->c.dp_exposed_s, x->c.bubble_s, x->c.bubble_frac, x->c.tokens};
    const char *dk[] = {"mem", "params", "grads", "optim", "gather", "acts", "step_s", "compute_s",
                        "tp_s", "pp_s", "dp_s", "dp_exposed_s", "bubble_s", "bubble_frac", "tokens_per_step"};
    for (int i = 0; i < 15; i++) cJSON_AddNumberToObject(o, dk[i], dv[i]);
    return o;
}

static void print_row(int rank, const loom_layout_row_t *x) {
    char name[96], b[32];
    layout_name(&x->l, name, sizeof name);
    printf("  %d. %-36s %9s %8.3g s %8.3g %7.3g %7.3g %7.3g %7.3g (%.1f%%) %9.4g\n", rank, name, plan_bytes(x->c.mem, b, 32), x->c.step_s,
           x->c.compute_s, x->c.tp_s, x->c.pp_s, x->c.dp_exposed_s, x->c.bubble_s, 100 * x->c.bubble_frac, x->c.tokens);
}

/* Each listed layout's `loom train` line, or why the trainer does not run
 * it yet; in the JSON as the rows' "command" / "not_runnable". */
static void report_commands(plan_report_t *r, const loom_layout_search_t *s, const loom_layout_env_t *e, const char *dtype, const char *model) {
    cJSON *arr = cJSON_GetObjectItem(r->root, "layouts");
    if (!r->json) printf("\n  to run them (docs/dist.md):\n");
    for (int i = 0; i < s->ntop; i++) {
        char cmd[1024], reasons[512];
        const char *why = not_runnable(&s->top[i].l, reasons, sizeof reasons);
        train_command(&s->top[i], e, dtype, model, cmd, sizeof cmd);
        cJSON *o = cJSON_GetArrayItem(arr, i);
        cJSON_AddStringToObject(o, why ? "not_runnable" : "command", why ? why : cmd);
        if (!r->json) printf("  %d. %s%s\n", i + 1, why ? "modelled, not runnable yet: " : "", why ? why : cmd);
    }
    if (!r->json)
        printf("  (--tp, --pp and --zero 3 train on CPU ranks, checked against one process; their CUDA/NCCL paths are compiled, "
               "not yet run on a GPU)\n");
}

void plan_report_layouts(plan_report_t *r, const loom_layout_search_t *s, const loom_layout_env_t *e, const char *dtype, const char *model) {
    cJSON *root = r->root, *arr = cJSON_AddArrayToObject(root, "layouts"), *dis = cJSON_AddArrayToObject(root, "discarded");
    for (int i = 0; i < s->ntop; i++) cJSON_AddItemToArray(arr, row_json(&s->top[i]));
    if (!r->json) {
        printf("\nlayouts (fastest per token first, of %ld considered; memory per GPU on the fullest stage)\n", s->considered);
        printf("     %-36s %9s %10s %8s %7s %7s %7s %7s %9s\n", "tp pp dp zero micro-batch x count recompute", "memory", "step",
               "compute", "tp", "pp", "dp", "bubble", "tokens");
        for (int i = 0; i < s->ntop; i++) print_row(i + 1, &s->top[i]);
        printf("  (seconds per step; dp: what the reductions leave exposed; activations at %g bytes (%s))\n", e->act_bytes, dtype);
    }
    report_commands(r, s, e, dtype, model);
    if (!r->json) printf("\ndiscarded\n");
    char name[96], b[2][32];
    for (int i = 0; i < LOOM_DISCARD_N; i++) {
        if (!s->count[i]) continue;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "why", loom_layout_discard_name(i));
        cJSON_AddNumberToObject(d, "count", (double)s->count[i]);
        if (i != LOOM_DISCARD_SLOWER) cJSON_AddItemToObject(d, "example", row_json(&s->example[i]));
        cJSON_AddItemToArray(dis, d);
        if (r->json) continue;
        layout_name(&s->example[i].l, name, sizeof name);
        if (i == LOOM_DISCARD_MEMORY)
            printf("  %6ld %s (the smallest: %s, %s of %s)\n", s->count[i], loom_layout_discard_name(i), name,
                   plan_bytes(s->example[i].c.mem, b[0], 32), plan_bytes(e->capacity, b[1], 32));
        else if (i == LOOM_DISCARD_BATCH)
            printf("  %6ld %s (e.g. %s: %.4g tokens per step)\n", s->count[i], loom_layout_discard_name(i), name, s->example[i].c.tokens);
        else if (i == LOOM_DISCARD_SLOWER)
            printf("  %6ld %s\n", s->count[i], loom_layout_discard_name(i));
        else
            printf("  %6ld %s (e.g. tp%d pp%d)\n", s->count[i], loom_layout_discard_name(i), s->example[i].l.tp, s->example[i].l.pp);
    }
}

double plan_layout_time(plan_report_t *r, const loom_layout_row_t *best, double tokens, int gpus) {
    char b[2][32];
    double steps = ceil(tokens / best->c.tokens), total = steps * best->c.step_s;
    plan_report_section(r, "time", "time (the fastest layout)");
    plan_report_num(r, "step_s", best->c.step_s, "step time", "%s", plan_duration(best->c.step_s, b[0], 32));
    plan_report_num(r, "steps", steps, "steps", "%.0f for %.4g tokens", steps, tokens);
    plan_report_num(r, "total_s", total, "total time", "%s", plan_duration(total, b[1], 32));
    plan_report_num(r, "gpu_hours", total / 3600 * gpus, "GPU-hours", "%.1f", total / 3600 * gpus);
    return total;
}
