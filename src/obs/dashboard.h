/* dashboard: the live page at GET / of a metrics port (training) or of
 * the inference server. One self-contained HTML page, no internet: it
 * draws its charts with dygraphs, served from the file Debian's
 * libjs-dygraphs installs, and refreshes every few seconds from
 * /dashboard.json.
 *
 * The charts are lines over the registry's series, sampled by a thread
 * every `period_s` seconds into a bounded history (when full, every other
 * point is dropped and sampling slows down by half, so the whole run stays
 * on the chart). A chart whose every line has no series (no GPU
 * telemetry) shows its `missing` text instead of an empty chart. */
#ifndef LOOM_DASHBOARD_H
#define LOOM_DASHBOARD_H

#include "obs/http.h"
#include "obs/metrics.h"

typedef enum {
    LOOM_LINE_VALUE,   /* the series' value (a gauge; a counter's total) */
    LOOM_LINE_RATE,    /* a counter's increase per second since the last sample */
    LOOM_LINE_QUANTILE /* a histogram's q-quantile over the observations since the last sample */
} loom_line_kind;

typedef struct {
    const char *chart;   /* chart title; lines with the same title share a chart */
    const char *label;   /* the line's name in the legend */
    loom_metric_t *m;    /* the series; NULL = none on this machine */
    loom_line_kind kind;
    double q;            /* the quantile, for LOOM_LINE_QUANTILE */
    double scale;        /* values are multiplied by this (0 = 1) */
    const char *missing; /* shown instead of the chart when no line of it has a series */
} loom_dashboard_line_t;

typedef struct loom_dashboard loom_dashboard_t;

/* The path of the dygraphs script served at /dygraph.min.js:
 * LOOM_DYGRAPHS_JS, else the copy `make install` puts in
 * <binary>/../share/loom/dygraphs/, else Debian's
 * /usr/share/javascript/dygraphs/dygraph.min.js (libjs-dygraphs). */
const char *loom_dashboard_js_path(void);

/* Start sampling `lines` (copied, at most 32; their strings must outlive
 * the dashboard) from `reg` every period_s seconds (0 = 1). When the
 * charting script is missing, says so once in the log; the page then
 * shows the latest values and how to install it. */
loom_status loom_dashboard_start(loom_dashboard_t **out, const char *title, loom_metrics_t *reg,
                                 const loom_dashboard_line_t *lines, int n, double period_s);
/* A line of text shown at the top of the page (at most 8), such as the
 * telemetry status. */
void loom_dashboard_note(loom_dashboard_t *d, const char *text);
/* Take a sample now (the thread also does every period). */
void loom_dashboard_sample(loom_dashboard_t *d);
/* The dashboard's routes (GET /, /dashboard.json, /dygraph.min.js,
 * /dygraph.css) into out[0..4); returns 4. Mount them next to a server's
 * own routes. */
int loom_dashboard_routes(loom_dashboard_t *d, loom_http_route_t *out);
/* GET /metrics: the registry in the Prometheus text format. */
loom_http_route_t loom_dashboard_metrics_route(loom_metrics_t *reg);
/* The JSON the page reads (title, notes, charts with their points);
 * malloc'd, the caller frees it. */
char *loom_dashboard_json(loom_dashboard_t *d);
/* Stop the sampling thread and free. NULL is fine. */
void loom_dashboard_stop(loom_dashboard_t *d);

#endif
