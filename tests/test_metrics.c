/* The metrics registry, its Prometheus text, the HTTP server and the
 * dashboard's JSON. Oracles: exposition text written by hand from the
 * format's specification, Debian's promtool, PromQL's histogram_quantile
 * arithmetic done by hand, exact counts from concurrent updates. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "obs/dashboard.h"
#include "obs/http.h"
#include "obs/metrics.h"

static void test_exposition_text(void) {
    loom_metrics_t *r = loom_metrics_new();
    loom_metric_t *c = loom_metrics_counter(r, "loom_test_requests_total", "Requests.\nSecond line \\ here.", "code", "200", NULL);
    loom_metric_t *g = loom_metrics_gauge(r, "loom_test_temperature_celsius", "A gauge.", NULL);
    double b[] = {0.1, 0.5, 1};
    loom_metric_t *h = loom_metrics_histogram(r, "loom_test_latency_seconds", "Latency.", b, 3, "model", "a\"b\\c\nd", NULL);
    loom_counter_add(c, 3);
    loom_counter_add(c, -5); /* ignored */
    loom_gauge_set(g, 0.25);
    loom_histogram_observe(h, 0.1); /* le is inclusive: the 0.1 bucket */
    loom_histogram_observe(h, 0.7);
    loom_histogram_observe(h, 9);
    char *text = loom_metrics_render(r, NULL);
    const char *want =
        "# HELP loom_test_requests_total Requests.\\nSecond line \\\\ here.\n"
        "# TYPE loom_test_requests_total counter\n"
        "loom_test_requests_total{code=\"200\"} 3\n"
        "# HELP loom_test_temperature_celsius A gauge.\n"
        "# TYPE loom_test_temperature_celsius gauge\n"
        "loom_test_temperature_celsius 0.25\n"
        "# HELP loom_test_latency_seconds Latency.\n"
        "# TYPE loom_test_latency_seconds histogram\n"
        "loom_test_latency_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"0.1\"} 1\n"
        "loom_test_latency_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"0.5\"} 1\n"
        "loom_test_latency_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"1\"} 2\n"
        "loom_test_latency_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 3\n"
        "loom_test_latency_seconds_sum{model=\"a\\\"b\\\\c\\nd\"} 9.8\n"
        "loom_test_latency_seconds_count{model=\"a\\\"b\\\\c\\nd\"} 3\n";
    CHECK(!strcmp(text, want), "got:\n%s\nwanted:\n%s", text, want);
    free(text);
    loom_metrics_free(r);
}

static void test_declaration_rules(void) {
    loom_metrics_t *r = loom_metrics_new();
    CHECK(loom_metrics_gauge(r, "9bad", "x", NULL) == NULL, "a name starting with a digit was accepted");
    CHECK(strstr(loom_errmsg(), "9bad") != NULL, "message: %s", loom_errmsg());
    CHECK(loom_metrics_gauge(r, "ok_name", "x", "bad-label", "v", NULL) == NULL, "label with '-' accepted");
    CHECK(loom_metrics_gauge(r, "ok_name2", "x", "__reserved", "v", NULL) == NULL, "label __reserved accepted");
    double b[] = {1};
    CHECK(loom_metrics_histogram(r, "h_seconds", "x", b, 1, "le", "1", NULL) == NULL, "histogram label le accepted");
    double bad[] = {2, 1};
    CHECK(loom_metrics_histogram(r, "h2_seconds", "x", bad, 2, NULL) == NULL, "descending buckets accepted");
    loom_metric_t *a = loom_metrics_gauge(r, "same", "x", "rank", "0", NULL);
    CHECK(a && loom_metrics_gauge(r, "same", "x", "rank", "0", NULL) == a, "same series, another handle");
    CHECK(loom_metrics_gauge(r, "same", "x", "rank", "1", NULL) != a, "other label value, same handle");
    CHECK(loom_metrics_counter(r, "same", "x", "rank", "0", NULL) == NULL, "type conflict accepted");
    CHECK(strstr(loom_errmsg(), "declared before as a gauge") != NULL, "message: %s", loom_errmsg());
    CHECK(loom_metrics_gauge(r, "same", "x", "gpu", "0", NULL) == NULL, "label-name conflict accepted");
    CHECK(loom_metrics_find(r, "same", "rank", "0", NULL) == a, "find");
    loom_gauge_set(NULL, 1); /* NULL handles do nothing */
    loom_counter_add(NULL, 1);
    loom_histogram_observe(NULL, 1);
    /* An unset gauge is absent, not 0. */
    loom_metric_t *u = loom_metrics_gauge(r, "never_set", "x", NULL);
    char *text = loom_metrics_render(r, NULL);
    CHECK(!strstr(text, "never_set"), "an unset gauge is exposed:\n%s", text);
    free(text);
    loom_gauge_set(u, 2);
    loom_gauge_unset(u);
    CHECK(isnan(loom_metric_value(u)), "unset gauge has value %g", loom_metric_value(u));
    loom_metrics_free(r);
}

