/* cpu_team: the inference step's persistent thread team (cpu_team.h).
 *
 * The tasks are split into one contiguous range a team member, each held
 * in its own 64-bit claim word (a cache line of its own): generation (32
 * bits), the range's end (16) and its next unclaimed task (16). A member
 * takes the next task of its own range with a compare-and-swap that adds
 * one, so its tasks are consecutive (one stream of weights, and a claim
 * word no other core touches while it has work); when its range is empty
 * it takes the last task of another's (a swap that lowers the end). A
 * successful swap on a word of the current generation proves the job has
 * not moved on (the next job is published only once every task of this
 * one has finished, and the generation would have to wrap 2^32 times for
 * an old word to come back), so the job's function and context, read
 * after the swap, are this job's. The caller publishes the generation
 * again in a 32-bit futex word the sleeping workers wait on.
 *
 * Why not OpenMP: an OpenMP parallel region ends in a barrier every
 * thread of the team must reach, so a decode token's ~200 regions each
 * wait for the slowest thread to be scheduled; on a machine shared with
 * other work, a 2-thread token took 5-10x the 1-thread time (docs/perf.md,
 * issue 23 session 6). Here the caller waits only for tasks in progress. */
#include "cpu_team.h"

#include "core/core.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define TEAM_MAX 256        /* threads, the caller included */
#define SPIN_NS 500000      /* a worker spins this long for the next job, then sleeps */

static struct {
    pthread_mutex_t use;           /* held by the caller of a job, and while workers start */
    int want;                      /* the team's size, the caller included */
    int started;                   /* workers running (they never end) */
    uint32_t next_gen;             /* under `use` */
    _Atomic int active;            /* workers 0 .. active-1 take tasks */
    _Atomic int lanes;             /* claim words of the current job (written under `use`) */
    _Atomic uint32_t gen;          /* the latest job's generation: the futex word */
    _Atomic int done;              /* tasks of the current job finished */
    _Atomic int sleepers;          /* workers in (or entering) futex wait */
    loom_cpu_team_fn fn;           /* the current job: written before its claim word */
    void *ctx;
} T = {.use = PTHREAD_MUTEX_INITIALIZER, .want = 1, .next_gen = 1};

/* Member k's range (the caller 0, worker i i + 1): gen << 32 | end << 16 | next task. */
static struct {
    _Alignas(64) _Atomic uint64_t w;
} lane[TEAM_MAX];

static _Thread_local int is_worker;

static void relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *w, uint32_t expect) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
#else
    (void)w, (void)expect;
    sched_yield();
#endif
}

static void futex_wake_all(_Atomic uint32_t *w) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)w;
#endif
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Claim and run tasks of job `gen` until none is left: member `self`'s
 * range from its front, then the others' from their ends. */
static void work(uint32_t gen, int self) {
    int lanes = atomic_load_explicit(&T.lanes, memory_order_relaxed); /* a newer job's is harmless: its words' generation differs */
    for (int k = 0; k < lanes; k++) {
        _Atomic uint64_t *w = &lane[(self + k) % lanes].w;
        uint64_t c = atomic_load_explicit(w, memory_order_acquire);
        for (;;) {
            unsigned end = (unsigned)(c >> 16) & 0xffffu, i = (unsigned)c & 0xffffu;
            if ((uint32_t)(c >> 32) != gen) return; /* the job has moved on */
            if (i >= end) break;                      /* this range is done: the next */
            uint64_t take = k == 0 ? c + 1 : c - (1u << 16); /* own: the front; another's: its last */
            if (!atomic_compare_exchange_weak_explicit(w, &c, take, memory_order_acq_rel, memory_order_acquire))
                continue; /* c now holds the word's value */
            T.fn(T.ctx, k == 0 ? (int)i : (int)end - 1); /* this job's: it cannot end before the task is done */
            atomic_fetch_add_explicit(&T.done, 1, memory_order_release);
            c = atomic_load_explicit(w, memory_order_acquire);
        }
    }
}

/* The generation of a job newer than `seen`: spin SPIN_NS (active
 * workers), then sleep on the futex word. */
