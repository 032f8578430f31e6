/* dist: the transport-independent part. Finds the launch from the
 * environment, runs collectives in issue order on a communication thread
 * (so non-blocking ops overlap the caller's compute and transports need
 * not be thread-safe), converts to bf16 for compressed reductions, and runs
 * the watchdog that turns a dead or hung rank into a prompt, named exit. */
#define _GNU_SOURCE
#include "dist.h"
#include "backend/plugin.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/clock.h"
#include "parallel/dist_impl.h"

/* ---------------- element types ---------------- */

size_t dist_elem_size(dist_elem t) { return t == DIST_F64 ? 8 : t == DIST_BF16 || t == DIST_F16 ? 2 : 4; }

uint16_t dist_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                         /* nearest even */
    return (uint16_t)(u >> 16);
}

float dist_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void dist_elem_add(void *dst, const void *src, size_t n, dist_elem t) {
    if (t == DIST_F32) {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++) d[i] += s[i];
    } else if (t == DIST_F64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < n; i++) d[i] += s[i];
    } else {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) d[i] = dist_f32_to_bf16(dist_bf16_to_f32(d[i]) + dist_bf16_to_f32(s[i]));
    }
}

void dist_elem_scale(void *buf, size_t n, dist_elem t, float scale) {
    if (scale == 1.0f) return;
    if (t == DIST_F32) {
        float *d = buf;
        for (size_t i = 0; i < n; i++) d[i] *= scale;
    } else if (t == DIST_F64) {
        double *d = buf;
        for (size_t i = 0; i < n; i++) d[i] *= scale;
    } else {
        uint16_t *d = buf;
        for (size_t i = 0; i < n; i++) d[i] = dist_f32_to_bf16(dist_bf16_to_f32(d[i]) * scale);
    }
}

/* ---------------- ops and the communication thread ---------------- */

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_ALLREDUCE_F64, OP_BROADCAST, OP_BARRIER, OP_SENDRECV, OP_ALLREDUCE_ELEM } op_kind;
static const char *const op_names[] = {"all-reduce", "reduce-scatter", "all-gather", "all-reduce", "broadcast", "barrier", "send/receive", "all-reduce"};

typedef struct {
    op_kind kind;
    void *buf;
    size_t n;       /* elements (bytes for broadcast) */
    size_t *counts; /* reduce-scatter / all-gather, owned */
    loom_dist_dtype dt;
    loom_dist_elem elem; /* OP_ALLREDUCE_ELEM: the buffer's element type */
    float scale;
    int root;       /* broadcast's root; send/receive: the rank received from */
    const void *sbuf; /* send/receive: what goes to rank dst, sn bytes */
    size_t sn;
    int dst;
} op_t;

#define QCAP 4096

struct loom_dist {
    int rank, size, local_rank, gpu;
    int device; /* CUDA device of the NCCL transport */
    char name[32];
    double timeout_s;
    dist_join_t host;   /* mpi or tcp; size 1 = none */
    dist_join_t dev;    /* nccl; ops NULL = none */
    int have_dev;

    pthread_t comm;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    op_t q[QCAP];
    long issued, done; /* ops; q index = seq % QCAP */
    loom_status first_err;
    char err[512];
    int quit, comm_started;
    _Atomic double op_start; /* loom_clock_now when the running op began; 0 = idle */
    _Atomic long running_seq;

    /* watchdog */
    pthread_t dog;
    int dog_started, *hb;
    double *last_heard;
    long *peer_done;
    _Atomic int closing, dog_quit;

    double wait_s, bytes;

    /* Process groups (loom_dist_split): a group's parent, and a parent's
     * groups, whose running collectives the parent's watchdog times. */
    loom_dist_t *parent;
    loom_dist_t *kids[LOOM_DIST_MAX_GROUPS];
    _Atomic int nkids;
};

/* A buffer of 16-bit elements summed as stored (tensor parallelism's
 * activations): NCCL takes bf16 and fp16 as they are; the host transports
 * get an fp32 copy (they have no fp16 sum, and one rounding instead of one
 * per ring step makes the host's result the exact sum rounded once). */
