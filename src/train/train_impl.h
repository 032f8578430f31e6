/* train_impl: what train.c (the loop), setup.c (setup and teardown) and
 * checkpoint.c share. Not part of the public API. */
#ifndef LOOM_TRAIN_IMPL_H
#define LOOM_TRAIN_IMPL_H

#include "train/step_graph.h"
#include "train/train.h"

#define LOOM_TRAIN_MAX_OBS 32

/* A whole training job: the public view observers get, and the loop's own. */
typedef struct {
    loom_train_run_t run;
    loom_train_opts_t o;          /* run.o points here */
    loom_dataset_t *ds;
    loom_gpt_config_t cfg;
    int dtype, auto_dtype;        /* the --dtype asked for (loom_dtype); auto = chosen by loom */
    int recompute;                /* loom_recompute */
    int want_graphs, device_step, graphs;
    loom_step_graph_t *sg;        /* the device-resident step, NULL for the host step */
    loom_loss_scaler_t ls;
    loom_dp_opts_t dpo;
    loom_optim_t opt;
    int *in, *tg;                 /* this rank's micro-batches, (accum, B, T) */
    double peak;                  /* FLOP/s per rank the MFU is relative to */
    int peak_raised;
    int lock_fd;                  /* the run folder's writer lock (ckpt/run.h), -1 when not held */
    double best_achieved;         /* this rank's best model FLOP/s per rank so far */
    loom_ckpt_state_t rst;        /* the checkpoint resumed from */
    char rck[4096];               /* its folder */
    loom_train_observer_t *obs[LOOM_TRAIN_MAX_OBS];
    loom_dist_t *tp_group, *dp_group; /* --tp: this rank's groups (train/setup_tp.c) */
    float *tp_m, *tp_v;           /* rank 0 under --tp: the whole AdamW moments while a checkpoint is taken */
    loom_dp_t *tp_dp;             /* --tp: the data-parallel reduction (and ZeRO) over dp_group, NULL without either */
} loom_train_job_t;

/* observers.c: SIGINT/SIGTERM handlers for the whole job (install before
 * setup; restore is idempotent), read by the signals observer. */
void loom_train_signals_install(void);
void loom_train_signals_restore(void);

/* setup.c: everything before the first step, and its undoing. */
loom_status loom_train_setup(loom_train_job_t *j, loom_dist_t *dist);
void loom_train_teardown(loom_train_job_t *j);
/* Every rank's peak resident memory (VmHWM), printed by rank 0; a
 * collective, for when every rank reached the end of the loop. */
void loom_train_report_memory(loom_train_job_t *j);

/* checkpoint.c: load the resumed checkpoint's weights and this rank's part
 * of its AdamW state, from shards of any world size and ZeRO stage. */
loom_status loom_train_load_checkpoint(loom_train_job_t *j);

/* setup_tp.c: --tp. The groups, the shard cut from run->model (the whole
 * model, built and maybe loaded; kept on rank 0 for checkpoints), the
 * resumed checkpoint sliced. Teardown frees what it made. */
loom_status loom_train_setup_tp(loom_train_job_t *j, loom_dist_t *dist);
void loom_train_teardown_tp(loom_train_job_t *j);
/* Before a checkpoint: the shards gathered into run->ckpt_model (rank 0)
 * and the whole AdamW moments into *m, *v (backend memory on rank 0, NULL
 * elsewhere; [0, P) of the whole block); after submit: released. */
loom_status loom_train_tp_gather(loom_train_run_t *run, float **m, float **v, size_t *hi);
void loom_train_tp_release(loom_train_run_t *run);

#endif
