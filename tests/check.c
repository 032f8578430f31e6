#include "check.h"

#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int case_failed, case_skipped, any_failed;
static char skip_reason[512], fail_reason[512];

void check_fail(void) { case_failed = 1; }

#define FORMAT_INTO(buf, fmt)         \
    do {                              \
        va_list ap;                   \
        va_start(ap, fmt);            \
        vsnprintf(buf, sizeof buf, fmt, ap); \
        va_end(ap);                   \
    } while (0)

void check_fail_why(const char *fmt, ...) {
    FORMAT_INTO(fail_reason, fmt);
    case_failed = 1;
}

void check_skip(const char *fmt, ...) {
    FORMAT_INTO(skip_reason, fmt);
    case_skipped = 1;
}

static int require_gpu(void) {
    const char *e = getenv("LOOM_REQUIRE_GPU");
    return e && strcmp(e, "1") == 0;
}

void check_skip_gpu(const char *fmt, ...) {
    char why[480];
    FORMAT_INTO(why, fmt);
    if (require_gpu()) check_fail_why("LOOM_REQUIRE_GPU=1 and no usable GPU: %s", why);
    else check_skip("%s", why);
}

int check_available(loom_status st, int gpu) {
    if (st == LOOM_OK) return 1;
    if (st == LOOM_EUNAVAIL && gpu) check_skip_gpu("%s", loom_errmsg());
    else if (st == LOOM_EUNAVAIL) check_skip("%s", loom_errmsg());
    else check_fail_why("status %d: %s", (int)st, loom_errmsg());
    return 0;
}

void check_run(const char *name, void (*fn)(void)) {
    case_failed = case_skipped = 0;
    skip_reason[0] = fail_reason[0] = 0;
    fflush(stdout);
    fn();
    if (case_failed && fail_reason[0]) printf("FAIL %s: %s\n", name, fail_reason);
    else if (case_failed) printf("FAIL %s\n", name);
    else if (case_skipped) printf("SKIP %s: %s\n", name, skip_reason);
    else printf("PASS %s\n", name);
    fflush(stdout);
    any_failed |= case_failed;
}

int check_main_end(void) { return any_failed ? 1 : 0; }

/* The child: open, then each case from `from` on, its index written to
 * `fd` before it starts (n after the last); exits with check_main_end. */
static void isolated_child(int fd, int from, int n, const char *(*name)(int), void (*open)(void), void (*run)(int)) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* what a dying child printed is not lost */
    if (open) open();
    for (int i = from; i <= n; i++) {
        if (write(fd, &i, sizeof i) != (ssize_t)sizeof i) _exit(3);
        if (i < n) run(i);
    }
    fflush(stdout);
    _exit(check_main_end());
}

void check_run_isolated(int n, const char *(*name)(int), void (*open)(void), void (*run)(int)) {
    for (int from = 0; from < n;) {
        int fds[2];
        fflush(stdout);
        if (pipe(fds) != 0) {
            perror("check_run_isolated: pipe");
            exit(2);
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("check_run_isolated: fork");
            exit(2);
        }
        if (pid == 0) {
            close(fds[0]);
            isolated_child(fds[1], from, n, name, open, run);
        }
        close(fds[1]);
        int last = from - 1, i;
        while (read(fds[0], &i, sizeof i) == (ssize_t)sizeof i) last = i;
        close(fds[0]);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        if (last >= n && WIFEXITED(status) && WEXITSTATUS(status) <= 1) {
            any_failed |= WEXITSTATUS(status);
            return;
        }
        int at = last < from ? from : last >= n ? n - 1 : last;
        if (WIFSIGNALED(status))
            printf("FAIL %s: the test process died in this case (signal %d, %s: loom_panic, an abort or a fault); "
                   "the cases after it run in a new process\n", name(at), WTERMSIG(status), strsignal(WTERMSIG(status)));
        else
            printf("FAIL %s: the test process exited with status %d in this case; the cases after it run in a new "
                   "process\n", name(at), WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        fflush(stdout);
        any_failed = 1;
        from = at + 1;
    }
}

double check_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

double check_rel_err_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

void check_fill(float *x, size_t n, float scale, unsigned seed) {
    unsigned long long s = 0x9E3779B97F4A7C15ULL * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        unsigned long long r = s * 0x2545F4914F6CDD1DULL;
        x[i] = scale * (2.0f * (float)(r >> 40) / 16777216.0f - 1.0f);
    }
}

float *check_rand(size_t n, float scale, unsigned seed) {
    float *x = loom_calloc(n ? n : 1, sizeof(float));
    check_fill(x, n, scale, seed);
    return x;
}

void check_tokens(int *x, int n, int V, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (int)((seed >> 8) % (unsigned)V);
    }
}

static char tmpdir[256];

static void tmpdir_remove(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (tmpdir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

const char *check_tmpdir(const char *name) {
    if (tmpdir[0]) return tmpdir;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom-test-%s-XXXXXX", name);
    if (!mkdtemp(tmpdir)) loom_panic(__FILE__, __LINE__, "mkdtemp %s failed", tmpdir);
    atexit(tmpdir_remove);
    return tmpdir;
}

const char *check_tmp_path(const char *file) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", check_tmpdir("tmp"), file);
    return buf[k];
}
