/* core: status codes, error messages, check macros, logging, timing, RNG.
 * Knows nothing of the layers above it. */
#ifndef LOOM_CORE_H
#define LOOM_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Recoverable errors travel as values. The message for the most recent
 * failure on this thread is kept by loom_error() and read by loom_errmsg(). */
typedef enum {
    LOOM_OK = 0,
    LOOM_EINVAL,   /* a bad argument, flag or config: the user can fix it */
    LOOM_EIO,      /* a file could not be read */
    LOOM_EFORMAT,  /* a file's contents are not what they claim */
    LOOM_ENOMEM,   /* an allocation failed */
    LOOM_EUNAVAIL, /* a feature whose part is missing on this machine */
    LOOM_EINTERNAL, /* a bug: an invariant did not hold */
    LOOM_ESTOPPED, /* stopped on request (a signal) after a checkpoint: resumable */
    LOOM_EWRITE,   /* a file could not be written (disk full, read-only, no permission): exit 74 */
} loom_status;

/* Record a formatted message for `code` and return `code`, so that
 * `return loom_error(LOOM_EINVAL, "...")` both reports and propagates. */
loom_status loom_error(loom_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The message of the last loom_error() on this thread ("" if none). */
const char *loom_errmsg(void);
/* A short name for a status code ("invalid argument", ...). */
const char *loom_status_name(loom_status s);

/* Propagate a failing status from a call that returns loom_status. */
#define LOOM_TRY(call)                         \
    do {                                       \
        loom_status try_s_ = (call);           \
        if (try_s_ != LOOM_OK) return try_s_;  \
    } while (0)

/* Abort with file:line and the call's text when an invariant fails; for
 * bugs only, never for bad input. */
#define LOOM_ASSERT(cond)                                                   \
    do {                                                                    \
        if (!(cond)) loom_panic(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)
void loom_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* malloc/calloc that abort with a message when memory runs out. */
void *loom_malloc(size_t bytes);
void *loom_calloc(size_t n, size_t size);
char *loom_strdup(const char *s);

/* Logging to stderr. Quiet mode (LOOM_QUIET or loom_log_quiet(1)) keeps
 * warnings and errors only. */
void loom_log_quiet(int quiet);
void loom_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Wall-clock seconds from a monotonic clock. */
double loom_now(void);

/* Deterministic RNG (xorshift64*, seeded through splitmix64). */
typedef struct {
    uint64_t state;
} loom_rng_t;
void loom_rng_seed(loom_rng_t *rng, uint64_t seed);
uint64_t loom_rng_u64(loom_rng_t *rng);
float loom_rng_uniform(loom_rng_t *rng);              /* [0, 1) */
float loom_rng_normal(loom_rng_t *rng);               /* N(0, 1) */
void loom_rng_fill_normal(loom_rng_t *rng, float *x, size_t n, float std);

/* FNV-1a 64-bit hash, used to fingerprint tokenizers and files. */
uint64_t loom_fnv1a(const void *data, size_t n, uint64_t h);
#define LOOM_FNV_INIT 0xcbf29ce484222325ULL

/* Files. loom_file_open_regular opens PATH for reading only when it is a
 * regular file (a directory, a FIFO or a device is refused with a message
 * naming it) and gives its size from fstat, never from ftell: every reader
 * of a user-named file starts here. loom_file_open_fd is the same for the
 * readers that mmap (the descriptor is the caller's to close).
 * loom_file_read reads a whole file (NUL-terminated for text use).
 * loom_file_write_atomic writes to PATH.tmp, fsyncs it and renames it into
 * place, so a crash never leaves a half-written PATH. */
loom_status loom_file_open_regular(const char *path, FILE **f, size_t *size);
loom_status loom_file_open_fd(const char *path, int *fd, size_t *size);
loom_status loom_file_read(const char *path, char **data, size_t *size);
loom_status loom_file_write_atomic(const char *path, const void *data, size_t size);
/* The same for a file made of `n` parts written one after the other (no
 * copy into one buffer: a checkpoint's header, m and v). */
loom_status loom_file_write_atomic_parts(const char *path, int n, const void *const *data, const size_t *size);
int loom_path_is_dir(const char *path);
int loom_path_exists(const char *path);
loom_status loom_mkdir_p(const char *path);
/* fsync a directory so that renames inside it are durable. */
void loom_fsync_dir(const char *path);

/* An optional shared library (NCCL, cuSPARSELt), opened at first use. */
typedef struct {
    const char *env, *dflt;   /* the variable that may name the file, and the file otherwise */
    const char *what, *hint;  /* the library's name, and what to do when it is missing */
    const char *too_old;      /* why a library may lack an entry point */
    const char *const *names; /* the entry points, in the order of the caller's table */
    int n;
} loom_dl_spec_t;
/* Opens the file named by $env (when set and not empty) or dflt,
 * RTLD_NOW | RTLD_LOCAL, and resolves names[0..n) into slots[0..n) (the
 * caller's table of function pointers, filled as dlsym fills one). NULL
 * when it cannot, with why[0..wn): "<what> cannot be loaded: <dlerror>
 * (<hint>)" or "<file> has no <name> (<too_old>)". */
void *loom_dl_load(const loom_dl_spec_t *spec, void **slots, char *why, size_t wn);

#endif
