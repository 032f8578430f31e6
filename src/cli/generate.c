/* loom generate: many prompts through the engine's continuous batching,
 * offline (JSON lines in, JSON lines out, in input order). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "model/quant.h"
#include "serve/engine.h"
#include "serve/http_api.h"

typedef struct {
    int *ids; /* generated ids */
    int n, cap;
    char *text;
    size_t len;
    int finish;
} sample_out_t;

typedef struct {
    sample_out_t *s; /* (n) */
    int n, done, n_prompt;
    double ttft;
} req_out_t;

typedef struct {
    req_out_t *reqs;
    int done, total;
    long long tokens;
    double t0, last_print;
} gen_state_t;

typedef struct {
    gen_state_t *g;
    int index;
} req_ctx_t;

static void on_event(void *vctx, const loom_engine_event_t *ev) {
    req_ctx_t *c = vctx;
    req_out_t *r = &c->g->reqs[c->index];
    sample_out_t *s = &r->s[ev->index];
    if (ev->token >= 0) {
        if (s->n == s->cap) s->ids = realloc(s->ids, (size_t)(s->cap = s->cap ? 2 * s->cap : 64) * sizeof(int));
        s->ids[s->n++] = ev->token;
        c->g->tokens++;
        if (ev->index == 0 && ev->n_generated == 1) r->ttft = ev->ttft;
    }
    s->text = realloc(s->text, s->len + ev->text_len + 1);
    memcpy(s->text + s->len, ev->text, ev->text_len);
    s->len += ev->text_len;
    s->text[s->len] = 0;
    r->n_prompt = ev->n_prompt;
    if (ev->finish) {
        s->finish = ev->finish;
        if (++r->done == r->n) c->g->done++;
    }
}

/* Per-line settings override the flags'. */
static void line_params(const cJSON *j, loom_request_params_t *p) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItem(j, "max_tokens")) && cJSON_IsNumber(v)) p->max_tokens = v->valueint;
    if ((v = cJSON_GetObjectItem(j, "temperature")) && cJSON_IsNumber(v)) p->temperature = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItem(j, "top_k")) && cJSON_IsNumber(v)) p->top_k = v->valueint;
    if ((v = cJSON_GetObjectItem(j, "top_p")) && cJSON_IsNumber(v)) p->top_p = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItem(j, "seed")) && cJSON_IsNumber(v)) p->seed = (uint64_t)v->valuedouble;
    if ((v = cJSON_GetObjectItem(j, "n")) && cJSON_IsNumber(v)) p->n = v->valueint;
}

/* The prompt of one line as ids: "prompt_ids": [..] or "prompt": "text". */
static loom_status line_prompt(const cJSON *j, const loom_tokenizer_t *tok, int **ids, int *n) {
    const cJSON *a = cJSON_GetObjectItem(j, "prompt_ids"), *t = cJSON_GetObjectItem(j, "prompt");
    if (cJSON_IsArray(a)) {
        *n = cJSON_GetArraySize(a);
        *ids = loom_malloc(((size_t)*n + 1) * sizeof(int));
        for (int i = 0; i < *n; i++) (*ids)[i] = cJSON_GetArrayItem(a, i)->valueint;
        return LOOM_OK;
    }
    if (!cJSON_IsString(t)) return loom_error(LOOM_EINVAL, "no \"prompt\" (text) or \"prompt_ids\" (array of ids)");
    if (!tok) return loom_error(LOOM_EINVAL, "a text \"prompt\" needs the run's tokenizer.json; give \"prompt_ids\"");
    uint32_t *u = NULL;
    size_t nu = 0;
    LOOM_TRY(loom_tokenizer_encode_special(tok, t->valuestring, strlen(t->valuestring), &u, &nu));
    *ids = loom_malloc((nu + 1) * sizeof(int));
    for (size_t i = 0; i < nu; i++) (*ids)[i] = (int)u[i];
    *n = (int)nu;
    free(u);
    return LOOM_OK;
}

/* Submit every line of `path`; *count receives the number of requests. */
static loom_status submit_all(loom_engine_t *e, const loom_tokenizer_t *tok, const char *path,
                              const loom_request_params_t *defaults, gen_state_t *g, req_ctx_t **ctxs) {
    char *data;
    size_t size;
    LOOM_TRY(loom_file_read(path, &data, &size));
    int lines = 1;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    g->reqs = loom_calloc((size_t)lines, sizeof *g->reqs);
    *ctxs = loom_calloc((size_t)lines, sizeof **ctxs);
    loom_status s = LOOM_OK;
    int lineno = 0;
    for (char *line = strtok(data, "\n"); line && s == LOOM_OK; line = strtok(NULL, "\n")) {
        lineno++;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j) {
            s = loom_error(LOOM_EINVAL, "%s line %d: not JSON", path, lineno);
            break;
        }
        loom_request_params_t p = *defaults;
        line_params(j, &p);
        int *ids = NULL, n = 0, k = g->total;
        s = line_prompt(j, tok, &ids, &n);
        if (s == LOOM_OK) {
            g->reqs[k].n = p.n > 0 ? p.n : 1;
            g->reqs[k].s = loom_calloc((size_t)g->reqs[k].n, sizeof(sample_out_t));
            (*ctxs)[k] = (req_ctx_t){g, k};
            s = loom_engine_submit(e, ids, n, &p, on_event, &(*ctxs)[k], NULL);
        }
        if (s != LOOM_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", loom_errmsg());
            s = loom_error(s, "%s line %d: %s", path, lineno, why);
        }
        else g->total++;
        free(ids);
        cJSON_Delete(j);
    }
    free(data);
    return s;
}

