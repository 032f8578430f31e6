/* engine: many generation requests through one model at once (continuous
 * batching over a paged KV cache). docs/serving.md tells the whole story.
 *
 * Requests wait in a queue, first come first served. Each step the
 * scheduler builds one batch: first every decoding sequence's next token,
 * then prompt rows within the step's prefill budget (serve/step_budget.h:
 * what fits beside the decodes in about one decode step's time, learned
 * from measured steps, at most max_batch_tokens rows in all): the next
 * chunk of prompts being prefilled, then waiting requests admitted while
 * the budget, the sequence cap (max_seqs) and free KV blocks allow. A long
 * prompt is prefilled in chunks over several steps, so running decodes
 * keep their pace while prompts arrive. The batch runs as one forward (model/infer.h); each sequence
 * whose rows reach its end samples its next token. When a running sequence
 * needs a block and none is free, the newest running sequence is preempted:
 * its blocks are freed and it goes back to the front of the queue to be
 * recomputed (prompt plus the tokens it had made) when blocks free up.
 * A sequence admitted without blocks first takes the cached blocks of the
 * prompt prefix it shares with earlier ones (prefix caching,
 * serve/kv_cache.h); with `speculate`, a decoding sequence may run drafted
 * tokens after its last one, verified in the same forward.
 *
 * Threads: every function here is safe to call from any thread. Either
 * call loom_engine_step yourself (one thread), or start a step loop
 * (loom_engine_loop_start), which steps one or more engines in turn on a
 * thread of its own until loom_engine_loop_stop; the server and the tests
 * use this one loop. Events are delivered on the thread that runs the
 * steps, with no engine lock held: a callback may submit or cancel, but
 * must not block for long (it stalls every request). A loom_engine_queue_t
 * turns events into a queue that another thread waits on.
 *
 * CPU note: the CPU ops run on an OpenMP team from the stepping thread, of
 * the CPU backend's thread count (--threads; OpenMP's count is per thread,
 * so each step sets it), and share the GEMM's packing buffers: do not run
 * other model work in the same process while the engine steps, and step
 * several engines from one thread (one loop), never from two at once. */
#ifndef LOOM_ENGINE_H
#define LOOM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/generate.h"
#include "model/infer.h"

typedef struct {
    int block_size;       /* tokens per KV block (default 16) */
    size_t kv_bytes;      /* bytes for the KV pool (see loom_engine_parse_kv_memory) */
    loom_dtype kv_dtype;  /* element type of the cache (LOOM_FP32; int8 to come) */
    int max_batch_tokens; /* rows per step, prefill and decode together (default 512) */
    int max_seqs;         /* running sequences at most (default 64) */
    int max_context;      /* tokens a sequence may reach, prompt and output: 0 (default) the
                             model's context; less lets a smaller KV pool hold one whole
                             sequence (bench generate sizes its cache for what it runs) */
    int debug;            /* 1: check block ownership on every change (tests) */
    loom_infer_weights_t weights; /* the model's int8 or 2:4 copies to run (model/infer.h; made by
                                     ckpt/open.h's loom_open), owned by the caller and outliving the
                                     engine; zero (the default): the fp32 weights */
    int prefix_cache;     /* 1 (default): reuse cached KV blocks of equal prompt prefixes (serve/kv_cache.h) */
    int speculate;        /* draft tokens per step (speculative decoding), 0 (default) off, <= 16 */
    double prefill_ratio; /* prompt work a step may take while sequences decode, in decode-only
                             steps' time (serve/step_budget.h): 1 (default) keeps their
                             inter-token latency within about 2x; 0: no limit, prompts fill
                             max_batch_tokens (throughput first) */
    /* Where drafts come from: NULL (default) prompt lookup (n-gram); else
     * draft(ctx, tokens, len, out, max, sp, rng, q) writes up to max tokens
     * to follow tokens[0..len) into out and returns how many (a draft
     * model, serve/draft.h, or a test's oracle); when it returns none,
     * prompt lookup proposes. With draft_sampled and a sampled request
     * (sp->temperature > 0), q holds max rows of V floats: the drafter
     * draws draft j from a distribution of its own (using rng) and writes
     * that distribution to row j, and the target accepts it with
     * min(1, p/q) (model/generate.h loom_sample_verify_q); else q is NULL
     * and the drafts count as proposed with certainty. Called on the
     * stepping thread. */
    int (*draft)(void *ctx, const int *tokens, int len, int *out, int max, const loom_sampling_t *sp,
                 loom_rng_t *rng, float *q);
    void *draft_ctx;
    int draft_sampled;
    /* Seconds a step of decode_rows decode and prefill_rows prompt rows
     * took, for the prefill budget; NULL (default): measured on the wall
     * clock. Tests set a cost model here, so no result depends on speed. */
    double (*step_cost)(void *ctx, int decode_rows, int prefill_rows);
    void *step_cost_ctx;
} loom_engine_config_t;

