/* loom sample */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "ckpt/gguf.h"
#include "cli/runload.h"
#include "model/generate.h"

int cmd_sample(int argc, char **argv) {
    const char *run, *prompt, *gguf;
    int tokens, top_k, threads;
    double temperature, top_p;
    long long seed;
    const loom_arg_t args[] = {
        {"run", ARG_STR, &run, NULL, 0, 0, "run folder written by `loom train --out` (or a .gguf file)"},
        {"gguf", ARG_STR, &gguf, NULL, 0, 0, "GPT-2 GGUF file (loom export or llama.cpp's converter) instead of --run"},
        {"prompt", ARG_STR, &prompt, "", 0, 0, "text to continue (none: start from <|endoftext|>)"},
        {"tokens", ARG_INT, &tokens, "200", 1, 1 << 24, "tokens to generate"},
        {"temperature", ARG_FLOAT, &temperature, "0.8", 0, 100, "softmax temperature (0 = greedy)"},
        {"top-k", ARG_INT, &top_k, "40", 0, 1 << 30, "sample among the k likeliest tokens (0 = all)"},
        {"top-p", ARG_FLOAT, &top_p, "1.0", 0.000001, 1, "nucleus sampling mass (1 = off)"},
        {"seed", ARG_LONG, &seed, "1337", 0, 9.2e18, "sampling seed"},
        {"threads", ARG_INT, &threads, "0", 0, 4096, "CPU threads (0 = all cores)"},
    };
    int r = loom_args_parse("sample", "loom sample --run runs/NAME [--prompt TEXT] [flags]", args,
                            (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r) return 2;
    if (run && !gguf && !loom_path_is_dir(run) && loom_path_exists(run)) gguf = run; /* --run FILE.gguf */
    if (!run && !gguf) {
        fprintf(stderr, "loom sample: no --run; pass the folder of a `loom train --out`\n");
        return 2;
    }
    loom_gpt_t *m;
    loom_tokenizer_t *tok;
    loom_ckpt_state_t st;
    loom_status s;
    const loom_backend_t *be;
    if (gguf && (s = loom_backend_cpu_init(&be, threads)) == LOOM_OK) s = loom_gguf_load(gguf, be, &m, &tok);
    else if (!gguf) s = loom_run_open(run, threads, &m, &tok, &st);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom sample: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    if (!tok) {
        fprintf(stderr, "loom sample: %s has no tokenizer, so text cannot be encoded or decoded\n", gguf ? gguf : run);
        loom_gpt_free(m);
        return 2;
    }
    uint32_t *ids = NULL;
    size_t n = 0;
    if (prompt && *prompt) {
        s = loom_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n);
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
        s = loom_gpt_generate(m, ids, n, tokens, &sp, &rng, loom_text_sink_emit, &sink);
        fputc('\n', stdout);
    }
    free(ids);
    loom_tokenizer_free(tok);
    loom_gpt_free(m);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom sample: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return 0;
}
