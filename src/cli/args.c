#include "args.h"

#include "cli/commands.h"
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GIVEN 64
static const char *given[MAX_GIVEN];
static int ngiven;

int loom_args_given(const char *name) {
    for (int i = 0; i < ngiven; i++)
        if (strcmp(given[i], name) == 0) return 1;
    return 0;
}

static const loom_arg_t shared[LOOM_FLAG_COUNT] = {
    [LOOM_FLAG_RUN] = {"run", ARG_STR, NULL, NULL, 0, 0, "the model: a run folder (`loom train --out`), one of its checkpoints/step_N, a Hugging Face folder (save_pretrained, loom export) or a GGUF file (loom export, llama.cpp's converter)"},
    [LOOM_FLAG_DATA] = {"data", ARG_STR, NULL, NULL, 0, 0, "text file, or folder of token shards from `loom tokenize`"},
    [LOOM_FLAG_MODEL] = {"model", ARG_STR, NULL, "gpt2-tiny", 0, 0, "preset: gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, smollm2-135m, llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b, mistral-7b"},
    [LOOM_FLAG_BATCH] = {"batch", ARG_INT, NULL, "8", 1, 1 << 20, "sequences per batch (per micro-batch and rank when training)"},
    [LOOM_FLAG_SEQ] = {"seq", ARG_INT, NULL, "0", 0, 1 << 20, "tokens per sequence (0 = the model's context)"},
    [LOOM_FLAG_STEPS] = {"steps", ARG_LONG, NULL, "1000", 1, 1e12, "optimizer steps"},
    [LOOM_FLAG_THREADS] = {"threads", ARG_INT, NULL, "0", 0, 4096, "CPU threads (0 = all cores)"},
    [LOOM_FLAG_DEVICE] = {"device", ARG_STR, NULL, "cpu", 0, 0, "cpu, cuda or cuda:N"},
    [LOOM_FLAG_DTYPE] = {"dtype", ARG_CHOICE, NULL, "auto", -1, 0,
                         "matrix precision: fp32, tf32, bf16, fp16 (the last three CUDA only); auto = bf16 on a GPU that has it (compute capability >= 8), else fp32; fp16 uses dynamic loss scaling"},
    [LOOM_FLAG_SEED] = {"seed", ARG_LONG, NULL, "1337", 0, 9.2e18, "random seed (initialization, samples)"},
    [LOOM_FLAG_VAL_FRACTION] = {"val-fraction", ARG_FLOAT, NULL, "0.1", 0, 0.5, "share of a text file held out for validation"},
    [LOOM_FLAG_LR] = {"lr", ARG_FLOAT, NULL, "6e-4", 0, 10, "peak learning rate"},
    [LOOM_FLAG_MIN_LR_RATIO] = {"min-lr-ratio", ARG_FLOAT, NULL, "0.1", 0, 1, "final learning rate as a fraction of --lr (cosine decay)"},
    [LOOM_FLAG_WARMUP] = {"warmup", ARG_INT, NULL, "100", 0, 1 << 30, "linear warmup steps"},
    [LOOM_FLAG_WEIGHT_DECAY] = {"weight-decay", ARG_FLOAT, NULL, "0.1", 0, 10, "AdamW decoupled weight decay (matrices and embeddings only)"},
    [LOOM_FLAG_BETA1] = {"beta1", ARG_FLOAT, NULL, "0.9", 0, 0.999999, "AdamW beta1"},
    [LOOM_FLAG_BETA2] = {"beta2", ARG_FLOAT, NULL, "0.95", 0, 0.999999, "AdamW beta2"},
    [LOOM_FLAG_CLIP] = {"clip", ARG_FLOAT, NULL, "1.0", 0, 1e6, "global gradient norm clip (0 = off)"},
    [LOOM_FLAG_RECOMPUTE] = {"recompute", ARG_CHOICE, NULL, "none", 0, 0,
                             "activation recompute for memory: none, gelu (recompute each layer's GELU output), all (keep only each block's input)"},
    [LOOM_FLAG_CUDA_GRAPHS] = {"cuda-graphs", ARG_CHOICE, NULL, "default", -1, 0,
                               "capture the whole step as a CUDA graph after warm-up and replay it: on, off, default (on for CUDA; ignored on the CPU)"},
    [LOOM_FLAG_ZERO] = {"zero", ARG_INT, NULL, "0", 0, 3, "ZeRO stage: 0 replicate, 1 shard AdamW state, 2 also shard gradients, 3 also shard the weights (gathered layer by layer)"},
    [LOOM_FLAG_GRAD_DTYPE] = {"grad-dtype", ARG_CHOICE, NULL, "fp32", 0, 0, "gradients on the wire between ranks: fp32 or bf16"},
    [LOOM_FLAG_QUANT] = {"quant", ARG_CHOICE, NULL, "none", 0, 0,
                         "linear-layer weights for inference: none (fp32), int8 (= w8a32: int8 weights, per output channel scales, fp32 activations), w8a16 (= w8a32 on the CPU), w8a8 (int8 activations per token too, int32 sums); a Q8_0 GGUF runs its own int8 blocks of 32"},
    [LOOM_FLAG_KV_DTYPE] = {"kv-dtype", ARG_CHOICE, NULL, "fp32", 0, 0, "KV cache element type: fp32 or int8 (a scale per block, K or V, and head)"},
    [LOOM_FLAG_KV_MEMORY] = {"kv-memory", ARG_STR, NULL, "256M", 0, 0, "KV cache size: bytes (512M, 2G) or a share of the memory free now (0.25)"},
    [LOOM_FLAG_BLOCK_SIZE] = {"block-size", ARG_INT, NULL, "16", 1, 256, "tokens per KV cache block"},
    [LOOM_FLAG_MAX_BATCH_TOKENS] = {"max-batch-tokens", ARG_INT, NULL, "512", 1, 1 << 20, "rows per engine step, prefill chunks and decodes together"},
    [LOOM_FLAG_MAX_SEQS] = {"max-seqs", ARG_INT, NULL, "64", 1, 1 << 16, "running sequences at most"},
    [LOOM_FLAG_PREFILL_RATIO] = {"prefill-ratio", ARG_FLOAT, NULL, "1", 0, 1000, "prompt rows a step may take while sequences decode, in decode steps' time: 1 keeps running sequences' inter-token latency within about 2x while prompts arrive; 0 = no limit (prompts fill --max-batch-tokens: throughput first, as llama.cpp's batched bench)"},
    [LOOM_FLAG_SPARSE] = {"sparse", ARG_CHOICE, NULL, "auto", 0, 0,
                          "2:4-sparse linear weights (loom prune): auto runs them compressed (kept values + 2-bit positions, about half the bytes) when every linear weight is 2:4 and --quant is none; off runs them dense"},
};

