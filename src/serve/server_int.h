/* server_int: what server.c and serve_req.c share (not a public API). */
#ifndef LOOM_SERVER_INT_H
#define LOOM_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "obs/dashboard.h"
#include "obs/http.h"
#include "obs/metrics.h"
#include "obs/sbuf.h"
#include "serve/http_api.h"
#include "serve/server.h"

#define SRV_MAX_MODELS 8

enum { SRV_LOADING, SRV_READY, SRV_DRAINING, SRV_CANCELLING };

typedef struct {
    char *name;
    loom_gpt_t *m;
    const loom_tokenizer_t *tok;
    loom_engine_t *e;
    char *chat_template;
    int eot; /* the tokenizer's end-of-text id (a stop id), -1 if none */
    loom_metric_t *running, *waiting, *kv_usage, *kv_used, *prompt_tokens, *gen_tokens, *preemptions, *rejected;
    loom_metric_t *finished[LOOM_FINISH_COUNT], *ttft, *itl, *e2e, *queue;
    long long last_prompt, last_gen, last_preempt;
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
    pthread_cond_t cv;
    pthread_t stepper;
    int stepping, stop, kicked;
    time_t started;
};

/* Wake the stepping thread (a request was submitted). */
void loom_srv_kick(loom_server_t *s);
/* Answer with an error in the OpenAI shape. */
void loom_srv_reply_error(loom_http_response_t *resp, const loom_api_error_t *err);
/* The checks every /v1 request passes first: state (503) and API key
 * (401). LOOM_OK to go on; else resp holds the error. */
loom_status loom_srv_admit(loom_server_t *s, const loom_http_request_t *req, loom_http_response_t *resp,
                           loom_api_error_t *err);
void loom_srv_on_completions(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx);
void loom_srv_on_chat(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx);

#endif