static void progress(gen_state_t *g, int final) {
    double now = loom_now();
    if (!final && now - g->last_print < 0.5) return;
    g->last_print = now;
    double dt = now - g->t0;
    int w = 30, fill = g->total ? w * g->done / g->total : w;
    fprintf(stderr, "\r[%.*s%*s] %d/%d requests, %lld tokens, %.1f tokens/s%s", fill,
            "==============================", w - fill, "", g->done, g->total, g->tokens,
            dt > 0 ? (double)g->tokens / dt : 0.0, final ? "\n" : "");
}

static loom_status write_out(const gen_state_t *g, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return loom_error(LOOM_EWRITE, "%s: cannot write", path);
    for (int i = 0; i < g->total; i++) {
        const req_out_t *r = &g->reqs[i];
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "samples");
        cJSON_AddNumberToObject(j, "index", i);
        cJSON_AddNumberToObject(j, "prompt_tokens", r->n_prompt);
        cJSON_AddNumberToObject(j, "ttft_s", r->ttft);
        for (int k = 0; k < r->n; k++) {
            cJSON *s = cJSON_CreateObject();
            /* JSON text is UTF-8: bytes of a partial or invalid character become U+FFFD (token_ids are exact) */
            const char *t = r->s[k].text ? r->s[k].text : "";
            cJSON_AddItemToObject(s, "text", loom_api_clean_string(t, strlen(t)));
            cJSON_AddItemToObject(s, "token_ids", cJSON_CreateIntArray(r->s[k].ids, r->s[k].n));
            cJSON_AddStringToObject(s, "finish_reason", loom_finish_name((loom_finish_reason)r->s[k].finish));
            cJSON_AddItemToArray(arr, s);
        }
        char *txt = cJSON_PrintUnformatted(j);
        fprintf(f, "%s\n", txt);
        free(txt);
        cJSON_Delete(j);
    }
    return fclose(f) == 0 ? LOOM_OK : loom_error(LOOM_EWRITE, "%s: write failed", path);
}

loom_open_opts_t loom_cli_open_opts(const char *device, int threads, int quant, int kv_dtype, int sparse) {
    static const int modes[] = {LOOM_QUANT_NONE, LOOM_QUANT_W8A32, LOOM_QUANT_W8A32, LOOM_QUANT_W8A32, LOOM_QUANT_W8A8};
    loom_open_opts_t o = loom_open_opts_default();
    o.device = device, o.threads = threads;
    o.weights.quant = quant >= 0 && quant < 5 ? modes[quant] : LOOM_QUANT_NONE; /* docs/quantization.md */
    o.weights.sparse = sparse;                                                  /* model/sparse24.h */
    o.kv_dtype = kv_dtype ? LOOM_INT8 : LOOM_FP32;
    return o;
}

loom_status loom_cli_engine_config(const char *kv_memory, int block_size, int max_batch_tokens,
                                   int max_seqs, loom_engine_config_t *c) {
    loom_engine_config_default(c);
    LOOM_TRY(loom_engine_parse_kv_memory(kv_memory, &c->kv_bytes));
    c->block_size = block_size;
    c->max_batch_tokens = max_batch_tokens;
    c->max_seqs = max_seqs;
    return LOOM_OK;
}

loom_open_opts_t loom_cli_engine_flags_open(const loom_cli_engine_flags_t *ef, int threads) {
    return loom_cli_open_opts(ef->device, threads, ef->quant, ef->kv_dtype, ef->sparse);
}

loom_status loom_cli_engine_flags_config(const loom_cli_engine_flags_t *ef, loom_engine_config_t *c) {
    LOOM_TRY(loom_cli_engine_config(ef->kv_memory, ef->block_size, ef->max_batch_tokens, ef->max_seqs, c));
    c->prefix_cache = !ef->no_prefix_cache;
    c->speculate = ef->speculate;
    c->prefill_ratio = ef->prefill_ratio;
    return LOOM_OK;
}