static loom_status allreduce_elem(const loom_dist_t *d, const dist_join_t *J, op_t *o) {
    static const dist_elem wire[] = {[LOOM_DIST_ELEM_FP32] = DIST_F32, [LOOM_DIST_ELEM_BF16] = DIST_BF16,
                                     [LOOM_DIST_ELEM_FP16] = DIST_F16};
    static const loom_dtype host[] = {[LOOM_DIST_ELEM_FP32] = LOOM_FP32, [LOOM_DIST_ELEM_BF16] = LOOM_BF16,
                                      [LOOM_DIST_ELEM_FP16] = LOOM_FP16};
    if (d->have_dev || o->elem == LOOM_DIST_ELEM_FP32) return J->ops->allreduce(J->impl, o->buf, o->n, wire[o->elem], 1.0f);
    float *f = loom_malloc(o->n * sizeof *f + 4);
    loom_dtype_to_f32(f, o->buf, host[o->elem], o->n);
    loom_status s = J->ops->allreduce(J->impl, f, o->n, DIST_F32, 1.0f);
    if (s == LOOM_OK) loom_dtype_from_f32(o->buf, f, host[o->elem], o->n);
    free(f);
    return s;
}

/* An fp32 buffer reduced with bf16 on the wire (--grad-dtype bf16), on a
 * host transport: convert, reduce, convert back what this rank owns. */
static loom_status reduce_as_bf16(const loom_dist_t *d, const dist_join_t *J, op_t *o, size_t total) {
    float *f = o->buf;
    uint16_t *h = loom_malloc(total * sizeof *h + 2);
    for (size_t i = 0; i < total; i++) h[i] = dist_f32_to_bf16(f[i]);
    loom_status s;
    size_t lo = 0, hi = total;
    if (o->kind == OP_ALLREDUCE) {
        s = J->ops->allreduce(J->impl, h, total, DIST_BF16, o->scale);
    } else {
        s = J->ops->reduce_scatter(J->impl, h, o->counts, DIST_BF16, o->scale);
        for (int r = 0; r < d->rank; r++) lo += o->counts[r];
        hi = lo + o->counts[d->rank];
    }
    for (size_t i = lo; i < hi; i++) f[i] = dist_bf16_to_f32(h[i]);
    free(h);
    return s;
}

static loom_status run_op(loom_dist_t *d, op_t *o) {
    const dist_join_t *J = &d->host;
    switch (o->kind) {
    case OP_ALLREDUCE_F64:
        return J->ops->allreduce(J->impl, o->buf, o->n, DIST_F64, 1.0f);
    case OP_BROADCAST:
        return J->ops->broadcast(J->impl, o->buf, o->n, o->root);
    case OP_BARRIER: {
        double x = 0;
        return J->ops->allreduce(J->impl, &x, 1, DIST_F64, 1.0f);
    }
    default:
        break;
    }
    if (d->have_dev) J = &d->dev;
    if (o->kind == OP_SENDRECV) return J->ops->sendrecv(J->impl, o->sbuf, o->sn, o->dst, o->buf, o->n, o->root);
    if (o->kind == OP_ALLREDUCE_ELEM) return allreduce_elem(d, J, o);
    size_t total = o->n;
    if (o->kind != OP_ALLREDUCE) {
        total = 0;
        for (int r = 0; r < d->size; r++) total += o->counts[r];
    }
    if (o->kind == OP_ALLGATHER) return J->ops->allgather(J->impl, o->buf, o->counts, DIST_F32);
    if (o->dt == LOOM_DIST_BF16 && !d->have_dev) return reduce_as_bf16(d, J, o, total);
    /* fp32, or bf16 on NCCL, which converts on the device (dist_nccl.c) */
    dist_elem e = o->dt == LOOM_DIST_BF16 ? DIST_F32_AS_BF16 : DIST_F32;
    if (o->kind == OP_ALLREDUCE) return J->ops->allreduce(J->impl, o->buf, total, e, o->scale);
    return J->ops->reduce_scatter(J->impl, o->buf, o->counts, e, o->scale);
}

static void *comm_main(void *arg) {
    loom_dist_t *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->quit && d->done == d->issued) pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->done == d->issued && d->quit) break;
        op_t *o = &d->q[d->done % QCAP];
        loom_status prior = d->first_err;
        pthread_mutex_unlock(&d->mu);
        loom_status s = LOOM_OK;
        if (prior == LOOM_OK) { /* after a failure the rest are skipped */
            atomic_store(&d->running_seq, d->done);
            atomic_store(&d->op_start, loom_clock_now());
            s = run_op(d, o);
            atomic_store(&d->op_start, 0.0);
        }
        free(o->counts);
        o->counts = NULL;
        pthread_mutex_lock(&d->mu);
        if (s != LOOM_OK && d->first_err == LOOM_OK) {
            d->first_err = s;
            snprintf(d->err, sizeof d->err, "%s", loom_errmsg());
        }
        d->done++;
        pthread_cond_broadcast(&d->cv_done);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* The communication thread started, for the world and for a group. */
