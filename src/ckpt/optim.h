/* optim: AdamW state in a checkpoint, one file per rank, so a ZeRO run
 * (where each rank holds only its shard of the moments) can resume.
 *
 *   checkpoints/step_N/optim-rank00000-of-00002.bin
 *
 * Header (little-endian): magic "LOOMOPT\0", u32 version 1, u32 header
 * bytes, u32 rank, u32 world, u32 zero stage, u32 0, u64 parameter count
 * P, u64 lo, u64 hi (this shard is floats [lo, hi) of the parameter
 * block), u64 step, u64 FNV-1a of the payload; then m[lo:hi], v[lo:hi] as
 * float32. ZeRO 0 writes one file (rank 0, the whole block). */
#ifndef LOOM_CKPT_OPTIM_H
#define LOOM_CKPT_OPTIM_H

#include <stdint.h>

#include "model/gpt.h"

typedef struct {
    uint32_t rank, world, zero;
    uint64_t params, lo, hi, step;
} loom_optim_shard_t;

/* The file name of a shard inside a checkpoint folder. */
void loom_optim_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world);
/* Write m, v (backend memory, hi-lo floats each) of shard `h` atomically. */
loom_status loom_optim_shard_save(const char *path, const loom_optim_shard_t *h, const loom_backend_t *be,
                                  const float *m, const float *v);
/* The same from host memory (a snapshot taken at the step boundary, for a
 * background writer). */
loom_status loom_optim_shard_save_host(const char *path, const loom_optim_shard_t *h, const float *m, const float *v);
/* The same written in pieces (a checkpoint of a model no process holds
 * whole, train/ckpt_stream.h): open writes a provisional header; put
 * appends floats of the payload, m[lo:hi] then v[lo:hi], in order;
 * close(commit = 1) writes the checksum, syncs and renames into place
 * (an error when fewer than 2 (hi - lo) floats came), close(0) drops it. */
typedef struct loom_optim_stream loom_optim_stream_t;
loom_status loom_optim_stream_open(loom_optim_stream_t **w, const char *path, const loom_optim_shard_t *h);
loom_status loom_optim_stream_put(loom_optim_stream_t *w, const float *x, size_t n);
loom_status loom_optim_stream_close(loom_optim_stream_t *w, int commit);
/* Read a shard written by loom_optim_shard_save; `want` names what the
 * caller expects (params, lo, hi); m, v are backend memory of hi-lo floats. */
loom_status loom_optim_shard_load(const char *path, const loom_optim_shard_t *want, const loom_backend_t *be,
                                  float *m, float *v, loom_optim_shard_t *got);

/* Elastic resume: read every shard of `ckpt_dir` (any world size and ZeRO
 * stage; each checked, all of one world, together covering the P =
 * `params` floats) and copy floats [lo, hi) of m and v into the host
 * arrays `m`, `v` (hi-lo floats each). `step` (non-zero) must match every
 * shard's step. `saved` gets the header of the last shard (its world and
 * ZeRO stage). */
loom_status loom_optim_gather(const char *ckpt_dir, uint64_t params, uint64_t step, size_t lo, size_t hi,
                              float *m, float *v, loom_optim_shard_t *saved);

/* The same in ranges, so no process needs the whole moments (a sharded
 * layout's resume, train/ckpt_stream.h): open checks every shard as
 * loom_optim_gather does (read in pieces, not held); read copies floats
 * [a, b) of m (which 0) or v (1) into `out`. */
typedef struct loom_optim_reader loom_optim_reader_t;
loom_status loom_optim_reader_open(loom_optim_reader_t **r, const char *ckpt_dir, uint64_t params, uint64_t step, loom_optim_shard_t *saved);
loom_status loom_optim_reader_read(loom_optim_reader_t *r, int which, size_t a, size_t b, float *out);
void loom_optim_reader_close(loom_optim_reader_t *r);

#endif