static void test_format_value(void) {
    double v[] = {0.1, 1.0 / 3, 1e300, -2.5e-7, 123456789012345678.0, 3};
    char buf[40];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        loom_metrics_format_value(buf, sizeof buf, v[i]);
        CHECK(strtod(buf, NULL) == v[i], "%.17g written as %s", v[i], buf);
    }
    loom_metrics_format_value(buf, sizeof buf, 0.1);
    CHECK(!strcmp(buf, "0.1"), "0.1 as %s", buf);
    loom_metrics_format_value(buf, sizeof buf, NAN);
    CHECK(!strcmp(buf, "NaN"), "NaN as %s", buf);
    loom_metrics_format_value(buf, sizeof buf, -INFINITY);
    CHECK(!strcmp(buf, "-Inf"), "-Inf as %s", buf);
}

/* histogram_quantile by hand: buckets (0,1]:2, (1,2]:6, (2,4]:2, +Inf:0.
 * q=0.5: rank 5, in (1,2] after 2 -> 1 + (5-2)/6 = 1.5.
 * q=0.9: rank 9, in (2,4] after 8 -> 2 + 2*(9-8)/2 = 3. */
static void test_quantile(void) {
    loom_metrics_t *r = loom_metrics_new();
    double b[] = {1, 2, 4};
    loom_metric_t *h = loom_metrics_histogram(r, "q_seconds", "x", b, 3, NULL);
    CHECK(isnan(loom_histogram_quantile(h, 0.5)), "empty histogram has a quantile");
    double obs[] = {0.5, 1, 1.5, 1.5, 1.5, 1.5, 2, 2, 3, 4};
    for (int i = 0; i < 10; i++) loom_histogram_observe(h, obs[i]);
    CHECK(fabs(loom_histogram_quantile(h, 0.5) - 1.5) < 1e-12, "p50 %g", loom_histogram_quantile(h, 0.5));
    CHECK(fabs(loom_histogram_quantile(h, 0.9) - 3) < 1e-12, "p90 %g", loom_histogram_quantile(h, 0.9));
    loom_histogram_observe(h, 100);
    CHECK(loom_histogram_quantile(h, 1.0) == 4, "p100 in +Inf should be the top finite bound, got %g", loom_histogram_quantile(h, 1.0));
    CHECK(loom_metric_value(h) == 11 && loom_histogram_sum(h) == 118.5, "count %g sum %g", loom_metric_value(h), loom_histogram_sum(h));
    loom_metrics_free(r);
}

/* Concurrency: two writer threads, 10^6 updates each, one reader
 * rendering all the while. */
#define N_UPDATES 1000000
typedef struct {
    loom_metric_t *c, *g, *h;
} writer_ctx_t;

