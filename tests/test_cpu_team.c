/* The CPU backend's thread team (backend/cpu/cpu_team.h): every task of a
 * job runs exactly once (each member's range taken from its front, and
 * from its end by the others once theirs are done), the caller returns
 * only after all finished, jobs
 * from two threads at once (one runs inline) and from inside a task (the
 * caller is then a worker: inline) are correct, and the per-thread scratch
 * keeps its size and alignment. Known answers, no timing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_team.h"
#include "check.h"

typedef struct {
    _Atomic int *hits; /* (n) runs of each task */
    int *value;        /* (n) each task writes its own */
    int n, salt;
} job_t;

static void task(void *ctx, int t) {
    job_t *j = ctx;
    atomic_fetch_add(&j->hits[t], 1);
    volatile int s = 0;
    int spin = j->salt < 0 && t < j->n / 4 ? 20000 : (t % 7) * 50; /* uneven tasks; salt < 0: the first member's range slow */
    for (int k = 0; k < spin; k++) s += k;
    j->value[t] = t * 3 + j->salt;
}

/* Run `rounds` jobs of n tasks; 1 when every task ran once and wrote its value. */
static int jobs_ok(int n, int rounds, int salt) {
    _Atomic int *hits = calloc((size_t)n, sizeof *hits);
    int *value = calloc((size_t)n, sizeof *value), ok = 1;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n; i++) atomic_store(&hits[i], 0), value[i] = -1;
        job_t j = {hits, value, n, salt + r};
        loom_cpu_team_run(task, &j, n);
        for (int i = 0; i < n; i++) ok &= atomic_load(&hits[i]) == 1 && value[i] == i * 3 + salt + r;
    }
    free(hits);
    free(value);
    return ok;
}

static void each_task_once(void) {
    for (int threads = 1; threads <= 4; threads++) {
        loom_cpu_team_set_threads(threads);
        CHECK(loom_cpu_team_threads() == threads, "team of %d, asked %d", loom_cpu_team_threads(), threads);
        CHECK(jobs_ok(1, 10, 0), "1 task, %d threads", threads);
        CHECK(jobs_ok(3, 500, 1), "3 tasks, %d threads", threads);
        CHECK(jobs_ok(257, 200, 2), "257 tasks, %d threads", threads);
        CHECK(jobs_ok(64, 50, -100), "64 tasks, the caller's range slow (the others take its last tasks), %d threads", threads);
        CHECK(jobs_ok(LOOM_CPU_TEAM_MAX_TASKS, 2, 3), "%d tasks, %d threads", LOOM_CPU_TEAM_MAX_TASKS, threads);
    }
    loom_cpu_team_run(task, NULL, 0); /* no task: returns at once */
}

static void *other_caller(void *arg) {
    *(int *)arg = jobs_ok(64, 300, 7);
    return NULL;
}

static void two_callers(void) {
    loom_cpu_team_set_threads(2);
    pthread_t t;
    int theirs = 0;
    CHECK(pthread_create(&t, NULL, other_caller, &theirs) == 0, "thread");
    int mine = jobs_ok(64, 300, 11);
    pthread_join(t, NULL);
    CHECK(mine && theirs, "concurrent jobs: mine %d, theirs %d", mine, theirs);
}

static void nested_task(void *ctx, int t) {
    int *ok = ctx;
    ok[t] = jobs_ok(5, 3, t); /* a job from inside a task: runs inline */
}

static void nested(void) {
    loom_cpu_team_set_threads(2);
    int ok[8] = {0};
    loom_cpu_team_run(nested_task, ok, 8);
    for (int i = 0; i < 8; i++) CHECK(ok[i], "nested job in task %d", i);
}

static void scratch(void) {
    char *a = loom_cpu_scratch(0, 100);
    CHECK(a && (uintptr_t)a % 64 == 0, "slot 0 aligned");
    memset(a, 1, 100);
    CHECK(loom_cpu_scratch(0, 50) == a, "a smaller request keeps the buffer");
    char *b = loom_cpu_scratch(1, 1 << 20);
    CHECK(b && b != a && (uintptr_t)b % 64 == 0, "slot 1 is its own");
    memset(b, 2, 1 << 20);
    CHECK(a[99] == 1, "slot 0 untouched by slot 1");
}

int main(void) {
    RUN(each_task_once);
    RUN(two_callers);
    RUN(nested);
    RUN(scratch);
    return check_main_end();
}
