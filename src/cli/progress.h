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

/* "45s", "3m05s", "2h10m"; "?" when unknown. */
void loom_progress_fmt_eta(double seconds, char *buf, size_t cap);

#endif
