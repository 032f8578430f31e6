/* server: the OpenAI-compatible HTTP server (see server.h). The request
 * path is in serve_req.c; this file holds the models, the step loop,
 * the metrics and the routes. */
#define _GNU_SOURCE
#include "serve/server_int.h"

#include "core/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const double latency_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                        0.75,  1.0,   2.5,  5.0,  7.5,  10,   20,   40,  80,  160};
#define NB (int)(sizeof latency_bounds / sizeof latency_bounds[0])

/* Declare one model's series, every one labelled model=NAME. */
static void declare_metrics(loom_server_t *s, srv_model_t *m) {
    loom_metrics_t *r = s->reg;
    const char *n = m->name;
    m->running = loom_metrics_gauge(r, "loom_serve_requests_running", "Sequences in the running batch.", "model", n, NULL);
    m->waiting = loom_metrics_gauge(r, "loom_serve_requests_waiting", "Sequences waiting for admission.", "model", n, NULL);
    m->kv_usage = loom_metrics_gauge(r, "loom_serve_kv_cache_usage_ratio", "Share of KV cache blocks in use (0..1).", "model", n, NULL);
    m->kv_used = loom_metrics_gauge(r, "loom_serve_kv_cache_used_blocks", "KV cache blocks in use.", "model", n, NULL);
    m->prompt_tokens = loom_metrics_counter(r, "loom_serve_prompt_tokens_total", "Prompt tokens prefilled (recomputes included).", "model", n, NULL);
    m->gen_tokens = loom_metrics_counter(r, "loom_serve_generation_tokens_total", "Tokens generated.", "model", n, NULL);
    m->preemptions = loom_metrics_counter(r, "loom_serve_preemptions_total", "Sequences preempted for KV blocks.", "model", n, NULL);
    m->prefix_queries = loom_metrics_counter(r, "loom_serve_prefix_cache_queries_total",
                                             "Prompt tokens looked up in the prefix cache (recomputes after preemption included).", "model", n, NULL);
    m->prefix_hits = loom_metrics_counter(r, "loom_serve_prefix_cache_hits_total",
                                          "Prompt tokens found in the prefix cache (their KV blocks reused, not computed).", "model", n, NULL);
    m->spec_drafted = loom_metrics_counter(r, "loom_serve_spec_decode_num_draft_tokens_total",
                                           "Tokens drafted for speculative decoding (--speculate).", "model", n, NULL);
    m->spec_accepted = loom_metrics_counter(r, "loom_serve_spec_decode_num_accepted_tokens_total",
                                            "Drafted tokens the model accepted.", "model", n, NULL);
    m->rejected = loom_metrics_counter(r, "loom_serve_requests_rejected_total", "Requests refused with 429 (waiting queue full).", "model", n, NULL);
    m->ttft = loom_metrics_histogram(r, "loom_serve_time_to_first_token_seconds", "Time from arrival to a sample's first token.",
                                     latency_bounds, NB, "model", n, NULL);
    m->itl = loom_metrics_histogram(r, "loom_serve_inter_token_latency_seconds", "Time between two tokens of a sample.",
                                    latency_bounds, NB, "model", n, NULL);
    m->e2e = loom_metrics_histogram(r, "loom_serve_e2e_request_latency_seconds", "Time from arrival to a request's last token.",
                                    latency_bounds, NB, "model", n, NULL);
    m->queue = loom_metrics_histogram(r, "loom_serve_request_queue_time_seconds",
                                      "Time from submission to the engine's first admission of the request.", latency_bounds, NB,
                                      "model", n, NULL);
    loom_serve_metrics_declare(&m->more, r, n, m->e, m->m->be->name);
}

/* Collect hook: engine stats into gauges, counter deltas into counters. */
static void collect(void *ctx) {
    loom_server_t *s = ctx;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_models; i++) {
        srv_model_t *m = &s->models[i];
        loom_engine_stats_t st;
        loom_engine_stats(m->e, &st);
        loom_gauge_set(m->running, st.running);
        loom_gauge_set(m->waiting, st.waiting);
        loom_gauge_set(m->kv_used, st.total_blocks - st.free_blocks);
        loom_gauge_set(m->kv_usage, st.total_blocks ? (double)(st.total_blocks - st.free_blocks) / st.total_blocks : 0);
        loom_counter_add(m->prompt_tokens, (double)(st.prompt_tokens - m->last_prompt));
        loom_counter_add(m->gen_tokens, (double)(st.generated_tokens - m->last_gen));
        loom_counter_add(m->preemptions, (double)(st.preemptions - m->last_preempt));
        loom_counter_add(m->prefix_queries, (double)(st.prefix_queries - m->last_queries));
        loom_counter_add(m->prefix_hits, (double)(st.prefix_hits - m->last_hits));
        m->last_prompt = st.prompt_tokens, m->last_gen = st.generated_tokens, m->last_preempt = st.preemptions;
        loom_counter_add(m->spec_drafted, (double)(st.spec_drafted - m->last_drafted));
        loom_counter_add(m->spec_accepted, (double)(st.spec_accepted - m->last_accepted));
        m->last_queries = st.prefix_queries, m->last_hits = st.prefix_hits;
        m->last_drafted = st.spec_drafted, m->last_accepted = st.spec_accepted;
    }
    pthread_mutex_unlock(&s->mu);
}

