/* runload: open a run's newest checkpoint for the commands that read one
 * (sample, eval, generate, serve, prune, bench generate and bench serve). */
#ifndef LOOM_RUNLOAD_H
#define LOOM_RUNLOAD_H

#include "ckpt/run.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

/* A run's newest checkpoint, loaded. */
typedef struct {
    loom_gpt_t *model;
    loom_tokenizer_t *tok;   /* NULL when the run has no tokenizer.json */
    loom_ckpt_state_t state; /* step, losses, data position, tokenizer hash */
} loom_opened_run_t;

/* Load the model of the newest checkpoint of `run` onto the CPU backend
 * with `threads`, and the run's tokenizer (checked against the hash the
 * checkpoint recorded). run == NULL: an error asking for --run. */
loom_status loom_run_open(const char *run, int threads, loom_opened_run_t *out);
/* Free what loom_run_open loaded. */
void loom_run_close(loom_opened_run_t *r);

#endif
