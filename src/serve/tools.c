/* tools: tool calling (see tools.h). */
#define _GNU_SOURCE
#include "serve/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "obs/sbuf.h"

const char *const loom_tools_markers[] = {"<tool_call>", "</tool_call>", "[TOOL_CALLS]", NULL};

loom_tools_style_t loom_tools_style(const char *t) {
    loom_tools_style_t st = {LOOM_TOOLS_HERMES, 0, 0};
    if (!t || !strstr(t, "tools")) return st;
    if (strstr(t, "[TOOL_CALLS]")) return (loom_tools_style_t){LOOM_TOOLS_MISTRAL, 1, strstr(t, "[TOOL_CALLS] [") != NULL};
    if (strstr(t, "<tool_call>")) return (loom_tools_style_t){LOOM_TOOLS_HERMES, 1, 0};
    if (strstr(t, "\"parameters\"") || strstr(t, "<|python_tag|>")) return (loom_tools_style_t){LOOM_TOOLS_LLAMA, 1, 0};
    return st;
}

/* ---- the request ---- */

/* OpenAI's rule for a function name: 1 to 64 of [a-zA-Z0-9_-]. */
static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z'))) return 0;
    return 1;
}

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static loom_status check_tool(const cJSON *t, int k, const cJSON *tools, loom_api_error_t *err) {
    const cJSON *type = field(t, "type"), *fn = field(t, "function"), *name = field(fn, "name"), *params = field(fn, "parameters");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn))
        return loom_api_fail(err, 400, NULL, "tools", "invalid_value", "'tools' item %d must be {\"type\": \"function\", \"function\": {...}}", k);
    if (!cJSON_IsString(name) || !name_ok(name->valuestring))
        return loom_api_fail(err, 400, NULL, "tools", "invalid_value",
                             "'tools' item %d: 'function.name' must be 1 to 64 letters, digits, '_' or '-'", k);
    if (params && !cJSON_IsObject(params))
        return loom_api_fail(err, 400, NULL, "tools", "invalid_type", "'tools' item %d: 'function.parameters' must be a JSON schema object", k);
    const cJSON *desc = field(fn, "description");
    if (desc && !cJSON_IsString(desc))
        return loom_api_fail(err, 400, NULL, "tools", "invalid_type", "'tools' item %d: 'function.description' must be a string", k);
    int i = 0;
    for (const cJSON *u = tools->child; u != t; u = u->next, i++)
        if (!strcmp(field(field(u, "function"), "name")->valuestring, name->valuestring))
            return loom_api_fail(err, 400, NULL, "tools", "invalid_value", "'tools' items %d and %d both name '%s'", i, k, name->valuestring);
    return LOOM_OK;
}

/* tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name": ...}} naming a tool. */
static loom_status parse_choice(const cJSON *v, loom_api_request_t *r, loom_api_error_t *err) {
    r->tool_choice = r->tools ? LOOM_TOOL_AUTO : LOOM_TOOL_NONE;
    if (!v) return LOOM_OK;
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        r->tool_choice = !strcmp(s, "none") ? LOOM_TOOL_NONE : !strcmp(s, "auto") ? LOOM_TOOL_AUTO : !strcmp(s, "required") ? LOOM_TOOL_REQUIRED : -1;
        if ((int)r->tool_choice < 0)
            return loom_api_fail(err, 400, NULL, "tool_choice", "invalid_value", "'tool_choice' '%.32s' is not one of none, auto, required", s);
    } else {
        const cJSON *name = field(field(v, "function"), "name");
        if (!cJSON_IsString(field(v, "type")) || strcmp(field(v, "type")->valuestring, "function") || !cJSON_IsString(name))
            return loom_api_fail(err, 400, NULL, "tool_choice", "invalid_value",
                                 "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        int found = 0;
        for (const cJSON *t = r->tools ? r->tools->child : NULL; t; t = t->next)
            found |= !strcmp(field(field(t, "function"), "name")->valuestring, name->valuestring);
        if (!found)
            return loom_api_fail(err, 400, NULL, "tool_choice", "invalid_value", "'tool_choice' names '%.64s', which is not in 'tools'", name->valuestring);
        r->tool_choice = LOOM_TOOL_NAMED;
        snprintf(r->tool_name, sizeof r->tool_name, "%s", name->valuestring);
    }
    if (r->tool_choice != LOOM_TOOL_NONE && !r->tools)
        return loom_api_fail(err, 400, NULL, "tool_choice", "invalid_value", "'tool_choice' other than none needs 'tools'");
    return LOOM_OK;
}

