/* dist_mpi: Open MPI for CPU ranks (mpirun, or srun with PMIx). Each
 * process group (loom_dist_split) has a communication thread of its own,
 * so calls may come from several threads: MPI_THREAD_MULTIPLE when the
 * library offers it, else MPI_THREAD_SERIALIZED with every call under one
 * lock (held per call, never across a wait, so groups still overlap).
 * Non-blocking MPI collectives progress only inside MPI calls, so each op
 * is started with its MPI_I* form and then tested with short sleeps: the
 * thread does not spin a core that the compute threads need. bf16 sums use
 * a user-defined op (MPI has no bf16 type). */
#ifdef LOOM_HAVE_MPI
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel/dist_impl.h"

typedef struct {
    int rank, size;
    MPI_Comm comm; /* MPI_COMM_WORLD, or a split group's */
    MPI_Op bf16_sum;
    MPI_Datatype bf16;
} mpi_t;

static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int mpi_multiple; /* the library took MPI_THREAD_MULTIPLE: no lock */
static void lock(void) { if (!mpi_multiple) pthread_mutex_lock(&mpi_mu); }
static void unlock(void) { if (!mpi_multiple) pthread_mutex_unlock(&mpi_mu); }
/* One MPI call under the lock; evaluates to its return code. */
#define LOCKED(call) (lock(), mpi_rc_ = (call), unlock(), mpi_rc_)
static _Thread_local int mpi_rc_;

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    dist_elem_add(inout, in, (size_t)*len, DIST_BF16);
}

static loom_status mpi_fail(mpi_t *m, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return loom_error(LOOM_EIO, "rank %d: MPI %s failed: %s", m->rank, what, msg);
}

/* Wait for a request without spinning: test, then sleep a little longer each time up to 200 us. */
static loom_status finish(mpi_t *m, MPI_Request *req, int rc, const char *what) {
    if (rc != MPI_SUCCESS) return mpi_fail(m, rc, what);
    int done = 0;
    long ns = 2000;
    for (;;) {
        rc = LOCKED(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS) return mpi_fail(m, rc, what);
        if (done) return LOOM_OK;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 200000) ns *= 2;
    }
}

static void types(mpi_t *m, dist_elem e, MPI_Datatype *dt, MPI_Op *op) {
    *dt = e == DIST_F64 ? MPI_DOUBLE : e == DIST_BF16 ? m->bf16 : MPI_FLOAT;
    *op = e == DIST_BF16 ? m->bf16_sum : MPI_SUM;
}

static loom_status mpi_allreduce(void *vm, void *buf, size_t n, dist_elem e, float scale) {
    mpi_t *m = vm;
    MPI_Datatype dt;
    MPI_Op op;
    types(m, e, &dt, &op);
    /* Counts above INT_MAX go in pieces. */
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
        size_t c = n - off < ((size_t)1 << 30) ? n - off : (size_t)1 << 30;
        MPI_Request r;
        int rc = LOCKED(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * dist_elem_size(e), (int)c, dt, op, m->comm, &r));
        LOOM_TRY(finish(m, &r, rc, "all-reduce"));
    }
    dist_elem_scale(buf, n, e, scale);
    return LOOM_OK;
}

static loom_status mpi_reduce_scatter(void *vm, void *buf, const size_t *counts, dist_elem e, float scale) {
    mpi_t *m = vm;
    MPI_Datatype dt;
    MPI_Op op;
    types(m, e, &dt, &op);
    int *rc_counts = loom_malloc((size_t)m->size * sizeof(int));
    size_t off = 0, total = 0;
    for (int r = 0; r < m->size; r++) {
        rc_counts[r] = (int)counts[r];
        if (r < m->rank) off += counts[r];
        total += counts[r];
    }
    MPI_Request req;
    /* In place: the result lands at the start of buf; move it to this rank's segment. */
    int rc = LOCKED(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, rc_counts, dt, op, m->comm, &req));
    loom_status s = finish(m, &req, rc, "reduce-scatter");
    free(rc_counts);
    LOOM_TRY(s);
    size_t es = dist_elem_size(e);
    if (off) memmove((char *)buf + off * es, buf, counts[m->rank] * es);
    dist_elem_scale((char *)buf + off * es, counts[m->rank], e, scale);
    (void)total;
    return LOOM_OK;
}

static loom_status mpi_allgather(void *vm, void *buf, const size_t *counts, dist_elem e) {
    mpi_t *m = vm;
    MPI_Datatype dt;
    MPI_Op op;
    types(m, e, &dt, &op);
    int *c = loom_malloc((size_t)m->size * sizeof(int)), *displ = loom_malloc((size_t)m->size * sizeof(int));
    size_t off = 0;
    for (int r = 0; r < m->size; r++) {
        c[r] = (int)counts[r];
        displ[r] = (int)off;
        off += counts[r];
    }
    MPI_Request req;
    int rc = LOCKED(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, displ, dt, m->comm, &req));
    loom_status s = finish(m, &req, rc, "all-gather");
    free(c);
    free(displ);
    return s;
}

