/* loom bench generate: decode throughput and time to first token of the
 * engine, one request at a time against continuous batching at several
 * concurrencies, on one model in one run; the machine's memory bandwidth
 * (the floor for single-stream decode); llama.cpp on the same weights when
 * its build is there. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/bench_llama.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "model/quant.h"
#include "cli/stats.h"
#include "model/sparse24.h"
#include "model/infer.h"
#include "backend/qblock.h"

typedef struct {
    loom_engine_t *e;
    int *prompt; /* the base prompt, its first token changed per request */
    int prompt_len, vocab, submitted, total, done, n_first;
    loom_request_params_t p;
    double *ttft;
    long long tokens;
    double t_first, decode_time; /* one request in flight: its first token's time; sum of first-to-last times */
    long long decode_tokens;     /* tokens after each request's first */
} load_t;

static void bench_event(void *ctx, const loom_engine_event_t *ev);

/* Every request of the run gets a prompt no earlier one began with (its
 * first token counts up): the prefix cache would otherwise serve all but
 * the first prompt of a level from cached blocks, where llama.cpp's
 * batched bench computes every prompt. */
static unsigned g_prompt_salt;

static void submit_next(load_t *L) {
    if (L->submitted >= L->total) return;
    L->submitted++;
    L->prompt[0] = (int)(g_prompt_salt++ % (unsigned)L->vocab);
    if (loom_engine_submit(L->e, L->prompt, L->prompt_len, &L->p, bench_event, L, NULL) != LOOM_OK)
        loom_panic(__FILE__, __LINE__, "bench request refused: %s", loom_errmsg());
}

/* Closed loop: a finished request makes room for the next. */
static void bench_event(void *ctx, const loom_engine_event_t *ev) {
    load_t *L = ctx;
    if (ev->token >= 0) L->tokens++;
    if (ev->token >= 0 && ev->n_generated == 1) L->ttft[L->n_first++] = ev->ttft, L->t_first = loom_now();
    if (ev->finish) {
        L->decode_time += loom_now() - L->t_first, L->decode_tokens += ev->n_generated - 1;
        L->done++;
        submit_next(L);
    }
}

/* One concurrency level: `total` requests, `conc` in flight. Returns
 * output tokens/s; median TTFT into *ttft_ms; with conc 1, the decode rate
 * (tokens after the first over the time from first to last, the rate
 * llama-bench's tg measures) into *decode. */
static double run_level(loom_engine_t *e, const int *prompt, int plen, int vocab, int gen, int conc, int total,
                        double *ttft_ms, double *decode) {
    load_t L = {.e = e, .prompt = loom_malloc((size_t)plen * sizeof(int)), .prompt_len = plen, .vocab = vocab, .total = total};
    memcpy(L.prompt, prompt, (size_t)plen * sizeof(int));
    loom_request_params_default(&L.p);
    L.p.max_tokens = gen;
    L.ttft = loom_calloc((size_t)total + 1, sizeof(double));
    double t0 = loom_now();
    for (int i = 0; i < conc; i++) submit_next(&L);
    if (loom_engine_run(e) != LOOM_OK) loom_panic(__FILE__, __LINE__, "engine: %s", loom_errmsg());
    double dt = loom_now() - t0;
    loom_sort_doubles(L.ttft, total);
    *ttft_ms = 1e3 * L.ttft[total / 2];
    *decode = conc == 1 && L.decode_time > 0 ? (double)L.decode_tokens / L.decode_time : 0;
    free(L.ttft), free(L.prompt);
    return (double)L.tokens / dt;
}

/* Read bandwidth: sum a buffer far larger than the caches, all threads. */
static double measure_bandwidth(size_t bytes) {
    size_t n = bytes / sizeof(float);
    float *x = malloc(bytes);
    if (!x) return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    double best = 1e30, sink = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = loom_now(), s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
        for (size_t i = 0; i < n; i++) s += x[i];
        double dt = loom_now() - t0;
        sink += s;
        if (dt < best) best = dt;
    }
    free(x);
    return sink < 0 ? 0 : (double)bytes / best;
}

typedef struct {
    const char *model, *kv_memory, *conc_text, *run, *llama_bin, *gguf, *device, *sweep;
    int conc[16], nconc;
    int vocab, plen, gen, repeat, threads, block_size, max_batch_tokens, quant, kv_dtype, sparse, speculate;
    double prefill_ratio;
} bench_flags_t;

