/* loom bench serve: the HTTP server under load. Starts `loom serve` in
 * this process, drives it over HTTP with N concurrent clients (closed
 * loop) or Poisson arrivals, and reports request throughput, output
 * tokens/s, and time to first token, inter-token latency and end-to-end
 * latency at p50 and p99 (vLLM's benchmark_serving definitions: TTFT from
 * sending the request to the first streamed token; ITL every gap between
 * two streamed chunks; E2E from sending to the last byte). The same load
 * then drives llama.cpp's llama-server on the same weights (a GGUF), when
 * it is built. Prompts are token ids cut from the KJV text. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "cli/stats.h"
#include "obs/sbuf.h"
#include "serve/server.h"

typedef struct {
    double ttft, e2e;
    double *itl;
    int n_itl, tokens, ok;
} result_t;

typedef struct {
    int port, plen, gen, n_prompts, llama;
    int base; /* first prompt of this level: levels never repeat a prompt, so a peer's prompt cache cannot help */
    int **prompts;
    result_t *res;
    int next, total; /* closed loop: next request to send */
    double *start_at; /* Poisson: each request's send time (NULL = closed loop) */
    double t0;
    pthread_mutex_t mu;
} load_t;

static int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) close(fd), fd = -1;
    return fd;
}

/* One streamed completion; fills *r. */
static void one_request(load_t *L, int i, result_t *r) {
    loom_sbuf_t body = {0}, req = {0};
    const int *p = L->prompts[(L->base + i) % L->n_prompts];
    loom_sbuf_puts(&body, "{\"prompt\":[");
    for (int k = 0; k < L->plen; k++) loom_sbuf_printf(&body, "%s%d", k ? "," : "", p[k]);
    loom_sbuf_printf(&body, "],\"max_tokens\":%d,\"temperature\":0,\"stream\":true,\"ignore_eos\":true,"
                            "\"stream_options\":{\"include_usage\":true}}",
                     L->gen);
    loom_sbuf_printf(&req, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", body.len, body.data);
    memset(r, 0, sizeof *r);
    r->itl = loom_calloc((size_t)L->gen + 8, sizeof(double));
    double t0 = loom_now(), last = 0;
    int fd = http_connect(L->port);
    if (fd >= 0 && write(fd, req.data, req.len) == (ssize_t)req.len) {
        loom_sbuf_t in = {0};
        char buf[16384];
        ssize_t n;
        size_t scanned = 0;
        while ((n = read(fd, buf, sizeof buf)) > 0) {
            loom_sbuf_put(&in, buf, (size_t)n);
            double now = loom_now();
            char *e;
            while ((e = strstr(in.data + scanned, "data: ")) != NULL) {
                char *end = strstr(e, "\n");
                if (!end) break;
                scanned = (size_t)(end - in.data);
                if (!strncmp(e, "data: [DONE]", 12)) { r->ok = 1; continue; }
                char *u = strstr(e, "\"completion_tokens\":");
                if (u && u < end) { r->tokens = atoi(u + 20); continue; }
                if (!strstr(e, "\"text\":") || strstr(e, "\"text\":\"\"")) continue;
                if (last == 0) r->ttft = now - t0;
                else if (r->n_itl < L->gen + 8) r->itl[r->n_itl++] = now - last;
                last = now;
            }
        }
        free(in.data);
        if (!r->tokens && r->ok) r->tokens = r->n_itl + 1;
    }
    if (fd >= 0) close(fd);
    r->e2e = loom_now() - t0;
    free(body.data), free(req.data);
}

static void *client_main(void *arg) {
    load_t *L = arg;
    for (;;) {
        pthread_mutex_lock(&L->mu);
        int i = L->next < L->total ? L->next++ : -1;
        pthread_mutex_unlock(&L->mu);
        if (i < 0) return NULL;
        if (L->start_at) {
            double wait = L->t0 + L->start_at[i] - loom_now();
            if (wait > 0) usleep((useconds_t)(wait * 1e6));
        }
        one_request(L, i, &L->res[i]);
    }
}

static double pct(double *v, int n, double q) {
    if (n == 0) return NAN;
    loom_sort_doubles(v, n);
    double k = q * (n - 1);
    int lo = (int)k;
    return lo + 1 < n ? v[lo] + (k - lo) * (v[lo + 1] - v[lo]) : v[lo];
}

/* Run one load level and print its row. clients threads; rate > 0: Poisson. */
static void run_level(load_t *L, const char *who, int clients, double rate, int total) {
    L->res = loom_calloc((size_t)total, sizeof *L->res);
    L->next = 0, L->total = total;
    L->start_at = NULL;
    if (rate > 0) {
        L->start_at = loom_malloc((size_t)total * sizeof(double));
        double t = 0;
        unsigned seed = 7;
        for (int i = 0; i < total; i++) t += -log(1.0 - rand_r(&seed) / ((double)RAND_MAX + 1)) / rate, L->start_at[i] = t;
        clients = total;
    }
    pthread_t *th = loom_malloc((size_t)clients * sizeof *th);
    L->t0 = loom_now();
    for (int c = 0; c < clients; c++) pthread_create(&th[c], NULL, client_main, L);
    for (int c = 0; c < clients; c++) pthread_join(th[c], NULL);
    double dur = loom_now() - L->t0;
    double *ttft = loom_malloc((size_t)total * sizeof(double)), *e2e = loom_malloc((size_t)total * sizeof(double));
    double *itl = loom_malloc(((size_t)total * (size_t)(L->gen + 8)) * sizeof(double));
    int ok = 0, nitl = 0;
    long long toks = 0;
    for (int i = 0; i < total; i++) {
        result_t *r = &L->res[i];
        if (!r->ok) continue;
        ttft[ok] = r->ttft, e2e[ok] = r->e2e, ok++;
        toks += r->tokens;
        memcpy(itl + nitl, r->itl, (size_t)r->n_itl * sizeof(double));
        nitl += r->n_itl;
    }
    char load[32];
    if (rate > 0) snprintf(load, sizeof load, "rate %.2f/s", rate);
    else snprintf(load, sizeof load, "%d clients", clients);
    printf("| %-9s | %-12s | %3d/%-3d | %7.2f | %8.1f | %7.0f | %7.0f | %6.1f | %6.1f | %7.0f | %7.0f |\n", who, load, ok,
           total, ok / dur, toks / dur, 1e3 * pct(ttft, ok, 0.5), 1e3 * pct(ttft, ok, 0.99), 1e3 * pct(itl, nitl, 0.5),
           1e3 * pct(itl, nitl, 0.99), 1e3 * pct(e2e, ok, 0.5), 1e3 * pct(e2e, ok, 0.99));
    fflush(stdout);
    for (int i = 0; i < total; i++) free(L->res[i].itl);
    free(L->res), free(L->start_at), free(th), free(ttft), free(e2e), free(itl);
}

/* The KJV text: --text FILE, else data/kjv.txt, else the bible-kjv package's `bible`. */
static char *kjv_text(const char *path, size_t *len) {
    char *data = NULL;
    if (path && loom_file_read(path, &data, len) == LOOM_OK) return data;
    if (loom_file_read("data/kjv.txt", &data, len) == LOOM_OK) return data;
    FILE *f = popen("bible Gen1:1-Exo40:38 </dev/null 2>/dev/null", "r");
    if (!f) return NULL;
    loom_sbuf_t b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) loom_sbuf_put(&b, buf, n);
    pclose(f);
    *len = b.len;
    return b.data;
}