static void start_comm(loom_dist_t *d) {
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    pthread_create(&d->comm, NULL, comm_main, d);
    d->comm_started = 1;
}

static void stop_comm(loom_dist_t *d) {
    pthread_mutex_lock(&d->mu);
    d->quit = 1;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->comm, NULL);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_done);
}

static void issue(loom_dist_t *d, const op_t *o) {
    pthread_mutex_lock(&d->mu);
    while (d->issued - d->done >= QCAP) pthread_cond_wait(&d->cv_done, &d->mu);
    d->q[d->issued % QCAP] = *o;
    d->issued++;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
}

/* Wait until `mark` ops are done (mark < 0: every op issued so far). */
static loom_status wait_until(loom_dist_t *d, long mark) {
    if (!d || d->size == 1) return LOOM_OK;
    double t0 = loom_now();
    pthread_mutex_lock(&d->mu);
    while (d->done < (mark < 0 ? d->issued : mark)) pthread_cond_wait(&d->cv_done, &d->mu);
    loom_status s = d->first_err;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", d->err);
    pthread_mutex_unlock(&d->mu);
    d->wait_s += loom_now() - t0;
    if (s != LOOM_OK) return loom_error(s, "%s", msg);
    return LOOM_OK;
}

loom_status loom_dist_wait(loom_dist_t *d) { return wait_until(d, -1); }

long loom_dist_mark(loom_dist_t *d) {
    if (!d || d->size == 1) return 0;
    pthread_mutex_lock(&d->mu);
    long m = d->issued;
    pthread_mutex_unlock(&d->mu);
    return m;
}

loom_status loom_dist_wait_mark(loom_dist_t *d, long mark) { return wait_until(d, mark < 0 ? 0 : mark); }

static size_t sum_counts(const loom_dist_t *d, const size_t *counts) {
    size_t t = 0;
    for (int r = 0; r < d->size; r++) t += counts[r];
    return t;
}

static size_t *copy_counts(const loom_dist_t *d, const size_t *counts) {
    size_t *c = loom_malloc((size_t)d->size * sizeof *c);
    memcpy(c, counts, (size_t)d->size * sizeof *c);
    return c;
}

loom_status loom_dist_iallreduce(loom_dist_t *d, float *buf, size_t n, loom_dist_dtype dt, float scale) {
    if (d->size == 1) {
        if (!d->gpu) dist_elem_scale(buf, n, DIST_F32, scale);
        return LOOM_OK;
    }
    d->bytes += (double)n * (dt == LOOM_DIST_BF16 ? 2 : 4);
    issue(d, &(op_t){.kind = OP_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .scale = scale});
    return LOOM_OK;
}

loom_status loom_dist_ireduce_scatter(loom_dist_t *d, float *buf, const size_t *counts, loom_dist_dtype dt,
                                      float scale) {
    if (d->size == 1) {
        if (!d->gpu) dist_elem_scale(buf, counts[0], DIST_F32, scale);
        return LOOM_OK;
    }
    d->bytes += (double)sum_counts(d, counts) * (dt == LOOM_DIST_BF16 ? 2 : 4);
    issue(d, &(op_t){.kind = OP_REDUCE_SCATTER, .buf = buf, .counts = copy_counts(d, counts), .dt = dt, .scale = scale});
    return LOOM_OK;
}

loom_status loom_dist_allreduce(loom_dist_t *d, float *buf, size_t n, loom_dist_dtype dt, float scale) {
    LOOM_TRY(loom_dist_iallreduce(d, buf, n, dt, scale));
    return loom_dist_wait(d);
}

loom_status loom_dist_reduce_scatter(loom_dist_t *d, float *buf, const size_t *counts, loom_dist_dtype dt,
                                     float scale) {
    LOOM_TRY(loom_dist_ireduce_scatter(d, buf, counts, dt, scale));
    return loom_dist_wait(d);
}

