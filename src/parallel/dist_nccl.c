/* dist_nccl: collectives on device buffers with NCCL, on a stream of their
 * own. Rank 0 makes the unique id and the bootstrap transport (mpi or tcp)
 * carries it to everyone. The communicator is created non-blocking so a
 * dead peer shows up as an asynchronous error (ncclCommGetAsyncError)
 * while we wait, and a wait longer than the timeout aborts the
 * communicator instead of hanging. Uneven reduce-scatter / all-gather
 * segments are a group of ncclReduce / ncclBroadcast calls, one per rank.
 * bf16 and fp16 buffers (tensor parallelism's activations) reduce as they
 * are; an fp32 buffer with bf16 on the wire (--grad-dtype bf16) is
 * converted into a bf16 scratch of this transport on its stream, reduced,
 * and widened back (docs/dist.md, "Tensor parallel on GPUs").
 * The caller must have finished writing a buffer on the compute stream
 * (backend sync) before handing it over. */
#if defined(LOOM_HAVE_CUDA) && defined(LOOM_HAVE_NCCL)
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_wire.h"
#include "parallel/dist_impl.h"

/* NCCL is opened with dlopen at the first join (libnccl.so.2 on the
 * loader's path, or the file LOOM_NCCL names), not linked: a run on one GPU
 * never needs libnccl, and a machine without it says so when a multi-GPU
 * run asks. The entry points used, typed by the header: */
#define NCCL_FUNCS(X)                                                                                   \
    X(ncclGetErrorString) X(ncclCommGetAsyncError) X(ncclCommAbort) X(ncclAllReduce) X(ncclGroupStart) \
    X(ncclGroupEnd) X(ncclReduce) X(ncclBroadcast) X(ncclCommDestroy) X(ncclGetUniqueId)               \
    X(ncclCommInitRankConfig) X(ncclSend) X(ncclRecv)
#define NCCL_PTR(f) __typeof__(&f) f;
static struct { /* filled by loom_dl_load in the order of NCCL_FUNCS */
    NCCL_FUNCS(NCCL_PTR)
} nccl_lib;
static int nccl_state; /* 0 not tried, 1 loaded, -1 not loadable (nccl_why says why) */
static char nccl_why[400];

static int nccl_load(void) {
    if (nccl_state) return nccl_state > 0;
    nccl_state = -1;
#define NCCL_NAME(f) #f,
    static const char *const names[] = {NCCL_FUNCS(NCCL_NAME)};
#undef NCCL_NAME
    static const loom_dl_spec_t spec = {
        .env = "LOOM_NCCL", .dflt = "libnccl.so.2", .what = "NCCL",
        .hint = "install NCCL, e.g. the nvidia-nccl Python package, and put its lib folder on LD_LIBRARY_PATH, or name "
                "the file in LOOM_NCCL",
        .too_old = "an NCCL older than 2.14?", .names = names, .n = sizeof names / sizeof *names};
    if (!loom_dl_load(&spec, (void **)&nccl_lib, nccl_why, sizeof nccl_why)) return 0;
    nccl_state = 1;
    return 1;
}

/* Every NCCL call below goes through the table. */
#define ncclGetErrorString nccl_lib.ncclGetErrorString
#define ncclCommGetAsyncError nccl_lib.ncclCommGetAsyncError
#define ncclCommAbort nccl_lib.ncclCommAbort
#define ncclAllReduce nccl_lib.ncclAllReduce
#define ncclGroupStart nccl_lib.ncclGroupStart
#define ncclGroupEnd nccl_lib.ncclGroupEnd
#define ncclReduce nccl_lib.ncclReduce
#define ncclBroadcast nccl_lib.ncclBroadcast
#define ncclCommDestroy nccl_lib.ncclCommDestroy
#define ncclGetUniqueId nccl_lib.ncclGetUniqueId
#define ncclCommInitRankConfig nccl_lib.ncclCommInitRankConfig
#define ncclSend nccl_lib.ncclSend
#define ncclRecv nccl_lib.ncclRecv

typedef struct {
    int rank, size;
    int device; /* CUDA device of this rank: set on the calling thread before every NCCL call */
    double timeout_s;
    ncclComm_t comm;
    cudaStream_t stream;
    const dist_join_t *boot; /* mpi or tcp: host bytes travel through it */
    uint16_t *wire;          /* device: the bf16 copy of an fp32 buffer (DIST_F32_AS_BF16) */
    size_t wire_cap;         /* its elements */
} nccl_t;

/* Wait for `what` (already enqueued, or an init in flight) to finish;
 * abort the communicator on an async error or after the timeout. */
