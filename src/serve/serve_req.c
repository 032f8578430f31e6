/* serve_req: one /v1/completions or /v1/chat/completions request, from
 * its body to its answer (a JSON body or server-sent events). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/hash.h"
#include "serve/json_schema.h"
#include "serve/server_int.h"

enum { WHY_NONE, WHY_TIMEOUT, WHY_SHUTDOWN, WHY_CLIENT };

typedef struct job job_t;

typedef struct {
    job_t *job;
    int k;       /* prompt index */
    int started; /* a first event arrived (or never submitted): no longer pending */
    int n_fin, finish, n_gen; /* samples finished, the request's finish reason, tokens generated (metrics) */
} sub_t;

typedef struct {
    loom_sbuf_t text; /* bytes so far */
    size_t sent;      /* bytes of text already streamed */
    int finish, n_gen;
    cJSON *lp;        /* chat-style logprob entries, when asked */
    int lp_off;       /* streamed completions: text_offset of the next token */
    int lp_sent, fin_sent; /* streams: logprob entries sent; the finish sent */
    loom_tools_stream_t ts; /* tool calls: what of them a stream has sent (serve/tools.h) */
} choice_t;

struct job {
    loom_server_t *s;
    srv_model_t *m;
    loom_api_kind kind;
    loom_api_request_t a;
    loom_engine_queue_t *q;
    sub_t *subs;
    uint64_t *eids;
    int *submitted, **pids, *n_pids;
    char **ptext;      /* prompt text, for echo */
    cJSON **plp;       /* echo with logprobs: each prompt's token entries (the first one's logprob null) */
    int n_sub, n_choices, n_done, fin_cb, why, counted, phase;
    choice_t *ch;
    double *last_t;    /* per choice, stepping thread only */
    double t0;       /* arrival, for the latency metrics (loom_now) */
    double deadline; /* --request-timeout on the decision clock (core/clock.h); 0 = none */
    char id[40];
    long created;
    loom_sbuf_t out;
    size_t out_pos;
    loom_json_schema_t *schema;  /* response_format json_object / json_schema, compiled (NULL: none) */
    loom_token_filter_t *filter; /* ... as the engine's token filter */
    int tools_on, forced;        /* the output is read for tool calls; decoded under the call grammar */
};

static int hold_k = -1;          /* LOOM_TEST_SERVE_HOLD's K; -1: no hold */
static const char *hold_release; /* ... and its PATH, if any */
static pthread_once_t hold_once = PTHREAD_ONCE_INIT;
static void hold_parse(void) {
    const char *v = getenv("LOOM_TEST_SERVE_HOLD");
    char *end;
    if (!v || !*v) return;
    long k = strtol(v, &end, 10);
    if (end == v || k < 0 || (*end && *end != ':')) {
        loom_warn("LOOM_TEST_SERVE_HOLD=%s: not K or K:PATH; no hold", v);
        return;
    }
    hold_k = (int)k;
    if (*end == ':' && end[1]) hold_release = end + 1;
}

/* LOOM_TEST_SERVE_HOLD=K[:PATH]: a sample's token after its K-th waits
 * here, on the stepping thread (so no request moves on meanwhile), until
 * its request is cancelled (the client left, the deadline passed), the
 * server cancels at shutdown, or PATH exists. A test then acts while
 * requests are surely in flight, on a machine of any speed. */
static void hold_for_test(job_t *j, const loom_engine_event_t *ev) {
    pthread_once(&hold_once, hold_parse);
    if (hold_k < 0 || ev->token < 0 || ev->n_generated <= hold_k) return;
    while (!__atomic_load_n(&j->why, __ATOMIC_ACQUIRE) && atomic_load(&j->s->state) != SRV_CANCELLING &&
           !(hold_release && access(hold_release, F_OK) == 0))
        usleep(1000);
}

/* Event callback, on the stepping thread: metrics, then into the job's queue. */
static void on_event(void *ctx, const loom_engine_event_t *ev) {
    sub_t *sb = ctx;
    job_t *j = sb->job;
    srv_model_t *m = j->m;
    hold_for_test(j, ev);
    double now = loom_now();
    if (!sb->started) {
        sb->started = 1;
        atomic_fetch_sub(&j->s->pending, 1);
        if (ev->queue_time > 0) loom_histogram_observe(m->queue, ev->queue_time);
    }
    int c = sb->k * j->a.p.n + ev->index;
    if (ev->prompt) return loom_engine_queue_push(j->q, ev); /* a prompt token's logprob: no latency to record */
    if (ev->token >= 0) {
        if (ev->n_generated == 1) loom_histogram_observe(m->ttft, now - j->t0);
        else loom_histogram_observe(m->itl, now - j->last_t[c]);
        j->last_t[c] = now;
    }
    if (ev->token >= 0) sb->n_gen++;
    if (ev->finish) {
        /* A request ends with its last sample; abort outranks length outranks stop. */
        if (ev->finish == LOOM_FINISH_CANCELLED || (ev->finish == LOOM_FINISH_LENGTH && sb->finish != LOOM_FINISH_CANCELLED) || !sb->finish)
            sb->finish = ev->finish;
        if (++sb->n_fin == j->a.p.n) loom_serve_metrics_request(&m->more, j->n_pids[sb->k], sb->n_gen, sb->finish);
        if (++j->fin_cb == j->n_choices) loom_histogram_observe(m->e2e, now - j->t0);
    }
    loom_engine_queue_push(j->q, ev);
}

