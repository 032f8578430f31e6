/* http: a small HTTP server over libmicrohttpd with a route table, shared
 * by the training metrics endpoint (/metrics and the dashboard) and the
 * inference server (/v1/... routes).
 *
 * One thread per connection: a handler may block (wait for a generation)
 * without stalling other clients. Handlers fill a response; the server
 * sends it and frees its body. A streaming response (server-sent events)
 * gives a callback that is called again and again for more bytes and may
 * block until it has some. */
#ifndef LOOM_HTTP_H
#define LOOM_HTTP_H

#include <stddef.h>

#include "core/core.h"
#include "obs/metrics.h"

typedef struct loom_http loom_http_t;

typedef struct {
    const char *method;  /* "GET", "POST", ... (HEAD is routed as GET) */
    const char *path;    /* the URL path, without the query string */
    const char *body;    /* request body, NUL-terminated ("" when none) */
    size_t body_len;
    void *conn;          /* for loom_http_query / loom_http_header */
} loom_http_request_t;

/* A stream callback writes up to `max` bytes into `buf` and returns how
 * many, blocking until it has at least one; -1 ends the response. */
typedef long (*loom_http_stream_fn)(void *sctx, char *buf, size_t max);

#define LOOM_HTTP_MAX_HEADERS 4

typedef struct {
    int status;               /* 200 unless set */
    const char *content_type; /* "text/plain; charset=utf-8" unless set (a static string) */
    char *body;               /* malloc'd; the server frees it (NULL = empty) */
    size_t body_len;
    loom_http_stream_fn stream; /* set instead of body for a streamed response */
    void (*stream_free)(void *sctx);
    void *sctx;
    const char *headers[LOOM_HTTP_MAX_HEADERS][2]; /* extra headers, static strings */
} loom_http_response_t;

typedef void (*loom_http_handler_fn)(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx);

typedef struct {
    const char *method; /* NULL = any method */
    const char *path;   /* exact path, or a prefix when it ends in a star, as in "/v1/" plus a star */
    loom_http_handler_fn fn;
    void *ctx;
} loom_http_route_t;

/* Listen on host:port (an IPv4/IPv6 address or a name; port 0 = any free
 * port, see loom_http_port) and serve the routes (copied; at most 32),
 * first match wins. An unknown path gets 404, a known path with another
 * method 405. Bodies above 16 MiB get 413. Fails with a message naming the
 * address and the reason (in use, not an address of this machine). */
loom_status loom_http_start(loom_http_t **out, const char *host, int port, const loom_http_route_t *routes, int n);
/* loom_http_start with more: responses counted by status code, and the
 * body of the errors the server raises before any handler runs. */
typedef struct {
    const char *host;
    int port;
    const loom_http_route_t *routes;
    int n;
    loom_metrics_t *reg; /* count every response in counter{code="..."} (NULL: no count) */
    const char *counter; /* the counter's name, e.g. "loom_serve_http_responses_total" */
    /* Fill resp for an error the server raises itself (404, 405, 413 above
     * 16 MiB) with this status and message; NULL = plain text. */
    void (*error_body)(loom_http_response_t *resp, int status, const char *message);
    /* Browsers' CORS: every response says Access-Control-Allow-Origin: this,
     * and OPTIONS (a preflight) gets 204 with the methods and headers
     * allowed. NULL = no CORS headers, OPTIONS is an unknown method. */
    const char *cors_origin;
} loom_http_opts_t;
loom_status loom_http_start_opts(loom_http_t **out, const loom_http_opts_t *o);

/* The port the server listens on (the chosen one when started with 0). */
int loom_http_port(const loom_http_t *h);
/* Stop listening, finish open connections, free. NULL is fine. */
void loom_http_stop(loom_http_t *h);

/* A query-string argument or request header of the request (NULL if absent). */
const char *loom_http_query(const loom_http_request_t *req, const char *key);
const char *loom_http_header(const loom_http_request_t *req, const char *name);

/* Fill resp with a copy of `text` (len < 0: strlen), a status and a
 * content type (a static string; NULL = text/plain). */
void loom_http_reply(loom_http_response_t *resp, int status, const char *content_type, const char *text, long len);

#endif
