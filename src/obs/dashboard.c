/* dashboard: sampled history of chosen series and the page that charts it
 * (see dashboard.h). */
#define _GNU_SOURCE
#include "obs/dashboard.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/sbuf.h"

#define MAX_LINES 32
#define MAX_NOTES 8
#define MAX_BUCKETS 64
#define HISTORY 1024 /* points kept per line */

typedef struct {
    loom_dashboard_line_t spec;
    double prev_v, prev_t;          /* LOOM_LINE_RATE */
    uint64_t prev[MAX_BUCKETS];     /* LOOM_LINE_QUANTILE: bucket counts at the last sample */
    double *v;                      /* HISTORY values */
} line_t;

struct loom_dashboard {
    pthread_mutex_t lock; /* history, notes */
    pthread_cond_t wake;
    pthread_t thread;
    int running;
    char title[256];
    loom_metrics_t *reg;
    line_t lines[MAX_LINES];
    int nlines;
    double t0, period;
    double t[HISTORY];
    int n, stride, tick; /* points kept; keep every stride-th sample */
    char *notes[MAX_NOTES];
    int nnotes;
    char *js, *css;      /* the charting library, read at start (NULL when missing) */
    size_t js_len, css_len;
    char js_missing[512];
};

const char *loom_dashboard_js_path(void) {
    static char installed[PATH_MAX + 64];
    const char *p = getenv("LOOM_DYGRAPHS_JS");
    if (p && *p) return p;
    /* `make install` puts a copy beside the binary's share folder, so an
     * installed loom (or a container image) finds it wherever it lives. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        snprintf(installed, sizeof installed, "%s/../share/loom/dygraphs/dygraph.min.js", exe);
        if (access(installed, R_OK) == 0) return installed;
    }
    return "/usr/share/javascript/dygraphs/dygraph.min.js";
}

/* One line's value now, or NaN. */
static double line_value(line_t *l, double now) {
    const loom_dashboard_line_t *s = &l->spec;
    double scale = s->scale != 0 ? s->scale : 1, v = NAN;
    if (!s->m) return NAN;
    if (s->kind == LOOM_LINE_VALUE) {
        v = loom_metric_value(s->m);
    } else if (s->kind == LOOM_LINE_RATE) {
        double cur = loom_metric_value(s->m);
        if (l->prev_t > 0 && now > l->prev_t) v = (cur - l->prev_v) / (now - l->prev_t);
        l->prev_v = cur;
        l->prev_t = now;
    } else {
        uint64_t cur[MAX_BUCKETS], d[MAX_BUCKETS];
        int nb = loom_histogram_counts(s->m, cur, MAX_BUCKETS);
        if (nb > MAX_BUCKETS) return NAN;
        for (int i = 0; i < nb; i++) d[i] = cur[i] - l->prev[i];
        v = loom_histogram_quantile_of(s->m, d, s->q);
        memcpy(l->prev, cur, (size_t)nb * sizeof *cur);
    }
    return v * scale;
}

/* History full: keep every other point, sample half as often. */
static void halve(loom_dashboard_t *d) {
    for (int i = 0; i < d->n / 2; i++) {
        d->t[i] = d->t[2 * i + 1];
        for (int k = 0; k < d->nlines; k++) d->lines[k].v[i] = d->lines[k].v[2 * i + 1];
    }
    d->n /= 2;
    d->stride *= 2;
}

void loom_dashboard_sample(loom_dashboard_t *d) {
    if (!d) return;
    loom_metrics_collect(d->reg);
    double now = loom_now();
    pthread_mutex_lock(&d->lock);
    double vals[MAX_LINES];
    for (int k = 0; k < d->nlines; k++) vals[k] = line_value(&d->lines[k], now);
    if (d->tick++ % d->stride == 0) {
        if (d->n == HISTORY) halve(d);
        d->t[d->n] = now - d->t0;
        for (int k = 0; k < d->nlines; k++) d->lines[k].v[d->n] = vals[k];
        d->n++;
    }
    pthread_mutex_unlock(&d->lock);
}

static void *sampler(void *arg) {
    loom_dashboard_t *d = arg;
    pthread_mutex_lock(&d->lock);
    while (d->running) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double when = ts.tv_sec + ts.tv_nsec / 1e9 + d->period;
        ts.tv_sec = (time_t)when;
        ts.tv_nsec = (long)((when - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&d->wake, &d->lock, &ts);
        if (!d->running) break;
        pthread_mutex_unlock(&d->lock);
        loom_dashboard_sample(d);
        pthread_mutex_lock(&d->lock);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

static char *read_file(const char *path, size_t *len, char *why, size_t cap) {
    char *data;
    if (loom_file_read(path, &data, len) != LOOM_OK) {
        snprintf(why, cap, "the charting library is missing: %s (%s); install Debian's libjs-dygraphs (apt-get install libjs-dygraphs) or set LOOM_DYGRAPHS_JS",
                 path, loom_errmsg());
        return NULL;
    }
    return data;
}

loom_status loom_dashboard_start(loom_dashboard_t **out, const char *title, loom_metrics_t *reg,
                                 const loom_dashboard_line_t *lines, int n, double period_s) {
    *out = NULL;
    if (n > MAX_LINES) return loom_error(LOOM_EINTERNAL, "dashboard: %d lines, at most %d", n, MAX_LINES);
    loom_dashboard_t *d = loom_calloc(1, sizeof *d);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->wake, NULL);
    snprintf(d->title, sizeof d->title, "%s", title);
    d->reg = reg;
    d->nlines = n;
    for (int k = 0; k < n; k++) {
        d->lines[k].spec = lines[k];
        d->lines[k].v = loom_malloc(HISTORY * sizeof(double));
    }
    d->t0 = loom_now();
    d->period = period_s > 0 ? period_s : 1.0;
    d->stride = 1;
    const char *js = loom_dashboard_js_path();
    d->js = read_file(js, &d->js_len, d->js_missing, sizeof d->js_missing);
    if (!d->js) loom_warn("dashboard: %s; the page shows the latest values without charts", d->js_missing);
    char css[4096], ignore[8];
    snprintf(css, sizeof css, "%.*s.css", (int)(strlen(js) > 7 && !strcmp(js + strlen(js) - 7, ".min.js") ? strlen(js) - 7 : strlen(js)), js);
    d->css = read_file(css, &d->css_len, ignore, 1);
    d->running = 1;
    if (pthread_create(&d->thread, NULL, sampler, d) != 0) {
        d->running = 0;
        loom_dashboard_stop(d);
        return loom_error(LOOM_EINTERNAL, "dashboard: cannot start the sampling thread");
    }
    *out = d;
    return LOOM_OK;
}

void loom_dashboard_note(loom_dashboard_t *d, const char *text) {
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    if (d->nnotes < MAX_NOTES) d->notes[d->nnotes++] = loom_strdup(text);
    pthread_mutex_unlock(&d->lock);
}

void loom_dashboard_stop(loom_dashboard_t *d) {
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    int was = d->running;
    d->running = 0;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->lock);
    if (was) pthread_join(d->thread, NULL);
    for (int k = 0; k < d->nlines; k++) free(d->lines[k].v);
    for (int i = 0; i < d->nnotes; i++) free(d->notes[i]);
    free(d->js);
    free(d->css);
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void json_str(loom_sbuf_t *b, const char *s) {
    loom_sbuf_putc(b, '"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') loom_sbuf_printf(b, "\\%c", c);
        else if (c < 0x20) loom_sbuf_printf(b, "\\u%04x", c);
        else loom_sbuf_putc(b, (char)c);
    }
    loom_sbuf_putc(b, '"');
}

static void json_num(loom_sbuf_t *b, double v) {
    if (!isfinite(v)) {
        loom_sbuf_puts(b, "null");
        return;
    }
    char num[40];
    loom_metrics_format_value(num, sizeof num, v);
    loom_sbuf_puts(b, num);
}

/* One chart: the lines [k0, k1) that share a title. */
static void json_chart(loom_sbuf_t *b, loom_dashboard_t *d, int k0, int k1) {
    int any = 0;
    const char *missing = NULL;
    for (int k = k0; k < k1; k++) {
        any |= d->lines[k].spec.m != NULL;
        if (d->lines[k].spec.missing) missing = d->lines[k].spec.missing;
    }
    loom_sbuf_puts(b, "{\"title\":");
    json_str(b, d->lines[k0].spec.chart);
    loom_sbuf_puts(b, ",\"missing\":");
    if (any) loom_sbuf_puts(b, "null");
    else json_str(b, missing ? missing : "no data on this machine");
    loom_sbuf_puts(b, ",\"labels\":[\"seconds\"");
    for (int k = k0; k < k1; k++) {
        loom_sbuf_putc(b, ',');
        json_str(b, d->lines[k].spec.label);
    }
    loom_sbuf_puts(b, "],\"data\":[");
    for (int i = 0; any && i < d->n; i++) {
        loom_sbuf_printf(b, "%s[", i ? "," : "");
        json_num(b, d->t[i]);
        for (int k = k0; k < k1; k++) {
            loom_sbuf_putc(b, ',');
            json_num(b, d->lines[k].v[i]);
        }
        loom_sbuf_putc(b, ']');
    }
    loom_sbuf_puts(b, "]}");
}

char *loom_dashboard_json(loom_dashboard_t *d) {
    loom_sbuf_t b = {0};
    pthread_mutex_lock(&d->lock);
    loom_sbuf_puts(&b, "{\"title\":");
    json_str(&b, d->title);
    loom_sbuf_printf(&b, ",\"period_s\":%g,\"charts_missing\":", d->period);
    if (d->js) loom_sbuf_puts(&b, "null");
    else json_str(&b, d->js_missing);
    loom_sbuf_puts(&b, ",\"notes\":[");
    for (int i = 0; i < d->nnotes; i++) {
        if (i) loom_sbuf_putc(&b, ',');
        json_str(&b, d->notes[i]);
    }
    loom_sbuf_puts(&b, "],\"charts\":[");
    for (int k0 = 0, k1; k0 < d->nlines; k0 = k1) {
        for (k1 = k0 + 1; k1 < d->nlines && !strcmp(d->lines[k1].spec.chart, d->lines[k0].spec.chart);) k1++;
        if (k0) loom_sbuf_putc(&b, ',');
        json_chart(&b, d, k0, k1);
    }
    loom_sbuf_puts(&b, "]}");
    pthread_mutex_unlock(&d->lock);
    return b.data;
}

/* The page: fetches dashboard.json every few seconds and draws one
 * dygraph per chart; each chart's element carries data-points (rows with
 * a value) so that a test can read what was drawn from the DOM. */
static const char page_html[] =
    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>loom</title>\n"
    "<link rel=\"stylesheet\" href=\"dygraph.css\">\n"
    "<script src=\"dygraph.min.js\"></script>\n"
    "<style>body{font-family:sans-serif;margin:16px;background:#fafafa;color:#222}"
    "h1{font-size:20px;margin:0 0 6px}.note{color:#555;font-size:13px;margin:2px 0}"
    "#grid{display:flex;flex-wrap:wrap;gap:14px;margin-top:12px}"
    ".chart{background:#fff;border:1px solid #ddd;padding:8px;width:440px}"
    ".chart h2{font-size:14px;margin:0 0 4px}.plot{width:430px;height:200px}"
    ".missing{height:200px;display:flex;align-items:center;justify-content:center;color:#a33;text-align:center;font-size:14px}"
    "#warn{color:#a33}</style></head>\n"
    "<body><h1 id=\"title\">loom</h1><div id=\"notes\"></div><div id=\"warn\"></div><div id=\"grid\"></div>\n"
    "<script>\n"
    "var graphs = {};\n"
    "function el(tag, cls, text) { var e = document.createElement(tag); if (cls) e.className = cls;"
    " if (text !== undefined) e.textContent = text; return e; }\n"
    "function last(rows, i) { for (var r = rows.length - 1; r >= 0; r--) if (rows[r][i] !== null) return rows[r][i]; return null; }\n"
    "function fmt(v) { return v === null ? 'n/a' : (Math.abs(v) >= 1000 || v === Math.round(v) ? v.toFixed(0) : v.toPrecision(4)); }\n"
    "function draw(d) {\n"
    "  document.getElementById('title').textContent = d.title; document.title = d.title;\n"
    "  var notes = document.getElementById('notes'); notes.innerHTML = '';\n"
    "  d.notes.forEach(function (n) { notes.appendChild(el('div', 'note', n)); });\n"
    "  var charts = typeof Dygraph !== 'undefined';\n"
    "  document.getElementById('warn').textContent = charts ? '' : (d.charts_missing || 'the charting library did not load');\n"
    "  var grid = document.getElementById('grid');\n"
    "  d.charts.forEach(function (c, i) {\n"
    "    var id = 'chart' + i, box = document.getElementById(id);\n"
    "    if (!box) { box = el('div', 'chart'); box.id = id; box.appendChild(el('h2', '', c.title));"
    " box.appendChild(el('div', c.missing ? 'missing' : 'plot')); box.appendChild(el('div', 'latest')); grid.appendChild(box); }\n"
    "    var body = box.children[1], latest = box.children[2];\n"
    "    var pts = c.data.filter(function (r) { return r.slice(1).some(function (v) { return v !== null; }); }).length;\n"
    "    box.setAttribute('data-title', c.title); box.setAttribute('data-points', c.missing ? 0 : pts);\n"
    "    if (c.missing) { body.textContent = c.missing; box.setAttribute('data-missing', c.missing); return; }\n"
    "    latest.textContent = c.labels.slice(1).map(function (l, k) { return l + ': ' + fmt(last(c.data, k + 1)); }).join('   ');\n"
    "    if (!charts || c.data.length === 0) return;\n"
    "    if (!graphs[id]) graphs[id] = new Dygraph(body, c.data, {labels: c.labels, xlabel: 'seconds', drawPoints: true,"
    " connectSeparatedPoints: true, legend: 'always', labelsSeparateLines: false});\n"
    "    else graphs[id].updateOptions({file: c.data});\n"
    "  });\n"
    "  document.body.setAttribute('data-updated', Date.now());\n"
    "}\n"
    "function refresh() { fetch('dashboard.json').then(function (r) { return r.json(); }).then(draw)"
    ".catch(function (e) { document.getElementById('warn').textContent = 'cannot reach the loom process: ' + e; }); }\n"
    "refresh(); setInterval(refresh, 3000);\n"
    "</script></body></html>\n";

static void serve_page(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_http_reply(resp, 200, "text/html; charset=utf-8", page_html, (long)sizeof page_html - 1);
}

static void serve_json(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    char *j = loom_dashboard_json(ctx);
    resp->status = 200;
    resp->content_type = "application/json";
    resp->body = j;
    resp->body_len = strlen(j);
    resp->headers[0][0] = "Cache-Control";
    resp->headers[0][1] = "no-store";
}

static void serve_js(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_dashboard_t *d = ctx;
    if (d->js) loom_http_reply(resp, 200, "application/javascript", d->js, (long)d->js_len);
    else loom_http_reply(resp, 404, NULL, d->js_missing, -1);
}

static void serve_css(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    loom_dashboard_t *d = ctx;
    if (d->css) loom_http_reply(resp, 200, "text/css", d->css, (long)d->css_len);
    else loom_http_reply(resp, 200, "text/css", "", 0);
}

int loom_dashboard_routes(loom_dashboard_t *d, loom_http_route_t *out) {
    out[0] = (loom_http_route_t){"GET", "/", serve_page, d};
    out[1] = (loom_http_route_t){"GET", "/dashboard.json", serve_json, d};
    out[2] = (loom_http_route_t){"GET", "/dygraph.min.js", serve_js, d};
    out[3] = (loom_http_route_t){"GET", "/dygraph.css", serve_css, d};
    return 4;
}

static void serve_metrics(const loom_http_request_t *req, loom_http_response_t *resp, void *ctx) {
    size_t len;
    resp->body = loom_metrics_render(ctx, &len);
    resp->body_len = len;
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

loom_http_route_t loom_dashboard_metrics_route(loom_metrics_t *reg) {
    return (loom_http_route_t){"GET", "/metrics", serve_metrics, reg};
}
