/* http_api: the OpenAI request parser and error shape (see http_api.h). */
#include "serve/http_api.h"

#include "obs/sbuf.h"
#include "serve/tools.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_api_fail(loom_api_error_t *err, int status, const char *type, const char *param, const char *code,
                          const char *fmt, ...) {
    err->status = status;
    err->type = type ? type : "invalid_request_error";
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return LOOM_EINVAL;
}

char *loom_api_error_json(const loom_api_error_t *err) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0]) cJSON_AddStringToObject(e, "param", err->param);
    else cJSON_AddNullToObject(e, "param");
    if (err->code) cJSON_AddStringToObject(e, "code", err->code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

int loom_api_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int k;
        unsigned cp;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
        else return 0;
        if (n - i <= (size_t)k) return 0;
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

size_t loom_api_utf8_complete(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return k > back ? n - back : n;
    }
    return n;
}

cJSON *loom_api_clean_string(const char *s, size_t n) {
    loom_sbuf_t b = {0};
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (c && i + k <= n && loom_api_utf8_valid(s + i, k)) loom_sbuf_put(&b, s + i, k), i += k;
        else loom_sbuf_puts(&b, "\xEF\xBF\xBD"), i++;
    }
    cJSON *j = cJSON_CreateString(b.data ? b.data : "");
    free(b.data);
    return j;
}

int loom_api_secret_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned d = na != nb;
    for (size_t i = 0; i < nb; i++) d |= (unsigned char)(na ? a[i < na ? i : 0] : 0) ^ (unsigned char)b[i];
    return d == 0;
}

