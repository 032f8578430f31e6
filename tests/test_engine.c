/* The engine (serve/engine.h) against independent answers: greedy tokens
 * equal the argmax of the full forward pass (model/gpt.h) whether a
 * request runs alone or among 16 of mixed lengths arriving at different
 * steps, also when a small pool forces preemption and recompute (the
 * chosen tokens' log-probabilities match the full forward's there too);
 * block accounting after finished, cancelled and preempted requests; seeded
 * sampling; n samples sharing the prompt's blocks (copy-on-write) equal
 * separate requests; stop strings across token boundaries; bad input;
 * submissions from several threads to the engine's own step thread. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve/draft.h"
#include "serve/engine.h"

#define MAXT 64
#define MAXGEN 24

static loom_gpt_t *model;
static loom_tokenizer_t *bytes_tok;

static void setup(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 2);
    loom_tokenizer_bytes(&bytes_tok);
    loom_gpt_config_t c = {.max_seq_len = MAXT, .vocab_size = loom_tokenizer_vocab_size(bytes_tok),
                           .n_layer = 2, .n_head = 4, .channels = 64};
    loom_gpt_config_finish(&c);
    loom_gpt_init(&model, &c, be, 5);
    for (size_t i = 0; i < model->num_params; i++) model->params[i] *= 4.0f;
}

static void prompt_of(int *x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (int)((seed >> 8) % 200u) + 32;
    }
}

typedef struct {
    int tokens[4][MAXGEN + 1], n[4], finish[4], events;
    float lp[4][MAXGEN + 1];
    char text[4][256];
    size_t text_len[4];
} result_t;

static void collect(void *ctx, const loom_engine_event_t *ev) {
    result_t *r = ctx;
    int i = ev->index;
    r->events++;
    if (ev->token >= 0 && r->n[i] <= MAXGEN) {
        r->lp[i][r->n[i]] = ev->logprob;
        r->tokens[i][r->n[i]++] = ev->token;
    }
    memcpy(r->text[i] + r->text_len[i], ev->text, ev->text_len);
    r->text_len[i] += ev->text_len;
    if (ev->finish) r->finish[i] = ev->finish;
}

/* Step costs from a model instead of the clock, so the prefill budget and
 * with it every test's chunking is the same on any machine: 10 ms a step,
 * 0.1 ms a decode row, 0.6 ms a prompt row. Each step is recorded. */
typedef struct {
    int n, decode[256], prefill[256];
} cost_log_t;

static double model_cost(void *ctx, int decode_rows, int prefill_rows) {
    cost_log_t *log = ctx;
    if (log && log->n < 256) log->decode[log->n] = decode_rows, log->prefill[log->n++] = prefill_rows;
    return 0.010 + 0.0001 * decode_rows + 0.0006 * prefill_rows;
}

static int prefix_cache_on = 1; /* engines made from here on cache prefixes (the default) */
static int speculate_k = 0;     /* and draft this many tokens (0: off, the default) */
static double prefill_ratio = 1; /* and take this much prompt work beside decodes (1: the default) */
static int (*drafter)(void *, const int *, int, int *, int, const loom_sampling_t *, loom_rng_t *, float *); /* from here (NULL: prompt lookup) */
static void *drafter_ctx;
static int drafter_sampled; /* the drafter draws sampled drafts from a distribution it writes */

static loom_engine_t *engine_logged(size_t kv_bytes, int max_batch_tokens, cost_log_t *log) {
    loom_engine_config_t c;
    loom_engine_config_default(&c);
    c.block_size = 4;
    c.kv_bytes = kv_bytes;
    c.max_batch_tokens = max_batch_tokens;
    c.max_seqs = 16;
    c.debug = 1;
    c.step_cost = model_cost;
    c.step_cost_ctx = log;
    c.prefix_cache = prefix_cache_on;
    c.speculate = speculate_k;
    c.prefill_ratio = prefill_ratio;
    c.draft = drafter;
    c.draft_ctx = drafter_ctx;
    c.draft_sampled = drafter_sampled;
    loom_engine_t *e = NULL;
    CHECK(loom_engine_create(&e, model, bytes_tok, &c) == LOOM_OK, "create: %s", loom_errmsg());
    return e;
}

static loom_engine_t *engine(size_t kv_bytes, int max_batch_tokens) { return engine_logged(kv_bytes, max_batch_tokens, NULL); }

/* Greedy continuation by the full forward pass; log-softmax of each chosen token into lp. */
static void full_greedy(const int *prompt, int np, int n, int *out, float *lp) {
    int seq[MAXT + MAXGEN], len = np, Vp = model->cfg.padded_vocab_size, V = model->cfg.vocab_size;
    memcpy(seq, prompt, sizeof(int) * np);
    float *lg = malloc(sizeof(float) * MAXT * Vp);
    for (int i = 0; i < n && len <= MAXT; i++) {
        loom_gpt_forward(model, seq, NULL, 1, len, 0.0f, NULL);
        loom_gpt_logits(model, lg, 1, len);
        const float *r = lg + (size_t)(len - 1) * Vp;
        int best = 0;
        double sum = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[best]) best = v;
        for (int v = 0; v < V; v++) sum += exp((double)r[v] - r[best]);
        out[i] = best;
        lp[i] = (float)-log(sum);
        seq[len++] = best;
    }
    free(lg);
}

static size_t block_bytes(void) { return 2 * 2 * 4 * 64 * sizeof(float); /* L * (K,V) * bs * C */ }

/* 16 requests, lengths 1..61, arriving two per step into an engine whose
 * pool holds `blocks` blocks. With preemption, every token and
 * log-probability is the same bits as without (the results of the run
 * before): a recompute runs each position through the kernel it had. */
