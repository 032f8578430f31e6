/* loom train */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "parallel/launch.h"
#include "train/train.h"

/* --nproc N: this same command in N local ranks (parallel/launch.h), each
 * with --threads set to its share of the cores. Returns the exit status. */
static int launch_local(int nproc, int threads, double timeout, int argc, char **argv) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int per = threads > 0 ? threads : (int)(ncpu / nproc > 0 ? ncpu / nproc : 1);
    char **cargv = loom_calloc((size_t)argc + 5, sizeof *cargv), tbuf[16];
    int n = 0;
    cargv[n++] = "loom";
    cargv[n++] = "train";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc") || !strcmp(argv[i], "--threads")) { i++; continue; }
        if (!strncmp(argv[i], "--nproc=", 8) || !strncmp(argv[i], "--threads=", 10)) continue;
        cargv[n++] = argv[i];
    }
    snprintf(tbuf, sizeof tbuf, "%d", per);
    cargv[n++] = "--threads";
    cargv[n++] = tbuf;
    loom_launch_t l = {.what = "loom train", .nproc = nproc, .kill_after_s = timeout + 10, .argv = cargv};
    int code;
    loom_status s = loom_launch_local(&l, &code);
    free(cargv);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom train: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return code;
}

int cmd_train(int argc, char **argv) {
    loom_train_opts_t o = {0};
    int nproc = 0;
    const loom_arg_t args[] = {
        {"data", ARG_STR, &o.data, NULL, 0, 0, "text file, or folder of token shards from `loom tokenize`"},
        {"model", ARG_STR, &o.model, "gpt2-tiny", 0, 0, "preset: gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl"},
        {"out", ARG_STR, &o.out, NULL, 0, 0, "run folder to create (config, metrics log, checkpoints, plot)"},
        {"force", ARG_BOOL, &o.force, "0", 0, 0, "replace the run in an existing --out folder"},
        {"resume", ARG_OPTSTR, &o.resume_from, "", 0, 0, "continue the run in --out from its newest verified checkpoint (weights, AdamW state, step, data position), or from step_N; auto: resume when --out holds a checkpoint, else start fresh (one command for first start and restarts). Another --nproc is fine (the global batch is kept)"},
        {"layers", ARG_INT, &o.layers, "0", 0, 1024, "override the preset's layer count (0 = preset)"},
        {"heads", ARG_INT, &o.heads, "0", 0, 1024, "override the preset's head count (0 = preset)"},
        {"channels", ARG_INT, &o.channels, "0", 0, 65536, "override the preset's width (0 = preset)"},
        {"context", ARG_INT, &o.context, "0", 0, 1 << 20, "override the preset's context length (0 = preset)"},
        {"steps", ARG_LONG, &o.steps, "1000", 1, 1e12, "optimizer steps"},
        {"batch", ARG_INT, &o.batch, "8", 1, 1 << 20, "sequences per micro-batch"},
        {"seq", ARG_INT, &o.seq, "0", 0, 1 << 20, "tokens per sequence (0 = the model's context)"},
        {"grad-accum", ARG_INT, &o.grad_accum, "1", 1, 1 << 20, "micro-batches per optimizer step"},
        {"lr", ARG_FLOAT, &o.lr, "6e-4", 0, 10, "peak learning rate"},
        {"min-lr-ratio", ARG_FLOAT, &o.min_lr_ratio, "0.1", 0, 1, "final learning rate as a fraction of --lr (cosine decay)"},
        {"warmup", ARG_INT, &o.warmup, "100", 0, 1 << 30, "linear warmup steps"},
        {"weight-decay", ARG_FLOAT, &o.weight_decay, "0.1", 0, 10, "AdamW decoupled weight decay (matrices and embeddings only)"},
        {"beta1", ARG_FLOAT, &o.beta1, "0.9", 0, 0.999999, "AdamW beta1"},
        {"beta2", ARG_FLOAT, &o.beta2, "0.95", 0, 0.999999, "AdamW beta2"},
        {"clip", ARG_FLOAT, &o.clip, "1.0", 0, 1e6, "global gradient norm clip (0 = off)"},
        {"val-fraction", ARG_FLOAT, &o.val_fraction, "0.1", 0, 0.5, "share of a text file held out for validation"},
        {"eval-every", ARG_INT, &o.eval_every, "100", 0, 1 << 30, "steps between validation losses (0 = only at the end)"},
        {"eval-batches", ARG_INT, &o.eval_batches, "8", 1, 1 << 20, "batches per validation"},
        {"sample-every", ARG_INT, &o.sample_every, "0", 0, 1 << 30, "steps between text samples (0 = only at the end)"},
        {"sample-tokens", ARG_INT, &o.sample_tokens, "200", 0, 1 << 20, "tokens per text sample (0 = none)"},
        {"ckpt-every", ARG_INT, &o.ckpt_every, "500", 0, 1 << 30, "steps between checkpoints (always one at the end)"},
        {"keep-ckpts", ARG_INT, &o.keep_ckpts, "3", 1, 1 << 20, "checkpoints kept (oldest removed first, only after the new one is on disk)"},
        {"ckpt-every-minutes", ARG_FLOAT, &o.ckpt_every_minutes, "0", 0, 1e6, "also checkpoint when this many minutes passed since the last one (0 = off)"},
        {"ckpt-sync", ARG_BOOL, &o.ckpt_sync, "0", 0, 0, "write checkpoints in the training thread instead of the background (for comparison)"},
        {"log-every", ARG_INT, &o.log_every, "10", 1, 1 << 30, "steps between progress lines when stderr is not a terminal"},
        {"seed", ARG_LONG, &o.seed, "1337", 0, 9.2e18, "seed for initialization and samples"},
        {"threads", ARG_INT, &o.threads, "0", 0, 4096, "CPU threads (0 = all cores)"},
        {"device", ARG_STR, &o.device, "cpu", 0, 0, "cpu, cuda or cuda:N"},
        {"dtype", ARG_STR, &o.dtype, "auto", 0, 0, "matrix precision: fp32, tf32, bf16, fp16 (the last three CUDA only); auto = bf16 on a GPU that has it (compute capability >= 8), else fp32; fp16 uses dynamic loss scaling"},
        {"cuda-graphs", ARG_STR, &o.cuda_graphs, "", 0, 0, "on|off: capture the whole step as a CUDA graph after warm-up and replay it (default on for CUDA; ignored on the CPU)"},
        {"recompute", ARG_STR, &o.recompute, "none", 0, 0, "activation recompute for memory: none, gelu (recompute each layer's GELU output), all (keep only each block's input)"},
        {"nproc", ARG_INT, &nproc, "0", 0, 4096, "start this many local ranks (data parallel over TCP on 127.0.0.1); 0 = as launched (mpirun, srun, torchrun environment)"},
        {"zero", ARG_INT, &o.zero, "0", 0, 2, "ZeRO stage: 0 replicate, 1 shard AdamW state, 2 also shard gradients"},
        {"grad-dtype", ARG_STR, &o.grad_dtype, "fp32", 0, 0, "gradients on the wire between ranks: fp32 or bf16"},
        {"dist-timeout", ARG_FLOAT, &o.dist_timeout, "300", 1, 1e6, "seconds a rank waits for a dead or hung peer before every rank exits naming it"},
        {"no-overlap", ARG_BOOL, &o.no_overlap, "0", 0, 0, "reduce gradients after backward instead of during it"},
        {"bucket-mb", ARG_FLOAT, &o.bucket_mb, "4", 0.001, 1e5, "gradient bucket size for overlapped reduction, MB"},
    };
    int r = loom_args_parse("train", "loom train --data FILE_OR_DIR --out runs/NAME [--model gpt2-tiny] [flags]",
                            args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r) return 2;
    if (!o.data) {
        fprintf(stderr, "loom train: no data; pass --data with a text file or a folder from `loom tokenize`, e.g.\n"
                        "  loom train --data corpus.txt --out runs/first\n");
        return 2;
    }
    if (!o.out) {
        fprintf(stderr, "loom train: no --out folder; name where the run goes, e.g. --out runs/first\n");
        return 2;
    }
    if (strcmp(o.grad_dtype, "fp32") && strcmp(o.grad_dtype, "bf16")) {
        fprintf(stderr, "loom train: --grad-dtype %s: unknown; use fp32 or bf16\n", o.grad_dtype);
        return 2;
    }
    if (o.cuda_graphs && strcmp(o.cuda_graphs, "on") && strcmp(o.cuda_graphs, "off")) {
        fprintf(stderr, "loom train: --cuda-graphs %s: use on or off\n", o.cuda_graphs);
        return 2;
    }
    if (strcmp(o.recompute, "none") && strcmp(o.recompute, "gelu") && strcmp(o.recompute, "all")) {
        fprintf(stderr, "loom train: --recompute %s: use none, gelu or all\n", o.recompute);
        return 2;
    }
    o.resume = o.resume_from != NULL;
    if (nproc > 0) return launch_local(nproc, o.threads, o.dist_timeout, argc, argv);
    o.world_size = 1;
    loom_train_observer_t *observers[] = {loom_progress_observer(&o)};
    o.observers = observers;
    o.n_observers = 1;
    loom_status s = loom_train(&o);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom train: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return 0;
}
