/* The collectives of src/parallel/dist.h called directly, on 3 ranks over
 * TCP (forked by loom_launch_local), against sums known in closed form:
 * rank r contributes values made from r, so every result is exact in fp32.
 * The blocking allreduce, reduce_scatter, allgather and broadcast, the
 * f64 allreduce, the byte count each rank reports, send/receive, and the
 * all-reduce of bf16 and fp16 buffers (tensor parallelism's activations:
 * on the host transports widened to fp32, summed, rounded once). Each rank checks
 * its own results and exits non-zero on the first wrong one; the cases
 * here read the ranks' exit codes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel/dist.h"
#include "parallel/launch.h"

#define WORLD 3
#define N 37 /* not a multiple of the world: uneven ring chunks */

enum { CASE_ALLREDUCE = 1, CASE_REDUCE_SCATTER, CASE_BROADCAST, CASE_BYTES, CASE_SPLIT, CASE_IALLGATHER, CASE_SENDRECV, CASE_ELEM };

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

/* loom_dist_split: colors rank % 2 give the groups {0, 2} and {1}; key
 * -rank reverses the order, so rank 2 is rank 0 of its group. A world
 * all-reduce stays in flight on the world's thread while the group runs
 * its own, and a second split (all ranks, one color) coexists. */
static int split_case(loom_dist_t *d, int rank) {
    loom_dist_t *g = NULL, *all = NULL;
    if (loom_dist_split(d, rank % 2, -rank, &g) != LOOM_OK) return 50;
    int want_size = rank == 1 ? 1 : 2, want_rank = rank == 0 ? 1 : 0;
    if (loom_dist_size(g) != want_size || loom_dist_rank(g) != want_rank) return 51;
    float w[N], x[N];
    for (int i = 0; i < N; i++) w[i] = value(rank, i), x[i] = value(rank, i);
    if (loom_dist_iallreduce(d, w, N, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 52;
    if (loom_dist_allreduce(g, x, N, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 53;
    for (int i = 0; i < N; i++) /* group {0, 2}: (1 + 3) * 1000 + 2i; group {1}: its own values */
        if (x[i] != (rank == 1 ? value(1, i) : (float)(4000 + 2 * i))) return 54;
    if (loom_dist_wait(d) != LOOM_OK) return 55;
    for (int i = 0; i < N; i++)
        if (w[i] != summed(i, 1.0f)) return 56;
    if (loom_dist_split(d, 7, rank, &all) != LOOM_OK) return 57;
    double f = rank;
    if (loom_dist_size(all) != WORLD || loom_dist_rank(all) != rank || loom_dist_allreduce_f64(all, &f, 1) != LOOM_OK || f != 3.0) return 58;
    loom_dist_free(all);
    loom_dist_free(g);
    return 0;
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
    if (loom_dist_iallgather(d, g, counts) != LOOM_OK) return 60;
    long mark = loom_dist_mark(d);
    if (loom_dist_ireduce_scatter(d, r, counts, LOOM_DIST_FP32, 1.0f) != LOOM_OK) return 61;
    if (loom_dist_wait_mark(d, mark) != LOOM_OK) return 62;
    for (int i = 0; i < N; i++)
        if (g[i] != value(i < 5 ? 0 : 2, i)) return 63;
    if (loom_dist_wait(d) != LOOM_OK) return 64;
    for (size_t i = off[rank]; i < off[rank] + counts[rank]; i++)
        if (r[i] != summed((int)i, 1.0f)) return 65;
    return 0;
}

/* Point to point (the pipeline's): every rank sends 4 MB to the next while
 * receiving 4 MB from the previous -- far above a socket's buffer, so two
 * blocking sends would deadlock -- then rank 0 sends alone to rank 2; a
 * send to oneself is refused. */
static int sendrecv_case(loom_dist_t *d, int rank) {
    enum { BIG = 1 << 20 };
    float *out = malloc(BIG * sizeof(float)), *in = malloc(BIG * sizeof(float));
    int next = (rank + 1) % WORLD, prev = (rank + WORLD - 1) % WORLD, rc = 0;
    for (int i = 0; i < BIG; i++) out[i] = value(rank, i);
    if (loom_dist_sendrecv(d, out, BIG * sizeof(float), next, in, BIG * sizeof(float), prev) != LOOM_OK) rc = 70;
    for (int i = 0; i < BIG && !rc; i++)
        if (in[i] != value(prev, i)) rc = 71;
    float one[N];
    if (!rc && rank == 0 && loom_dist_send(d, out, sizeof one, 2) != LOOM_OK) rc = 72;
    if (!rc && rank == 2 && loom_dist_recv(d, one, sizeof one, 0) != LOOM_OK) rc = 73;
    for (int i = 0; i < N && !rc && rank == 2; i++)
        if (one[i] != value(0, i)) rc = 74;
    if (!rc && loom_dist_send(d, out, sizeof one, rank) == LOOM_OK) rc = 75;
    free(out);
    free(in);
    return rc;
}

/* 16-bit buffers summed as stored. Even elements: bf16 (r+1)(i+1), whole
 * numbers under 256, exact in bf16, summing to 6(i+1); fp16 2.0 on every
 * rank, summing to 6.0 (0x4600). Odd elements tell one rounding from one
 * per ring step: rank 0 holds 1.0, ranks 1 and 2 a quarter of 1.0's last
 * place each (bf16 2^-8 = 0x3B80, fp16 2^-11 = 0x1000). Rounded at every
 * step of a ring that adds 1.0 first, 1 + 2^-8 ties to 1.0 and the sum
 * stays 1.0; summed in fp32 and rounded once it is 1 + 2^-7 (bf16 0x3F81),
 * 1 + 2^-10 (fp16 0x3C01), one last place up. 2 bytes an element are
 * counted. */
static uint16_t bf16_of_whole(int v) { /* exact for |v| < 256 */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static int elem_case(loom_dist_t *d, int rank) {
    uint16_t b[N], h[N];
    for (int i = 0; i < N; i++) {
        b[i] = i % 2 ? (rank ? 0x3B80 : 0x3F80) : bf16_of_whole((rank + 1) * (i + 1));
        h[i] = i % 2 ? (rank ? 0x1000 : 0x3C00) : 0x4000;
    }
    double before = loom_dist_bytes(d);
    if (loom_dist_allreduce_elem(d, b, N, LOOM_DIST_ELEM_BF16) != LOOM_OK) return 80;
    if (loom_dist_allreduce_elem(d, h, N, LOOM_DIST_ELEM_FP16) != LOOM_OK) return 81;
    for (int i = 0; i < N; i++) {
        if (b[i] != (i % 2 ? 0x3F81 : bf16_of_whole(6 * (i + 1)))) return 82;
        if (h[i] != (i % 2 ? 0x3C01 : 0x4600)) return 83;
    }
    return loom_dist_bytes(d) - before == 2.0 * 2 * N ? 0 : 84;
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
             : which == CASE_SPLIT                                ? split_case(d, rank)
             : which == CASE_IALLGATHER                           ? iallgather_case(d, rank)
             : which == CASE_SENDRECV                             ? sendrecv_case(d, rank)
             : which == CASE_ELEM                                 ? elem_case(d, rank)
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
static void split_groups(void) { on_ranks(CASE_SPLIT); }
static void iallgather_waits_by_mark(void) { on_ranks(CASE_IALLGATHER); }
static void sendrecv_ring_4mb_and_one_way(void) { on_ranks(CASE_SENDRECV); }
static void allreduce_bf16_fp16_rounded_once(void) { on_ranks(CASE_ELEM); }

int main(void) {
    RUN(allreduce_and_f64);
    RUN(reduce_scatter_then_allgather);
    RUN(broadcast_from_rank_2);
    RUN(bytes_counted);
    RUN(split_groups);
    RUN(iallgather_waits_by_mark);
    RUN(sendrecv_ring_4mb_and_one_way);
    RUN(allreduce_bf16_fp16_rounded_once);
    return check_main_end();
}
