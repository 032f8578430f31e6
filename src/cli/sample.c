/* loom sample */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "model/generate.h"

int cmd_sample(int argc, char **argv) {
    const char *run, *prompt, *gguf;
    int tokens, top_k, threads, quant, kv_dtype, sparse;
    double temperature, top_p;
    long long seed;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_RUN, &run),
        {"gguf", ARG_STR, &gguf, NULL, 0, 0, "a GGUF file (GPT-2 or Llama family: loom export, llama.cpp's converter and quantizer) instead of --run"},
        {"prompt", ARG_STR, &prompt, "", 0, 0, "text to continue (none: start from <|endoftext|>)"},
        {"tokens", ARG_INT, &tokens, "200", 1, 1 << 24, "tokens to generate"},
        {"temperature", ARG_FLOAT, &temperature, "0.8", 0, 100, "softmax temperature (0 = greedy)"},
        {"top-k", ARG_INT, &top_k, "40", 0, 1 << 30, "sample among the k likeliest tokens (0 = all)"},
        {"top-p", ARG_FLOAT, &top_p, "1.0", 0.000001, 1, "nucleus sampling mass (1 = off)"},
        loom_flag(LOOM_FLAG_SEED, &seed),
        loom_flag(LOOM_FLAG_THREADS, &threads),
        loom_flag(LOOM_FLAG_QUANT, &quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &kv_dtype),
        loom_flag(LOOM_FLAG_SPARSE, &sparse),
    };
    LOOM_ARGS_PARSE_OR_RETURN("sample", "loom sample --run runs/NAME [--prompt TEXT] [flags]", args, argc, argv);
    if (gguf) run = gguf;
    loom_opened_t R;
    loom_open_opts_t oo = loom_cli_open_opts("cpu", threads, quant, kv_dtype, sparse);
    loom_status s = loom_open(run, &oo, &R);
    if (s != LOOM_OK) return loom_exit_report("sample", s);
    loom_tokenizer_t *tok = R.tok;
    if (!tok) {
        fprintf(stderr, "loom sample: %s has no tokenizer.json, so text cannot be encoded or decoded\n", run);
        loom_open_close(&R);
        return 2;
    }
    uint32_t *ids = NULL;
    size_t n = 0;
    if (prompt && *prompt) {
        s = loom_tokenizer_encode_special(tok, prompt, strlen(prompt), &ids, &n);
    } else {
        int eot = loom_tokenizer_eot(tok);
        ids = malloc(sizeof *ids);
        ids[0] = eot >= 0 ? (uint32_t)eot : 0;
        n = 1;
    }
    if (s == LOOM_OK) {
        if (prompt && *prompt) fputs(prompt, stdout);
        loom_sampling_t sp = {(float)temperature, top_k, (float)top_p};
        loom_rng_t rng;
        loom_rng_seed(&rng, (uint64_t)seed);
        loom_text_sink_t sink = {tok, stdout};
        s = loom_gpt_generate_with(R.model, R.weights.quant, R.weights.s24, R.kv_dtype, ids, n, tokens, &sp, &rng,
                                   loom_text_sink_emit, &sink);
        fputc('\n', stdout);
    }
    free(ids);
    loom_open_close(&R);
    return loom_exit_report("sample", s);
}