/* Bytes s[0..n) with invalid UTF-8 and NUL replaced by U+FFFD. */
static void put_clean(loom_sbuf_t *b, const char *s, size_t n) {
    cJSON *j = loom_api_clean_string(s, n);
    loom_sbuf_puts(b, j->valuestring);
    cJSON_Delete(j);
}

static cJSON *clean_string(const char *s, size_t n) { return loom_api_clean_string(s, n); }

static cJSON *token_string(const loom_tokenizer_t *tok, int id) {
    size_t n = 0;
    const unsigned char *t = loom_tokenizer_token(tok, (uint32_t)id, &n);
    return clean_string(t ? (const char *)t : "", t ? n : 0);
}

/* {token, logprob, bytes}: bytes are the token's raw UTF-8 bytes (token may
 * show U+FFFD where a token holds part of a character). */
static cJSON *token_logprob(const loom_tokenizer_t *tok, int id, float logprob) {
    cJSON *e = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    size_t n = 0;
    const unsigned char *t = loom_tokenizer_token(tok, (uint32_t)id, &n);
    cJSON_AddItemToObject(e, "token", token_string(tok, id));
    cJSON_AddNumberToObject(e, "logprob", logprob);
    for (size_t i = 0; t && i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber(t[i]));
    cJSON_AddItemToObject(e, "bytes", bytes);
    return e;
}

/* One token's logprobs, chat style: {token, logprob, bytes, top_logprobs:
 * [{token, logprob, bytes}]}. The sampled token is always among its own
 * alternatives (appended last when it is not in the top n), as OpenAI's
 * completions promise ("up to logprobs+1 elements"); chat with
 * top_logprobs 0 keeps an empty list. */
static cJSON *lp_entry(const job_t *j, const loom_engine_event_t *ev) {
    cJSON *e = token_logprob(j->m->tok, ev->token, ev->logprob), *top = cJSON_CreateArray();
    int seen = 0;
    for (int i = 0; i < ev->n_top; i++) {
        cJSON_AddItemToArray(top, token_logprob(j->m->tok, ev->top_ids[i], ev->top_logprobs[i]));
        seen |= ev->top_ids[i] == ev->token;
    }
    if (!seen && (ev->n_top > 0 || j->kind == LOOM_API_COMPLETION))
        cJSON_AddItemToArray(top, token_logprob(j->m->tok, ev->token, ev->logprob));
    cJSON_AddItemToObject(e, "top_logprobs", top);
    return e;
}

/* A chat choice's logprobs object: {content: entries (taken), refusal: null}. */
static void add_chat_logprobs(cJSON *x, cJSON *entries) {
    cJSON *o = cJSON_AddObjectToObject(x, "logprobs");
    cJSON_AddItemToObject(o, "content", entries);
    cJSON_AddNullToObject(o, "refusal");
}

/* Chat-style entries as a completion's logprobs object (text_offset from `off`). */
static cJSON *lp_completion(const cJSON *entries, int off) {
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens"),
          *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs"),
          *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (const cJSON *e = entries ? entries->child : NULL; e; e = e->next) {
        const char *t = cJSON_GetObjectItem(e, "token")->valuestring;
        cJSON_AddItemToArray(toks, cJSON_CreateString(t));
        if (cJSON_IsNull(cJSON_GetObjectItem(e, "logprob"))) { /* a prompt's first token: nothing before it */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            cJSON_AddItemToArray(offs, cJSON_CreateNumber(off));
            off += (int)strlen(t);
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON *m = cJSON_CreateObject();
        for (const cJSON *a = cJSON_GetObjectItem(e, "top_logprobs")->child; a; a = a->next)
            if (!cJSON_GetObjectItem(m, cJSON_GetObjectItem(a, "token")->valuestring))
                cJSON_AddNumberToObject(m, cJSON_GetObjectItem(a, "token")->valuestring,
                                        cJSON_GetObjectItem(a, "logprob")->valuedouble);
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(off));
        off += (int)strlen(t);
    }
    return o;
}