static loom_status mpi_broadcast(void *vm, void *buf, size_t bytes, int root) {
    mpi_t *m = vm;
    MPI_Request req;
    int rc = LOCKED(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, m->comm, &req));
    return finish(m, &req, rc, "broadcast");
}

static loom_status mpi_allgather_bytes(void *vm, const void *in, void *out, size_t bytes) {
    mpi_t *m = vm;
    int rc = LOCKED(MPI_Allgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, m->comm));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(m, rc, "all-gather");
}

/* Tag 7 is the pipeline's; counts above INT_MAX bytes are refused (a
 * stage's activations are far smaller). */
static loom_status mpi_sendrecv(void *vm, const void *sbuf, size_t sn, int dst, void *rbuf, size_t rn, int src) {
    mpi_t *m = vm;
    if (sn > (size_t)INT_MAX || rn > (size_t)INT_MAX)
        return loom_error(LOOM_EUNAVAIL, "rank %d: MPI send/receive of %zu bytes; at most %d bytes per message", m->rank, sn > rn ? sn : rn, INT_MAX);
    MPI_Request req[2];
    int n = 0, rc = MPI_SUCCESS;
    if (src >= 0 && rc == MPI_SUCCESS) rc = LOCKED(MPI_Irecv(rbuf, (int)rn, MPI_BYTE, src, 7, m->comm, &req[n++]));
    if (dst >= 0 && rc == MPI_SUCCESS) rc = LOCKED(MPI_Isend(sbuf, (int)sn, MPI_BYTE, dst, 7, m->comm, &req[n++]));
    for (int i = 0; i < n; i++) LOOM_TRY(finish(m, &req[i], rc, "send/receive"));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(m, rc, "send/receive");
}

static void mpi_free(void *vm) {
    mpi_t *m = vm;
    if (m->comm != MPI_COMM_WORLD) { /* a split group: the world's types and MPI stay */
        lock();
        MPI_Comm_free(&m->comm);
        unlock();
        free(m);
        return;
    }
    MPI_Op_free(&m->bf16_sum);
    MPI_Type_free(&m->bf16);
    MPI_Finalize();
    free(m);
}

static const dist_transport_t mpi_ops;

static loom_status mpi_split(void *vm, int color, int key, dist_join_t *out) {
    mpi_t *p = vm;
    MPI_Comm c;
    int rc = LOCKED(MPI_Comm_split(p->comm, color, key, &c));
    if (rc != MPI_SUCCESS) return mpi_fail(p, rc, "communicator split");
    lock();
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    mpi_t *m = loom_calloc(1, sizeof *m);
    *m = *p;
    m->comm = c;
    MPI_Comm_rank(c, &m->rank);
    MPI_Comm_size(c, &m->size);
    unlock();
    *out = (dist_join_t){.rank = m->rank, .size = m->size, .impl = m, .ops = &mpi_ops, .name = "mpi"};
    return LOOM_OK;
}

static const dist_transport_t mpi_ops = DIST_TRANSPORT_OPS(mpi, mpi_split);

loom_status dist_mpi_join(dist_join_t *j) {
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return loom_error(LOOM_EUNAVAIL, "MPI_Init failed: launch with mpirun or srun, or use the torchrun environment");
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return loom_error(LOOM_EUNAVAIL, "this MPI library offers thread level %d; loom needs MPI_THREAD_SERIALIZED", provided);
    }
    mpi_multiple = provided >= MPI_THREAD_MULTIPLE;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_t *m = loom_calloc(1, sizeof *m);
    m->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->size);
    MPI_Type_contiguous(2, MPI_BYTE, &m->bf16);
    MPI_Type_commit(&m->bf16);
    MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr) lr = getenv("SLURM_LOCALID");
    *j = (dist_join_t){.rank = m->rank, .size = m->size, .local_rank = lr ? atoi(lr) : 0, .impl = m,
                       .ops = &mpi_ops, .name = "mpi"};
    /* Heartbeats go over loopback when every rank shares this host. */
    char host[256] = "", *all = loom_calloc((size_t)m->size, sizeof host);
    gethostname(host, sizeof host - 1);
    MPI_Allgather(host, sizeof host, MPI_BYTE, all, sizeof host, MPI_BYTE, MPI_COMM_WORLD);
    int same = 1;
    for (int r = 0; r < m->size; r++) same &= strcmp(all + (size_t)r * sizeof host, host) == 0;
    free(all);
    if (same) snprintf(j->addr, sizeof j->addr, "127.0.0.1");
    return LOOM_OK;
}
#else
typedef int loom_dist_mpi_unused; /* ISO C forbids an empty translation unit */
#endif
