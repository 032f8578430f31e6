/* dist: ranks and collectives for data-parallel training.
 *
 * One interface, four transports, chosen at loom_dist_init from how the
 * process was launched:
 *   single  one process (always available)
 *   mpi     mpirun / srun with Open MPI (OMPI_COMM_WORLD_*, PMIX_RANK);
 *           CPU buffers; needs a build with MPI (LOOM_HAVE_MPI)
 *   tcp     the torchrun convention (RANK, WORLD_SIZE, LOCAL_RANK,
 *           MASTER_ADDR, MASTER_PORT), also `loom train --nproc N` and
 *           srun without MPI (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID +
 *           MASTER_ADDR/MASTER_PORT): a rendezvous at the master, a full
 *           mesh of sockets, ring collectives over CPU buffers
 *   nccl    GPU buffers (LOOM_HAVE_CUDA), bootstrapped by mpi or tcp,
 *           which exchange the NCCL unique id; ops on their own stream
 *
 * Collectives sum. Every data collective works in place on a buffer of
 * floats in "collective memory": host memory for mpi/tcp/single, device
 * memory for nccl. Non-blocking ops (loom_dist_i*) run in issue order on
 * a communication thread (a separate stream for NCCL) and complete at
 * loom_dist_wait.
 *
 * Failure: every rank runs a watchdog thread with a heartbeat socket to
 * every other rank. A rank whose process dies (its sockets close) or that
 * stops answering heartbeats for `timeout_s`, or a collective that waits
 * longer than `timeout_s`, makes every surviving rank print a message
 * naming the rank and exit with status 3. */
#ifndef LOOM_DIST_H
#define LOOM_DIST_H

#include <stddef.h>

#include "../core/core.h"

typedef enum { LOOM_DIST_FP32 = 0, LOOM_DIST_BF16 } loom_dist_dtype;

typedef struct {
    const char *transport; /* "auto" (from the environment), "single", "mpi", "tcp" */
    int gpu;               /* 1: data collectives on device buffers through NCCL */
    int device;            /* CUDA device index for NCCL; -1 = the local rank */
    double timeout_s;      /* collective / heartbeat timeout; 0 = 300 s */
} loom_dist_opts_t;

typedef struct loom_dist loom_dist_t;

/* Join the job the environment describes. A launch that asks for more
 * than one rank through a transport this build lacks is LOOM_EUNAVAIL with
 * what is missing. */
loom_status loom_dist_init(loom_dist_t **out, const loom_dist_opts_t *o);
/* Leave the job: a last barrier, then close everything. NULL is fine. */
void loom_dist_free(loom_dist_t *d);

/* A TCP port on 127.0.0.1 that is free right now (for a local
 * rendezvous: --nproc, loom bench dist); `fallback` if none is found. */
int loom_dist_free_port(int fallback);

int loom_dist_rank(const loom_dist_t *d);
int loom_dist_size(const loom_dist_t *d);
int loom_dist_local_rank(const loom_dist_t *d);
/* "single", "mpi", "tcp", "mpi+nccl", "tcp+nccl". */
const char *loom_dist_name(const loom_dist_t *d);
/* What this build can do, one line (for --help and error messages). */
const char *loom_dist_available(void);

/* Blocking collectives. Each first waits for the non-blocking ops issued
 * before it. */
loom_status loom_dist_barrier(loom_dist_t *d);
/* bytes of host memory from `root` to everyone. */
loom_status loom_dist_broadcast(loom_dist_t *d, void *host_buf, size_t bytes, int root);
/* Sum of n host doubles (losses, norms): small, exact order on every rank. */
loom_status loom_dist_allreduce_f64(loom_dist_t *d, double *host_buf, size_t n);
/* buf (n floats, collective memory) = scale * sum over ranks, reduced in dt. */
loom_status loom_dist_allreduce(loom_dist_t *d, float *buf, size_t n, loom_dist_dtype dt,
                                float scale);
/* The element type of a buffer summed as it is stored: tensor
 * parallelism's activations at the backend's act_dtype. */
typedef enum { LOOM_DIST_ELEM_FP32 = 0, LOOM_DIST_ELEM_BF16, LOOM_DIST_ELEM_FP16 } loom_dist_elem;
/* buf (n elements of type t, collective memory) = its sum over ranks.
 * NCCL sums 16-bit elements natively (each step of its ring adds in fp32
 * and rounds to t); mpi and tcp widen them to fp32, sum, and round once
 * (docs/dist.md, "Tensor parallel on GPUs"). */
