/* loom export: a run's checkpoint as a Hugging Face folder or a GGUF file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/open.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"

/* A Llama-family GGUF is written from the model's parameters (GPT-2's
 * table streams each tensor from the checkpoint by name): the run loaded
 * whole on the CPU, then written. */
static loom_status write_from_model(const char *run, long long step, const char *out, loom_gguf_write_opts_t *o) {
    loom_opened_t M;
    loom_open_opts_t oo = loom_open_opts_default();
    oo.step = step;
    LOOM_TRY(loom_open(run, &oo, &M));
    float *host = loom_malloc(M.model->num_params * sizeof(float));
    M.model->be->download(host, M.model->params, M.model->num_params * sizeof(float));
    o->params = host;
    loom_status s = loom_gguf_write(out, o);
    free(host);
    loom_open_close(&M);
    return s;
}

/* An existing --out is replaced (with --force) only when it is what an
 * export writes: a regular file for GGUF, a model folder (or an empty one)
 * for hf. The writers build OUT.tmp and rename it over OUT, removing an
 * hf OUT first, so anything else (a device such as /dev/full, a home
 * folder) would be destroyed. */
static loom_status check_out(const char *out, int hf, int force) {
    struct stat sb;
    if (stat(out, &sb) != 0) return LOOM_OK;
    if (!force) return loom_error(LOOM_EINVAL, "--out %s already exists; pass --force to replace it, or choose another --out", out);
    if (!hf && !S_ISREG(sb.st_mode))
        return loom_error(LOOM_EINVAL, "--out %s exists and is not a regular file; --force replaces only a file (a GGUF exported earlier): "
                          "choose another --out", out);
    if (hf && (!S_ISDIR(sb.st_mode) || !loom_hf_model_or_empty_folder(out)))
        return loom_error(LOOM_EINVAL, "--out %s exists and is not a model folder (no config.json)%s; --force replaces only a folder "
                          "exported earlier: choose another --out", out, S_ISDIR(sb.st_mode) ? " and not empty" : "");
    return LOOM_OK;
}

static loom_status export_run(const char *run, const char *format, long long step, loom_xdtype dt, const char *out, int force) {
    char path[4200];
    LOOM_TRY(check_out(out, !strcmp(format, "hf"), force));
    loom_opened_t R;
    loom_open_opts_t oo = loom_open_opts_default();
    oo.step = step, oo.config_only = 1; /* the weights stream from the file, one tensor at a time */
    LOOM_TRY(loom_open(run, &oo, &R));
    loom_status s = LOOM_OK;
    if (R.kind == LOOM_SOURCE_GGUF)
        s = loom_error(LOOM_EINVAL, "%s is a GGUF file; loom export reads a run folder, a checkpoint or a Hugging Face folder", run);
    else if (!R.tok)
        s = loom_error(LOOM_EINVAL, "%s: the run has no tokenizer.json; an exported model needs its tokenizer", run);
    loom_stview_t *v = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", R.weights_path);
    if (s == LOOM_OK) s = loom_stview_open(&v, path);
    if (s == LOOM_OK && !strcmp(format, "hf")) {
        s = loom_hf_write(out, force, &R.cfg, R.tok, dt, loom_xsource_safetensors, v);
    } else if (s == LOOM_OK) {
        const char *name = strrchr(run, '/') && strrchr(run, '/')[1] ? strrchr(run, '/') + 1 : run;
        char *tmpl = NULL;
        s = loom_cli_chat_template(run, NULL, R.tok, &tmpl);
        loom_gguf_write_opts_t o = {&R.cfg, R.tok, dt, name, loom_xsource_safetensors, v, NULL, tmpl};
        if (s == LOOM_OK && strcmp(loom_gpt_family(&R.cfg), "gpt2"))
            s = write_from_model(run, step, out, &o);
        else if (s == LOOM_OK)
            s = loom_gguf_write(out, &o);
        free(tmpl);
    }
    if (s == LOOM_OK) {
        struct stat sb;
        const loom_gpt_config_t *cfg = &R.cfg;
        snprintf(path, sizeof path, "%s%s", out, strcmp(format, "hf") ? "" : "/model.safetensors");
        double mb = stat(path, &sb) == 0 ? (double)sb.st_size / 1e6 : 0;
        printf("%s: %s %s (%.1f MB of weights) from %s: %d layers, %d heads, %d channels, context %d, vocabulary %d\n", out,
               strcmp(format, "hf")                  ? (strcmp(loom_gpt_family(cfg), "gpt2") ? "GGUF v3 (llama.cpp llama)" : "GGUF v3 (llama.cpp gpt2)")
               : strcmp(loom_gpt_family(cfg), "gpt2") ? "Hugging Face Llama-family folder"
                                                      : "Hugging Face GPT-2 folder",
               loom_xdtype_name(dt), mb,
               R.weights_path, cfg->n_layer, cfg->n_head, cfg->channels, cfg->max_seq_len, cfg->vocab_size);
    }
    loom_stview_close(v);
    loom_open_close(&R);
    return s;
}

int cmd_export(int argc, char **argv) {
    const char *run, *format, *dtype, *out;
    long long step;
    int force;
    const loom_arg_t args[] = {
        {"run", ARG_STR, &run, NULL, 0, 0, "run folder written by `loom train --out`, one of its checkpoints, or a Hugging Face folder"},
        {"format", ARG_STR, &format, NULL, 0, 0, "hf (a Hugging Face folder for transformers) or gguf (a file for llama.cpp)"},
        {"step", ARG_LONG, &step, "-1", -1, 9e18, "checkpoint step to export (-1 = the newest)"},
        {"dtype", ARG_STR, &dtype, "f32", 0, 0, "weights: f32, f16, bf16; q8_0 for gguf (vectors stay f32 in GGUF)"},
        {"out", ARG_STR, &out, NULL, 0, 0, "folder (hf) or file (gguf) to write"},
        {"force", ARG_BOOL, &force, "0", 0, 0, "replace an existing --out"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("export", "loom export --run runs/NAME --format hf|gguf [--step N] [--dtype f32|f16|bf16|q8_0] --out PATH",
                              args, argc, argv);
    if (!run || !format || !out) {
        fprintf(stderr, "loom export: pass --run (a `loom train --out` folder), --format hf|gguf and --out, e.g.\n"
                        "  loom export --run runs/first --format gguf --out first.gguf\n");
        return 2;
    }
    if (strcmp(format, "hf") && strcmp(format, "gguf")) {
        fprintf(stderr, "loom export: --format %s: use hf (Hugging Face folder) or gguf (llama.cpp file)\n", format);
        return 2;
    }
    int dt = loom_xdtype_parse(dtype);
    if (dt < 0) {
        fprintf(stderr, "loom export: --dtype %s: use f32, f16, bf16 or q8_0\n", dtype);
        return 2;
    }
    loom_status s = export_run(run, format, step, (loom_xdtype)dt, out, force);
    return loom_exit_report("export", s);
}
