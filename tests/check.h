/* A small test harness. Each test binary runs named cases with RUN(fn);
 * every case prints one line: "PASS name", "FAIL name" (after the failed
 * checks' messages) or "SKIP name: reason". tests/run.sh counts the lines.
 * check_main_end() returns 1 when any case failed, so the binary's exit
 * code fails too. */
#ifndef LOOM_TEST_CHECK_H
#define LOOM_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            printf("  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            printf(__VA_ARGS__);                                                 \
            printf("\n");                                                        \
            check_fail();                                                        \
        }                                                                        \
    } while (0)

#define RUN(fn) check_run(#fn, fn)

void check_fail(void);
/* Mark the running case skipped with a reason (it counts as neither). */
void check_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void check_run(const char *name, void (*fn)(void));
int check_main_end(void);

/* Normalized error ||a-b|| / max(||b||, tiny), in double. */
double check_rel_err(const float *a, const float *b, size_t n);
double check_rel_err_d(const float *a, const double *b, size_t n);
/* Random floats in [-scale, scale) from a fixed-per-call seed. */
void check_fill(float *x, size_t n, float scale, unsigned seed);

#endif
