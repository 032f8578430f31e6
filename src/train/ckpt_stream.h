/* ckpt_stream: the single-model checkpoint of a run that no process holds
 * whole (--tp, --pp, both), written unit by unit so that no rank needs
 * memory for the whole model.
 *
 * A unit is one layer's slice of a per-layer tensor (qkvw of layer 3) or
 * one whole non-layer tensor (wte, wpe, lm_head, lnf): every tensor of the
 * safetensors file lies inside one unit. For each of the three blocks
 * (parameters, AdamW m, AdamW v) the writer asks the layout for each unit
 * in block order -- a collective: every rank calls the gather with the
 * same arguments, the unit's holders give their shards, rank 0 gets the
 * unit whole -- and rank 0 writes it at once: the parameters into
 * model.safetensors (ckpt/safetensors.h, the stream writer), m then v into
 * one optimizer file `optim-rank00000-of-00001.bin` (ckpt/optim.h, the
 * stream writer), exactly the files a one-process run writes. Memory on
 * rank 0: one unit and its holders' pieces (the largest unit is the
 * embedding, V x C); on the others: their pieces of one unit. */
#ifndef LOOM_TRAIN_CKPT_STREAM_H
#define LOOM_TRAIN_CKPT_STREAM_H

#include "ckpt/optim.h"
#include "model/gpt.h"

enum { LOOM_UNIT_PARAMS, LOOM_UNIT_M, LOOM_UNIT_V };

/* Gather unit (param, layer) of block `which` (LOOM_UNIT_*) onto rank 0:
 * `out` holds the unit's floats there (NULL on other ranks). layer is -1
 * for a non-layer tensor. */
typedef loom_status (*loom_unit_gather_fn)(void *ctx, int which, int param, int layer, float *out);

typedef struct {
    loom_gpt_config_t cfg;   /* the whole model */
    int lead;                /* rank 0: writes the files */
    int zero;                /* the run's --zero, in the optimizer file's header: one file, whole, at
                              * any stage, which a loader tells from a ZeRO-0 file a state.json was
                              * tampered to call ZeRO-1+ (train/checkpoint.c) */
    loom_unit_gather_fn gather;
    void *ctx;
} loom_ckpt_stream_t;

/* 1 when parameter i is stored per layer, (L, ...). */
int loom_ckpt_unit_per_layer(int i);
/* Floats of one unit of parameter i under cfg (a layer's slice, or the
 * whole tensor), and its first float in the whole parameter block. */
size_t loom_ckpt_unit_floats(const loom_tensor_info_t *table, int i, int layer, size_t *offset);
/* Write model.safetensors and the optimizer file of step `step` into
 * folder `dir` (rank 0; NULL elsewhere). A collective: every rank calls it,
 * and a write error on rank 0 does not stop the gathers (the others finish
 * theirs), it is returned at the end. */
loom_status loom_ckpt_stream_write(const loom_ckpt_stream_t *cs, const char *dir, long long step);

/* Resume, unit by unit: `put` gets each unit of the checkpoint in `dir`
 * (whole-model layout; blocks: a mask of 1 << LOOM_UNIT_*) that `want`
 * (NULL: every unit) says this rank holds, so a pipeline stage reads its
 * own layers only and no rank holds more than one unit of the file at a
 * time. The optimizer shards are checked whole first (checksums, in
 * pieces; ckpt/optim.h), whichever layout wrote them; `saved` gets the
 * last one's header. No collective. */
typedef int (*loom_unit_want_fn)(void *ctx, int param, int layer);
typedef loom_status (*loom_unit_put_fn)(void *ctx, int which, int param, int layer, const float *x);
loom_status loom_ckpt_stream_read(const loom_gpt_config_t *cfg, const char *dir, long long step, int blocks, loom_unit_want_fn want,
                                  loom_unit_put_fn put, void *ctx, loom_optim_shard_t *saved);

#endif