/* A present, non-null field (NULL when missing or JSON null). */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static loom_status get_int(const cJSON *o, const char *name, double lo, double hi, int *out, loom_api_error_t *err) {
    const cJSON *v = field(o, name);
    if (!v) return LOOM_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return loom_api_fail(err, 400, NULL, name, "invalid_type", "'%s' must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return loom_api_fail(err, 400, NULL, name, v->valuedouble < lo ? "integer_below_min_value" : "integer_above_max_value",
                             "'%s' must be between %.0f and %.0f, not %g", name, lo, hi, v->valuedouble);
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static loom_status get_num(const cJSON *o, const char *name, double lo, double hi, int open_lo, double *out,
                           loom_api_error_t *err) {
    const cJSON *v = field(o, name);
    if (!v) return LOOM_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return loom_api_fail(err, 400, NULL, name, "invalid_type", "'%s' must be a number", name);
    double x = v->valuedouble;
    if (x > hi || x < lo || (open_lo && x == lo))
        return loom_api_fail(err, 400, NULL, name, x > hi ? "decimal_above_max_value" : "decimal_below_min_value", "'%s' must be in %s%g, %g], not %g", name, open_lo ? "(" : "[",
                             lo, hi, x);
    *out = x;
    return LOOM_OK;
}

static loom_status get_bool(const cJSON *o, const char *name, int *out, loom_api_error_t *err) {
    const cJSON *v = field(o, name);
    if (!v) return LOOM_OK;
    if (!cJSON_IsBool(v)) return loom_api_fail(err, 400, NULL, name, "invalid_type", "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return LOOM_OK;
}

/* Known OpenAI fields this server does not implement: refused unless neutral. */
static loom_status refuse_unsupported(const cJSON *o, loom_api_error_t *err) {
    static const char *const zero_nums[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = field(o, zero_nums[i]);
        if (v && (!cJSON_IsNumber(v) || v->valuedouble != 0))
            return loom_api_fail(err, 400, NULL, zero_nums[i], NULL, "'%s' is not supported by this server (leave it 0)",
                                 zero_nums[i]);
    }
    const cJSON *v = field(o, "logit_bias");
    if (v && (!cJSON_IsObject(v) || v->child))
        return loom_api_fail(err, 400, NULL, "logit_bias", NULL, "'logit_bias' is not supported by this server");
    v = field(o, "suffix");
    if (v && (!cJSON_IsString(v) || v->valuestring[0]))
        return loom_api_fail(err, 400, NULL, "suffix", NULL, "'suffix' is not supported by this server");
    v = field(o, "best_of");
    if (v && (!cJSON_IsNumber(v) || v->valuedouble != 1))
        return loom_api_fail(err, 400, NULL, "best_of", NULL, "'best_of' other than 1 is not supported by this server");
    return LOOM_OK;
}

/* response_format: text (nothing), json_object (any object), or
 * json_schema {name, schema, strict} (the schema kept as text; it is
 * compiled, and refused if loom cannot enforce it, when the model is known). */
static loom_status parse_response_format(const cJSON *o, loom_api_request_t *r, loom_api_error_t *err) {
    const cJSON *v = field(o, "response_format");
    if (!v) return LOOM_OK;
    const cJSON *type = cJSON_IsObject(v) ? field(v, "type") : NULL;
    if (!cJSON_IsString(type))
        return loom_api_fail(err, 400, NULL, "response_format", "invalid_type", "'response_format' must be an object with a string 'type'");
    if (!strcmp(type->valuestring, "text")) return LOOM_OK;
    if (!strcmp(type->valuestring, "json_object")) return r->json_mode = 1, LOOM_OK;
    if (strcmp(type->valuestring, "json_schema"))
        return loom_api_fail(err, 400, NULL, "response_format.type", "invalid_value",
                             "'response_format' type '%.32s' is not one of text, json_object, json_schema", type->valuestring);
    const cJSON *js = field(v, "json_schema"), *schema = cJSON_IsObject(js) ? field(js, "schema") : NULL;
    if (!cJSON_IsObject(js) || !cJSON_IsString(field(js, "name")))
        return loom_api_fail(err, 400, NULL, "response_format.json_schema", "missing_required_parameter",
                             "'response_format' json_schema needs an object 'json_schema' with a 'name'");
    r->json_mode = 2;
    r->json_schema = schema ? cJSON_PrintUnformatted(schema) : NULL; /* no schema: any object */
    return LOOM_OK;
}

static loom_status parse_stop(const cJSON *o, loom_api_request_t *r, loom_api_error_t *err) {
    const cJSON *v = field(o, "stop");
    if (!v) return LOOM_OK;
    if (cJSON_IsString(v)) {
        if (v->valuestring[0]) r->stop[r->n_stop++] = loom_strdup(v->valuestring);
        return LOOM_OK;
    }
    if (!cJSON_IsArray(v)) return loom_api_fail(err, 400, NULL, "stop", NULL, "'stop' must be a string or a list of strings");
    if (cJSON_GetArraySize(v) > LOOM_API_MAX_STOP)
        return loom_api_fail(err, 400, NULL, "stop", NULL, "'stop' has at most %d strings", LOOM_API_MAX_STOP);
    for (const cJSON *s = v->child; s; s = s->next) {
        if (!cJSON_IsString(s)) return loom_api_fail(err, 400, NULL, "stop", NULL, "'stop' must be a list of strings");
        if (s->valuestring[0]) r->stop[r->n_stop++] = loom_strdup(s->valuestring);
    }
    return LOOM_OK;
}

/* A list of token ids as one prompt. */
static loom_status ids_prompt(const cJSON *a, loom_api_request_t *r, int k, loom_api_error_t *err) {
    int n = cJSON_GetArraySize(a);
    if (n == 0) return loom_api_fail(err, 400, NULL, "prompt", NULL, "'prompt' %d is empty", k);
    r->ids[k] = loom_malloc((size_t)n * sizeof(int));
    r->n_ids[k] = 0;
    for (const cJSON *t = a->child; t; t = t->next) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble > 1e9)
            return loom_api_fail(err, 400, NULL, "prompt", NULL, "'prompt' token ids must be integers >= 0");
        r->ids[k][r->n_ids[k]++] = (int)t->valuedouble;
    }
    return LOOM_OK;
}

static void alloc_prompts(loom_api_request_t *r, int n) {
    r->n_prompts = n;
    r->text = loom_calloc((size_t)n, sizeof *r->text);
    r->ids = loom_calloc((size_t)n, sizeof *r->ids);
    r->n_ids = loom_calloc((size_t)n, sizeof *r->n_ids);
}