loom_status loom_tools_parse_request(const cJSON *o, loom_api_request_t *r, loom_api_error_t *err) {
    if (field(o, "functions") || field(o, "function_call"))
        return loom_api_fail(err, 400, NULL, field(o, "functions") ? "functions" : "function_call", NULL,
                             "'functions' and 'function_call' (deprecated by OpenAI) are not supported: use 'tools' and 'tool_choice'");
    const cJSON *tools = field(o, "tools");
    r->parallel_tool_calls = 1;
    const cJSON *par = field(o, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par))
        return loom_api_fail(err, 400, NULL, "parallel_tool_calls", "invalid_type", "'parallel_tool_calls' must be true or false");
    if (par) r->parallel_tool_calls = cJSON_IsTrue(par);
    if (tools) {
        if (!cJSON_IsArray(tools))
            return loom_api_fail(err, 400, NULL, "tools", "invalid_type", "'tools' must be a list of {\"type\": \"function\", ...}");
        int n = cJSON_GetArraySize(tools), k = 0;
        if (n > LOOM_TOOLS_MAX) return loom_api_fail(err, 400, NULL, "tools", NULL, "'tools' has at most %d functions", LOOM_TOOLS_MAX);
        for (const cJSON *t = tools->child; t; t = t->next, k++) LOOM_TRY(check_tool(t, k, tools, err));
        if (n > 0) r->tools = cJSON_Duplicate(tools, 1);
    }
    LOOM_TRY(parse_choice(field(o, "tool_choice"), r, err));
    if (r->json_mode && r->tool_choice != LOOM_TOOL_NONE)
        return loom_api_fail(err, 400, NULL, "response_format", NULL,
                             "'response_format' with 'tools' is not supported: the output is either a tool call or the format "
                             "(set tool_choice none, or drop one of them)");
    return LOOM_OK;
}

/* A call of an assistant turn, as the template sees it: arguments parsed. */
static loom_status copy_call(const cJSON *c, int k, int i, cJSON *calls, loom_api_error_t *err) {
    const cJSON *fn = field(c, "function"), *name = field(fn, "name"), *args = field(fn, "arguments");
    if (!cJSON_IsString(name) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args)))
        return loom_api_fail(err, 400, NULL, "messages", "invalid_value",
                             "'messages' item %d: tool_calls[%d] needs 'function' with a string 'name' and 'arguments' (a JSON string)", k, i);
    cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
    if (cJSON_IsString(field(c, "id"))) cJSON_AddStringToObject(o, "id", field(c, "id")->valuestring);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : args ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
    /* arguments that are not JSON stay the string the client sent */
    cJSON_AddItemToObject(f, "arguments", parsed ? parsed : cJSON_CreateString(args->valuestring));
    cJSON_AddItemToObject(o, "function", f);
    cJSON_AddItemToArray(calls, o);
    return LOOM_OK;
}