/* The values of the shared ARG_CHOICE flags, '|'-separated. */
static const char *const shared_choices[LOOM_FLAG_COUNT] = {
    [LOOM_FLAG_DTYPE] = "auto|fp32|tf32|bf16|fp16",
    [LOOM_FLAG_RECOMPUTE] = "none|gelu|all",
    [LOOM_FLAG_CUDA_GRAPHS] = "default|off|on",
    [LOOM_FLAG_GRAD_DTYPE] = "fp32|bf16",
    [LOOM_FLAG_QUANT] = "none|int8|w8a32|w8a16|w8a8",
    [LOOM_FLAG_KV_DTYPE] = "fp32|int8",
    [LOOM_FLAG_SPARSE] = "off|auto",
};

static const char *choices_of(const char *name) {
    for (int i = 0; i < LOOM_FLAG_COUNT; i++)
        if (shared_choices[i] && !strcmp(shared[i].name, name)) return shared_choices[i];
    return "";
}

loom_arg_t loom_flag(loom_flag_id id, void *ptr) {
    loom_arg_t a = shared[id];
    a.ptr = ptr;
    return a;
}

loom_arg_t loom_flag_default(loom_flag_id id, void *ptr, const char *def) {
    loom_arg_t a = loom_flag(id, ptr);
    a.def = def;
    return a;
}