static loom_status nccl_wait(nccl_t *n, const char *what, int stream_work) {
    double t0 = loom_now();
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclCommGetAsyncError(n->comm, &ar);
        if (ar != ncclSuccess && ar != ncclInProgress) {
            ncclCommAbort(n->comm);
            return loom_error(LOOM_EIO, "rank %d: NCCL %s failed: %s (a peer rank died or its GPU failed?)", n->rank, what, ncclGetErrorString(ar));
        }
        if (ar == ncclSuccess) {
            if (!stream_work) return LOOM_OK;
            cudaError_t ce = cudaStreamQuery(n->stream);
            if (ce == cudaSuccess) return LOOM_OK;
            if (ce != cudaErrorNotReady)
                return loom_error(LOOM_EIO, "rank %d: NCCL %s: CUDA error %s", n->rank, what, cudaGetErrorString(ce));
        }
        if (loom_now() - t0 > n->timeout_s) {
            ncclCommAbort(n->comm);
            return loom_error(LOOM_EIO, "rank %d: NCCL %s waited %.0f s (--dist-timeout); a peer rank is dead or hung", n->rank, what, n->timeout_s);
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static loom_status check(nccl_t *n, ncclResult_t r, const char *what) {
    if (r == ncclSuccess || r == ncclInProgress) return nccl_wait(n, what, 1);
    return loom_error(LOOM_EIO, "rank %d: NCCL %s: %s", n->rank, what, ncclGetErrorString(r));
}

/* The collectives run on dist.c's communication thread, not the thread that
 * opened the backend; a thread that never chose a device would create a
 * context on GPU 0 and NCCL would use it. */
static void on_device(const nccl_t *n) { cudaSetDevice(n->device); }

static ncclDataType_t nccl_type(dist_elem e) {
    switch (e) {
    case DIST_F64: return ncclFloat64;
    case DIST_BF16: case DIST_F32_AS_BF16: return ncclBfloat16;
    case DIST_F16: return ncclFloat16;
    default: return ncclFloat32;
    }
}

/* scale is 1 or 1/size (gradient averaging): ncclAvg does the division. */
static ncclRedOp_t nccl_op(const nccl_t *n, float scale) { return scale != 1.0f && n->size > 1 ? ncclAvg : ncclSum; }

/* One grouped call per rank r on its slice of buf (counts[r] elements, the
 * slices back to back): reduce to r (reduce-scatter) when reduce is set,
 * else broadcast from r (all-gather). */
static loom_status per_rank(nccl_t *n, void *buf, const size_t *counts, dist_elem e, int reduce, float scale,
                            const char *what) {
    on_device(n);
    size_t es = dist_elem_size(e), off = 0;
    ncclGroupStart();
    for (int r = 0; r < n->size; r++) {
        char *p = (char *)buf + off * es;
        if (counts[r] && reduce) ncclReduce(p, p, counts[r], nccl_type(e), nccl_op(n, scale), r, n->comm, n->stream);
        else if (counts[r]) ncclBroadcast(p, p, counts[r], nccl_type(e), r, n->comm, n->stream);
        off += counts[r];
    }
    return check(n, ncclGroupEnd(), what);
}

/* A conversion launched on the transport's stream, checked at once. */
static loom_status converted(nccl_t *n, int launch_error, const char *what) {
    if (launch_error == 0) return LOOM_OK;
    return loom_error(LOOM_EIO, "rank %d: NCCL %s: the bf16 conversion kernel failed: %s", n->rank, what,
                      cudaGetErrorString((cudaError_t)launch_error));
}

/* fp32 buf with bf16 on the wire: a bf16 copy in n->wire, reduced there by
 * NCCL in bf16 (each ring step adds in fp32 and rounds to bf16, as the tcp
 * ring's dist_elem_add does), then widened back into buf: all of it after
 * an all-reduce (counts NULL), this rank's segment after a reduce-scatter. */
static loom_status reduce_as_bf16(nccl_t *n, float *buf, size_t total, const size_t *counts, float scale,
                                  const char *what) {
    on_device(n);
    if (total > n->wire_cap) {
        if (n->wire) cudaFree(n->wire);
        n->wire_cap = 0;
        if (cudaMalloc((void **)&n->wire, total * sizeof *n->wire) != cudaSuccess) {
            n->wire = NULL;
            return loom_error(LOOM_ENOMEM, "rank %d: NCCL %s: no room on the GPU for the %.1f MB bf16 copy of the gradients "
                              "(--grad-dtype bf16); use --grad-dtype fp32", n->rank, what, total * 2e-6);
        }
        n->wire_cap = total;
    }
    LOOM_TRY(converted(n, loom_cuda_f32_to_bf16(n->wire, buf, total, n->stream), what));
    size_t lo = 0, cnt = total;
    if (counts) {
        LOOM_TRY(per_rank(n, n->wire, counts, DIST_BF16, 1, scale, what));
        for (int r = 0; r < n->rank; r++) lo += counts[r];
        cnt = counts[n->rank];
    } else {
        LOOM_TRY(check(n, ncclAllReduce(n->wire, n->wire, total, ncclBfloat16, nccl_op(n, scale), n->comm, n->stream), what));
    }
    LOOM_TRY(converted(n, loom_cuda_bf16_to_f32(buf + lo, n->wire + lo, cnt, n->stream), what));
    return nccl_wait(n, what, 1);
}

static loom_status nccl_allreduce(void *vn, void *buf, size_t count, dist_elem e, float scale) {
    nccl_t *n = vn;
    on_device(n);
    if (e == DIST_F32_AS_BF16) return reduce_as_bf16(n, buf, count, NULL, scale, "all-reduce");
    return check(n, ncclAllReduce(buf, buf, count, nccl_type(e), nccl_op(n, scale), n->comm, n->stream), "all-reduce");
}

static loom_status nccl_reduce_scatter(void *vn, void *buf, const size_t *counts, dist_elem e, float scale) {
    nccl_t *n = vn;
    if (e != DIST_F32_AS_BF16) return per_rank(n, buf, counts, e, 1, scale, "reduce-scatter");
    size_t total = 0;
    for (int r = 0; r < n->size; r++) total += counts[r];
    return reduce_as_bf16(n, buf, total, counts, scale, "reduce-scatter");
}

static loom_status nccl_allgather(void *vn, void *buf, const size_t *counts, dist_elem e) {
    return per_rank(vn, buf, counts, e, 0, 1.0f, "all-gather");
}

static loom_status nccl_broadcast(void *vn, void *buf, size_t bytes, int root) {
    nccl_t *n = vn;
    on_device(n);
    return check(n, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream), "broadcast");
}

/* Both sides in one group, so two neighbours exchanging never deadlock. */
static loom_status nccl_sendrecv(void *vn, const void *sbuf, size_t sn, int dst, void *rbuf, size_t rn, int src) {
    nccl_t *n = vn;
    on_device(n);
    ncclGroupStart();
    if (dst >= 0) ncclSend(sbuf, sn, ncclUint8, dst, n->comm, n->stream);
    if (src >= 0) ncclRecv(rbuf, rn, ncclUint8, src, n->comm, n->stream);
    return check(n, ncclGroupEnd(), "send/receive");
}

static void nccl_free(void *vn) {
    nccl_t *n = vn;
    on_device(n);
    ncclCommDestroy(n->comm);
    if (n->wire) cudaFree(n->wire);
    cudaStreamDestroy(n->stream);
    free(n);
}

/* Host bytes (the unique id at init) go through the bootstrap transport. */
static loom_status nccl_allgather_bytes(void *vn, const void *in, void *out, size_t bytes) {
    const dist_join_t *b = ((nccl_t *)vn)->boot;
    if (b->size == 1) {
        memcpy(out, in, bytes);
        return LOOM_OK;
    }
    return b->ops->allgather_bytes(b->impl, in, out, bytes);
}

static const dist_transport_t nccl_ops = DIST_TRANSPORT_OPS(nccl, NULL);

loom_status dist_nccl_join(dist_join_t *j, const dist_join_t *boot, int device, double timeout_s) {
    if (!nccl_load()) return loom_error(LOOM_EUNAVAIL, "rank %d: the nccl transport: %s", boot->rank, nccl_why);
    nccl_t *n = loom_calloc(1, sizeof *n);
    n->rank = boot->rank;
    n->size = boot->size;
    n->timeout_s = timeout_s;
    n->device = device;
    n->boot = boot;
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        free(n);
        return loom_error(LOOM_EUNAVAIL, "rank %d: CUDA device %d: %s (LOCAL_RANK picks the device; are there enough GPUs?)", boot->rank, device, cudaGetErrorString(ce));
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (n->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) memset(&id, 0, sizeof id);
    ncclUniqueId *all = loom_malloc((size_t)n->size * sizeof id);
    loom_status s = nccl_allgather_bytes(n, &id, all, sizeof id);
    if (s == LOOM_OK) id = all[0];
    free(all);
    if (s == LOOM_OK) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0; /* init and errors become pollable, see nccl_wait */
        ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->size, id, n->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress)
            s = loom_error(LOOM_EIO, "rank %d: NCCL init: %s", n->rank, ncclGetErrorString(r));
        else
            s = nccl_wait(n, "init", 0);
    }
    if (s != LOOM_OK) {
        cudaStreamDestroy(n->stream);
        free(n);
        return s;
    }
    *j = (dist_join_t){.rank = n->rank, .size = n->size, .local_rank = boot->local_rank, .impl = n,
                       .ops = &nccl_ops, .name = "nccl"};
    return LOOM_OK;
}
#elif defined(LOOM_HAVE_CUDA)
#include "parallel/dist_impl.h"

loom_status dist_nccl_join(dist_join_t *j, const dist_join_t *boot, int device, double timeout_s) {
    return loom_error(LOOM_EUNAVAIL, "rank %d: the nccl transport: this loom was built without NCCL's header "
                      "(nccl.h was not found beside the CUDA toolkit's); rebuild with it, or use --dist tcp",
                      boot->rank);
}
#else
typedef int loom_dist_nccl_unused; /* ISO C forbids an empty translation unit */
#endif
