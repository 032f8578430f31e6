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

static loom_engine_t *engine(size_t kv_bytes, int max_batch_tokens) {
    loom_engine_config_t c;
    loom_engine_config_default(&c);
    c.block_size = 4;
    c.kv_bytes = kv_bytes;
    c.max_batch_tokens = max_batch_tokens;
    c.max_seqs = 16;
    c.debug = 1;
    loom_engine_t *e = NULL;
    CHECK(loom_engine_create(&e, model, bytes_tok, &c) == LOOM_OK, "create: %s", loom_errmsg());
    return e;
}

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
 * pool holds `blocks` blocks. */
static void batch_of_16(int blocks, int expect_preempt) {
    loom_engine_t *e = engine(block_bytes() * (size_t)blocks, 24);
    if (!e) return;
    static result_t res[16];
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
    }
    loom_engine_free(e);
}

static void greedy_batch_equals_full_forward(void) { batch_of_16(400, 0); }
static void greedy_with_preemption(void) { batch_of_16(40, 1); }

/* Alone: one request in its own engine gives the same tokens as in the batch. */
static void alone_equals_batch(void) {
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 10;
    int prompts[16][MAXT], len[16];
    static result_t alone[16], batch[16];
    memset(alone, 0, sizeof alone);
    memset(batch, 0, sizeof batch);
    loom_engine_t *e = engine(block_bytes() * 300, 32);
    if (!e) return;
    for (int i = 0; i < 16; i++) {
        len[i] = 3 + (i * 13) % 40;
        prompt_of(prompts[i], len[i], 7u * (unsigned)i);
        loom_engine_submit(e, prompts[i], len[i], &p, collect, &alone[i], NULL);
        loom_engine_run(e);
    }
    for (int i = 0; i < 16; i++) loom_engine_submit(e, prompts[i], len[i], &p, collect, &batch[i], NULL);
    loom_engine_run(e);
    for (int i = 0; i < 16; i++)
        CHECK(memcmp(alone[i].tokens[0], batch[i].tokens[0], sizeof(int) * 10) == 0 && batch[i].n[0] == 10,
              "request %d differs alone and in the batch", i);
    loom_engine_free(e);
}

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
    CHECK(loom_engine_start(e) == LOOM_OK, "%s", loom_errmsg());
    client_t c[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        c[k] = (client_t){.e = e, .k = k};
        pthread_create(&th[k], NULL, client, &c[k]);
    }
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    loom_engine_stop(e);
    loom_engine_free(e);
    for (int k = 0; k < 4; k++) {
        int prompt[20], want[8];
        float lp[8];
        prompt_of(prompt, 11 + k, 50u + (unsigned)k);
        full_greedy(prompt, 11 + k, 8, want, lp);
        CHECK(c[k].ok && memcmp(c[k].tokens, want, sizeof want) == 0, "client %d: ok %d, tokens differ from the full forward", k, c[k].ok);
    }
}

int main(void) {
    setup();
    RUN(greedy_batch_equals_full_forward);
    RUN(greedy_with_preemption);
    RUN(alone_equals_batch);
    RUN(seeded_samples_share_prompt);
    RUN(stop_strings);
    RUN(bad_input_keeps_serving);
    RUN(cancel_returns_blocks);
    RUN(threads_and_queues);
    loom_gpt_free(model);
    loom_tokenizer_free(bytes_tok);
    return check_main_end();
}
