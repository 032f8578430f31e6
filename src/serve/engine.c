/* engine: the scheduler, sequences and events (see engine.h). The step
 * thread owns every request and sequence; other threads touch only the
 * incoming list and the cancel flags, under the mutex. */
#include "engine.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_cache.h"
#include "step_budget.h"
#include "model/generate.h"
#include "model/infer.h"

typedef struct request request_t;

/* Speculative decoding by prompt lookup: drafts come from the latest
 * earlier occurrence of a sequence's last NGRAM_MAX..NGRAM_MIN tokens; only
 * while at most SPEC_MAX_SEQS sequences decode (beyond, a step is compute
 * bound and drafts cost more than they save); after a proposal with nothing
 * accepted a sequence waits 2, 4, .. SPEC_MAX_WAIT steps before the next. */
#define NGRAM_MAX 4
#define NGRAM_MIN 2
#define SPEC_MAX_SEQS 8
#define SPEC_MAX_DRAFT 16
#define SPEC_MAX_WAIT 16
/* Prompt rows whose logits a step returns for prompt_logprobs (a prefill
 * chunk that asks for them is cut to what is left of these). */
#define PLP_ROWS 64

typedef struct {
    request_t *req;
    int index;             /* sample index in the request */
    int *tokens, len;      /* (prompt + generated) ids, len of them */
    int n_cached;          /* tokens whose K, V are in the cache */
    int *blocks, n_blocks; /* block table (max_blocks wide) */
    int n_hashed;          /* leading full prompt blocks registered in the prefix cache */
    uint64_t hash;         /* the hash of the last of them (0: none) */
    loom_rng_t rng;
    int n_gen;
    char *text;            /* generated text; bytes [released, text_len) held back */
    size_t text_len, text_cap, released;
    double t_first;
    int chunk;             /* rows in this step's batch */
    long long batched;     /* the step that last put it in the batch */
    int n_draft;           /* drafted tokens in this step's rows (at tokens[len..len+n_draft)) */
    int spec_wait, spec_fails; /* steps before the next proposal; proposals in a row with none accepted */
    float *q;              /* draft_sampled: the drafts' distributions (speculate rows of V), or NULL */
    int q_live;            /* this step's drafts were drawn from q (else proposed with certainty) */
    void *fst;             /* the request's token filter's state (NULL: none, or not begun) */
    void (*fend)(void *);  /* ... and what frees it: kept here, since the filter itself may be
                              gone once the sample's last event is out (its owner frees it then) */
    int f_done;            /* the filter says the output is complete: end with "stop" */
    int plp_next;          /* prompt_logprobs: the next prompt position to send (1 .. n_prompt-1) */
} seq_t;

struct request {
    uint64_t id;
    loom_request_params_t p;
    int *stop_ids;
    char **stop;
    loom_engine_cb cb;
    void *ctx;
    int n_prompt, live, forked;
    seq_t **seqs;          /* (n) NULL until created (samples > 0 appear at the fork) */
    char *finished;        /* (n) */
    atomic_int cancel;
    double t_submit;
    double t_admit;        /* first admission to the running batch (0 = not yet) */
    request_t *next;
};

typedef struct {
    seq_t **v;
    int n, cap;
} seq_list_t;

struct loom_engine {
    loom_gpt_t *m;
    const loom_tokenizer_t *tok;
    loom_engine_config_t cfg;
    loom_infer_t *inf;
    loom_kv_pool_t *pool;
    int max_blocks, V, Vp, maxT;
    pthread_mutex_t mu;
    loom_engine_loop_t *loop; /* the loop that steps this engine, or NULL */
    request_t *incoming, *live; /* both under mu; live is read by the step thread freely */
    int n_live;
    uint64_t next_id;
    seq_list_t waiting, running; /* step thread only, ordered by (request id, index) */
    /* this step's batch */
    int *b_tok, *b_pos, *b_seq, *b_rows, *tables;
    unsigned char *b_prefill; /* (max_batch_tokens) 1: a prompt row (GEMM), 0: a generated token */
    seq_t **b_seqs;
    int N, S, gen_step;
    long long step_no;
    loom_step_budget_t budget;
    float *logits, *scratch;
    float *masked;         /* (V) a row with a token filter's mask applied (NULL until needed) */
    int top_ids[20];
    float top_lp[20];
    int n_plp, plp_seq[PLP_ROWS], plp_pos[PLP_ROWS]; /* this step's prompt-logprob rows: batch sequence, position scored */
    int plp_used, R0;      /* prompt rows of prompt_logprobs requests scheduled this step; logit rows before the prompt ones */
    loom_engine_stats_t st; /* counters; under mu */
    pthread_t stepper;      /* the thread that last stepped, whose team st.threads is */
    int stepper_threads;    /* the OpenMP count set on it (0 = none yet) */
};

struct loom_engine_loop {
    loom_engine_t **e;
    int n, threads;
    void (*on_step)(void *ctx, int i);
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, kicked, started;
    pthread_t thread;
};

void loom_engine_config_default(loom_engine_config_t *c) {
    *c = (loom_engine_config_t){.block_size = 16, .kv_bytes = (size_t)256 << 20, .kv_dtype = LOOM_FP32,
                                .max_batch_tokens = 512, .max_seqs = 64, .prefix_cache = 1, .prefill_ratio = 1.0};
}

const char *loom_finish_name(loom_finish_reason f) {
    static const char *const names[LOOM_FINISH_COUNT] = {"", "length", "stop", "abort"};
    return f >= 0 && f < LOOM_FINISH_COUNT ? names[f] : "";
}

void loom_request_params_default(loom_request_params_t *p) {
    *p = (loom_request_params_t){.max_tokens = 16, .temperature = 0, .top_k = 0, .top_p = 1, .n = 1, .logprobs = -1};
}

static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

loom_status loom_engine_parse_kv_memory(const char *s, size_t *bytes) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0 || !isfinite(v))
        return loom_error(LOOM_EINVAL, "--kv-memory %s: expected bytes (512M, 2G) or a share of free memory in (0, 1]", s);
    if (*end == 0 && v <= 1.0) {
        *bytes = (size_t)(v * (double)mem_available());
        return LOOM_OK;
    }
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return loom_error(LOOM_EINVAL, "--kv-memory %s: unknown suffix '%s'; use K, M or G", s, end);
    *bytes = (size_t)(v * mul);
    return LOOM_OK;
}

/* ---- lists ordered by (request id, sample index) ---- */

static int seq_before(const seq_t *a, const seq_t *b) {
    return a->req->id != b->req->id ? a->req->id < b->req->id : a->index < b->index;
}

