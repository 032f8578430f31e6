/* loom train */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/prune.h"
#include "parallel/launch.h"
#include "train/train.h"

/* --nproc N [--nnodes M --node-rank K]: the ranks this machine starts. */
typedef struct {
    int nproc, nnodes, node_rank;
} launch_flags_t;

static int is_launch_flag(const char *a) {
    static const char *const names[] = {"--nproc", "--threads", "--nnodes", "--node-rank"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        size_t n = strlen(names[k]);
        if (!strncmp(a, names[k], n) && (a[n] == 0 || a[n] == '=')) return a[n] == 0 ? 2 : 1; /* 2: its value follows */
    }
    return 0;
}

/* --nproc N: this same command in N local ranks (parallel/launch.h), each
 * with --threads set to its share of the cores. Returns the exit status. */
static int launch_local(const launch_flags_t *lf, int threads, double timeout, int argc, char **argv) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nproc = lf->nproc, per = threads > 0 ? threads : (int)(ncpu / nproc > 0 ? ncpu / nproc : 1);
    char **cargv = loom_calloc((size_t)argc + 5, sizeof *cargv), tbuf[16];
    int n = 0;
    cargv[n++] = "loom";
    cargv[n++] = "train";
    for (int i = 0; i < argc; i++) {
        int k = is_launch_flag(argv[i]);
        if (k) {
            i += k - 1;
            continue;
        }
        cargv[n++] = argv[i];
    }
    snprintf(tbuf, sizeof tbuf, "%d", per);
    cargv[n++] = "--threads";
    cargv[n++] = tbuf;
    loom_launch_t l = {.what = "loom train", .nproc = nproc, .nnodes = lf->nnodes, .node_rank = lf->node_rank,
                       .kill_after_s = timeout + 10, .argv = cargv};
    int code;
    loom_status s = loom_launch_local(&l, &code);
    free(cargv);
    if (s != LOOM_OK) return loom_exit_report("train", s);
    return code;
}

/* A row for --layers, --heads, --channels or --context: an int up to
 * `max` that replaces the preset's `what`; 0 keeps the preset's. */
#define PRESET_OVERRIDE(name, ptr, max, what) {name, ARG_INT, ptr, "0", 0, max, "override the preset's " what " (0 = preset)"}

/* The flags: the shared ones (cli/args.h) and loom train's own. Returns
 * 0, 1 (--help printed) or 2. */
