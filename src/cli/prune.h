/* prune: the --keep-sparsity observer of `loom train` (cli/prune.c). */
#ifndef LOOM_CLI_PRUNE_H
#define LOOM_CLI_PRUNE_H

#include "train/train.h"

/* An observer that takes the zeros of the model's linear weights at the
 * start and zeroes them again after every optimizer step. Freed by the
 * loop through its `free` hook (the struct itself: see the observer's
 * ownership in train.h). */
loom_train_observer_t *loom_keep_sparsity_observer(void);

#endif
