#include "mem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long long cur[LOOM_MEM_KINDS];
static long long at_peak[LOOM_MEM_KINDS];
static long long peak_total;
static int report_armed;

/* glibc raises its mmap threshold to the size of each large block freed
 * (up to 32 MB), after which blocks of up to that size come from the heap
 * and stay resident when freed: a 30 MB parameter staging buffer freed at
 * start-up left ~30 MB of a GPT-sized run's heap resident for good. A
 * fixed 1 MB threshold hands every large buffer back to the kernel on
 * free, so the peak resident set is what the tensor tables say. */
__attribute__((constructor)) static void fixed_mmap_threshold(void) { mallopt(M_MMAP_THRESHOLD, 1 << 20); }

static const char *const names[LOOM_MEM_KINDS] = {"params", "grads", "optim", "acts", "batch"};

const char *loom_mem_name(loom_mem_kind k) { return (unsigned)k < LOOM_MEM_KINDS ? names[k] : "?"; }

double loom_mem_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtod(line + 6, NULL);
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = (double)ru.ru_maxrss;
    }
    return kb * 1024.0;
}

/* The LOOM_MEM_REPORT line; one write so that ranks appending to one file do not interleave. */
static void report(void) {
    const char *path = getenv("LOOM_MEM_REPORT");
    if (!path || !*path) return;
    size_t v[LOOM_MEM_KINDS];
    size_t total = loom_mem_at_peak(v);
    char buf[1024];
    const char *rank = getenv("RANK");
    int n = snprintf(buf, sizeof buf, "{\"pid\":%d,\"rank\":%s,\"peak_counted\":%zu", (int)getpid(),
                     rank && *rank ? rank : "0", total);
    for (int k = 0; k < LOOM_MEM_KINDS; k++) n += snprintf(buf + n, sizeof buf - (size_t)n, ",\"%s\":%zu", names[k], v[k]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, ",\"vmhwm\":%.0f}\n", loom_mem_peak_rss());
    FILE *f = fopen(path, "a");
    if (!f) return;
    fwrite(buf, 1, (size_t)n, f);
    fclose(f);
}

void loom_mem_count(loom_mem_kind k, long long bytes) {
    if ((unsigned)k >= LOOM_MEM_KINDS) return;
    pthread_mutex_lock(&lock);
    if (!report_armed) {
        report_armed = 1;
        if (getenv("LOOM_MEM_REPORT")) atexit(report);
    }
    cur[k] += bytes;
    long long total = 0;
    for (int i = 0; i < LOOM_MEM_KINDS; i++) total += cur[i];
    if (total > peak_total) {
        peak_total = total;
        memcpy(at_peak, cur, sizeof cur);
    }
    pthread_mutex_unlock(&lock);
}

size_t loom_mem_current(loom_mem_kind k) {
    if ((unsigned)k >= LOOM_MEM_KINDS) return 0;
    pthread_mutex_lock(&lock);
    long long v = cur[k];
    pthread_mutex_unlock(&lock);
    return v > 0 ? (size_t)v : 0;
}

size_t loom_mem_at_peak(size_t out[LOOM_MEM_KINDS]) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < LOOM_MEM_KINDS; i++) out[i] = at_peak[i] > 0 ? (size_t)at_peak[i] : 0;
    long long t = peak_total;
    pthread_mutex_unlock(&lock);
    return t > 0 ? (size_t)t : 0;
}
