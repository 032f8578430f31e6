/* tokenizer: text <-> token ids. The trainer only sees this interface, so
 * the byte-level tokenizer and BPE tokenizers plug in the same way.
 *
 * The BPE families of Hugging Face tokenizer.json files are read: byte-level
 * BPE with GPT-2's, Llama 3's, Qwen2's or SmolLM2's pre-tokenization, and
 * SentencePiece-style BPE (Llama 2, Mistral, TinyLlama: "▁" for spaces,
 * <0xNN> byte fallback); see docs/tokenizer.md and src/data/bpe_build.h.
 *
 * Byte-level BPE as GPT-2 and Hugging Face `tokenizers` do it: text is split
 * by the GPT-2 pre-tokenizer (bpe_pretok.h), each piece's bytes start as one
 * token each and are merged by rank; special tokens ("<|endoftext|>") found
 * in the text are split out first. Any byte string encodes, and
 * decode(encode(x)) == x.
 *
 * Byte-level: ids 0..255 are the bytes, 256 is "<|endoftext|>". It is the
 * special case of byte-level BPE with no merges, and is saved as such. A
 * tokenizer loom trains keeps that layout (bytes, then specials, then one id
 * per merge in merge order). */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdio.h>
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
/* BOS and EOS ids (-1: none). EOS falls back to "<|endoftext|>". */
int loom_tokenizer_bos(const loom_tokenizer_t *t);
int loom_tokenizer_eos(const loom_tokenizer_t *t);
/* 1 when `id` is a special (control) token: an added token marked special. */
int loom_tokenizer_is_control(const loom_tokenizer_t *t, uint32_t id);
/* The id of the token whose text (an added token's content, or a regular
 * token's bytes) is `text`, or -1. */
int loom_tokenizer_find(const loom_tokenizer_t *t, const char *text);
/* Set BOS/EOS ids (-1: none, -2: keep) and whether a model's input gets
 * them (-1: keep). Errors when an id is out of range or an added one is
 * missing. */
loom_status loom_tokenizer_set_specials(loom_tokenizer_t *t, int bos, int eos, int add_bos, int add_eos);
/* A fingerprint of the vocabulary and merges: equal hashes, same ids. */
uint64_t loom_tokenizer_hash(const loom_tokenizer_t *t);

/* Encode `len` bytes of text; *ids is malloc'd, caller frees. */
loom_status loom_tokenizer_encode(const loom_tokenizer_t *t, const char *text, size_t len,
                                  uint32_t **ids, size_t *n);
/* The same with the BOS/EOS the tokenizer adds for a model (what HF's
 * encode() does with its post-processor or add_bos_token). */
loom_status loom_tokenizer_encode_special(const loom_tokenizer_t *t, const char *text, size_t len,
                                          uint32_t **ids, size_t *n);
/* Decode ids to bytes (HF's decode without skipping special tokens, except
 * that invalid UTF-8 stays as its bytes where HF writes U+FFFD); *text is malloc'd and NUL-terminated, caller frees.
 * An id outside the vocabulary is an error naming its position. */
loom_status loom_tokenizer_decode(const loom_tokenizer_t *t, const uint32_t *ids, size_t n,
                                  char **text, size_t *len);

/* Load GPT-2's original pair: vocab.json (token -> id) and merges.txt (one
 * "a b" merge per line, ranked by line, "#version" header allowed). A token
 * named "<|endoftext|>" becomes the end-of-text special. */
loom_status loom_tokenizer_load_gpt2(loom_tokenizer_t **out, const char *vocab_path, const char *merges_path);

/* Number of merges (0 for the byte-level tokenizer). */
int loom_tokenizer_merges(const loom_tokenizer_t *t);
/* Bytes of token `id` (not NUL-terminated), or NULL when id is out of range. */
const unsigned char *loom_tokenizer_token(const loom_tokenizer_t *t, uint32_t id, size_t *len);
/* Number of special tokens and the content of special i. */
int loom_tokenizer_nspecial(const loom_tokenizer_t *t);
const char *loom_tokenizer_special(const loom_tokenizer_t *t, int i, uint32_t *id);

/* For file formats that embed a tokenizer (GGUF): the name of token `id`
 * in vocab files (byte-level characters; a special token's own text),
 * malloc'd, caller frees; merge `i` (0 <= i < loom_tokenizer_merges) as the
 * ids of its two parts; and a tokenizer from tokenizer.json text held in
 * memory (`origin` names it in messages). */
char *loom_tokenizer_token_name(const loom_tokenizer_t *t, uint32_t id);
void loom_tokenizer_merge(const loom_tokenizer_t *t, size_t i, uint32_t *a, uint32_t *b);
loom_status loom_tokenizer_parse(loom_tokenizer_t **out, const char *origin, const char *json, size_t len);

/* A tokenizer from a vocabulary held in memory (GGUF's tokenizer.ggml.*). */
typedef struct {
    const char *model;          /* "gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE) */
    const char *pre;            /* pre-tokenizer, GGUF's tokenizer.ggml.pre: NULL, "default" or "gpt2",
                                   "llama-bpe" / "llama3" (Llama 3), "qwen2", "smollm" (digits alone) */
    int n;                      /* tokens */
    const char *const *tokens;  /* names as in vocab files (byte-level characters, or "▁" and <0xNN>) */
    const int32_t *types;       /* GGUF token types (1 normal, 2 unknown, 3 control, 4 user defined,
                                   5 unused, 6 byte); NULL: all normal */
    const char *const *merges;  /* "a b", in rank order */
    size_t nmerges;
    const float *scores;        /* "llama" without merges: merges made from the scores (higher first) */
    int bos, eos, unk;          /* -1: none */
    int add_bos, add_eos;
    int add_space_prefix;       /* "llama": a space before the text (GGUF tokenizer.ggml.add_space_prefix, default 1) */
    const char *origin;         /* named in messages */
} loom_tokenizer_vocab_t;
loom_status loom_tokenizer_from_vocab(loom_tokenizer_t **out, const loom_tokenizer_vocab_t *v);

