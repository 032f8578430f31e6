#include "optim.h"

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

loom_status loom_optim_shard_save(const char *path, const loom_optim_shard_t *h, const loom_backend_t *be,
                                  const float *m, const float *v) {
    size_t n = (size_t)(h->hi - h->lo), payload = 2 * n * sizeof(float);
    char *buf = loom_malloc(sizeof(opt_header_t) + payload);
    opt_header_t *hd = (opt_header_t *)buf;
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
    float *p = (float *)(buf + sizeof *hd);
    if (n) {
        be->download(p, m, n * sizeof(float));
        be->download(p + n, v, n * sizeof(float));
    }
    hd->checksum = loom_fnv1a(p, payload, 1469598103934665603ULL);
    loom_status s = loom_file_write_atomic(path, buf, sizeof *hd + payload);
    free(buf);
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
    if (n) {
        be->upload(m, p, n * sizeof(float));
        be->upload(v, p + n, n * sizeof(float));
    }
    if (got) *got = (loom_optim_shard_t){hd.rank, hd.world, hd.zero, hd.params, hd.lo, hd.hi, hd.step};
out:
    free(buf);
    return s;
}
