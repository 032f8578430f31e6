/* http: libmicrohttpd behind a route table (see http.h). */
#define _GNU_SOURCE
#include "obs/http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "obs/sbuf.h"

#define MAX_ROUTES 32
#define MAX_BODY (16u << 20)

struct loom_http {
    struct MHD_Daemon *d;
    int port;
    loom_http_route_t routes[MAX_ROUTES];
    int nroutes;
    loom_metrics_t *reg;
    char counter[96];
    void (*error_body)(loom_http_response_t *resp, int status, const char *message);
    char cors_origin[256]; /* "" = no CORS headers */
};

/* Codes counted from the start, so that rate() and alerts see them at 0
 * before the first one; others are declared when they first happen. */
static const int counted_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 504};

static void count_response(loom_http_t *h, int status) {
    if (!h->reg) return;
    char code[16];
    snprintf(code, sizeof code, "%d", status ? status : 200);
    loom_counter_add(loom_metrics_counter(h->reg, h->counter, "HTTP responses sent, by status code.", "code", code, NULL), 1);
}

/* An error raised by the server itself, in the caller's shape when given. */
static void reply_error(loom_http_t *h, loom_http_response_t *resp, int status, const char *message) {
    if (h->error_body) h->error_body(resp, status, message);
    else loom_http_reply(resp, status, NULL, message, -1);
}

/* Per-request state while a body arrives. */
typedef struct {
    loom_sbuf_t body;
    int too_big;
} upload_t;

/* Bind and listen ourselves, so that failures carry errno's reason and
 * port 0 can be read back with getsockname. Returns the socket or -1. */