/* The index of `val` in the '|'-separated `choices`, or -1. */
static int choice_index(const char *choices, const char *val) {
    size_t n = strlen(val);
    int k = 0;
    for (const char *p = choices; *p; k++) {
        const char *end = strchr(p, '|');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, val, n)) return k;
        if (!end) break;
        p = end + 1;
    }
    return -1;
}

static const char *type_hint(loom_arg_type t) {
    switch (t) {
    case ARG_INT: case ARG_LONG: return "N";
    case ARG_FLOAT: return "X";
    case ARG_STR: return "S";
    case ARG_BOOL: return "";
    case ARG_LIST: return "S...";
    case ARG_OPTSTR: return "[S]";
    case ARG_CHOICE: return "S";
    }
    return "";
}

void loom_args_help(const char *cmd, const char *usage, const loom_arg_t *args, int n) {
    printf("usage: %s\n\nflags:\n", usage);
    for (int i = 0; i < n; i++) {
        if (!args[i].name[0]) continue;
        char left[64];
        snprintf(left, sizeof left, "--%s %s", args[i].name, type_hint(args[i].type));
        printf("  %-24s %s", left, args[i].help);
        if (args[i].def) printf(" (default: %s)", args[i].def[0] ? args[i].def : "none");
        else if (args[i].type != ARG_BOOL) printf(" (required)");
        printf("\n");
    }
    printf("  %-24s %s\n", "--help", "print this help");
    (void)cmd;
}

/* Store `val` into the target of `a`; returns 0 or prints an error and 2. */
static int set_value(const char *cmd, const loom_arg_t *a, const char *val) {
    char *end;
    switch (a->type) {
    case ARG_INT:
    case ARG_LONG: {
        errno = 0;
        double d;
        long long v = strtoll(val, &end, 10);
        if (*end == 'e' || *end == 'E' || *end == '.') { /* allow 1e6 for counts */
            d = strtod(val, &end);
            v = (long long)d;
            if (*end == 0 && d != (double)v) end = (char *)"x";
        }
        if (end == val || *end || errno) {
            fprintf(stderr, "loom %s: --%s %s: not an integer; see `loom %s --help`\n", cmd, a->name, val, cmd);
            return 2;
        }
        if (a->min != a->max && (v < a->min || v > a->max)) {
            fprintf(stderr, "loom %s: --%s %s: out of range, expected %.0f to %.0f\n", cmd, a->name, val, a->min, a->max);
            return 2;
        }
        if (a->type == ARG_INT) *(int *)a->ptr = (int)v;
        else *(long long *)a->ptr = v;
        return 0;
    }
    case ARG_FLOAT: {
        errno = 0;
        double v = strtod(val, &end);
        if (end == val || *end || errno || !isfinite(v)) {
            fprintf(stderr, "loom %s: --%s %s: not a number; see `loom %s --help`\n", cmd, a->name, val, cmd);
            return 2;
        }
        if (a->min != a->max && (v < a->min || v > a->max)) {
            fprintf(stderr, "loom %s: --%s %s: out of range, expected %g to %g\n", cmd, a->name, val, a->min, a->max);
            return 2;
        }
        *(double *)a->ptr = v;
        return 0;
    }
    case ARG_STR:
        *(const char **)a->ptr = val;
        return 0;
    case ARG_OPTSTR:
        *(const char **)a->ptr = val;
        return 0;
    case ARG_BOOL:
        if (!strcmp(val, "1") || !strcmp(val, "on") || !strcmp(val, "true") || !strcmp(val, "yes")) *(int *)a->ptr = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "off") || !strcmp(val, "false") || !strcmp(val, "no")) *(int *)a->ptr = 0;
        else {
            fprintf(stderr, "loom %s: --%s %s: expected on or off\n", cmd, a->name, val);
            return 2;
        }
        return 0;
    case ARG_CHOICE: {
        int k = choice_index(choices_of(a->name), val);
        if (k < 0) {
            fprintf(stderr, "loom %s: --%s %s: unknown; use one of %s\n", cmd, a->name, val, choices_of(a->name));
            return 2;
        }
        *(int *)a->ptr = (int)a->min + k;
        return 0;
    }
    case ARG_LIST: {
        loom_arg_list_t *l = a->ptr;
        const char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
        if (!v) return 2;
        l->v = v;
        l->v[l->n++] = val;
        return 0;
    }
    }
    return 2;
}