static int parse_flags(loom_train_opts_t *o, launch_flags_t *lf, int *keep_sparsity, int argc, char **argv) {
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_DATA, &o->data),
        loom_flag(LOOM_FLAG_MODEL, &o->model),
        {"init-from-run", ARG_STR, &o->init_from_run, NULL, 0, 0, "a loom run folder (e.g. from loom prune) whose newest checkpoint gives the architecture and weights to fine-tune"},
        {"keep-sparsity", ARG_BOOL, keep_sparsity, "0", 0, 0, "hold the zero weights of the linear layers at zero after every AdamW step (fine-tuning a pruned run)"},
        {"init-from", ARG_STR, &o->init_from, NULL, 0, 0, "Hugging Face folder (GPT-2, Llama, Mistral, Qwen2: config.json, safetensors weights, tokenizer) to fine-tune; --data must use its tokenizer"},
        {"out", ARG_STR, &o->out, NULL, 0, 0, "run folder to create (config, metrics log, checkpoints, plot)"},
        {"force", ARG_BOOL, &o->force, "0", 0, 0, "replace the run in an existing --out folder"},
        {"resume", ARG_OPTSTR, &o->resume_from, "", 0, 0, "continue the run in --out from its newest verified checkpoint (weights, AdamW state, step, data position), or from step_N; auto: resume when --out holds a checkpoint, else start fresh (one command for first start and restarts). Another --nproc is fine (the global batch is kept)"},
        PRESET_OVERRIDE("layers", &o->layers, LOOM_GPT_MAX_LAYERS, "layer count"),
        PRESET_OVERRIDE("heads", &o->heads, LOOM_GPT_MAX_HEADS, "head count"),
        PRESET_OVERRIDE("channels", &o->channels, LOOM_GPT_MAX_CHANNELS, "width"),
        PRESET_OVERRIDE("context", &o->context, LOOM_GPT_MAX_CONTEXT, "context length"),
        {"untied-head", ARG_BOOL, &o->untied_head, "0", 0, 0, "give the output head its own weights (lm_head, as Llama 3.1 8B and Mistral) instead of the token embedding's"},
        loom_flag(LOOM_FLAG_STEPS, &o->steps),
        loom_flag(LOOM_FLAG_BATCH, &o->batch),
        loom_flag(LOOM_FLAG_SEQ, &o->seq),
        {"grad-accum", ARG_INT, &o->grad_accum, "1", 1, 1 << 20, "micro-batches per optimizer step"},
        LOOM_OPTIMIZER_FLAGS(o),
        loom_flag(LOOM_FLAG_VAL_FRACTION, &o->val_fraction),
        {"eval-every", ARG_INT, &o->eval_every, "100", 0, 1 << 30, "steps between validation losses (0 = only at the end)"},
        {"eval-batches", ARG_INT, &o->eval_batches, "8", 1, 1 << 20, "batches per validation"},
        {"sample-every", ARG_INT, &o->sample_every, "0", 0, 1 << 30, "steps between text samples (0 = only at the end)"},
        {"sample-tokens", ARG_INT, &o->sample_tokens, "200", 0, 1 << 20, "tokens per text sample (0 = none)"},
        {"ckpt-every", ARG_INT, &o->ckpt_every, "500", 0, 1 << 30, "steps between checkpoints (always one at the end)"},
        {"keep-ckpts", ARG_INT, &o->keep_ckpts, "3", 1, 1 << 20, "checkpoints kept (oldest removed first, only after the new one is on disk)"},
        {"ckpt-every-minutes", ARG_FLOAT, &o->ckpt_every_minutes, "0", 0, 1e6, "also checkpoint when this many minutes passed since the last one (0 = off)"},
        {"ckpt-sync", ARG_BOOL, &o->ckpt_sync, "0", 0, 0, "write checkpoints in the training thread instead of the background (for comparison)"},
        {"log-every", ARG_INT, &o->log_every, "10", 1, 1 << 30, "steps between progress lines when stderr is not a terminal"},
        loom_flag(LOOM_FLAG_SEED, &o->seed),
        loom_flag(LOOM_FLAG_THREADS, &o->threads),
        loom_flag(LOOM_FLAG_DEVICE, &o->device),
        loom_flag(LOOM_FLAG_DTYPE, &o->dtype),
        loom_flag(LOOM_FLAG_CUDA_GRAPHS, &o->cuda_graphs),
        loom_flag(LOOM_FLAG_RECOMPUTE, &o->recompute),
        {"nproc", ARG_INT, &lf->nproc, "0", 0, 4096, "start this many local ranks (data parallel over TCP on 127.0.0.1); 0 = as launched (mpirun, srun, torchrun environment)"},
        {"nnodes", ARG_INT, &lf->nnodes, "1", 1, 4096, "with --nproc: machines that each start --nproc ranks of one job (MASTER_ADDR/MASTER_PORT in the environment: node 0's address and a free port); tp groups stay within a machine when --tp divides --nproc"},
        {"node-rank", ARG_INT, &lf->node_rank, "0", 0, 4095, "with --nnodes: this machine's index, 0 .. nnodes-1 (its ranks are node-rank x nproc onward)"},
        loom_flag(LOOM_FLAG_ZERO, &o->zero),
        {"tp", ARG_INT, &o->tp, "1", 1, 4096, "tensor-parallel ranks per group: each layer's heads, MLP and vocabulary split over this many consecutive ranks (Megatron; --dtype fp32); the ranks divide into world / tp data-parallel replicas (docs/dist.md)"},
        {"pp", ARG_INT, &o->pp, "1", 1, LOOM_GPT_MAX_LAYERS, "pipeline-parallel stages: consecutive layers per stage, --grad-accum micro-batches scheduled 1F1B; the ranks divide into world / pp pipelines (docs/dist.md)"},
        loom_flag(LOOM_FLAG_GRAD_DTYPE, &o->grad_dtype),
        {"dist-timeout", ARG_FLOAT, &o->dist_timeout, "300", 1, 1e6, "seconds a rank waits for a dead or hung peer before every rank exits naming it"},
        {"no-overlap", ARG_BOOL, &o->no_overlap, "0", 0, 0, "reduce gradients after backward instead of during it"},
        {"bucket-mb", ARG_FLOAT, &o->bucket_mb, "4", 0.001, 1e5, "gradient bucket size for overlapped reduction, MB"},
        {"metrics-port", ARG_INT, &o->metrics_port, "-1", -1, 65535, "serve Prometheus /metrics and the live dashboard (/) on this port plus the local rank; 0 = any free port; -1 = off"},
        {"metrics-host", ARG_STR, &o->metrics_host, "127.0.0.1", 0, 0, "address the metrics server listens on (0.0.0.0 = every interface)"},
        {"metrics-linger", ARG_FLOAT, &o->metrics_linger, "10", 0, 86400, "after the run, keep /metrics up until it is scraped once more (the final state), at most this many seconds"},
    };
    return loom_args_parse("train", "loom train --data FILE_OR_DIR --out runs/NAME [--model gpt2-tiny] [flags]", args,
                           LOOM_ARGS_COUNT(args), argc, argv);
}