/* "prompt": a string, a list of strings, a list of ids, a list of lists of ids. */
static loom_status parse_prompt(const cJSON *o, loom_api_request_t *r, loom_api_error_t *err) {
    const cJSON *v = field(o, "prompt");
    if (!v) return loom_api_fail(err, 400, NULL, "prompt", "missing_required_parameter", "'prompt' is required");
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return loom_api_fail(err, 400, NULL, "prompt", NULL, "'prompt' is empty");
        alloc_prompts(r, 1);
        r->text[0] = loom_strdup(v->valuestring);
        return LOOM_OK;
    }
    const char *what = "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists";
    if (!cJSON_IsArray(v) || !v->child) return loom_api_fail(err, 400, NULL, "prompt", NULL, "%s", what);
    if (cJSON_IsNumber(v->child)) {
        alloc_prompts(r, 1);
        return ids_prompt(v, r, 0, err);
    }
    int n = cJSON_GetArraySize(v);
    if (n > LOOM_API_MAX_PROMPTS)
        return loom_api_fail(err, 400, NULL, "prompt", NULL, "'prompt' has at most %d prompts", LOOM_API_MAX_PROMPTS);
    alloc_prompts(r, n);
    int k = 0;
    for (const cJSON *p = v->child; p; p = p->next, k++) {
        if (cJSON_IsString(p) && p->valuestring[0]) r->text[k] = loom_strdup(p->valuestring);
        else if (cJSON_IsArray(p)) LOOM_TRY(ids_prompt(p, r, k, err));
        else return loom_api_fail(err, 400, NULL, "prompt", NULL, "%s (item %d is not)", what, k);
    }
    return LOOM_OK;
}

/* A message's content as one string: a string, or a list of text parts
 * ({"type": "text", "text": ...}) joined; null only for an assistant
 * message that carries tool_calls (the template sees null). Malloc'd in *out. */
static loom_status message_content(const cJSON *m, const char *role, int k, char **out, loom_api_error_t *err) {
    const cJSON *c = field(m, "content");
    if (cJSON_IsString(c)) return *out = loom_strdup(c->valuestring), LOOM_OK;
    if (!c && !strcmp(role, "assistant") && (field(m, "tool_calls") || field(m, "function_call")))
        return *out = loom_strdup(""), LOOM_OK;
    if (!c)
        return loom_api_fail(err, 400, NULL, "messages", "missing_required_parameter", "'messages' item %d has no 'content'", k);
    if (!cJSON_IsArray(c))
        return loom_api_fail(err, 400, NULL, "messages", "invalid_type",
                             "'messages' item %d: 'content' must be a string or a list of content parts", k);
    size_t n = 1;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_IsObject(p) ? field(p, "type") : NULL, *text = cJSON_IsObject(p) ? field(p, "text") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return loom_api_fail(err, 400, NULL, "messages", "invalid_value",
                                 "'messages' item %d: content part type '%.32s' is not supported here (only {\"type\": \"text\", "
                                 "\"text\": ...}: this server serves text-only models)",
                                 k, cJSON_IsString(type) ? type->valuestring : "?");
        n += strlen(text->valuestring);
    }
    char *s = loom_malloc(n), *w = s;
    for (const cJSON *p = c->child; p; p = p->next) {
        size_t len = strlen(field(p, "text")->valuestring);
        memcpy(w, field(p, "text")->valuestring, len);
        w += len;
    }
    *w = 0;
    *out = s;
    return LOOM_OK;
}

