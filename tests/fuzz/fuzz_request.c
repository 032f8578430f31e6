/* Fuzz target for the request parser of `loom serve`
 * (src/serve/http_api.c): any bytes as a /v1/completions and a
 * /v1/chat/completions body. Besides memory errors (ASan, UBSan), it
 * aborts when a request that parsed breaks a bound the engine relies on,
 * or when an error is not a well-formed OpenAI error. Linked into
 * fuzz_readers as its "request" target (the mutation driver: make test,
 * bench/fuzz-readers.sh; libFuzzer: bench/fuzz-libfuzzer.sh); built alone
 * with -DLOOM_FUZZ_REQUEST_ALONE against the parser's few sources by
 * bench/fuzz-serve.sh. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/http_api.h"

void loom_fuzz_request(const uint8_t *data, size_t size);

#ifdef LOOM_FUZZ_REQUEST_ALONE
/* The parser alone is linked (not the engine): the engine's defaults,
 * as src/serve/engine.c sets them. */
void loom_request_params_default(loom_request_params_t *p) {
    *p = (loom_request_params_t){.max_tokens = 16, .temperature = 0, .top_k = 0, .top_p = 1, .n = 1, .logprobs = -1};
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom_fuzz_request(data, size);
    return 0;
}
#endif

static void check_ok(const loom_api_request_t *r, loom_api_kind kind) {
    const loom_request_params_t *p = &r->p;
    if (p->max_tokens < 1 || p->max_tokens > LOOM_API_MAX_TOKENS || p->n < 1 || p->n > LOOM_API_MAX_N) abort();
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0 || p->logprobs > 20) abort();
    if (r->n_stop > LOOM_API_MAX_STOP) abort();
    if (kind == LOOM_API_COMPLETION) {
        if (r->n_prompts < 1 || r->n_prompts > LOOM_API_MAX_PROMPTS) abort();
        for (int i = 0; i < r->n_prompts; i++) {
            if (!r->text[i] && (!r->ids[i] || r->n_ids[i] < 1)) abort();
            if (r->text[i] && !loom_api_utf8_valid(r->text[i], strlen(r->text[i]))) abort();
            for (int k = 0; !r->text[i] && k < r->n_ids[i]; k++)
                if (r->ids[i][k] < 0) abort();
        }
    } else {
        if (r->n_msgs < 1) abort();
        char *t = loom_api_render_chat(r->msgs, r->n_msgs, NULL);
        free(t);
    }
}

static void check_err(const loom_api_error_t *e) {
    if (e->status != 400 && e->status != 413) abort();
    char *j = loom_api_error_json(e);
    cJSON *o = cJSON_Parse(j);
    if (!o || !cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message"))) abort();
    cJSON_Delete(o);
    free(j);
}

void loom_fuzz_request(const uint8_t *data, size_t size) {
    char *body = malloc(size + 1);
    memcpy(body, data, size);
    body[size] = 0;
    for (int kind = 0; kind < 2; kind++) {
        loom_api_request_t r;
        loom_api_error_t e;
        if (loom_api_parse(body, size, (loom_api_kind)kind, &r, &e) == LOOM_OK) {
            check_ok(&r, (loom_api_kind)kind);
            loom_api_request_free(&r);
        } else {
            check_err(&e);
        }
    }
    free(body);
}