int loom_args_parse(const char *cmd, const char *usage, const loom_arg_t *args, int n,
                    int argc, char **argv) {
    ngiven = 0;
    const loom_arg_t *positional = NULL;
    for (int i = 0; i < n; i++) {
        if (!args[i].name[0]) positional = &args[i];
        if (args[i].type == ARG_LIST) {
            loom_arg_list_t *l = args[i].ptr;
            l->n = 0;
        }
        if (args[i].def && args[i].def[0] && set_value(cmd, &args[i], args[i].def)) return 2;
        if (args[i].type == ARG_STR && !args[i].def) *(const char **)args[i].ptr = NULL;
        if (args[i].type == ARG_STR && args[i].def && !args[i].def[0]) *(const char **)args[i].ptr = NULL;
        if (args[i].type == ARG_OPTSTR && (!args[i].def || !args[i].def[0])) *(const char **)args[i].ptr = NULL;
    }
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            loom_args_help(cmd, usage, args, n);
            return 1;
        }
        if (strncmp(s, "--", 2) != 0) {
            if (positional) {
                if (set_value(cmd, positional, s)) return 2;
                continue;
            }
            fprintf(stderr, "loom %s: unexpected argument '%s'; flags start with --, see `loom %s --help`\n", cmd, s, cmd);
            return 2;
        }
        char name[128];
        snprintf(name, sizeof name, "%s", s + 2);
        const char *inline_val = NULL;
        char *eq = strchr(name, '=');
        if (eq) {
            *eq = 0;
            inline_val = s + 2 + (eq - name) + 1;
        }
        const loom_arg_t *a = NULL;
        for (int k = 0; k < n; k++)
            if (args[k].name[0] && !strcmp(args[k].name, name)) a = &args[k];
        if (!a) {
            fprintf(stderr, "loom %s: unknown flag --%s; see `loom %s --help`\n", cmd, name, cmd);
            return 2;
        }
        if (ngiven < MAX_GIVEN) given[ngiven++] = a->name;
        if (a->type == ARG_BOOL && !inline_val) {
            *(int *)a->ptr = 1;
            continue;
        }
        if (a->type == ARG_OPTSTR && !inline_val && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))) {
            *(const char **)a->ptr = "latest";
            continue;
        }
        if (a->type == ARG_LIST && !inline_val) {
            int got = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (set_value(cmd, a, argv[++i])) return 2;
                got++;
            }
            if (!got) {
                fprintf(stderr, "loom %s: --%s needs at least one value\n", cmd, name);
                return 2;
            }
            continue;
        }
        const char *val = inline_val;
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "loom %s: --%s needs a value; see `loom %s --help`\n", cmd, name, cmd);
                return 2;
            }
            val = argv[++i];
        }
        if (set_value(cmd, a, val)) return 2;
    }
    return 0;
}

int loom_exit_code(int status) {
    switch (status) {
    case LOOM_OK: return 0;
    case LOOM_EINVAL: case LOOM_EFORMAT: case LOOM_EIO: case LOOM_EUNAVAIL: return 2;
    case LOOM_ESTOPPED: return 75; /* EX_TEMPFAIL: preempted, resume with the same command */
    case LOOM_EWRITE: return 74;   /* EX_IOERR: the storage failed, not the input */
    default: return 1;
    }
}

int loom_exit_report(const char *cmd, int status) {
    if (status != LOOM_OK) fprintf(stderr, "loom %s: %s\n", cmd, loom_errmsg());
    return loom_exit_code(status);
}