static void batch_of_16(int blocks, int expect_preempt) {
    loom_engine_t *e = engine(block_bytes() * (size_t)blocks, 24);
    if (!e) return;
    static result_t res[16], before[16];
    memset(res, 0, sizeof res);
    int prompts[16][MAXT], len[16];
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 12;
    p.logprobs = 0;
    for (int i = 0; i < 16; i++) {
        len[i] = 1 + (i * 37) % 50;
        prompt_of(prompts[i], len[i], 1000u + (unsigned)i);
    }
    int submitted = 0, busy = 1;
    while (busy || submitted < 16) {
        for (int k = 0; k < 2 && submitted < 16; k++, submitted++)
            CHECK(loom_engine_submit(e, prompts[submitted], len[submitted], &p, collect, &res[submitted], NULL) == LOOM_OK, "%s", loom_errmsg());
        CHECK(loom_engine_step(e, &busy) == LOOM_OK, "step: %s", loom_errmsg());
        CHECK(loom_engine_audit(e) == LOOM_OK, "audit: %s", loom_errmsg());
    }
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    CHECK(st.free_blocks == st.total_blocks, "%d of %d blocks free at the end", st.free_blocks, st.total_blocks);
    if (expect_preempt) CHECK(st.preemptions > 0, "a pool of %d blocks preempted nothing", blocks);
    printf("  pool %d blocks: %lld steps, %lld preemptions, mean batch %.1f rows\n", blocks, st.steps,
           st.preemptions, (double)st.batch_rows / (double)st.steps);
    for (int i = 0; i < 16; i++) {
        int want[MAXGEN];
        float lp[MAXGEN];
        int n = MAXT - len[i] + 1 < 12 ? MAXT - len[i] + 1 : 12;
        full_greedy(prompts[i], len[i], n, want, lp);
        CHECK(res[i].n[0] == n && res[i].finish[0] == LOOM_FINISH_LENGTH, "request %d: %d tokens (want %d), finish %d", i, res[i].n[0], n, res[i].finish[0]);
        for (int k = 0; k < n && k < res[i].n[0]; k++) {
            CHECK(res[i].tokens[0][k] == want[k], "request %d token %d: engine %d, full forward %d", i, k, res[i].tokens[0][k], want[k]);
            CHECK(fabsf(res[i].lp[0][k] - lp[k]) < 1e-4f, "request %d token %d: logprob %g vs full forward %g", i, k, (double)res[i].lp[0][k], (double)lp[k]);
        }
        if (expect_preempt)
            CHECK(memcmp(res[i].tokens, before[i].tokens, sizeof res[i].tokens) == 0 &&
                  memcmp(res[i].lp, before[i].lp, sizeof res[i].lp) == 0,
                  "request %d: other tokens or log-probability bits after preemption than without", i);
    }
    memcpy(before, res, sizeof res);
    loom_engine_free(e);
}

static void greedy_batch_equals_full_forward(void) { batch_of_16(400, 0); }
static void greedy_with_preemption(void) { batch_of_16(40, 1); }

/* Alone: one request gives the same tokens and log-probability bits as in
 * a batch: prompt rows always take the packed GEMM, whose rows do not
 * depend on the other rows, and generated tokens the row kernel, whatever
 * the chunks. With a step budget that takes every prompt whole, and with a
 * small one that cuts the prompts into other chunks in the batch (some
 * of a few rows) than alone. */
static void alone_vs_batch(int budget) {
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 10;
    p.logprobs = 0;
    int prompts[16][MAXT], len[16];
    static result_t alone[16], batch[16];
    memset(alone, 0, sizeof alone);
    memset(batch, 0, sizeof batch);
    loom_engine_t *e = engine(block_bytes() * 300, budget);
    if (!e) return;
    for (int i = 0; i < 16; i++) {
        len[i] = 3 + (i * 13) % 40;
        prompt_of(prompts[i], len[i], 7u * (unsigned)i);
        loom_engine_submit(e, prompts[i], len[i], &p, collect, &alone[i], NULL);
        loom_engine_run(e);
    }
    for (int i = 0; i < 16; i++) loom_engine_submit(e, prompts[i], len[i], &p, collect, &batch[i], NULL);
    loom_engine_run(e);
    for (int i = 0; i < 16; i++) {
        CHECK(memcmp(alone[i].tokens[0], batch[i].tokens[0], sizeof(int) * 10) == 0 && batch[i].n[0] == 10,
              "request %d: other tokens alone and in the batch", i);
        for (int k = 0; k < 10; k++)
            CHECK(memcmp(&alone[i].lp[0][k], &batch[i].lp[0][k], sizeof(float)) == 0,
                  "request %d token %d: log-probability %.9g alone, %.9g in the batch", i, k,
                  (double)alone[i].lp[0][k], (double)batch[i].lp[0][k]);
    }
    loom_engine_free(e);
}
static void alone_equals_batch_whole(void) { alone_vs_batch(512); }
static void alone_equals_batch_chunked(void) { alone_vs_batch(32); }

/* Same seed, same tokens; n = 3 samples sharing the prompt's blocks (the
 * prompt ends inside a block, so the first write copies it) equal three
 * separate requests seeded seed, seed+1, seed+2. */
static void seeded_samples_share_prompt(void) {
    loom_engine_t *e = engine(block_bytes() * 200, 64);
    if (!e) return;
    int prompt[10];
    prompt_of(prompt, 10, 99);
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 20, p.temperature = 1.0f, p.top_k = 50, p.top_p = 0.9f, p.seed = 42, p.n = 3;
    static result_t shared, sep[3], again;
    memset(&shared, 0, sizeof shared), memset(sep, 0, sizeof sep), memset(&again, 0, sizeof again);
    loom_engine_submit(e, prompt, 10, &p, collect, &shared, NULL);
    loom_engine_run(e);
    CHECK(loom_engine_audit(e) == LOOM_OK, "%s", loom_errmsg());
    p.n = 1;
    for (int i = 0; i < 3; i++) {
        p.seed = 42 + (uint64_t)i;
        loom_engine_submit(e, prompt, 10, &p, collect, &sep[i], NULL);
    }
    loom_engine_run(e);
    for (int i = 0; i < 3; i++)
        CHECK(shared.n[i] == 20 && memcmp(shared.tokens[i], sep[i].tokens[0], sizeof(int) * 20) == 0,
              "sample %d of n=3 differs from a request seeded %d", i, 42 + i);
    CHECK(memcmp(shared.tokens[0], shared.tokens[1], sizeof(int) * 20) != 0, "samples 0 and 1 are identical: seeds not applied");
    p.seed = 42;
    loom_engine_submit(e, prompt, 10, &p, collect, &again, NULL);
    loom_engine_run(e);
    CHECK(memcmp(again.tokens[0], sep[0].tokens[0], sizeof(int) * 20) == 0, "seed 42 twice gave different tokens");
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    CHECK(st.free_blocks == st.total_blocks, "%d of %d blocks free", st.free_blocks, st.total_blocks);
    loom_engine_free(e);
}

