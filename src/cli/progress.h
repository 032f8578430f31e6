/* progress: the training progress line on stderr ("step 10/30 | loss 4.47
 * | val 4.43 | lr 6.00e-05 | norm 4.49 | 451 tok/s | MFU 21.8% | ETA 19s"),
 * redrawn in place on a terminal and one line every --log-every steps
 * otherwise, and the summary when the run ends. A training observer. */
#ifndef LOOM_PROGRESS_H
#define LOOM_PROGRESS_H

#include "train/train.h"

/* A progress observer for a run with options `o` (prints on rank 0 only).
 * Freed by the run (its free hook). */
loom_train_observer_t *loom_progress_observer(const loom_train_opts_t *o);

/* A progress bar for long stages ("encoding [####......] 40% 12.0/30.0 MB,
 * 8.1 MB/s, 1.20M tokens, ETA 0:02"): redrawn at most 10 times a second on
 * a terminal, once every 10 s into a log. */
typedef struct {
    char stage[32];
    double start, last;
    int tty, quiet;
} loom_progress_bar_t;

void loom_progress_bar_init(loom_progress_bar_t *p, int quiet);
/* Show `done` of `total` `unit` for `stage` (a new stage restarts the
 * clock); final = 1 ends the stage's line. Fits loom_pipeline_progress_fn. */
void loom_progress_bar_show(void *p, const char *stage, double done, double total, const char *unit, const char *extra,
                            int final);

/* "45s", "3m05s", "2h10m"; "?" when unknown. */
void loom_progress_fmt_eta(double seconds, char *buf, size_t cap);

#endif