static int listen_on(const char *host, int port, int *bound_port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        loom_error(LOOM_EINVAL, "cannot listen on %s:%d: %s; give an address of this machine such as 127.0.0.1 or 0.0.0.0", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        loom_error(LOOM_EIO, "cannot listen on %s:%d: %s%s", host, port, strerror(err),
                   err == EADDRINUSE ? "; another program has this port: pick another one (0 = any free port)" : "");
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

void loom_http_reply(loom_http_response_t *resp, int status, const char *content_type, const char *text, long len) {
    size_t n = len < 0 ? strlen(text) : (size_t)len;
    free(resp->body);
    resp->body = loom_malloc(n + 1);
    memcpy(resp->body, text, n);
    resp->body[n] = 0;
    resp->body_len = n;
    resp->status = status;
    resp->content_type = content_type;
}

const char *loom_http_query(const loom_http_request_t *req, const char *key) {
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *loom_http_header(const loom_http_request_t *req, const char *name) {
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

static int path_matches(const char *pattern, const char *path) {
    size_t n = strlen(pattern);
    if (n > 0 && pattern[n - 1] == '*') return !strncmp(pattern, path, n - 1);
    return !strcmp(pattern, path);
}

/* The handler's answer, or 404/405 when no route takes the request. */
static void dispatch(loom_http_t *h, const loom_http_request_t *req, loom_http_response_t *resp) {
    const char *method = !strcmp(req->method, "HEAD") ? "GET" : req->method;
    int path_known = 0;
    for (int i = 0; i < h->nroutes; i++) {
        const loom_http_route_t *r = &h->routes[i];
        if (!path_matches(r->path, req->path)) continue;
        path_known = 1;
        if (r->method && strcmp(r->method, method)) continue;
        r->fn(req, resp, r->ctx);
        return;
    }
    loom_sbuf_t b = {0};
    if (path_known) {
        loom_sbuf_printf(&b, "%s %s: method not allowed here\n", req->method, req->path);
    } else {
        loom_sbuf_printf(&b, "%s: not found; this server has:\n", req->path);
        for (int i = 0; i < h->nroutes; i++)
            loom_sbuf_printf(&b, "  %s %s\n", h->routes[i].method ? h->routes[i].method : "*", h->routes[i].path);
    }
    reply_error(h, resp, path_known ? 405 : 404, b.data);
    free(b.data);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    loom_http_response_t *r = cls;
    long n = r->stream(r->sctx, buf, max);
    return n < 0 ? MHD_CONTENT_READER_END_OF_STREAM : (ssize_t)n;
}

static void stream_done(void *cls) {
    loom_http_response_t *r = cls;
    if (r->stream_free) r->stream_free(r->sctx);
    free(r);
}

static enum MHD_Result send_response(loom_http_t *h, struct MHD_Connection *conn, loom_http_response_t *resp) {
    struct MHD_Response *mr;
    count_response(h, resp->status);
    if (resp->stream) {
        loom_http_response_t *keep = loom_malloc(sizeof *keep);
        *keep = *resp;
        mr = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, keep, stream_done);
        free(resp->body);
    } else {
        mr = MHD_create_response_from_buffer(resp->body_len, resp->body ? resp->body : "", resp->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    }
    if (!mr) return MHD_NO;
    MHD_add_response_header(mr, "Content-Type", resp->content_type ? resp->content_type : "text/plain; charset=utf-8");
    if (h->cors_origin[0]) {
        MHD_add_response_header(mr, "Access-Control-Allow-Origin", h->cors_origin);
        MHD_add_response_header(mr, "Vary", "Origin");
    }
    for (int i = 0; i < LOOM_HTTP_MAX_HEADERS && resp->headers[i][0]; i++)
        MHD_add_response_header(mr, resp->headers[i][0], resp->headers[i][1]);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)(resp->status ? resp->status : 200), mr);
    MHD_destroy_response(mr);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    loom_http_t *h = cls;
    upload_t *up = *con_cls;
    if (!up) { /* first call: headers only */
        *con_cls = up = loom_calloc(1, sizeof *up);
        loom_sbuf_puts(&up->body, "");
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (up->body.len + *upload_size > MAX_BODY) up->too_big = 1;
        else loom_sbuf_put(&up->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    loom_http_response_t resp = {0};
    if (h->cors_origin[0] && !strcmp(method, "OPTIONS")) { /* a browser's preflight: say what it may send */
        resp.status = 204;
        resp.headers[0][0] = "Access-Control-Allow-Methods", resp.headers[0][1] = "GET, POST, OPTIONS";
        resp.headers[1][0] = "Access-Control-Allow-Headers", resp.headers[1][1] = "Authorization, Content-Type";
        resp.headers[2][0] = "Access-Control-Max-Age", resp.headers[2][1] = "600";
    } else if (up->too_big) {
        reply_error(h, &resp, 413, "request body above 16 MiB: send less");
    } else {
        loom_http_request_t req = {method, url, up->body.data, up->body.len, conn};
        dispatch(h, &req, &resp);
    }
    return send_response(h, conn, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    upload_t *up = *con_cls;
    if (!up) return;
    free(up->body.data);
    free(up);
    *con_cls = NULL;
}

loom_status loom_http_start(loom_http_t **out, const char *host, int port, const loom_http_route_t *routes, int n) {
    loom_http_opts_t o = {.host = host, .port = port, .routes = routes, .n = n};
    return loom_http_start_opts(out, &o);
}

loom_status loom_http_start_opts(loom_http_t **out, const loom_http_opts_t *o) {
    const char *host = o->host;
    int port = o->port, n = o->n;
    *out = NULL;
    if (n > MAX_ROUTES) return loom_error(LOOM_EINTERNAL, "http: %d routes, at most %d", n, MAX_ROUTES);
    if (port < 0 || port > 65535) return loom_error(LOOM_EINVAL, "port %d: use 1..65535, or 0 for any free port", port);
    loom_http_t *h = loom_calloc(1, sizeof *h);
    memcpy(h->routes, o->routes, (size_t)n * sizeof *o->routes);
    h->nroutes = n;
    h->error_body = o->error_body;
    if (o->cors_origin && strlen(o->cors_origin) >= sizeof h->cors_origin) {
        free(h);
        return loom_error(LOOM_EINVAL, "--cors-origin: %zu bytes, at most %zu", strlen(o->cors_origin), sizeof h->cors_origin - 1);
    }
    snprintf(h->cors_origin, sizeof h->cors_origin, "%s", o->cors_origin ? o->cors_origin : "");
    if (o->reg && o->counter) {
        h->reg = o->reg;
        snprintf(h->counter, sizeof h->counter, "%s", o->counter);
        for (size_t i = 0; i < sizeof counted_codes / sizeof counted_codes[0]; i++) {
            char code[16];
            snprintf(code, sizeof code, "%d", counted_codes[i]);
            loom_metrics_counter(h->reg, h->counter, "HTTP responses sent, by status code.", "code", code, NULL);
        }
    }
    int fd = listen_on(host && *host ? host : "127.0.0.1", port, &h->port);
    if (fd < 0) {
        free(h);
        return LOOM_EIO;
    }
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                            MHD_OPTION_END);
    if (!h->d) {
        close(fd);
        free(h);
        return loom_error(LOOM_EIO, "libmicrohttpd could not start a server on %s:%d", host, port);
    }
    *out = h;
    return LOOM_OK;
}

int loom_http_port(const loom_http_t *h) { return h ? h->port : 0; }

void loom_http_stop(loom_http_t *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