/* A stop string spanning tokens (byte-level tokenizer: every token is one
 * byte) ends the sample before it and is not returned. */
static void stop_strings(void) {
    loom_engine_t *e = engine(block_bytes() * 200, 64);
    if (!e) return;
    int prompt[6];
    prompt_of(prompt, 6, 5);
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 20;
    static result_t plain, cut, nomatch;
    memset(&plain, 0, sizeof plain), memset(&cut, 0, sizeof cut), memset(&nomatch, 0, sizeof nomatch);
    loom_engine_submit(e, prompt, 6, &p, collect, &plain, NULL);
    loom_engine_run(e);
    CHECK(plain.text_len[0] == 20, "greedy text of %zu bytes", plain.text_len[0]);
    char stop[4] = {0}, miss[3] = {plain.text[0][7], (char)(plain.text[0][8] ^ 1), 0};
    memcpy(stop, plain.text[0] + 7, 3);
    const char *stops[2] = {miss, stop};
    p.stop = stops, p.n_stop = 2;
    loom_engine_submit(e, prompt, 6, &p, collect, &cut, NULL);
    loom_engine_run(e);
    /* the first occurrence of stop may come earlier than byte 7 */
    size_t at = 0;
    while (memcmp(plain.text[0] + at, stop, 3) != 0) at++;
    CHECK(cut.finish[0] == LOOM_FINISH_STOP, "finish %d, want stop", cut.finish[0]);
    CHECK(cut.text_len[0] == at && memcmp(cut.text[0], plain.text[0], at) == 0, "text of %zu bytes before the stop string, want %zu", cut.text_len[0], at);
    const char *never[1] = {"\x01\x02\x03\x04"};
    p.stop = never, p.n_stop = 1;
    loom_engine_submit(e, prompt, 6, &p, collect, &nomatch, NULL);
    loom_engine_run(e);
    CHECK(nomatch.text_len[0] == 20 && memcmp(nomatch.text[0], plain.text[0], 20) == 0, "an unmatched stop string changed the text");
    int stop_id = plain.tokens[0][4];
    p.n_stop = 0, p.stop_ids = &stop_id, p.n_stop_ids = 1;
    memset(&cut, 0, sizeof cut);
    loom_engine_submit(e, prompt, 6, &p, collect, &cut, NULL);
    loom_engine_run(e);
    int first = 0;
    while (plain.tokens[0][first] != stop_id) first++;
    CHECK(cut.finish[0] == LOOM_FINISH_STOP && cut.text_len[0] == (size_t)first, "stop id: %zu bytes, want %d", cut.text_len[0], first);
    loom_engine_free(e);
}

/* Bad requests are refused with a message while a good one goes on. */
static void bad_input_keeps_serving(void) {
    loom_engine_t *e = engine(block_bytes() * 200, 64);
    if (!e) return;
    int good[8], big[MAXT + 1], outside[3] = {5, 100000, 7};
    prompt_of(good, 8, 3);
    prompt_of(big, MAXT + 1, 4);
    loom_request_params_t p, q;
    loom_request_params_default(&p);
    p.max_tokens = 15;
    static result_t r;
    memset(&r, 0, sizeof r);
    loom_engine_submit(e, good, 8, &p, collect, &r, NULL);
    loom_engine_step(e, NULL);
    struct {
        const char *what, *msg;
        int np;
        const int *prompt;
        loom_request_params_t p;
    } bad[7];
    for (int i = 0; i < 7; i++) bad[i].p = p, bad[i].np = 8, bad[i].prompt = good;
    bad[0].what = "long prompt", bad[0].msg = "longer than the model's context", bad[0].np = MAXT + 1, bad[0].prompt = big;
    bad[1].what = "empty prompt", bad[1].msg = "empty prompt", bad[1].np = 0;
    bad[2].what = "token id", bad[2].msg = "outside the model's vocabulary", bad[2].np = 3, bad[2].prompt = outside;
    bad[3].what = "max_tokens 0", bad[3].msg = "max_tokens 0", bad[3].p.max_tokens = 0;
    bad[4].what = "max_tokens -3", bad[4].msg = "max_tokens -3", bad[4].p.max_tokens = -3;
    bad[5].what = "top_p 1.5", bad[5].msg = "top_p", bad[5].p.top_p = 1.5f;
    bad[6].what = "temperature -1", bad[6].msg = "temperature", bad[6].p.temperature = -1;
    for (int i = 0; i < 7; i++) {
        loom_status s = loom_engine_submit(e, bad[i].prompt, bad[i].np, &bad[i].p, collect, &r, NULL);
        CHECK(s == LOOM_EINVAL && strstr(loom_errmsg(), bad[i].msg), "%s: status %d, message '%s'", bad[i].what, s, loom_errmsg());
        loom_engine_step(e, NULL);
    }
    q = p, q.top_p = 0;
    CHECK(loom_engine_submit(e, good, 8, &q, collect, &r, NULL) == LOOM_EINVAL, "top_p 0 accepted");
    loom_engine_run(e);
    int want[15];
    float lp[15];
    full_greedy(good, 8, 15, want, lp);
    CHECK(r.n[0] == 15 && memcmp(r.tokens[0], want, sizeof want) == 0, "the good request's tokens changed (%d of them)", r.n[0]);
    loom_engine_free(e);
}

/* Cancelled requests (waiting, prefilling, decoding) end with CANCELLED
 * and every block comes back. */
static void cancel_returns_blocks(void) {
    loom_engine_t *e = engine(block_bytes() * 60, 16);
    if (!e) return;
    static result_t r[8];
    memset(r, 0, sizeof r);
    uint64_t id[8];
    int prompt[40];
    prompt_of(prompt, 40, 8);
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 20;
    p.n = 2, p.temperature = 0.7f;
    for (int i = 0; i < 8; i++) loom_engine_submit(e, prompt, 10 + 4 * i, &p, collect, &r[i], &id[i]);
    for (int s = 0; s < 6; s++) loom_engine_step(e, NULL);
    for (int i = 0; i < 8; i += 2) CHECK(loom_engine_cancel(e, id[i]) == 0, "cancel %d", i);
    loom_engine_run(e);
    CHECK(loom_engine_cancel(e, id[1]) == -1, "cancelling a finished request succeeded");
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 2; k++)
            CHECK(r[i].finish[k] == (i % 2 ? LOOM_FINISH_LENGTH : LOOM_FINISH_CANCELLED), "request %d sample %d finish %d", i, k, r[i].finish[k]);
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    CHECK(st.free_blocks == st.total_blocks && st.running == 0 && st.waiting == 0, "%d of %d blocks free, %d running, %d waiting", st.free_blocks, st.total_blocks, st.running, st.waiting);
    CHECK(loom_engine_audit(e) == LOOM_OK, "%s", loom_errmsg());
    loom_engine_free(e);
}

