/* serve_metrics: the series `loom serve` exports beyond the engine gauges
 * and latency histograms that server.c declares: per-request token
 * histograms and request outcomes (counted per request, as vLLM does, not
 * per sample), tokens per engine step, the KV cache's configuration, the
 * model and device, GPU telemetry and process_* series, and HTTP responses
 * by status code. docs/observability.md lists every series. */
#ifndef LOOM_SERVE_METRICS_H
#define LOOM_SERVE_METRICS_H

#include "obs/http.h"
#include "obs/metrics.h"
#include "serve/engine.h"

/* The counter behind loom_http_opts_t.counter for the server. */
#define LOOM_SERVE_HTTP_COUNTER "loom_serve_http_responses_total"

typedef struct {
    loom_metric_t *prompt_hist, *gen_hist, *step_tokens, *done[LOOM_FINISH_COUNT];
    long long last_step_tokens; /* prompt + generated tokens at the last step */
} loom_serve_metrics_t;

/* Declare model `name`'s series in reg (labelled model=name) and set the
 * ones known once the engine exists: cache_config_info and model_info. */
void loom_serve_metrics_declare(loom_serve_metrics_t *sm, loom_metrics_t *reg, const char *name, loom_engine_t *e,
                                const char *device);
/* After an engine step: the tokens it computed (prefill and decode). */
void loom_serve_metrics_step(loom_serve_metrics_t *sm, loom_engine_t *e);
/* A request (one prompt and its n samples) finished: its prompt and
 * generated tokens, and its finish reason (1 length, 2 stop, 3 abort). */
void loom_serve_metrics_request(loom_serve_metrics_t *sm, int prompt_tokens, int generated_tokens, int finish);

/* loom_http_opts_t.error_body: the OpenAI error shape for the errors the
 * HTTP layer raises itself (404, 405, 413). */
void loom_serve_http_error(loom_http_response_t *resp, int status, const char *message);

#endif