/* n prompts of plen token ids each, cut at spread-out places of the text. */
static loom_status make_prompts(const loom_tokenizer_t *tok, const char *path, int n, int plen, int ***out) {
    size_t len = 0;
    char *text = kjv_text(path, &len);
    if (!text || len < 1000)
        return loom_error(LOOM_EINVAL, "no KJV text: give --text FILE (or install bible-kjv, or put it in data/kjv.txt)");
    uint32_t *ids = NULL;
    size_t nid = 0;
    loom_status s = loom_tokenizer_encode(tok, text, len < (4u << 20) ? len : (4u << 20), &ids, &nid);
    free(text);
    LOOM_TRY(s);
    if (nid < (size_t)plen * 2) return loom_error(LOOM_EINVAL, "the text has %zu tokens, too few for %d-token prompts", nid, plen);
    *out = loom_malloc((size_t)n * sizeof **out);
    for (int i = 0; i < n; i++) {
        size_t at = (nid - (size_t)plen) * (size_t)i / (size_t)n;
        (*out)[i] = loom_malloc((size_t)plen * sizeof(int));
        for (int k = 0; k < plen; k++) (*out)[i][k] = (int)ids[at + (size_t)k];
    }
    free(ids);
    return LOOM_OK;
}

typedef struct {
    const char *run, *text, *levels, *kv_memory, *llama_bin, *gguf;
    int plen, gen, threads, requests, max_seqs;
    double rate;
} bench_flags_t;