loom_status loom_dist_allreduce_elem(loom_dist_t *d, void *buf, size_t n, loom_dist_elem t) {
    if (d->size == 1) return LOOM_OK;
    d->bytes += (double)n * (t == LOOM_DIST_ELEM_FP32 ? 4 : 2);
    issue(d, &(op_t){.kind = OP_ALLREDUCE_ELEM, .buf = buf, .n = n, .elem = t});
    return loom_dist_wait(d);
}

loom_status loom_dist_iallgather(loom_dist_t *d, float *buf, const size_t *counts) {
    if (d->size == 1) return LOOM_OK;
    d->bytes += (double)sum_counts(d, counts) * 4;
    issue(d, &(op_t){.kind = OP_ALLGATHER, .buf = buf, .counts = copy_counts(d, counts)});
    return LOOM_OK;
}

loom_status loom_dist_allgather(loom_dist_t *d, float *buf, const size_t *counts) {
    LOOM_TRY(loom_dist_iallgather(d, buf, counts));
    return loom_dist_wait(d);
}

loom_status loom_dist_allreduce_f64(loom_dist_t *d, double *buf, size_t n) {
    if (d->size == 1) return LOOM_OK;
    issue(d, &(op_t){.kind = OP_ALLREDUCE_F64, .buf = buf, .n = n});
    return loom_dist_wait(d);
}

loom_status loom_dist_broadcast(loom_dist_t *d, void *buf, size_t bytes, int root) {
    if (d->size == 1) return LOOM_OK;
    issue(d, &(op_t){.kind = OP_BROADCAST, .buf = buf, .n = bytes, .root = root});
    return loom_dist_wait(d);
}

loom_status loom_dist_barrier(loom_dist_t *d) {
    if (d->size == 1) return LOOM_OK;
    issue(d, &(op_t){.kind = OP_BARRIER});
    return loom_dist_wait(d);
}

loom_status loom_dist_sendrecv(loom_dist_t *d, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                               size_t rbytes, int src) {
    int n = loom_dist_size(d);
    if (dst >= n || src >= n || dst == loom_dist_rank(d) || src == loom_dist_rank(d) || (n == 1 && (dst >= 0 || src >= 0)))
        return loom_error(LOOM_EINVAL, "rank %d of %d: send to rank %d / receive from rank %d: a peer must be another rank of the job",
                          loom_dist_rank(d), n, dst, src);
    if (dst < 0 && src < 0) return LOOM_OK;
    d->bytes += dst >= 0 ? (double)sbytes : 0;
    issue(d, &(op_t){.kind = OP_SENDRECV, .sbuf = sbuf, .sn = dst >= 0 ? sbytes : 0, .dst = dst, .buf = rbuf,
                     .n = src >= 0 ? rbytes : 0, .root = src});
    return loom_dist_wait(d);
}

loom_status loom_dist_send(loom_dist_t *d, const void *buf, size_t bytes, int dst) {
    return loom_dist_sendrecv(d, buf, bytes, dst, NULL, 0, -1);
}

loom_status loom_dist_recv(loom_dist_t *d, void *buf, size_t bytes, int src) {
    return loom_dist_sendrecv(d, NULL, 0, -1, buf, bytes, src);
}

int loom_dist_rank(const loom_dist_t *d) { return d ? d->rank : 0; }
int loom_dist_size(const loom_dist_t *d) { return d ? d->size : 1; }
int loom_dist_local_rank(const loom_dist_t *d) { return d ? d->local_rank : 0; }
const char *loom_dist_name(const loom_dist_t *d) { return d ? d->name : "single"; }
double loom_dist_wait_seconds(const loom_dist_t *d) { return d ? d->wait_s : 0; }
double loom_dist_bytes(const loom_dist_t *d) { return d ? d->bytes : 0; }

const char *loom_dist_available(void) {
    return "single, tcp (torchrun environment, --nproc)"
#ifdef LOOM_HAVE_MPI
           ", mpi"
#else
           "; no mpi (build without Open MPI: install libopenmpi-dev and rebuild)"
#endif
#ifdef LOOM_HAVE_CUDA
           ", nccl"
#else
           "; no nccl (build without CUDA)"
#endif
        ;
}

/* ---------------- watchdog ---------------- */

typedef struct {
    int32_t rank, pad;
    int64_t done; /* collectives this rank has finished */
} heartbeat_t;

