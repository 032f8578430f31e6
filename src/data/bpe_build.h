/* bpe_build: how the loaders and the trainer construct a tokenizer (private
 * to src/data). */
#ifndef LOOM_BPE_BUILD_H
#define LOOM_BPE_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct {
    int vocab_size;
    const unsigned char *const *tok; /* bytes of each id (specials: their text) */
    const size_t *tok_len;
    const uint8_t *special;          /* 1 for special (added) tokens */
    const uint32_t (*merges)[2];     /* in rank order */
    size_t nmerges;
    int add_prefix_space;
    int ignore_merges;               /* a word in the vocabulary is one token */
    int use_regex;                   /* 0: no GPT-2 pre-tokenization */
    const char *origin;              /* file name for messages about the vocabulary */
    const char *merges_origin;       /* ... and about merges (NULL: origin) */
    long merge_line0;                /* > 0: merge i is on line merge_line0 + i */
} loom_bpe_spec_t;

/* Check and index a vocabulary and merges: every byte must have a token,
 * token bytes must be distinct, each merge's parts and result must be in the
 * vocabulary and no merge may repeat. Errors name the origin and position. */
loom_status loom_tokenizer_build(loom_tokenizer_t **out, const loom_bpe_spec_t *spec);

#endif
