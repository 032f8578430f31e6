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

/* Write code point cp (<= 0x10FFFF) as UTF-8 to out; returns its length. */
size_t loom_utf8_put(unsigned char *out, unsigned cp);

/* End (exclusive) of the pre-token that starts at s[i], i < len. */
size_t loom_pretok_next(const unsigned char *s, size_t len, size_t i);

/* The regex pre-tokenizers loom implements by hand (tokenizer.json names
 * them by their pattern, GGUF by tokenizer.ggml.pre). */
typedef enum {
    LOOM_PRETOK_NONE,   /* the whole text is one piece */
    LOOM_PRETOK_GPT2,   /* the GPT-2 regex above */
    LOOM_PRETOK_LLAMA3, /* Llama 3's regex, digits in groups of up to 3 */
    LOOM_PRETOK_QWEN2,  /* Llama 3's regex with single digits (Qwen2) */
    LOOM_PRETOK_DIGITS, /* each digit alone, then the GPT-2 regex (SmolLM2) */
} loom_pretok_kind;

/* Llama 3's pre-tokenizer regex:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Qwen2's is the same with \p{N} for \p{N}{1,3}. */
#define LOOM_PRETOK_LLAMA3_REGEX \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LOOM_PRETOK_QWEN2_REGEX \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LOOM_PRETOK_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* End (exclusive) of the pre-token of kind `k` that starts at s[i], i < len
 * (LOOM_PRETOK_NONE: len). */
size_t loom_pretok_next_kind(loom_pretok_kind k, const unsigned char *s, size_t len, size_t i);

/* A cut point in s[0..len) at or before `want` (0 < want <= len) where
 * splitting the text in two changes no pre-token of any kind above: a space,
 * tab, vertical tab or form feed (not a line break: Llama 3's regex keeps "."
 * and the line breaks after it together) right after an ASCII letter or
 * digit (not after an added token such as "</s>", which would make the next
 * piece start a segment). Returns 0 when none is found. */
size_t loom_pretok_safe_cut(const unsigned char *s, size_t len, size_t want);

/* The first such cut at or after `from`, or 0 when there is none. */
size_t loom_pretok_safe_cut_after(const unsigned char *s, size_t len, size_t from);

#endif