/* One configuration measured (a "side"): weights, scales, logits, cache. */
typedef struct {
    char name[40];
    int quant, block, fp32_logits, kv8;
    size_t bytes; /* weight bytes read per decode token */
    loom_infer_weights_t w; /* the side's int8 or 2:4 copies of the one model's weights */
    loom_engine_t *e;
} bench_side_t;

#define MAX_SIDES 8

/* "fp32", "w8a32" or "w8a8", then any of "-q8_0" (blocks of 32), "-fp32logits",
 * "-kv8" (int8 KV cache): 0, or -1 with a message. */
static int parse_side(const char *s, size_t n, bench_side_t *d) {
    static const char *const base[] = {"fp32", "w8a32", "w8a8"};
    static const int modes[] = {LOOM_QUANT_NONE, LOOM_QUANT_W8A32, LOOM_QUANT_W8A8};
    *d = (bench_side_t){0};
    snprintf(d->name, sizeof d->name, "%.*s", (int)n, s);
    size_t k = strcspn(d->name, "-");
    int ok = 0;
    for (int i = 0; i < 3; i++)
        if (strlen(base[i]) == k && !strncmp(d->name, base[i], k)) d->quant = modes[i], ok = 1;
    for (const char *t = d->name + k; ok && *t; t += strcspn(t + 1, "-") + 1) {
        size_t len = strcspn(t + 1, "-");
        if (len == 4 && !strncmp(t + 1, "q8_0", 4)) d->block = 32;
        else if (len == 10 && !strncmp(t + 1, "fp32logits", 10)) d->fp32_logits = 1;
        else if (len == 3 && !strncmp(t + 1, "kv8", 3)) d->kv8 = 1;
        else ok = 0;
    }
    if (!ok || (d->quant == LOOM_QUANT_NONE && (d->block || d->fp32_logits)))
        fprintf(stderr, "loom bench generate: --sweep item '%s': expected fp32, w8a32 or w8a8, then any of -q8_0, -fp32logits, -kv8 (q8_0 and fp32logits need int8 weights)\n",
                d->name);
    return ok && !(d->quant == LOOM_QUANT_NONE && (d->block || d->fp32_logits)) ? 0 : -1;
}

/* The sides: --sweep's list, else the one --quant / --kv-dtype name. */
static int parse_sides(const bench_flags_t *f, bench_side_t *sd) {
    int n = 0;
    if (!f->sweep || !*f->sweep) {
        sd[0] = (bench_side_t){.quant = loom_cli_open_opts(f->device, f->threads, f->quant, f->kv_dtype, f->sparse).weights.quant,
                               .kv8 = f->kv_dtype != 0};
        snprintf(sd[0].name, sizeof sd[0].name, "%s%s", sd[0].quant ? loom_quant_name((loom_quant_mode)sd[0].quant) : "fp32",
                 sd[0].kv8 ? "-kv8" : "");
        return 1;
    }
    for (const char *c = f->sweep; *c; c += strcspn(c, ",") + (c[strcspn(c, ",")] == ',')) {
        if (n == MAX_SIDES) {
            fprintf(stderr, "loom bench generate: --sweep: at most %d items\n", MAX_SIDES);
            return -1;
        }
        if (parse_side(c, strcspn(c, ","), &sd[n++])) return -1;
    }
    return n;
}

/* Every side and level `repeat` times, alternating sides and levels (drift
 * on a shared machine spreads over all of them), the read bandwidth
 * measured at the start of each round; medians and spread printed. */
/* medians: out tok/s per side and level; dec1: per side, the median decode
 * tok/s of the one-at-a-time level (0 when there is none). */