/* Fold one event into its choice (handler thread). */
static void apply(job_t *j, const loom_engine_event_t *ev) {
    int k = 0;
    while (k < j->n_sub && j->eids[k] != ev->request) k++;
    if (k == j->n_sub) return;
    if (ev->prompt) {
        cJSON_AddItemToArray(j->plp[k], lp_entry(j, ev));
        return;
    }
    choice_t *ch = &j->ch[k * j->a.p.n + ev->index];
    loom_sbuf_put(&ch->text, ev->text ? ev->text : "", ev->text_len);
    if (ev->token >= 0) {
        ch->n_gen++;
        if (j->a.p.logprobs >= 0) cJSON_AddItemToArray(ch->lp, lp_entry(j, ev));
    }
    if (ev->finish && !ch->finish) {
        ch->finish = ev->finish;
        j->n_done++;
    }
}

static void cancel_all(job_t *j, int why) {
    if (j->why) return;
    __atomic_store_n(&j->why, why, __ATOMIC_RELEASE); /* the stepping thread's test hold reads it */
    for (int k = 0; k < j->n_sub; k++)
        if (j->submitted[k]) loom_engine_cancel(j->m->e, j->eids[k]);
}

/* Wait up to timeout_s for one event and fold it in; cancels on the
 * deadline or at shutdown. Returns 1 when an event came. */
static int wait_one(job_t *j, double timeout_s, loom_engine_event_t *evout) {
    double now = loom_clock_now();
    if (j->deadline > 0 && now > j->deadline) cancel_all(j, WHY_TIMEOUT);
    if (atomic_load(&j->s->state) == SRV_CANCELLING) cancel_all(j, WHY_SHUTDOWN);
    if (j->deadline > 0 && j->deadline - now < timeout_s) timeout_s = j->deadline - now > 0.01 ? j->deadline - now : 0.01;
    loom_engine_event_t ev;
    if (!loom_engine_queue_pop(j->q, &ev, timeout_s)) return 0;
    apply(j, &ev);
    if (evout) *evout = ev;
    else loom_engine_event_clear(&ev);
    return 1;
}

static void job_free(job_t *j) {
    for (int k = 0; k < j->n_sub; k++) {
        if (j->subs && !j->subs[k].started) atomic_fetch_sub(&j->s->pending, 1);
        if (j->pids) free(j->pids[k]);
        if (j->ptext) free(j->ptext[k]);
        if (j->plp) cJSON_Delete(j->plp[k]);
    }
    for (int c = 0; c < j->n_choices; c++) free(j->ch[c].text.data), cJSON_Delete(j->ch[c].lp);
    if (j->q) loom_engine_queue_free(j->q);
    free(j->subs), free(j->eids), free(j->submitted), free(j->pids), free(j->n_pids), free(j->ptext), free(j->plp);
    free(j->ch), free(j->last_t), free(j->out.data);
    if (j->counted) atomic_fetch_sub(&j->s->active, 1);
    loom_json_filter_free(j->filter);
    loom_json_schema_free(j->schema);
    loom_api_request_free(&j->a);
    free(j);
}

/* Cancel what is left, wait until every sample has its last event, free. */
static void job_finish(job_t *j) {
    if (j->n_done < j->n_choices) cancel_all(j, WHY_CLIENT);
    int submitted_choices = 0;
    for (int k = 0; k < j->n_sub; k++) submitted_choices += j->submitted[k] * j->a.p.n;
    int done_submitted = 0;
    for (int k = 0; k < j->n_sub; k++)
        for (int i = 0; i < j->a.p.n; i++) done_submitted += j->submitted[k] && j->ch[k * j->a.p.n + i].finish;
    while (done_submitted < submitted_choices) {
        loom_engine_event_t ev;
        if (!loom_engine_queue_pop(j->q, &ev, 1.0)) continue;
        int before = j->n_done;
        apply(j, &ev);
        done_submitted += j->n_done - before;
        loom_engine_event_clear(&ev);
    }
    job_free(j);
}

static void stream_free(void *ctx) { job_finish(ctx); }

static cJSON *usage_json(const job_t *j) {
    int pt = 0, ct = 0;
    for (int k = 0; k < j->n_sub; k++) pt += j->n_pids[k];
    for (int c = 0; c < j->n_choices; c++) ct += j->ch[c].n_gen;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", pt);
    cJSON_AddNumberToObject(u, "completion_tokens", ct);
    cJSON_AddNumberToObject(u, "total_tokens", pt + ct);
    return u;
}

static cJSON *head_json(const job_t *j, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->m->name);
    return o;
}

