/* loom: train and serve transformer language models. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "ckpt/checkpoint.h"
#include "core/core.h"
#include "version.h" /* LOOM_VERSION, LOOM_GIT_COMMIT: written by the Makefile */

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"tokenize", cmd_tokenize, "train a BPE tokenizer on text (or load one) and write token shards"},
    {"train", cmd_train, "train a GPT model on text or token shards"},
    {"sample", cmd_sample, "generate text from a run's newest checkpoint"},
    {"generate", cmd_generate, "run many prompts (JSON lines) through continuous batching, offline"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)"},
    {"eval", cmd_eval, "print the validation loss of a run's checkpoint"},
    {"bench", cmd_bench, "throughput against a peer: train (PyTorch), ops, dist (scaling), generate and serve (llama.cpp)"},
    {"devices", cmd_devices, "list the GPUs and MIG instances CUDA sees"},
    {"plan", cmd_plan, "memory, time and cost of training or serving; MIG layouts (train|serve|mig)"},
    {"prune", cmd_prune, "zero 2 of every 4 weights of a run's linear layers (2:4 sparsity) into a new run"},
    {"export", cmd_export, "write a run's checkpoint as a Hugging Face folder or a GGUF file (llama.cpp)"},
};
#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "loom: train and serve transformer language models\n\n"
               "usage: loom COMMAND [flags]   (loom COMMAND --help lists every flag; loom --version)\n"
               "any command: --no-verify loads checkpoints that have no manifest.json, unverified\n\ncommands:\n");
    for (int i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nstart here:\n"
               "  loom tokenize --input corpus.txt --vocab 4096 --out data/corpus\n"
               "  loom train --data data/corpus --model gpt2-tiny --out runs/first\n"
               "  loom sample --run runs/first --prompt \"In the beginning\"\n");
}

/* A command whose output could not be written (a full disk, /dev/full, a
 * closed pipe) did not do its job: say so and fail, whatever it returned. */
static int output_checked(const char *cmd, int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "loom %s: cannot write the output: %s\n", cmd, strerror(errno ? errno : EIO));
    return rc ? rc : 1;
}

/* --no-verify, on any command: load checkpoints that have no manifest
 * (ckpt/checkpoint.h). Taken out of argv here so every command accepts it. */
static int take_no_verify(int argc, char **argv) {
    int n = 0;
    for (int i = 0; i < argc; i++)
        if (i < 2 || strcmp(argv[i], "--no-verify")) argv[n++] = argv[i];
        else loom_ckpt_allow_unverified();
    argv[n] = NULL;
    return n;
}

int main(int argc, char **argv) {
    argc = take_no_verify(argc, argv);
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("loom %s (commit %s)\n", LOOM_VERSION, LOOM_GIT_COMMIT);
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return output_checked(argv[1], commands[i].run(argc - 2, argv + 2));
    fprintf(stderr, "loom: unknown command '%s'; run `loom --help` for the list\n", argv[1]);
    return 2;
}