static void run_table(bench_side_t *sd, int ns, const bench_flags_t *f, const int *prompt, int vocab, double *medians,
                      double *dec1) {
    int nl = f->nconc, R = f->repeat;
    double *tps = loom_calloc((size_t)(ns * nl * R), sizeof(double)), *ttft = loom_calloc((size_t)(ns * nl * R), sizeof(double));
    double *bw = loom_calloc((size_t)R, sizeof(double)), *dec = loom_calloc((size_t)(ns * nl * R), sizeof(double));
    /* the host's memory bounds a CPU's decode, not a GPU's: no floor there */
    int host = strcmp(f->device, "cpu") == 0;
    for (int r = 0; r < R; r++) {
        if (host) {
            bw[r] = measure_bandwidth((size_t)1 << 30);
            fprintf(stderr, "round %d: memory read bandwidth %.1f GB/s\n", r + 1, bw[r] / 1e9);
        }
        for (int s = 0; s < ns; s++)
            for (int l = 0; l < nl; l++) {
                int c = f->conc[l], total = c > 1 ? c : 2, i = (s * nl + l) * R + r;
                tps[i] = run_level(sd[s].e, prompt, f->plen, vocab, f->gen, c, total, &ttft[i], &dec[i]);
                fprintf(stderr, "  %s, concurrency %d, round %d: %.1f tokens/s, TTFT %.0f ms\n", sd[s].name, c, r + 1, tps[i], ttft[i]);
            }
    }
    loom_sort_doubles(bw, R);
    if (host)
        printf("memory read bandwidth %.1f GB/s (median of %d rounds, %.1f-%.1f; 1 GiB summed, best of 5 each)\n",
               bw[R / 2] / 1e9, R, bw[0] / 1e9, bw[R - 1] / 1e9);
    printf("%-16s %-26s %10s %17s %9s %9s %22s\n", "loom", "", "out tok/s", "(min-max)", "TTFT ms", "vs first",
           "decode tok/s (floor)");
    double first = 0;
    for (int s = 0; s < ns; s++)
        for (int l = 0; l < nl; l++) {
            double *t = tps + (s * nl + l) * R, *q = ttft + (s * nl + l) * R, *d = dec + (s * nl + l) * R;
            loom_sort_doubles(t, R);
            loom_sort_doubles(q, R);
            loom_sort_doubles(d, R);
            double med = t[R / 2], floor = bw[R / 2] / (double)sd[s].bytes;
            int c = f->conc[l];
            if (s == 0 && l == 0) first = med;
            medians[s * nl + l] = med;
            char name[64], fl[64] = "";
            snprintf(name, sizeof name, c == 1 ? "one request at a time" : "continuous batching, %d", c);
            if (c == 1) dec1[s] = d[R / 2];
            if (c == 1 && host) snprintf(fl, sizeof fl, "%.1f (%.1f-%.1f) of %.1f", d[R / 2], d[0], d[R - 1], floor);
            else if (c == 1) snprintf(fl, sizeof fl, "%.1f (%.1f-%.1f)", d[R / 2], d[0], d[R - 1]);
            printf("%-16s %-26s %10.1f %8.1f-%-8.1f %9.0f %8.2fx %22s\n", sd[s].name, name, med, t[0], t[R - 1], q[R / 2],
                   med / first, fl);
        }
    printf("decode tok/s: one request at a time, tokens after the first over the time from first to last (median, min-max)%s\n",
           host ? "; floor: what the median bandwidth allows for the side's bytes per token" : "");
    free(tps), free(ttft), free(bw), free(dec);
}

/* The model: a run's checkpoint (fp32: each side makes its own copies),
 * or a preset with random weights. */
static loom_status bench_model(const bench_flags_t *f, loom_opened_t *R, loom_gpt_t **m) {
    if (f->run) {
        loom_open_opts_t oo = loom_cli_open_opts(f->device, f->threads, 0, 0, LOOM_SPARSE_OFF);
        oo.keep_fp32 = f->quant || (f->sweep && *f->sweep); /* int8 sides quantize the fp32 weights */
        LOOM_TRY(loom_open(f->run, &oo, R));
        *m = R->model;
        return LOOM_OK;
    }
    const loom_backend_t *be;
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_backend_cpu_init(&be, f->threads));
    if (strcmp(f->device, "cpu") != 0) LOOM_TRY(loom_backend_open(&be, f->device, f->threads, LOOM_FP32));
    LOOM_TRY(loom_gpt_preset(&cfg, f->model));
    cfg.vocab_size = f->vocab;
    LOOM_TRY(loom_gpt_config_finish(&cfg));
    return loom_gpt_init(m, &cfg, be, 1);
}

/* llama.cpp beside the int8 side with the fastest single-stream decode
 * (else the first side): decode against llama-bench's generation, and the
 * 16-client level (else the largest) against llama-batched-bench,
 * bench_llama.h. */
