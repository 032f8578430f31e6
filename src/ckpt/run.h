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

#endif
