/* dist_impl: what a transport (tcp, mpi, nccl) gives the generic layer in
 * dist.c, and the socket helpers shared by the tcp transport and the
 * watchdog's heartbeat mesh. Private to src/parallel/. */
#ifndef LOOM_DIST_IMPL_H
#define LOOM_DIST_IMPL_H

#include <stddef.h>

#include "core/core.h"

/* Element types on the wire. DIST_BF16 and DIST_F16 are buffers of 16-bit
 * elements (tensor parallelism's activations; bf16-compressed gradients
 * after run_op's host conversion). DIST_F32_AS_BF16 is an fp32 buffer that
 * travels and sums as bf16: only the nccl transport takes it, converting
 * on the device around the reduction (the host transports get the bf16
 * copy run_op makes instead). */
typedef enum { DIST_F32 = 0, DIST_BF16, DIST_F64, DIST_F16, DIST_F32_AS_BF16 } dist_elem;

size_t dist_elem_size(dist_elem t);
/* dst[i] += src[i] in type t (bf16 adds in float and rounds to nearest
 * even; fp16 is not summed on the host: run_op widens it to fp32 first). */
void dist_elem_add(void *dst, const void *src, size_t n, dist_elem t);
/* buf[i] *= scale (nothing when scale == 1). */
void dist_elem_scale(void *buf, size_t n, dist_elem t, float scale);
uint16_t dist_f32_to_bf16(float f);
float dist_bf16_to_f32(uint16_t h);

struct dist_join;

/* A transport's blocking collectives, all in place and summing. They are
 * called from one thread at a time (the communication thread). */
typedef struct {
    /* buf = scale * sum. */
    loom_status (*allreduce)(void *impl, void *buf, size_t n, dist_elem t, float scale);
    /* counts[r] elements of rank r's segment; on return the own segment
     * holds scale * the sum. */
    loom_status (*reduce_scatter)(void *impl, void *buf, const size_t *counts, dist_elem t,
                                  float scale);
    loom_status (*allgather)(void *impl, void *buf, const size_t *counts, dist_elem t);
    loom_status (*broadcast)(void *impl, void *buf, size_t bytes, int root);
    /* Gather `bytes` from every rank into out (size * bytes), rank order; host memory. */
    loom_status (*allgather_bytes)(void *impl, const void *in, void *out, size_t bytes);
    /* Point to point: sbytes from sbuf to rank dst while rbytes arrive in
     * rbuf from rank src (either side skipped when its rank is < 0). */
    loom_status (*sendrecv)(void *impl, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src);
    /* Collective over this transport's ranks, like MPI_Comm_split: *out
     * becomes a transport of its own (own connections or communicator)
     * over the ranks with this color, ordered by key then rank. A group of
     * one is *out with size 1 and no impl. nccl has none (its groups are
     * made over their host group's transport): NULL. */
    loom_status (*split)(void *impl, int color, int key, struct dist_join *out);
    void (*free)(void *impl);
} dist_transport_t;

/* A transport's table from its functions PREFIX_allreduce,
 * PREFIX_reduce_scatter, PREFIX_allgather, PREFIX_broadcast,
 * PREFIX_allgather_bytes, PREFIX_sendrecv and PREFIX_free (split is set
 * apart, as not every transport has it): the slots are named here once,
 * and a transport that lacks a function does not compile. */
#define DIST_TRANSPORT_OPS(prefix, split_fn)                                                                \
    {.allreduce = prefix##_allreduce, .reduce_scatter = prefix##_reduce_scatter, .allgather = prefix##_allgather, \
     .broadcast = prefix##_broadcast, .allgather_bytes = prefix##_allgather_bytes, .sendrecv = prefix##_sendrecv,  \
     .split = split_fn,                                                                                     \
     .free = prefix##_free}

typedef struct dist_join {
    int rank, size, local_rank;
    const char *name; /* "tcp", "mpi", "nccl" */
    char addr[64];    /* this rank's address as its peers reach it ("" = find one) */
    void *impl;
    const dist_transport_t *ops;
} dist_join_t;

/* torchrun / --nproc / srun environment over TCP. */
loom_status dist_tcp_join(dist_join_t *j, int rank, int size, int local_rank, const char *addr,
                          int port, double timeout_s);
#ifdef LOOM_HAVE_MPI
loom_status dist_mpi_join(dist_join_t *j);
/* The ranks of a split: members[0..*n) are the ranks r of `all` (size
 * (color, key) pairs, rank order) with all[2r] == color, ordered by key
 * then r; returns the index of `rank` among them. */
int dist_split_members(const int *all, int size, int rank, int *members, int *n);

#endif
#ifdef LOOM_HAVE_CUDA
/* NCCL on device `device`; the unique id travels through `boot`. */
loom_status dist_nccl_join(dist_join_t *j, const dist_join_t *boot, int device, double timeout_s);
/* The ranks of a split: members[0..*n) are the ranks r of `all` (size
 * (color, key) pairs, rank order) with all[2r] == color, ordered by key
 * then r; returns the index of `rank` among them. */
int dist_split_members(const int *all, int size, int rank, int *members, int *n);

#endif

/* --- sockets --- */
/* Listen on addr:port (port 0 = any); returns fd, and the port in *port. */
int dist_listen(const char *addr, int *port);
/* Connect to host:port, retrying until `deadline` (loom_now seconds); -1 on failure. */
int dist_connect(const char *host, int port, double deadline);
/* accept() with a deadline; -1 on timeout. */
int dist_accept(int lfd, double deadline);
/* Whole-buffer blocking send / receive; 0 ok, -1 error or peer closed. */
int dist_send_all(int fd, const void *buf, size_t n);
int dist_recv_all(int fd, void *buf, size_t n);
/* Send sn bytes on sfd while receiving rn bytes on rfd (no deadlock for
 * large messages); returns 0, or -1 with *bad set to the fd that failed. */
int dist_sendrecv(int sfd, const void *sbuf, size_t sn, int rfd, void *rbuf, size_t rn, int *bad);
/* This host's address for peers to reach: LOOM_DIST_IFADDR, else the first
 * non-loopback IPv4 address, else 127.0.0.1. */
void dist_host_addr(char *out, size_t cap);

/* A full mesh: fds[r] is a connected socket to rank r (-1 for self).
 * Each rank listens on addr, the listen addresses are exchanged through
 * `xchg` (an allgather of bytes), lower ranks accept from higher ones. */
typedef loom_status (*dist_xchg_fn)(void *ctx, const void *in, void *out, size_t bytes);
loom_status dist_mesh_build(int rank, int size, const char *addr, dist_xchg_fn xchg, void *ctx,
                            double timeout_s, int *fds);

/* The ranks of a split: members[0..*n) are the ranks r of `all` (size
 * (color, key) pairs, rank order) with all[2r] == color, ordered by key
 * then r; returns the index of `rank` among them. */
int dist_split_members(const int *all, int size, int rank, int *members, int *n);

#endif