static void llama_peer(const bench_flags_t *f, int threads, const bench_side_t *sd, int ns, const double *med, const double *dec1) {
    int s = 0, nl = f->nconc;
    for (int i = 0; i < ns; i++)
        if (sd[i].quant && (!sd[s].quant || dec1[i] > dec1[s])) s = i;
    char label[64];
    snprintf(label, sizeof label, "loom %s", sd[s].name);
    loom_bench_llama_t p = {.bin = f->llama_bin, .gguf = f->gguf, .run = f->run, .quant = sd[s].quant, .label = label,
                            .plen = f->plen, .gen = f->gen, .threads = threads, .repeat = f->repeat,
                            .loom_one = dec1[s]};
    for (int l = 1; l < nl; l++)
        if (p.clients != 16) p.clients = f->conc[l], p.loom_many = med[s * nl + l];
    loom_bench_llama_peer(&p);
}

/* Decode bytes when m runs its GGUF's own block weights (gpt.h file_q):
 * those matrices, and the head when stored so, at their block bytes
 * instead of `fp32_bytes`' 4 a weight (the embedding is read a row a token). */
static size_t file_q_bytes(const loom_gpt_t *m, size_t fp32_bytes) {
    size_t b = fp32_bytes, nq = (size_t)m->cfg.n_layer * LOOM_QLIN_COUNT;
    for (size_t i = 0; m->file_q && i <= nq + 1; i++) {
        /* a weight the file split in parts (a Llama's q, k and v: gpt.h's
         * part slots) counts by its parts; the embedding is read a row a token */
        const loom_tensor_t *t = &m->file_q[i], *parts = i < nq ? &m->file_q[nq + 2 + i * LOOM_FILE_Q_PARTS] : NULL;
        for (int k = 0; k < (t->data || !parts ? 1 : LOOM_FILE_Q_PARTS); k++) {
            const loom_tensor_t *p = t->data || !parts ? t : &parts[k];
            if (p->data && i != nq) b += loom_qblock_tensor_bytes(p) - 4 * (size_t)p->rows * (size_t)p->cols;
        }
    }
    return b;
}

/* The KV cache a side needs for what the benchmark runs (--kv-memory
 * auto): every request of the largest concurrency level at its longest
 * (prompt, new and draft tokens), a block more each for a partly filled
 * last one, and a quarter more for headroom. */
static size_t auto_kv_bytes(const bench_flags_t *f, const loom_gpt_t *m, int kv8) {
    int most = 1, bs = f->block_size;
    for (int i = 0; i < f->nconc; i++) most = f->conc[i] > most ? f->conc[i] : most;
    size_t per_seq = (size_t)(f->plen + f->gen + f->speculate + bs - 1) / (size_t)bs + 1;
    size_t blocks = per_seq * (size_t)most;
    return (blocks + blocks / 4 + 1) * loom_infer_block_bytes(&m->cfg, bs, kv8 ? LOOM_INT8 : LOOM_FP32);
}

/* One engine per side on model m (each with its own cache: --kv-memory,
 * or auto_kv_bytes), its sequences as long as the benchmark's requests. */
