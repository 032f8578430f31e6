/* tools: tool calling for /v1/chat/completions (docs/serving.md, "Tool
 * calling"). The request's `tools`, `tool_choice` and
 * `parallel_tool_calls`; the tool-call format a model writes, chosen from
 * its chat template's text; the grammar a forced call (tool_choice
 * `required` or a named function) is decoded under (serve/json_schema.h);
 * and the model's output read back into OpenAI's `tool_calls`, whole or
 * as the deltas of a stream. Pure functions over JSON and text: no engine. */
#ifndef LOOM_TOOLS_H
#define LOOM_TOOLS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "serve/http_api.h"
#include "serve/json_schema.h"

#define LOOM_TOOLS_MAX 64       /* functions in one request */
#define LOOM_TOOLS_MAX_CALLS 16 /* calls read from one output (more stay text) */

/* How a model writes a call, from its template text (loom_tools_style):
 * HERMES  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen2.5, Hermes, and the fallback)
 * LLAMA   {"name": ..., "parameters": {...}}                          (Llama 3.1 / 3.2 / 3.3 JSON tool calls)
 * MISTRAL [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]       (Mistral v0.3, Nemo) */
typedef enum { LOOM_TOOLS_HERMES, LOOM_TOOLS_LLAMA, LOOM_TOOLS_MISTRAL } loom_tools_format;

typedef struct {
    loom_tools_format fmt;
    int native;      /* 1: the template renders `tools` and tool turns itself; 0: loom's fallback text */
    int space_after; /* MISTRAL: "[TOOL_CALLS] [" (v0.3) rather than "[TOOL_CALLS][" (Nemo) */
} loom_tools_style_t;

/* The style of a template's text (NULL or a template that never mentions
 * tools: the fallback, HERMES not native). */
loom_tools_style_t loom_tools_style(const char *template_text);

/* Parse `tools`, `tool_choice`, `parallel_tool_calls` of a chat request
 * body into r (400 naming the field otherwise). */
loom_status loom_tools_parse_request(const cJSON *body, loom_api_request_t *r, loom_api_error_t *err);
/* A message as the template sees it: role, content (a string, or null for
 * an assistant turn with tool_calls and no content), tool_calls (each
 * call's arguments parsed from their JSON string into an object, as
 * transformers' templates expect), tool_call_id, name. k is its index (errors). */
loom_status loom_tools_message(const cJSON *m, const char *role, const char *content, int k, cJSON **out,
                               loom_api_error_t *err);

/* For a template without tool support: the messages with loom's fallback
 * (docs/serving.md): the tools described in the system message (added
 * when there is none), calls of earlier assistant turns written as
 * <tool_call> text, tool results wrapped in <tool_response>. tools may be
 * NULL (then only the turns are rewritten). Changes msgs in place. */
void loom_tools_fallback(cJSON *msgs, const cJSON *tools);

/* The grammar of a forced call (r->tool_choice REQUIRED: any of the
 * functions; NAMED: that one) in style st: the format's text around one
 * call (MISTRAL: an array of 1, or of up to LOOM_TOOLS_MAX_CALLS with
 * parallel_tool_calls) whose arguments follow the function's parameter
 * schema. With *out NULL, only checks that every function's parameters
 * compile. 400 naming the construct and the function when loom cannot
 * enforce a schema. */
loom_status loom_tools_grammar(const loom_api_request_t *r, loom_tools_style_t st, loom_json_schema_t **out,
                               loom_api_error_t *err);
/* The special-token texts a forced call may use as one token. */
extern const char *const loom_tools_markers[];

/* What of a choice's output has gone out in a stream. */
typedef struct {
    size_t content_sent; /* bytes of the leading content sent */
    size_t rest_sent;    /* bytes of text after the calls (text, not calls) sent */
    int heads;           /* calls whose first delta (id, name) was sent */
    size_t args_sent[LOOM_TOOLS_MAX_CALLS];
    uint64_t seed;       /* call ids come from it (set once, before the first delta) */
} loom_tools_stream_t;

/* The delta the output text[0..n) releases since the last call, in
 * OpenAI's stream shape ({"content": ..., "tool_calls": [{index, id, type,
 * function: {name, arguments: ""}}, {index, function: {arguments:
 * fragment}}]}), or NULL when nothing new. `forced`: the output was
 * decoded under the call grammar (arguments stream as they come); else a
 * call goes out when it is complete. `final`: the output ended; what did
 * not become a call is content. The non-streamed answer is the one delta
 * of a fresh state with final set, so both agree. */
cJSON *loom_tools_delta(loom_tools_style_t st, int forced, int parallel, const char *text, size_t n, int final,
                        loom_tools_stream_t *s);
/* Turn one final delta into a message's fields: content (string or null)
 * and tool_calls (id, type, function). Returns the number of calls. */
int loom_tools_message_out(cJSON *delta, cJSON *msg);

#endif