static __attribute__((noreturn)) void die(loom_dist_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void die(loom_dist_t *d, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nloom: rank %d: %s; exiting (status %d)\n", d->rank, msg, LOOM_DIST_EXIT_PEER);
    fflush(stderr);
    _exit(LOOM_DIST_EXIT_PEER);
}

static void *dog_main(void *arg) {
    loom_dist_t *d = arg;
    int n = d->size;
    struct pollfd *p = loom_calloc((size_t)n, sizeof *p);
    double last_beat = 0;
    while (!atomic_load(&d->dog_quit)) {
        for (int r = 0; r < n; r++) p[r] = (struct pollfd){.fd = d->hb[r], .events = POLLIN | POLLRDHUP};
        poll(p, (nfds_t)n, 200);
        double now = loom_clock_now();
        int closing = atomic_load(&d->closing);
        for (int r = 0; r < n; r++) {
            if (r == d->rank || d->hb[r] < 0 || !p[r].revents) continue;
            heartbeat_t h;
            ssize_t got = (p[r].revents & POLLIN) ? recv(d->hb[r], &h, sizeof h, MSG_WAITALL) : 0;
            if (got == (ssize_t)sizeof h) {
                d->last_heard[r] = now;
                d->peer_done[r] = h.done;
                continue;
            }
            if (closing) { /* peers leave after the last barrier */
                close(d->hb[r]);
                d->hb[r] = -1;
                continue;
            }
            die(d, "rank %d died: its connection closed (the process exited or was killed)", r);
        }
        if (now - last_beat >= 1.0) {
            heartbeat_t h = {.rank = d->rank, .done = d->done};
            for (int r = 0; r < n; r++)
                if (d->hb[r] >= 0) send(d->hb[r], &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
            last_beat = now;
        }
        if (closing) continue;
        for (int r = 0; r < n; r++)
            if (d->hb[r] >= 0 && now - d->last_heard[r] > d->timeout_s)
                die(d, "rank %d stopped answering for %.0f s (hung, stopped or unreachable; --dist-timeout %.0f)", r, now - d->last_heard[r], d->timeout_s);
        for (int k = 0; k < atomic_load(&d->nkids); k++) {
            loom_dist_t *g = d->kids[k];
            double gs = g ? atomic_load(&g->op_start) : 0;
            if (gs > 0 && now - gs > d->timeout_s)
                die(d, "a collective of its group of %d ranks (rank %d there) waited %.0f s (--dist-timeout); a rank of that group is hung or dead",
                    g->size, g->rank, now - gs);
        }
        double st = atomic_load(&d->op_start);
        if (st > 0 && now - st > d->timeout_s) {
            long seq = atomic_load(&d->running_seq);
            int behind = -1;
            for (int r = 0; r < n; r++)
                if (r != d->rank && d->peer_done[r] <= seq && (behind < 0 || d->peer_done[r] < d->peer_done[behind])) behind = r;
            if (behind >= 0)
                die(d, "collective #%ld (%s) waited %.0f s (--dist-timeout); rank %d is behind: it has finished only %ld collectives",
                    seq, op_names[d->q[seq % QCAP].kind], now - st, behind, d->peer_done[behind]);
            die(d, "collective #%ld (%s) waited %.0f s (--dist-timeout); no rank reports being behind", seq,
                op_names[d->q[seq % QCAP].kind], now - st);
        }
    }
    free(p);
    return NULL;
}

/* ---------------- init / free ---------------- */

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static loom_status join(loom_dist_t *d, const loom_dist_opts_t *o) {
    const char *want = o->transport && *o->transport ? o->transport : "auto";
    const char *ev = getenv("LOOM_DIST");
    if (!strcmp(want, "auto") && ev && *ev) want = ev;
    int ompi = env_int("OMPI_COMM_WORLD_SIZE", 0);
    int torch = getenv("WORLD_SIZE") && getenv("RANK");
    int slurm = env_int("SLURM_NTASKS", 0) > 1 && getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID");
    if (!strcmp(want, "auto")) want = torch ? "tcp" : ompi ? "mpi" : slurm ? "tcp" : "single";
    if (!strcmp(want, "single")) {
        d->host = (dist_join_t){.rank = 0, .size = 1};
        return LOOM_OK;
    }
    if (!strcmp(want, "mpi")) {
#ifdef LOOM_HAVE_MPI
        return dist_mpi_join(&d->host);
#else
        return loom_error(LOOM_EUNAVAIL, "launched for MPI (%d ranks) but this build has no MPI: install libopenmpi-dev (scripts/deps.sh) and rebuild, or launch with the torchrun environment or `loom train --nproc N`", ompi);
#endif
    }
    if (strcmp(want, "tcp") != 0)
        return loom_error(LOOM_EINVAL, "LOOM_DIST=%s: unknown transport; use single, mpi or tcp (this build: %s)", want, loom_dist_available());
    int rank, size, local;
    if (torch) {
        rank = env_int("RANK", 0);
        size = env_int("WORLD_SIZE", 1);
        local = env_int("LOCAL_RANK", rank);
    } else {
        rank = env_int("SLURM_PROCID", 0);
        size = env_int("SLURM_NTASKS", 1);
        local = env_int("SLURM_LOCALID", 0);
    }
    if (size < 1 || rank < 0 || rank >= size)
        return loom_error(LOOM_EINVAL, "RANK %d and WORLD_SIZE %d do not fit: need 0 <= RANK < WORLD_SIZE", rank, size);
    if (size == 1) {
        d->host = (dist_join_t){.rank = 0, .size = 1};
        return LOOM_OK;
    }
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return loom_error(LOOM_EINVAL, "rank %d of %d: MASTER_ADDR is not set; set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port (deploy/ scripts do)", rank, size);
    return dist_tcp_join(&d->host, rank, size, local, addr, env_int("MASTER_PORT", 29500), d->timeout_s);
}

/* What init allocates for the watchdog, and d itself. */
static void release(loom_dist_t *d) {
    free(d->hb);
    free(d->last_heard);
    free(d->peer_done);
    free(d);
}

static loom_status xchg_host(void *vd, const void *in, void *out, size_t bytes) {
    loom_dist_t *d = vd;
    return d->host.ops->allgather_bytes(d->host.impl, in, out, bytes);
}

loom_status loom_dist_init(loom_dist_t **out, const loom_dist_opts_t *o) {
    *out = NULL;
    loom_dist_t *d = loom_calloc(1, sizeof *d);
    d->timeout_s = o->timeout_s > 0 ? o->timeout_s : 300;
    d->gpu = o->gpu;
    loom_status s = join(d, o);
    if (s != LOOM_OK) {
        free(d);
        return s;
    }
    d->rank = d->host.rank;
    d->size = d->host.size;
    d->local_rank = d->host.local_rank;
    snprintf(d->name, sizeof d->name, "%s", d->size == 1 ? "single" : d->host.name);
    if (d->size == 1) {
        *out = d;
        return LOOM_OK;
    }
    /* The heartbeat mesh, then the threads. */
    d->hb = loom_malloc((size_t)d->size * sizeof(int));
    d->last_heard = loom_malloc((size_t)d->size * sizeof(double));
    d->peer_done = loom_calloc((size_t)d->size, sizeof(long));
    char addr[64];
    snprintf(addr, sizeof addr, "%s", d->host.addr);
    if (!addr[0]) dist_host_addr(addr, sizeof addr);
    s = dist_mesh_build(d->rank, d->size, addr, xchg_host, d, d->timeout_s, d->hb);
    if (s == LOOM_OK && o->gpu) {
#ifdef LOOM_HAVE_CUDA
        /* NCCL lives in the CUDA plugin (src/backend/plugin.h). */
        char why[1200];
        loom_status (*nccl_join)(dist_join_t *, const dist_join_t *, int, double) =
            (loom_status(*)(dist_join_t *, const dist_join_t *, int, double))loom_cuda_symbol("dist_nccl_join", why, sizeof why);
        d->device = o->device >= 0 ? o->device : d->local_rank;
        s = nccl_join ? nccl_join(&d->dev, &d->host, d->device, d->timeout_s)
                      : loom_error(LOOM_EUNAVAIL, "NCCL: %s", why);
        if (s == LOOM_OK) {
            d->have_dev = 1;
            snprintf(d->name + strlen(d->name), sizeof d->name - strlen(d->name), "+nccl");
        }
#else
        s = loom_error(LOOM_EUNAVAIL, "GPU ranks need NCCL, and this build has no CUDA");
#endif
    }
    if (s != LOOM_OK) {
        d->host.ops->free(d->host.impl);
        release(d);
        return s;
    }
    double now = loom_clock_now();
    for (int r = 0; r < d->size; r++) d->last_heard[r] = now;
    start_comm(d);
    pthread_create(&d->dog, NULL, dog_main, d);
    d->dog_started = 1;
    *out = d;
    return LOOM_OK;
}

int dist_split_members(const int *all, int size, int rank, int *members, int *n) {
    int color = all[2 * rank], me = 0;
    *n = 0;
    for (int r = 0; r < size; r++) {
        if (all[2 * r] != color) continue;
        int i = (*n)++; /* insertion by (key, rank): groups are small */
        while (i > 0 && all[2 * members[i - 1] + 1] > all[2 * r + 1]) {
            members[i] = members[i - 1];
            i--;
        }
        members[i] = r;
    }
    for (int i = 0; i < *n; i++)
        if (members[i] == rank) me = i;
    return me;
}

loom_status loom_dist_split(loom_dist_t *d, int color, int key, loom_dist_t **out) {
    *out = NULL;
    loom_dist_t *g = loom_calloc(1, sizeof *g);
    g->timeout_s = d->timeout_s;
    g->gpu = d->gpu;
    g->local_rank = d->local_rank;
    g->host = (dist_join_t){.rank = 0, .size = 1};
    if (d->size > 1) {
        if (atomic_load(&d->nkids) >= LOOM_DIST_MAX_GROUPS) {
            free(g);
            return loom_error(LOOM_EINVAL, "rank %d: more than %d process groups; free one first", d->rank, LOOM_DIST_MAX_GROUPS);
        }
        /* The parent's thread is idle once its ops are done; its transport is then the caller's. */
        loom_status s = loom_dist_wait(d);
        if (s == LOOM_OK) s = d->host.ops->split(d->host.impl, color, key, &g->host);
        if (s == LOOM_OK && g->host.size > 1 && d->have_dev) {
#ifdef LOOM_HAVE_CUDA
            char why[1200];
            loom_status (*nccl_join)(dist_join_t *, const dist_join_t *, int, double) =
                (loom_status(*)(dist_join_t *, const dist_join_t *, int, double))loom_cuda_symbol("dist_nccl_join", why, sizeof why);
            s = nccl_join ? nccl_join(&g->dev, &g->host, d->device, d->timeout_s)
                          : loom_error(LOOM_EUNAVAIL, "NCCL: %s", why);
            g->have_dev = s == LOOM_OK;
#endif
        }
        if (s != LOOM_OK) {
            if (g->host.size > 1) g->host.ops->free(g->host.impl);
            free(g);
            return s;
        }
        if (g->host.size == 1 && g->host.impl) { /* mpi's group of one: a single rank needs no communicator */
            g->host.ops->free(g->host.impl);
            g->host = (dist_join_t){.rank = 0, .size = 1};
        }
    }
    g->rank = g->host.rank;
    g->size = g->host.size;
    snprintf(g->name, sizeof g->name, "%s%s", g->size == 1 ? "single" : g->host.name, g->have_dev ? "+nccl" : "");
    if (g->size > 1) {
        g->parent = d;
        start_comm(g);
        d->kids[atomic_load(&d->nkids)] = g;
        atomic_fetch_add(&d->nkids, 1);
    }
    *out = g;
    return LOOM_OK;
}

/* A group: its ops done, its thread and transports gone, its parent told. */
static void free_group(loom_dist_t *g) {
    loom_dist_wait(g);
    stop_comm(g);
    loom_dist_t *p = g->parent;
    for (int k = 0; k < atomic_load(&p->nkids); k++)
        if (p->kids[k] == g) p->kids[k] = NULL; /* the watchdog skips it */
    if (g->have_dev) g->dev.ops->free(g->dev.impl);
    g->host.ops->free(g->host.impl);
    free(g);
}

void loom_dist_free(loom_dist_t *d) {
    if (!d) return;
    if (d->parent) {
        free_group(d);
        return;
    }
    if (d->size > 1) {
        loom_dist_wait(d);
        atomic_store(&d->closing, 1);
        loom_dist_barrier(d);
        stop_comm(d);
        atomic_store(&d->dog_quit, 1);
        pthread_join(d->dog, NULL);
        for (int r = 0; r < d->size; r++)
            if (d->hb[r] >= 0) close(d->hb[r]);
        if (d->have_dev) d->dev.ops->free(d->dev.impl);
        d->host.ops->free(d->host.impl);
    }
    release(d);
}