static loom_status make_engines(const bench_flags_t *f, loom_gpt_t *m, bench_side_t *sd, int ns) {
    int autokv = !strcmp(f->kv_memory, "auto");
    for (int i = 0; i < ns; i++) {
        loom_engine_config_t ec;
        LOOM_TRY(loom_cli_engine_config(autokv ? "1K" : f->kv_memory, f->block_size, f->max_batch_tokens, 64, &ec));
        if (autokv) ec.kv_bytes = auto_kv_bytes(f, m, sd[i].kv8);
        ec.max_context = f->plen + f->gen + f->speculate; /* no request runs longer: no whole-context cache */
        /* --sparse: 2:4 weights compressed (model/sparse24.h) */
        loom_infer_weights_opts_t wo = {sd[i].quant, sd[i].block, sd[i].fp32_logits, f->sparse};
        LOOM_TRY(loom_infer_weights_create(&sd[i].w, m, &wo));
        ec.weights = sd[i].w;
        ec.kv_dtype = sd[i].kv8 ? LOOM_INT8 : LOOM_FP32;
        ec.speculate = f->speculate;
        ec.prefill_ratio = f->prefill_ratio;
        loom_quant_opts_t qo = {.block = sd[i].block, .logits = !sd[i].fp32_logits};
        sd[i].bytes = loom_quant_decode_bytes(&m->cfg, (loom_quant_mode)sd[i].quant, &qo);
        int stored = m->file_q && !(m->be->caps & LOOM_CAP_DEVICE_MEMORY); /* a device model runs fp32 (ckpt/open.c) */
        if (stored && !sd[i].quant) sd[i].bytes = file_q_bytes(m, sd[i].bytes);
        LOOM_TRY(loom_engine_create(&sd[i].e, m, NULL, &ec));
        printf("%-16s linear weights %s%s, logits %s, KV cache %s (%d blocks of %d tokens), %.0f MB of weights per decode token\n",
               sd[i].name, sd[i].quant ? loom_quant_name((loom_quant_mode)sd[i].quant) : stored ? "the GGUF's own blocks" : "fp32",
               sd[i].block ? " (Q8_0 blocks of 32)" : sd[i].quant ? " (per-channel scales)" : "",
               sd[i].quant && !sd[i].fp32_logits ? "int8" : stored && m->file_q[m->cfg.n_layer * LOOM_QLIN_COUNT + 1].data ? "the GGUF's own blocks" : "fp32", sd[i].kv8 ? "int8" : "fp32",
               (int)(ec.kv_bytes / loom_infer_block_bytes(&m->cfg, ec.block_size, ec.kv_dtype)), ec.block_size,
               sd[i].bytes / 1e6);
    }
    return LOOM_OK;
}

/* A GGUF's fp32 weights that no side reads once the sides' copies are
 * made (bench_model kept them for the int8 sides to quantize): the ones
 * the file's own blocks replace, and with int8 on every side every linear
 * weight; given back to the system, so the benchmark holds what serve holds. */
static void release_fp32(const bench_flags_t *f, loom_gpt_t *m, const bench_side_t *sd, int ns) {
    if (!f->run || !m->file_q || !(f->quant || (f->sweep && *f->sweep))) return; /* else loom_open gave them back */
    int all_int8 = 1;
    for (int i = 0; i < ns; i++) all_int8 &= sd[i].w.quant != NULL;
    size_t given = loom_infer_weights_release_fp32(m, all_int8 ? &sd[0].w : NULL);
    if (given) printf("%.1f MB of fp32 weights no side reads given back to the system\n", given / 1e6);
}

static int bench_generate(const bench_flags_t *f) {
    loom_gpt_t *m = NULL;
    loom_opened_t R = {0};
    bench_side_t sd[MAX_SIDES] = {0};
    int ns = parse_sides(f, sd);
    if (ns < 0) return 2;
    loom_status s = bench_model(f, &R, &m);
    if (s == LOOM_OK && f->plen + f->gen > m->cfg.max_seq_len)
        s = loom_error(LOOM_EINVAL, "--prompt-len %d + --gen %d is above the model's context (%d)", f->plen, f->gen, m->cfg.max_seq_len);
    if (s == LOOM_OK) {
        const loom_gpt_config_t *cfg = &m->cfg;
        printf("model %s (%.1fM parameters, vocabulary %d, %s, fp32), %d CPU threads, kernels %s, prompts %d + %d new tokens\n",
               f->run ? f->run : f->model, loom_gpt_num_params(cfg) / 1e6, cfg->vocab_size, f->run ? "checkpoint" : "random weights",
               m->be->threads, m->be->kernels ? m->be->kernels : "-", f->plen, f->gen);
        printf("every request's prompt its own (none served from the prefix cache); prompt work per step while others decode: %s\n",
               f->prefill_ratio > 0 ? "at most --prefill-ratio decode steps' time" : "no limit (--prefill-ratio 0)");
        s = make_engines(f, m, sd, ns);
        if (s == LOOM_OK) release_fp32(f, m, sd, ns);
    }
    if (s == LOOM_OK) {
        int *prompt = loom_malloc((size_t)f->plen * sizeof(int));
        for (int i = 0; i < f->plen; i++) prompt[i] = (int)((i * 7919u + 13u) % (unsigned)m->cfg.vocab_size);
        double med[MAX_SIDES * 16] = {0}, dec1[MAX_SIDES] = {0};
        run_table(sd, ns, f, prompt, m->cfg.vocab_size, med, dec1);
        free(prompt);
        for (int i = 0; i < ns; i++) {
            loom_engine_stats_t st;
            loom_engine_stats(sd[i].e, &st);
            printf("engine %s: %lld steps, mean batch %.1f rows, %lld preemptions, %lld of %lld prompt tokens from the prefix cache\n",
                   sd[i].name, st.steps, (double)st.batch_rows / (double)(st.steps ? st.steps : 1), st.preemptions, st.prefix_hits,
                   st.prefix_queries);
        }
        llama_peer(f, m->be->threads, sd, ns, med, dec1);
    } else {
        fprintf(stderr, "loom bench generate: %s\n", loom_errmsg());
    }
    for (int i = 0; i < ns; i++) loom_engine_free(sd[i].e), loom_infer_weights_free(&sd[i].w);
    if (R.model) loom_open_close(&R);
    else loom_gpt_free(m);
    return s == LOOM_OK ? 0 : loom_exit_code(s);
}

