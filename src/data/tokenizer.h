/* tokenizer: text <-> token ids. The trainer only sees this interface, so
 * the byte-level tokenizer and BPE tokenizers plug in the same way.
 *
 * Byte-level: ids 0..255 are the bytes, 256 is "<|endoftext|>". It is the
 * special case of byte-level BPE with no merges, and is saved as such. */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../core/core.h"

typedef struct loom_tokenizer loom_tokenizer_t;

/* The byte-level tokenizer (vocabulary 257). */
loom_status loom_tokenizer_bytes(loom_tokenizer_t **out);
/* Load a tokenizer.json (loom's own or Hugging Face's BPE format). */
loom_status loom_tokenizer_load(loom_tokenizer_t **out, const char *path);
/* Save as a Hugging Face compatible tokenizer.json (atomically). */
loom_status loom_tokenizer_save(const loom_tokenizer_t *t, const char *path);
void loom_tokenizer_free(loom_tokenizer_t *t);

int loom_tokenizer_vocab_size(const loom_tokenizer_t *t);
/* Id of "<|endoftext|>", or -1 when the tokenizer has none. */
int loom_tokenizer_eot(const loom_tokenizer_t *t);
/* A fingerprint of the vocabulary and merges: equal hashes, same ids. */
uint64_t loom_tokenizer_hash(const loom_tokenizer_t *t);

/* Encode `len` bytes of text; *ids is malloc'd, caller frees. */
loom_status loom_tokenizer_encode(const loom_tokenizer_t *t, const char *text, size_t len,
                                  uint32_t **ids, size_t *n);
/* Decode ids to bytes; *text is malloc'd and NUL-terminated, caller frees.
 * An id outside the vocabulary is an error naming its position. */
loom_status loom_tokenizer_decode(const loom_tokenizer_t *t, const uint32_t *ids, size_t n,
                                  char **text, size_t *len);

#endif
