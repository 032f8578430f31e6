#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int case_failed, case_skipped, any_failed;
static char skip_reason[512];

void check_fail(void) { case_failed = 1; }

void check_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
    va_end(ap);
    case_skipped = 1;
    /* bench/gpu-check.sh on a GPU machine: nothing may skip there */
    const char *req = getenv("LOOM_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) {
        printf("  LOOM_REQUIRE_GPU=1, so this skip fails: %s\n", skip_reason);
        case_failed = 1;
    }
}

void check_run(const char *name, void (*fn)(void)) {
    case_failed = case_skipped = 0;
    skip_reason[0] = 0;
    fflush(stdout);
    fn();
    if (case_failed) printf("FAIL %s\n", name);
    else if (case_skipped) printf("SKIP %s: %s\n", name, skip_reason);
    else printf("PASS %s\n", name);
    fflush(stdout);
    any_failed |= case_failed;
}

int check_main_end(void) { return any_failed ? 1 : 0; }

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