/* Four client threads submit to the engine's step thread and read their
 * events from queues; tokens equal the full forward's. */
typedef struct {
    loom_engine_t *e;
    int k, ok, tokens[8];
} client_t;

static void *client(void *arg) {
    client_t *c = arg;
    loom_engine_queue_t *q = loom_engine_queue_new();
    int prompt[20], got[8], n = 0;
    prompt_of(prompt, 11 + c->k, 50u + (unsigned)c->k);
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 8;
    c->ok = loom_engine_submit(c->e, prompt, 11 + c->k, &p, loom_engine_queue_push, q, NULL) == LOOM_OK;
    loom_engine_event_t ev;
    while (c->ok && loom_engine_queue_pop(q, &ev, 600.0)) { /* a guard only: the finish event ends it */
        int fin = ev.finish;
        if (ev.token >= 0 && n < 8) got[n++] = ev.token;
        loom_engine_event_clear(&ev);
        if (fin) break;
    }
    loom_engine_queue_free(q);
    if (n != 8) c->ok = 0;
    else memcpy(c->tokens, got, sizeof got);
    return NULL;
}

static void threads_and_queues(void) {
    loom_engine_t *e = engine(block_bytes() * 200, 64);
    if (!e) return;
    loom_engine_loop_t *loop = NULL;
    CHECK(loom_engine_loop_start(&loop, &e, 1, NULL, NULL) == LOOM_OK, "%s", loom_errmsg());
    client_t c[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        c[k] = (client_t){.e = e, .k = k};
        pthread_create(&th[k], NULL, client, &c[k]);
    }
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    loom_engine_loop_stop(loop);
    loom_engine_free(e);
    for (int k = 0; k < 4; k++) {
        int prompt[20], want[8];
        float lp[8];
        prompt_of(prompt, 11 + k, 50u + (unsigned)k);
        full_greedy(prompt, 11 + k, 8, want, lp);
        CHECK(c[k].ok && memcmp(c[k].tokens, want, sizeof want) == 0, "client %d: ok %d, tokens differ from the full forward", k, c[k].ok);
    }
}

/* Steady decode while a prompt arrives: four requests decode, then a
 * 60-token prompt comes. Under the cost model a prompt row costs 0.6 ms
 * beside a 10 ms decode step, so the budget lets 11 (first estimate, from
 * the prefill-only step) to 17 prompt rows in per step (at least min_rows
 * 8): the prompt is spread over 4 to 6 steps (it took one step of 60 rows
 * before the budget), every one of them carries all four decodes, and
 * every answer equals the full forward's. */
/* A 60-token prompt arrives while 4 sequences decode: at --prefill-ratio
 * 1 (the default) the budget spreads it over 4 to 6 steps of 8-20 rows
 * beside all 4 decodes; at 0 it takes one step (its 60 rows fit the 512
 * cap). Every request's tokens are the full forward's either way. */
static void prompt_beside_decodes(double ratio) {
    prefill_ratio = ratio;
    cost_log_t log = {0};
    loom_engine_t *e = engine_logged(block_bytes() * 200, 512, &log);
    prefill_ratio = 1;
    if (!e) return;
    static result_t res[5];
    memset(res, 0, sizeof res);
    int prompts[5][MAXT], len[5] = {6, 7, 8, 9, 60};
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 14;
    for (int i = 0; i < 5; i++) prompt_of(prompts[i], len[i], 300u + (unsigned)i);
    for (int i = 0; i < 4; i++) loom_engine_submit(e, prompts[i], len[i], &p, collect, &res[i], NULL);
    for (int k = 0; k < 3; k++) loom_engine_step(e, NULL);
    int first = log.n;
    p.max_tokens = 4;
    loom_engine_submit(e, prompts[4], len[4], &p, collect, &res[4], NULL);
    for (int busy = 1; busy;) {
        CHECK(loom_engine_step(e, &busy) == LOOM_OK, "%s", loom_errmsg());
        CHECK(loom_engine_audit(e) == LOOM_OK, "audit: %s", loom_errmsg());
    }
    int spread = 0, rows = 0;
    for (int k = first; k < log.n && rows < 60; k++) {
        CHECK(log.decode[k] == 4, "step %d: %d decode rows beside %d prompt rows, want all 4 decodes", k,
              log.decode[k], log.prefill[k]);
        CHECK(ratio == 0 || (log.prefill[k] <= 20 && (log.prefill[k] >= 8 || rows + log.prefill[k] == 60)),
              "step %d: %d prompt rows, want the budget's 8-20 (or the rest)", k, log.prefill[k]);
        rows += log.prefill[k];
        spread++;
    }
    if (ratio == 0) CHECK(rows == 60 && spread == 1, "ratio 0: the 60-token prompt took %d steps (%d rows), want 1", spread, rows);
    else CHECK(rows == 60 && spread >= 4 && spread <= 6, "the 60-token prompt took %d steps (%d rows), want 4 to 6", spread, rows);
    for (int i = 0; i < 5; i++) {
        int want[MAXGEN];
        float lp[MAXGEN];
        int n = i < 4 ? 14 : 4;
        full_greedy(prompts[i], len[i], n, want, lp);
        CHECK(res[i].n[0] == n && memcmp(res[i].tokens[0], want, sizeof(int) * (size_t)n) == 0,
              "request %d: %d tokens, not the full forward's", i, res[i].n[0]);
    }
    loom_engine_free(e);
}
static void prompt_spread_over_steps(void) { prompt_beside_decodes(1); }
static void prompt_whole_at_ratio_zero(void) { prompt_beside_decodes(0); }

/* Submit prompts[i] (len[i] tokens) for i in [from, to) at once and step
 * until done, auditing the blocks after every step. */
