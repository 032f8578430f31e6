#define _GNU_SOURCE
#include "optim.h"

#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OPT_MAGIC "LOOMOPT"
#define OPT_VERSION 1

typedef struct {
    char magic[8];
    uint32_t version, header_bytes, rank, world, zero, reserved;
    uint64_t params, lo, hi, step, checksum;
} opt_header_t;

void loom_optim_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world) {
    snprintf(out, cap, "%s/optim-rank%05d-of-%05d.bin", ckpt_dir, rank, world);
}

/* The header of shard h whose payload hashes to `checksum`. */
static opt_header_t header_of(const loom_optim_shard_t *h, uint64_t checksum) {
    opt_header_t hd;
    memset(&hd, 0, sizeof hd);
    memcpy(hd.magic, OPT_MAGIC, 8);
    hd.version = OPT_VERSION;
    hd.header_bytes = sizeof hd;
    hd.rank = h->rank;
    hd.world = h->world;
    hd.zero = h->zero;
    hd.params = h->params;
    hd.lo = h->lo;
    hd.hi = h->hi;
    hd.step = h->step;
    hd.checksum = checksum;
    return hd;
}

struct loom_optim_stream {
    char path[4096], tmp[4200];
    FILE *f;
    loom_optim_shard_t h;
    uint64_t hash, floats; /* of the payload so far */
    int ok, err;
};