static void run_levels(load_t *L, const char *who, const bench_flags_t *f) {
    L->base = 0; /* both servers get the same prompts, level by level */
    if (f->rate > 0) {
        run_level(L, who, 0, f->rate, f->requests ? f->requests : 32);
        return;
    }
    char *lv = loom_strdup(f->levels), *save = NULL;
    for (char *t = strtok_r(lv, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int c = atoi(t);
        if (c < 1) continue;
        int total = f->requests ? f->requests : (c * 2 > 8 ? c * 2 : 8);
        run_level(L, who, c, 0, total);
        L->base += total;
    }
    free(lv);
}

static int wait_health(int port, double timeout_s) {
    double t0 = loom_now();
    while (loom_now() - t0 < timeout_s) {
        int fd = http_connect(port);
        if (fd >= 0) {
            const char *q = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            char buf[64] = {0};
            if (write(fd, q, strlen(q)) > 0 && read(fd, buf, sizeof buf - 1) > 12 && !strncmp(buf + 9, "200", 3)) {
                close(fd);
                return 1;
            }
            close(fd);
        }
        usleep(200000);
    }
    return 0;
}

/* llama.cpp's llama-server on the same GGUF, same threads and slots. */
static void llama_peer(load_t *L, const bench_flags_t *f, int slots) {
    if (access(f->llama_bin, X_OK) != 0) {
        printf("SKIP llama.cpp: %s is not built (bench/llama-build.sh builds it, 15+ minutes; --llama-server names another)\n", f->llama_bin);
        return;
    }
    if (!f->gguf) {
        printf("SKIP llama.cpp: no --gguf of the same weights (loom export --run %s --format gguf --out FILE)\n", f->run);
        return;
    }
    int port = 18000 + (int)(getpid() % 20000);
    char tbuf[16], sbuf[16], pbuf[16], cbuf[16];
    snprintf(tbuf, sizeof tbuf, "%d", f->threads), snprintf(sbuf, sizeof sbuf, "%d", slots);
    snprintf(pbuf, sizeof pbuf, "%d", port), snprintf(cbuf, sizeof cbuf, "%d", slots * (f->plen + f->gen + 16));
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout), freopen("/dev/null", "w", stderr);
        execl(f->llama_bin, f->llama_bin, "-m", f->gguf, "-t", tbuf, "-np", sbuf, "-c", cbuf, "--port", pbuf, "--host",
              "127.0.0.1", (char *)NULL);
        _exit(127);
    }
    if (pid > 0 && wait_health(port, 120)) {
        L->port = port, L->llama = 1;
        run_levels(L, "llama.cpp", f);
    } else {
        printf("SKIP llama.cpp: llama-server did not come up on port %d\n", port);
    }
    if (pid > 0) kill(pid, SIGTERM), waitpid(pid, NULL, 0);
}

static int max_level(const bench_flags_t *f) {
    int m = 1;
    char *lv = loom_strdup(f->levels), *save = NULL;
    for (char *t = strtok_r(lv, ",", &save); t; t = strtok_r(NULL, ",", &save)) m = atoi(t) > m ? atoi(t) : m;
    free(lv);
    return m;
}

