/* The collectives of src/parallel/dist.h called directly, on 3 ranks over
 * TCP (forked by loom_launch_local), against sums known in closed form:
 * rank r contributes values made from r, so every result is exact in fp32.
 * The blocking allreduce, reduce_scatter, allgather and broadcast, the
 * f64 allreduce, and the byte count each rank reports. Each rank checks
 * its own results and exits non-zero on the first wrong one; the cases
 * here read the ranks' exit codes. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel/dist.h"
#include "parallel/launch.h"

#define WORLD 3
#define N 37 /* not a multiple of the world: uneven ring chunks */

enum { CASE_ALLREDUCE = 1, CASE_REDUCE_SCATTER, CASE_BROADCAST, CASE_BYTES, CASE_IALLGATHER };

static float value(int rank, int i) { return (float)((rank + 1) * 1000 + i); }
/* sum over ranks of value(r, i), times scale */
static float summed(int i, float scale) { return scale * (float)(6000 + WORLD * i); }

static int allreduce_case(loom_dist_t *d, int rank) {
    float buf[N];
    for (int i = 0; i < N; i++) buf[i] = value(rank, i);
    if (loom_dist_allreduce(d, buf, N, LOOM_DIST_FP32, 0.5f) != LOOM_OK) return 10;
    for (int i = 0; i < N; i++)
        if (buf[i] != summed(i, 0.5f)) return 11;
    double f[2] = {rank + 0.25, 0.125 * rank}; /* exact in binary: any order gives the same sum */
    if (loom_dist_allreduce_f64(d, f, 2) != LOOM_OK) return 12;
    return f[0] == 3.75 && f[1] == 0.375 ? 0 : 13;
}

/* Segments of 5, 0 and N-5 floats: rank 1's is empty. */
static int reduce_scatter_case(loom_dist_t *d, int rank) {
    size_t counts[WORLD] = {5, 0, N - 5}, off[WORLD] = {0, 5, 5};
    float buf[N];
    for (int i = 0; i < N; i++) buf[i] = value(rank, i);
    if (loom_dist_reduce_scatter(d, buf, counts, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 20;
    for (size_t i = off[rank]; i < off[rank] + counts[rank]; i++)
        if (buf[i] != summed((int)i, 1.0f)) return 21;
    /* allgather spreads every rank's reduced segment: the full sum everywhere */
    if (loom_dist_allgather(d, buf, counts) != LOOM_OK) return 22;
    for (int i = 0; i < N; i++)
        if (buf[i] != summed(i, 1.0f)) return 23;
    return 0;
}

static int broadcast_case(loom_dist_t *d, int rank) {
    char text[64];
    snprintf(text, sizeof text, "from rank %d", rank);
    if (loom_dist_broadcast(d, text, sizeof text, 2) != LOOM_OK) return 30;
    return strcmp(text, "from rank 2") == 0 ? 0 : 31;
}

/* Bytes handed to collectives: allreduce N floats, then allgather N floats. */
static int bytes_case(loom_dist_t *d, int rank) {
    float buf[N];
    size_t counts[WORLD] = {N, 0, 0};
    for (int i = 0; i < N; i++) buf[i] = 1;
    double before = loom_dist_bytes(d);
    if (loom_dist_allreduce(d, buf, N, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 40;
    if (loom_dist_allgather(d, buf, counts) != LOOM_OK) return 41;
    return loom_dist_bytes(d) - before == 2.0 * N * sizeof(float) ? 0 : 42;
}

/* The non-blocking all-gather, with a reduce-scatter issued after it: a
 * wait for the gather's mark returns the gathered buffer (each segment
 * from its own rank) while the later op may still run; loom_dist_wait then
 * finishes the reduce-scatter. */
static int iallgather_case(loom_dist_t *d, int rank) {
    size_t counts[WORLD] = {5, 0, N - 5}, off[WORLD] = {0, 5, 5};
    float g[N], r[N];
    for (int i = 0; i < N; i++) g[i] = (size_t)i >= off[rank] && (size_t)i < off[rank] + counts[rank] ? value(rank, i) : -1;
    for (int i = 0; i < N; i++) r[i] = value(rank, i);
    if (loom_dist_iallgather(d, g, counts) != LOOM_OK) return 50;
    long mark = loom_dist_mark(d);
    if (loom_dist_ireduce_scatter(d, r, counts, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 51;
    if (loom_dist_wait_mark(d, mark) != LOOM_OK) return 52;
    for (int i = 0; i < N; i++)
        if (g[i] != value(i < 5 ? 0 : 2, i)) return 53;
    if (loom_dist_wait(d) != LOOM_OK) return 54;
    for (size_t i = off[rank]; i < off[rank] + counts[rank]; i++)
        if (r[i] != summed((int)i, 1.0f)) return 55;
    return 0;
}

static int rank_main(int rank, void *ctx) {
    int which = *(const int *)ctx;
    loom_dist_t *d;
    loom_dist_opts_t o = {.transport = "tcp", .timeout_s = 600}; /* a guard only */
    if (loom_dist_init(&d, &o) != LOOM_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, loom_errmsg());
        return 2;
    }
    int rc = loom_dist_size(d) != WORLD || loom_dist_rank(d) != rank ? 3
             : which == CASE_ALLREDUCE                            ? allreduce_case(d, rank)
             : which == CASE_REDUCE_SCATTER                       ? reduce_scatter_case(d, rank)
             : which == CASE_BROADCAST                            ? broadcast_case(d, rank)
             : which == CASE_IALLGATHER                           ? iallgather_case(d, rank)
                                                                  : bytes_case(d, rank);
    if (rc) fprintf(stderr, "rank %d: check %d failed\n", rank, rc);
    loom_dist_free(d);
    return rc;
}

static void on_ranks(int which) {
    loom_launch_t l = {.what = "test_dist_collectives", .nproc = WORLD, .kill_after_s = 600, .run = rank_main, .ctx = &which};
    int code = -1;
    loom_status s = loom_launch_local(&l, &code);
    CHECK(s == LOOM_OK && code == 0, "launch %s, exit %d (the rank's message above names the check)",
          s == LOOM_OK ? "ok" : loom_errmsg(), code);
}

static void allreduce_and_f64(void) { on_ranks(CASE_ALLREDUCE); }
static void reduce_scatter_then_allgather(void) { on_ranks(CASE_REDUCE_SCATTER); }
static void broadcast_from_rank_2(void) { on_ranks(CASE_BROADCAST); }
static void bytes_counted(void) { on_ranks(CASE_BYTES); }
static void iallgather_waits_by_mark(void) { on_ranks(CASE_IALLGATHER); }

int main(void) {
    RUN(allreduce_and_f64);
    RUN(reduce_scatter_then_allgather);
    RUN(broadcast_from_rank_2);
    RUN(bytes_counted);
    RUN(iallgather_waits_by_mark);
    return check_main_end();
}