/* finish_reason; a sample that ended (not cut short) with tool calls: "tool_calls". */
static void add_finish(cJSON *c, int finish, int calls) {
    if (finish == LOOM_FINISH_STOP && calls) cJSON_AddStringToObject(c, "finish_reason", "tool_calls");
    else if (finish) cJSON_AddStringToObject(c, "finish_reason", loom_api_finish_reason((loom_finish_reason)finish));
    else cJSON_AddNullToObject(c, "finish_reason");
}

/* Choice c's prompt entries, then `gen`'s (a new array, owned by the caller's object). */
static cJSON *echo_entries(const job_t *j, int c, const cJSON *gen) {
    cJSON *a = cJSON_Duplicate(j->plp[c / j->a.p.n], 1);
    for (const cJSON *e = gen ? gen->child : NULL; e; e = e->next) cJSON_AddItemToArray(a, cJSON_Duplicate(e, 1));
    return a;
}

/* The whole answer of a request that did not stream. */
static char *render_full(job_t *j) {
    int chat = j->kind == LOOM_API_CHAT;
    cJSON *o = head_json(j, chat ? "chat.completion" : "text_completion"), *arr = cJSON_AddArrayToObject(o, "choices");
    for (int c = 0; c < j->n_choices; c++) {
        choice_t *ch = &j->ch[c];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "index", c);
        loom_sbuf_t t = {0};
        const char *pt = j->a.echo ? j->ptext[c / j->a.p.n] : "";
        loom_sbuf_puts(&t, pt);
        put_clean(&t, ch->text.data ? ch->text.data : "", ch->text.len);
        int calls = 0;
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(x, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (j->tools_on) { /* the stream's deltas at once: both answers agree */
                loom_tools_stream_t ts = {.seed = ch->ts.seed};
                cJSON *d = loom_tools_delta(j->m->tools, j->forced, j->a.parallel_tool_calls, ch->text.data ? ch->text.data : "",
                                            ch->text.len, 1, &ts);
                calls = loom_tools_message_out(d, msg);
                cJSON_Delete(d);
            } else {
                cJSON_AddStringToObject(msg, "content", t.data);
            }
            cJSON_AddNullToObject(msg, "refusal");
        } else {
            cJSON_AddStringToObject(x, "text", t.data);
        }
        free(t.data);
        if (j->a.p.logprobs < 0) cJSON_AddNullToObject(x, "logprobs");
        else if (chat) add_chat_logprobs(x, cJSON_Duplicate(ch->lp, 1));
        else if (j->plp) {
            cJSON *all = echo_entries(j, c, ch->lp);
            cJSON_AddItemToObject(x, "logprobs", lp_completion(all, 0));
            cJSON_Delete(all);
        }
        else cJSON_AddItemToObject(x, "logprobs", lp_completion(ch->lp, (int)strlen(pt)));
        add_finish(x, ch->finish, calls);
        cJSON_AddItemToArray(arr, x);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void put_event(job_t *j, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    loom_sbuf_printf(&j->out, "data: %s\n\n", s);
    free(s);
    cJSON_Delete(o);
}

/* One streamed chunk for choice c: text (clean UTF-8), or a chat delta
 * (taken; tool calls), logprob entries (an array, taken), finish. */
static void put_chunk(job_t *j, int c, const char *text, size_t len, cJSON *lp, int finish, int role, cJSON *delta) {
    int chat = j->kind == LOOM_API_CHAT;
    cJSON *o = head_json(j, chat ? "chat.completion.chunk" : "text_completion"), *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", c);
    cJSON *str = clean_string(text, len);
    if (delta) {
        cJSON_AddItemToObject(x, "delta", delta);
        cJSON_Delete(str);
    } else if (chat) {
        cJSON *d = cJSON_AddObjectToObject(x, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (len || role) cJSON_AddItemToObject(d, "content", str);
        else cJSON_Delete(str);
    } else {
        cJSON_AddItemToObject(x, "text", str);
    }
    if (!lp) cJSON_AddNullToObject(x, "logprobs");
    else if (chat) {
        add_chat_logprobs(x, lp);
    } else {
        cJSON_AddItemToObject(x, "logprobs", lp_completion(lp, j->ch[c].lp_off));
        for (const cJSON *e = lp->child; e; e = e->next) j->ch[c].lp_off += (int)strlen(cJSON_GetObjectItem(e, "token")->valuestring);
        cJSON_Delete(lp);
    }
    add_finish(x, finish, j->ch[c].ts.heads);
    j->ch[c].fin_sent |= finish != 0;
    cJSON_AddItemToArray(arr, x);
    put_event(j, o);
}

/* The chunk(s) choice c has ready: text, logprob entries and finish not yet sent. */
static void stream_choice(job_t *j, int c) {
    choice_t *ch = &j->ch[c];
    if (ch->fin_sent) return;
    size_t end = ch->finish ? ch->text.len : loom_api_utf8_complete(ch->text.data ? ch->text.data : "", ch->text.len);
    cJSON *lp = NULL;
    if (ch->lp && cJSON_GetArraySize(ch->lp) > ch->lp_sent) {
        lp = cJSON_CreateArray();
        for (const cJSON *e = cJSON_GetArrayItem(ch->lp, ch->lp_sent); e; e = e->next, ch->lp_sent++)
            cJSON_AddItemToArray(lp, cJSON_Duplicate(e, 1));
    }
    if (j->tools_on) { /* content and tool-call deltas as the calls take shape */
        cJSON *d = loom_tools_delta(j->m->tools, j->forced, j->a.parallel_tool_calls, ch->text.data ? ch->text.data : "",
                                    ch->text.len, ch->finish != 0, &ch->ts);
        cJSON *calls = d ? cJSON_DetachItemFromObjectCaseSensitive(d, "tool_calls") : NULL;
        if ((d && d->child) || (!calls && (ch->finish || lp)))
            put_chunk(j, c, "", 0, lp, calls ? 0 : ch->finish, 0, d ? d : cJSON_CreateObject()), lp = NULL;
        else
            cJSON_Delete(d);
        for (cJSON *x = calls ? calls->child : NULL; x; x = calls->child) { /* one call item a chunk, as OpenAI sends them */
            cJSON *one = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(one, "tool_calls");
            cJSON_AddItemToArray(arr, cJSON_DetachItemViaPointer(calls, x));
            put_chunk(j, c, "", 0, lp, calls->child ? 0 : ch->finish, 0, one);
            lp = NULL;
        }
        cJSON_Delete(calls);
        return;
    }
    if (end == ch->sent && !ch->finish && !lp) return;
    put_chunk(j, c, ch->text.data ? ch->text.data + ch->sent : "", end - ch->sent, lp, ch->finish, 0, NULL);
    ch->sent = end;
}

/* The chunk(s) one event releases (a prompt token's logprob: none; the echo chunk carries them). */
static void stream_event(job_t *j, const loom_engine_event_t *ev) {
    int k = 0;
    while (k < j->n_sub && j->eids[k] != ev->request) k++;
    if (k < j->n_sub && !ev->prompt) stream_choice(j, k * j->a.p.n + ev->index);
}

/* Echo with logprobs: every prompt's token entries are in (or its samples ended early). */
static int prompts_scored(const job_t *j) {
    for (int k = 0; j->plp && k < j->n_sub; k++) {
        int ended = 1;
        for (int i = 0; i < j->a.p.n; i++) ended &= j->ch[k * j->a.p.n + i].finish != 0;
        if (cJSON_GetArraySize(j->plp[k]) < j->n_pids[k] && !ended) return 0;
    }
    return 1;
}

/* The stream's first chunks: the role (chat), or the echoed prompt with its logprobs. */
static void stream_start(job_t *j) {
    for (int c = 0; c < j->n_choices; c++) {
        const char *pt = j->a.echo ? j->ptext[c / j->a.p.n] : "";
        j->ch[c].lp_off = j->plp ? 0 : (int)strlen(pt);
        /* finish is set already when the engine had nothing to do (max_tokens 0 with echo) */
        int fin = j->plp ? 0 : j->ch[c].finish;
        if (j->kind == LOOM_API_CHAT || *pt || fin)
            put_chunk(j, c, pt, strlen(pt), j->plp ? echo_entries(j, c, NULL) : NULL, fin, j->kind == LOOM_API_CHAT, NULL);
        stream_choice(j, c); /* what came while the prompt was scored */
    }
    j->phase = 1;
}

/* Server-sent events: the libmicrohttpd reader; blocks until it has bytes. */
static long stream_fn(void *ctx, char *buf, size_t max) {
    job_t *j = ctx;
    while (j->out.len == j->out_pos) {
        j->out.len = j->out_pos = 0;
        if (j->phase == 2) return -1;
        if (j->phase == 0 && !prompts_scored(j)) {
            if (!wait_one(j, 1.0, NULL)) loom_sbuf_puts(&j->out, ": keep-alive\n\n");
        } else if (j->phase == 0) {
            stream_start(j);
        } else if (j->n_done == j->n_choices) {
            if (j->a.include_usage) {
                cJSON *o = head_json(j, j->kind == LOOM_API_CHAT ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", usage_json(j));
                put_event(j, o);
            }
            loom_sbuf_puts(&j->out, "data: [DONE]\n\n");
            j->phase = 2;
        } else {
            loom_engine_event_t ev;
            if (wait_one(j, 1.0, &ev)) {
                stream_event(j, &ev);
                loom_engine_event_clear(&ev);
            } else {
                loom_sbuf_puts(&j->out, ": keep-alive\n\n");
            }
        }
    }
    size_t n = j->out.len - j->out_pos < max ? j->out.len - j->out_pos : max;
    memcpy(buf, j->out.data + j->out_pos, n);
    j->out_pos += n;
    return (long)n;
}

loom_status loom_srv_admit(loom_server_t *s, const loom_http_request_t *req, loom_http_response_t *resp,
                           loom_api_error_t *err) {
    int st = atomic_load(&s->state);
    loom_status r = LOOM_OK;
    if (st == SRV_LOADING) r = loom_api_fail(err, 503, "server_error", NULL, "loading", "the models are still loading; retry shortly");
    else if (st != SRV_READY) r = loom_api_fail(err, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    else if (s->api_key) {
        const char *h = loom_http_header(req, "Authorization");
        if (!h || strncmp(h, "Bearer ", 7) || !loom_api_secret_equal(h + 7, s->api_key))
            r = loom_api_fail(err, 401, "invalid_request_error", NULL, "invalid_api_key",
                              h ? "wrong API key" : "missing API key: send the header 'Authorization: Bearer KEY'");
    }
    if (r != LOOM_OK) loom_srv_reply_error(resp, err);
    return r;
}

static srv_model_t *find_model(loom_server_t *s, const char *name, loom_api_error_t *err) {
    if (!name) return &s->models[0];
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i].name, name)) return &s->models[i];
    char names[256] = "";
    for (int i = 0; i < s->n_models; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", s->models[i].name);
    loom_api_fail(err, 404, "invalid_request_error", "model", "model_not_found",
                  "model '%.64s' is not served here; this server has: %s", name, names);
    return NULL;
}

/* The job's prompts as token ids (chat: the rendered messages). */
static loom_status job_prompts(job_t *j, loom_api_error_t *err) {
    loom_api_request_t *a = &j->a;
    if (j->kind == LOOM_API_CHAT) {
        a->n_prompts = 1;
        a->text = loom_calloc(1, sizeof *a->text);
        a->ids = loom_calloc(1, sizeof *a->ids);
        a->n_ids = loom_calloc(1, sizeof *a->n_ids);
        if (loom_srv_chat_render(j->m, a, &a->text[0]) != LOOM_OK)
            return loom_api_fail(err, 400, NULL, "messages", NULL, "%s", loom_errmsg());
    }
    j->n_sub = a->n_prompts;
    j->pids = loom_calloc((size_t)j->n_sub, sizeof *j->pids);
    j->n_pids = loom_calloc((size_t)j->n_sub, sizeof *j->n_pids);
    j->ptext = loom_calloc((size_t)j->n_sub, sizeof *j->ptext);
    const char *param = j->kind == LOOM_API_CHAT ? "messages" : "prompt";
    for (int k = 0; k < j->n_sub; k++) {
        if (a->text[k]) {
            uint32_t *u = NULL;
            size_t n = 0;
            /* a rendered template holds its own BOS; a plain prompt gets what the tokenizer adds */
            loom_status (*enc)(const loom_tokenizer_t *, const char *, size_t, uint32_t **, size_t *) =
                j->m->tmpl && j->kind == LOOM_API_CHAT ? loom_tokenizer_encode : loom_tokenizer_encode_special;
            if (enc(j->m->tok, a->text[k], strlen(a->text[k]), &u, &n) != LOOM_OK)
                return loom_api_fail(err, 400, NULL, param, NULL, "cannot tokenize the prompt: %s", loom_errmsg());
            j->pids[k] = loom_malloc((n + 1) * sizeof(int));
            for (size_t i = 0; i < n; i++) j->pids[k][i] = (int)u[i];
            j->n_pids[k] = (int)n;
            free(u);
            j->ptext[k] = loom_strdup(a->text[k]);
        } else {
            j->n_pids[k] = a->n_ids[k];
            j->pids[k] = loom_malloc(((size_t)a->n_ids[k] + 1) * sizeof(int));
            memcpy(j->pids[k], a->ids[k], (size_t)a->n_ids[k] * sizeof(int));
            int V = j->m->m->cfg.vocab_size;
            for (int i = 0; i < a->n_ids[k]; i++)
                if (a->ids[k][i] >= V) return loom_api_fail(err, 400, NULL, param, NULL, "token id %d is outside the vocabulary (size %d)", a->ids[k][i], V);
            char *t = NULL;
            size_t tl = 0;
            loom_tokenizer_decode(j->m->tok, (const uint32_t *)a->ids[k], (size_t)a->n_ids[k], &t, &tl);
            loom_sbuf_t b = {0};
            put_clean(&b, t ? t : "", t ? tl : 0);
            j->ptext[k] = b.data;
            free(t);
        }
        int ctx = j->m->m->cfg.max_seq_len;
        if (j->n_pids[k] == 0) return loom_api_fail(err, 400, NULL, param, NULL, "the prompt is empty after tokenization");
        if (j->n_pids[k] >= ctx)
            return loom_api_fail(err, 400, NULL, param, "context_length_exceeded",
                                 "the prompt has %d tokens; this model's context is %d, so at most %d fit with one new token",
                                 j->n_pids[k], ctx, ctx - 1);
        /* OpenAI refuses what does not fit rather than cutting it short; an unset max_tokens is cut with "length" */
        if (a->max_tokens_set && (long)j->n_pids[k] + a->p.max_tokens > ctx)
            return loom_api_fail(err, 400, NULL, "max_tokens", "context_length_exceeded",
                                 "this model's context is %d tokens, but the prompt has %d and max_tokens asks for %d more (%ld in "
                                 "all): shorten the prompt or ask for at most %d tokens",
                                 ctx, j->n_pids[k], a->p.max_tokens, (long)j->n_pids[k] + a->p.max_tokens, ctx - j->n_pids[k]);
    }
    return LOOM_OK;
}

static job_t *job_new(loom_server_t *s, srv_model_t *m, loom_api_kind kind, loom_api_request_t *a) {
    job_t *j = loom_calloc(1, sizeof *j);
    j->s = s, j->m = m, j->kind = kind, j->a = *a;
    j->t0 = loom_now();
    j->deadline = s->cfg.request_timeout > 0 ? loom_clock_now() + s->cfg.request_timeout : 0;
    j->created = (long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llx", kind == LOOM_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1) + 1);
    return j;
}

/* response_format, or a forced tool call, as a token filter (400 naming
 * what loom cannot enforce; every function's parameters are checked). */
static loom_status job_format(job_t *j, loom_api_error_t *err) {
    if (j->a.tools) {
        j->tools_on = j->a.tool_choice != LOOM_TOOL_NONE;
        j->forced = j->a.tool_choice == LOOM_TOOL_REQUIRED || j->a.tool_choice == LOOM_TOOL_NAMED;
        LOOM_TRY(loom_tools_grammar(&j->a, j->m->tools, j->forced ? &j->schema : NULL, err));
    } else if (j->a.json_mode) {
        if (loom_json_schema_compile(j->a.json_schema, &j->schema) != LOOM_OK)
            return loom_api_fail(err, 400, NULL, "response_format", "invalid_value", "%s", loom_errmsg());
    }
    if (!j->schema) return LOOM_OK;
    LOOM_TRY(loom_json_filter_new(j->schema, j->m->tok, j->m->m->cfg.vocab_size, &j->filter));
    for (int i = 0; j->forced && loom_tools_markers[i]; i++) loom_json_filter_allow(j->filter, j->m->tok, loom_tools_markers[i]);
    j->a.p.filter = j->filter;
    return LOOM_OK;
}

/* Submit every prompt; the first refusal cancels the rest (400). */
static loom_status job_submit(job_t *j, loom_api_error_t *err) {
    loom_api_request_t *a = &j->a;
    j->n_choices = j->n_sub * a->p.n;
    j->ch = loom_calloc((size_t)j->n_choices, sizeof *j->ch);
    j->last_t = loom_calloc((size_t)j->n_choices, sizeof *j->last_t);
    for (int c = 0; c < j->n_choices; c++) {
        j->ch[c].lp = a->p.logprobs >= 0 ? cJSON_CreateArray() : NULL;
        j->ch[c].ts.seed = loom_hash64(j->id, strlen(j->id), (uint64_t)c);
    }
    j->subs = loom_calloc((size_t)j->n_sub, sizeof *j->subs);
    j->eids = loom_calloc((size_t)j->n_sub, sizeof *j->eids);
    j->submitted = loom_calloc((size_t)j->n_sub, sizeof *j->submitted);
    j->q = loom_engine_queue_new();
    a->p.stop = (const char *const *)a->stop;
    a->p.n_stop = a->n_stop;
    a->p.stop_ids = j->m->n_stop ? j->m->stop_ids : NULL;
    a->p.n_stop_ids = a->ignore_eos ? 0 : j->m->n_stop;
    a->p.prompt_logprobs = j->kind == LOOM_API_COMPLETION && a->echo && a->p.logprobs >= 0;
    if (a->p.prompt_logprobs) { /* each prompt's first token has no logprob: nothing comes before it */
        j->plp = loom_calloc((size_t)j->n_sub, sizeof *j->plp);
        for (int k = 0; k < j->n_sub; k++) {
            cJSON *e = token_logprob(j->m->tok, j->pids[k][0], 0);
            cJSON_ReplaceItemInObject(e, "logprob", cJSON_CreateNull());
            cJSON_AddNullToObject(e, "top_logprobs");
            cJSON_AddItemToArray(j->plp[k] = cJSON_CreateArray(), e);
        }
    }
    if (a->p.max_tokens == 0 && !a->p.prompt_logprobs) { /* echo only: nothing for the engine to do */
        for (int k = 0; k < j->n_sub; k++) j->subs[k] = (sub_t){.job = j, .k = k, .started = 1};
        atomic_fetch_sub(&j->s->pending, j->n_sub);
        for (int c = 0; c < j->n_choices; c++) j->ch[c].finish = LOOM_FINISH_LENGTH;
        j->n_done = j->n_choices;
        return LOOM_OK;
    }
    for (int k = 0; k < j->n_sub; k++) {
        j->subs[k] = (sub_t){.job = j, .k = k};
        if (loom_engine_submit(j->m->e, j->pids[k], j->n_pids[k], &a->p, on_event, &j->subs[k], &j->eids[k]) != LOOM_OK) {
            j->subs[k].started = 1, atomic_fetch_sub(&j->s->pending, 1);
            for (int r = k + 1; r < j->n_sub; r++) j->subs[r].started = 1, atomic_fetch_sub(&j->s->pending, 1);
            return loom_api_fail(err, 400, NULL, j->kind == LOOM_API_CHAT ? "messages" : "prompt", NULL, "%s", loom_errmsg());
        }
        j->submitted[k] = 1;
    }
    return LOOM_OK;
}

/* Wait for every sample, then answer with one JSON body. */
static void answer_full(job_t *j, loom_http_response_t *resp) {
    while (j->n_done < j->n_choices) wait_one(j, 1.0, NULL);
    loom_api_error_t err;
    if (j->why == WHY_TIMEOUT) {
        loom_api_fail(&err, 504, "server_error", NULL, "timeout", "the request ran past --request-timeout (%g s)", j->s->cfg.request_timeout);
        loom_srv_reply_error(resp, &err);
    } else if (j->why == WHY_SHUTDOWN) {
        loom_api_fail(&err, 503, "server_error", NULL, "shutting_down", "the server shut down before the request finished");
        loom_srv_reply_error(resp, &err);
    } else {
        resp->body = render_full(j);
        resp->body_len = strlen(resp->body);
        resp->status = 200;
        resp->content_type = "application/json";
    }
    job_finish(j);
}

static void handle(const loom_http_request_t *req, loom_http_response_t *resp, loom_server_t *s, loom_api_kind kind) {
    loom_api_error_t err;
    if (loom_srv_admit(s, req, resp, &err) != LOOM_OK) return;
    loom_api_request_t a;
    if (loom_api_parse(req->body, req->body_len, kind, &a, &err) != LOOM_OK) return loom_srv_reply_error(resp, &err);
    srv_model_t *m = find_model(s, a.model, &err);
    if (!m) {
        loom_api_request_free(&a);
        return loom_srv_reply_error(resp, &err);
    }
    job_t *j = job_new(s, m, kind, &a);
    atomic_fetch_add(&s->active, 1);
    j->counted = 1;
    if (job_prompts(j, &err) != LOOM_OK || job_format(j, &err) != LOOM_OK) {
        job_free(j);
        return loom_srv_reply_error(resp, &err);
    }
    int before = atomic_fetch_add(&s->pending, j->n_sub);
    if (s->cfg.max_queue > 0 && before + j->n_sub > s->cfg.max_queue) {
        atomic_fetch_sub(&s->pending, j->n_sub);
        loom_counter_add(m->rejected, 1);
        loom_api_fail(&err, 429, "rate_limit_error", NULL, "queue_full",
                      "the waiting queue is full (%d prompts wait, --max-queue %d); retry after a second", before, s->cfg.max_queue);
        job_free(j);
        loom_srv_reply_error(resp, &err);
        resp->headers[0][0] = "Retry-After", resp->headers[0][1] = "1";
        return;
    }
    if (job_submit(j, &err) != LOOM_OK) {
        job_finish(j);
        return loom_srv_reply_error(resp, &err);
    }
    if (!j->a.stream) return answer_full(j, resp);
    resp->status = 200;
    resp->content_type = "text/event-stream";
    resp->headers[0][0] = "Cache-Control", resp->headers[0][1] = "no-cache";
    resp->stream = stream_fn;
    resp->stream_free = stream_free;
    resp->sctx = j;
}

void loom_srv_on_completions(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    handle(req, resp, ctx, LOOM_API_COMPLETION);
}

void loom_srv_on_chat(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    handle(req, resp, ctx, LOOM_API_CHAT);
}