int cmd_train(int argc, char **argv) {
    loom_train_opts_t o = {0};
    launch_flags_t lf = {0};
    int keep_sparsity = 0;
    int r = parse_flags(&o, &lf, &keep_sparsity, argc, argv);
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
    if (o.init_from && (o.layers || o.heads || o.channels || o.context)) {
        fprintf(stderr, "loom train: --init-from %s takes the architecture from its config.json; drop --layers/--heads/--channels/--context\n", o.init_from);
        return 2;
    }
    o.model_given = loom_args_given("model") || o.init_from;
    if (o.init_from) o.model = o.init_from;
    o.resume = o.resume_from != NULL;
    /* the layout must divide the ranks: say so before starting any (each rank would refuse it alone) */
    int world = lf.nproc * lf.nnodes;
    if (lf.nproc > 0 && world % (o.tp * o.pp)) {
        fprintf(stderr, "loom train: %d ranks (--nproc %d x --nnodes %d) is not a multiple of --tp %d x --pp %d = %d; use a multiple of %d ranks\n",
                world, lf.nproc, lf.nnodes, o.tp, o.pp, o.tp * o.pp, o.tp * o.pp);
        return 2;
    }
    if (lf.nproc == 0 && (lf.nnodes > 1 || lf.node_rank)) {
        fprintf(stderr, "loom train: --nnodes/--node-rank start ranks with --nproc; add --nproc (the ranks per machine) or drop them\n");
        return 2;
    }
    if (lf.nproc > 0) return launch_local(&lf, o.threads, o.dist_timeout, argc, argv);
    o.world_size = 1;
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (mem > 0 && (double)o.steps * 64 > mem / 4) { /* before any observer sizes its per-step history */
        fprintf(stderr, "loom train: --steps %lld: the per-step loss history would not fit in this machine's %.1f GB; use at most %.0f steps\n",
                o.steps, mem / 1e9, mem / 4 / 64);
        return 2;
    }
    loom_train_observer_t *observers[] = {loom_progress_observer(&o), keep_sparsity ? loom_keep_sparsity_observer() : NULL};
    o.observers = observers;
    o.n_observers = keep_sparsity ? 2 : 1;
    loom_status s = loom_train(&o);
    return loom_exit_report("train", s);
}