static void wave(loom_engine_t *e, int prompts[][MAXT], const int *len, int from, int to,
                 const loom_request_params_t *p, result_t *res) {
    for (int i = from; i < to; i++)
        CHECK(loom_engine_submit(e, prompts[i], len[i], p, collect, &res[i], NULL) == LOOM_OK, "%s", loom_errmsg());
    for (int busy = 1; busy;) {
        CHECK(loom_engine_step(e, &busy) == LOOM_OK, "%s", loom_errmsg());
        CHECK(loom_engine_audit(e) == LOOM_OK, "audit: %s", loom_errmsg());
    }
}

static long long hits_of(loom_engine_t *e) {
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    return st.prefix_hits;
}

/* Prefix caching: requests sharing a 24-token prefix (6 blocks of 4) with
 * one that ran before give the same tokens and log-probability bits as
 * an engine without the cache, sampled ones (n = 2) included. Hits, in
 * tokens: P + 9 others shares 6 blocks (24), P itself 5 (its last token is
 * always computed: 20), 10 tokens of P then others 2 (8), an unrelated
 * prompt 0, the first request again 7 (28). */
static void prefix_cache_equals_no_cache(void) {
    int prompts[6][MAXT], len[6] = {29, 33, 24, 21, 20, 29};
    for (int i = 0; i < 6; i++) prompt_of(prompts[i], len[i], 500u + (unsigned)i);
    for (int i = 0; i < 24; i++) prompts[1][i] = prompts[2][i] = prompts[0][i];
    for (int i = 0; i < 10; i++) prompts[3][i] = prompts[0][i];
    memcpy(prompts[5], prompts[0], sizeof prompts[0]);
    static result_t res[2][6];
    memset(res, 0, sizeof res);
    long long hits[2] = {0, 0};
    for (int on = 0; on < 2; on++) {
        prefix_cache_on = on;
        loom_engine_t *e = engine(block_bytes() * 200, 512);
        prefix_cache_on = 1;
        if (!e) return;
        loom_request_params_t p;
        loom_request_params_default(&p);
        p.max_tokens = 8;
        p.logprobs = 0;
        wave(e, prompts, len, 0, 1, &p, res[on]);
        wave(e, prompts, len, 1, 5, &p, res[on]);
        p.n = 2, p.temperature = 0.8f, p.seed = 11;
        wave(e, prompts, len, 5, 6, &p, res[on]);
        hits[on] = hits_of(e);
        loom_engine_stats_t st;
        loom_engine_stats(e, &st);
        CHECK(st.free_blocks == st.total_blocks, "cache %s: %d of %d blocks free or cached at the end", on ? "on" : "off",
              st.free_blocks, st.total_blocks);
        loom_engine_free(e);
    }
    CHECK(hits[0] == 0 && hits[1] == 24 + 20 + 8 + 0 + 28, "prefix cache hits: %lld off, %lld on (want 0 and 80 tokens)",
          hits[0], hits[1]);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < (i == 5 ? 2 : 1); j++)
            CHECK(res[0][i].n[j] == 8 && memcmp(res[0][i].tokens[j], res[1][i].tokens[j], sizeof res[0][i].tokens[j]) == 0 &&
                  memcmp(res[0][i].lp[j], res[1][i].lp[j], sizeof res[0][i].lp[j]) == 0,
                  "request %d sample %d: other tokens or log-probability bits with the prefix cache", i, j);
}

/* Under memory pressure cached blocks nobody holds are evicted, least
 * recently used first, and a prompt's last blocks before its first ones
 * (they are released last first). A pool of 40 blocks: X (40 tokens)
 * leaves 10 cached blocks; three 44-token prompts run after it need 36
 * blocks beside their 11 cached each, so the third evicts 4 of X's, its
 * last. X again finds its first 6 blocks (24 tokens); the third flood
 * prompt again finds all it may (10 blocks, 40 tokens). Every answer
 * equals a cache-off engine's (bits), blocks audited after every step. */
static void prefix_cache_evicts_lru(void) {
    int prompts[6][MAXT], len[6] = {40, 44, 44, 44, 40, 44};
    for (int i = 0; i < 6; i++) prompt_of(prompts[i], len[i], 900u + (unsigned)i);
    memcpy(prompts[4], prompts[0], sizeof prompts[0]);
    memcpy(prompts[5], prompts[3], sizeof prompts[3]);
    static result_t res[2][6];
    memset(res, 0, sizeof res);
    long long got[2][6];
    for (int on = 0; on < 2; on++) {
        prefix_cache_on = on;
        loom_engine_t *e = engine(block_bytes() * 40, 512);
        prefix_cache_on = 1;
        if (!e) return;
        loom_request_params_t p;
        loom_request_params_default(&p);
        p.max_tokens = 4;
        p.logprobs = 0;
        for (int i = 0; i < 6; i++) {
            long long h = hits_of(e);
            wave(e, prompts, len, i, i + 1, &p, res[on]);
            got[on][i] = hits_of(e) - h;
        }
        loom_engine_free(e);
    }
    CHECK(got[1][4] == 24 && got[1][5] == 40, "hits of X again %lld (want 24), of the third flood prompt again %lld (want 40)",
          got[1][4], got[1][5]);
    for (int i = 0; i < 6; i++)
        CHECK(memcmp(res[0][i].tokens, res[1][i].tokens, sizeof res[0][i].tokens) == 0 &&
              memcmp(res[0][i].lp, res[1][i].lp, sizeof res[0][i].lp) == 0,
              "request %d: other tokens or log-probability bits with the prefix cache", i);
}

/* Requests 0..5 with drafts (res[1]) gave plain decoding's (res[0]) tokens,
 * finish reasons and log-probability bits. */
static void same_as_plain(result_t res[2][6]) {
    for (int i = 0; i < 6; i++)
        CHECK(res[0][i].n[0] == res[1][i].n[0] && res[0][i].finish[0] == res[1][i].finish[0] &&
              memcmp(res[0][i].tokens, res[1][i].tokens, sizeof res[0][i].tokens) == 0 &&
              memcmp(res[0][i].lp, res[1][i].lp, sizeof res[0][i].lp) == 0,
              "request %d: %d tokens (finish %d) with drafts, %d (finish %d) without, or other bits", i, res[1][i].n[0],
              res[1][i].finish[0], res[0][i].n[0], res[0][i].finish[0]);
}

