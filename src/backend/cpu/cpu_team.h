/* cpu_team: a persistent team of host threads for the many small parallel
 * loops of an inference step (a decode token of a small model is ~200
 * matrix-vector products of 10-60 us each, plus attention).
 *
 * A job is n independent tasks. The caller and the team's workers claim
 * tasks one at a time from one atomic word, and the caller returns once
 * every task has finished: it waits for work, never for a thread to
 * arrive, so a worker the OS has descheduled (a shared or busy machine)
 * costs nothing unless it holds a task. Workers spin a short while after a
 * job for the next one, then sleep on a futex.
 *
 * Results never depend on the team: every task must write its own
 * outputs, whichever thread runs it (the callers' tasks are output rows
 * or heads, each computed by one kernel in a fixed order). When the team
 * is busy (another thread's job), the caller is itself a worker or inside
 * an OpenMP region, or the team has one thread, the tasks run on the
 * calling thread, in order. */
#ifndef LOOM_CPU_TEAM_H
#define LOOM_CPU_TEAM_H

#include <stddef.h>

/* Task `task` (0 .. n-1) of a job on ctx. */
typedef void (*loom_cpu_team_fn)(void *ctx, int task);

/* At most this many tasks per job (the claim word's field). */
#define LOOM_CPU_TEAM_MAX_TASKS 65535

/* The team's size from now on, the caller included (the backend's
 * --threads); workers start at the first job. */
void loom_cpu_team_set_threads(int threads);
/* The team's size (1: jobs run on the caller). */
int loom_cpu_team_threads(void);
/* Run tasks 0 .. n-1 of fn on ctx (n <= LOOM_CPU_TEAM_MAX_TASKS) and
 * return when all have finished. */
void loom_cpu_team_run(loom_cpu_team_fn fn, void *ctx, int n);

/* Input rows up to which the drivers and attention use the team (decode:
 * one row per sequence); above, a prefill step, whose GEMMs and other ops
 * run on OpenMP: two teams spinning at once on the same cores made a
 * Q8_0 prefill 1.7x slower (docs/perf.md, issue 23 session 6). */
#define LOOM_CPU_TEAM_ROWS 4
/* Tasks 0 .. n-1 of fn on the team when rows <= LOOM_CPU_TEAM_ROWS, else
 * on OpenMP's (a dynamic schedule, one task at a time). */
void loom_cpu_team_or_omp(loom_cpu_team_fn fn, void *ctx, int n, int rows);

/* Rows per task for `rows` output rows (a multiple of `align`) whose
 * weights are `bytes` in all: about one task per LOOM_CPU_TEAM_TASK_BYTES
 * of weights, but at least 4 per thread (a thread the OS pauses leaves
 * only a small share to the others) and at most LOOM_CPU_TEAM_MAX_TASKS
 * over `passes` passes. With one claim word for the whole team, each
 * claim moved a cache line between cores (~0.2 us on a VM) and a thread's
 * consecutive tasks were apart: llama-3.2-1b Q4_K_M's decode read 27 GB/s
 * of the 34 the memory gives at 64 KB a task, 30 at 256 KB; with a range a
 * member (cpu_team.c) 32-34, and 64 KB and 256 KB the same (2-core Zen 4,
 * docs/perf.md). The larger leaves fewer claims; the last task a thread
 * waits for is still short (16 us). */
#define LOOM_CPU_TEAM_TASK_BYTES (256 * 1024)
int loom_cpu_team_rows_per_task(int rows, int align, size_t bytes, int passes);

/* Scratch slot `slot` (0 .. 3) of the calling thread, at least `bytes`
 * long (64-byte aligned; contents undefined; out of memory panics, as
 * loom_malloc).
 * Kept for the thread's next call and freed when the thread ends: the
 * drivers of a decode step need a few kilobytes per call, every call. */
void *loom_cpu_scratch(int slot, size_t bytes);

#endif
