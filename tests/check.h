/* A small test harness. Each test binary runs named cases with RUN(fn);
 * every case prints one line: "PASS name", "FAIL name" (after the failed
 * checks' messages) or "SKIP name: reason". tests/run.sh counts the lines.
 * check_main_end() returns 1 when any case failed, so the binary's exit
 * code fails too. */
#ifndef LOOM_TEST_CHECK_H
#define LOOM_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "core/core.h"

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
/* Mark the running case failed with a reason, printed on its FAIL line. */
void check_fail_why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Mark the running case skipped with a reason (it counts as neither).
 * Only for a part that is really absent on this machine (a package not
 * installed, no GPU): anything that failed is check_fail_why. */
void check_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* check_skip for a GPU case: a FAIL instead when LOOM_REQUIRE_GPU=1 (the
 * GPU check sets it, so that a machine whose GPU cannot be used fails). */
void check_skip_gpu(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* After opening a part (a backend, a device): 1 if `st` is LOOM_OK. Else
 * 0, and the case is skipped when `st` is LOOM_EUNAVAIL (the library says
 * the part is absent; with `gpu` set that is check_skip_gpu) and failed
 * for any other status, with loom_errmsg() as the reason. */
int check_available(loom_status st, int gpu);
void check_run(const char *name, void (*fn)(void));
int check_main_end(void);
/* Cases 0..n-1, each isolated from the others' deaths: they run in a child
 * process (fork), which calls `open` first (NULL: nothing; open a GPU
 * backend there, since a CUDA context does not survive fork) and then
 * run(i) for each case (run(i) calls check_run(name(i), ...)). When the
 * child dies in case i (loom_panic's abort, a fault, a signal), case i
 * FAILS saying so and a new child goes on from case i + 1: one failure
 * hides no later case. The cases' PASS/FAIL/SKIP lines are the child's;
 * a failed case fails check_main_end here too. */
void check_run_isolated(int n, const char *(*name)(int), void (*open)(void), void (*run)(int));

/* Normalized error ||a-b|| / max(||b||, tiny), in double. */
double check_rel_err(const float *a, const float *b, size_t n);
double check_rel_err_d(const float *a, const double *b, size_t n);
/* Random floats in [-scale, scale) from a fixed-per-call seed. */
void check_fill(float *x, size_t n, float scale, unsigned seed);
/* A new array of n (at least 1) such floats; free() it. */
float *check_rand(size_t n, float scale, unsigned seed);
/* n token ids in [0, V) from `seed` (a linear congruential sequence). */
void check_tokens(int *x, int n, int V, unsigned seed);

/* A fresh folder /tmp/loom-test-NAME-XXXXXX for this process, made on the
 * first call and removed with its contents at exit; later calls return it. */
const char *check_tmpdir(const char *name);
/* check_tmpdir()/file. The last 8 results stay valid. */
const char *check_tmp_path(const char *file);

#endif