static loom_status parse_messages(const cJSON *o, loom_api_request_t *r, loom_api_error_t *err) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *v = field(o, "messages");
    if (!v) return loom_api_fail(err, 400, NULL, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(v) || !v->child)
        return loom_api_fail(err, 400, NULL, "messages", NULL, "'messages' must be a non-empty list of {role, content}");
    int n = cJSON_GetArraySize(v), k = 0;
    if (n > 4096) return loom_api_fail(err, 400, NULL, "messages", NULL, "'messages' has at most 4096 messages");
    r->msgs = loom_calloc((size_t)n, sizeof *r->msgs);
    r->messages = cJSON_CreateArray();
    for (const cJSON *m = v->child; m; m = m->next, k++) {
        const cJSON *role = cJSON_IsObject(m) ? field(m, "role") : NULL;
        if (!cJSON_IsString(role))
            return loom_api_fail(err, 400, NULL, "messages", NULL, "'messages' item %d needs a string 'role' and a 'content'", k);
        int known = 0;
        for (size_t i = 0; i < sizeof roles / sizeof *roles; i++) known |= !strcmp(role->valuestring, roles[i]);
        if (!known)
            return loom_api_fail(err, 400, NULL, "messages", "invalid_value",
                                 "'messages' item %d: role '%.32s' is not one of system, developer, user, assistant, tool", k,
                                 role->valuestring);
        char *content = NULL;
        LOOM_TRY(message_content(m, role->valuestring, k, &content, err));
        r->msgs[k].role = loom_strdup(role->valuestring);
        r->msgs[k].content = content;
        r->n_msgs = k + 1;
        cJSON *tm = NULL;
        loom_status st = loom_tools_message(m, role->valuestring, content, k, &tm, err);
        cJSON_AddItemToArray(r->messages, tm);
        LOOM_TRY(st);
    }
    return LOOM_OK;
}

/* Sampling settings and flags shared by both endpoints. */
static loom_status parse_settings(const cJSON *o, loom_api_kind kind, loom_api_request_t *r, loom_api_error_t *err) {
    double temperature = 1.0, top_p = 1.0, seed = 0;
    int top_k = 0;
    /* 0 with echo scores a prompt without generating (the spec allows it) */
    LOOM_TRY(get_int(o, "max_tokens", kind == LOOM_API_COMPLETION ? 0 : 1, LOOM_API_MAX_TOKENS, &r->p.max_tokens, err));
    if (kind == LOOM_API_CHAT) LOOM_TRY(get_int(o, "max_completion_tokens", 1, LOOM_API_MAX_TOKENS, &r->p.max_tokens, err));
    LOOM_TRY(get_num(o, "temperature", 0, 100, 0, &temperature, err));
    LOOM_TRY(get_num(o, "top_p", 0, 1, 1, &top_p, err));
    LOOM_TRY(get_int(o, "top_k", -1, 1 << 30, &top_k, err));
    LOOM_TRY(get_num(o, "seed", -9.2e18, 9.2e18, 0, &seed, err));
    if (field(o, "seed") && field(o, "seed")->valuedouble != floor(seed))
        return loom_api_fail(err, 400, NULL, "seed", NULL, "'seed' must be an integer");
    LOOM_TRY(get_int(o, "n", 1, LOOM_API_MAX_N, &r->p.n, err));
    LOOM_TRY(get_bool(o, "stream", &r->stream, err));
    LOOM_TRY(get_bool(o, "ignore_eos", &r->ignore_eos, err));
    r->p.temperature = (float)temperature;
    r->p.top_p = (float)top_p;
    r->p.top_k = top_k < 0 ? 0 : top_k;
    r->p.seed = (uint64_t)(long long)seed;
    const cJSON *so = field(o, "stream_options");
    if (so && !cJSON_IsObject(so)) return loom_api_fail(err, 400, NULL, "stream_options", NULL, "'stream_options' must be an object");
    if (so) LOOM_TRY(get_bool(so, "include_usage", &r->include_usage, err));
    r->max_tokens_set = field(o, "max_tokens") || (kind == LOOM_API_CHAT && field(o, "max_completion_tokens"));
    if (kind == LOOM_API_COMPLETION) {
        LOOM_TRY(get_bool(o, "echo", &r->echo, err));
        if (r->p.max_tokens == 0 && !r->echo)
            return loom_api_fail(err, 400, NULL, "max_tokens", "integer_below_min_value",
                                 "'max_tokens' 0 generates nothing: it is allowed only with 'echo': true (to score a prompt)");
        LOOM_TRY(get_int(o, "logprobs", 0, 20, &r->p.logprobs, err));
    } else {
        int want = 0, top = 0;
        LOOM_TRY(get_bool(o, "logprobs", &want, err));
        LOOM_TRY(get_int(o, "top_logprobs", 0, 20, &top, err));
        r->p.logprobs = want ? top : -1;
    }
    const cJSON *m = field(o, "model");
    if (m && !cJSON_IsString(m)) return loom_api_fail(err, 400, NULL, "model", NULL, "'model' must be a string");
    if (m) r->model = loom_strdup(m->valuestring);
    LOOM_TRY(parse_response_format(o, r, err));
    if (kind == LOOM_API_CHAT) LOOM_TRY(loom_tools_parse_request(o, r, err));
    return parse_stop(o, r, err);
}