void loom_cli_engine_config_model(loom_engine_config_t *c, const loom_opened_t *m) {
    c->kv_dtype = m->kv_dtype;
    c->weights = m->weights;
    if (loom_args_given("kv-memory")) return; /* the user's size: one that cannot hold a whole context is refused, naming it */
    /* The default size and a model whose whole context does not fit in it
     * (smollm2's 8192 tokens, Llama 3's 131072): run with a shorter context,
     * four sequences' worth, and say so, instead of refusing to start. */
    const loom_gpt_config_t *g = &m->model->cfg;
    size_t per = loom_infer_block_bytes(g, c->block_size, c->kv_dtype), nb = c->kv_bytes / per;
    size_t need = ((size_t)g->max_seq_len + (size_t)c->block_size - 1) / (size_t)c->block_size;
    if (nb >= need || nb < 4) return; /* fits, or too small for any cap: the engine's error says what to raise */
    c->max_context = (int)(nb / 4) * c->block_size;
    fprintf(stderr, "loom: the default --kv-memory (%.0f MiB) holds %zu tokens: requests get %d tokens of context, not the model's %d; "
                    "--kv-memory %.0fM holds four whole ones\n",
            (double)c->kv_bytes / (1 << 20), nb * (size_t)c->block_size, c->max_context, g->max_seq_len,
            ceil((double)(4 * need * per) / (1 << 20)));
}

static loom_status generate_run(const char *run, int threads, const char *in, const char *out,
                                const loom_request_params_t *p, const loom_cli_engine_flags_t *ef) {
    loom_opened_t R;
    loom_open_opts_t oo = loom_cli_engine_flags_open(ef, threads);
    LOOM_TRY(loom_open(run, &oo, &R));
    loom_engine_config_t c;
    loom_engine_t *e = NULL;
    gen_state_t g = {0};
    req_ctx_t *ctxs = NULL;
    loom_status s = loom_cli_engine_flags_config(ef, &c);
    loom_cli_engine_config_model(&c, &R);
    if (s == LOOM_OK) s = loom_engine_create(&e, R.model, R.tok, &c);
    g.t0 = loom_now();
    if (s == LOOM_OK) s = submit_all(e, R.tok, in, p, &g, &ctxs);
    for (int busy = 1; s == LOOM_OK && busy;) {
        s = loom_engine_step(e, &busy);
        progress(&g, !busy);
    }
    if (s == LOOM_OK) s = write_out(&g, out);
    for (int i = 0; i < g.total; i++) {
        for (int k = 0; k < g.reqs[i].n; k++) free(g.reqs[i].s[k].ids), free(g.reqs[i].s[k].text);
        free(g.reqs[i].s);
    }
    free(g.reqs);
    loom_engine_free(e);
    free(ctxs);
    loom_open_close(&R);
    return s;
}

int cmd_generate(int argc, char **argv) {
    const char *run, *in, *out;
    int threads;
    double temperature, top_p;
    long long seed;
    loom_request_params_t p;
    loom_request_params_default(&p);
    loom_cli_engine_flags_t ef;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_RUN, &run),
        {"prompts", ARG_STR, &in, NULL, 0, 0, "JSON lines: {\"prompt\": TEXT} or {\"prompt_ids\": [..]}, optional max_tokens, temperature, top_k, top_p, seed, n"},
        {"out", ARG_STR, &out, NULL, 0, 0, "JSON lines written here, one per prompt, in input order"},
        {"max-tokens", ARG_INT, &p.max_tokens, "128", 1, 1 << 24, "new tokens per prompt (a line's max_tokens wins)"},
        {"temperature", ARG_FLOAT, &temperature, "0", 0, 100, "softmax temperature (0 = greedy)"},
        {"top-k", ARG_INT, &p.top_k, "0", 0, 1 << 30, "sample among the k likeliest tokens (0 = all)"},
        {"top-p", ARG_FLOAT, &top_p, "1.0", 0.000001, 1, "nucleus sampling mass (1 = off)"},
        {"seed", ARG_LONG, &seed, "1337", 0, 9.2e18, "sampling seed"},
        {"threads", ARG_INT, &threads, "0", 0, 4096, "CPU threads (0 = all cores)"},
        {"device", ARG_STR, &ef.device, "cpu", 0, 0, "cpu, cuda or cuda:N (the engine's ops run there)"},
        loom_flag_default(LOOM_FLAG_KV_MEMORY, &ef.kv_memory, "0.2"),
        LOOM_CLI_ENGINE_SIZE_FLAGS(ef),
        loom_flag(LOOM_FLAG_QUANT, &ef.quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &ef.kv_dtype),
        loom_flag(LOOM_FLAG_SPARSE, &ef.sparse),
    };
    LOOM_ARGS_PARSE_OR_RETURN("generate", "loom generate --run runs/NAME --prompts in.jsonl --out out.jsonl [flags]",
                              args, argc, argv);
    if (!run || !in || !out) {
        fprintf(stderr, "loom generate: --run, --prompts and --out are all needed (loom generate --help)\n");
        return 2;
    }
    p.temperature = (float)temperature, p.top_p = (float)top_p, p.seed = (uint64_t)seed;
    loom_status s = generate_run(run, threads, in, out, &p, &ef);
    return loom_exit_report("generate", s);
}
