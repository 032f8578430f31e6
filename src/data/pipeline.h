/* pipeline: text files in, a data folder out (what `loom tokenize` does).
 * The input -- files, or folders read in name order -- is streamed in
 * chunks cut where no pre-token changes, so memory stays bounded whatever
 * the corpus size. A byte-level BPE tokenizer is trained on it (counting
 * words with threads, then merging), or a given one is used; the text is
 * then encoded by `threads` encoders in parallel, the first `val_fraction`
 * of its bytes into val_NNNNNN.bin shards and the rest into
 * train_NNNNNN.bin shards of at most `shard_tokens` tokens each
 * (data/shard.h), each input file starting with the end-of-text token.
 * tokenizer.json goes beside them. */
#ifndef LOOM_PIPELINE_H
#define LOOM_PIPELINE_H

#include <stddef.h>

#include "data/tokenizer.h"

/* Progress of a stage ("counting", "merging", "encoding"): `done` of
 * `total` in `unit` ("MB" or "merges"), `extra` a short note; final = 1
 * once at the stage's end. */
typedef void (*loom_pipeline_progress_fn)(void *ctx, const char *stage, double done, double total, const char *unit,
                                          const char *extra, int final);

typedef struct {
    const char *const *inputs; /* files or folders (every non-hidden file in them, sorted) */
    int ninputs;
    const char *out;           /* data folder to write (created) */
    const loom_tokenizer_t *tokenizer; /* use this one; NULL = train one */
    long long vocab;           /* vocabulary to train: bytes, merges and specials */
    const char *const *specials; /* special tokens for training, cut out of the text */
    int nspecial;
    int min_frequency;         /* stop merging when the best pair is rarer */
    double val_fraction;       /* leading share of the bytes for validation */
    size_t shard_tokens;       /* tokens per shard file */
    int threads;               /* >= 1 */
    loom_pipeline_progress_fn progress; /* NULL = silent */
    void *progress_ctx;
} loom_pipeline_opts_t;

typedef struct {
    int vocab, merges, nspecial;             /* of the tokenizer written */
    size_t train_tokens, val_tokens;
    int train_shards, val_shards;
    size_t bytes;                            /* of text read */
    double train_s, encode_s;                /* training (0 with a given tokenizer), encoding with shards */
} loom_pipeline_result_t;

/* Run the whole pipeline into o->out. Shards left there by an earlier run
 * beyond the new ones are removed (`loom train` would read them as data). */
loom_status loom_pipeline_run(const loom_pipeline_opts_t *o, loom_pipeline_result_t *r);

#endif
