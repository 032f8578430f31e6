/* loom serve: the OpenAI-compatible HTTP server (src/serve/server.h,
 * docs/serving.md "HTTP API"). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/gguf.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "obs/process.h"
#include "serve/draft.h"
#include "serve/server.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* "NAME=DIR" or "DIR" (the name is the folder's or file's base name). */
static void split_run(const char *spec, char *name, size_t cap, const char **dir) {
    const char *eq = strchr(spec, '=');
    if (eq && eq != spec) {
        snprintf(name, cap, "%.*s", (int)(eq - spec), spec);
        *dir = eq + 1;
        return;
    }
    *dir = spec;
    size_t n = strlen(spec);
    while (n > 1 && spec[n - 1] == '/') n--;
    const char *b = spec;
    for (size_t i = 0; i < n; i++)
        if (spec[i] == '/') b = spec + i + 1;
    size_t len = (size_t)(spec + n - b);
    if (len > 5 && !strncmp(b + len - 5, ".gguf", 5)) len -= 5;
    snprintf(name, cap, "%.*s", (int)len, b);
}

typedef struct {
    loom_arg_list_t runs;
    const char *host, *api_key, *chat_template, *cors_origin, *draft_run;
    int port, threads, max_queue;
    loom_cli_engine_flags_t engine;
    double timeout, grace;
} serve_flags_t;

/* generate.h */
loom_status loom_cli_chat_template(const char *dir, const char *flag, loom_tokenizer_t *tok, char **out) {
    char path[4096], *data = NULL, *cfg_tmpl = NULL;
    size_t n = 0;
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!loom_path_is_dir(dir)) LOOM_TRY(loom_gguf_read_str(dir, "tokenizer.chat_template", &cfg_tmpl)); /* a GGUF file */
    else if (tok && access(path, R_OK) == 0) LOOM_TRY(loom_tokenizer_apply_config(tok, path, &cfg_tmpl));
    if (flag) {
        free(cfg_tmpl);
        return loom_file_read(flag, out, &n);
    }
    snprintf(path, sizeof path, "%s/chat_template.txt", dir);
    if (access(path, R_OK) == 0 && loom_file_read(path, &data, &n) == LOOM_OK) {
        free(cfg_tmpl);
        *out = data;
        return LOOM_OK;
    }
    *out = cfg_tmpl;
    return LOOM_OK;
}

/* --draft-run: the draft model whose proposals target t's speculation
 * verifies (serve/draft.h), opened as the targets are (its int8 or 2:4
 * copies included) with its tokenizer checked against t's; opened at the
 * first target, checked at every one. Sets ec's draft. */
static loom_status use_draft(const serve_flags_t *f, const loom_open_opts_t *oo, const char *dir,
                             const loom_opened_t *t, loom_opened_t *dm, loom_draft_t **d, loom_engine_config_t *ec) {
    if (!f->draft_run || !*f->draft_run) return LOOM_OK;
    int first = !*d;
    if (first) LOOM_TRY(loom_open(f->draft_run, oo, dm));
    LOOM_TRY(loom_draft_check_tokenizer(dm->tok, dm->cfg.vocab_size, f->draft_run, t->tok, t->cfg.vocab_size, dir));
    if (first) {
        loom_infer_weights_release_fp32(dm->model, &dm->weights);
        LOOM_TRY(loom_draft_create(d, dm->model, &dm->weights, t->cfg.vocab_size, 8));
        fprintf(stderr, "loom serve: draft model %s (%d layers, %d wide) proposes %d tokens a step\n", f->draft_run,
                dm->cfg.n_layer, dm->cfg.channels, ec->speculate ? ec->speculate : 4);
    }
    ec->draft = loom_draft_propose, ec->draft_ctx = *d, ec->draft_sampled = 1;
    if (!ec->speculate) ec->speculate = 4;
    return LOOM_OK;
}

static loom_status load_models(loom_server_t *srv, const serve_flags_t *f, loom_opened_t *opened, loom_draft_t **draft) {
    loom_open_opts_t oo = loom_cli_engine_flags_open(&f->engine, f->threads);
    loom_engine_config_t ec;
    LOOM_TRY(loom_cli_engine_flags_config(&f->engine, &ec));
    ec.kv_bytes /= (size_t)f->runs.n; /* one budget, split evenly */
    for (int i = 0; i < f->runs.n; i++) {
        char name[128];
        const char *dir;
        split_run(f->runs.v[i], name, sizeof name, &dir);
        LOOM_TRY(loom_open(dir, &oo, &opened[i]));
        LOOM_TRY(use_draft(f, &oo, dir, &opened[i], &opened[f->runs.n], draft, &ec));
        /* the server runs the model only through the engine: an int8 run keeps no fp32 linear weights */
        size_t given = loom_infer_weights_release_fp32(opened[i].model, &opened[i].weights);
        loom_cli_engine_config_model(&ec, &opened[i]);
        char *tmpl = NULL;
        LOOM_TRY(loom_cli_chat_template(dir, f->chat_template, opened[i].tok, &tmpl));
        loom_status s = loom_server_add_model(srv, name, opened[i].model, opened[i].tok, &ec, tmpl);
        free(tmpl);
        LOOM_TRY(s);
        char gave[96] = "";
        if (given) snprintf(gave, sizeof gave, "; %.0f MiB of fp32 linear weights given back to the system", (double)given / (1 << 20));
        fprintf(stderr, "loom serve: model %s from %s (%.0f MiB of KV cache%s)\n", name, dir, (double)ec.kv_bytes / (1 << 20), gave);
    }
    double kv = (double)ec.kv_bytes * f->runs.n / (1 << 20); /* allocated zeroed: resident from the start */
    fprintf(stderr, "loom serve: resident memory %.0f MiB, of which about %.0f MiB KV cache (process_resident_memory_bytes)\n",
            loom_process_rss_bytes() / (1 << 20), kv);
    return LOOM_OK;
}