loom_status loom_dist_allreduce_elem(loom_dist_t *d, void *buf, size_t n, loom_dist_elem t);
/* buf holds sum(counts) floats, rank r's segment at offset sum(counts[0..r)).
 * On return this rank's segment holds scale * the sum over ranks of that
 * segment; the rest of buf is unspecified. counts has loom_dist_size entries
 * (zeros allowed). */
loom_status loom_dist_reduce_scatter(loom_dist_t *d, float *buf, const size_t *counts,
                                     loom_dist_dtype dt, float scale);
/* buf laid out as for reduce_scatter: every rank's segment is copied to
 * every rank. */
loom_status loom_dist_allgather(loom_dist_t *d, float *buf, const size_t *counts);

/* Non-blocking versions: issue and return; `buf` must not be touched until
 * loom_dist_wait. counts is copied. */
loom_status loom_dist_iallreduce(loom_dist_t *d, float *buf, size_t n, loom_dist_dtype dt,
                                 float scale);
loom_status loom_dist_ireduce_scatter(loom_dist_t *d, float *buf, const size_t *counts,
                                      loom_dist_dtype dt, float scale);
/* The all-gather's non-blocking version (fully sharded data parallel
 * prefetches the next layer's weights with it while this one computes). */
loom_status loom_dist_iallgather(loom_dist_t *d, float *buf, const size_t *counts);
/* Wait for every non-blocking op issued so far; the first failure's status. */
loom_status loom_dist_wait(loom_dist_t *d);
/* A mark after the ops issued so far; loom_dist_wait_mark waits for those
 * only, so an op issued later (a gradient reduce-scatter) keeps running
 * while the caller uses what an earlier one (a prefetched gather) brought.
 * Ops still complete in issue order. */
long loom_dist_mark(loom_dist_t *d);
loom_status loom_dist_wait_mark(loom_dist_t *d, long mark);

/* Point to point, for pipeline stages: send `sbytes` of collective memory
 * at `sbuf` to rank `dst` while receiving `rbytes` into `rbuf` from rank
 * `src`, both at once (neighbouring stages exchange activations and
 * gradients in the same phase of the schedule; two blocking sends of
 * large buffers would deadlock on full socket buffers). dst or src < 0
 * skips that side. Blocking: first waits for the non-blocking ops issued
 * before it. A 1-rank job has no peer: an error. */
loom_status loom_dist_sendrecv(loom_dist_t *d, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                               size_t rbytes, int src);
loom_status loom_dist_send(loom_dist_t *d, const void *buf, size_t bytes, int dst);
loom_status loom_dist_recv(loom_dist_t *d, void *buf, size_t bytes, int src);

/* Seconds the calling thread has spent blocked in collectives and waits,
 * and bytes this rank has handed to collectives, since init. */
double loom_dist_wait_seconds(const loom_dist_t *d);
double loom_dist_bytes(const loom_dist_t *d);

/* ---- Process groups ----
 * loom_dist_split is MPI_Comm_split: every rank of d calls it (a
 * collective, from the thread that issues d's ops); the ranks that pass
 * the same color form one group, ranked by key (ties by their rank in d).
 * *out is a loom_dist_t like any other -- rank, size and every collective
 * above work on it and reach only its members -- with connections (tcp),
 * a communicator (mpi, nccl) and a communication thread of its own, so
 * one group's ops never queue behind another's. A group of one is a
 * single-rank loom_dist_t. d's watchdog covers the group: a member that
 * dies, or a group collective that waits longer than the timeout, ends
 * every rank with a message. Free groups (loom_dist_free) before d.
 *
 * Layouts place tp innermost: world rank = (dp * pp_size + pp) * tp_size +
 * tp, so a tp group is tp_size consecutive ranks; the tp group is
 * loom_dist_split(world, rank / tp_size, rank) and the dp group (ranks with
 * the same tp and pp index) loom_dist_split(world, rank % (tp_size *
 * pp_size), rank). */
#define LOOM_DIST_MAX_GROUPS 8
loom_status loom_dist_split(loom_dist_t *d, int color, int key, loom_dist_t **out);

/* Exit code of a rank that the watchdog ends. */
#define LOOM_DIST_EXIT_PEER 3

#endif