static loom_status bench_loom(const bench_flags_t *f, load_t *L, loom_opened_t *R) {
    loom_open_opts_t oo = loom_open_opts_default();
    oo.threads = f->threads;
    LOOM_TRY(loom_open(f->run, &oo, R));
    if (!R->tok) return loom_error(LOOM_EINVAL, "%s has no tokenizer.json: the benchmark cuts its prompts from text", f->run);
    LOOM_TRY(make_prompts(R->tok, f->text, 512, f->plen, &L->prompts));
    L->n_prompts = 512;
    if (f->plen + f->gen > R->model->cfg.max_seq_len)
        return loom_error(LOOM_EINVAL, "--in %d + --out %d is above the model's context (%d)", f->plen, f->gen, R->model->cfg.max_seq_len);
    loom_engine_config_t ec;
    LOOM_TRY(loom_cli_engine_config(f->kv_memory, 16, 512, f->max_seqs, &ec));
    loom_cli_engine_config_model(&ec, R);
    loom_server_config_t sc = {.host = "127.0.0.1"};
    loom_server_t *srv = NULL;
    loom_status s = loom_server_start(&srv, &sc);
    if (s == LOOM_OK) s = loom_server_add_model(srv, "bench", R->model, R->tok, &ec, NULL);
    if (s == LOOM_OK) s = loom_server_ready(srv);
    if (s == LOOM_OK) {
        L->port = loom_server_port(srv);
        L->llama = 0;
        run_levels(L, "loom", f);
        loom_server_drain(srv, 5);
    }
    loom_server_free(srv);
    return s;
}

int cmd_bench_serve(int argc, char **argv) {
    bench_flags_t f;
    const loom_arg_t args[] = {
        {"run", ARG_STR, &f.run, NULL, 0, 0, "run folder (or GGUF) to serve"},
        {"text", ARG_STR, &f.text, "", 0, 0, "text the prompts are cut from (default data/kjv.txt, else the bible-kjv package)"},
        {"clients", ARG_STR, &f.levels, "1,4,16,64", 0, 0, "concurrent clients per level, closed loop (comma-separated)"},
        {"rate", ARG_FLOAT, &f.rate, "0", 0, 1e6, "Poisson arrivals at this many requests/s instead of --clients (0 = off)"},
        {"requests", ARG_INT, &f.requests, "0", 0, 1 << 20, "requests per level (0 = 2 x clients, at least 8; 32 with --rate)"},
        {"in", ARG_INT, &f.plen, "128", 1, 1 << 20, "prompt tokens per request"},
        {"out", ARG_INT, &f.gen, "128", 1, 1 << 20, "generated tokens per request (end-of-text ignored)"},
        loom_flag_default(LOOM_FLAG_KV_MEMORY, &f.kv_memory, "512M"),
        loom_flag(LOOM_FLAG_MAX_SEQS, &f.max_seqs), /* llama.cpp gets as many slots */
        loom_flag(LOOM_FLAG_THREADS, &f.threads),
        {"llama-server", ARG_STR, &f.llama_bin, ".cache/llama.cpp/build/bin/llama-server", 0, 0, "llama.cpp's llama-server, the peer"},
        {"gguf", ARG_STR, &f.gguf, "", 0, 0, "the same weights as GGUF, for llama.cpp"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("bench serve", "loom bench serve --run runs/NAME [--clients 1,4,16,64 | --rate R] [flags]",
                              args, argc, argv);
    if (!f.run) {
        fprintf(stderr, "loom bench serve: give the model with --run DIR\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    load_t L = {.plen = f.plen, .gen = f.gen};
    pthread_mutex_init(&L.mu, NULL);
    printf("loom bench serve: %s, %d tokens in, %d out, greedy, streamed; times in ms\n\n", f.run, f.plen, f.gen);
    printf("| server    | load         | ok      | req/s   | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    loom_opened_t R = {0};
    loom_status s = bench_loom(&f, &L, &R);
    if (s == LOOM_OK) llama_peer(&L, &f, f.rate > 0 ? f.max_seqs : max_level(&f));
    if (s != LOOM_OK) fprintf(stderr, "loom bench serve: %s\n", loom_errmsg());
    for (int i = 0; L.prompts && i < L.n_prompts; i++) free(L.prompts[i]);
    free(L.prompts);
    loom_open_close(&R);
    return s == LOOM_OK ? 0 : loom_exit_code(s);
}