/* Defaults for every field (kv_bytes 256 MiB). */
void loom_engine_config_default(loom_engine_config_t *c);
/* Parse --kv-memory: bytes with an optional K/M/G suffix ("512M", "2G"),
 * or a share of the memory free now, a number in (0, 1] ("0.25"). */
loom_status loom_engine_parse_kv_memory(const char *s, size_t *bytes);

/* Constrained decoding (structured outputs, serve/json_schema.h): which
 * tokens may come next for one sample. begin makes a sample's state (at its
 * first token); allowed says whether tok keeps the output valid; mask sets
 * every disallowed logit of a row to -inf and returns how many are left;
 * accept advances past the chosen token and returns 1 when the output is
 * complete (the sample then ends with "stop"); end frees the state. Called
 * on the stepping thread only. */
typedef struct loom_token_filter {
    void *(*begin)(const struct loom_token_filter *f);
    int (*allowed)(void *st, int tok);
    int (*mask)(void *st, float *logits, int V);
    int (*accept)(void *st, int tok);
    void (*end)(void *st);
} loom_token_filter_t;

/* One request's settings. */
typedef struct {
    int max_tokens;      /* new tokens at most (>= 1) */
    float temperature;   /* 0 = greedy; >= 0 */
    int top_k;           /* 0 = off */
    float top_p;         /* in (0, 1]; 1 = off */
    uint64_t seed;       /* sample i draws from its own stream seeded with seed + i */
    int n;               /* samples sharing the prompt (>= 1); they share its KV blocks */
    const int *stop_ids; /* token ids that end a sample (not returned as text) */
    int n_stop_ids;
    const char *const *stop; /* strings that end a sample, matched on the decoded text
                                across token boundaries; not returned */
    int n_stop;
    int logprobs;        /* -1 off; else return the chosen token's log-probability
                            and this many top alternatives (<= 20) */
    const loom_token_filter_t *filter; /* NULL: any token; else only the tokens it allows (no
                                          speculation; must outlive the request's last event) */
    int prompt_logprobs; /* 1: also each prompt token's log-probability given the ones before it
                            (with `logprobs` alternatives), as events with `prompt` set, tokens 1 ..
                            n_prompt-1 in order before the first generated one; the prompt is then
                            computed, not taken from the prefix cache. max_tokens may then be 0 */
} loom_request_params_t;

/* Defaults: max_tokens 16, greedy, n 1, no stops, no logprobs. */
void loom_request_params_default(loom_request_params_t *p);

typedef enum {
    LOOM_FINISH_NONE = 0,  /* more events follow for this sample */
    LOOM_FINISH_LENGTH,    /* max_tokens reached, or the model's context is full */
    LOOM_FINISH_STOP,      /* a stop id or stop string */
    LOOM_FINISH_CANCELLED, /* loom_engine_cancel */
    LOOM_FINISH_COUNT
} loom_finish_reason;

/* The one table of reason names, for loom's own outputs (the metrics'
 * finish_reason label, `loom generate`'s JSON lines): "length", "stop",
 * "abort" for CANCELLED (the client left, a deadline passed, shutdown:
 * vLLM's label for it), "" for NONE. The OpenAI API has no "abort":
 * loom_api_finish_reason (http_api.h) maps the reasons for clients. */
const char *loom_finish_name(loom_finish_reason f);

/* What an event carries; valid during the callback only. */
typedef struct {
    uint64_t request;      /* the handle submit returned */
    int index;             /* which of the n samples */
    int token;             /* the new token, or -1 for an event without one (cancel) */
    const char *text;      /* decoded bytes this token releases (may be empty; bytes
                              that could start a stop string are held back) */
    size_t text_len;
    float logprob;         /* log-probability of token, when logprobs >= 0 */
    int n_top;             /* alternatives below (logprobs of them, descending) */
    const int *top_ids;
    const float *top_logprobs;
    loom_finish_reason finish; /* != NONE on the sample's last event */
    int n_prompt, n_generated; /* token counts so far */
    double ttft;           /* seconds from submit to this sample's first token */
    double queue_time;     /* seconds from submit to the request's first admission (0 = not admitted) */
    int prompt;            /* 1: token is a prompt token (prompt_logprobs), not a generated one */
} loom_engine_event_t;

typedef void (*loom_engine_cb)(void *ctx, const loom_engine_event_t *ev);