static void list_insert(seq_list_t *l, seq_t *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        if (!l->v) loom_panic(__FILE__, __LINE__, "out of memory for the scheduler's lists");
    }
    int i = l->n++;
    while (i > 0 && seq_before(s, l->v[i - 1])) {
        l->v[i] = l->v[i - 1];
        i--;
    }
    l->v[i] = s;
}

static void list_remove(seq_list_t *l, const seq_t *s) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == s) {
            memmove(&l->v[i], &l->v[i + 1], (size_t)(l->n - i - 1) * sizeof *l->v);
            l->n--;
            return;
        }
}

/* ---- create / free ---- */

loom_status loom_engine_create(loom_engine_t **out, loom_gpt_t *m, const loom_tokenizer_t *tok,
                               const loom_engine_config_t *cfg) {
    const loom_engine_config_t *c = cfg;
    if (c->block_size < 1 || c->block_size > 256)
        return loom_error(LOOM_EINVAL, "--block-size %d: expected 1 to 256 tokens", c->block_size);
    if (c->max_batch_tokens < 1 || c->max_seqs < 1)
        return loom_error(LOOM_EINVAL, "--max-batch-tokens %d, --max-seqs %d: each must be at least 1", c->max_batch_tokens, c->max_seqs);
    if (c->speculate < 0 || c->speculate > SPEC_MAX_DRAFT)
        return loom_error(LOOM_EINVAL, "--speculate %d: expected 0 (off) to %d draft tokens", c->speculate, SPEC_MAX_DRAFT);
    if (!(c->prefill_ratio >= 0 && c->prefill_ratio <= 1000))
        return loom_error(LOOM_EINVAL, "--prefill-ratio %g: expected 0 (no limit) to 1000 decode steps' time", c->prefill_ratio);
    size_t per = loom_infer_block_bytes(&m->cfg, c->block_size, c->kv_dtype);
    size_t nb = c->kv_bytes / per;
    int maxT = c->max_context > 0 && c->max_context < m->cfg.max_seq_len ? c->max_context : m->cfg.max_seq_len;
    int need = (maxT + c->block_size - 1) / c->block_size; /* one full-context sequence */
    if (nb < (size_t)need)
        return loom_error(LOOM_EINVAL, "--kv-memory %zu bytes holds %zu blocks of %zu bytes; one sequence of the model's full context (%d tokens) needs %d: raise --kv-memory to at least %zu",
                          c->kv_bytes, nb, per, maxT, need, (size_t)need * per);
    if (nb > (1u << 30)) nb = 1u << 30;
    loom_engine_t *e = loom_calloc(1, sizeof *e);
    e->m = m;
    e->tok = tok;
    e->cfg = *c;
    e->V = m->cfg.vocab_size, e->Vp = m->cfg.padded_vocab_size, e->maxT = maxT;
    int max_logits = c->max_seqs + SPEC_MAX_SEQS * c->speculate + PLP_ROWS; /* one row per sequence, k more per drafting one */
    loom_status s = loom_infer_create(&e->inf, m, (int)nb, c->block_size, c->kv_dtype, c->max_batch_tokens,
                                      c->max_seqs, max_logits);
    if (s == LOOM_OK) loom_infer_set_weights(e->inf, &c->weights);
    if (s != LOOM_OK) {
        free(e);
        return s;
    }
    e->pool = loom_kv_pool_new((int)nb, c->block_size, c->prefix_cache, c->debug);
    e->max_blocks = loom_infer_max_blocks(e->inf);
    pthread_mutex_init(&e->mu, NULL);
    e->next_id = 1;
    loom_step_budget_init(&e->budget, c->max_batch_tokens);
    e->budget.ratio = c->prefill_ratio;
    size_t T = (size_t)c->max_batch_tokens, S = (size_t)c->max_seqs;
    e->b_tok = loom_malloc(T * sizeof(int));
    e->b_pos = loom_malloc(T * sizeof(int));
    e->b_seq = loom_malloc(T * sizeof(int));
    e->b_prefill = loom_malloc(T);
    e->b_rows = loom_malloc((size_t)max_logits * sizeof(int));
    e->tables = loom_malloc(S * (size_t)e->max_blocks * sizeof(int));
    e->b_seqs = loom_malloc(S * sizeof(seq_t *));
    e->logits = loom_malloc((size_t)max_logits * (size_t)e->Vp * sizeof(float));
    e->scratch = loom_malloc(2 * (size_t)e->V * sizeof(float));
    e->st.total_blocks = (int)nb;
    e->st.block_size = c->block_size;
    *out = e;
    return LOOM_OK;
}

/* Drop s's blocks, the last first: a prompt's first blocks are then the
 * most recently used of its cached ones, evicted last (a cached block is
 * of use only while the ones before it are cached too). */
static void release_blocks(loom_engine_t *e, seq_t *s) {
    for (int k = s->n_blocks - 1; k >= 0; k--) loom_kv_pool_release(e->pool, s->blocks[k]);
    s->n_blocks = 0;
    s->n_cached = 0;
    s->n_hashed = 0;
    s->hash = 0;
}

static void seq_free(loom_engine_t *e, seq_t *s) {
    release_blocks(e, s);
    free(s->tokens);
    free(s->blocks);
    free(s->text);
    free(s->q);
    if (s->fst) s->fend(s->fst);
    free(s);
}

static void request_free(request_t *r) {
    for (int i = 0; i < r->p.n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->seqs);
    free(r->finished);
    free(r);
}

