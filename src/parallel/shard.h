/* shard: how ZeRO splits a block of floats over data-parallel ranks. One
 * layout, used by the trainer (train/step.c, loom_dp_init) and by the
 * planner (plan/plan.c), which must agree on every rank's bytes. */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stddef.h>

/* Rank `rank`'s shard [*lo, *hi) of a block of n floats over `world`
 * ranks: shards of equal size rounded up to 16 floats (64 bytes), the
 * last one shorter (or empty). */
void loom_dp_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi);

#endif
