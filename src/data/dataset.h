/* dataset: where training batches come from. A data path is either a folder
 * made by `loom tokenize` (train_*.bin and val_*.bin shards, tokenizer.json;
 * llm.c's shards load too), or a plain text file, which is tokenized in
 * memory with the byte-level tokenizer and split: the last `val_fraction`
 * of its tokens are held out for validation. */
#ifndef LOOM_DATASET_H
#define LOOM_DATASET_H

#include <stddef.h>

#include "core/core.h"
#include "data/tokenizer.h"

enum { LOOM_SPLIT_TRAIN = 0, LOOM_SPLIT_VAL = 1 };

typedef struct loom_dataset loom_dataset_t;

loom_status loom_dataset_open(loom_dataset_t **out, const char *path, double val_fraction);
/* The same, a text file tokenized with tok (a model's own: it must
 * outlive the dataset) instead of byte-level; NULL: byte-level. */
loom_status loom_dataset_open_tok(loom_dataset_t **out, const char *path, double val_fraction, const loom_tokenizer_t *tok);
void loom_dataset_free(loom_dataset_t *ds);
/* The tokenizer the data was made with (owned by the dataset); NULL when a
 * shard folder has no tokenizer.json (ids then cannot be decoded). */
const loom_tokenizer_t *loom_dataset_tokenizer(const loom_dataset_t *ds);
/* Vocabulary size the shards were written for (tokenizer's, else shard header's). */
int loom_dataset_vocab_size(const loom_dataset_t *ds);
size_t loom_dataset_ntokens(const loom_dataset_t *ds, int split);
/* Inputs and targets (B*T each) from the split's tokens starting at `pos`
 * (taken modulo the split's length, wrapping around its end): inputs are
 * tokens pos..pos+B*T-1, targets the same shifted by one. */
void loom_dataset_batch(const loom_dataset_t *ds, int split, size_t pos, int B, int T,
                        int *inputs, int *targets);
/* A one-line description for logs ("kjv.txt: 4.4M train + 0.4M val tokens, byte-level"). */
const char *loom_dataset_describe(const loom_dataset_t *ds);

#endif
