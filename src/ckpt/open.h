/* open: a model for inference, from wherever it is stored, in one call.
 *
 * `loom sample`, `eval`, `generate`, `serve`, `bench generate|serve`,
 * `prune` and `export` all take a path to a model. What the path is gets
 * decided here, once (loom_open_detect):
 *
 *   run folder        config.json and checkpoints/ (loom train --out): its
 *                     newest complete checkpoint (or opts.step), the run's
 *                     tokenizer.json checked against the hash the
 *                     checkpoint recorded
 *   checkpoint        a folder with state.json (RUN/checkpoints/step_N):
 *                     that checkpoint, verified, and its run's tokenizer
 *   Hugging Face      a folder with config.json and no checkpoints/
 *                     (save_pretrained, loom export --format hf): ckpt/hf.h
 *   GGUF file         a file that starts with "GGUF": ckpt/gguf.h
 *
 * and anything else is an error that lists the four. The model config is
 * whatever the source's own reader returns (loom_gpt_config_t passes
 * through untouched), so a new model family needs a reader, not a change
 * here. The weights load on the CPU, move to opts.device, and get the int8
 * or 2:4 copies the inference forward runs (model/infer.h
 * loom_infer_weights_create): the result is what loom_engine_create and
 * loom_gpt_generate_with take. */
#ifndef LOOM_OPEN_H
#define LOOM_OPEN_H

#include "ckpt/run.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/infer.h"

typedef enum { LOOM_SOURCE_RUN, LOOM_SOURCE_CHECKPOINT, LOOM_SOURCE_HF, LOOM_SOURCE_GGUF } loom_source_kind;

/* "run folder", "checkpoint", "Hugging Face folder", "GGUF file". */
const char *loom_source_name(loom_source_kind k);
/* What `path` is (the table above). A missing path, or one that is none of
 * the four, is LOOM_EINVAL with a message that says what to pass. */
loom_status loom_open_detect(const char *path, loom_source_kind *kind);

typedef struct {
    const char *device;                /* "cpu" (NULL too), "cuda", "cuda:N" */
    int threads;                       /* CPU threads (0 = all cores) */
    long long step;                    /* a run's checkpoint of this step; < 0: the newest */
    loom_infer_weights_opts_t weights; /* int8 or 2:4 copies for the inference forward */
    loom_dtype kv_dtype;               /* the KV cache's element type: LOOM_FP32 or LOOM_INT8 */
    int config_only;                   /* 1: config, tokenizer, state and weights_path only; no model
                                          (loom export streams the weights file itself) */
    int keep_fp32;                     /* 1: keep the fp32 weights a GGUF's stored blocks replace (made into
                                          other copies afterwards); 0: given back (loom_infer_weights_release_fp32) */
} loom_open_opts_t;

/* The CPU, all cores, the newest checkpoint, fp32 weights with 2:4
 * compression when the model is 2:4 (LOOM_SPARSE_AUTO), an fp32 cache. */
loom_open_opts_t loom_open_opts_default(void);

typedef struct {
    loom_source_kind kind;
    char weights_path[4096];       /* the checkpoint or Hugging Face folder, or the GGUF file */
    loom_gpt_config_t cfg;         /* the source's model config */
    loom_gpt_t *model;             /* on opts.device; NULL with config_only */
    loom_tokenizer_t *tok;         /* NULL when the source has none */
    loom_ckpt_state_t state;       /* runs and checkpoints: step, losses, tokenizer hash; else zero */
    loom_infer_weights_t weights;  /* the copies opts.weights asked for (both NULL: fp32) */
    loom_dtype kv_dtype;           /* opts.kv_dtype, for the engine and the generator */
} loom_opened_t;

/* Open `path` (run folder, checkpoint, Hugging Face folder or GGUF file;
 * NULL is an error asking for --run) as `o` says. On an error nothing is
 * left to free and *out is zeroed. */
loom_status loom_open(const char *path, const loom_open_opts_t *o, loom_opened_t *out);
/* Free what loom_open loaded (a zeroed *r is fine). */
void loom_open_close(loom_opened_t *r);

#endif