static void *writer(void *arg) {
    writer_ctx_t *w = arg;
    for (int i = 0; i < N_UPDATES; i++) {
        loom_counter_add(w->c, 1);
        loom_gauge_add(w->g, (i & 1) ? -1 : 1);
        loom_histogram_observe(w->h, (double)(i % 4));
    }
    return NULL;
}

/* Values of lines starting with `prefix` in the exposition, in order. */
static int values_of(const char *text, const char *prefix, double *out, int cap) {
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; *p && n < cap;) {
        if (!strncmp(p, prefix, pl)) out[n++] = strtod(strrchr(strndupa(p, strcspn(p, "\n")), ' ') + 1, NULL);
        p += strcspn(p, "\n");
        if (*p) p++;
    }
    return n;
}

static void test_concurrent_updates(void) {
    loom_metrics_t *r = loom_metrics_new();
    double b[] = {0.5, 1.5, 2.5};
    writer_ctx_t w = {loom_metrics_counter(r, "c_total", "x", "rank", "0", NULL), loom_metrics_gauge(r, "g", "x", NULL),
                      loom_metrics_histogram(r, "h_seconds", "x", b, 3, NULL)};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, writer, &w);
    int renders = 0, bad = 0;
    double last_count = 0;
    for (; renders < 2000; renders++) { /* consistent while updated */
        char *text = loom_metrics_render(r, NULL);
        double bk[4], cnt[1], c[1];
        int nb = values_of(text, "h_seconds_bucket", bk, 4), nc = values_of(text, "h_seconds_count", cnt, 1);
        values_of(text, "c_total", c, 1);
        if (nb != 4 || nc != 1 || bk[3] != cnt[0] || bk[0] > bk[1] || bk[1] > bk[2] || bk[2] > bk[3] || c[0] < last_count) {
            if (bad++ < 3) printf("  inconsistent exposition during updates:\n%s", text);
        }
        last_count = c[0];
        free(text);
        if (loom_metric_value(w.c) >= 2.0 * N_UPDATES) break;
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("  %d renders while 2 threads updated\n", renders);
    CHECK(bad == 0, "%d of %d renders inconsistent", bad, renders);
    CHECK(loom_metric_value(w.c) == 2.0 * N_UPDATES, "counter %.0f, want %d", loom_metric_value(w.c), 2 * N_UPDATES);
    CHECK(loom_metric_value(w.g) == 0, "gauge %g, want 0", loom_metric_value(w.g));
    CHECK(loom_metric_value(w.h) == 2.0 * N_UPDATES, "histogram count %.0f", loom_metric_value(w.h));
    /* each thread observes 0,1,2,3 repeated: sum 1.5 per observation */
    CHECK(loom_histogram_sum(w.h) == 3.0 * N_UPDATES, "histogram sum %.0f, want %d", loom_histogram_sum(w.h), 3 * N_UPDATES);
    uint64_t counts[4];
    loom_histogram_counts(w.h, counts, 4);
    for (int i = 0; i < 4; i++) CHECK(counts[i] == N_UPDATES / 2, "bucket %d has %llu", i, (unsigned long long)counts[i]);
    loom_metrics_free(r);
}

