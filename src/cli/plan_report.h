/* plan_report: one code path for `loom plan`'s two outputs, a readable
 * table (sections of labelled rows, then the assumptions with their
 * sources) or, with --json, one JSON object with the same keys. */
#ifndef LOOM_PLAN_REPORT_H
#define LOOM_PLAN_REPORT_H

#include "cli/args.h"
#include "model/gpt.h"
#include "plan/gpus.h"

typedef struct {
    void *root, *sec, *assume; /* cJSON */
    int json;
} plan_report_t;

void plan_report_begin(plan_report_t *r, int json, const char *kind);
/* Start section `key`, titled `title` in the table. */
void plan_report_section(plan_report_t *r, const char *key, const char *title);
/* A number under `key` (JSON) shown as `label` and the formatted text. */
void plan_report_num(plan_report_t *r, const char *key, double v, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void plan_report_str(plan_report_t *r, const char *key, const char *v, const char *label);
/* An assumption: what, its value as text, where it came from. */
void plan_report_assume(plan_report_t *r, const char *what, const char *value, const char *source);
/* Print the JSON (or the assumptions, for the table) and free. */
void plan_report_end(plan_report_t *r);
/* Free without printing (after an error). */
void plan_report_discard(plan_report_t *r);
/* "1.23 GB", "45.6 MB", "812 kB" (10^3 units). */
const char *plan_bytes(double b, char *buf, int cap);
/* "3.2 days", "5.1 h", "12 min", "0.42 s". */
const char *plan_duration(double s, char *buf, int cap);

#endif

/* ---- shared by the three `loom plan` subcommands (src/cli/plan*.c) ---- */

/* Model flags: a preset and overrides (0 = the preset's). */
typedef struct {
    const char *model, *config;
    int layers, heads, channels, context, vocab;
} plan_model_flags_t;
/* Their rows of a loom_arg_t table (cli/args.h). */
#define PLAN_MODEL_ARGS(mf)                                                                                           \
    {"model", ARG_STR, &(mf).model, "gpt2-small", 0, 0, "preset: gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, " \
     "llama-tiny, smollm2-135m, llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b, mistral-7b"},                                 \
    {"config", ARG_STR, &(mf).config, "", 0, 0, "a Hugging Face config.json (or its folder) instead of --model"},       \
    {"layers", ARG_INT, &(mf).layers, "0", 0, 1024, "override the preset's layer count"},                              \
    {"heads", ARG_INT, &(mf).heads, "0", 0, 1024, "override the preset's head count"},                                 \
    {"channels", ARG_INT, &(mf).channels, "0", 0, 65536, "override the preset's width"},                               \
    {"context", ARG_INT, &(mf).context, "0", 0, 1 << 20, "override the preset's context length"},                      \
    {"vocab", ARG_INT, &(mf).vocab, "50257", 2, 1 << 30, "vocabulary size (the tokenizer's; default: the preset's, else 50257)"}
/* The rows every `loom plan` subcommand takes: --gpu, --gpu-table and --json. */
#define PLAN_GPU_ARGS(gpu, table, json)                                                                               \
    {"gpu", ARG_STR, &(gpu), "a100-80gb", 0, 0, "GPU id from the GPU table (plan train also takes cpu)"},             \
    {"gpu-table", ARG_STR, &(table), "", 0, 0, "GPU table JSON (default: $LOOM_GPU_TABLE or the installed gpus.json)"},  \
    {"json", ARG_BOOL, &(json), "0", 0, 0, "print JSON instead of the table"}
/* The finished config, or a one-line error naming the bad flag. */
loom_status plan_model_config(const plan_model_flags_t *f, loom_gpt_config_t *cfg);
/* The GPU with id `id` from `t`, or LOOM_EINVAL listing the known ones. */
loom_status plan_gpu_lookup(const loom_gpu_table_t *t, const char *id, int allow_cpu, const loom_gpu_t **out);
/* "2.5B" -> 2.5e9 (K, M, B or G, T suffixes); -1 when not a count. */
double plan_parse_count(const char *s);
/* Peak-table column for a dtype name, -1 if unknown. */
int plan_dtype_column(const char *dtype);
/* A `loom plan` subcommand's whole CLI: parse argv against args (n rows),
 * then run(flags); an error is printed as "loom CMD: message". Returns the
 * exit code (0 after --help, 2 for a bad flag, else loom_exit_code). */
int plan_command(const char *cmd, const char *usage, const loom_arg_t *args, int n, int argc, char **argv,
                 loom_status (*run)(void *flags), void *flags);
int cmd_plan_serve(int argc, char **argv);
int cmd_plan_mig(int argc, char **argv);

/* ---- the layout search's report (src/cli/plan_layout.c) ---- */
#include "plan/layout.h"
/* Bytes of an ACT tensor: 2 on a GPU at bf16/fp16 (the CUDA backend's
 * activation width), 4 otherwise. dt: a peak-table column. */
double plan_act_bytes(int gpu, int dt);
/* A warning row when a step's tokens overshoot --global-batch by more than
 * 25% (even one micro-batch per rank is more than the target). */
void plan_batch_overshoot(plan_report_t *r, double tokens, double target, int gpus, double micro_tokens);
/* The error when no layout fits, naming why each kind was set aside. */
loom_status plan_layouts_none(const loom_layout_search_t *s, const loom_layout_env_t *e);
/* The "layouts" section: the fastest few, the `loom train` line of each
 * (model: its flags, e.g. "--model gpt2-xl") or why loom does not run it
 * yet, and why the others were set aside. */
void plan_report_layouts(plan_report_t *r, const loom_layout_search_t *s, const loom_layout_env_t *e, const char *dtype, const char *model);
/* Steps and total time of the best layout for `tokens`; returns seconds. */
double plan_layout_time(plan_report_t *r, const loom_layout_row_t *best, double tokens, int gpus);