loom_status loom_api_parse(const char *body, size_t len, loom_api_kind kind, loom_api_request_t *r,
                           loom_api_error_t *err) {
    memset(r, 0, sizeof *r);
    loom_request_params_default(&r->p);
    r->p.temperature = 1.0f; /* OpenAI's default */
    if (len > LOOM_API_MAX_BODY)
        return loom_api_fail(err, 413, NULL, NULL, NULL, "request body of %zu bytes is above the limit of %u", len,
                             LOOM_API_MAX_BODY);
    if (len == 0) return loom_api_fail(err, 400, NULL, NULL, NULL, "empty request body: send a JSON object");
    if (!loom_api_utf8_valid(body, len))
        return loom_api_fail(err, 400, NULL, NULL, NULL, "request body is not valid UTF-8");
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (o && end) {
        while (end < body + len && strchr(" \t\r\n", *end)) end++;
        if (end != body + len) cJSON_Delete(o), o = NULL;
    }
    if (!o) return loom_api_fail(err, 400, NULL, NULL, NULL, "malformed JSON in the request body");
    loom_status s = LOOM_OK;
    if (!cJSON_IsObject(o)) s = loom_api_fail(err, 400, NULL, NULL, NULL, "the request body must be a JSON object");
    if (s == LOOM_OK) s = refuse_unsupported(o, err);
    if (s == LOOM_OK) s = parse_settings(o, kind, r, err);
    if (s == LOOM_OK) s = kind == LOOM_API_CHAT ? parse_messages(o, r, err) : parse_prompt(o, r, err);
    cJSON_Delete(o);
    if (s != LOOM_OK) loom_api_request_free(r);
    return s;
}

void loom_api_request_free(loom_api_request_t *r) {
    for (int i = 0; i < r->n_prompts; i++) free(r->text[i]), free(r->ids[i]);
    free(r->text), free(r->ids), free(r->n_ids);
    for (int i = 0; i < r->n_msgs; i++) free(r->msgs[i].role), free(r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->model);
    free(r->json_schema);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    memset(r, 0, sizeof *r);
}

char *loom_api_render_chat(const loom_api_message_t *m, int n, const char *tmpl) {
    if (!tmpl) tmpl = "{role}: {content}\n";
    size_t cap = strlen(tmpl) * (size_t)(n + 1) + 1;
    for (int i = 0; i < n; i++) cap += strlen(m[i].role) + strlen(m[i].content);
    cap += 16;
    char *out = loom_malloc(cap), *w = out;
    for (int i = 0; i <= n; i++) {
        const char *role = i < n ? m[i].role : "assistant", *content = i < n ? m[i].content : NULL;
        for (const char *t = tmpl; *t;) {
            if (!strncmp(t, "{role}", 6)) w += sprintf(w, "%s", role), t += 6;
            else if (!strncmp(t, "{content}", 9)) {
                if (!content) break;
                w += sprintf(w, "%s", content), t += 9;
            } else *w++ = *t++;
        }
    }
    *w = 0;
    return out;
}

const char *loom_api_finish_reason(loom_finish_reason f) {
    return f == LOOM_FINISH_STOP ? "stop" : f == LOOM_FINISH_NONE ? NULL : "length";
}
