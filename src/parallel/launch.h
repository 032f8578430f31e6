/* launch: start N ranks of one job on this machine and wait for them (what
 * `loom train --nproc N` and `loom bench dist` use). Each rank is a forked
 * child with the torchrun environment -- RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT (or, over
 * several machines, the given MASTER_ADDR/MASTER_PORT) -- so loom_dist_init
 * in it joins the others over TCP. SIGINT and SIGTERM that
 * reach the launcher are passed on to every rank. When a rank fails, the
 * others stop on their own (their collectives time out, naming it) or are
 * killed `kill_after_s` later. */
#ifndef LOOM_LAUNCH_H
#define LOOM_LAUNCH_H

#include "core/core.h"

typedef struct {
    const char *what;        /* names the job in messages: "loom train" */
    int nproc;               /* ranks to start on this machine, >= 1 */
    /* Several machines (torchrun's --nnodes/--node-rank): this machine's
     * ranks are node_rank * nproc .. + nproc - 1 of nnodes * nproc, and
     * MASTER_ADDR / MASTER_PORT come from the environment (node 0's
     * address). nnodes 0 or 1: one machine, 127.0.0.1 and a free port. */
    int nnodes, node_rank;
    double kill_after_s;     /* after the first failure, SIGKILL the rest this much later */
    /* What each rank runs: either exec this program again with `argv`
     * (argv[0] first, NULL-terminated) ... */
    char *const *argv;
    /* ... or, when argv is NULL, call run(rank, ctx) in the forked child;
     * its return value is the rank's exit status. */
    int (*run)(int rank, void *ctx);
    void *ctx;
} loom_launch_t;

/* Start the ranks and wait for all of them. *exit_code is 0 when every rank
 * exited 0, else the first failing rank's status (128 + signal for a killed
 * one); each failure is reported on stderr. Fails (LOOM_EINVAL) inside a
 * job that is itself launched (RANK and WORLD_SIZE set), over several
 * machines without MASTER_ADDR and MASTER_PORT, and when a rank cannot be
 * started. */
loom_status loom_launch_local(const loom_launch_t *l, int *exit_code);

#endif
