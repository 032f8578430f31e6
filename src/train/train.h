/* train: the training loop. loom_train sets a run up (model, backend, data,
 * ranks, run folder), runs the step loop, and tears it down. Everything
 * besides the step itself -- the metrics log, the progress line, the loss
 * plot, text samples, checkpoints, signals -- is an observer that the loop
 * calls at these points, in this order:
 *
 *   setup, resume
 *   on_start                                    every observer, once
 *   for each step:
 *       before_step     may ask the run to stop (signals, time limits)
 *       (the optimizer step: batches, forward, backward, AdamW)
 *       on_eval         only when a validation loss was just measured
 *       after_step      the step's numbers (loss, lr, tokens/s, MFU, ...)
 *   (after the last step or a stop: a final validation, then on_eval)
 *   on_stop             the loop is over; final writes (checkpoint, plot)
 *   on_end              reports (the done line, the last sample)
 *   free                every observer, in teardown
 *
 * on_checkpoint is emitted by whoever writes a checkpoint (the checkpoint
 * observer, src/train/checkpoint.c), through loom_train_emit_checkpoint.
 *
 * Observers run in list order: the built-in ones that record (signals, the
 * metrics log), then the caller's (loom_train_opts_t.observers: the CLI's
 * progress line, a metrics exporter), then the built-in ones that act
 * (samples, checkpoints, the plot). Any hook may be NULL. A hook that
 * returns an error ends the loop; on_stop and on_end still run, and the
 * first error is what loom_train returns. Adding an observer never needs a
 * change to the loop: pass it in opts, or add it to builtin_observers in
 * train.c. */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "backend/backend.h"
#include "ckpt/run.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/dist.h"
#include "train/step.h"
#include "train/step_graph.h"

typedef struct loom_train_run loom_train_run_t;
typedef struct loom_train_observer loom_train_observer_t;

typedef struct {
    const char *data, *model, *out, *device;
    int dtype;               /* loom_dtype; -1 = auto: bf16 on a CUDA GPU that has it, else fp32 */
    int cuda_graphs;         /* 1 on, 0 off, -1 default: on for CUDA (ignored with a note on the CPU) */
    int recompute;           /* loom_recompute: activation recompute */
    int layers, heads, channels, context; /* model overrides; 0 = the preset's */
    int untied_head;         /* 1: the output head gets its own weights (lm_head) instead of wte's */
    int batch, seq, grad_accum;           /* seq 0 = the model's context */
    long long steps;
    int warmup;
    double lr, min_lr_ratio, weight_decay, clip, beta1, beta2, val_fraction;
    int eval_every, eval_batches, sample_every, sample_tokens, ckpt_every, keep_ckpts;
    int log_every, threads, force;
    int resume; /* continue the run in `out` from its newest checkpoint */
    /* Fault tolerance (docs/fault-tolerance.md). resume_from: NULL, "latest",
     * "auto" (resume when `out` holds a checkpoint, else start fresh) or
     * "step_N"; resume is set from it when given. */
    const char *resume_from;
    double ckpt_every_minutes; /* also checkpoint when this much time passed (0 = off) */
    int ckpt_sync;             /* write checkpoints in the loop's thread (default: in the background) */
    const char *init_from; /* Hugging Face GPT-2 folder: architecture and weights (ckpt/hf.h); NULL = a preset */
    int model_given;           /* --model was on the command line (a resume refuses another preset) */
    const char *init_from_run; /* a loom run folder (e.g. from `loom prune`): architecture and weights of its newest checkpoint */
    long long seed;
    /* Data parallelism. The ranks come from the launch (mpirun, srun, the
     * torchrun environment; see parallel/dist.h); loom_train fills rank and
     * world_size in its own copy. */
    int zero;               /* ZeRO stage 0, 1, 2 */
    int tp;                 /* tensor-parallel ranks per group (0 or 1 = none; parallel/tp.h):
                             * consecutive ranks form a group, the world divides into
                             * world_size / tp data-parallel replicas */
    int grad_dtype;         /* loom_dist_dtype: gradients on the wire */
    double dist_timeout;    /* seconds a collective may wait for a peer (0 = 300) */
    int no_overlap;         /* reduce after backward instead of during it */
    double bucket_mb;       /* gradient bucket size in MB (0 = 4) */
    int rank, world_size;
    /* Pipeline parallelism (train/pipeline.h): stages of consecutive
     * layers, 0 or 1 = none; the micro-batches are --grad-accum's. */
    int pp;
    /* The caller's observers, called after the built-in recorders and
     * before the built-in actors (see the file comment). Not owned: their
     * free hook is called, the array is not. */
    loom_train_observer_t *const *observers;
    int n_observers;
    /* --metrics-port: /metrics and the live dashboard on this port plus the
     * local rank (0 = any free port, < 0 = no server); --metrics-host. */
    int metrics_port;
    const char *metrics_host;
    double metrics_linger;  /* after the run, keep the server until one more scrape, at most this many seconds */
} loom_train_opts_t;

