/* shard: token shard files, read through mmap.
 *
 * loom's format: a header of 256 little-endian int32 (1024 bytes), then the
 * tokens as uint16 (vocabulary <= 65536) or uint32.
 *   header[0] = LOOM_SHARD_MAGIC, header[1] = version (1),
 *   header[2] = header size in bytes (1024), header[3] = vocabulary size,
 *   header[4], header[5] = token count (low, high 32 bits),
 *   header[6] = bytes per token (2 or 4),
 *   header[7], header[8] = XXH64 (core/hash.h) of the token bytes (low,
 *   high 32 bits; version 2), checked when the shard is opened,
 *   header[9], header[10] = loom_tokenizer_hash of the tokenizer that made
 *   the tokens (low, high; 0 = not recorded: shards of a loom before it),
 *   checked by `loom train` against the data folder's tokenizer.json.
 * Version 1 shards (no checksum) still load, with a note that their
 * tokens are not verified. llm.c's shards (magic 20240520, version 1: uint16 tokens; header[2] =
 * token count) load unchanged; their vocabulary size is reported as 0. */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "../core/core.h"

#define LOOM_SHARD_MAGIC 0x4c4f4f4d /* "LOOM" */
#define LOOM_SHARD_VERSION 2
#define LLMC_SHARD_MAGIC 20240520

typedef struct {
    const unsigned char *tokens; /* start of the token array inside the map */
    size_t ntokens;
    int token_bytes;             /* 2 or 4 */
    int vocab_size;              /* 0 when the file does not say */
    uint64_t tokenizer_hash;     /* of the tokenizer that made it; 0 = not recorded */
    void *map;
    size_t map_len;
} loom_shard_t;

/* Open and validate a shard (magic, version, size against token count,
 * the checksum of version 2). */
loom_status loom_shard_open(loom_shard_t *s, const char *path);
void loom_shard_close(loom_shard_t *s);
/* Token i of an open shard. */
uint32_t loom_shard_get(const loom_shard_t *s, size_t i);
/* Check that every token of an open shard is below its vocabulary (or
 * below vocab_size when the file does not say, > 0); the error names `path`
 * and the first bad position. */
loom_status loom_shard_validate(const loom_shard_t *s, const char *path, int vocab_size);
/* Write tokens atomically (temporary name, fsync, rename). Tokens must be
 * below vocab_size; uint16 is used when vocab_size <= 65536. */
loom_status loom_shard_write(const char *path, const uint32_t *tokens, size_t n, int vocab_size);

/* A shard written piece by piece in bounded memory: tokens go to PATH.tmp,
 * and close() fills in the header, fsyncs and renames it to PATH. Until
 * then (and after abort() or any error) PATH is untouched and the temporary
 * file is removed, so no half-written shard is ever under its final name. */
typedef struct loom_shard_writer loom_shard_writer_t;
loom_status loom_shard_writer_open(loom_shard_writer_t **w, const char *path, int vocab_size);
/* Append tokens; one beyond the vocabulary is an error naming its position
 * in the shard (the writer is aborted then). */
loom_status loom_shard_writer_append(loom_shard_writer_t *w, const uint32_t *tokens, size_t n);
/* Record the hash of the tokenizer that made the tokens (loom_tokenizer_hash). */
void loom_shard_writer_set_tokenizer(loom_shard_writer_t *w, uint64_t hash);
/* Tokens appended so far. */
size_t loom_shard_writer_count(const loom_shard_writer_t *w);
/* Finish: header, fsync, rename; frees the writer whatever happens. */
loom_status loom_shard_writer_close(loom_shard_writer_t *w);
/* Give up: remove the temporary file and free the writer. */
void loom_shard_writer_abort(loom_shard_writer_t *w);

#endif
