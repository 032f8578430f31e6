/* resume: what a restart may change and what it may not.
 *
 * A resumed run must take the steps the interrupted one would have taken.
 * Settings that change the math (sequence length, micro-batch, learning
 * rate and its schedule, AdamW's constants, clipping, seed, precision) are
 * refused with a message naming each one; the global batch (micro-batch x
 * sequence x accumulation x ranks) is kept, so another world size is
 * accepted when the accumulation can absorb it (2 ranks x accum 1 -> 1
 * rank x accum 2); more --steps, another ZeRO stage, threads and the
 * logging/checkpoint cadence are free. What changed is printed and
 * appended to the run's events.jsonl. */
#ifndef LOOM_CKPT_RESUME_H
#define LOOM_CKPT_RESUME_H

#include "ckpt/run.h"

/* This start's settings, as the trainer resolved them. */
typedef struct {
    int batch, seq, grad_accum, world_size, zero;
    long long steps, seed;
    int warmup;
    double lr, min_lr_ratio, weight_decay, clip, beta1, beta2;
    const char *dtype;      /* resolved precision name, e.g. "fp32" */
    const char *grad_dtype; /* "fp32" or "bf16" */
    const char *data_resolved; /* --data, realpath'd */
    double val_fraction;
    const char *model;         /* --model when given, else NULL */
    const char *init_from_run; /* --init-from-run, realpath'd; "" when none */
} loom_resume_settings_t;

/* Compare `now` with the run's config.json (what it started with) and the
 * checkpoint's state `st` (how its global batch was made). On success
 * *grad_accum is the accumulation to use on this world size; when `lead`,
 * the changes are logged and appended to `run`/events.jsonl. */
loom_status loom_resume_check(const char *run, const loom_resume_settings_t *now, const loom_ckpt_state_t *st,
                              int lead, int *grad_accum);

#endif
