/* dist_tcp: the torchrun-style transport. Rank 0 listens on
 * MASTER_ADDR:MASTER_PORT; the others connect there (retrying until the
 * timeout), and this star carries the rendezvous: every rank's address, then
 * a full mesh of sockets for the data. Collectives are rings over the mesh
 * (reduce-scatter then all-gather for all-reduce), in chunks so buffers of
 * any size stream through a fixed scratch. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/dist_impl.h"

#define TCP_MAGIC 0x6c6f6f6d44495354ULL /* "loomDIST" */
#define CHUNK (1u << 20)                /* bytes per ring transfer */

/* ---------------- sockets ---------------- */

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int dist_listen(const char *addr, int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (addr && *addr && inet_pton(AF_INET, addr, &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    return fd;
}

int dist_connect(const char *host, int port, double deadline) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        if (getaddrinfo(host, ps, &hints, &res) == 0) {
            for (struct addrinfo *a = res; a; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (fd < 0) continue;
                if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                    freeaddrinfo(res);
                    tune(fd);
                    return fd;
                }
                close(fd);
            }
            freeaddrinfo(res);
        }
        if (loom_now() > deadline) return -1;
        usleep(50 * 1000);
    }
}

int dist_accept(int lfd, double deadline) {
    for (;;) {
        double left = deadline - loom_now();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return -1;
        if (r > 0) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                tune(fd);
                return fd;
            }
        }
    }
}

/* All n bytes of p through fd: sent when events is POLLOUT (p is then only
 * read), else received; waits out EINTR/EAGAIN. 0, or -1 on error or EOF. */
