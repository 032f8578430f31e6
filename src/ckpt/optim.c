#include "optim.h"

#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

loom_status loom_optim_shard_save_host(const char *path, const loom_optim_shard_t *h, const float *m, const float *v) {
    size_t n = (size_t)(h->hi - h->lo), half = n * sizeof(float);
    opt_header_t head, *hd = &head;
    memset(hd, 0, sizeof *hd);
    memcpy(hd->magic, OPT_MAGIC, 8);
    hd->version = OPT_VERSION;
    hd->header_bytes = sizeof *hd;
    hd->rank = h->rank;
    hd->world = h->world;
    hd->zero = h->zero;
    hd->params = h->params;
    hd->lo = h->lo;
    hd->hi = h->hi;
    hd->step = h->step;
    /* FNV-1a runs byte by byte, so m's hash seeds v's: the checksum of the
     * payload m then v, without copying the two into one buffer. */
    hd->checksum = loom_fnv1a(v, half, loom_fnv1a(m, half, 1469598103934665603ULL));
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

static void host_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
/* Shard loads into host memory go through this two-slot stand-in. */
static const loom_backend_t host_memory = {.upload = host_copy, .download = host_copy};

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

loom_status loom_optim_gather(const char *ckpt_dir, uint64_t params, uint64_t step, size_t lo, size_t hi,
                              float *m, float *v, loom_optim_shard_t *saved) {
    int world = 0;
    LOOM_TRY(list_shards(ckpt_dir, &world));
    size_t covered = 0, next = 0;
    loom_status s = LOOM_OK;
    for (int r = 0; r < world && s == LOOM_OK; r++) {
        char path[4200], *buf;
        size_t len;
        loom_optim_shard_path(path, sizeof path, ckpt_dir, r, world);
        loom_optim_shard_t got, want = {0};
        want.step = step;
        /* Read the header for the range, then the checked payload. */
        if ((s = loom_file_read(path, &buf, &len)) != LOOM_OK) break;
        opt_header_t hd;
        if (len < sizeof hd) s = loom_error(LOOM_EFORMAT, "%s: shorter than the optimizer-state header", path);
        else memcpy(&hd, buf, sizeof hd);
        free(buf);
        if (s != LOOM_OK) break;
        want.params = params, want.lo = hd.lo, want.hi = hd.hi;
        size_t n = hd.hi > hd.lo && hd.hi - hd.lo < (1ULL << 40) ? (size_t)(hd.hi - hd.lo) : 0;
        float *tmp = loom_malloc(2 * n * sizeof(float) + 1);
        s = loom_optim_shard_load(path, &want, &host_memory, tmp, tmp + n, &got);
        if (s == LOOM_OK && (got.rank != (uint32_t)r || got.world != (uint32_t)world || got.lo != next))
            s = loom_error(LOOM_EFORMAT, "%s: holds rank %u of %u, floats from %llu; expected rank %d of %d from %zu", path, got.rank, got.world,
                           (unsigned long long)got.lo, r, world, next);
        if (s == LOOM_OK) {
            size_t a = lo > got.lo ? lo : (size_t)got.lo, b = hi < got.hi ? hi : (size_t)got.hi;
            if (a < b) {
                memcpy(m + (a - lo), tmp + (a - got.lo), (b - a) * sizeof(float));
                memcpy(v + (a - lo), tmp + n + (a - got.lo), (b - a) * sizeof(float));
                covered += b - a;
            }
            next = (size_t)got.hi;
            if (saved) *saved = got;
        }
        free(tmp);
    }
    if (s == LOOM_OK && (next != params || covered != hi - lo))
        s = loom_error(LOOM_EFORMAT, "%s: the optimizer shards cover floats [0, %zu) of %llu; the checkpoint is incomplete", ckpt_dir, next,
                       (unsigned long long)params);
    return s;
}