typedef struct loom_engine loom_engine_t;

/* An engine over `m` (which must outlive it; the engine runs it). `tok` may
 * be NULL: then stop strings are refused and events carry no text. The
 * pool holds kv_bytes / loom_infer_block_bytes blocks. */
loom_status loom_engine_create(loom_engine_t **out, loom_gpt_t *m, const loom_tokenizer_t *tok,
                               const loom_engine_config_t *cfg);
/* Pending requests are dropped without events. Stop the loop that steps
 * `e` (if any) first. */
void loom_engine_free(loom_engine_t *e);

/* Queue a request: prompt (n_prompt ids), its settings, and where its
 * events go (cb(ctx, event) for every token of every sample, the last one
 * with finish set). Checks everything first and refuses a bad request with
 * LOOM_EINVAL and a message (nothing queued; the engine goes on with the
 * others): an empty prompt or one longer than the context, a token outside
 * the vocabulary, max_tokens < 1, temperature < 0, top_p outside (0, 1],
 * n < 1, a request that could never fit the KV pool. *id receives the
 * request's handle. */
loom_status loom_engine_submit(loom_engine_t *e, const int *prompt, int n_prompt,
                               const loom_request_params_t *p, loom_engine_cb cb, void *ctx,
                               uint64_t *id);
/* Cancel a request: its samples end with LOOM_FINISH_CANCELLED at the next
 * step and their blocks are freed. 0 if found, -1 if unknown or done. */
int loom_engine_cancel(loom_engine_t *e, uint64_t id);

/* One scheduler step on the calling thread. *busy (may be NULL) is set to 1
 * when there was work. Errors are internal (a failed forward). */
loom_status loom_engine_step(loom_engine_t *e, int *busy);
/* Step until no request is left. */
loom_status loom_engine_run(loom_engine_t *e);
/* The step loop: a thread of its own that steps engines[0..n) in turn
 * while any has work and sleeps while none has (a submit or cancel wakes
 * it), calling on_step(ctx, i) (may be NULL) on that thread after each
 * step of engines[i] that had work. An engine belongs to one loop at most.
 * Returns once the thread runs and has measured its OpenMP team
 * (loom_engine_loop_threads). */
typedef struct loom_engine_loop loom_engine_loop_t;
loom_status loom_engine_loop_start(loom_engine_loop_t **out, loom_engine_t *const *engines, int n,
                                   void (*on_step)(void *ctx, int i), void *ctx);
/* Threads in a parallel region on the loop's thread: the team the models run on. */
int loom_engine_loop_threads(const loom_engine_loop_t *l);
/* Stop the thread (after the step it is in) and free the loop; NULL is a no-op. */
void loom_engine_loop_stop(loom_engine_loop_t *l);

typedef struct {
    int waiting, running;      /* sequences now */
    int free_blocks, total_blocks, block_size;
    long long steps, prompt_tokens, generated_tokens, preemptions, requests_done;
    long long batch_rows;      /* rows over all steps (mean batch = batch_rows / steps) */
    int prefill_budget;        /* prompt rows the last step allowed */
    long long prefix_queries;  /* prompt tokens looked up in the prefix cache (recomputes included) */
    long long prefix_hits;     /* of them, tokens found cached (not computed) */
    int cached_blocks;         /* cached blocks nobody holds (counted in free_blocks) */
    long long spec_drafted, spec_accepted; /* speculative decoding: tokens drafted, and accepted */
    int threads;               /* OpenMP team of the thread that last stepped (0 = not stepped yet) */
} loom_engine_stats_t;
void loom_engine_stats(loom_engine_t *e, loom_engine_stats_t *st);

/* Check block accounting: every block's references against the block
 * tables of the live sequences (LOOM_EINTERNAL with the difference). */
loom_status loom_engine_audit(loom_engine_t *e);

/* A thread-safe FIFO of events: pass loom_engine_queue_push as the
 * callback and the queue as its ctx; another thread pops. Text and top
 * lists are copied. */
typedef struct loom_engine_queue loom_engine_queue_t;
loom_engine_queue_t *loom_engine_queue_new(void);
void loom_engine_queue_free(loom_engine_queue_t *q);
void loom_engine_queue_push(void *q, const loom_engine_event_t *ev);
/* Wait up to timeout_s (< 0: forever) for an event; 1 with *ev filled
 * (release with loom_engine_event_clear), 0 on timeout. */
int loom_engine_queue_pop(loom_engine_queue_t *q, loom_engine_event_t *ev, double timeout_s);
void loom_engine_event_clear(loom_engine_event_t *ev);

#endif