static int move_all(int fd, char *p, size_t n, short events) {
    while (n) {
        ssize_t k = events == POLLOUT ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) {
            struct pollfd q = {.fd = fd, .events = events};
            poll(&q, 1, 100);
            continue;
        }
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int dist_send_all(int fd, const void *buf, size_t n) { return move_all(fd, (char *)buf, n, POLLOUT); }

int dist_recv_all(int fd, void *buf, size_t n) { return move_all(fd, buf, n, POLLIN); }

int dist_sendrecv(int sfd, const void *sbuf, size_t sn, int rfd, void *rbuf, size_t rn, int *bad) {
    const char *sp = sbuf;
    char *rp = rbuf;
    while (sn || rn) {
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1;
        if (sn) { si = np; p[np++] = (struct pollfd){.fd = sfd, .events = POLLOUT}; }
        if (rn) { ri = np; p[np++] = (struct pollfd){.fd = rfd, .events = POLLIN}; }
        if (poll(p, (nfds_t)np, 1000) < 0 && errno != EINTR) { *bad = sfd; return -1; }
        if (si >= 0 && (p[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(sfd, sp, sn, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN && errno != EINTR) { *bad = sfd; return -1; }
            if (w > 0) { sp += w; sn -= (size_t)w; }
        }
        if (ri >= 0 && (p[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t r = recv(rfd, rp, rn, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { *bad = rfd; return -1; }
            if (r > 0) { rp += r; rn -= (size_t)r; }
        }
    }
    return 0;
}

void dist_host_addr(char *out, size_t cap) {
    const char *e = getenv("LOOM_DIST_IFADDR");
    if (e && *e) { snprintf(out, cap, "%s", e); return; }
    snprintf(out, cap, "127.0.0.1");
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)cap);
        break;
    }
    freeifaddrs(ifs);
}

typedef struct {
    char addr[64];
    int port;
} endpoint_t;

loom_status dist_mesh_build(int rank, int size, const char *addr, dist_xchg_fn xchg, void *ctx,
                            double timeout_s, int *fds) {
    double deadline = loom_now() + timeout_s;
    for (int r = 0; r < size; r++) fds[r] = -1;
    int port = 0, lfd = dist_listen(NULL, &port);
    if (lfd < 0) return loom_error(LOOM_EIO, "rank %d: cannot open a listening socket: %s", rank, strerror(errno));
    endpoint_t me = {.port = port}, *all = loom_calloc((size_t)size, sizeof *all);
    snprintf(me.addr, sizeof me.addr, "%s", addr);
    loom_status s = xchg(ctx, &me, all, sizeof me);
    for (int r = 0; s == LOOM_OK && r < rank; r++) {
        fds[r] = dist_connect(all[r].addr, all[r].port, deadline);
        if (fds[r] < 0 || dist_send_all(fds[r], &rank, sizeof rank) != 0)
            s = loom_error(LOOM_EIO, "rank %d: cannot connect to rank %d at %s:%d: %s", rank, r, all[r].addr, all[r].port, strerror(errno));
    }
    for (int n = rank + 1; s == LOOM_OK && n < size; n++) {
        int fd = dist_accept(lfd, deadline), who = -1;
        if (fd < 0 || dist_recv_all(fd, &who, sizeof who) != 0 || who <= rank || who >= size || fds[who] >= 0) {
            if (fd >= 0) close(fd);
            s = loom_error(LOOM_EIO, "rank %d: ranks above it did not all connect within %.0f s", rank, timeout_s);
            break;
        }
        fds[who] = fd;
    }
    close(lfd);
    free(all);
    if (s != LOOM_OK)
        for (int r = 0; r < size; r++)
            if (fds[r] >= 0) { close(fds[r]); fds[r] = -1; }
    return s;
}

/* ---------------- the transport ---------------- */

typedef struct {
    int rank, size;
    int *star; /* rank 0: star[r] to rank r; others: star[0] to rank 0 */
    int *mesh;
    int star_is_mesh; /* a split group's star is its own mesh's sockets */
    char *scratch; /* CHUNK bytes */
    char addr[64]; /* this rank's address as peers reach it (a split's mesh listens there) */
    double timeout_s;
} tcp_t;

static loom_status peer_failed(tcp_t *t, int fd, const char *what) {
    for (int r = 0; r < t->size; r++)
        if (t->mesh[r] == fd || t->star[r] == fd)
            return loom_error(LOOM_EIO, "rank %d: %s: the connection to rank %d failed (rank %d exited or was killed?)", t->rank, what, r, r);
    return loom_error(LOOM_EIO, "rank %d: %s: a connection failed", t->rank, what);
}

/* The rendezvous star carries host bytes (rank 0 gathers, then sends all to all). */
static loom_status tcp_allgather_bytes(void *vt, const void *in, void *out, size_t bytes) {
    tcp_t *t = vt;
    char *o = out;
    memcpy(o + (size_t)t->rank * bytes, in, bytes);
    if (t->rank == 0) {
        for (int r = 1; r < t->size; r++)
            if (dist_recv_all(t->star[r], o + (size_t)r * bytes, bytes) != 0) return peer_failed(t, t->star[r], "rendezvous");
        for (int r = 1; r < t->size; r++)
            if (dist_send_all(t->star[r], o, bytes * (size_t)t->size) != 0) return peer_failed(t, t->star[r], "rendezvous");
    } else {
        if (dist_send_all(t->star[0], in, bytes) != 0 || dist_recv_all(t->star[0], o, bytes * (size_t)t->size) != 0)
            return peer_failed(t, t->star[0], "rendezvous");
    }
    return LOOM_OK;
}

/* One ring pass over segments: reduce (add into the received segment) or
 * copy. step s sends segment (rank - s - off) and receives (rank - s - off - 1). */
static loom_status ring(tcp_t *t, char *buf, const size_t *counts, dist_elem e, int reduce) {
    int n = t->size, next = t->mesh[(t->rank + 1) % n], prev = t->mesh[(t->rank + n - 1) % n];
    size_t es = dist_elem_size(e);
    size_t *off = loom_malloc((size_t)n * sizeof *off);
    off[0] = 0;
    for (int r = 1; r < n; r++) off[r] = off[r - 1] + counts[r - 1];
    int o = reduce ? 1 : 0;
    loom_status s = LOOM_OK;
    for (int st = 0; st < n - 1 && s == LOOM_OK; st++) {
        int si = ((t->rank - st - o) % n + n) % n, ri = ((t->rank - st - o - 1) % n + n) % n;
        size_t sb = counts[si] * es, rb = counts[ri] * es;
        char *sp = buf + off[si] * es, *rp = buf + off[ri] * es;
        size_t chunk = CHUNK / es * es;
        for (size_t c = 0; c < sb || c < rb; c += chunk) {
            size_t sn = c < sb ? (sb - c < chunk ? sb - c : chunk) : 0;
            size_t rn = c < rb ? (rb - c < chunk ? rb - c : chunk) : 0;
            char *dst = reduce ? t->scratch : rp + c;
            int bad;
            if (dist_sendrecv(next, sp + c, sn, prev, dst, rn, &bad) != 0) {
                s = peer_failed(t, bad, reduce ? "reduce-scatter" : "all-gather");
                break;
            }
            if (reduce) dist_elem_add(rp + c, t->scratch, rn / es, e);
        }
    }
    free(off);
    return s;
}

static loom_status tcp_reduce_scatter(void *vt, void *buf, const size_t *counts, dist_elem e,
                                      float scale) {
    tcp_t *t = vt;
    LOOM_TRY(ring(t, buf, counts, e, 1));
    size_t off = 0;
    for (int r = 0; r < t->rank; r++) off += counts[r];
    dist_elem_scale((char *)buf + off * dist_elem_size(e), counts[t->rank], e, scale);
    return LOOM_OK;
}

static loom_status tcp_allgather(void *vt, void *buf, const size_t *counts, dist_elem e) {
    return ring(vt, buf, counts, e, 0);
}

static loom_status tcp_allreduce(void *vt, void *buf, size_t n, dist_elem e, float scale) {
    tcp_t *t = vt;
    size_t *counts = loom_malloc((size_t)t->size * sizeof *counts);
    for (int r = 0; r < t->size; r++) counts[r] = n / (size_t)t->size + ((size_t)r < n % (size_t)t->size);
    /* Scaling the own segment between the passes keeps every rank's result identical. */
    loom_status s = ring(t, buf, counts, e, 1);
    size_t off = 0;
    for (int r = 0; r < t->rank; r++) off += counts[r];
    dist_elem_scale((char *)buf + off * dist_elem_size(e), counts[t->rank], e, scale);
    if (s == LOOM_OK) s = ring(t, buf, counts, e, 0);
    free(counts);
    return s;
}

static loom_status tcp_broadcast(void *vt, void *buf, size_t bytes, int root) {
    tcp_t *t = vt;
    if (t->rank == root) {
        for (int r = 0; r < t->size; r++)
            if (r != root && dist_send_all(t->mesh[r], buf, bytes) != 0) return peer_failed(t, t->mesh[r], "broadcast");
    } else if (dist_recv_all(t->mesh[root], buf, bytes) != 0) {
        return peer_failed(t, t->mesh[root], "broadcast");
    }
    return LOOM_OK;
}

/* Both sides through one poll loop on the mesh sockets. */
static loom_status tcp_sendrecv(void *vt, const void *sbuf, size_t sn, int dst, void *rbuf, size_t rn, int src) {
    tcp_t *t = vt;
    int bad, sfd = dst >= 0 ? t->mesh[dst] : -1, rfd = src >= 0 ? t->mesh[src] : -1;
    if (dist_sendrecv(sfd, sbuf, dst >= 0 ? sn : 0, rfd, rbuf, src >= 0 ? rn : 0, &bad) != 0)
        return peer_failed(t, bad, "send/receive");
    return LOOM_OK;
}

static void tcp_free(void *vt) {
    tcp_t *t = vt;
    for (int r = 0; r < t->size; r++) {
        if (t->mesh[r] >= 0) close(t->mesh[r]);
        if (t->star[r] >= 0 && !t->star_is_mesh) close(t->star[r]);
    }
    free(t->mesh);
    free(t->star);
    free(t->scratch);
    free(t);
}

static loom_status tcp_split(void *vt, int color, int key, dist_join_t *out);
static const dist_transport_t tcp_ops = DIST_TRANSPORT_OPS(tcp, tcp_split);

/* A split group's rendezvous: the parent's all-gather, keeping the members' entries. */
typedef struct {
    tcp_t *parent;
    const int *members;
    int n;
} sub_xchg_t;

static loom_status sub_xchg(void *ctx, const void *in, void *out, size_t bytes) {
    sub_xchg_t *x = ctx;
    char *all = loom_malloc(bytes * (size_t)x->parent->size);
    loom_status s = tcp_allgather_bytes(x->parent, in, all, bytes);
    for (int i = 0; s == LOOM_OK && i < x->n; i++) memcpy((char *)out + (size_t)i * bytes, all + (size_t)x->members[i] * bytes, bytes);
    free(all);
    return s;
}

/* A group gets a mesh of its own, not the parent's sockets: each group's
 * ops run on their own communication thread (dist.c), and two threads on
 * one socket would interleave their bytes. Every parent rank builds one
 * (a group of one too), so the rendezvous all-gathers line up. */
static loom_status tcp_split(void *vt, int color, int key, dist_join_t *out) {
    tcp_t *p = vt;
    int me[2] = {color, key}, *all = loom_malloc(2 * (size_t)p->size * sizeof(int));
    int *members = loom_malloc((size_t)p->size * sizeof(int)), n = 0;
    loom_status s = tcp_allgather_bytes(p, me, all, sizeof me);
    int sub = s == LOOM_OK ? dist_split_members(all, p->size, p->rank, members, &n) : 0;
    tcp_t *t = loom_calloc(1, sizeof *t);
    *t = (tcp_t){.rank = sub, .size = n, .star_is_mesh = 1, .timeout_s = p->timeout_s};
    snprintf(t->addr, sizeof t->addr, "%s", p->addr);
    t->mesh = loom_malloc((size_t)(n ? n : 1) * sizeof(int));
    t->star = loom_malloc((size_t)(n ? n : 1) * sizeof(int));
    t->scratch = loom_malloc(CHUNK);
    sub_xchg_t x = {p, members, n};
    if (s == LOOM_OK) s = dist_mesh_build(sub, n, t->addr, sub_xchg, &x, t->timeout_s, t->mesh);
    free(all);
    free(members);
    if (s != LOOM_OK || n == 1) {
        if (s != LOOM_OK) t->size = 0; /* dist_mesh_build closed what it opened */
        tcp_free(t);
        *out = (dist_join_t){.rank = 0, .size = 1, .name = "tcp"};
        return s;
    }
    for (int r = 0; r < n; r++) t->star[r] = sub == 0 || r == 0 ? t->mesh[r] : -1;
    *out = (dist_join_t){.rank = sub, .size = n, .impl = t, .ops = &tcp_ops, .name = "tcp"};
    snprintf(out->addr, sizeof out->addr, "%s", t->addr);
    return LOOM_OK;
}

typedef struct {
    uint64_t magic;
    int rank, size;
} hello_t;

loom_status dist_tcp_join(dist_join_t *j, int rank, int size, int local_rank, const char *addr,
                          int port, double timeout_s) {
    tcp_t *t = loom_calloc(1, sizeof *t);
    t->rank = rank;
    t->size = size;
    t->star = loom_malloc((size_t)size * sizeof(int));
    t->mesh = loom_malloc((size_t)size * sizeof(int));
    for (int r = 0; r < size; r++) t->star[r] = t->mesh[r] = -1;
    t->scratch = loom_malloc(CHUNK);
    double deadline = loom_now() + timeout_s;
    loom_status s = LOOM_OK;
    char me[64] = "127.0.0.1";
    if (rank == 0) {
        int p = port, lfd = dist_listen(NULL, &p);
        if (lfd < 0) {
            s = loom_error(LOOM_EIO, "rank 0: cannot listen on port %d (MASTER_PORT): %s; is another job using it?", port, strerror(errno));
            goto out;
        }
        for (int n = 1; n < size && s == LOOM_OK; n++) {
            int fd = dist_accept(lfd, deadline);
            hello_t h;
            if (fd < 0) {
                s = loom_error(LOOM_EIO, "rank 0: only %d of %d ranks reached %s:%d within %.0f s; start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE", n, size, addr, port, timeout_s);
            } else if (dist_recv_all(fd, &h, sizeof h) != 0 || h.magic != TCP_MAGIC || h.size != size || h.rank <= 0 ||
                       h.rank >= size || t->star[h.rank] >= 0) {
                s = loom_error(LOOM_EINVAL, "rank 0: a peer sent a bad hello (WORLD_SIZE %d vs %d, rank %d, or a duplicate RANK)", h.size, size, h.rank);
                close(fd);
            } else {
                t->star[h.rank] = fd;
            }
        }
        close(lfd);
        if (s == LOOM_OK && size > 1) {
            struct sockaddr_in sa;
            socklen_t len = sizeof sa;
            if (getsockname(t->star[1], (struct sockaddr *)&sa, &len) == 0) inet_ntop(AF_INET, &sa.sin_addr, me, sizeof me);
        }
    } else {
        int fd = dist_connect(addr, port, deadline);
        if (fd < 0) {
            s = loom_error(LOOM_EIO, "rank %d: cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.0f s", rank, addr, port, timeout_s);
            goto out;
        }
        t->star[0] = fd;
        hello_t h = {TCP_MAGIC, rank, size};
        if (dist_send_all(fd, &h, sizeof h) != 0) { s = loom_error(LOOM_EIO, "rank %d: rendezvous: rank 0 closed the connection", rank); goto out; }
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0) inet_ntop(AF_INET, &sa.sin_addr, me, sizeof me);
    }
    if (s == LOOM_OK) s = dist_mesh_build(rank, size, me, tcp_allgather_bytes, t, timeout_s, t->mesh);
    snprintf(t->addr, sizeof t->addr, "%s", me);
    t->timeout_s = timeout_s;
out:
    if (s != LOOM_OK) {
        tcp_free(t);
        return s;
    }
    *j = (dist_join_t){.rank = rank, .size = size, .local_rank = local_rank, .impl = t, .ops = &tcp_ops, .name = "tcp"};
    snprintf(j->addr, sizeof j->addr, "%s", me);
    return LOOM_OK;
}

int loom_dist_free_port(int fallback) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = fallback;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}
