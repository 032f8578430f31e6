/* server_int: what server.c and serve_req.c share (not a public API). */
#ifndef LOOM_SERVER_INT_H
#define LOOM_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "data/chat_template.h"
#include "obs/dashboard.h"
#include "obs/http.h"
#include "obs/metrics.h"
#include "obs/sbuf.h"
#include "obs/telemetry.h"
#include "serve/http_api.h"
#include "serve/serve_metrics.h"
#include "serve/server.h"
#include "serve/tools.h"

#define SRV_MAX_MODELS 8

enum { SRV_LOADING, SRV_READY, SRV_DRAINING, SRV_CANCELLING };

typedef struct {
    char *name;
    loom_gpt_t *m;
    const loom_tokenizer_t *tok;
    loom_engine_t *e;
    char *chat_template;      /* the fixed {role}/{content} form, or NULL */
    loom_chat_template_t *tmpl; /* the model's own (Jinja) chat template, or NULL (serve_chat.c) */
    loom_tools_style_t tools;   /* how its template renders tools and how the model writes calls (serve/tools.h) */
    int eot; /* the tokenizer's end-of-text id (a stop id), -1 if none */
    int stop_ids[4], n_stop;  /* where a sample ends: eot, and with a template its end-of-turn token and EOS */
    loom_metric_t *running, *waiting, *kv_usage, *kv_used, *prompt_tokens, *gen_tokens, *preemptions, *rejected;
    loom_metric_t *ttft, *itl, *e2e, *queue;
    loom_serve_metrics_t more; /* per-request, per-step and configuration series (serve_metrics.h) */
    loom_metric_t *prefix_hits, *prefix_queries, *spec_drafted, *spec_accepted;
    long long last_prompt, last_gen, last_preempt, last_hits, last_queries, last_drafted, last_accepted;
    char lbl[5][96];
} srv_model_t;

typedef struct {
    struct loom_server *s;
    int i;
} srv_proxy_t;

struct loom_server {
    loom_server_config_t cfg;
    char *api_key;
    loom_http_t *http;
    loom_metrics_t *reg;
    loom_dashboard_t *dash;
    loom_http_route_t dash_routes[4];
    srv_proxy_t proxy[4];
    volatile int dash_routes_ready;
    srv_model_t models[SRV_MAX_MODELS];
    int n_models;
    atomic_int state, active, pending;
    atomic_ullong next_id;
    pthread_mutex_t mu;
    loom_engine_loop_t *loop; /* steps every model's engine in turn (NULL until ready) */
    time_t started;
    loom_telemetry_t *tel; /* GPU telemetry (or CPU energy) and process_* series, from the first model's device */
};

/* Answer with an error in the OpenAI shape. */
void loom_srv_reply_error(loom_http_response_t *resp, const loom_api_error_t *err);
/* The checks every /v1 request passes first: state (503) and API key
 * (401). LOOM_OK to go on; else resp holds the error. */
loom_status loom_srv_admit(loom_server_t *s, const loom_http_request_t *req, loom_http_response_t *resp,
                           loom_api_error_t *err);
void loom_srv_on_completions(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx);
void loom_srv_on_chat(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx);

/* serve_chat.c: set a model's chat template (Jinja, or the fixed form) and
 * stop ids; render a request's messages with it; free it. */
loom_status loom_srv_chat_setup(srv_model_t *sm, const char *name, const char *tmpl);
loom_status loom_srv_chat_render(const srv_model_t *sm, const loom_api_request_t *a, char **out);
void loom_srv_chat_free(srv_model_t *sm);

#endif
