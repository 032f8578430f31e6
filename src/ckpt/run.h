/* run: the run folder.
 *
 *   runs/NAME/config.json        resolved run config (model, data, optimizer)
 *   runs/NAME/metrics.jsonl      one JSON object per logged step
 *   runs/NAME/loss.svg           train/val loss plot
 *   runs/NAME/tokenizer.json     the tokenizer the run trained with
 *   runs/NAME/latest             name of the newest complete checkpoint
 *   runs/NAME/checkpoints/step_NNNNNNNN/
 *       model.safetensors        weights (Hugging Face GPT-2 names)
 *       config.json              Hugging Face GPT2Config
 *       state.json               step, loss, data position, tokenizer hash
 *
 * A checkpoint is written into checkpoints/.tmp-step_N, synced and renamed
 * into place, and only then is `latest` replaced (atomically), so a crash
 * never leaves a half-written latest checkpoint. */
#ifndef LOOM_RUN_H
#define LOOM_RUN_H

#include <stdint.h>

#include "model/gpt.h"

/* The run's config.json: what the run is -- data, model, how the step
 * runs, the optimizer. One writer and one reader; the model block uses the
 * same keys as the checkpoints' Hugging Face config.json (n_layer, n_head,
 * n_embd, n_positions, vocab_size). Format "loom-run-1"; keys a reader does
 * not find keep the defaults of loom_run_config_defaults (older runs lack
 * val_fraction). */
#define LOOM_RUN_FORMAT "loom-run-1"

typedef struct {
    char format[32];
    char data[4096], data_description[512], model[64];
    char data_resolved[4096]; /* --data as realpath resolved it at the start ("" in older runs): eval from elsewhere, resume checks */
    char init_from_run[4096]; /* --init-from-run, resolved ("" when none) */
    loom_gpt_config_t model_cfg;
    char device[64], dtype[16], dtype_source[16], loss_scaling[16], recompute[16], step[16], grad_dtype[16];
    char peak_flops_source[512];
    int cuda_graphs, threads, batch, seq, grad_accum, world_size, zero, warmup;
    long long steps, seed;
    double lr, min_lr_ratio, weight_decay, clip, beta1, beta2, val_fraction;
    uint64_t tokenizer_hash;
} loom_run_config_t;

/* Defaults for fields an older config.json lacks. */
void loom_run_config_defaults(loom_run_config_t *c);
/* Write dir/config.json atomically. */
loom_status loom_run_config_write(const char *dir, const loom_run_config_t *c);
/* Read dir/config.json; a folder without one, or another format, is an
 * error that says what was found. */
loom_status loom_run_config_read(const char *dir, loom_run_config_t *c);

/* Take the run folder's writer lock: flock on dir/.lock (made, with dir,
 * when missing), held until the process ends, the kernel releasing it
 * when the process dies, so a killed run never leaves a stale lock. A
 * second writer is refused naming the holder's PID; call before anything
 * in the folder is touched (resume's clean-up, --force). Readers take no
 * lock. The descriptor stays open for the life of the process. */
#define LOOM_RUN_LOCK ".lock"
/* The refusals of loom_run_prepare alone (read-only): a file where the
 * folder goes, or a non-empty folder without `force`. */
loom_status loom_run_check_new(const char *dir, int force);
loom_status loom_run_lock(const char *dir, int *fd);

/* Prepare `dir` for a new run. An existing non-empty folder is refused
 * unless `force`, in which case loom's own files in it are removed. */
loom_status loom_run_prepare(const char *dir, int force);

typedef struct {
    long long step;
    double train_loss, val_loss; /* val_loss < 0: not measured */
    unsigned long long data_pos; /* next training token */
    uint64_t tokenizer_hash;
    /* How the global batch was made when saved (0: not recorded, an older
     * checkpoint): ranks, ZeRO stage, micro-batch, sequence, accumulation. */
    int world_size, zero, batch, seq, grad_accum;
    /* fp16 dynamic loss scaling (0: the run has none): the scale, good steps
     * since it last changed, steps skipped so far; --resume continues them */
    float loss_scale;
    int loss_scale_good;
    long long loss_scale_skipped;
} loom_ckpt_state_t;

/* config.json (Hugging Face GPT2Config) and state.json of a checkpoint
 * into folder `tmp` (see ckpt/checkpoint.h for the rest of the protocol). */
loom_status loom_run_write_ckpt_meta(const char *tmp, const loom_gpt_config_t *cfg, const loom_ckpt_state_t *st);

/* Write a checkpoint of `m` for `st->step`; keep the newest `keep`. */
loom_status loom_run_save_checkpoint(const char *dir, const loom_gpt_t *m,
                                     const loom_ckpt_state_t *st, int keep);
/* The same, calling extra(tmp_dir, ctx) after the checkpoint's own files are
 * written and before the folder is synced and renamed: the place to add
 * more files (every rank's optimizer shard) to the same atomic checkpoint. */
loom_status loom_run_save_checkpoint_with(const char *dir, const loom_gpt_t *m,
                                          const loom_ckpt_state_t *st, int keep,
                                          loom_status (*extra)(const char *tmp_dir, void *ctx), void *ctx);
/* Read the model config and state of the newest complete checkpoint of a
 * run (see ckpt/checkpoint.h: verified against its manifest; state.json
 * checked for range and against the folder's step). */
loom_status loom_run_latest(const char *dir, char *ckpt_dir, size_t cap,
                            loom_gpt_config_t *cfg, loom_ckpt_state_t *st);

/* The same for a chosen checkpoint: `which` is NULL/"latest"/"auto" (the
 * newest) or "step_N"/"N". */
loom_status loom_run_find(const char *dir, const char *which, char *ckpt_dir, size_t cap,
                          loom_gpt_config_t *cfg, loom_ckpt_state_t *st);
/* One checkpoint folder by its path (RUN/checkpoints/step_N, or a copy of
 * one elsewhere): verified against its manifest, then its model config and
 * state as loom_run_find reads them. */
loom_status loom_run_read_checkpoint(const char *ckpt_dir, loom_gpt_config_t *cfg, loom_ckpt_state_t *st);

#endif
