#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

loom_status loom_shard_open(loom_shard_t *s, const char *path) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loom_error(LOOM_EIO, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    if (len < 1024) {
        close(fd);
        return loom_error(LOOM_EFORMAT, "%s: %zu bytes, shorter than a shard header (1024); re-run `loom tokenize`", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return loom_error(LOOM_EIO, "%s: mmap failed: %s", path, strerror(errno));
    const int32_t *h = map;
    size_t count, hdr = 1024;
    int tb, vocab;
    if (h[0] == LOOM_SHARD_MAGIC) {
        if (h[1] != LOOM_SHARD_VERSION) {
            munmap(map, len);
            return loom_error(LOOM_EFORMAT, "%s: shard version %d, this loom reads version %d; re-run `loom tokenize`", path, h[1], LOOM_SHARD_VERSION);
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
    if (len - hdr != count * (size_t)tb) {
        munmap(map, len);
        return loom_error(LOOM_EFORMAT, "%s: header says %zu tokens (%zu bytes) but the file holds %zu bytes of tokens; the file is truncated or corrupt, re-run `loom tokenize`",
                          path, count, count * (size_t)tb, len - hdr);
    }
    s->map = map;
    s->map_len = len;
    s->tokens = (const unsigned char *)map + hdr;
    s->ntokens = count;
    s->token_bytes = tb;
    s->vocab_size = vocab;
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

loom_status loom_shard_write(const char *path, const uint32_t *tokens, size_t n, int vocab_size) {
    if (vocab_size <= 0) return loom_error(LOOM_EINVAL, "%s: vocabulary size %d", path, vocab_size);
    int tb = vocab_size <= 65536 ? 2 : 4;
    size_t bytes = 1024 + n * (size_t)tb;
    unsigned char *buf = loom_calloc(1, bytes);
    int32_t h[7] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, 1024, vocab_size,
                    (int32_t)(uint32_t)(n & 0xffffffffu), (int32_t)(uint32_t)((uint64_t)n >> 32), tb};
    memcpy(buf, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= (uint32_t)vocab_size) {
            free(buf);
            return loom_error(LOOM_EINVAL, "%s: token %u at position %zu is beyond the vocabulary (%d); nothing written", path, tokens[i], i, vocab_size);
        }
        if (tb == 2) {
            uint16_t t = (uint16_t)tokens[i];
            memcpy(buf + 1024 + 2 * i, &t, 2);
        } else {
            memcpy(buf + 1024 + 4 * i, &tokens[i], 4);
        }
    }
    loom_status s = loom_file_write_atomic(path, buf, bytes);
    free(buf);
    return s;
}
