#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/hash.h"

loom_status loom_shard_open(loom_shard_t *s, const char *path) {
    memset(s, 0, sizeof *s);
    int fd;
    size_t len;
    LOOM_TRY(loom_file_open_fd(path, &fd, &len));
    if (len < 1024) {
        close(fd);
        return loom_error(LOOM_EFORMAT, "%s: %zu bytes, shorter than a shard header (1024); re-run `loom tokenize`", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return loom_error(LOOM_EIO, "%s: mmap failed: %s", path, strerror(errno));
    int32_t h[11]; /* a copy, so messages can use it after munmap */
    memcpy(h, map, sizeof h);
    size_t count, hdr = 1024;
    int tb, vocab;
    if (h[0] == LOOM_SHARD_MAGIC) {
        if (h[1] != LOOM_SHARD_VERSION && h[1] != 1) {
            munmap(map, len);
            return loom_error(LOOM_EFORMAT, "%s: shard version %d, this loom reads versions 1 and %d; re-run `loom tokenize`", path, h[1], LOOM_SHARD_VERSION);
        }
        hdr = (size_t)h[2];
        vocab = h[3];
        count = (size_t)(uint32_t)h[4] | ((size_t)(uint32_t)h[5] << 32);
        tb = h[6];
        if (hdr < 28 || hdr > len || (tb != 2 && tb != 4) || vocab <= 0 || (tb == 2 && vocab > 65536)) {
            munmap(map, len);
            return loom_error(LOOM_EFORMAT, "%s: corrupt shard header (header size %zu, %d bytes per token, vocabulary %d)", path, hdr, tb, vocab);
        }
    } else if (h[0] == LLMC_SHARD_MAGIC) {
        if (h[1] != 1) {
            munmap(map, len);
            return loom_error(LOOM_EFORMAT, "%s: llm.c shard version %d; only version 1 (uint16 tokens) is supported", path, h[1]);
        }
        count = (size_t)(uint32_t)h[2];
        tb = 2;
        vocab = 0;
    } else {
        munmap(map, len);
        return loom_error(LOOM_EFORMAT, "%s: not a token shard (magic %d); make one with `loom tokenize`", path, h[0]);
    }
    if (count > (len - hdr) / (size_t)tb + 1 || len - hdr != count * (size_t)tb) {
        munmap(map, len);
        return loom_error(LOOM_EFORMAT, "%s: header says %zu tokens (%zu bytes) but the file holds %zu bytes of tokens; the file is truncated or corrupt, re-run `loom tokenize`",
                          path, count, count * (size_t)tb, len - hdr);
    }
    if (h[0] == LOOM_SHARD_MAGIC && h[1] >= 2) {
        uint64_t want = (uint64_t)(uint32_t)h[7] | ((uint64_t)(uint32_t)h[8] << 32);
        uint64_t got = loom_hash64((const unsigned char *)map + hdr, count * (size_t)tb, 0);
        if (got != want) {
            munmap(map, len);
            return loom_error(LOOM_EFORMAT, "%s: token checksum %016llx, the header says %016llx: the file is corrupt; re-run `loom tokenize`",
                              path, (unsigned long long)got, (unsigned long long)want);
        }
    } else {
        static int noted;
        if (!noted++)
            loom_info("%s: a shard without a checksum (%s); its tokens are not verified. Re-run `loom tokenize` to add one",
                      path, h[0] == LOOM_SHARD_MAGIC ? "loom shard version 1" : "llm.c format");
    }
    s->map = map;
    s->map_len = len;
    s->tokens = (const unsigned char *)map + hdr;
    s->ntokens = count;
    s->token_bytes = tb;
    s->vocab_size = vocab;
    s->tokenizer_hash = h[0] == LOOM_SHARD_MAGIC && hdr >= 44 ? (uint64_t)(uint32_t)h[9] | ((uint64_t)(uint32_t)h[10] << 32) : 0;
    return LOOM_OK;
}

void loom_shard_close(loom_shard_t *s) {
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

uint32_t loom_shard_get(const loom_shard_t *s, size_t i) {
    if (s->token_bytes == 2) {
        uint16_t t;
        memcpy(&t, s->tokens + 2 * i, 2);
        return t;
    }
    uint32_t t;
    memcpy(&t, s->tokens + 4 * i, 4);
    return t;
}

loom_status loom_shard_validate(const loom_shard_t *s, const char *path, int vocab_size) {
    uint32_t v = (uint32_t)(s->vocab_size > 0 ? s->vocab_size : vocab_size);
    if (v == 0) return LOOM_OK;
    for (size_t i = 0; i < s->ntokens; i++) {
        uint32_t t = loom_shard_get(s, i);
        if (t >= v)
            return loom_error(LOOM_EFORMAT, "%s: token %u at position %zu is beyond the vocabulary (%u); re-run `loom tokenize`", path, t, i, v);
    }
    return LOOM_OK;
}

#define WRITER_BUF (1 << 20)

struct loom_shard_writer {
    char *path, *tmp;
    int fd;
    int vocab_size, tb;
    size_t count;
    unsigned char *buf; /* WRITER_BUF bytes */
    size_t fill, skip;  /* skip: header bytes at the front of buf, not hashed */
    loom_hash64_t hash; /* of the token bytes */
    uint64_t tok_hash;  /* of the tokenizer, 0 = not recorded */
};

/* Write out the buffer, hashing its token bytes on the way. */
static loom_status writer_flush(loom_shard_writer_t *w);

static void header(int32_t h[11], size_t n, int vocab_size, int tb, uint64_t hash, uint64_t tok_hash) {
    int32_t v[11] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, 1024, vocab_size,
                     (int32_t)(uint32_t)(n & 0xffffffffu), (int32_t)(uint32_t)((uint64_t)n >> 32), tb,
                     (int32_t)(uint32_t)(hash & 0xffffffffu), (int32_t)(uint32_t)(hash >> 32),
                     (int32_t)(uint32_t)(tok_hash & 0xffffffffu), (int32_t)(uint32_t)(tok_hash >> 32)};
    memcpy(h, v, sizeof v);
}

static loom_status write_all(int fd, const void *p, size_t n, const char *tmp) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return loom_error(LOOM_EWRITE, "%s: write failed: %s", tmp, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return LOOM_OK;
}

void loom_shard_writer_abort(loom_shard_writer_t *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w->buf);
    free(w);
}

loom_status loom_shard_writer_open(loom_shard_writer_t **out, const char *path, int vocab_size) {
    *out = NULL;
    if (vocab_size <= 0) return loom_error(LOOM_EINVAL, "%s: vocabulary size %d", path, vocab_size);
    loom_shard_writer_t *w = loom_calloc(1, sizeof *w);
    w->path = loom_strdup(path);
    w->tmp = loom_malloc(strlen(path) + 5);
    sprintf(w->tmp, "%s.tmp", path);
    w->vocab_size = vocab_size;
    w->tb = vocab_size <= 65536 ? 2 : 4;
    w->buf = loom_malloc(WRITER_BUF);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        loom_status s = loom_error(LOOM_EWRITE, "%s: cannot create: %s", w->tmp, strerror(errno));
        w->fd = -1;
        loom_shard_writer_abort(w);
        return s;
    }
    /* The header is written with a zero count and filled in by close(). */
    memset(w->buf, 0, 1024);
    int32_t h[11];
    header(h, 0, vocab_size, w->tb, 0, 0);
    memcpy(w->buf, h, sizeof h);
    w->fill = w->skip = 1024;
    loom_hash64_init(&w->hash, 0);
    *out = w;
    return LOOM_OK;
}

