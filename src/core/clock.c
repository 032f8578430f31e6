#include "core/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { CLOCK_REAL, CLOCK_FILE, CLOCK_TICK };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int kind = CLOCK_REAL;
static const char *path;       /* CLOCK_FILE: the file the test writes */
static double tick_s;          /* CLOCK_TICK: seconds per tick */
static _Atomic long long ticks; /* CLOCK_TICK: ticks so far */

static void parse(void) {
    const char *v = getenv("LOOM_TEST_CLOCK");
    if (!v || !*v) return;
    char *end;
    if (!strncmp(v, "file:", 5) && v[5]) {
        path = v + 5;
        kind = CLOCK_FILE;
    } else if (!strncmp(v, "tick:", 5) && (tick_s = strtod(v + 5, &end)) > 0 && end != v + 5 && !*end) {
        kind = CLOCK_TICK;
    } else {
        loom_warn("LOOM_TEST_CLOCK=%s: not file:PATH or tick:SECONDS (> 0); using the real clock", v);
    }
}

static double file_seconds(void) {
    FILE *f = fopen(path, "r");
    double t = 0;
    if (f) {
        if (fscanf(f, "%lf", &t) != 1) t = 0;
        fclose(f);
    }
    return t;
}

double loom_clock_now(void) {
    pthread_once(&once, parse);
    if (kind == CLOCK_FILE) return file_seconds();
    if (kind == CLOCK_TICK) return (double)atomic_load(&ticks) * tick_s;
    return loom_now();
}

void loom_clock_tick(void) {
    pthread_once(&once, parse);
    if (kind == CLOCK_TICK) atomic_fetch_add(&ticks, 1);
}
