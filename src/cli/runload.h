/* runload: open a run's newest checkpoint for `loom sample` and `loom eval`. */
#ifndef LOOM_RUNLOAD_H
#define LOOM_RUNLOAD_H

#include "ckpt/run.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

/* Load the model of the newest checkpoint of `run` onto the CPU backend
 * with `threads`, and the run's tokenizer (checked against the hash the
 * checkpoint recorded). */
loom_status loom_run_open(const char *run, int threads, loom_gpt_t **model,
                          loom_tokenizer_t **tok, loom_ckpt_state_t *st);

#endif