loom_status loom_tools_message(const cJSON *m, const char *role, const char *content, int k, cJSON **out,
                               loom_api_error_t *err) {
    cJSON *o = cJSON_CreateObject();
    *out = o;
    cJSON_AddStringToObject(o, "role", role);
    const cJSON *calls = field(m, "tool_calls");
    if (calls && (!cJSON_IsArray(calls) || strcmp(role, "assistant")))
        return loom_api_fail(err, 400, NULL, "messages", "invalid_value", "'messages' item %d: 'tool_calls' must be a list, on an assistant message", k);
    if (!field(m, "content") && calls) cJSON_AddNullToObject(o, "content");
    else cJSON_AddStringToObject(o, "content", content);
    if (calls) {
        cJSON *arr = cJSON_AddArrayToObject(o, "tool_calls");
        int i = 0;
        for (const cJSON *c = calls->child; c; c = c->next, i++) LOOM_TRY(copy_call(c, k, i, arr, err));
    }
    const cJSON *id = field(m, "tool_call_id"), *name = field(m, "name");
    if (!strcmp(role, "tool") && !cJSON_IsString(id))
        return loom_api_fail(err, 400, NULL, "messages", "missing_required_parameter", "'messages' item %d: a tool message needs a string 'tool_call_id'", k);
    if (cJSON_IsString(id)) cJSON_AddStringToObject(o, "tool_call_id", id->valuestring);
    if (cJSON_IsString(name)) cJSON_AddStringToObject(o, "name", name->valuestring);
    return LOOM_OK;
}

/* ---- the fallback for templates without tools ---- */

static const char FALLBACK_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char FALLBACK_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/* One call as the HERMES text a model would have written. */
static void put_call_text(loom_sbuf_t *b, const cJSON *call) {
    const cJSON *fn = field(call, "function");
    char *args = cJSON_PrintUnformatted(field(fn, "arguments"));
    loom_sbuf_printf(b, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", b->len ? "\n" : "",
                     field(fn, "name")->valuestring, args ? args : "{}");
    free(args);
}

static void set_content(cJSON *m, const char *text) {
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(text));
}

void loom_tools_fallback(cJSON *msgs, const cJSON *tools) {
    for (cJSON *m = msgs->child; m; m = m->next) {
        const cJSON *content = field(m, "content"), *calls = field(m, "tool_calls");
        loom_sbuf_t b = {0};
        if (calls) {
            if (cJSON_IsString(content)) loom_sbuf_puts(&b, content->valuestring);
            for (const cJSON *c = calls->child; c; c = c->next) put_call_text(&b, c);
            set_content(m, b.data ? b.data : "");
            cJSON_DeleteItemFromObjectCaseSensitive(m, "tool_calls");
        } else if (!strcmp(field(m, "role")->valuestring, "tool")) {
            loom_sbuf_printf(&b, "<tool_response>\n%s\n</tool_response>", cJSON_IsString(content) ? content->valuestring : "");
            set_content(m, b.data);
        }
        free(b.data);
    }
    if (!tools) return;
    loom_sbuf_t b = {0};
    cJSON *first = msgs->child;
    int sys = first && !strcmp(field(first, "role")->valuestring, "system");
    if (sys && cJSON_IsString(field(first, "content")) && field(first, "content")->valuestring[0])
        loom_sbuf_printf(&b, "%s\n\n", field(first, "content")->valuestring);
    loom_sbuf_puts(&b, FALLBACK_HEAD);
    for (const cJSON *t = tools->child; t; t = t->next) {
        char *s = cJSON_PrintUnformatted(t);
        loom_sbuf_printf(&b, "\n%s", s);
        free(s);
    }
    loom_sbuf_puts(&b, FALLBACK_TAIL);
    if (sys) {
        set_content(first, b.data);
    } else {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", b.data);
        cJSON_InsertItemInArray(msgs, 0, m);
    }
    free(b.data);
}

/* ---- the grammar of a forced call ---- */

/* The text before a call's arguments: {"name": "NAME", "arguments": (names need no escaping: name_ok). */
static void call_head(char *out, size_t cap, loom_tools_format fmt, const char *name) {
    snprintf(out, cap, "{\"name\": \"%s\", \"%s\": ", name, fmt == LOOM_TOOLS_LLAMA ? "parameters" : "arguments");
}

