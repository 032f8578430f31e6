/* serve_metrics: request, step and configuration series of `loom serve`
 * (see serve_metrics.h). */
#include "serve/serve_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/http_api.h"

/* Token counts: 1 .. 1M in steps of about 2x, vLLM's 1-2-5 buckets. */
static const double token_bounds[] = {1,    2,    5,    10,    20,    50,    100,    200,    500,    1000,
                                      2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000};
#define NT (int)(sizeof token_bounds / sizeof token_bounds[0])

void loom_serve_metrics_declare(loom_serve_metrics_t *sm, loom_metrics_t *r, const char *n, loom_engine_t *e,
                                const char *device) {
    memset(sm, 0, sizeof *sm);
    sm->prompt_hist = loom_metrics_histogram(r, "loom_serve_request_prompt_tokens", "Prompt tokens of each finished request.",
                                             token_bounds, NT, "model", n, NULL);
    sm->gen_hist = loom_metrics_histogram(r, "loom_serve_request_generation_tokens",
                                          "Generated tokens of each finished request (all its samples).", token_bounds, NT,
                                          "model", n, NULL);
    sm->step_tokens = loom_metrics_histogram(r, "loom_serve_iteration_tokens", "Tokens (prefill and decode) computed per engine step.",
                                             token_bounds, NT, "model", n, NULL);
    for (int i = 1; i < LOOM_FINISH_COUNT; i++)
        sm->done[i] = loom_metrics_counter(r, "loom_serve_request_success_total",
                                           "Finished requests (a prompt with its n samples) by finish reason: length, stop, or "
                                           "abort (cancelled, disconnected, timed out).",
                                           "model", n, "finish_reason", loom_finish_name((loom_finish_reason)i), NULL);
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    char bs[16], nb[16];
    snprintf(bs, sizeof bs, "%d", st.block_size);
    snprintf(nb, sizeof nb, "%d", st.total_blocks);
    loom_gauge_set(loom_metrics_gauge(r, "loom_serve_cache_config_info", "KV cache configuration (value 1): tokens per block and blocks.",
                                      "model", n, "block_size", bs, "num_blocks", nb, NULL),
                   1);
    loom_gauge_set(loom_metrics_gauge(r, "loom_serve_kv_cache_total_blocks", "KV cache blocks in the pool.", "model", n, NULL),
                   st.total_blocks);
    loom_gauge_set(loom_metrics_gauge(r, "loom_serve_model_info", "The served model and the device it runs on (value 1).", "model",
                                      n, "device", device, NULL),
                   1);
    sm->last_step_tokens = st.prompt_tokens + st.generated_tokens;
}

void loom_serve_metrics_step(loom_serve_metrics_t *sm, loom_engine_t *e) {
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    long long now = st.prompt_tokens + st.generated_tokens;
    if (now > sm->last_step_tokens) loom_histogram_observe(sm->step_tokens, (double)(now - sm->last_step_tokens));
    sm->last_step_tokens = now;
}

void loom_serve_metrics_request(loom_serve_metrics_t *sm, int prompt_tokens, int generated_tokens, int finish) {
    loom_histogram_observe(sm->prompt_hist, prompt_tokens);
    loom_histogram_observe(sm->gen_hist, generated_tokens);
    if (finish > 0 && finish < LOOM_FINISH_COUNT) loom_counter_add(sm->done[finish], 1);
}

void loom_serve_http_error(loom_http_response_t *resp, int status, const char *message) {
    loom_api_error_t err;
    const char *code = status == 404 ? "not_found" : status == 405 ? "method_not_allowed" : status == 413 ? "request_too_large" : NULL;
    loom_api_fail(&err, status, "invalid_request_error", NULL, code, "%s", message);
    size_t n = strlen(err.message); /* the plain-text listing ends in a newline */
    while (n > 0 && err.message[n - 1] == '\n') err.message[--n] = 0;
    char *j = loom_api_error_json(&err);
    loom_http_reply(resp, status, "application/json", j, -1);
    free(j);
}
