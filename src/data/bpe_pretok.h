/* bpe_pretok: GPT-2's pre-tokenization, written by hand. It splits text the
 * way the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * does in Hugging Face tokenizers' ByteLevel pre-tokenizer, so BPE merges
 * never cross a word, number, punctuation or whitespace boundary. Bytes that
 * are not valid UTF-8 count as one "other" character each (neither letter,
 * number nor space), so any byte string splits, and the pieces concatenate
 * back to the input. */
#ifndef LOOM_BPE_PRETOK_H
#define LOOM_BPE_PRETOK_H

#include <stddef.h>

enum { LOOM_CC_OTHER = 0, LOOM_CC_LETTER = 1, LOOM_CC_NUMBER = 2, LOOM_CC_SPACE = 3 };

/* Class of the code point (LOOM_CC_*). */
int loom_pretok_class(unsigned cp);
/* Decode one character at s[i] (len bytes in all): sets *cp (0xFFFFFFFF for
 * an invalid byte) and returns its length in bytes (>= 1). */
int loom_utf8_next(const unsigned char *s, size_t len, size_t i, unsigned *cp);

/* End (exclusive) of the pre-token that starts at s[i], i < len. */
size_t loom_pretok_next(const unsigned char *s, size_t len, size_t i);

/* A cut point in s[0..len) at or before `want` (0 < want <= len) where
 * splitting the text in two changes no pre-token: a whitespace byte right
 * after an ASCII non-space byte. Returns 0 when none is found. */
size_t loom_pretok_safe_cut(const unsigned char *s, size_t len, size_t want);

/* The first such cut at or after `from`, or 0 when there is none. */
size_t loom_pretok_safe_cut_after(const unsigned char *s, size_t len, size_t from);

#endif