/* Each function (or the named one) as "head" -> arguments -> "}", in one switch. */
static loom_status call_switch(const loom_api_request_t *r, loom_tools_style_t st, loom_json_schema_t *g, int *sw,
                               loom_api_error_t *err) {
    char heads[LOOM_TOOLS_MAX][120];
    const char *lits[LOOM_TOOLS_MAX];
    int next[LOOM_TOOLS_MAX], n = 0, k = 0;
    int close = loom_json_grammar_literal(g, "}");
    for (const cJSON *t = r->tools->child; t; t = t->next, k++) {
        const cJSON *fn = field(t, "function"), *params = field(fn, "parameters");
        const char *name = field(fn, "name")->valuestring;
        char *text = params ? cJSON_PrintUnformatted(params) : loom_strdup("{\"type\": \"object\", \"properties\": {}, \"additionalProperties\": false}");
        char where[64];
        snprintf(where, sizeof where, "tools[%d].function.parameters", k);
        int args;
        loom_status s = loom_json_grammar_schema(g, text, where, &args);
        free(text);
        if (s != LOOM_OK) return loom_api_fail(err, 400, NULL, "tools", "invalid_value", "function '%s': %s", name, loom_errmsg());
        if (r->tool_choice == LOOM_TOOL_NAMED && strcmp(name, r->tool_name)) continue;
        call_head(heads[n], sizeof heads[n], st.fmt, name);
        lits[n] = heads[n];
        int parts[2] = {args, close};
        next[n++] = loom_json_grammar_seq(g, parts, 2);
    }
    *sw = loom_json_grammar_switch(g, lits, next, n);
    return LOOM_OK;
}

loom_status loom_tools_grammar(const loom_api_request_t *r, loom_tools_style_t st, loom_json_schema_t **out,
                               loom_api_error_t *err) {
    loom_json_schema_t *g = loom_json_grammar_new();
    int sw = -1, top;
    loom_status s = call_switch(r, st, g, &sw, err);
    if (s != LOOM_OK || !out) return loom_json_schema_free(g), s;
    if (st.fmt == LOOM_TOOLS_LLAMA) {
        top = sw;
    } else if (st.fmt == LOOM_TOOLS_HERMES) {
        int parts[3] = {loom_json_grammar_literal(g, "<tool_call>\n"), sw, loom_json_grammar_literal(g, "\n</tool_call>")};
        top = loom_json_grammar_seq(g, parts, 3);
    } else {
        int parts[2] = {loom_json_grammar_literal(g, st.space_after ? "[TOOL_CALLS] " : "[TOOL_CALLS]"),
                        loom_json_grammar_array(g, sw, 1, r->parallel_tool_calls ? LOOM_TOOLS_MAX_CALLS : 1)};
        top = loom_json_grammar_seq(g, parts, 2);
    }
    if (sw < 0 || loom_json_grammar_finish(g, top) != LOOM_OK) {
        loom_json_schema_free(g);
        return loom_api_fail(err, 400, NULL, "tools", NULL, "the tools' call grammar is too large for this server: fewer or smaller schemas");
    }
    *out = g;
    return LOOM_OK;
}

/* ---- reading calls back ---- */

typedef struct {
    size_t start;              /* where the call's text begins */
    size_t name_off, name_len; /* the name's JSON string, quotes included (len 0: not yet) */
    size_t args_off, args_len; /* the arguments' text so far (off 0: not begun) */
    int complete;
} span_t;

enum { S_DONE, S_MORE, S_BAD }; /* after the calls: nothing (whitespace), text that may still become one, text that is not */

typedef struct {
    size_t content_end; /* text[0, content_end) is content before any call (a marker that may be coming is not) */
    size_t rest;        /* where the text after the last complete call begins */
    int state;          /* S_* for text[rest, n) */
    int n;              /* spans (the last may be incomplete) */
    span_t c[LOOM_TOOLS_MAX_CALLS];
} scan_t;

static size_t skip_ws(const char *t, size_t i, size_t n) {
    while (i < n && t[i] && strchr(" \t\r\n", t[i])) i++;
    return i;
}

enum { MORE = -1, BAD = -2 };

/* The end of the JSON string at t[i] (after its quote), MORE or BAD. */
static long string_end(const char *t, size_t i, size_t n) {
    if (i >= n) return MORE;
    if (t[i] != '"') return BAD;
    for (i++; i < n; i++) {
        if (t[i] == '\\') i++;
        else if (t[i] == '"') return (long)i + 1;
    }
    return MORE;
}

