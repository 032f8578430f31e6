/* metrics: a registry of counters, gauges and histograms with labels,
 * rendered in the Prometheus text exposition format (version 0.0.4).
 *
 * Declaring a series takes the registry's lock; updating one does not:
 * every value is an atomic, so training threads, HTTP handler threads and
 * the scraper never wait on each other. Declare once, keep the handle:
 *
 *     loom_metric_t *loss = loom_metrics_gauge(reg, "loom_train_loss",
 *                                              "Training loss.", "rank", "0", NULL);
 *     loom_gauge_set(loss, 3.14);   // lock-free
 *
 * Every update function accepts a NULL handle and does nothing, so a
 * caller whose declaration failed (the message is in loom_errmsg()) keeps
 * running without metrics.
 *
 * A gauge is not exposed until it is first set: a quantity that cannot be
 * read (NVML utilisation on a MIG instance) is absent, never a false 0.
 * Counters and histograms are exposed from their declaration on. */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

typedef enum {
    LOOM_METRIC_COUNTER,   /* only goes up; names end in _total */
    LOOM_METRIC_GAUGE,     /* goes up and down */
    LOOM_METRIC_HISTOGRAM, /* observations counted into fixed buckets */
    LOOM_METRIC_UNTYPED    /* a foreign name whose type we do not claim (DCGM's energy counter) */
} loom_metric_type;

typedef struct loom_metrics loom_metrics_t; /* the registry */
typedef struct loom_metric loom_metric_t;   /* one series: a family and its label values */

/* A new, empty registry. */
loom_metrics_t *loom_metrics_new(void);
/* Free the registry and every series handle it gave out. NULL is fine. */
void loom_metrics_free(loom_metrics_t *r);

/* The series NAME{label=value,...} of a counter, gauge or untyped family,
 * declared on first use. The variadic part is label name/value pairs
 * ending with NULL; every series of a family has the same label names in
 * the same order. Returns the same handle for the same name and labels.
 * NULL (with loom_error) for an invalid metric or label name, a name
 * declared before with another type or label names, or a reserved label. */
loom_metric_t *loom_metrics_counter(loom_metrics_t *r, const char *name, const char *help, ...);
loom_metric_t *loom_metrics_gauge(loom_metrics_t *r, const char *name, const char *help, ...);
loom_metric_t *loom_metrics_untyped(loom_metrics_t *r, const char *name, const char *help, ...);
/* A histogram series with `nb` ascending finite bucket upper bounds (the
 * +Inf bucket is implied); the first declaration of a name fixes them. */
loom_metric_t *loom_metrics_histogram(loom_metrics_t *r, const char *name, const char *help,
                                      const double *bounds, int nb, ...);

/* A subsystem's fixed set of counters and gauges, as a table. */
typedef struct {
    int counter; /* 1 a counter, 0 a gauge */
    const char *name, *help;
} loom_metric_def_t;
/* Declare defs[0..n) into out[0..n), each with the one label
 * `label`=`value` (label NULL: none). */
void loom_metrics_declare(loom_metrics_t *r, const loom_metric_def_t *defs, int n, const char *label, const char *value,
                          loom_metric_t **out);

/* Lock-free updates. Counters ignore negative or NaN increments. */
void loom_counter_add(loom_metric_t *m, double v);
void loom_gauge_set(loom_metric_t *m, double v);
void loom_gauge_add(loom_metric_t *m, double v);
void loom_histogram_observe(loom_metric_t *m, double v);
/* A set gauge goes back to "never set": not exposed until set again. */
void loom_gauge_unset(loom_metric_t *m);

/* The current value of a counter or gauge (NaN for a gauge never set);
 * for a histogram, its observation count. 0 for NULL. */
double loom_metric_value(const loom_metric_t *m);
/* A histogram's sum of observations. */
double loom_histogram_sum(const loom_metric_t *m);
/* The q-quantile (0..1) of a histogram, by linear interpolation inside
 * the bucket that holds it, as PromQL's histogram_quantile() does; NaN
 * when it has no observations. */
double loom_histogram_quantile(const loom_metric_t *m, double q);

/* Copy a histogram's per-bucket counts (not cumulative; the last is +Inf)
 * into counts[0..cap); returns the number of buckets (finite + 1), 0 for
 * a series that is not a histogram. */
int loom_histogram_counts(const loom_metric_t *m, uint64_t *counts, int cap);
/* The q-quantile of per-bucket counts of m's buckets (such as the
 * difference of two loom_histogram_counts snapshots: a recent window). */
double loom_histogram_quantile_of(const loom_metric_t *m, const uint64_t *counts, double q);

/* Find a series that was declared already (NULL if none). The variadic
 * part is label name/value pairs ending with NULL, as at declaration. */
loom_metric_t *loom_metrics_find(loom_metrics_t *r, const char *name, ...);

/* Register fn(ctx) to run before each render (and each
 * loom_metrics_collect): the place to read telemetry that is sampled on
 * demand (NVML, RAPL, process memory). At most 16 hooks. */
loom_status loom_metrics_on_collect(loom_metrics_t *r, void (*fn)(void *ctx), void *ctx);
/* Remove a hook registered with the same fn and ctx (before ctx is freed). */
void loom_metrics_off_collect(loom_metrics_t *r, void (*fn)(void *ctx), void *ctx);
/* Run the collect hooks now (one caller at a time). */
void loom_metrics_collect(loom_metrics_t *r);

/* Render every family in the text exposition format: # HELP, # TYPE,
 * escaped label values, _bucket{le=...}/_sum/_count for histograms.
 * Runs the collect hooks first. Returns a malloc'd NUL-terminated string
 * (its length in *len when len is not NULL); the caller frees it. */
char *loom_metrics_render(loom_metrics_t *r, size_t *len);

/* Write v the way Prometheus reads it back exactly: shortest round-trip
 * decimal, NaN, +Inf, -Inf. `buf` needs 32 bytes. */
void loom_metrics_format_value(char *buf, size_t cap, double v);

#endif