loom_status loom_optim_stream_open(loom_optim_stream_t **out, const char *path, const loom_optim_shard_t *h) {
    loom_optim_stream_t *w = loom_calloc(1, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->h = *h;
    w->hash = 1469598103934665603ULL;
    opt_header_t hd = header_of(h, 0); /* the checksum is written at close */
    w->f = fopen(w->tmp, "wb");
    w->ok = w->f && fwrite(&hd, sizeof hd, 1, w->f) == 1;
    if (!w->ok) {
        loom_status s = loom_error(LOOM_EWRITE, "%s: cannot create: %s", w->tmp, strerror(errno));
        loom_optim_stream_close(w, 0);
        return s;
    }
    *out = w;
    return LOOM_OK;
}

loom_status loom_optim_stream_put(loom_optim_stream_t *w, const float *x, size_t n) {
    if (w->ok) {
        w->hash = loom_fnv1a(x, n * sizeof(float), w->hash);
        w->floats += n;
        w->ok = fwrite(x, sizeof(float), n, w->f) == n;
        if (!w->ok) w->err = errno;
    }
    return w->ok ? LOOM_OK : loom_error(LOOM_EWRITE, "%s: write failed: %s (disk full?)", w->tmp, strerror(w->err));
}

loom_status loom_optim_stream_close(loom_optim_stream_t *w, int commit) {
    loom_status s = LOOM_OK;
    if (w->f) {
        opt_header_t hd = header_of(&w->h, w->hash);
        int ok = w->ok && w->floats == 2 * (w->h.hi - w->h.lo) && fseek(w->f, 0, SEEK_SET) == 0 && fwrite(&hd, sizeof hd, 1, w->f) == 1 &&
                 fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
        int err = errno;
        if (fclose(w->f) != 0) ok = 0;
        if (commit && w->ok && w->floats != 2 * (w->h.hi - w->h.lo))
            s = loom_error(LOOM_EINTERNAL, "%s: %llu floats given for a shard of 2 x %llu; the writer missed part of the block", w->tmp,
                           (unsigned long long)w->floats, (unsigned long long)(w->h.hi - w->h.lo));
        else if (commit && !ok)
            s = loom_error(LOOM_EWRITE, "%s: write failed after %llu of %llu floats: %s (disk full?)", w->tmp, (unsigned long long)w->floats,
                           (unsigned long long)(2 * (w->h.hi - w->h.lo)), strerror(w->err ? w->err : err));
        if (s == LOOM_OK && commit && rename(w->tmp, w->path) != 0)
            s = loom_error(LOOM_EWRITE, "%s: rename failed: %s", w->path, strerror(errno));
        if (s != LOOM_OK || !commit) unlink(w->tmp);
    }
    free(w);
    return s;
}

loom_status loom_optim_shard_save_host(const char *path, const loom_optim_shard_t *h, const float *m, const float *v) {
    size_t n = (size_t)(h->hi - h->lo), half = n * sizeof(float);
    /* FNV-1a runs byte by byte, so m's hash seeds v's: the checksum of the
     * payload m then v, without copying the two into one buffer. */
    opt_header_t head = header_of(h, loom_fnv1a(v, half, loom_fnv1a(m, half, 1469598103934665603ULL))), *hd = &head;
    const void *parts[] = {hd, m, v};
    size_t sizes[] = {sizeof *hd, half, half};
    return loom_file_write_atomic_parts(path, 3, parts, sizes);
}

loom_status loom_optim_shard_save(const char *path, const loom_optim_shard_t *h, const loom_backend_t *be,
                                  const float *m, const float *v) {
    size_t n = (size_t)(h->hi - h->lo);
    float *host = loom_malloc(2 * n * sizeof(float) + 1);
    if (n) {
        be->download(host, m, n * sizeof(float));
        be->download(host + n, v, n * sizeof(float));
    }
    loom_status s = loom_optim_shard_save_host(path, h, host, host + n);
    free(host);
    return s;
}

loom_status loom_optim_shard_load(const char *path, const loom_optim_shard_t *want, const loom_backend_t *be,
                                  float *m, float *v, loom_optim_shard_t *got) {
    char *buf;
    size_t len;
    LOOM_TRY(loom_file_read(path, &buf, &len));
    opt_header_t hd;
    loom_status s = LOOM_OK;
    if (len < sizeof hd) {
        s = loom_error(LOOM_EFORMAT, "%s: %zu bytes, shorter than the optimizer-state header", path, len);
        goto out;
    }
    memcpy(&hd, buf, sizeof hd);
    if (memcmp(hd.magic, OPT_MAGIC, 8) != 0 || hd.version != OPT_VERSION) {
        s = loom_error(LOOM_EFORMAT, "%s: not a loom optimizer shard (magic/version %.7s/%u; expected %s/%d)", path, hd.magic, hd.version, OPT_MAGIC, OPT_VERSION);
        goto out;
    }
    size_t n = (size_t)(hd.hi - hd.lo);
    if (hd.header_bytes < sizeof hd || len != hd.header_bytes + 2 * n * sizeof(float)) {
        s = loom_error(LOOM_EFORMAT, "%s: truncated: %zu bytes for a shard of %zu floats", path, len, n);
        goto out;
    }
    if (want && want->step && hd.step != want->step) {
        s = loom_error(LOOM_EFORMAT, "%s: optimizer state of step %llu, but the checkpoint is of step %llu; the files are mixed up",
                       path, (unsigned long long)hd.step, (unsigned long long)want->step);
        goto out;
    }
    if (hd.lo > hd.hi || hd.hi > hd.params || hd.rank >= hd.world || hd.zero > 3) {
        s = loom_error(LOOM_EFORMAT, "%s: inconsistent header (rank %u of %u, ZeRO-%u, floats [%llu, %llu) of %llu)", path, hd.rank,
                       hd.world, hd.zero, (unsigned long long)hd.lo, (unsigned long long)hd.hi, (unsigned long long)hd.params);
        goto out;
    }
    if (want && (hd.params != want->params || hd.lo != want->lo || hd.hi != want->hi)) {
        s = loom_error(LOOM_EINVAL, "%s: holds parameters [%llu, %llu) of %llu; this rank needs [%llu, %llu) of %llu: resume with the same --nproc/world size and --zero",
                       path, (unsigned long long)hd.lo, (unsigned long long)hd.hi, (unsigned long long)hd.params,
                       (unsigned long long)want->lo, (unsigned long long)want->hi, (unsigned long long)want->params);
        goto out;
    }
    const float *p = (const float *)(buf + hd.header_bytes);
    if (loom_fnv1a(p, 2 * n * sizeof(float), 1469598103934665603ULL) != hd.checksum) {
        s = loom_error(LOOM_EFORMAT, "%s: checksum mismatch: the file is corrupt", path);
        goto out;
    }
    for (size_t i = 0; i < 2 * n; i++) /* AdamW's v is a mean of squares: never negative */
        if (!isfinite(p[i]) || (i >= n && p[i] < 0)) {
            s = loom_error(LOOM_EFORMAT, "%s: AdamW %s[%zu] is %g; the optimizer state is damaged: resume from an older checkpoint "
                           "(--resume step_N) or fine-tune from the weights alone (--init-from-run)", path, i < n ? "m" : "v", i % (n ? n : 1), p[i]);
            goto out;
        }
    if (n) {
        be->upload(m, p, n * sizeof(float));
        be->upload(v, p + n, n * sizeof(float));
    }
    if (got) *got = (loom_optim_shard_t){hd.rank, hd.world, hd.zero, hd.params, hd.lo, hd.hi, hd.step};
out:
    free(buf);
    return s;
}


/* Parse "optim-rankRRRRR-of-WWWWW.bin"; 0 when the name is another file. */
static int shard_name(const char *name, int *rank, int *world) {
    int n = 0;
    if (sscanf(name, "optim-rank%5d-of-%5d.bin%n", rank, world, &n) != 2 || name[n]) return 0;
    return *rank >= 0 && *world > 0 && *rank < *world;
}

/* The shard files of `ckpt_dir`: all of one world size, ranks 0..W-1. */
static loom_status list_shards(const char *ckpt_dir, int *world_out) {
    DIR *d = opendir(ckpt_dir);
    if (!d) return loom_error(LOOM_EIO, "%s: cannot open: %s", ckpt_dir, strerror(errno));
    int world = 0, count = 0, r, w;
    struct dirent *e;
    loom_status s = LOOM_OK;
    while ((e = readdir(d)) && s == LOOM_OK) {
        if (!shard_name(e->d_name, &r, &w)) continue;
        if (world && w != world) s = loom_error(LOOM_EFORMAT, "%s: optimizer shards of world sizes %d and %d; the checkpoint is mixed up", ckpt_dir, world, w);
        world = w;
        count++;
    }
    closedir(d);
    if (s == LOOM_OK && !world) s = loom_error(LOOM_EFORMAT, "%s: no optimizer state (optim-rank*-of-*.bin)", ckpt_dir);
    if (s == LOOM_OK && count != world)
        s = loom_error(LOOM_EFORMAT, "%s: %d optimizer shard(s) of a %d-rank run; the checkpoint is incomplete", ckpt_dir, count, world);
    *world_out = world;
    return s;
}

/* ---- reading ranges ---- */

typedef struct {
    FILE *f;
    opt_header_t hd;
} rshard_t;

struct loom_optim_reader {
    rshard_t *sh;
    int world;
    char dir[4096];
};

/* Check one shard's payload in 1 MB pieces: the checksum and finite
 * values (v never negative), as loom_optim_shard_load does for a whole
 * file, in bounded memory. */
static loom_status verify_payload(const char *path, rshard_t *r) {
    size_t n = (size_t)(r->hd.hi - r->hd.lo), total = 2 * n, chunk = 1 << 18, done = 0;
    float *buf = loom_malloc(chunk * sizeof(float));
    uint64_t h = 1469598103934665603ULL;
    loom_status s = LOOM_OK;
    if (fseeko(r->f, (off_t)r->hd.header_bytes, SEEK_SET) != 0) s = loom_error(LOOM_EIO, "%s: cannot seek: %s", path, strerror(errno));
    while (s == LOOM_OK && done < total) {
        size_t k = total - done < chunk ? total - done : chunk;
        if (fread(buf, sizeof(float), k, r->f) != k) {
            s = loom_error(LOOM_EFORMAT, "%s: truncated: fewer than %zu floats for a shard of %zu", path, total, n);
            break;
        }
        h = loom_fnv1a(buf, k * sizeof(float), h);
        for (size_t i = 0; i < k && s == LOOM_OK; i++) {
            size_t at = done + i;
            if (!isfinite(buf[i]) || (at >= n && buf[i] < 0))
                s = loom_error(LOOM_EFORMAT, "%s: AdamW %s[%zu] is %g; the optimizer state is damaged: resume from an older checkpoint "
                               "(--resume step_N) or fine-tune from the weights alone (--init-from-run)", path, at < n ? "m" : "v", at % (n ? n : 1), buf[i]);
        }
        done += k;
    }
    if (s == LOOM_OK && h != r->hd.checksum) s = loom_error(LOOM_EFORMAT, "%s: checksum mismatch: the file is corrupt", path);
    free(buf);
    return s;
}

/* Open shard r of `world` and check its header against the others'. */
static loom_status open_shard(loom_optim_reader_t *rd, int r, uint64_t params, uint64_t step, size_t next) {
    char path[4200];
    loom_optim_shard_path(path, sizeof path, rd->dir, r, rd->world);
    rshard_t *x = &rd->sh[r];
    x->f = fopen(path, "rb");
    if (!x->f) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    opt_header_t *hd = &x->hd;
    if (fread(hd, sizeof *hd, 1, x->f) != 1) return loom_error(LOOM_EFORMAT, "%s: shorter than the optimizer-state header", path);
    if (memcmp(hd->magic, OPT_MAGIC, 8) != 0 || hd->version != OPT_VERSION)
        return loom_error(LOOM_EFORMAT, "%s: not a loom optimizer shard (magic/version %.7s/%u; expected %s/%d)", path, hd->magic, hd->version, OPT_MAGIC, OPT_VERSION);
    if (hd->header_bytes < sizeof *hd || hd->lo > hd->hi || hd->hi > hd->params || hd->rank >= hd->world || hd->zero > 3)
        return loom_error(LOOM_EFORMAT, "%s: inconsistent header (rank %u of %u, ZeRO-%u, floats [%llu, %llu) of %llu)", path, hd->rank,
                          hd->world, hd->zero, (unsigned long long)hd->lo, (unsigned long long)hd->hi, (unsigned long long)hd->params);
    if (step && hd->step != step)
        return loom_error(LOOM_EFORMAT, "%s: optimizer state of step %llu, but the checkpoint is of step %llu; the files are mixed up", path,
                          (unsigned long long)hd->step, (unsigned long long)step);
    if (hd->params != params)
        return loom_error(LOOM_EINVAL, "%s: holds parameters [%llu, %llu) of %llu; this model has %llu: resume with the same model", path,
                          (unsigned long long)hd->lo, (unsigned long long)hd->hi, (unsigned long long)hd->params, (unsigned long long)params);
    if (hd->rank != (uint32_t)r || hd->world != (uint32_t)rd->world || hd->lo != next)
        return loom_error(LOOM_EFORMAT, "%s: holds rank %u of %u, floats from %llu; expected rank %d of %d from %zu", path, hd->rank, hd->world,
                          (unsigned long long)hd->lo, r, rd->world, next);
    return verify_payload(path, x);
}

loom_status loom_optim_reader_open(loom_optim_reader_t **out, const char *ckpt_dir, uint64_t params, uint64_t step, loom_optim_shard_t *saved) {
    *out = NULL;
    int world = 0;
    LOOM_TRY(list_shards(ckpt_dir, &world));
    loom_optim_reader_t *rd = loom_calloc(1, sizeof *rd);
    snprintf(rd->dir, sizeof rd->dir, "%s", ckpt_dir);
    rd->world = world;
    rd->sh = loom_calloc((size_t)world, sizeof *rd->sh);
    size_t next = 0;
    loom_status s = LOOM_OK;
    for (int r = 0; r < world && s == LOOM_OK; r++) {
        s = open_shard(rd, r, params, step, next);
        next = (size_t)rd->sh[r].hd.hi;
    }
    if (s == LOOM_OK && next != params)
        s = loom_error(LOOM_EFORMAT, "%s: the optimizer shards cover floats [0, %zu) of %llu; the checkpoint is incomplete", ckpt_dir, next,
                       (unsigned long long)params);
    if (s != LOOM_OK) {
        loom_optim_reader_close(rd);
        return s;
    }
    const opt_header_t *h = &rd->sh[world - 1].hd;
    if (saved) *saved = (loom_optim_shard_t){h->rank, h->world, h->zero, h->params, h->lo, h->hi, h->step};
    *out = rd;
    return LOOM_OK;
}

loom_status loom_optim_reader_read(loom_optim_reader_t *rd, int which, size_t a, size_t b, float *out) {
    for (int r = 0; r < rd->world; r++) {
        const opt_header_t *h = &rd->sh[r].hd;
        size_t x0 = a > h->lo ? a : (size_t)h->lo, x1 = b < h->hi ? b : (size_t)h->hi, n = (size_t)(h->hi - h->lo);
        if (x0 >= x1) continue;
        off_t at = (off_t)(h->header_bytes + ((which ? n : 0) + (x0 - h->lo)) * sizeof(float));
        if (fseeko(rd->sh[r].f, at, SEEK_SET) != 0 || fread(out + (x0 - a), sizeof(float), x1 - x0, rd->sh[r].f) != x1 - x0)
            return loom_error(LOOM_EIO, "%s: optimizer shard %d of %d: cannot read floats [%zu, %zu): %s", rd->dir, r, rd->world, x0, x1, strerror(errno));
    }
    return LOOM_OK;
}

void loom_optim_reader_close(loom_optim_reader_t *rd) {
    if (!rd) return;
    for (int r = 0; r < rd->world; r++)
        if (rd->sh[r].f) fclose(rd->sh[r].f);
    free(rd->sh);
    free(rd);
}

loom_status loom_optim_gather(const char *ckpt_dir, uint64_t params, uint64_t step, size_t lo, size_t hi,
                              float *m, float *v, loom_optim_shard_t *saved) {
    loom_optim_reader_t *rd;
    LOOM_TRY(loom_optim_reader_open(&rd, ckpt_dir, params, step, saved));
    loom_status s = loom_optim_reader_read(rd, 0, lo, hi, m);
    if (s == LOOM_OK) s = loom_optim_reader_read(rd, 1, lo, hi, v);
    loom_optim_reader_close(rd);
    return s;
}
