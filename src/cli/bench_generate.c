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
#include "cli/commands.h"
#include "cli/generate.h"
#include "model/quant.h"
#include "cli/runload.h"
#include "model/infer.h"

typedef struct {
    loom_engine_t *e;
    const int *prompt;
    int prompt_len, submitted, total, done, n_first;
    loom_request_params_t p;
    double *ttft;
    long long tokens;
} load_t;

static void bench_event(void *ctx, const loom_engine_event_t *ev);

static void submit_next(load_t *L) {
    if (L->submitted >= L->total) return;
    L->submitted++;
    if (loom_engine_submit(L->e, L->prompt, L->prompt_len, &L->p, bench_event, L, NULL) != LOOM_OK)
        loom_panic(__FILE__, __LINE__, "bench request refused: %s", loom_errmsg());
}

/* Closed loop: a finished request makes room for the next. */
static void bench_event(void *ctx, const loom_engine_event_t *ev) {
    load_t *L = ctx;
    if (ev->token >= 0) L->tokens++;
    if (ev->token >= 0 && ev->n_generated == 1) L->ttft[L->n_first++] = ev->ttft;
    if (ev->finish) {
        L->done++;
        submit_next(L);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One concurrency level: `total` requests, `conc` in flight. Returns
 * output tokens/s; median TTFT into *ttft_ms. */
static double run_level(loom_engine_t *e, const int *prompt, int plen, int gen, int conc, int total,
                        double *ttft_ms) {
    load_t L = {.e = e, .prompt = prompt, .prompt_len = plen, .total = total};
    loom_request_params_default(&L.p);
    L.p.max_tokens = gen;
    L.ttft = loom_calloc((size_t)total + 1, sizeof(double));
    double t0 = loom_now();
    for (int i = 0; i < conc; i++) submit_next(&L);
    if (loom_engine_run(e) != LOOM_OK) loom_panic(__FILE__, __LINE__, "engine: %s", loom_errmsg());
    double dt = loom_now() - t0;
    qsort(L.ttft, (size_t)total, sizeof(double), cmp_double);
    *ttft_ms = 1e3 * L.ttft[total / 2];
    free(L.ttft);
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

/* llama.cpp's llama-bench on the same weights (a GGUF exported from the
 * run given with --run), or a line saying why that row is skipped. */
static void llama_row(const char *bin, const char *gguf, int plen, int gen, const char *levels) {
    if (!loom_path_exists(bin)) {
        printf("SKIP llama.cpp: %s is not built (bench/llama-build.sh builds it; --llama-bench names another)\n", bin);
        return;
    }
    if (!gguf || !loom_path_exists(gguf)) {
        printf("SKIP llama.cpp: no --gguf of the same weights (export the --run checkpoint with `loom export --format gguf`)\n");
        return;
    }
    char dir[4096], cmd[12288];
    snprintf(dir, sizeof dir, "%s", bin);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int t = loom_backend_cpu_threads();
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH='%s' '%s' -m '%s' -t %d -p %d -n %d -r 3 2>&1", dir, bin, gguf, t, plen, gen);
    printf("llama.cpp on the same weights, one stream (%s):\n", cmd);
    fflush(stdout);
    if (system(cmd) != 0) printf("llama.cpp: llama-bench failed\n");
    /* the batched peer: parallel sequences in one batch, as the engine */
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH='%s' '%s/llama-batched-bench' -m '%s' -t %d -c %d -b 2048 -ub 512 -npp %d -ntg %d -npl %s 2>&1 | grep -E '^[|] +[0-9]|PP|S_TG'",
             dir, dir, gguf, t, 64 * (plen + gen), plen, gen, levels);
    printf("llama.cpp, parallel sequences (%s):\n", cmd);
    fflush(stdout);
    if (system(cmd) != 0) printf("llama.cpp: llama-batched-bench failed or is not built\n");
}

typedef struct {
    const char *model, *kv_memory, *conc_text, *run, *llama_bin, *gguf, *device;
    int conc[16], nconc;
    int vocab, plen, gen, repeat, threads, block_size, max_batch_tokens, quant, kv_dtype, sparse;
} bench_flags_t;

/* Every level `repeat` times, alternating levels (drift on a shared
 * machine spreads over all of them); medians and spread printed. */
static void run_table(loom_engine_t *e, const bench_flags_t *f, const int *prompt) {
    int nl = f->nconc;
    double *tps = loom_calloc((size_t)(nl * f->repeat), sizeof(double)), *ttft = loom_calloc((size_t)(nl * f->repeat), sizeof(double));
    for (int r = 0; r < f->repeat; r++)
        for (int l = 0; l < nl; l++) {
            int c = f->conc[l], total = c > 1 ? c : 2;
            tps[l * f->repeat + r] = run_level(e, prompt, f->plen, f->gen, c, total, &ttft[l * f->repeat + r]);
            fprintf(stderr, "  concurrency %d, round %d: %.1f tokens/s, TTFT %.0f ms\n", c, r + 1, tps[l * f->repeat + r], ttft[l * f->repeat + r]);
        }
    printf("%-28s %12s %17s %12s %10s\n", "loom", "out tok/s", "(min-max)", "TTFT ms", "vs 1-at-a-time");
    double base = 0;
    for (int l = 0; l < nl; l++) {
        double *t = tps + l * f->repeat, *q = ttft + l * f->repeat;
        qsort(t, (size_t)f->repeat, sizeof(double), cmp_double);
        qsort(q, (size_t)f->repeat, sizeof(double), cmp_double);
        double med = t[f->repeat / 2];
        int c = f->conc[l];
        if (l == 0) base = med;
        char name[64];
        snprintf(name, sizeof name, c == 1 ? "one request at a time" : "continuous batching, %d", c);
        printf("%-28s %12.1f %8.1f-%-8.1f %12.0f %9.2fx\n", name, med, t[0], t[f->repeat - 1], q[f->repeat / 2], med / base);
    }
    free(tps);
    free(ttft);
}

/* The model: a run's checkpoint, or a preset with random weights. */
static loom_status bench_model(const bench_flags_t *f, loom_gpt_t **m) {
    if (f->run) {
        loom_opened_run_t R;
        LOOM_TRY(loom_run_open(f->run, f->threads, &R));
        if (R.tok) loom_tokenizer_free(R.tok);
        *m = R.model;
        return loom_cli_model_to_device(m, f->device);
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

static int bench_generate(const bench_flags_t *f) {
    loom_gpt_t *m = NULL;
    loom_engine_t *e = NULL;
    loom_engine_config_t ec;
    loom_status s = bench_model(f, &m);
    if (s == LOOM_OK && f->plen + f->gen > m->cfg.max_seq_len)
        s = loom_error(LOOM_EINVAL, "--prompt-len %d + --gen %d is above the model's context (%d)", f->plen, f->gen, m->cfg.max_seq_len);
    if (s == LOOM_OK) s = loom_cli_engine_config(f->kv_memory, f->block_size, f->max_batch_tokens, 64, &ec);
    ec.quant = loom_cli_quant_mode(f->quant);
    ec.kv_dtype = f->kv_dtype ? LOOM_INT8 : LOOM_FP32;
    ec.sparse = f->sparse; /* --sparse: 2:4 weights compressed (model/sparse24.h) */
    if (s == LOOM_OK) s = loom_engine_create(&e, m, NULL, &ec);
    if (s == LOOM_OK && (ec.quant || f->kv_dtype))
        printf("quantization: linear weights %s, KV cache %s\n", loom_quant_name((loom_quant_mode)ec.quant),
               loom_dtype_name(ec.kv_dtype));
    if (s != LOOM_OK) {
        fprintf(stderr, "loom bench generate: %s\n", loom_errmsg());
        loom_gpt_free(m);
        return loom_exit_code(s);
    }
    const loom_gpt_config_t cfg = m->cfg;
    double bw = measure_bandwidth((size_t)1 << 30);
    size_t weight_bytes = 4 * (loom_gpt_num_params(&cfg) - (size_t)cfg.max_seq_len * cfg.channels);
    printf("model %s (%.1fM parameters, vocabulary %d, %s, fp32), %d CPU threads, prompts %d + %d new tokens, KV blocks %d x %d tokens\n",
           f->run ? f->run : f->model, loom_gpt_num_params(&cfg) / 1e6, cfg.vocab_size, f->run ? "checkpoint" : "random weights",
           loom_backend_cpu_threads(), f->plen, f->gen,
           (int)(ec.kv_bytes / loom_infer_block_bytes(&cfg, ec.block_size, ec.kv_dtype)), ec.block_size);
    printf("memory read bandwidth %.1f GB/s (1 GiB summed, best of 5): single-stream decode floor %.1f tokens/s (%.0f MB of weights per token)\n",
           bw / 1e9, bw / (double)weight_bytes, weight_bytes / 1e6);
    int *prompt = loom_malloc((size_t)f->plen * sizeof(int));
    for (int i = 0; i < f->plen; i++) prompt[i] = (int)((i * 7919u + 13u) % (unsigned)cfg.vocab_size);
    run_table(e, f, prompt);
    loom_engine_stats_t st;
    loom_engine_stats(e, &st);
    printf("engine: %lld steps, mean batch %.1f rows, %lld preemptions\n", st.steps, (double)st.batch_rows / (double)(st.steps ? st.steps : 1), st.preemptions);
    llama_row(f->llama_bin, f->gguf, f->plen, f->gen, f->conc_text);
    free(prompt);
    loom_engine_free(e);
    loom_gpt_free(m);
    return 0;
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
        loom_flag_default(LOOM_FLAG_KV_MEMORY, &f.kv_memory, "2G"),
        loom_flag(LOOM_FLAG_BLOCK_SIZE, &f.block_size),
        loom_flag(LOOM_FLAG_MAX_BATCH_TOKENS, &f.max_batch_tokens),
        loom_flag(LOOM_FLAG_QUANT, &f.quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &f.kv_dtype),
        loom_flag(LOOM_FLAG_SPARSE, &f.sparse),
        {"llama-bench", ARG_STR, &f.llama_bin, ".cache/llama.cpp/build/bin/llama-bench", 0, 0, "llama.cpp's llama-bench, for the peer row"},
        {"gguf", ARG_STR, &f.gguf, "", 0, 0, "the same weights as GGUF, for llama.cpp"},
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