static int serve_run(const serve_flags_t *f) {
    if (f->chat_template && access(f->chat_template, R_OK) != 0) {
        fprintf(stderr, "loom serve: --chat-template %s: cannot read it\n", f->chat_template);
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    loom_server_config_t c = {f->host, f->port, f->max_queue, f->api_key, f->timeout, f->cors_origin && f->cors_origin[0] ? f->cors_origin : NULL};
    loom_server_t *srv = NULL;
    loom_opened_t *opened = loom_calloc((size_t)f->runs.n + 1, sizeof *opened); /* the last: --draft-run's */
    loom_draft_t *draft = NULL;
    loom_status s = loom_server_start(&srv, &c);
    if (s == LOOM_OK) fprintf(stderr, "loom serve: listening on http://%s:%d, loading\n", f->host, loom_server_port(srv));
    if (s == LOOM_OK) s = load_models(srv, f, opened, &draft);
    if (s == LOOM_OK) s = loom_server_ready(srv);
    if (s == LOOM_OK) {
        fprintf(stderr, "loom serve: ready on http://%s:%d\n", f->host, loom_server_port(srv));
        while (!stop_signal) usleep(50000);
        fprintf(stderr, "loom serve: %s: no new requests; in-flight ones have %g s to finish\n",
                stop_signal == SIGTERM ? "SIGTERM" : "SIGINT", f->grace);
        int left = loom_server_drain(srv, f->grace);
        fprintf(stderr, "loom serve: stopped (%d requests cancelled at the end of the grace period)\n", left);
    } else {
        fprintf(stderr, "loom serve: %s\n", loom_errmsg());
    }
    loom_server_free(srv);
    loom_draft_free(draft);
    for (int i = 0; i <= f->runs.n; i++) loom_open_close(&opened[i]);
    free(opened);
    free(f->runs.v);
    return s == LOOM_OK ? 0 : loom_exit_code(s);
}

int cmd_serve(int argc, char **argv) {
    serve_flags_t f = {0};
    const loom_arg_t args[] = {
        {"run", ARG_LIST, &f.runs, NULL, 0, 0, "run folder or GGUF file to serve, as DIR (named by its base name) or NAME=DIR; several serve several models"},
        {"host", ARG_STR, &f.host, "127.0.0.1", 0, 0, "address to listen on (0.0.0.0: every interface)"},
        {"port", ARG_INT, &f.port, "8080", 0, 65535, "TCP port (0 = any free port, printed at start)"},
        loom_flag(LOOM_FLAG_DEVICE, &f.engine.device),
        loom_flag(LOOM_FLAG_THREADS, &f.threads),
        loom_flag(LOOM_FLAG_QUANT, &f.engine.quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &f.engine.kv_dtype),
        loom_flag(LOOM_FLAG_SPARSE, &f.engine.sparse),
        loom_flag(LOOM_FLAG_KV_MEMORY, &f.engine.kv_memory), /* for all models together, split evenly */
        LOOM_CLI_ENGINE_SIZE_FLAGS(f.engine),                /* --max-seqs per model */
        {"speculate", ARG_INT, &f.engine.speculate, "0", 0, 16, "draft tokens per step by prompt lookup (speculative decoding, while at most 8 sequences decode; same greedy output), 0 = off"},
        {"draft-run", ARG_STR, &f.draft_run, "", 0, 0, "a small model of the same tokenizer that drafts the --speculate tokens (default 4) instead of prompt lookup; same greedy output, same sampled distribution"},
        {"no-prefix-cache", ARG_BOOL, &f.engine.no_prefix_cache, NULL, 0, 0, "compute every prompt in full (default: reuse the KV blocks of prompt prefixes seen before; the output is the same bits)"},
        {"max-queue", ARG_INT, &f.max_queue, "256", 0, 1 << 20, "prompts waiting for their first token at most; above: 429 with Retry-After (0 = no cap)"},
        {"api-key", ARG_STR, &f.api_key, "", 0, 0, "ask clients for 'Authorization: Bearer KEY' on /v1 routes (none: open)"},
        {"request-timeout", ARG_FLOAT, &f.timeout, "600", 0, 1e9, "seconds a request may take from arrival to its last token (0 = none)"},
        {"cors-origin", ARG_STR, &f.cors_origin, "", 0, 0, "let browser pages from this origin call the API (e.g. http://localhost:3000, or *); none: no CORS headers"},
        {"grace", ARG_FLOAT, &f.grace, "30", 0, 1e6, "seconds in-flight requests get to finish after SIGTERM"},
        {"chat-template", ARG_STR, &f.chat_template, "", 0, 0, "chat template file for every run (Jinja, as tokenizer_config.json holds it, or {role}/{content}); overrides the run's own"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("serve", "loom serve --run runs/NAME [--run NAME=DIR ...] [--port 8080] [flags]",
                              args, argc, argv);
    if (f.runs.n == 0) {
        fprintf(stderr, "loom serve: give the model to serve with --run DIR (or --run NAME=DIR, repeatable)\n");
        return 2;
    }
    return serve_run(&f);
}