size_t loom_shard_writer_count(const loom_shard_writer_t *w) { return w->count; }
void loom_shard_writer_set_tokenizer(loom_shard_writer_t *w, uint64_t hash) { w->tok_hash = hash; }

loom_status loom_shard_writer_append(loom_shard_writer_t *w, const uint32_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= (uint32_t)w->vocab_size) {
            loom_status s = loom_error(LOOM_EINVAL, "%s: token %u at position %zu is beyond the vocabulary (%d); nothing written",
                                       w->path, tokens[i], w->count + i, w->vocab_size);
            loom_shard_writer_abort(w);
            return s;
        }
        if (w->fill + 4 > WRITER_BUF) {
            loom_status s = writer_flush(w);
            if (s != LOOM_OK) {
                loom_shard_writer_abort(w);
                return s;
            }
            w->fill = 0;
        }
        if (w->tb == 2) {
            uint16_t t = (uint16_t)tokens[i];
            memcpy(w->buf + w->fill, &t, 2);
        } else {
            memcpy(w->buf + w->fill, &tokens[i], 4);
        }
        w->fill += (size_t)w->tb;
    }
    w->count += n;
    return LOOM_OK;
}

static loom_status writer_flush(loom_shard_writer_t *w) {
    loom_hash64_update(&w->hash, w->buf + w->skip, w->fill - w->skip);
    w->skip = 0;
    return write_all(w->fd, w->buf, w->fill, w->tmp);
}

loom_status loom_shard_writer_close(loom_shard_writer_t *w) {
    loom_status s = writer_flush(w);
    int32_t h[11];
    header(h, w->count, w->vocab_size, w->tb, loom_hash64_digest(&w->hash), w->tok_hash);
    if (s == LOOM_OK && pwrite(w->fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        s = loom_error(LOOM_EIO, "%s: writing the header failed: %s", w->tmp, strerror(errno));
    if (s == LOOM_OK && fsync(w->fd) != 0) s = loom_error(LOOM_EWRITE, "%s: sync failed: %s", w->tmp, strerror(errno));
    if (s == LOOM_OK) {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) != 0) s = loom_error(LOOM_EWRITE, "%s: close failed: %s", w->tmp, strerror(errno));
    }
    if (s == LOOM_OK && rename(w->tmp, w->path) != 0) s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", w->path, strerror(errno));
    if (s != LOOM_OK) {
        loom_shard_writer_abort(w);
        return s;
    }
    char *dir = loom_strdup(w->path), *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        loom_fsync_dir(dir[0] ? dir : "/");
    } else {
        loom_fsync_dir(".");
    }
    free(dir);
    free(w->path);
    free(w->tmp);
    free(w->buf);
    free(w);
    return LOOM_OK;
}

loom_status loom_shard_write(const char *path, const uint32_t *tokens, size_t n, int vocab_size) {
    loom_shard_writer_t *w;
    LOOM_TRY(loom_shard_writer_open(&w, path, vocab_size));
    LOOM_TRY(loom_shard_writer_append(w, tokens, n));
    return loom_shard_writer_close(w);
}