/* Speculative decoding by prompt lookup (4 drafts) gives the greedy tokens
 * and log-probability bits of plain decoding: prompts that repeat a
 * pattern (drafts proposed; this random model rarely follows them) and
 * plain ones, one ending on a stop id. Accepted runs are the next case's. */
static void speculative_greedy_equals_plain(void) {
    int prompts[6][MAXT], len[6] = {30, 24, 17, 33, 12, 40};
    for (int i = 0; i < 6; i++) prompt_of(prompts[i], len[i], 700u + (unsigned)i);
    for (int i = 0; i < 3; i++)
        for (int k = 5; k < len[i]; k++) prompts[i][k] = prompts[i][k % (3 + i)]; /* a repeating pattern */
    static result_t res[2][6];
    memset(res, 0, sizeof res);
    loom_engine_stats_t st[2];
    int stop = -1;
    for (int on = 0; on < 2; on++) {
        speculate_k = on ? 4 : 0;
        loom_engine_t *e = engine(block_bytes() * 200, 512);
        speculate_k = 0;
        if (!e) return;
        loom_request_params_t p;
        loom_request_params_default(&p);
        p.max_tokens = 20;
        p.logprobs = 0;
        wave(e, prompts, len, 0, 5, &p, res[on]);
        if (!on) stop = res[0][0].tokens[0][9]; /* a token plain decoding makes: the stop id */
        p.stop_ids = &stop, p.n_stop_ids = 1;
        wave(e, prompts, len, 5, 6, &p, res[on]);
        loom_engine_stats(e, &st[on]);
        loom_engine_free(e);
    }
    printf("  speculative: %lld drafted, %lld accepted\n", st[1].spec_drafted, st[1].spec_accepted);
    CHECK(st[0].spec_drafted == 0 && st[1].spec_drafted > 0, "drafts: %lld off, %lld on", st[0].spec_drafted,
          st[1].spec_drafted);
    same_as_plain(res);
}

/* Drafts from the answers plain decoding gave (an oracle: every draft is
 * right), except that every third proposal gets its second token wrong:
 * long accepted runs, bonus tokens, rejections in the middle; one request
 * ends on a stop id, one on max_tokens inside a run of drafts. Tokens,
 * finish reasons and log-probability bits equal plain decoding's, in
 * fewer steps. */
typedef struct {
    int (*prompts)[MAXT];
    const int *len;
    result_t *plain;
    int n, calls;
} oracle_t;

static int oracle_draft(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                        loom_rng_t *rng, float *q) {
    oracle_t *o = ctx;
    for (int i = 0; i < o->n; i++) {
        int np = o->len[i], ng = len - np;
        if (ng < 0 || ng >= o->plain[i].n[0] || memcmp(tokens, o->prompts[i], sizeof(int) * np) != 0 ||
            memcmp(tokens + np, o->plain[i].tokens[0], sizeof(int) * ng) != 0)
            continue;
        int d = 0;
        while (d < max && ng + d < o->plain[i].n[0]) out[d] = o->plain[i].tokens[0][ng + d], d++;
        if (++o->calls % 3 == 0 && d > 1) out[1] = (out[1] + 1) % 256;
        return d;
    }
    return 0;
}

static void speculative_oracle_drafts(void) {
    int prompts[6][MAXT], len[6] = {14, 12, 17, 13, 12, 20};
    for (int i = 0; i < 6; i++) prompt_of(prompts[i], len[i], 800u + (unsigned)i);
    static result_t res[2][6];
    memset(res, 0, sizeof res);
    oracle_t o = {prompts, len, res[0], 6, 0};
    loom_engine_stats_t st;
    for (int on = 0; on < 2; on++) {
        speculate_k = on ? 5 : 0, drafter = oracle_draft, drafter_ctx = &o;
        loom_engine_t *e = engine(block_bytes() * 200, 512);
        speculate_k = 0, drafter = NULL, drafter_ctx = NULL;
        if (!e) return;
        loom_request_params_t p;
        loom_request_params_default(&p);
        p.max_tokens = MAXGEN;
        p.logprobs = 0;
        wave(e, prompts, len, 0, 4, &p, res[on]);
        int want[MAXGEN];
        float lp[MAXGEN];
        full_greedy(prompts[4], len[4], 8, want, lp);
        int stop = want[7]; /* ends request 4 on a token it makes (or the first earlier one equal to it) */
        p.stop_ids = &stop, p.n_stop_ids = 1;
        p.max_tokens = 11; /* request 5 ends on max_tokens inside a run of drafts */
        wave(e, prompts, len, 4, 6, &p, res[on]);
        loom_engine_stats(e, &st);
        loom_engine_free(e);
    }
    printf("  oracle drafts: %lld drafted, %lld accepted in %lld steps\n", st.spec_drafted, st.spec_accepted, st.steps);
    CHECK(st.spec_accepted > st.spec_drafted / 2 && st.spec_accepted < st.spec_drafted && st.steps < 16,
          "%lld of %lld drafts accepted in %lld steps", st.spec_accepted, st.spec_drafted, st.steps);
    same_as_plain(res);
}

/* Sampled with drafts: the first two tokens (t1, t2) of 2000 requests with
 * top_k 3 at temperature 1.5, a draft always proposed for t2 (the same
 * token whatever t1: accepted about a tenth of the time), follow the
 * model's distribution p(t1) p(t2 | t1) computed by the full forward
 * (chi-squared, p = 0.001, fixed seeds: the same result on every run). */
static int fixed_draft(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                       loom_rng_t *rng, float *q) {
    out[0] = *(const int *)ctx;
    return max > 0;
}

/* The top_k 3 distribution at temperature T of the full forward's last row. */
static void top3(const int *seq, int len, double T, int *ids, double *p) {
    int Vp = model->cfg.padded_vocab_size, V = model->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * MAXT * Vp);
    loom_gpt_forward(model, seq, NULL, 1, len, 0.0f, NULL);
    loom_gpt_logits(model, lg, 1, len);
    const float *r = lg + (size_t)(len - 1) * Vp;
    for (int k = 0; k < 3; k++) {
        ids[k] = -1;
        for (int v = 0; v < V; v++)
            if ((k == 0 || (v != ids[0] && (k == 1 || v != ids[1]))) && (ids[k] < 0 || r[v] > r[ids[k]])) ids[k] = v;
    }
    double z = 0;
    for (int k = 0; k < 3; k++) z += p[k] = exp((r[ids[k]] - r[ids[0]]) / T);
    for (int k = 0; k < 3; k++) p[k] /= z;
    free(lg);
}