/* The end of the JSON value at t[i] (brackets balanced, strings skipped;
 * an argument object is parsed once complete), MORE or BAD. */
static long value_end(const char *t, size_t i, size_t n) {
    if (i >= n) return MORE;
    if (t[i] == '"') return string_end(t, i, n);
    if (t[i] != '{' && t[i] != '[') {
        size_t j = i;
        while (j < n && t[j] && !strchr(",}] \t\r\n", t[j])) j++;
        return j == n ? MORE : j == i ? BAD : (long)j;
    }
    int depth = 0;
    for (; i < n; i++) {
        if (t[i] == '"') {
            long e = string_end(t, i, n);
            if (e < 0) return e;
            i = (size_t)e - 1;
        } else if (t[i] == '{' || t[i] == '[') {
            depth++;
        } else if (t[i] == '}' || t[i] == ']') {
            if (--depth == 0) return (long)i + 1;
        }
    }
    return MORE;
}

static int key_is(const char *t, size_t i, long end, const char *key) {
    size_t L = strlen(key);
    return (size_t)end - i == L + 2 && !strncmp(t + i + 1, key, L);
}

/* One call object {"name": ..., "arguments"|"parameters": ...} at t[i]:
 * its end, MORE (c filled as far as it goes) or BAD. */
static long scan_call(const char *t, size_t i, size_t n, span_t *c) {
    *c = (span_t){.start = i};
    if (i >= n) return MORE;
    if (t[i++] != '{') return BAD;
    for (;;) {
        i = skip_ws(t, i, n);
        if (i < n && t[i] == '}' && c->name_len && c->args_off) break;
        long ke = string_end(t, i, n);
        if (ke < 0) return ke;
        int is_name = key_is(t, i, ke, "name"), is_args = key_is(t, i, ke, "arguments") || key_is(t, i, ke, "parameters");
        i = skip_ws(t, (size_t)ke, n);
        if (i >= n) return MORE;
        if (t[i] != ':') return BAD;
        i = skip_ws(t, i + 1, n);
        long ve = value_end(t, i, n);
        if (is_args && ve != BAD) c->args_off = i, c->args_len = (ve == MORE ? n : (size_t)ve) - i;
        if (ve < 0) return ve;
        if (is_name && t[i] != '"') return BAD;
        if (is_name) c->name_off = i, c->name_len = (size_t)ve - i;
        i = skip_ws(t, (size_t)ve, n);
        if (i >= n) return MORE;
        if (t[i] == ',') i++;
        else if (t[i] != '}') return BAD;
    }
    cJSON *args = cJSON_ParseWithLength(t + c->args_off, c->args_len); /* a model's own call must hold JSON */
    int ok = cJSON_IsObject(args);
    cJSON_Delete(args);
    return ok ? (c->complete = 1, (long)i + 1) : BAD;
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of m (a marker that may be coming). */
static size_t partial_marker(const char *t, size_t n, const char *m) {
    for (size_t k = strlen(m) - 1; k > 0; k--)
        if (k <= n && !strncmp(t + n - k, m, k)) return k;
    return 0;
}

/* Literal m at t[*i]: 1 (taken), 0 (something else), MORE (the text ends inside it). */
static int expect(const char *t, size_t *i, size_t n, const char *m) {
    size_t L = strlen(m), k = n - *i < L ? n - *i : L;
    if (strncmp(t + *i, m, k)) return 0;
    if (k < L) return MORE;
    *i += L;
    return 1;
}

/* Where the calls begin (*at, after the format's marker): 0 when the text
 * holds none (x->content_end then stops before a marker still partial). */
static int find_start(loom_tools_style_t st, const char *t, size_t n, scan_t *x, size_t *at) {
    if (st.fmt == LOOM_TOOLS_LLAMA) { /* a call is the whole output: a JSON object, maybe after <|python_tag|> */
        size_t i = skip_ws(t, 0, n);
        int r = expect(t, &i, n, "<|python_tag|>");
        if (r == MORE || skip_ws(t, i, n) == n) return x->content_end = 0, x->state = S_MORE, 0;
        i = skip_ws(t, i, n);
        if (t[i] != '{') return 0;
        return x->content_end = 0, *at = i, 1;
    }
    const char *m = st.fmt == LOOM_TOOLS_HERMES ? "<tool_call>" : "[TOOL_CALLS]";
    const char *p = memmem(t, n, m, strlen(m));
    if (!p) {
        size_t k = partial_marker(t, n, m);
        x->content_end = n - k, x->state = k ? S_MORE : S_DONE;
        return 0;
    }
    x->content_end = (size_t)(p - t);
    *at = x->content_end + strlen(m);
    return 1;
}

/* What follows complete call x->c[x->n - 1] at t[j]: 1 another call comes at *next; else x->state is set. */
static int after_call(loom_tools_style_t st, const char *t, size_t j, size_t n, scan_t *x, size_t *next) {
    j = skip_ws(t, j, n);
    int r;
    if (st.fmt == LOOM_TOOLS_HERMES) {
        if ((r = expect(t, &j, n, "</tool_call>")) != 1) return x->state = r == MORE ? S_MORE : S_BAD, 0;
        x->rest = j;
        j = skip_ws(t, j, n);
        if (j == n) return x->state = S_DONE, 0;
        if ((r = expect(t, &j, n, "<tool_call>")) != 1) return x->state = r == MORE ? S_MORE : S_BAD, 0;
        return *next = j, 1;
    }
    if (j == n) return x->state = S_DONE, 0;
    if (st.fmt == LOOM_TOOLS_LLAMA) return t[j] == ';' ? (*next = j + 1, 1) : (x->state = S_BAD, 0);
    if (t[j] == ',') return *next = j + 1, 1;
    if (t[j] == ']') return x->rest = j + 1, x->state = S_DONE, 0;
    return x->state = S_BAD, 0;
}

/* Read the calls of text[0..n) in style st. */
static void scan(loom_tools_style_t st, const char *t, size_t n, scan_t *x) {
    *x = (scan_t){.content_end = n, .rest = n, .state = S_DONE};
    size_t i;
    int found = find_start(st, t, n, x, &i);
    x->rest = x->content_end;
    if (!found) return;
    x->state = S_MORE;
    if (st.fmt == LOOM_TOOLS_MISTRAL) {
        i = skip_ws(t, i, n);
        int r = expect(t, &i, n, "[");
        if (r != 1) return (void)(x->state = r == MORE ? S_MORE : S_BAD);
    }
    while (x->n < LOOM_TOOLS_MAX_CALLS) {
        i = skip_ws(t, i, n);
        long e = scan_call(t, i, n, &x->c[x->n]);
        if (e == BAD) return (void)(x->state = S_BAD);
        x->n++;
        if (e == MORE) return (void)(x->state = S_MORE);
        x->rest = (size_t)e;
        if (!after_call(st, t, (size_t)e, n, x, &i)) return;
    }
}

/* A call's id: 9 letters and digits (Mistral's templates insist on 9), from the stream's seed and the call's index. */
static void call_id(uint64_t seed, int k, char out[10]) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = loom_hash64(&k, sizeof k, seed);
    for (int i = 0; i < 9; i++, h /= 62) out[i] = digits[h % 62];
    out[9] = 0;
}