void loom_engine_free(loom_engine_t *e) {
    if (!e) return;
    for (int pass = 0; pass < 2; pass++)
        for (request_t *r = pass ? e->live : e->incoming, *nx; r; r = nx) {
            nx = r->next;
            for (int i = 0; i < r->p.n; i++)
                if (r->seqs[i]) seq_free(e, r->seqs[i]);
            request_free(r);
        }
    free(e->waiting.v);
    free(e->running.v);
    free(e->b_tok), free(e->b_pos), free(e->b_seq), free(e->b_prefill), free(e->b_rows), free(e->tables), free(e->b_seqs);
    free(e->logits), free(e->scratch), free(e->masked);
    loom_kv_pool_free(e->pool);
    loom_infer_free(e->inf);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* ---- submit / cancel ---- */

/* Tell e's loop (if any) there is work. The flag under the loop's mutex
 * closes the gap between its last step and its wait. */
static void loop_wake(loom_engine_t *e) {
    loom_engine_loop_t *l = e->loop;
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->kicked = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static loom_status check_request(const loom_engine_t *e, const int *prompt, int np, const loom_request_params_t *p) {
    if (np < 1 || !prompt) return loom_error(LOOM_EINVAL, "empty prompt: a request needs at least one token");
    if (np > e->maxT)
        return loom_error(LOOM_EINVAL, "prompt of %d tokens is longer than the model's context (%d tokens%s)", np, e->maxT,
                          e->maxT < e->m->cfg.max_seq_len ? ", as the server's KV cache limits it: its operator can raise --kv-memory" : "");
    for (int i = 0; i < np; i++)
        if (prompt[i] < 0 || prompt[i] >= e->V)
            return loom_error(LOOM_EINVAL, "prompt token %d at position %d is outside the model's vocabulary (%d)", prompt[i], i, e->V);
    if (p->max_tokens < (p->prompt_logprobs ? 0 : 1))
        return loom_error(LOOM_EINVAL, "max_tokens %d: must be at least 1 (0 only with prompt_logprobs)", p->max_tokens);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return loom_error(LOOM_EINVAL, "temperature %g: must be 0 (greedy) or more", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) return loom_error(LOOM_EINVAL, "top_p %g: must be in (0, 1]", (double)p->top_p);
    if (p->top_k < 0) return loom_error(LOOM_EINVAL, "top_k %d: must be 0 (off) or more", p->top_k);
    if (p->n < 1 || p->n > e->cfg.max_seqs)
        return loom_error(LOOM_EINVAL, "n %d: must be 1 to --max-seqs (%d)", p->n, e->cfg.max_seqs);
    if (p->logprobs > 20) return loom_error(LOOM_EINVAL, "logprobs %d: at most 20 alternatives", p->logprobs);
    if (p->n_stop > 0 && !e->tok) return loom_error(LOOM_EINVAL, "stop strings need a tokenizer; this engine has none");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return loom_error(LOOM_EINVAL, "stop string %d is empty", i);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= e->V)
            return loom_error(LOOM_EINVAL, "stop token %d is outside the model's vocabulary (%d)", p->stop_ids[i], e->V);
    return LOOM_OK;
}

static seq_t *seq_new(loom_engine_t *e, request_t *r, int index, const int *tokens, int len) {
    seq_t *s = loom_calloc(1, sizeof *s);
    s->req = r;
    s->index = index;
    s->tokens = loom_malloc(((size_t)len + (size_t)r->p.max_tokens + 1 + SPEC_MAX_DRAFT) * sizeof(int));
    memcpy(s->tokens, tokens, (size_t)len * sizeof(int));
    s->len = len;
    s->blocks = loom_malloc((size_t)e->max_blocks * sizeof(int));
    loom_rng_seed(&s->rng, r->p.seed + (uint64_t)index);
    s->plp_next = 1;
    r->seqs[index] = s;
    return s;
}

loom_status loom_engine_submit(loom_engine_t *e, const int *prompt, int n_prompt,
                               const loom_request_params_t *p, loom_engine_cb cb, void *ctx,
                               uint64_t *id) {
    LOOM_TRY(check_request(e, prompt, n_prompt, p));
    request_t *r = loom_calloc(1, sizeof *r);
    r->p = *p;
    r->stop_ids = loom_malloc((size_t)(p->n_stop_ids + 1) * sizeof(int));
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof(int));
    r->stop = loom_calloc((size_t)p->n_stop + 1, sizeof(char *));
    for (int i = 0; i < p->n_stop; i++) r->stop[i] = loom_strdup(p->stop[i]);
    r->p.stop_ids = r->stop_ids;
    r->p.stop = (const char *const *)r->stop;
    r->cb = cb;
    r->ctx = ctx;
    r->n_prompt = n_prompt;
    r->live = p->n;
    r->forked = p->n == 1;
    r->seqs = loom_calloc((size_t)p->n, sizeof(seq_t *));
    r->finished = loom_calloc((size_t)p->n, 1);
    r->t_submit = loom_now();
    seq_new(e, r, 0, prompt, n_prompt);
    pthread_mutex_lock(&e->mu);
    uint64_t rid = r->id = e->next_id++;
    request_t **tail = &e->incoming;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    e->n_live++;
    pthread_mutex_unlock(&e->mu);
    /* From here the stepping thread may finish and free r: the id is the
     * copy taken under the lock (reading r->id here lost short requests'
     * events, their handler waiting forever). */
    if (id) *id = rid;
    loop_wake(e);
    return LOOM_OK;
}

int loom_engine_cancel(loom_engine_t *e, uint64_t id) {
    int found = -1;
    pthread_mutex_lock(&e->mu);
    for (int pass = 0; pass < 2 && found < 0; pass++)
        for (request_t *r = pass ? e->live : e->incoming; r; r = r->next)
            if (r->id == id) {
                atomic_store(&r->cancel, 1);
                found = 0;
                break;
            }
    pthread_mutex_unlock(&e->mu);
    loop_wake(e);
    return found;
}

/* ---- events and text ---- */

static void emit(loom_engine_t *e, seq_t *s, int token, const char *text, size_t n, float lp, int n_top,
                 loom_finish_reason fin) {
    request_t *r = s->req;
    loom_engine_event_t ev = {.request = r->id, .index = s->index, .token = token, .text = text ? text : "",
                              .text_len = n, .logprob = lp, .n_top = n_top, .top_ids = e->top_ids,
                              .top_logprobs = e->top_lp, .finish = fin, .n_prompt = r->n_prompt,
                              .n_generated = s->n_gen, .ttft = s->t_first > 0 ? s->t_first - r->t_submit : 0,
                              .queue_time = r->t_admit > 0 ? r->t_admit - r->t_submit : 0};
    if (r->cb) r->cb(r->ctx, &ev);
}

/* Append the token's bytes to the sample's text; returns 1 when a stop
 * string now appears (the text is cut before it). *rel receives how many
 * bytes may be released. */
