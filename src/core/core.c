#define _GNU_SOURCE
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char errmsg[1024];

loom_status loom_error(loom_status code, const char *fmt, ...) {
    /* formatted apart, then copied: a caller may pass loom_errmsg() itself
     * to add where the error happened */
    char buf[sizeof errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(errmsg, buf, sizeof buf);
    return code;
}

const char *loom_errmsg(void) { return errmsg; }

const char *loom_status_name(loom_status s) {
    switch (s) {
    case LOOM_OK: return "ok";
    case LOOM_EINVAL: return "invalid argument";
    case LOOM_EIO: return "i/o error";
    case LOOM_EFORMAT: return "bad file format";
    case LOOM_ENOMEM: return "out of memory";
    case LOOM_EUNAVAIL: return "unavailable";
    case LOOM_EINTERNAL: return "internal error";
    case LOOM_ESTOPPED: return "stopped (resumable)";
    case LOOM_EWRITE: return "write error";
    }
    return "unknown status";
}

void loom_panic(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "loom: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void *loom_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) loom_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *loom_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) loom_panic(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

char *loom_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = loom_malloc(n);
    memcpy(d, s, n);
    return d;
}

static int quiet = -1;

void loom_log_quiet(int q) { quiet = q; }

static int is_quiet(void) {
    if (quiet < 0) {
        const char *e = getenv("LOOM_QUIET");
        quiet = e && *e && strcmp(e, "0") != 0;
    }
    return quiet;
}

void loom_info(const char *fmt, ...) {
    if (is_quiet()) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void loom_warn(const char *fmt, ...) {
    va_list ap;
    fputs("loom: warning: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void loom_rng_seed(loom_rng_t *rng, uint64_t seed) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    rng->state = z ? z : 0x2545f4914f6cdd1dULL;
}

uint64_t loom_rng_u64(loom_rng_t *rng) {
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return x * 0x2545f4914f6cdd1dULL;
}

float loom_rng_uniform(loom_rng_t *rng) {
    return (float)(loom_rng_u64(rng) >> 40) / 16777216.0f;
}

float loom_rng_normal(loom_rng_t *rng) {
    /* Box-Muller; u1 in (0, 1] so the log is finite. */
    float u1 = 1.0f - loom_rng_uniform(rng);
    float u2 = loom_rng_uniform(rng);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

void loom_rng_fill_normal(loom_rng_t *rng, float *x, size_t n, float std) {
    for (size_t i = 0; i < n; i++) x[i] = std * loom_rng_normal(rng);
}

uint64_t loom_fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

loom_status loom_file_open_fd(const char *path, int *fd, size_t *size) {
    *fd = open(path, O_RDONLY);
    if (*fd < 0) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int is_dir = S_ISDIR(st.st_mode);
        close(*fd);
        *fd = -1;
        return loom_error(LOOM_EIO, "%s: %s, not a file; pass the path of the file itself", path,
                          is_dir ? "a folder" : "not a regular file");
    }
    *size = (size_t)st.st_size;
    return LOOM_OK;
}

loom_status loom_file_open_regular(const char *path, FILE **f, size_t *size) {
    int fd;
    LOOM_TRY(loom_file_open_fd(path, &fd, size));
    *f = fdopen(fd, "rb");
    if (!*f) {
        close(fd);
        return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    return LOOM_OK;
}

loom_status loom_file_read(const char *path, char **data, size_t *size) {
    FILE *f;
    size_t n;
    LOOM_TRY(loom_file_open_regular(path, &f, &n));
    char *buf = loom_malloc(n + 1);
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return loom_error(LOOM_EIO, "%s: read %zu of %zu bytes (the file changed or the disk failed)", path, got, n);
    }
    buf[n] = 0;
    *data = buf;
    *size = n;
    return LOOM_OK;
}

static void dir_of(const char *path, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

void *loom_dl_load(const loom_dl_spec_t *spec, void **slots, char *why, size_t wn) {
    const char *e = getenv(spec->env), *path = e && *e ? e : spec->dflt;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, wn, "%s cannot be loaded: %s (%s)", spec->what, dlerror(), spec->hint);
        return NULL;
    }
    for (int i = 0; i < spec->n; i++)
        if (!(slots[i] = dlsym(h, spec->names[i]))) {
            snprintf(why, wn, "%s has no %s (%s)", path, spec->names[i], spec->too_old);
            dlclose(h);
            return NULL;
        }
    return h;
}

void loom_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

loom_status loom_file_write_atomic(const char *path, const void *data, size_t size) {
    return loom_file_write_atomic_parts(path, 1, &data, &size);
}

/* Writes all of p[0..left) to fd; 0 or an errno. */
static int write_all(int fd, const char *p, size_t left) {
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        p += w;
        left -= (size_t)w;
    }
    return 0;
}

loom_status loom_file_write_atomic_parts(const char *path, int n, const void *const *data, const size_t *size) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return loom_error(LOOM_EWRITE, "%s: cannot create: %s", tmp, strerror(errno));
    for (int i = 0; i < n; i++) {
        int e = write_all(fd, data[i], size[i]);
        if (e) {
            close(fd);
            unlink(tmp);
            return loom_error(LOOM_EWRITE, "%s: write failed: %s; %s is unchanged", tmp, strerror(e), path);
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_error(LOOM_EWRITE, "%s: sync failed: %s; %s is unchanged", tmp, strerror(e), path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_error(LOOM_EWRITE, "%s: rename failed: %s", path, strerror(e));
    }
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    loom_fsync_dir(dir);
    return LOOM_OK;
}

int loom_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int loom_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

loom_status loom_mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return loom_error(LOOM_EWRITE, "%s: cannot create folder: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return loom_error(LOOM_EWRITE, "%s: cannot create folder: %s", buf, strerror(errno));
    if (!loom_path_is_dir(buf)) return loom_error(LOOM_EIO, "%s: exists and is not a folder", buf);
    return LOOM_OK;
}