static void add_content(cJSON *d, const char *t, size_t from, size_t to, size_t *sent, int final) {
    size_t end = final ? to : from + loom_api_utf8_complete(t + from, to - from);
    if (end <= from) return;
    cJSON *old = cJSON_GetObjectItemCaseSensitive(d, "content");
    loom_sbuf_t b = {0};
    if (old) loom_sbuf_puts(&b, old->valuestring);
    loom_sbuf_put(&b, t + from, end - from);
    cJSON *s = loom_api_clean_string(b.data, b.len);
    if (old) cJSON_ReplaceItemInObjectCaseSensitive(d, "content", s);
    else cJSON_AddItemToObject(d, "content", s);
    free(b.data);
    *sent = end;
}

/* Call k's delta: its head (the first time) and the arguments not yet sent (nothing new: none). */
static void add_call(cJSON *calls, const char *t, const span_t *c, int k, int final, loom_tools_stream_t *s) {
    int head = k == s->heads;
    size_t from = head ? 0 : s->args_sent[k], to = c->args_off ? c->args_len : 0;
    size_t end = final || c->complete ? to : from + loom_api_utf8_complete(t + c->args_off + from, to - from);
    if (!head && end <= from) return;
    cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", k);
    if (head) {
        char id[10];
        call_id(s->seed, k, id);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *name = cJSON_ParseWithLength(t + c->name_off, c->name_len);
        cJSON_AddStringToObject(f, "name", cJSON_IsString(name) ? name->valuestring : "");
        cJSON_Delete(name);
        s->heads++;
    }
    /* OpenAI's first delta of a call carries empty arguments; the text follows in later deltas */
    cJSON_AddItemToObject(f, "arguments", loom_api_clean_string(t + c->args_off + from, head ? 0 : end - from));
    s->args_sent[k] = head ? 0 : end;
    cJSON_AddItemToObject(o, "function", f);
    cJSON_AddItemToArray(calls, o);
}

