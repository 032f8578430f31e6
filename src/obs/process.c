/* process: process_* metrics from /proc (see process.h). */
#define _GNU_SOURCE
#include "obs/process.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

enum { P_CPU, P_RSS, P_VSZ, P_FDS, P_MAX_FDS, P_START, P_N };

struct loom_process_metrics {
    loom_metrics_t *reg;
    loom_metric_t *m[P_N];
    double cpu_reported; /* CPU seconds already added to the counter */
};

double loom_process_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (!f) return NAN;
    int ok = fscanf(f, "%ld %ld", &pages, &rss) == 2;
    fclose(f);
    return ok ? (double)rss * (double)sysconf(_SC_PAGESIZE) : NAN;
}

/* utime + stime (s), virtual size (bytes) and start time (s after boot)
 * from /proc/self/stat; 0 when it cannot be read. */
static int read_stat(double *cpu_s, double *vsize, double *start_s) {
    char buf[2048];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return 0;
    unsigned long long ut, st, start, vsz;
    /* fields 3.. after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
     * cutime cstime priority nice threads itrealvalue starttime vsize */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu %llu", &ut, &st,
               &start, &vsz) != 4)
        return 0;
    double hz = (double)sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(ut + st) / hz;
    *vsize = (double)vsz;
    *start_s = (double)start / hz;
    return 1;
}

/* Seconds since the epoch at boot (btime of /proc/stat), NaN if unknown. */
static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    char line[256];
    double bt = NAN;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) bt = atof(line + 6);
    if (f) fclose(f);
    return bt;
}

static double open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return NAN;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory stream's own descriptor */
}

static void collect(void *ctx) {
    loom_process_metrics_t *p = ctx;
    double cpu, vsz, start;
    if (read_stat(&cpu, &vsz, &start)) {
        loom_counter_add(p->m[P_CPU], cpu - p->cpu_reported);
        if (cpu > p->cpu_reported) p->cpu_reported = cpu;
        loom_gauge_set(p->m[P_VSZ], vsz);
    }
    double rss = loom_process_rss_bytes(), fds = open_fds();
    if (isfinite(rss)) loom_gauge_set(p->m[P_RSS], rss);
    if (isfinite(fds)) loom_gauge_set(p->m[P_FDS], fds);
}

loom_process_metrics_t *loom_process_metrics_open(loom_metrics_t *reg, const char *label, const char *value) {
    static const loom_metric_def_t d[P_N] = {
        [P_CPU] = {1, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds."},
        [P_RSS] = {0, "process_resident_memory_bytes", "Resident memory size in bytes."},
        [P_VSZ] = {0, "process_virtual_memory_bytes", "Virtual memory size in bytes."},
        [P_FDS] = {0, "process_open_fds", "Number of open file descriptors."},
        [P_MAX_FDS] = {0, "process_max_fds", "Maximum number of open file descriptors."},
        [P_START] = {0, "process_start_time_seconds", "Start time of the process since unix epoch in seconds."},
    };
    loom_process_metrics_t *p = loom_calloc(1, sizeof *p);
    p->reg = reg;
    loom_metrics_declare(reg, d, P_N, label, value, p->m);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) loom_gauge_set(p->m[P_MAX_FDS], (double)rl.rlim_cur);
    double cpu, vsz, start, bt = boot_time();
    if (read_stat(&cpu, &vsz, &start) && isfinite(bt)) loom_gauge_set(p->m[P_START], bt + start);
    if (reg) loom_metrics_on_collect(reg, collect, p);
    return p;
}

void loom_process_metrics_close(loom_process_metrics_t *p) {
    if (!p) return;
    loom_metrics_off_collect(p->reg, collect, p);
    free(p);
}