/* The distribution check with drafts from `draft` (ctx, sampled: see
 * drafter_sampled; NULL ctx: the fixed draft below). */
static void sampling_distribution_with(int (*draft)(void *, const int *, int, int *, int, const loom_sampling_t *,
                                                    loom_rng_t *, float *),
                                       void *ctx, int sampled) {
    int prompt[MAXT], np = 10, ids1[3], ids2[3][3];
    double p1[3], p2[3][3];
    prompt_of(prompt, np, 4242u);
    top3(prompt, np, 1.5, ids1, p1);
    for (int a = 0; a < 3; a++) {
        prompt[np] = ids1[a];
        top3(prompt, np + 1, 1.5, ids2[a], p2[a]);
    }
    int D = ids2[0][1];
    speculate_k = 1, drafter = draft, drafter_ctx = ctx ? ctx : &D, drafter_sampled = sampled;
    loom_engine_t *e = engine(block_bytes() * 300, 512);
    speculate_k = 0, drafter = NULL, drafter_ctx = NULL, drafter_sampled = 0;
    if (!e) return;
    enum { N = 2000 };
    static result_t res[16];
    int count[3][3] = {{0}}, other = 0;
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 3, p.temperature = 1.5f, p.top_k = 3;
    for (int done = 0; done < N; done += 8) { /* 8 at a time: drafts are made for at most 8 */
        memset(res, 0, sizeof res);
        for (int k = 0; k < 8; k++) {
            p.seed = 7919u * (uint64_t)(done + k) + 17;
            loom_engine_submit(e, prompt, np, &p, collect, &res[k], NULL);
        }
        loom_engine_run(e);
        for (int k = 0; k < 8 && done + k < N; k++) {
            int a = -1, b = -1;
            for (int j = 0; j < 3; j++) a = res[k].tokens[0][0] == ids1[j] ? j : a;
            for (int j = 0; j < 3 && a >= 0; j++) b = res[k].tokens[0][1] == ids2[a][j] ? j : b;
            if (a < 0 || b < 0) other++;
            else count[a][b]++;
        }
    }
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    loom_engine_free(e);
    double chi2 = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            double want = N * p1[a] * p2[a][b];
            chi2 += (count[a][b] - want) * (count[a][b] - want) / want;
        }
    printf("  %lld drafts, %lld accepted; chi-squared %.2f over 9 cells\n", st.spec_drafted, st.spec_accepted, chi2);
    CHECK(other == 0, "%d samples outside the top 3", other);
    CHECK(st.spec_drafted >= N && st.spec_accepted > 0, "%lld drafts, %lld accepted", st.spec_drafted, st.spec_accepted);
    CHECK(chi2 < 26.12, "chi-squared %.2f over 9 cells (8 degrees of freedom, critical 26.12 at p = 0.001)", chi2);
}

static void speculative_sampling_distribution(void) { sampling_distribution_with(fixed_draft, NULL, 0); }

/* Drafts drawn from a distribution q of their own, which the target
 * accepts with min(1, p/q) and else replaces from max(0, p - q): q puts
 * 0.4, 0.3, 0.2, 0.1 on four tokens, two of them outside the target's
 * top 3 (p = 0: always replaced). */