static int blank(const char *t, size_t from, size_t n) { return skip_ws(t, from, n) == n; }

cJSON *loom_tools_delta(loom_tools_style_t st, int forced, int parallel, const char *t, size_t n, int final,
                        loom_tools_stream_t *s) {
    scan_t x;
    scan(st, t, n, &x);
    int ready = 0; /* calls that go out: complete ones; forced, also the last one once named */
    while (ready < x.n && (x.c[ready].complete || (forced && x.c[ready].name_len))) ready++;
    if (!parallel && ready > 1) ready = 1; /* parallel_tool_calls false: the first call only */
    size_t tail = ready && !x.c[ready - 1].complete ? n : x.rest; /* text after the calls */
    cJSON *d = cJSON_CreateObject(), *calls = cJSON_CreateArray();
    add_content(d, t, s->content_sent, x.content_end, &s->content_sent, final);
    for (int k = 0; k < ready; k++) {
        const span_t *c = &x.c[k];
        if (k >= s->heads) add_call(calls, t, c, k, final, s); /* the head, then (below) its arguments so far */
        if (s->args_sent[k] < c->args_len) add_call(calls, t, c, k, final, s);
    }
    /* the tail is content once it cannot become a call: malformed, or the output ended */
    if ((final || x.state == S_BAD) && tail < n && !(ready && blank(t, tail, n)))
        add_content(d, t, tail > s->rest_sent ? tail : s->rest_sent, n, &s->rest_sent, final);
    if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(d, "tool_calls", calls);
    else cJSON_Delete(calls);
    if (!d->child) cJSON_Delete(d), d = NULL;
    return d;
}

int loom_tools_message_out(cJSON *delta, cJSON *msg) {
    cJSON *content = delta ? cJSON_DetachItemFromObjectCaseSensitive(delta, "content") : NULL;
    cJSON *calls = delta ? cJSON_GetObjectItemCaseSensitive(delta, "tool_calls") : NULL;
    cJSON_AddItemToObject(msg, "content", content ? content : cJSON_CreateNull());
    if (!calls) return 0;
    cJSON *out = cJSON_AddArrayToObject(msg, "tool_calls");
    for (cJSON *c = calls->child; c; c = c->next) { /* a call's head, then its arguments: one call */
        cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *args = cJSON_GetObjectItemCaseSensitive(f, "arguments")->valuestring;
        if (cJSON_GetObjectItemCaseSensitive(c, "id")) {
            cJSON *o = cJSON_Duplicate(c, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(o, "index");
            cJSON_AddItemToArray(out, o);
            continue;
        }
        cJSON *into = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1), "function");
        loom_sbuf_t b = {0};
        loom_sbuf_puts(&b, cJSON_GetObjectItemCaseSensitive(into, "arguments")->valuestring);
        loom_sbuf_puts(&b, args);
        cJSON_ReplaceItemInObjectCaseSensitive(into, "arguments", cJSON_CreateString(b.data));
        free(b.data);
    }
    return cJSON_GetArraySize(out);
}