/* promtool accepts every metric type with awkward label values. */
static void test_promtool(void) {
    if (system("command -v promtool > /dev/null 2>&1") != 0) {
        check_skip("promtool not installed (Debian package prometheus)");
        return;
    }
    loom_metrics_t *r = loom_metrics_new();
    loom_counter_add(loom_metrics_counter(r, "loom_x_tokens_total", "Tokens.", "rank", "0", "model", "quote\" backslash\\ newline\n é", NULL), 7);
    loom_gauge_set(loom_metrics_gauge(r, "loom_x_ratio", "Ratio.", "rank", "0", NULL), NAN);
    loom_gauge_set(loom_metrics_gauge(r, "loom_x_bytes", "Bytes.", "rank", "1", NULL), 1e12);
    loom_metrics_untyped(r, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ.", "gpu", "0", NULL);
    double b[] = {0.001, 0.01, 0.1, 1, 10};
    loom_metric_t *h = loom_metrics_histogram(r, "loom_x_latency_seconds", "Latency.", b, 5, "route", "/v1/{x}", NULL);
    for (int i = 0; i < 100; i++) loom_histogram_observe(h, i * 0.013);
    char path[] = "/tmp/loom-promtool-XXXXXX";
    int fd = mkstemp(path);
    size_t len;
    char *text = loom_metrics_render(r, &len);
    CHECK(write(fd, text, len) == (ssize_t)len, "write");
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    CHECK(rc == 0, "promtool: %s\n%s", out, text);
    unlink(path);
    free(text);
    loom_metrics_free(r);
}

/* A blocking HTTP/1.0 exchange with 127.0.0.1:port; the whole response. */
static char *http_do(int port, const char *request) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return strdup("(connect failed)");
    }
    if (write(fd, request, strlen(request)) < 0) return strdup("(write failed)");
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

static void echo(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    char text[256];
    const char *q = loom_http_query(req, "x");
    snprintf(text, sizeof text, "%s %s body=[%s] x=%s ctx=%s", req->method, req->path, req->body, q ? q : "-", (const char *)ctx);
    loom_http_reply(resp, 201, "text/plain", text, -1);
}

typedef struct {
    int left;
} stream_ctx_t;

static long stream_chunk(void *sctx, char *buf, size_t max) {
    stream_ctx_t *s = sctx;
    if (s->left == 0) return -1;
    return snprintf(buf, max, "data: %d\n\n", s->left--);
}

static void streamer(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    stream_ctx_t *s = malloc(sizeof *s);
    s->left = 3;
    resp->content_type = "text/event-stream";
    resp->stream = stream_chunk;
    resp->stream_free = free;
    resp->sctx = s;
}