/* After each step of model i that had work, on the loop's thread. */
static void after_step(void *ctx, int i) {
    loom_server_t *s = ctx;
    loom_serve_metrics_step(&s->models[i].more, s->models[i].e);
}

void loom_srv_reply_error(loom_http_response_t *resp, const loom_api_error_t *err) {
    char *j = loom_api_error_json(err);
    resp->status = err->status;
    resp->content_type = "application/json";
    resp->body = j;
    resp->body_len = strlen(j);
}

static void on_health(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_server_t *s = ctx;
    int st = atomic_load(&s->state);
    const char *text = st == SRV_LOADING ? "{\"status\":\"loading\"}" : st == SRV_READY ? "{\"status\":\"ok\"}" : "{\"status\":\"shutting down\"}";
    loom_http_reply(resp, st == SRV_READY ? 200 : 503, "application/json", text, -1);
}

static void on_models(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_server_t *s = ctx;
    loom_api_error_t err;
    if (loom_srv_admit(s, req, resp, &err) != LOOM_OK) return;
    loom_sbuf_t b = {0};
    loom_sbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < s->n_models; i++)
        loom_sbuf_printf(&b, "%s{\"id\":\"%s\",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"loom\",\"max_model_len\":%d}",
                         i ? "," : "", s->models[i].name, (long)s->started, s->models[i].m->cfg.max_seq_len);
    loom_sbuf_puts(&b, "]}");
    loom_http_reply(resp, 200, "application/json", b.data, (long)b.len);
    free(b.data);
}

/* GET /v1/models/{id}: one model (404 model_not_found for another id). */
static void on_model(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_server_t *s = ctx;
    loom_api_error_t err;
    if (loom_srv_admit(s, req, resp, &err) != LOOM_OK) return;
    const char *id = req->path + strlen("/v1/models/");
    for (int i = 0; i < s->n_models; i++) {
        if (strcmp(s->models[i].name, id)) continue;
        loom_sbuf_t b = {0};
        loom_sbuf_printf(&b, "{\"id\":\"%s\",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"loom\",\"max_model_len\":%d}",
                         s->models[i].name, (long)s->started, s->models[i].m->cfg.max_seq_len);
        loom_http_reply(resp, 200, "application/json", b.data, (long)b.len);
        free(b.data);
        return;
    }
    loom_api_fail(&err, 404, "invalid_request_error", "model", "model_not_found", "model '%.64s' is not served here; GET /v1/models lists them", id);
    loom_srv_reply_error(resp, &err);
}

static void on_unknown_v1(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_api_error_t err;
    if (!strcmp(req->path, "/v1/completions") || !strcmp(req->path, "/v1/chat/completions") || !strcmp(req->path, "/v1/models")) {
        loom_api_fail(&err, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %s: method not allowed here (%s)",
                      req->method, req->path, strcmp(req->path, "/v1/models") ? "use POST" : "use GET");
        return loom_srv_reply_error(resp, &err);
    }
    loom_api_fail(&err, 404, "invalid_request_error", NULL, "not_found",
                  "%s %s: no such route; this server has POST /v1/completions, POST /v1/chat/completions, GET /v1/models",
                  req->method, req->path);
    loom_srv_reply_error(resp, &err);
}

/* GET /, /dashboard.json, ...: the dashboard's own handler once it runs. */
static void on_dash(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    srv_proxy_t *p = ctx;
    loom_server_t *s = p->s;
    if (!s->dash_routes_ready) {
        loom_http_reply(resp, 503, NULL, "the dashboard starts when the models are loaded\n", -1);
        return;
    }
    s->dash_routes[p->i].fn(req, resp, s->dash_routes[p->i].ctx);
}

