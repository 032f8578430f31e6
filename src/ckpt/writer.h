/* writer: checkpoints written in the background, at most one in flight.
 *
 * At a step boundary loom_ckpt_writer_submit copies what the checkpoint
 * needs to host memory (rank 0: the parameters; every rank: its AdamW
 * shard) and returns; a thread writes the files into .tmp-step_N and
 * fsyncs them while training goes on. On one rank the same thread then
 * commits (manifest, rename, `latest`, prune: ckpt/checkpoint.h). On
 * several ranks a checkpoint is complete only when every rank's shard is
 * in, which only the ranks together know: each rank adds
 * loom_ckpt_writer_poll()'s flags to a collective the loop already makes,
 * and loom_ckpt_writer_agreed() on the sums lets rank 0 commit when no
 * rank is busy. A new submit first
 * waits for the previous checkpoint, so memory holds one snapshot. */
#ifndef LOOM_CKPT_WRITER_H
#define LOOM_CKPT_WRITER_H

#include "ckpt/run.h"
#include "model/gpt.h"

typedef struct loom_ckpt_writer loom_ckpt_writer_t;

typedef struct {
    const char *run;      /* run folder */
    const loom_gpt_t *m;  /* its config and parameter table are read by the thread */
    int rank, world;      /* this process, and how many write shards */
    int zero;             /* ZeRO stage: 0 = rank 0 writes the whole AdamW state */
    int keep;             /* checkpoints kept (>= 1) */
    int async;            /* 0: submit writes (and commits, one rank) before returning */
    /* Where the parameters come from when the model does not hold them
     * whole (ZeRO-3, train/zero3.h): called on every rank at submit (a
     * collective), with rank 0's P-float host snapshot and NULL elsewhere.
     * NULL = rank 0 downloads m->params. */
    loom_status (*gather_params)(void *ctx, float *host);
    void *gather_ctx;
    /* A layout no rank holds whole (--tp, --pp): the parameters and the
     * AdamW state are written at submit by this call, unit by unit
     * (train/ckpt_stream.h; a collective on every rank, `dir` the
     * checkpoint's temporary folder on rank 0 and NULL elsewhere), not
     * from host snapshots, so no rank needs the whole model's memory; the
     * thread writes the rest (state.json, config) and the commit is as
     * always. m may be NULL then: cfg is the whole model's. */
    loom_status (*write_stream)(void *ctx, const char *dir, long long step);
    void *stream_ctx;
    const loom_gpt_config_t *cfg;
} loom_ckpt_writer_opts_t;

loom_status loom_ckpt_writer_open(loom_ckpt_writer_t **w, const loom_ckpt_writer_opts_t *o);
/* Snapshot and start writing the checkpoint of st->step. m, v are this
 * rank's AdamW shard (backend memory, floats [lo, hi) of the parameter
 * block); ignored on ranks > 0 under ZeRO-0. Returns an earlier
 * background write's error, if any. */
loom_status loom_ckpt_writer_submit(loom_ckpt_writer_t *w, const loom_ckpt_state_t *st,
                                    const float *m, const float *v, size_t lo, size_t hi);
/* Several ranks: what this rank adds to the loop's per-step collective
 * (summed over ranks): busy[0] = 1 while its files are being written,
 * busy[1] = 1 when they failed. Then every rank passes the sums to
 * loom_ckpt_writer_agreed: when a checkpoint is pending and no rank is
 * busy, rank 0 commits it in the background if no rank failed, else it
 * is dropped with an error. */
void loom_ckpt_writer_poll(loom_ckpt_writer_t *w, double busy[2]);
loom_status loom_ckpt_writer_agreed(loom_ckpt_writer_t *w, const double sums[2]);
/* A sum over ranks of n doubles, in place (the loop's allreduce). */
typedef loom_status (*loom_ckpt_agree_fn)(double *v, int n, void *ctx);
/* Finish what is in flight on every rank before going on: wait for this
 * rank's files, agree, rank 0 commits (in this thread), agree again, so
 * no rank returns (or exits) while another still writes. `agree` may be
 * NULL on one rank. */
loom_status loom_ckpt_writer_settle(loom_ckpt_writer_t *w, loom_ckpt_agree_fn agree, void *ctx);
/* Wait until this rank's files (and, on rank 0 of one, the commit) are
 * done; the error of the background write, if any. No collective. */
loom_status loom_ckpt_writer_wait(loom_ckpt_writer_t *w);
/* Seconds the caller spent in submit (snapshot plus waiting for the
 * previous write) and the background spent writing, since open. */
void loom_ckpt_writer_times(const loom_ckpt_writer_t *w, double *blocked_s, double *write_s);
/* Waits for what is in flight, then frees. */
void loom_ckpt_writer_free(loom_ckpt_writer_t *w);

#endif