int cmd_bench_generate(int argc, char **argv) {
    bench_flags_t f;
    const loom_arg_t args[] = {
        loom_flag_default(LOOM_FLAG_MODEL, &f.model, "gpt2-small"),
        {"run", ARG_STR, &f.run, "", 0, 0, "a run folder's newest checkpoint instead of a random preset (the weights a GGUF for llama.cpp was exported from)"},
        {"vocab", ARG_INT, &f.vocab, "50257", 2, 1 << 24, "vocabulary size"},
        {"prompt-len", ARG_INT, &f.plen, "128", 1, 1 << 20, "prompt tokens per request"},
        {"gen", ARG_INT, &f.gen, "128", 1, 1 << 20, "new tokens per request"},
        {"concurrency", ARG_STR, &f.conc_text, "1,4,16,64", 0, 0, "requests in flight per level, comma-separated (1 = one at a time)"},
        {"repeat", ARG_INT, &f.repeat, "3", 1, 100, "rounds per level (medians and spread)"},
        loom_flag(LOOM_FLAG_THREADS, &f.threads),
        loom_flag(LOOM_FLAG_DEVICE, &f.device),
        {"kv-memory", ARG_STR, &f.kv_memory, "auto", 0, 0,
         "KV cache per side: auto sizes it for what the benchmark runs ((prompt + new tokens) x the largest concurrency, a quarter more; "
         "not the model's whole context), or bytes (512M, 2G) or a share of the memory free now (0.25)"},
        loom_flag(LOOM_FLAG_BLOCK_SIZE, &f.block_size),
        loom_flag(LOOM_FLAG_MAX_BATCH_TOKENS, &f.max_batch_tokens),
        loom_flag(LOOM_FLAG_PREFILL_RATIO, &f.prefill_ratio),
        loom_flag(LOOM_FLAG_QUANT, &f.quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &f.kv_dtype),
        loom_flag(LOOM_FLAG_SPARSE, &f.sparse),
        {"speculate", ARG_INT, &f.speculate, "0", 0, 16, "draft tokens per step by prompt lookup (speculative decoding), 0 = off"},
        {"llama-bench", ARG_STR, &f.llama_bin, ".cache/llama.cpp/build/bin/llama-bench", 0, 0, "llama.cpp's llama-bench, for the peer row"},
        {"gguf", ARG_STR, &f.gguf, "", 0, 0, "the same weights as GGUF, for llama.cpp"},
        {"sweep", ARG_STR, &f.sweep, "", 0, 0,
         "sides measured in alternation, comma-separated: fp32, w8a32 or w8a8, then any of -q8_0 (Q8_0 blocks of 32), -fp32logits, -kv8 (int8 KV cache); e.g. fp32,w8a32,w8a8,fp32-kv8 (default: the one --quant and --kv-dtype give)"},
    };
    int r = loom_args_parse("bench generate", "loom bench generate [flags]", args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r) return 2;
    f.nconc = 0;
    for (const char *c = f.conc_text; *c && f.nconc < 16; c += strcspn(c, ",") + (c[strcspn(c, ",")] == ',')) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || (*end && *end != ',') || v < 1 || v > 64) {
            fprintf(stderr, "loom bench generate: --concurrency %s: expected numbers 1 to 64, comma-separated\n", f.conc_text);
            return 2;
        }
        f.conc[f.nconc++] = (int)v;
    }
    return bench_generate(&f);
}
