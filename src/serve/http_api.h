/* http_api: the OpenAI-compatible request parser and the error shape of
 * `loom serve` (docs/serving.md, "HTTP API"). Pure functions over bytes:
 * no engine, no sockets, so the fuzz target (tests/fuzz/) drives them
 * directly. */
#ifndef LOOM_HTTP_API_H
#define LOOM_HTTP_API_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "serve/engine.h"

typedef enum { LOOM_API_COMPLETION, LOOM_API_CHAT } loom_api_kind;

/* tool_choice (serve/tools.h): no call, the model's choice, some call, the named function's call. */
typedef enum { LOOM_TOOL_NONE, LOOM_TOOL_AUTO, LOOM_TOOL_REQUIRED, LOOM_TOOL_NAMED } loom_tool_choice;

/* Limits a request is checked against. */
#define LOOM_API_MAX_BODY (4u << 20)  /* bytes of a request body (413 above) */
#define LOOM_API_MAX_N 16             /* samples per prompt */
#define LOOM_API_MAX_PROMPTS 64       /* prompts in one completion request */
#define LOOM_API_MAX_TOKENS (1 << 20) /* max_tokens at most */
#define LOOM_API_MAX_STOP 4           /* stop strings */

/* One chat message: its role (system, developer, user, assistant, tool)
 * and its content as one string (text parts joined). */
typedef struct {
    char *role, *content;
} loom_api_message_t;

/* A parsed request. Prompts are either text (text[i] != NULL) or token ids. */
typedef struct {
    char *model;              /* NULL: the server's first model */
    int n_prompts;
    char **text;              /* (n_prompts) text prompts, or NULL entries */
    int **ids;                /* (n_prompts) token-id prompts, or NULL entries */
    int *n_ids;               /* (n_prompts) */
    loom_api_message_t *msgs; /* chat: the messages (n_msgs) */
    int n_msgs;
    loom_request_params_t p;  /* max_tokens, temperature, top_p, top_k, seed, n, logprobs */
    char *stop[LOOM_API_MAX_STOP];
    int n_stop;
    int stream, include_usage, echo;
    int max_tokens_set; /* max_tokens (or max_completion_tokens) was given: the prompt plus it must fit the context */
    int ignore_eos;    /* "ignore_eos": true (vLLM's and llama.cpp's extension): do not stop at end-of-text */
    int json_mode;     /* response_format: 0 text, 1 json_object, 2 json_schema */
    char *json_schema; /* json_schema's schema as JSON text (NULL: any object) */
    cJSON *messages;   /* chat: the messages as the template sees them (serve/tools.h, loom_tools_message) */
    cJSON *tools;      /* the request's tools (checked), NULL: none */
    loom_tool_choice tool_choice;
    char tool_name[72]; /* LOOM_TOOL_NAMED: the function */
    int parallel_tool_calls;
} loom_api_request_t;

/* An error in the OpenAI shape: {"error": {"message", "type", "param", "code"}}. */
typedef struct {
    int status;        /* HTTP status */
    char message[384];
    const char *type;  /* "invalid_request_error", ... */
    char param[48];    /* the field at fault, "" = null */
    const char *code;  /* NULL = null */
} loom_api_error_t;

/* Parse and check a request body of `kind`. On failure fills *err (status
 * 400 naming the field, or 413) and returns LOOM_EINVAL; *r is then empty.
 * Unknown fields are ignored (as vLLM does); known fields this server does
 * not implement are refused when set to anything but their neutral value. */
loom_status loom_api_parse(const char *body, size_t len, loom_api_kind kind, loom_api_request_t *r,
                           loom_api_error_t *err);
/* Free what loom_api_parse allocated. */
void loom_api_request_free(loom_api_request_t *r);

/* Fill *err (printf-style message); returns LOOM_EINVAL. */
loom_status loom_api_fail(loom_api_error_t *err, int status, const char *type, const char *param, const char *code,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error as a malloc'd JSON string. */
char *loom_api_error_json(const loom_api_error_t *err);

/* Render chat messages with a template holding "{role}" and "{content}"
 * (NULL: "{role}: {content}\n"): every message, then the template with
 * role "assistant" up to "{content}" (the generation prompt). Malloc'd. */
char *loom_api_render_chat(const loom_api_message_t *m, int n, const char *tmpl);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates). */
int loom_api_utf8_valid(const char *s, size_t n);
/* Length of s[0..n) without a trailing multi-byte character still incomplete. */
size_t loom_api_utf8_complete(const char *s, size_t n);
/* s[0..n) as a JSON string, invalid UTF-8 and NUL replaced by U+FFFD (the
 * JSON writer takes C strings: a NUL would cut the text short). */
cJSON *loom_api_clean_string(const char *s, size_t n);

/* finish_reason as the OpenAI API defines it (stop, length, tool_calls,
 * content_filter, function_call): a sample cut short (CANCELLED: its
 * deadline passed, the server shut down) is "length", an output that
 * ended before it was complete, never loom's own "abort"; NULL for NONE. */
const char *loom_api_finish_reason(loom_finish_reason f);

/* Compare two strings in time that depends only on their lengths. */
int loom_api_secret_equal(const char *a, const char *b);

#endif