static int text_add(loom_engine_t *e, seq_t *s, int token, size_t *rel) {
    size_t n = 0;
    const unsigned char *b = e->tok ? loom_tokenizer_token(e->tok, (uint32_t)token, &n) : NULL;
    if (!b) n = 0;
    if (s->text_len + n + 1 > s->text_cap) {
        s->text_cap = (s->text_len + n + 1) * 2;
        s->text = realloc(s->text, s->text_cap);
        if (!s->text) loom_panic(__FILE__, __LINE__, "out of memory for generated text");
    }
    if (n) memcpy(s->text + s->text_len, b, n);
    s->text_len += n;
    const request_t *r = s->req;
    size_t hold = 0, cut = s->text_len;
    int hit = 0;
    for (int i = 0; i < r->p.n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        /* a match can only start in the part not yet released */
        for (size_t at = s->released; at + L <= s->text_len; at++)
            if (memcmp(s->text + at, r->stop[i], L) == 0) {
                if (at < cut) cut = at;
                hit = 1;
                break;
            }
        /* the longest tail that could still grow into this stop string */
        for (size_t k = L - 1; k > hold; k--)
            if (k <= s->text_len - s->released && memcmp(s->text + s->text_len - k, r->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    if (hit) {
        s->text_len = cut;
        *rel = cut;
        return 1;
    }
    *rel = s->text_len - hold;
    return 0;
}

/* log-probabilities of the raw logits row: the chosen token's, and the
 * top n (descending) into e->top_ids / e->top_lp. */
static float logprobs(loom_engine_t *e, const float *row, int token, int n) {
    float mx = row[0];
    for (int i = 1; i < e->V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < e->V; i++) sum += exp((double)row[i] - mx);
    float lse = mx + (float)log(sum);
    for (int k = 0; k < n; k++) e->top_ids[k] = -1;
    for (int i = 0; i < e->V; i++) {
        int k = n;
        while (k > 0 && (e->top_ids[k - 1] < 0 || row[i] > row[e->top_ids[k - 1]])) k--;
        if (k == n) continue;
        memmove(&e->top_ids[k + 1], &e->top_ids[k], (size_t)(n - k - 1) * sizeof(int));
        e->top_ids[k] = i;
    }
    for (int k = 0; k < n; k++) e->top_lp[k] = row[e->top_ids[k]] - lse;
    return row[token] - lse;
}

/* ---- finishing and preemption ---- */

/* End sample s: release its blocks, take it off the lists. */
static void seq_finish(loom_engine_t *e, seq_t *s) {
    request_t *r = s->req;
    list_remove(&e->running, s);
    list_remove(&e->waiting, s);
    r->finished[s->index] = 1;
    r->seqs[s->index] = NULL;
    r->live--;
    seq_free(e, s);
}

static void preempt(loom_engine_t *e, seq_t *s) {
    release_blocks(e, s);
    s->n_draft = 0;
    list_remove(&e->running, s);
    list_insert(&e->waiting, s);
    pthread_mutex_lock(&e->mu);
    e->st.preemptions++;
    pthread_mutex_unlock(&e->mu);
}

/* Make s own private blocks for positions [n_cached, n_cached + chunk):
 * copy a shared block it will write into, add new blocks. All or nothing:
 * 0 when the pool is short (nothing changed). */
static int reserve(loom_engine_t *e, seq_t *s, int chunk) {
    int bs = e->cfg.block_size, end = s->n_cached + chunk;
    int need = (end + bs - 1) / bs - s->n_blocks, wb = s->n_cached / bs;
    int cow = wb < s->n_blocks && loom_kv_pool_refs(e->pool, s->blocks[wb]) > 1;
    if (need < 0) need = 0;
    if (loom_kv_pool_free_count(e->pool) < need + cow) return 0;
    if (cow) {
        int nb = loom_kv_pool_alloc(e->pool);
        loom_infer_copy_block(e->inf, s->blocks[wb], nb);
        loom_kv_pool_release(e->pool, s->blocks[wb]);
        s->blocks[wb] = nb;
    }
    for (int k = 0; k < need; k++) s->blocks[s->n_blocks++] = loom_kv_pool_alloc(e->pool);
    return 1;
}

/* ---- prefix cache ---- */

/* A sequence about to be admitted with no blocks (new, or preempted)
 * takes the cached blocks its prompt starts with. Only full blocks inside
 * the prompt are looked up (those are the ones registered: all their rows
 * went through the prompt kernel, so reusing them gives the same bits as
 * computing them), and the last prompt token is always left to compute
 * (its logits start the generation). */
static void prefix_lookup(loom_engine_t *e, seq_t *s) {
    int bs = e->cfg.block_size, n_prompt = s->req->n_prompt;
    int max = (s->len - 1) / bs < n_prompt / bs ? (s->len - 1) / bs : n_prompt / bs;
    uint64_t h = 0;
    while (s->n_blocks < max) {
        const int *t = s->tokens + (size_t)s->n_blocks * bs;
        uint64_t hk = loom_kv_block_hash(h, t, bs);
        int b = loom_kv_pool_lookup(e->pool, hk, h, t);
        if (b < 0) break;
        s->blocks[s->n_blocks++] = b;
        h = hk;
    }
    s->n_hashed = s->n_blocks;
    s->n_cached = s->n_blocks * bs;
    s->hash = h;
    pthread_mutex_lock(&e->mu);
    e->st.prefix_queries += s->len;
    e->st.prefix_hits += s->n_cached;
    pthread_mutex_unlock(&e->mu);
}

/* Register s's full prompt blocks computed so far. */
static void prefix_register(loom_engine_t *e, seq_t *s) {
    int bs = e->cfg.block_size, upto = s->n_cached < s->req->n_prompt ? s->n_cached : s->req->n_prompt;
    for (; (s->n_hashed + 1) * bs <= upto; s->n_hashed++) {
        const int *t = s->tokens + (size_t)s->n_hashed * bs;
        uint64_t hk = loom_kv_block_hash(s->hash, t, bs);
        loom_kv_pool_register(e->pool, s->blocks[s->n_hashed], hk, s->hash, t);
        s->hash = hk;
    }
}

/* A prefill chunk of a prompt_logprobs request: at most the prompt-logit rows left this step. */
static int plp_cap(const loom_engine_t *e, const seq_t *s, int chunk) {
    if (!s->req->p.prompt_logprobs || s->n_cached >= s->req->n_prompt) return chunk;
    return chunk < PLP_ROWS - e->plp_used ? chunk : PLP_ROWS - e->plp_used;
}

/* Put s's next `chunk` rows into the batch. */
static void batch_add(loom_engine_t *e, seq_t *s, int chunk) {
    if (s->req->p.prompt_logprobs && s->n_cached < s->req->n_prompt) e->plp_used += chunk;
    int si = e->S++;
    e->b_seqs[si] = s;
    s->chunk = chunk;
    s->batched = e->step_no;
    memcpy(e->tables + (size_t)si * e->max_blocks, s->blocks, (size_t)s->n_blocks * sizeof(int));
    for (int k = 0; k < chunk; k++, e->N++) {
        e->b_tok[e->N] = s->tokens[s->n_cached + k];
        e->b_pos[e->N] = s->n_cached + k;
        e->b_seq[e->N] = si;
        e->b_prefill[e->N] = s->n_cached + k < s->req->n_prompt;
    }
}

/* ---- the step ---- */

/* Get s its blocks for `chunk` more rows, preempting the newest running
 * sequence not yet in this step's batch while the pool is short. 1 when s
 * got them; 0 when s itself was preempted or nothing is left to preempt. */
static int reserve_or_preempt(loom_engine_t *e, seq_t *s, int chunk) {
    while (!reserve(e, s, chunk)) {
        seq_t *victim = NULL;
        for (int k = e->running.n - 1; k >= 0 && !victim; k--)
            if (e->running.v[k]->batched != e->step_no) victim = e->running.v[k];
        if (!victim) return 0;
        preempt(e, victim);
        if (victim == s) return 0;
    }
    return 1;
}

/* Prompt lookup: up to `max` tokens that followed the latest earlier
 * occurrence of s's last n tokens (n = NGRAM_MAX down to NGRAM_MIN) in its
 * prompt and output, written after its tokens (tokens[len..]). */
static int propose(seq_t *s, int max) {
    int len = s->len, *t = s->tokens;
    for (int n = NGRAM_MAX; n >= NGRAM_MIN && max > 0; n--)
        for (int at = len - n - 1; at >= 0; at--) {
            if (memcmp(t + at, t + len - n, (size_t)n * sizeof(int)) != 0) continue;
            int d = len - (at + n) < max ? len - (at + n) : max;
            memcpy(t + len, t + at + n, (size_t)d * sizeof(int)); /* [at+n, at+n+d) ends at len at most */
            return d;
        }
    return 0;
}

/* Drafts for decoding sequence s this step (0 when off, backing off, or
 * when a draft could not be used: the request's last token, the context's
 * end, the step's rows). */
static int drafts(loom_engine_t *e, seq_t *s, int spec, int budget) {
    if (!spec || s->req->p.filter) return 0;
    if (s->spec_wait > 0) {
        s->spec_wait--;
        return 0;
    }
    int max = e->cfg.speculate, left = s->req->p.max_tokens - s->n_gen - 1;
    if (left < max) max = left;
    if (e->maxT - s->len < max) max = e->maxT - s->len;
    if (budget - 1 < max) max = budget - 1;
    if (max <= 0) return 0;
    s->q_live = 0;
    if (!e->cfg.draft) return propose(s, max);
    const loom_request_params_t *p = &s->req->p;
    loom_sampling_t sp = {p->temperature, p->top_k, p->top_p};
    if (e->cfg.draft_sampled && sp.temperature > 0 && !s->q)
        s->q = loom_malloc((size_t)e->cfg.speculate * (size_t)e->V * sizeof(float));
    float *q = e->cfg.draft_sampled && sp.temperature > 0 ? s->q : NULL;
    int d = e->cfg.draft(e->cfg.draft_ctx, s->tokens, s->len, s->tokens + s->len, max, &sp, &s->rng, q);
    if (d <= 0) return propose(s, max); /* the draft model had nothing (its context is full): prompt lookup */
    s->q_live = q != NULL;
    return d > max ? max : d;
}

/* Running sequences, oldest first: those with one row left (decode) when
 * `decode`, else those with a prompt chunk left, each within *budget rows.
 * A decoding sequence may add drafted tokens when `spec`. */
static void schedule_running(loom_engine_t *e, int decode, int spec, int *budget) {
    for (int i = 0; i < e->running.n && *budget > 0; i++) {
        seq_t *s = e->running.v[i];
        int left = s->len - s->n_cached, chunk = left < *budget ? left : *budget;
        if ((left == 1) != decode || s->batched == e->step_no) continue;
        if (!decode && (chunk = plp_cap(e, s, chunk)) == 0) continue;
        s->n_draft = decode ? drafts(e, s, spec, *budget) : 0;
        if (s->n_draft && !reserve(e, s, 1 + s->n_draft)) s->n_draft = 0; /* no room: plain decode */
        chunk += s->n_draft;
        int before = e->running.n;
        if (reserve_or_preempt(e, s, chunk)) {
            batch_add(e, s, chunk);
            *budget -= chunk;
        } else {
            s->n_draft = 0;
        }
        if (e->running.n != before) i = -1; /* preempted: look again from the start (batched ones are skipped) */
    }
}

/* Then waiting sequences, first come first served: the first that does not
 * fit (sequence slots or blocks) stops admission, so none is overtaken. */
static void schedule_waiting(loom_engine_t *e, int *budget) {
    while (e->waiting.n > 0 && *budget > 0) {
        seq_t *s = e->waiting.v[0];
        int slots = s->req->forked ? 1 : s->req->p.n;
        if (e->running.n + slots > e->cfg.max_seqs) break;
        if (e->cfg.prefix_cache && s->n_blocks == 0 && !s->req->p.prompt_logprobs) prefix_lookup(e, s);
        int chunk = s->len - s->n_cached;
        if (chunk > *budget) chunk = *budget;
        if ((chunk = plp_cap(e, s, chunk)) == 0) break;
        if (!reserve(e, s, chunk)) {
            release_blocks(e, s); /* what the lookup took: cached again, for the next try */
            break;
        }
        list_remove(&e->waiting, s);
        list_insert(&e->running, s);
        if (s->req->t_admit == 0) s->req->t_admit = loom_now();
        batch_add(e, s, chunk);
        *budget -= chunk;
    }
}

/* Take new requests in; end cancelled ones. */
static void intake(loom_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    request_t **tail = &e->live;
    while (*tail) tail = &(*tail)->next;
    *tail = e->incoming;
    for (request_t *r = e->incoming; r; r = r->next) list_insert(&e->waiting, r->seqs[0]);
    e->incoming = NULL;
    pthread_mutex_unlock(&e->mu);
    for (request_t *r = e->live; r; r = r->next) {
        if (!atomic_load(&r->cancel)) continue;
        for (int i = 0; i < r->p.n; i++) {
            if (r->finished[i]) continue;
            seq_t *s = r->seqs[i], tmp = {.req = r, .index = i};
            emit(e, s ? s : &tmp, -1, s ? s->text + s->released : "", s ? s->text_len - s->released : 0, 0, 0,
                 LOOM_FINISH_CANCELLED);
            if (s) seq_finish(e, s);
            else r->finished[i] = 1, r->live--;
        }
    }
}

/* Free requests whose samples have all finished. */
static void reap(loom_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    for (request_t **pp = &e->live; *pp;) {
        request_t *r = *pp;
        if (r->live > 0) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        e->n_live--;
        e->st.requests_done++;
        request_free(r);
    }
    pthread_mutex_unlock(&e->mu);
}

/* Samples 1..n-1 of s's request, sharing s's blocks, after its prompt. */
static void fork_samples(loom_engine_t *e, seq_t *s) {
    request_t *r = s->req;
    r->forked = 1;
    for (int i = 1; i < r->p.n; i++) {
        seq_t *c = seq_new(e, r, i, s->tokens, s->len);
        c->n_cached = s->n_cached;
        c->n_hashed = s->n_hashed;
        c->hash = s->hash;
        for (int k = 0; k < s->n_blocks; k++) {
            loom_kv_pool_ref(e->pool, s->blocks[k]);
            c->blocks[c->n_blocks++] = s->blocks[k];
        }
        list_insert(&e->running, c);
    }
}

/* Append tok (chosen from `row`) to s and send its event; 1 when that
 * ended s (freed). */
static int take_token(loom_engine_t *e, seq_t *s, const float *row, int tok) {
    const loom_request_params_t *p = &s->req->p;
    int ntop = p->logprobs > 0 ? p->logprobs : 0;
    float lp = p->logprobs >= 0 ? logprobs(e, row, tok, ntop) : 0.0f;
    s->tokens[s->len++] = tok;
    s->n_gen++;
    e->gen_step++;
    if (s->t_first == 0) s->t_first = loom_now();
    loom_finish_reason fin = LOOM_FINISH_NONE;
    size_t rel = s->released;
    for (int i = 0; i < p->n_stop_ids; i++)
        if (tok == p->stop_ids[i]) fin = LOOM_FINISH_STOP;
    if (!fin && text_add(e, s, tok, &rel)) fin = LOOM_FINISH_STOP;
    if (!fin && s->f_done) fin = LOOM_FINISH_STOP, rel = s->text_len; /* the constrained output is complete */
    if (!fin && (s->n_gen >= p->max_tokens || s->len > e->maxT)) fin = LOOM_FINISH_LENGTH;
    if (fin == LOOM_FINISH_LENGTH) rel = s->text_len;
    emit(e, s, tok, s->text + s->released, rel - s->released, lp, ntop, fin);
    s->released = rel;
    if (fin) seq_finish(e, s);
    return fin != LOOM_FINISH_NONE;
}

/* A token the request's filter allows: the token sampled from the whole
 * row when the filter allows it (the common case, one check), else one
 * sampled from the row with every disallowed token and stop id masked.
 * Both give the distribution restricted to the allowed tokens (a rejected
 * draw is redrawn from the rest), with top_k/top_p taken over the allowed
 * tokens on the second path. */
static int filtered_pick(loom_engine_t *e, seq_t *s, const float *row, const loom_sampling_t *sp) {
    const loom_request_params_t *p = &s->req->p;
    if (!s->fst) s->fst = p->filter->begin(p->filter), s->fend = p->filter->end;
    int tok = loom_sample_logits(row, e->V, sp, &s->rng, e->scratch), stop = 0;
    for (int i = 0; i < p->n_stop_ids; i++) stop |= tok == p->stop_ids[i];
    if (stop || !p->filter->allowed(s->fst, tok)) {
        if (!e->masked) e->masked = loom_malloc((size_t)e->V * sizeof(float));
        memcpy(e->masked, row, (size_t)e->V * sizeof(float));
        int left = p->filter->mask(s->fst, e->masked, e->V);
        for (int i = 0; i < p->n_stop_ids; i++) left -= e->masked[p->stop_ids[i]] > -INFINITY, e->masked[p->stop_ids[i]] = -INFINITY;
        if (left <= 0) return s->f_done = 1, tok; /* no token fits (a vocabulary without some byte): end here */
        tok = loom_sample_logits(e->masked, e->V, sp, &s->rng, e->scratch);
    }
    s->f_done = p->filter->accept(s->fst, tok);
    return tok;
}

/* Sample s's next token from `row` and send its event. */
static void sample_next(loom_engine_t *e, seq_t *s, const float *row) {
    const loom_request_params_t *p = &s->req->p;
    loom_sampling_t sp = {p->temperature, p->top_k, p->top_p};
    take_token(e, s, row, p->filter ? filtered_pick(e, s, row, &sp) : loom_sample_logits(row, e->V, &sp, &s->rng, e->scratch));
}

/* s ran its last token and d drafts (rows[0..d]): row j verifies draft j
 * (loom_sample_verify_q: greedy takes it iff it is the argmax; sampled keeps
 * the target distribution); tokens are taken until one differs from its
 * draft, then one more from the row after the last accepted draft. Each
 * accepted draft's row is a valid cache entry. */
static void verify_drafts(loom_engine_t *e, seq_t *s, const float *rows) {
    const loom_request_params_t *p = &s->req->p;
    loom_sampling_t sp = {p->temperature, p->top_k, p->top_p};
    int d = s->n_draft, accepted = 0, ended = 0;
    s->n_draft = 0;
    for (int j = 0; j <= d && !ended; j++) {
        const float *row = rows + (size_t)j * e->Vp;
        int draft = j < d ? s->tokens[s->len] : -1;
        const float *q = s->q_live && j < d ? s->q + (size_t)j * e->V : NULL;
        int tok = loom_sample_verify_q(row, e->V, &sp, &s->rng, e->scratch, draft, q);
        ended = take_token(e, s, row, tok); /* frees s when it ends */
        if (tok != draft) break;
        accepted++;
        if (!ended) s->n_cached++;
    }
    if (!ended) {
        s->spec_fails = accepted ? 0 : s->spec_fails + 1;
        s->spec_wait = accepted ? 0 : 1 << (s->spec_fails < 4 ? s->spec_fails : 4);
    }
    pthread_mutex_lock(&e->mu);
    e->st.spec_drafted += d;
    e->st.spec_accepted += accepted;
    pthread_mutex_unlock(&e->mu);
}

/* The prompt rows of this step whose logits score a prompt token (after the R0 sampling rows). */
static void plp_rows(loom_engine_t *e, int *R) {
    e->n_plp = 0;
    e->R0 = *R;
    for (int i = 0, row = 0; i < e->S; row += e->b_seqs[i++]->chunk) {
        seq_t *s = e->b_seqs[i];
        if (!s->req->p.prompt_logprobs || s->n_draft) continue;
        for (int k = 0; k < s->chunk && e->n_plp < PLP_ROWS; k++) {
            int q = s->n_cached + k + 1; /* row at position q-1 scores token q */
            if (q < s->plp_next || q >= s->req->n_prompt) continue;
            e->plp_seq[e->n_plp] = i, e->plp_pos[e->n_plp++] = q;
            e->b_rows[(*R)++] = row + k;
        }
    }
}

/* Send the prompt tokens' logprobs this step computed, before any sampling. */
static void emit_prompt_logprobs(loom_engine_t *e) {
    for (int j = 0; j < e->n_plp; j++) {
        seq_t *s = e->b_seqs[e->plp_seq[j]];
        request_t *r = s->req;
        int q = e->plp_pos[j], ntop = r->p.logprobs > 0 ? r->p.logprobs : 0;
        float lp = logprobs(e, e->logits + (size_t)(e->R0 + j) * e->Vp, s->tokens[q], ntop);
        loom_engine_event_t ev = {.request = r->id, .index = s->index, .token = s->tokens[q], .text = "", .logprob = lp,
                                  .n_top = ntop, .top_ids = e->top_ids, .top_logprobs = e->top_lp, .n_prompt = r->n_prompt,
                                  .queue_time = r->t_admit > 0 ? r->t_admit - r->t_submit : 0, .prompt = 1};
        if (r->cb) r->cb(r->ctx, &ev);
        s->plp_next = q + 1;
    }
}

/* max_tokens 0 (prompt_logprobs only): every sample ends at its prompt's end. */
static void end_unsampled(loom_engine_t *e, seq_t *s) {
    request_t *r = s->req;
    r->forked = 1;
    for (int i = 1; i < r->p.n; i++) {
        seq_t tmp = {.req = r, .index = i};
        emit(e, &tmp, -1, "", 0, 0, 0, LOOM_FINISH_LENGTH);
        r->finished[i] = 1, r->live--;
    }
    emit(e, s, -1, "", 0, 0, 0, LOOM_FINISH_LENGTH);
    seq_finish(e, s);
}

/* After the forward: advance every sequence of the batch; those that
 * reached their end sample (logits row r for the r-th of them). */
static void advance(loom_engine_t *e, int *prompt_rows) {
    int r = 0;
    emit_prompt_logprobs(e);
    seq_t **done = loom_malloc((size_t)e->S * sizeof *done);
    for (int i = 0; i < e->S; i++) {
        seq_t *s = e->b_seqs[i];
        if (s->n_cached < s->req->n_prompt) *prompt_rows += s->chunk;
        s->n_cached += s->n_draft ? 1 : s->chunk; /* drafts' rows count once accepted */
        if (e->cfg.prefix_cache) prefix_register(e, s);
        done[i] = s->n_cached == s->len || s->n_draft ? s : NULL;
    }
    for (int i = 0; i < e->S; i++) {
        seq_t *s = done[i];
        if (!s) continue;
        const float *row = e->logits + (size_t)r * e->Vp;
        r += 1 + s->n_draft;
        if (s->n_draft) {
            verify_drafts(e, s, row);
        } else if (s->req->p.max_tokens == 0) { /* at the prompt's end: nothing to generate */
            end_unsampled(e, s);
        } else if (!s->req->forked) {
            fork_samples(e, s);
            request_t *q = s->req;
            for (int k = 0; k < q->p.n; k++)
                if (q->seqs[k]) sample_next(e, q->seqs[k], row);
        } else {
            sample_next(e, s, row);
        }
    }
    free(done);
}

/* Threads in a parallel region started here: the team every op gets. */
static int team_size(void) {
    int n = 0;
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}

/* The host threads the model's backend runs its ops on (be->threads); one
 * where the ops run off the host (the sampling's few loops). */
static int backend_threads(const loom_engine_t *e) { return e->m->be->threads > 0 ? e->m->be->threads : 1; }

/* OpenMP's thread count belongs to each thread: give the stepping thread
 * the backend's, and record the team it gets when the thread or the count
 * changes. */
static void set_threads(loom_engine_t *e) {
    int want = backend_threads(e);
    omp_set_num_threads(want);
    if (want == e->stepper_threads && pthread_equal(e->stepper, pthread_self())) return;
    e->stepper = pthread_self();
    e->stepper_threads = want;
    int n = team_size();
    pthread_mutex_lock(&e->mu);
    e->st.threads = n;
    pthread_mutex_unlock(&e->mu);
}

loom_status loom_engine_step(loom_engine_t *e, int *busy) {
    set_threads(e);
    intake(e);
    e->N = e->S = e->gen_step = e->plp_used = 0;
    e->step_no++;
    int budget = e->cfg.max_batch_tokens, R = 0, prompt_rows = 0;
    int decoding = 0;
    for (int i = 0; i < e->running.n; i++) decoding += e->running.v[i]->len - e->running.v[i]->n_cached == 1;
    schedule_running(e, 1, e->cfg.speculate > 0 && decoding <= SPEC_MAX_SEQS, &budget);
    int decode_rows = e->N, prefill = loom_step_budget_prefill(&e->budget, decode_rows), allowed;
    if (prefill > budget) prefill = budget;
    allowed = prefill;
    schedule_running(e, 0, 0, &prefill);
    schedule_waiting(e, &prefill);
    for (int i = 0, row = 0; i < e->S; row += e->b_seqs[i++]->chunk) {
        seq_t *s = e->b_seqs[i];
        if (s->n_draft) /* every row: each verifies the draft after it */
            for (int k = 0; k < s->chunk; k++) e->b_rows[R++] = row + k;
        else if (s->n_cached + s->chunk == s->len)
            e->b_rows[R++] = row + s->chunk - 1;
    }
    plp_rows(e, &R);
    loom_status st = LOOM_OK;
    if (e->N > 0) {
        loom_infer_batch_t b = {.n_tokens = e->N, .tokens = e->b_tok, .pos = e->b_pos, .seq = e->b_seq,
                                .n_seqs = e->S, .block_tables = e->tables, .n_logits = R, .logit_rows = e->b_rows,
                                .prefill = e->b_prefill};
        double t0 = loom_now();
        st = loom_infer_forward(e->inf, &b, e->logits);
        double dt = e->cfg.step_cost ? e->cfg.step_cost(e->cfg.step_cost_ctx, decode_rows, e->N - decode_rows)
                                     : loom_now() - t0;
        loom_step_budget_observe(&e->budget, decode_rows, e->N - decode_rows, dt);
        if (st == LOOM_OK) advance(e, &prompt_rows);
    }
    reap(e);
    pthread_mutex_lock(&e->mu);
    if (e->N > 0) {
        e->st.steps++;
        e->st.batch_rows += e->N;
        e->st.prompt_tokens += prompt_rows;
        e->st.generated_tokens += e->gen_step;
    }
    e->st.prefill_budget = allowed;
    e->st.waiting = e->waiting.n;
    e->st.running = e->running.n;
    e->st.free_blocks = loom_kv_pool_free_count(e->pool);
    e->st.cached_blocks = loom_kv_pool_cached_count(e->pool);
    if (busy) *busy = e->N > 0 || e->n_live > 0;
    pthread_mutex_unlock(&e->mu);
    return st;
}

loom_status loom_engine_run(loom_engine_t *e) {
    for (;;) {
        int busy = 0;
        LOOM_TRY(loom_engine_step(e, &busy));
        if (!busy) return LOOM_OK;
    }
}

static void *loop_main(void *arg) {
    loom_engine_loop_t *l = arg;
    omp_set_num_threads(l->n > 0 ? backend_threads(l->e[0]) : 1);
    int threads = team_size();
    pthread_mutex_lock(&l->mu);
    l->threads = threads;
    l->started = 1;
    pthread_cond_broadcast(&l->cv);
    while (!l->stop) {
        l->kicked = 0;
        pthread_mutex_unlock(&l->mu);
        int any = 0;
        for (int i = 0; i < l->n; i++) {
            int busy = 0;
            if (loom_engine_step(l->e[i], &busy) != LOOM_OK) loom_warn("engine step failed: %s", loom_errmsg());
            if (busy && l->on_step) l->on_step(l->ctx, i);
            any |= busy;
        }
        pthread_mutex_lock(&l->mu);
        while (!any && !l->stop && !l->kicked) pthread_cond_wait(&l->cv, &l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

loom_status loom_engine_loop_start(loom_engine_loop_t **out, loom_engine_t *const *engines, int n,
                                   void (*on_step)(void *ctx, int i), void *ctx) {
    for (int i = 0; i < n; i++)
        if (engines[i]->loop) return loom_error(LOOM_EINVAL, "engine %d of %d is stepped by another loop already", i, n);
    loom_engine_loop_t *l = loom_calloc(1, sizeof *l);
    l->e = loom_malloc(((size_t)n + 1) * sizeof *l->e);
    memcpy(l->e, engines, (size_t)n * sizeof *l->e);
    l->n = n;
    l->on_step = on_step;
    l->ctx = ctx;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    for (int i = 0; i < n; i++) engines[i]->loop = l;
    if (pthread_create(&l->thread, NULL, loop_main, l) != 0) {
        for (int i = 0; i < n; i++) engines[i]->loop = NULL;
        free(l->e), free(l);
        return loom_error(LOOM_ENOMEM, "cannot start the engine's step thread");
    }
    pthread_mutex_lock(&l->mu);
    while (!l->started) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    *out = l;
    return LOOM_OK;
}

int loom_engine_loop_threads(const loom_engine_loop_t *l) { return l->threads; }

void loom_engine_loop_stop(loom_engine_loop_t *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    for (int i = 0; i < l->n; i++) l->e[i]->loop = NULL;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->e);
    free(l);
}

void loom_engine_stats(loom_engine_t *e, loom_engine_stats_t *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    pthread_mutex_unlock(&e->mu);
}

loom_status loom_engine_audit(loom_engine_t *e) {
    int n = e->waiting.n + e->running.n, k = 0;
    const int **tables = loom_malloc(((size_t)n + 1) * sizeof *tables);
    int *lens = loom_malloc(((size_t)n + 1) * sizeof(int));
    for (int pass = 0; pass < 2; pass++) {
        seq_list_t *l = pass ? &e->running : &e->waiting;
        for (int i = 0; i < l->n; i++, k++) {
            tables[k] = l->v[i]->blocks;
            lens[k] = l->v[i]->n_blocks;
        }
    }
    loom_status s = loom_kv_pool_audit(e->pool, tables, lens, n);
    free(tables);
    free(lens);
    return s;
}

/* ---- event queue ---- */

typedef struct qnode {
    loom_engine_event_t ev;
    struct qnode *next;
} qnode_t;

struct loom_engine_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qnode_t *head, *tail;
};

loom_engine_queue_t *loom_engine_queue_new(void) {
    loom_engine_queue_t *q = loom_malloc(sizeof *q);
    *q = (loom_engine_queue_t){.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}; /* empty */
    return q;
}

void loom_engine_event_clear(loom_engine_event_t *ev) {
    free((void *)ev->text);
    free((void *)ev->top_ids);
    free((void *)ev->top_logprobs);
    memset(ev, 0, sizeof *ev);
}

void loom_engine_queue_free(loom_engine_queue_t *q) {
    if (!q) return;
    for (qnode_t *n = q->head, *nx; n; n = nx) {
        nx = n->next;
        loom_engine_event_clear(&n->ev);
        free(n);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

void loom_engine_queue_push(void *vq, const loom_engine_event_t *ev) {
    loom_engine_queue_t *q = vq;
    qnode_t *n = loom_calloc(1, sizeof *n);
    n->ev = *ev;
    char *t = loom_malloc(ev->text_len + 1);
    memcpy(t, ev->text, ev->text_len);
    t[ev->text_len] = 0;
    n->ev.text = t;
    int *ids = loom_malloc(((size_t)ev->n_top + 1) * sizeof(int));
    float *lps = loom_malloc(((size_t)ev->n_top + 1) * sizeof(float));
    if (ev->n_top) {
        memcpy(ids, ev->top_ids, (size_t)ev->n_top * sizeof(int));
        memcpy(lps, ev->top_logprobs, (size_t)ev->n_top * sizeof(float));
    }
    n->ev.top_ids = ids;
    n->ev.top_logprobs = lps;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = n;
    else q->head = n;
    q->tail = n;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int loom_engine_queue_pop(loom_engine_queue_t *q, loom_engine_event_t *ev, double timeout_s) {
    pthread_mutex_lock(&q->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = until.tv_sec + until.tv_nsec * 1e-9 + (timeout_s > 0 ? timeout_s : 0);
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    while (!q->head) {
        if (timeout_s < 0) pthread_cond_wait(&q->cv, &q->mu);
        else if (pthread_cond_timedwait(&q->cv, &q->mu, &until) != 0) break;
    }
    qnode_t *n = q->head;
    if (n) {
        q->head = n->next;
        if (!q->head) q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    if (!n) return 0;
    *ev = n->ev;
    free(n);
    return 1;
}
