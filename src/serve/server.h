/* server: `loom serve`, the OpenAI-compatible HTTP server over the engine
 * (docs/serving.md, "HTTP API").
 *
 * One process serves one or more models, each with its own engine; one
 * step loop (loom_engine_loop_start) runs every engine's steps in turn on
 * one thread with --threads OpenMP threads (the CPU ops must not run on
 * two threads at once), libmicrohttpd runs a thread per connection.
 * A request is parsed (serve/http_api.h), tokenized, checked against the
 * waiting-queue cap (429), submitted, and answered as one JSON body or as
 * server-sent events. A client that hangs up mid-stream cancels its
 * sequences; every request has a deadline; loom_server_drain is the
 * SIGTERM path (503 to new requests, in-flight ones finish within a grace
 * period, then the rest are cancelled and answered). */
#ifndef LOOM_SERVER_H
#define LOOM_SERVER_H

#include "data/tokenizer.h"
#include "model/gpt.h"
#include "serve/engine.h"

typedef struct {
    const char *host;       /* NULL = 127.0.0.1 */
    int port;               /* 0 = any free port (loom_server_port) */
    int max_queue;          /* prompts waiting for their first token at most (429 above) */
    const char *api_key;    /* NULL = no key asked */
    double request_timeout; /* seconds from arrival to the last token (<= 0: none) */
    const char *cors_origin; /* Access-Control-Allow-Origin for browser clients (NULL = no CORS) */
} loom_server_config_t;

typedef struct loom_server loom_server_t;

/* Listen and answer /health (503 until loom_server_ready), /metrics, the
 * dashboard; /v1 routes answer 503 while loading. */
loom_status loom_server_start(loom_server_t **out, const loom_server_config_t *c);
/* Serve model `name` (m and tok stay the caller's; they must outlive the
 * server; tok may not be NULL) with an engine of config `ec`. chat_template
 * holds "{role}" and "{content}" (NULL = "{role}: {content}\n"; copied). */
loom_status loom_server_add_model(loom_server_t *s, const char *name, loom_gpt_t *m, const loom_tokenizer_t *tok,
                                  const loom_engine_config_t *ec, const char *chat_template);
/* Start stepping; /health answers 200 from now on. */
loom_status loom_server_ready(loom_server_t *s);
/* The port the server listens on. */
int loom_server_port(const loom_server_t *s);
/* Stop taking requests (503), wait up to grace_s for the ones in flight,
 * cancel what is left and wait until each has had its answer. Returns the
 * number of requests cancelled. */
int loom_server_drain(loom_server_t *s, double grace_s);
/* Stop listening and stepping, free. NULL is fine. */
void loom_server_free(loom_server_t *s);

#endif