loom_status loom_server_start(loom_server_t **out, const loom_server_config_t *c) {
    loom_server_t *s = loom_calloc(1, sizeof *s);
    s->cfg = *c;
    s->api_key = c->api_key ? loom_strdup(c->api_key) : NULL;
    s->reg = loom_metrics_new();
    s->started = time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    atomic_store(&s->state, SRV_LOADING);
    loom_metrics_on_collect(s->reg, collect, s);
    loom_http_route_t routes[16] = {
        {"GET", "/health", on_health, s},
        {"GET", "/v1/models", on_models, s},
        {"GET", "/v1/models/*", on_model, s},
        {"POST", "/v1/completions", loom_srv_on_completions, s},
        {"POST", "/v1/chat/completions", loom_srv_on_chat, s},
        {NULL, "/v1/*", on_unknown_v1, s},
        loom_dashboard_metrics_route(s->reg),
    };
    static const char *const dash_paths[4] = {"/", "/dashboard.json", "/dygraph.min.js", "/dygraph.css"};
    int n = 7;
    for (int i = 0; i < 4; i++) {
        s->proxy[i] = (srv_proxy_t){s, i};
        routes[n++] = (loom_http_route_t){"GET", dash_paths[i], on_dash, &s->proxy[i]};
    }
    *out = s;
    loom_http_opts_t ho = {.host = c->host, .port = c->port, .routes = routes, .n = n, .reg = s->reg,
                           .counter = LOOM_SERVE_HTTP_COUNTER, .error_body = loom_serve_http_error,
                           .cors_origin = c->cors_origin};
    return loom_http_start_opts(&s->http, &ho);
}

/* The "Errors" chart: rates of the error responses worth watching. */
static int error_lines(loom_server_t *s, loom_dashboard_line_t *lines) {
    static const char *const codes[4][2] = {{"400", "400 bad request"}, {"413", "413 too large"}, {"429", "429 queue full"},
                                            {"500", "500 server error"}};
    for (int i = 0; i < 4; i++)
        lines[i] = (loom_dashboard_line_t){"Errors (responses/s)", codes[i][1],
                                           loom_metrics_find(s->reg, LOOM_SERVE_HTTP_COUNTER, "code", codes[i][0], NULL),
                                           LOOM_LINE_RATE, 0, 0, NULL};
    return 4;
}

static void dashboard_lines(loom_server_t *s) {
    loom_dashboard_line_t lines[32];
    int n = 0;
    for (int i = 0; i < s->n_models && n + 10 <= 32 - 4; i++) {
        srv_model_t *m = &s->models[i];
        snprintf(m->lbl[0], sizeof m->lbl[0], "%s running", m->name);
        snprintf(m->lbl[1], sizeof m->lbl[1], "%s waiting", m->name);
        snprintf(m->lbl[2], sizeof m->lbl[2], "%s", m->name);
        snprintf(m->lbl[3], sizeof m->lbl[3], "%s p50", m->name);
        snprintf(m->lbl[4], sizeof m->lbl[4], "%s p99", m->name);
        lines[n++] = (loom_dashboard_line_t){"Requests", m->lbl[0], m->running, LOOM_LINE_VALUE, 0, 0, NULL};
        lines[n++] = (loom_dashboard_line_t){"Requests", m->lbl[1], m->waiting, LOOM_LINE_VALUE, 0, 0, NULL};
        lines[n++] = (loom_dashboard_line_t){"KV cache usage (%)", m->lbl[2], m->kv_usage, LOOM_LINE_VALUE, 0, 100, NULL};
        lines[n++] = (loom_dashboard_line_t){"Generated tokens/s", m->lbl[2], m->gen_tokens, LOOM_LINE_RATE, 0, 0, NULL};
        lines[n++] = (loom_dashboard_line_t){"Time to first token (ms)", m->lbl[3], m->ttft, LOOM_LINE_QUANTILE, 0.5, 1000, NULL};
        lines[n++] = (loom_dashboard_line_t){"Time to first token (ms)", m->lbl[4], m->ttft, LOOM_LINE_QUANTILE, 0.99, 1000, NULL};
        lines[n++] = (loom_dashboard_line_t){"Inter-token latency (ms)", m->lbl[3], m->itl, LOOM_LINE_QUANTILE, 0.5, 1000, NULL};
        lines[n++] = (loom_dashboard_line_t){"Inter-token latency (ms)", m->lbl[4], m->itl, LOOM_LINE_QUANTILE, 0.99, 1000, NULL};
        lines[n++] = (loom_dashboard_line_t){"End-to-end request latency (ms)", m->lbl[3], m->e2e, LOOM_LINE_QUANTILE, 0.5, 1000, NULL};
        lines[n++] = (loom_dashboard_line_t){"End-to-end request latency (ms)", m->lbl[4], m->e2e, LOOM_LINE_QUANTILE, 0.99, 1000, NULL};
    }
    n += error_lines(s, lines + n);
    char title[256];
    snprintf(title, sizeof title, "loom serve: %s%s on %s", s->models[0].name, s->n_models > 1 ? " and more" : "",
             s->models[0].m->be->name);
    if (loom_dashboard_start(&s->dash, title, s->reg, lines, n, 1.0) != LOOM_OK) {
        fprintf(stderr, "loom serve: no dashboard: %s\n", loom_errmsg());
        return;
    }
    for (int i = 0; i < s->n_models; i++) {
        char note[256];
        snprintf(note, sizeof note, "model %s on %s", s->models[i].name, s->models[i].m->be->name);
        loom_dashboard_note(s->dash, note);
    }
    loom_dashboard_note(s->dash, loom_telemetry_status(s->tel));
    loom_http_route_t r[4];
    loom_dashboard_routes(s->dash, r);
    s->dash_routes_ready = 1;
    memcpy(s->dash_routes, r, sizeof r);
}