static int q_draft(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                   loom_rng_t *rng, float *q) {
    const int *ids = ctx;
    static const float w[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    if (max < 1 || !q) return 0;
    float u = loom_rng_uniform(rng), acc = 0;
    int k = 0;
    while (k < 3 && u >= (acc += w[k])) k++;
    memset(q, 0, sizeof(float) * (size_t)model->cfg.vocab_size);
    for (int j = 0; j < 4; j++) q[ids[j]] = w[j];
    out[0] = ids[k];
    return 1;
}

static void speculative_sampled_drafts_distribution(void) {
    int prompt[MAXT], ids1[3], ids2[3];
    double p1[3], p2[3];
    prompt_of(prompt, 10, 4242u);
    top3(prompt, 10, 1.5, ids1, p1);
    prompt[10] = ids1[0];
    top3(prompt, 11, 1.5, ids2, p2);
    int none[2], nn = 0;
    for (int v = 0; v < model->cfg.vocab_size && nn < 2; v++) { /* two tokens in no top 3 of t2 */
        int in = 0;
        for (int a = 0; a < 3; a++) {
            int ids[3];
            double p[3];
            prompt[10] = ids1[a];
            top3(prompt, 11, 1.5, ids, p);
            in |= v == ids[0] || v == ids[1] || v == ids[2];
        }
        if (!in) none[nn++] = v;
    }
    int q_ids[4] = {ids2[0], none[0], ids2[1], none[1]};
    sampling_distribution_with(q_draft, q_ids, 1);
}

/* A draft model (serve/draft.h) proposing 4 tokens: greedy tokens,
 * finish reasons and log-probability bits equal plain decoding's, with a
 * small draft of another init and a shorter context (past it, prompt
 * lookup proposes), and with the target itself as its own draft (every
 * draft accepted: the draft's cache slots follow the sequences). Then the
 * sampled distribution check with drafts drawn from the q of a draft near
 * the target. */
static void greedy_with_draft_model(loom_gpt_t *dm, int self) {
    loom_draft_t *d = NULL;
    CHECK(loom_draft_create(&d, dm, NULL, model->cfg.vocab_size, 4) == LOOM_OK, "%s", loom_errmsg());
    if (!d) return;
    int prompts[6][MAXT], len[6] = {30, 24, 17, 33, 12, 8};
    for (int i = 0; i < 6; i++) prompt_of(prompts[i], len[i], 900u + (unsigned)i);
    static result_t res[2][6];
    memset(res, 0, sizeof res);
    loom_engine_stats_t st;
    for (int on = 0; on < 2; on++) {
        speculate_k = on ? 4 : 0, drafter = loom_draft_propose, drafter_ctx = d, drafter_sampled = 1;
        loom_engine_t *e = engine(block_bytes() * 200, 512);
        speculate_k = 0, drafter = NULL, drafter_ctx = NULL, drafter_sampled = 0;
        if (!e) break;
        loom_request_params_t p;
        loom_request_params_default(&p);
        p.max_tokens = MAXGEN;
        p.logprobs = 0;
        wave(e, prompts, len, 0, 6, &p, res[on]);
        loom_engine_stats(e, &st);
        loom_engine_free(e);
    }
    printf("  %s draft: %lld drafted, %lld accepted in %lld steps\n", self ? "the target as its own" : "a small", st.spec_drafted,
           st.spec_accepted, st.steps);
    CHECK(st.spec_drafted > 0 && (!self || st.spec_accepted == st.spec_drafted), "%lld of %lld drafts accepted",
          st.spec_accepted, st.spec_drafted);
    same_as_plain(res);
    loom_draft_free(d);
}

static void speculative_draft_model(void) {
    loom_gpt_config_t c = {.max_seq_len = 40, .vocab_size = model->cfg.vocab_size, .n_layer = 1, .n_head = 2, .channels = 32};
    loom_gpt_config_finish(&c);
    loom_gpt_t *dm = NULL;
    loom_gpt_init(&dm, &c, model->be, 9);
    for (size_t i = 0; i < dm->num_params; i++) dm->params[i] *= 4.0f;
    greedy_with_draft_model(dm, 0);
    greedy_with_draft_model(model, 1);
    loom_gpt_free(dm);
    /* sampled: a draft near the target (its weights scaled by 0.85), so some drafts are accepted */
    loom_gpt_init(&dm, &model->cfg, model->be, 5);
    for (size_t i = 0; i < dm->num_params; i++) dm->params[i] = model->params[i] * 0.85f;
    loom_draft_t *d = NULL;
    CHECK(loom_draft_create(&d, dm, NULL, model->cfg.vocab_size, 8) == LOOM_OK, "%s", loom_errmsg());
    if (d) sampling_distribution_with(loom_draft_propose, d, 1);
    loom_draft_free(d);
    loom_gpt_free(dm);
}

/* A draft of another tokenizer (here: none, or another vocabulary size) is
 * refused naming both. */
static void draft_tokenizer_refused(void) {
    CHECK(loom_draft_check_tokenizer(bytes_tok, 256, "runs/same", bytes_tok, 256, "runs/target") == LOOM_OK, "%s", loom_errmsg());
    for (int k = 0; k < 2; k++) {
        loom_status st = loom_draft_check_tokenizer(k ? bytes_tok : NULL, k ? 300 : 256, "runs/draft", bytes_tok, 256, "runs/target");
        CHECK(st == LOOM_EINVAL && strstr(loom_errmsg(), "runs/draft") && strstr(loom_errmsg(), "runs/target"),
              "refusal: %d %s", st, loom_errmsg());
        printf("  %s\n", loom_errmsg());
    }
    loom_draft_t *d = NULL;
    CHECK(loom_draft_create(&d, model, NULL, 300, 2) == LOOM_EINVAL && !d, "a draft of another vocabulary size: %s", loom_errmsg());
}

/* The loop's thread runs the model on the backend's thread count (OpenMP's
 * count is per thread: a new thread would otherwise get the default, all
 * cores), for two engines stepped by one loop; 3 is neither this machine's
 * default nor the 2 the other cases use. Runs last: it reopens the backend. */
static void loop_runs_backend_threads(void) {
    const loom_backend_t *be;
    CHECK(loom_backend_cpu_init(&be, 3) == LOOM_OK, "%s", loom_errmsg());
    loom_engine_t *es[2] = {engine(block_bytes() * 100, 64), engine(block_bytes() * 100, 64)};
    if (!es[0] || !es[1]) return;
    loom_engine_loop_t *loop = NULL;
    CHECK(loom_engine_loop_start(&loop, es, 2, NULL, NULL) == LOOM_OK, "%s", loom_errmsg());
    if (!loop) return;
    CHECK(loom_engine_loop_threads(loop) == 3, "the loop's thread has a team of %d, want 3", loom_engine_loop_threads(loop));
    loom_engine_queue_t *q = loom_engine_queue_new();
    int prompt[12], got[2] = {0, 0};
    prompt_of(prompt, 12, 9u);
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 3;
    for (int k = 0; k < 2; k++) CHECK(loom_engine_submit(es[k], prompt, 12, &p, loom_engine_queue_push, q, NULL) == LOOM_OK, "%s", loom_errmsg());
    loom_engine_event_t ev;
    for (int fins = 0; fins < 2 && loom_engine_queue_pop(q, &ev, 60.0);) {
        fins += ev.finish != LOOM_FINISH_NONE;
        loom_engine_event_clear(&ev);
    }
    loom_engine_loop_stop(loop);
    for (int k = 0; k < 2; k++) {
        loom_engine_stats_t st;
        loom_engine_stats(es[k], &st);
        got[k] = st.threads;
        CHECK(st.requests_done == 1, "engine %d finished %lld requests, want 1", k, st.requests_done);
        loom_engine_free(es[k]);
    }
    CHECK(got[0] == 3 && got[1] == 3, "the models ran on teams of %d and %d threads, want 3 (--threads)", got[0], got[1]);
    loom_engine_queue_free(q);
}

int main(void) {
    setup();
    RUN(greedy_batch_equals_full_forward);
    RUN(greedy_with_preemption);
    RUN(alone_equals_batch_whole);
    RUN(alone_equals_batch_chunked);
    RUN(seeded_samples_share_prompt);
    RUN(stop_strings);
    RUN(bad_input_keeps_serving);
    RUN(cancel_returns_blocks);
    RUN(prompt_spread_over_steps);
    RUN(prompt_whole_at_ratio_zero);
    RUN(prefix_cache_equals_no_cache);
    RUN(prefix_cache_evicts_lru);
    RUN(speculative_greedy_equals_plain);
    RUN(speculative_oracle_drafts);
    RUN(speculative_sampling_distribution);
    RUN(speculative_sampled_drafts_distribution);
    RUN(speculative_draft_model);
    RUN(draft_tokenizer_refused);
    RUN(threads_and_queues);
    RUN(loop_runs_backend_threads);
    loom_gpt_free(model);
    loom_tokenizer_free(bytes_tok);
    return check_main_end();
}