/* The reverse, for writing GGUF's tokenizer.ggml.* (ckpt/gguf.c): model
 * "gpt2" (byte-level BPE) or "llama" (SentencePiece-style); pre, the name
 * llama.cpp's reader knows for the byte-level split ("gpt-2", "llama-bpe",
 * "qwen2", "smollm"; NULL for "llama"); the BOS/EOS/unknown ids (-1: none)
 * and whether a model's input gets them; add_space_prefix ("llama"). */
typedef struct {
    const char *model, *pre;
    int bos, eos, unk, add_bos, add_eos, add_space_prefix;
} loom_tokenizer_gguf_t;
loom_tokenizer_gguf_t loom_tokenizer_gguf(const loom_tokenizer_t *t);
/* GGUF's type of token `id` (1 normal, 2 unknown, 3 control, 4 user
 * defined, 6 byte) and, for "llama", every token's score: -1 - the rank of
 * the first merge that makes it (llama.cpp's SentencePiece tokenizer and
 * loom_tokenizer_from_vocab merge the higher score first, so the merges
 * keep their order), -1e9 for a token no merge makes (characters, bytes,
 * added tokens: never the result of a merge). scores: vocab_size floats. */
int loom_tokenizer_gguf_type(const loom_tokenizer_t *t, uint32_t id);
void loom_tokenizer_gguf_scores(const loom_tokenizer_t *t, float *scores);

/* Apply a Hugging Face tokenizer_config.json: bos_token, eos_token,
 * add_bos_token, add_eos_token; *chat_template (may be NULL) gets its
 * "chat_template" (malloc'd; NULL when absent; the "default" one when it is
 * a list of named templates). Tokens it names must be in the vocabulary. */
loom_status loom_tokenizer_apply_config(loom_tokenizer_t *t, const char *path, char **chat_template);

/* A growable id buffer. */
typedef struct {
    uint32_t *v;
    size_t n, cap;
} loom_ids_t;
void loom_ids_push(loom_ids_t *ids, uint32_t id);
void loom_ids_free(loom_ids_t *ids);

/* An encoder keeps a cache of encoded words, so encoding a corpus piece by
 * piece does BPE once per distinct word. One per thread; the tokenizer is
 * shared read-only. */
typedef struct loom_encoder loom_encoder_t;
loom_encoder_t *loom_encoder_new(const loom_tokenizer_t *t);
void loom_encoder_free(loom_encoder_t *e);
/* Append the ids of `len` bytes of text to *out. `at_start` says the text
 * starts a document (only matters to tokenizers with add_prefix_space). To
 * encode a long text in pieces with the same result as in one call, cut it
 * where loom_pretok_safe_cut() says. */
void loom_encoder_encode(loom_encoder_t *e, const char *text, size_t len, int at_start, loom_ids_t *out);

/* Training. Words are counted piece by piece (stream the corpus through
 * loom_bpe_count_add), then loom_bpe_train makes the merges. */
typedef struct loom_bpe_counter loom_bpe_counter_t;
/* `specials` (n of them) are cut out of the text before counting and get
 * ids 256.. in the trained tokenizer; "<|endoftext|>" among them is the eot. */
loom_status loom_bpe_counter_new(loom_bpe_counter_t **out, const char *const *specials, int n);
void loom_bpe_counter_free(loom_bpe_counter_t *c);
/* Count the words of a piece of text (cut as for loom_encoder_encode). Safe
 * to call from one thread at a time; it uses `threads` OpenMP threads. */
void loom_bpe_count_add(loom_bpe_counter_t *c, const char *text, size_t len, int threads);
/* Distinct words counted so far, and bytes of memory the counter holds. */
size_t loom_bpe_counter_words(const loom_bpe_counter_t *c);
size_t loom_bpe_counter_bytes(const loom_bpe_counter_t *c);

typedef struct {
    long long vocab_size;  /* target, including 256 bytes and the specials */
    int min_frequency;     /* stop when the best pair occurs fewer times (<= 1: any pair) */
    /* Called now and then with merges done and merges wanted (may be NULL). */
    void (*progress)(void *ctx, long long done, long long total);
    void *progress_ctx;
} loom_bpe_train_opts;

/* Learn merges until the vocabulary reaches opts->vocab_size or no pair
 * occurs min_frequency times (the vocabulary is smaller then: check
 * loom_tokenizer_vocab_size). Ties go to the pair of smaller ids. */
loom_status loom_bpe_train(loom_tokenizer_t **out, loom_bpe_counter_t *c, const loom_bpe_train_opts *opts);

/* Where generated tokens go as text: loom_text_sink_emit, given a sink as
 * its context, decodes one token and writes its bytes to `out`, flushed.
 * It has the shape of loom_gpt_generate's callback and never stops it. */
typedef struct {
    const loom_tokenizer_t *tok;
    FILE *out;
} loom_text_sink_t;
int loom_text_sink_emit(int token, void *sink);

#endif