static void test_http_server(void) {
    loom_http_route_t routes[] = {{"POST", "/v1/echo", echo, "post"}, {"GET", "/v1/*", echo, "prefix"}, {"GET", "/stream", streamer, NULL}};
    loom_http_t *h;
    CHECK(loom_http_start(&h, "127.0.0.1", 0, routes, 3) == LOOM_OK, "%s", loom_errmsg());
    int port = loom_http_port(h);
    CHECK(port > 0, "port %d", port);
    char *r = http_do(port, "POST /v1/echo HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello");
    CHECK(strstr(r, " 201 ") && strstr(r, "POST /v1/echo body=[hello] x=- ctx=post"), "%s", r);
    free(r);
    r = http_do(port, "GET /v1/models?x=42 HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, "GET /v1/models body=[] x=42 ctx=prefix"), "%s", r);
    free(r);
    r = http_do(port, "GET /nothing HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, " 404 ") && strstr(r, "/v1/echo"), "%s", r);
    free(r);
    r = http_do(port, "DELETE /stream HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, " 405 "), "%s", r);
    free(r);
    r = http_do(port, "GET /stream HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, "data: 3\n\ndata: 2\n\ndata: 1\n\n") && strstr(r, "text/event-stream"), "%s", r);
    free(r);
    /* A body above 16 MiB is refused with 413, and the server goes on. */
    size_t big = (17u << 20);
    char *req = malloc(big + 128);
    int hl = snprintf(req, 128, "POST /v1/echo HTTP/1.0\r\nContent-Length: %zu\r\n\r\n", big);
    memset(req + hl, 'x', big);
    req[hl + big] = 0;
    r = http_do(port, req);
    CHECK(strstr(r, " 413 ") != NULL, "%.200s", r);
    free(r);
    free(req);
    r = http_do(port, "GET /v1/after HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, "GET /v1/after") != NULL, "%s", r);
    free(r);
    /* The same port again: a one-line reason. */
    loom_http_t *h2;
    CHECK(loom_http_start(&h2, "127.0.0.1", port, routes, 1) == LOOM_EIO, "second server on a busy port started");
    CHECK(strstr(loom_errmsg(), "in use") && strstr(loom_errmsg(), "pick another"), "message: %s", loom_errmsg());
    CHECK(loom_http_start(&h2, "no.such.host.invalid", 0, routes, 1) != LOOM_OK, "bad host accepted");
    loom_http_stop(h);
}

static void test_dashboard_json(void) {
    loom_metrics_t *r = loom_metrics_new();
    loom_metric_t *loss = loom_metrics_gauge(r, "loss", "x", NULL), *tok = loom_metrics_counter(r, "tokens_total", "x", NULL);
    double b[] = {0.1, 0.2, 0.4};
    loom_metric_t *lat = loom_metrics_histogram(r, "lat_seconds", "x", b, 3, NULL);
    loom_dashboard_line_t lines[] = {
        {"loss", "train", loss, LOOM_LINE_VALUE, 0, 0, NULL},
        {"throughput", "tokens/s", tok, LOOM_LINE_RATE, 0, 0, NULL},
        {"latency (ms)", "p50", lat, LOOM_LINE_QUANTILE, 0.5, 1000, NULL},
        {"GPU power (W)", "power", NULL, LOOM_LINE_VALUE, 0, 0, "no GPU telemetry: test"},
    };
    loom_dashboard_t *d;
    CHECK(loom_dashboard_start(&d, "test \"run\"", r, lines, 4, 3600) == LOOM_OK, "%s", loom_errmsg());
    loom_gauge_set(loss, 2.5);
    loom_dashboard_sample(d);
    loom_counter_add(tok, 1000);
    loom_histogram_observe(lat, 0.15);
    loom_histogram_observe(lat, 0.15);
    loom_dashboard_sample(d);
    loom_dashboard_note(d, "note one");
    char *j = loom_dashboard_json(d);
    cJSON *root = cJSON_Parse(j);
    CHECK(root != NULL, "not JSON: %s", j);
    cJSON *charts = cJSON_GetObjectItem(root, "charts");
    CHECK(cJSON_GetArraySize(charts) == 4, "%d charts", cJSON_GetArraySize(charts));
    cJSON *l = cJSON_GetObjectItem(cJSON_GetArrayItem(charts, 0), "data");
    CHECK(cJSON_GetArraySize(l) == 2 && cJSON_GetArrayItem(cJSON_GetArrayItem(l, 1), 1)->valuedouble == 2.5, "loss data %s", j);
    cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(charts, 1), "data");
    cJSON *rate = cJSON_GetArrayItem(cJSON_GetArrayItem(t, 1), 1);
    CHECK(cJSON_IsNumber(rate) && rate->valuedouble > 0, "rate %s", j);
    cJSON *q = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(charts, 2), "data"), 1), 1);
    CHECK(cJSON_IsNumber(q) && fabs(q->valuedouble - 150) < 1e-9, "p50 ms (want 0.1 + 0.1*1/2 = 0.15 s) %s", j);
    cJSON *miss = cJSON_GetObjectItem(cJSON_GetArrayItem(charts, 3), "missing");
    CHECK(cJSON_IsString(miss) && !strcmp(miss->valuestring, "no GPU telemetry: test"), "missing %s", j);
    CHECK(!strcmp(cJSON_GetObjectItem(root, "title")->valuestring, "test \"run\""), "title");
    cJSON_Delete(root);
    free(j);
    loom_dashboard_stop(d);
    loom_metrics_free(r);
}

int main(void) {
    RUN(test_exposition_text);
    RUN(test_declaration_rules);
    RUN(test_format_value);
    RUN(test_quantile);
    RUN(test_concurrent_updates);
    RUN(test_promtool);
    RUN(test_http_server);
    RUN(test_dashboard_json);
    return check_main_end();
}