loom_status loom_server_add_model(loom_server_t *s, const char *name, loom_gpt_t *m, const loom_tokenizer_t *tok,
                                  const loom_engine_config_t *ec, const char *chat_template) {
    if (s->n_models == SRV_MAX_MODELS) return loom_error(LOOM_EINVAL, "at most %d models in one server", SRV_MAX_MODELS);
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i].name, name)) return loom_error(LOOM_EINVAL, "model name '%s' given twice; give each --run its own NAME=", name);
    if (!tok) return loom_error(LOOM_EINVAL, "model %s has no tokenizer.json: the server needs one to read prompts", name);
    srv_model_t *sm = &s->models[s->n_models];
    memset(sm, 0, sizeof *sm);
    sm->tok = tok;
    sm->eot = loom_tokenizer_eot(tok);
    LOOM_TRY(loom_srv_chat_setup(sm, name, chat_template));
    loom_status st = loom_engine_create(&sm->e, m, tok, ec);
    if (st != LOOM_OK) loom_srv_chat_free(sm);
    LOOM_TRY(st);
    sm->name = loom_strdup(name);
    sm->m = m;
    declare_metrics(s, sm);
    if (!s->tel) {
        s->tel = loom_telemetry_open(s->reg, loom_backend_gpu_ordinal(m->be->name), -1);
        fprintf(stderr, "loom serve: %s\n", loom_telemetry_status(s->tel));
    }
    pthread_mutex_lock(&s->mu);
    s->n_models++;
    pthread_mutex_unlock(&s->mu);
    return LOOM_OK;
}

loom_status loom_server_ready(loom_server_t *s) {
    if (s->n_models == 0) return loom_error(LOOM_EINVAL, "no model to serve: give --run DIR or --run NAME=DIR");
    dashboard_lines(s);
    loom_engine_t *es[SRV_MAX_MODELS];
    for (int i = 0; i < s->n_models; i++) es[i] = s->models[i].e;
    LOOM_TRY(loom_engine_loop_start(&s->loop, es, s->n_models, after_step, s));
    int nt = loom_engine_loop_threads(s->loop);
    fprintf(stderr, "loom serve: the models run on one stepping thread with %d OpenMP thread%s\n", nt, nt == 1 ? "" : "s");
    atomic_store(&s->state, SRV_READY);
    return LOOM_OK;
}

int loom_server_port(const loom_server_t *s) { return loom_http_port(s->http); }

int loom_server_drain(loom_server_t *s, double grace_s) {
    atomic_store(&s->state, SRV_DRAINING);
    double t0 = loom_clock_now(); /* a test holds or moves the grace through LOOM_TEST_CLOCK */
    while (atomic_load(&s->active) > 0 && loom_clock_now() - t0 < grace_s) usleep(20000);
    int left = atomic_load(&s->active);
    if (left > 0) {
        atomic_store(&s->state, SRV_CANCELLING);
        double t1 = loom_now();
        while (atomic_load(&s->active) > 0 && loom_now() - t1 < 30) usleep(20000);
    }
    return left;
}

void loom_server_free(loom_server_t *s) {
    if (!s) return;
    if (atomic_load(&s->state) != SRV_CANCELLING) atomic_store(&s->state, SRV_CANCELLING);
    loom_http_stop(s->http);
    loom_dashboard_stop(s->dash);
    loom_engine_loop_stop(s->loop);
    loom_metrics_off_collect(s->reg, collect, s);
    loom_telemetry_close(s->tel);
    for (int i = 0; i < s->n_models; i++) {
        loom_engine_free(s->models[i].e);
        free(s->models[i].name);
        loom_srv_chat_free(&s->models[i]);
    }
    loom_metrics_free(s->reg);
    pthread_mutex_destroy(&s->mu);
    free(s->api_key);
    free(s);
}