static uint32_t wait_job(uint32_t seen, int spin) {
    long long t0 = spin ? now_ns() : 0;
    for (int i = 1; spin; i++) {
        uint32_t g = atomic_load_explicit(&T.gen, memory_order_acquire);
        if (g != seen) return g;
        relax();
        if (!(i & 63) && now_ns() - t0 > SPIN_NS) break;
    }
    for (;;) {
        atomic_fetch_add(&T.sleepers, 1); /* seq_cst with the caller's gen store, then sleepers load */
        if (atomic_load(&T.gen) == seen) futex_wait(&T.gen, seen);
        atomic_fetch_sub(&T.sleepers, 1);
        uint32_t g = atomic_load_explicit(&T.gen, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *worker_main(void *arg) {
    int idx = (int)(intptr_t)arg;
    is_worker = 1;
    uint32_t seen = 0;
    for (;;) {
        int on = idx < atomic_load_explicit(&T.active, memory_order_relaxed);
        seen = wait_job(seen, on);
        if (idx < atomic_load_explicit(&T.active, memory_order_relaxed)) work(seen, idx + 1);
    }
    return NULL;
}

/* Start workers up to want - 1 (under `use`); signals stay with the
 * program's own threads. */
static void start_workers(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (T.started < T.want - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)T.started) != 0) break; /* fewer helpers: still correct */
        pthread_detach(t);
        T.started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    atomic_store(&T.active, T.want - 1 < T.started ? T.want - 1 : T.started);
}

void loom_cpu_team_set_threads(int threads) {
    pthread_mutex_lock(&T.use);
    T.want = threads < 1 ? 1 : threads > TEAM_MAX ? TEAM_MAX : threads;
    if (T.started > T.want - 1) atomic_store(&T.active, T.want - 1);
    pthread_mutex_unlock(&T.use);
}

int loom_cpu_team_threads(void) { return T.want; }

int loom_cpu_team_rows_per_task(int rows, int align, size_t bytes, int passes) {
    long long tasks = (long long)(bytes / LOOM_CPU_TEAM_TASK_BYTES);
    if (tasks < 4LL * T.want) tasks = 4LL * T.want;
    int per = (int)((rows + tasks - 1) / tasks);
    per = per < align ? align : (per + align - 1) / align * align;
    while ((long long)passes * ((rows + per - 1) / per) > LOOM_CPU_TEAM_MAX_TASKS) per *= 2;
    return per;
}

void loom_cpu_team_run(loom_cpu_team_fn fn, void *ctx, int n) {
    if (n <= 0) return;
    if (n == 1 || T.want <= 1 || is_worker || omp_in_parallel() || n > LOOM_CPU_TEAM_MAX_TASKS ||
        pthread_mutex_trylock(&T.use) != 0) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    if (T.started < T.want - 1) start_workers();
    T.fn = fn, T.ctx = ctx;
    atomic_store_explicit(&T.done, 0, memory_order_relaxed);
    uint32_t g = T.next_gen++;
    if (!g) g = T.next_gen++; /* 0 is every worker's first `seen` */
    int lanes = T.want < n ? T.want : n; /* workers that never started leave theirs to be taken */
    atomic_store_explicit(&T.lanes, lanes, memory_order_relaxed); /* seen with the words, after the acquire of gen */
    for (int k = 0; k < lanes; k++) {
        uint64_t a = (uint64_t)n * (uint64_t)k / (uint64_t)lanes, b = (uint64_t)n * (uint64_t)(k + 1) / (uint64_t)lanes;
        atomic_store_explicit(&lane[k].w, (uint64_t)g << 32 | b << 16 | a, memory_order_release);
    }
    atomic_store(&T.gen, g);
    if (atomic_load(&T.sleepers)) futex_wake_all(&T.gen);
    work(g, 0);
    while (atomic_load_explicit(&T.done, memory_order_acquire) < n) relax();
    pthread_mutex_unlock(&T.use);
}

/* ---- per-thread scratch ---- */

#define SCRATCH_SLOTS 4
typedef struct {
    void *p[SCRATCH_SLOTS];
    size_t n[SCRATCH_SLOTS];
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *v) {
    scratch_t *s = v;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

void *loom_cpu_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = loom_calloc(1, sizeof *s);
        pthread_setspecific(scratch_key, s);
    }
    if (s->n[slot] < bytes) {
        size_t want = (bytes + 63) / 64 * 64;
        void *p = NULL;
        if (posix_memalign(&p, 64, want) != 0) loom_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes of scratch", want);
        free(s->p[slot]);
        s->p[slot] = p, s->n[slot] = want;
    }
    return s->p[slot];
}

void loom_cpu_team_or_omp(loom_cpu_team_fn fn, void *ctx, int n, int rows) {
    if (rows <= LOOM_CPU_TEAM_ROWS) {
        loom_cpu_team_run(fn, ctx, n);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) fn(ctx, i);
}
