/* bpe_build: how the loaders and the trainer construct a tokenizer, and the
 * tokenizer's representation (private to src/data).
 *
 * Two families share one representation. Byte-level BPE (GPT-2, Llama 3,
 * Qwen2, SmolLM2): a token is a byte string, a word starts as one symbol per
 * byte. SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): a token is a
 * UTF-8 string in which loom keeps a space where the vocabulary file has
 * "▁" (U+2581), a word starts as one symbol per character, and a character
 * missing from the vocabulary falls back to the <0xNN> tokens of its bytes
 * (byte_fallback) or to the unknown token. Keeping spaces, not "▁", makes a
 * token's bytes the text it decodes to in both families. */
#ifndef LOOM_BPE_BUILD_H
#define LOOM_BPE_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "bpe_map.h"
#include "tokenizer.h"

/* Flags of a token (the `special` array). Any nonzero value but
 * LOOM_TOK_BYTE alone is an added token: cut out of the text before
 * pre-tokenization, never made by merges, decoded as its own text. */
enum {
    LOOM_TOK_ADDED = 1,      /* an added token (tokenizer.json added_tokens) */
    LOOM_TOK_PLAIN = 2,      /* ... whose "special" is false (it is text, not a control token) */
    LOOM_TOK_NORMALIZED = 4, /* ... matched in the normalized text (after the Prepend normalizer) */
    LOOM_TOK_BYTE = 8,       /* a SentencePiece byte-fallback token <0xNN>; its bytes are that byte */
};

/* Where a space is put before a piece of text (between added tokens). */
enum {
    LOOM_PREPEND_NONE,
    LOOM_PREPEND_NORMALIZER,    /* normalizer Prepend("▁"): every non-empty piece */
    LOOM_PREPEND_ALWAYS,        /* Metaspace prepend_scheme "always": every piece not starting with one */
    LOOM_PREPEND_FIRST,         /* Metaspace "first": only the piece at the start of the text */
};

/* How the family's options are set (zero: GPT-2's byte-level BPE). */
typedef struct {
    int pretok;          /* loom_pretok_kind */
    int add_prefix_space;/* ByteLevel add_prefix_space */
    int ignore_merges;   /* a word in the vocabulary is one token */
    int sentencepiece;   /* SentencePiece-style symbols (see above) */
    int prepend;         /* LOOM_PREPEND_* (SentencePiece) */
    int nfc;             /* normalizer NFC (Qwen2): text between added tokens is normalized first */
    int split_spaces;    /* Metaspace split: every space starts a word */
    int strip_decode;    /* decode drops up to n leading spaces; -1: all spaces of the first token (Metaspace decoder) */
    int unk, fuse_unk;   /* unknown token (-1: none) and whether a run of unknowns is one */
    int bos, eos;        /* -1: none */
    int add_bos, add_eos;/* encode for a model (loom_tokenizer_encode_special) adds them */
} loom_tok_style_t;

typedef struct {
    int vocab_size;
    const unsigned char *const *tok; /* bytes of each id (specials: their text) */
    const size_t *tok_len;
    const uint8_t *special;          /* LOOM_TOK_* flags, 0 for regular tokens */
    const uint32_t (*merges)[2];     /* in rank order */
    size_t nmerges;
    loom_tok_style_t style;
    const char *origin;              /* file name for messages about the vocabulary */
    const char *merges_origin;       /* ... and about merges (NULL: origin) */
    long merge_line0;                /* > 0: merge i is on line merge_line0 + i */
} loom_bpe_spec_t;

/* A style with every id -1 (bos, eos, unk) and GPT-2's regex. */
loom_tok_style_t loom_tok_style_gpt2(void);

/* Check and index a vocabulary and merges: every byte must have a token
 * (byte-level) , token bytes must be distinct, each merge's parts and result
 * must be in the vocabulary and no merge may repeat. Errors name the origin
 * and position. */
loom_status loom_tokenizer_build(loom_tokenizer_t **out, const loom_bpe_spec_t *spec);

struct loom_tokenizer {
    int vocab_size;
    int eot;                  /* id of "<|endoftext|>" or -1 */
    unsigned char *bytes;     /* token bytes, all ids back to back */
    size_t *off;              /* (vocab_size + 1) token id -> offset into bytes */
    uint8_t *special;         /* (vocab_size) LOOM_TOK_* flags */
    uint32_t byte_id[256];    /* id of each single-byte token (SentencePiece: <0xNN>; UINT32_MAX: none) */
    size_t nmerges;
    uint32_t (*merges)[2];    /* (nmerges, 2) in rank order */
    loom_pairmap_t ranks;     /* pair -> rank << 32 | merged id */
    loom_strmap_t vocab;      /* token bytes -> id (regular tokens) */
    int nspecial;
    uint32_t *special_ids;    /* (nspecial) added tokens matched in the raw text, longest text first */
    int nnorm;
    uint32_t *norm_ids;       /* (nnorm) added tokens matched in normalized text, longest first */
    loom_tok_style_t st;
    int words_at_spaces;      /* SentencePiece without split: no token holds a space after a non-space, so
                                 words may be cut before such a space without changing the ids */
    uint64_t hash;
};

/* Length in bytes of token `id` of tokenizer `t`. */
#define LOOM_TOK_LEN(t, id) ((t)->off[(id) + 1] - (t)->off[(id)])

#endif