/* One optimizer step's numbers, as observers see them. */
typedef struct {
    long long step;          /* 1-based */
    float loss, grad_norm;   /* mean loss over the global batch; norm before clipping (inf/nan: skipped) */
    double lr;               /* this step's learning rate */
    double val_loss;         /* < 0: not measured at this step */
    double step_s;           /* wall time of the step on this rank */
    double tokens_per_s;     /* global tokens per second of this step */
    double mfu;              /* model FLOPs utilization, 0..1; < 0 when the peak is unknown */
    double comm_wait_s;      /* time blocked on communication (data parallel) */
    double comm_tp_s;        /* time blocked on the tensor-parallel group (0 without --tp) */
    double elapsed_s;        /* since the loop started */
    double eta_s;            /* estimated time to the last step */
    float loss_scale;        /* fp16 dynamic loss scale used (1 without scaling) */
    int skipped;             /* the step was skipped (inf/nan gradients under loss scaling) */
    double data_s;           /* time loading this step's batches, before step_s */
    double peak_flops;       /* FLOP/s per rank MFU is relative to (rank 0's measure, so every rank has the same) */
    double comm_pp_s;        /* --pp: time blocked in pipeline send/receive (idle on a neighbour plus transfer) */
    double bubble_s;         /* --pp: of which idle, the pipeline bubble (train/pipeline.h) */
} loom_step_record_t;

/* A checkpoint that was just taken. With --ckpt-sync it is on disk;
 * otherwise its snapshot is being written in the background, committed
 * before the next checkpoint is taken and before the run ends. write_s:
 * the time the loop was held (snapshot, and waiting for the previous one). */
typedef struct {
    loom_ckpt_state_t state; /* step, losses, data position, tokenizer hash */
    const char *dir;         /* the run folder (the checkpoint is dir/checkpoints/step_N) */
    double write_s;          /* seconds the write took (this rank's view) */
    int final;               /* the one written after the loop */
} loom_ckpt_event_t;

/* What a run is, for observers. Observers read it; they change the run
 * only through the loom_train_* functions below. */
struct loom_train_run {
    const loom_train_opts_t *o;  /* resolved options: rank and world_size filled in */
    loom_gpt_t *model;
    const loom_backend_t *be;
    const loom_dataset_t *data;
    const loom_tokenizer_t *tok; /* the data's tokenizer; NULL when it has none */
    loom_dist_t *dist;
    loom_dp_t *dp;               /* NULL: one process at ZeRO 0 (the plain step) */
    struct loom_pp *pp;          /* --pp: this rank's pipeline stage (model is the stage's), else NULL */
    struct loom_tp *tp;          /* tensor parallelism (--tp > 1), else NULL; model is then this rank's shard */
    loom_gpt_t *ckpt_model;      /* what checkpoints are written from when not model: under --tp the whole
                                  * model rank 0 assembles (its config on the other ranks) */
    int dp_rank, dp_size;        /* this rank's data-parallel replica and their number (world / (tp x pp)) */
    int lead, multi;             /* rank 0; more than one rank */
    int B, T;                    /* micro-batch sequences and tokens per sequence */
    size_t tokens_per_step;      /* global: B x T x grad_accum x world_size */
    double flops_per_token;      /* model FLOPs per token, forward + backward */
    int have_val;                /* the data has a validation split */
    int loss_scaling;            /* dynamic fp16 loss scaling is on */
    const loom_loss_scaler_t *loss_scaler; /* its state when on (checkpoints save it), else NULL */
    const char *resumed_from;    /* checkpoint folder of a --resume, else NULL */
    long long resumed_step;      /* its step (0 when not resumed) */
    long long first_step;        /* first step this process runs */
    long long step;              /* last completed step (first_step - 1 before any) */
    unsigned long long data_pos; /* next training token (global stream) */
    float last_loss;             /* loss of the last completed step (NAN before any) */
    double last_val;             /* last validation loss (< 0: none yet) */
    long long last_val_step;     /* step it was measured at (0: none) */
    double t_start;              /* loom_now() when the loop started */
    double train_time;           /* seconds spent inside steps */
    double comm_wait;            /* of which blocked on communication */
    double bubble_time;          /* --pp: of which this rank's stage sat idle on its neighbours */
    double comm_tp;              /* of that, on the tensor-parallel group */
    int stop_signal;             /* a stop was asked for: the signal number (or SIGTERM) */
    double energy_j_per_token;   /* energy per trained token so far (NAN: no energy counter); set by the exporter (train/exporter.h) */
    loom_train_observer_t **obs; /* every observer, in call order */
    int n_obs;
};

/* An observer: hooks the loop calls (any may be NULL) and their context. */
struct loom_train_observer {
    const char *name; /* for error messages ("checkpoint", "metrics log") */
    void *ctx;
    loom_status (*on_start)(void *ctx, loom_train_run_t *run);
    loom_status (*before_step)(void *ctx, loom_train_run_t *run, long long step);
    loom_status (*on_eval)(void *ctx, loom_train_run_t *run, long long step, double val_loss);
    loom_status (*after_step)(void *ctx, loom_train_run_t *run, const loom_step_record_t *rec);
    loom_status (*on_checkpoint)(void *ctx, loom_train_run_t *run, const loom_ckpt_event_t *ev);
    /* status: LOOM_OK, or the error that ended the loop. */
    loom_status (*on_stop)(void *ctx, loom_train_run_t *run, loom_status status);
    /* status: the run's outcome so far (after on_stop). */
    void (*on_end)(void *ctx, loom_train_run_t *run, loom_status status);
    void (*free)(void *ctx);
};

/* Learning rate at 1-based step t: linear warmup over `warmup` steps to
 * `lr`, then cosine decay to lr * min_lr_ratio at `steps`. */
double loom_lr_at(long long t, long long steps, int warmup, double lr, double min_lr_ratio);

/* Run a whole training job. SIGINT/SIGTERM stop it after the current step
 * with a final checkpoint. */
loom_status loom_train(const loom_train_opts_t *o);

/* Ask the run to stop after the step in flight (every rank stops at the
 * same step; a final checkpoint is written). `sig`: the signal number that
 * asked, or 0 for another reason (then SIGTERM is recorded). */
void loom_train_request_stop(loom_train_run_t *run, int sig);

/* Tell every observer that a checkpoint was written. */
loom_status loom_train_emit_checkpoint(loom_train_run_t *run, const loom_ckpt_event_t *ev);

/* The built-in observers (src/train/observers.c, checkpoint.c). Each
 * returns NULL when it has nothing to do on this rank. */
loom_train_observer_t *loom_train_observer_signals(void);
/* LOOM_TEST_HOLD_AFTER_STEP's step for this run (-1: none; a resumed run
 * never holds). The checkpoint observer commits what it has in flight
 * after that step, so a test that kills a held run finds the checkpoint
 * it waits for on any machine, however slow its background write. */
long long loom_train_test_hold_step(const loom_train_run_t *run);
loom_train_observer_t *loom_train_observer_metrics_log(const loom_train_opts_t *o);
loom_train_observer_t *loom_train_observer_sampler(const loom_train_opts_t *o);
loom_train_observer_t *loom_train_observer_plot(const loom_train_opts_t *o);
loom_train_observer_t *loom_train_observer_checkpoint(const loom_train_opts_t *o);

#endif
