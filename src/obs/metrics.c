/* metrics: the registry behind /metrics (see metrics.h). */
#define _GNU_SOURCE
#include "obs/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "obs/sbuf.h"

#define MAX_LABELS 12
#define MAX_HOOKS 16

typedef struct {
    char *name, *help;
    loom_metric_type type;
    int nlabels;
    char *labels[MAX_LABELS];
    double *bounds; /* histograms: nb finite upper bounds, ascending */
    int nb;
    loom_metric_t **series;
    int n, cap;
} family_t;

struct loom_metric {
    family_t *f;
    char *values[MAX_LABELS];
    _Atomic uint64_t bits; /* counter or gauge value, as the bits of a double */
    _Atomic int set;       /* gauges: set since declared (or unset) */
    _Atomic uint64_t *counts; /* histograms: nb + 1 per-bucket counts, the last is +Inf */
    _Atomic uint64_t sum_bits;
};

struct loom_metrics {
    pthread_mutex_t lock; /* families and series lists; never taken by updates */
    family_t **fam;
    int n, cap;
    pthread_mutex_t collect_lock;
    void (*hook_fn[MAX_HOOKS])(void *);
    void *hook_ctx[MAX_HOOKS];
    int nhooks;
};

static uint64_t d2u(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double u2d(uint64_t u) {
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Atomic double addition: a compare-and-swap loop on the bits. */
static void atomic_add_double(_Atomic uint64_t *p, double v) {
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d2u(u2d(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

loom_metrics_t *loom_metrics_new(void) {
    loom_metrics_t *r = loom_calloc(1, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->collect_lock, NULL);
    return r;
}

void loom_metrics_free(loom_metrics_t *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        family_t *f = r->fam[i];
        for (int j = 0; j < f->n; j++) {
            for (int k = 0; k < f->nlabels; k++) free(f->series[j]->values[k]);
            free(f->series[j]->counts);
            free(f->series[j]);
        }
        for (int k = 0; k < f->nlabels; k++) free(f->labels[k]);
        free(f->series);
        free(f->bounds);
        free(f->name);
        free(f->help);
        free(f);
    }
    free(r->fam);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->collect_lock);
    free(r);
}

static int valid_name(const char *s, int colon) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        int alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (colon && *p == ':');
        if (!alpha && !(p > s && *p >= '0' && *p <= '9')) return 0;
    }
    return 1;
}

static const char *type_name(loom_metric_type t) {
    static const char *names[] = {"counter", "gauge", "histogram", "untyped"};
    return names[t];
}

/* Label name/value pairs from a va_list into names/values; -1 on a bad list. */
static int read_labels(va_list ap, const char **names, const char **values) {
    int n = 0;
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k) return n;
        const char *v = va_arg(ap, const char *);
        if (n == MAX_LABELS || !v) return -1;
        names[n] = k;
        values[n++] = v;
    }
}

static family_t *find_family(loom_metrics_t *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->fam[i]->name, name)) return r->fam[i];
    return NULL;
}

static loom_metric_t *find_series(family_t *f, const char **values) {
    for (int i = 0; i < f->n; i++) {
        int same = 1;
        for (int k = 0; k < f->nlabels && same; k++) same = !strcmp(f->series[i]->values[k], values[k]);
        if (same) return f->series[i];
    }
    return NULL;
}

static loom_status check_labels(loom_metric_type type, const char *name, const char **names, int n) {
    for (int k = 0; k < n; k++) {
        if (!valid_name(names[k], 0) || !strncmp(names[k], "__", 2) || (type == LOOM_METRIC_HISTOGRAM && !strcmp(names[k], "le")))
            return loom_error(LOOM_EINTERNAL, "metric %s: label name '%s' is not allowed (letters, digits, _; not __*; not le on a histogram)",
                              name, names[k]);
        for (int j = 0; j < k; j++)
            if (!strcmp(names[j], names[k])) return loom_error(LOOM_EINTERNAL, "metric %s: label '%s' given twice", name, names[k]);
    }
    return LOOM_OK;
}

static family_t *new_family(loom_metrics_t *r, loom_metric_type type, const char *name, const char *help,
                            const char **names, int n, const double *bounds, int nb) {
    family_t *f = loom_calloc(1, sizeof *f);
    f->name = loom_strdup(name);
    f->help = loom_strdup(help ? help : "");
    f->type = type;
    f->nlabels = n;
    for (int k = 0; k < n; k++) f->labels[k] = loom_strdup(names[k]);
    if (type == LOOM_METRIC_HISTOGRAM) {
        f->nb = nb;
        f->bounds = loom_malloc((size_t)(nb > 0 ? nb : 1) * sizeof(double));
        memcpy(f->bounds, bounds, (size_t)nb * sizeof(double));
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 32;
        r->fam = realloc(r->fam, (size_t)r->cap * sizeof *r->fam);
        if (!r->fam) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    r->fam[r->n++] = f;
    return f;
}

/* The family of `name` (created if new, checked against the declaration if
 * not); called with the lock held. */
static family_t *get_family(loom_metrics_t *r, loom_metric_type type, const char *name, const char *help,
                            const char **names, int n, const double *bounds, int nb) {
    family_t *f = find_family(r, name);
    if (!f) {
        if (!valid_name(name, 1)) {
            loom_error(LOOM_EINTERNAL, "metric name '%s' is not valid (letters, digits, _ and :, not starting with a digit)", name ? name : "(null)");
            return NULL;
        }
        if (check_labels(type, name, names, n) != LOOM_OK) return NULL;
        for (int i = 0; type == LOOM_METRIC_HISTOGRAM && i < nb; i++)
            if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
                loom_error(LOOM_EINTERNAL, "histogram %s: bucket bounds must be finite and ascending", name);
                return NULL;
            }
        return new_family(r, type, name, help, names, n, bounds, nb);
    }
    int same = f->type == type && f->nlabels == n;
    for (int k = 0; same && k < n; k++) same = !strcmp(f->labels[k], names[k]);
    if (!same) {
        loom_error(LOOM_EINTERNAL, "metric %s: declared before as a %s with %d label(s); now as a %s with %d", name,
                   type_name(f->type), f->nlabels, type_name(type), n);
        return NULL;
    }
    return f;
}

static loom_metric_t *declare(loom_metrics_t *r, loom_metric_type type, const char *name, const char *help,
                              const double *bounds, int nb, va_list ap) {
    const char *names[MAX_LABELS], *values[MAX_LABELS];
    int n = read_labels(ap, names, values);
    if (n < 0) {
        loom_error(LOOM_EINTERNAL, "metric %s: labels must be name/value pairs ending with NULL, at most %d", name, MAX_LABELS);
        return NULL;
    }
    if (!r) return NULL;
    pthread_mutex_lock(&r->lock);
    loom_metric_t *m = NULL;
    family_t *f = get_family(r, type, name, help, names, n, bounds, nb);
    if (f && !(m = find_series(f, values))) {
        m = loom_calloc(1, sizeof *m);
        m->f = f;
        for (int k = 0; k < n; k++) m->values[k] = loom_strdup(values[k]);
        if (type == LOOM_METRIC_HISTOGRAM) m->counts = loom_calloc((size_t)f->nb + 1, sizeof *m->counts);
        if (f->n == f->cap) {
            f->cap = f->cap ? 2 * f->cap : 4;
            f->series = realloc(f->series, (size_t)f->cap * sizeof *f->series);
            if (!f->series) loom_panic(__FILE__, __LINE__, "out of memory");
        }
        f->series[f->n++] = m;
    }
    pthread_mutex_unlock(&r->lock);
    return m;
}

#define DECLARE(TYPE, BOUNDS, NB, LAST)                                       \
    va_list ap;                                                               \
    va_start(ap, LAST);                                                       \
    loom_metric_t *m = declare(r, TYPE, name, help, BOUNDS, NB, ap);          \
    va_end(ap);                                                               \
    return m

loom_metric_t *loom_metrics_counter(loom_metrics_t *r, const char *name, const char *help, ...) {
    DECLARE(LOOM_METRIC_COUNTER, NULL, 0, help);
}

loom_metric_t *loom_metrics_gauge(loom_metrics_t *r, const char *name, const char *help, ...) {
    DECLARE(LOOM_METRIC_GAUGE, NULL, 0, help);
}

loom_metric_t *loom_metrics_untyped(loom_metrics_t *r, const char *name, const char *help, ...) {
    DECLARE(LOOM_METRIC_UNTYPED, NULL, 0, help);
}

void loom_metrics_declare(loom_metrics_t *r, const loom_metric_def_t *defs, int n, const char *label, const char *value,
                          loom_metric_t **out) {
    for (int i = 0; i < n; i++)
        out[i] = (defs[i].counter ? loom_metrics_counter : loom_metrics_gauge)(r, defs[i].name, defs[i].help, label, value, NULL);
}

loom_metric_t *loom_metrics_histogram(loom_metrics_t *r, const char *name, const char *help,
                                      const double *bounds, int nb, ...) {
    DECLARE(LOOM_METRIC_HISTOGRAM, bounds, nb, nb);
}

loom_metric_t *loom_metrics_find(loom_metrics_t *r, const char *name, ...) {
    const char *names[MAX_LABELS], *values[MAX_LABELS];
    va_list ap;
    va_start(ap, name);
    int n = read_labels(ap, names, values);
    va_end(ap);
    if (!r || n < 0) return NULL;
    pthread_mutex_lock(&r->lock);
    family_t *f = find_family(r, name);
    loom_metric_t *m = f && f->nlabels == n ? find_series(f, values) : NULL;
    pthread_mutex_unlock(&r->lock);
    return m;
}

void loom_counter_add(loom_metric_t *m, double v) {
    if (m && v > 0) atomic_add_double(&m->bits, v);
}

void loom_gauge_set(loom_metric_t *m, double v) {
    if (!m) return;
    atomic_store_explicit(&m->bits, d2u(v), memory_order_relaxed);
    atomic_store_explicit(&m->set, 1, memory_order_release);
}

void loom_gauge_add(loom_metric_t *m, double v) {
    if (!m) return;
    atomic_add_double(&m->bits, v);
    atomic_store_explicit(&m->set, 1, memory_order_release);
}

void loom_gauge_unset(loom_metric_t *m) {
    if (m) atomic_store_explicit(&m->set, 0, memory_order_release);
}

void loom_histogram_observe(loom_metric_t *m, double v) {
    if (!m || !m->counts || isnan(v)) return;
    int lo = 0, hi = m->f->nb; /* the first bound >= v; nb is the +Inf bucket */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (m->f->bounds[mid] >= v) hi = mid;
        else lo = mid + 1;
    }
    atomic_fetch_add_explicit(&m->counts[lo], 1, memory_order_relaxed);
    atomic_add_double(&m->sum_bits, v);
}

static uint64_t hist_count(const loom_metric_t *m) {
    uint64_t c = 0;
    for (int i = 0; i <= m->f->nb; i++) c += atomic_load_explicit(&m->counts[i], memory_order_relaxed);
    return c;
}

double loom_metric_value(const loom_metric_t *m) {
    if (!m) return 0;
    if (m->counts) return (double)hist_count(m);
    if (m->f->type == LOOM_METRIC_GAUGE && !atomic_load_explicit(&m->set, memory_order_acquire)) return NAN;
    return u2d(atomic_load_explicit(&m->bits, memory_order_relaxed));
}

double loom_histogram_sum(const loom_metric_t *m) {
    return m && m->counts ? u2d(atomic_load_explicit(&m->sum_bits, memory_order_relaxed)) : 0;
}

int loom_histogram_counts(const loom_metric_t *m, uint64_t *counts, int cap) {
    if (!m || !m->counts) return 0;
    int n = m->f->nb + 1;
    for (int i = 0; i < n && i < cap; i++) counts[i] = atomic_load_explicit(&m->counts[i], memory_order_relaxed);
    return n;
}

double loom_histogram_quantile_of(const loom_metric_t *m, const uint64_t *counts, double q) {
    if (!m || !m->counts) return NAN;
    int nb = m->f->nb;
    uint64_t total = 0;
    for (int i = 0; i <= nb; i++) total += counts[i];
    if (total == 0 || q < 0 || q > 1) return NAN;
    double rank = q * (double)total, cum = 0;
    for (int i = 0; i <= nb; i++) {
        if (counts[i] == 0 || cum + (double)counts[i] < rank) {
            cum += (double)counts[i];
            continue;
        }
        if (i == nb) break; /* in +Inf: the highest finite bound */
        double lo = i > 0 ? m->f->bounds[i - 1] : (m->f->bounds[0] > 0 ? 0 : m->f->bounds[0]);
        return lo + (m->f->bounds[i] - lo) * (rank - cum) / (double)counts[i];
    }
    return nb > 0 ? m->f->bounds[nb - 1] : NAN;
}

double loom_histogram_quantile(const loom_metric_t *m, double q) {
    if (!m || !m->counts) return NAN;
    uint64_t counts[m->f->nb + 1];
    loom_histogram_counts(m, counts, m->f->nb + 1);
    return loom_histogram_quantile_of(m, counts, q);
}

loom_status loom_metrics_on_collect(loom_metrics_t *r, void (*fn)(void *ctx), void *ctx) {
    pthread_mutex_lock(&r->collect_lock);
    loom_status s = LOOM_OK;
    if (r->nhooks == MAX_HOOKS) {
        s = loom_error(LOOM_EINTERNAL, "metrics: more than %d collect hooks", MAX_HOOKS);
    } else {
        r->hook_fn[r->nhooks] = fn;
        r->hook_ctx[r->nhooks++] = ctx;
    }
    pthread_mutex_unlock(&r->collect_lock);
    return s;
}

void loom_metrics_off_collect(loom_metrics_t *r, void (*fn)(void *ctx), void *ctx) {
    if (!r) return;
    pthread_mutex_lock(&r->collect_lock);
    for (int i = 0; i < r->nhooks; i++) {
        if (r->hook_fn[i] != fn || r->hook_ctx[i] != ctx) continue;
        memmove(&r->hook_fn[i], &r->hook_fn[i + 1], (size_t)(r->nhooks - i - 1) * sizeof r->hook_fn[0]);
        memmove(&r->hook_ctx[i], &r->hook_ctx[i + 1], (size_t)(r->nhooks - i - 1) * sizeof r->hook_ctx[0]);
        r->nhooks--;
        break;
    }
    pthread_mutex_unlock(&r->collect_lock);
}

void loom_metrics_collect(loom_metrics_t *r) {
    if (!r) return;
    pthread_mutex_lock(&r->collect_lock);
    for (int i = 0; i < r->nhooks; i++) r->hook_fn[i](r->hook_ctx[i]);
    pthread_mutex_unlock(&r->collect_lock);
}

void loom_metrics_format_value(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "NaN");
    else if (isinf(v)) snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15) snprintf(buf, cap, "%.0f", v);
    else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
}

/* A label value with \, " and newline escaped. */
static void put_escaped(loom_sbuf_t *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\') loom_sbuf_puts(b, "\\\\");
        else if (*s == '\n') loom_sbuf_puts(b, "\\n");
        else if (*s == '"' && quote) loom_sbuf_puts(b, "\\\"");
        else loom_sbuf_putc(b, *s);
    }
}

/* NAME_SUFFIX{labels[,le="x"]} VALUE\n */
static void put_sample(loom_sbuf_t *b, const loom_metric_t *m, const char *suffix, const char *le, double v) {
    const family_t *f = m->f;
    loom_sbuf_printf(b, "%s%s", f->name, suffix);
    if (f->nlabels || le) {
        loom_sbuf_putc(b, '{');
        for (int k = 0; k < f->nlabels; k++) {
            loom_sbuf_printf(b, "%s%s=\"", k ? "," : "", f->labels[k]);
            put_escaped(b, m->values[k], 1);
            loom_sbuf_putc(b, '"');
        }
        if (le) loom_sbuf_printf(b, "%sle=\"%s\"", f->nlabels ? "," : "", le);
        loom_sbuf_putc(b, '}');
    }
    char num[40];
    loom_metrics_format_value(num, sizeof num, v);
    loom_sbuf_printf(b, " %s\n", num);
}

/* Buckets are read once into a snapshot and cumulated, so +Inf and _count
 * agree and the buckets never decrease, however fast updates arrive. */
static void put_histogram(loom_sbuf_t *b, const loom_metric_t *m) {
    int nb = m->f->nb;
    uint64_t cum = 0;
    char le[40];
    for (int i = 0; i <= nb; i++) {
        cum += atomic_load_explicit(&m->counts[i], memory_order_relaxed);
        if (i < nb) loom_metrics_format_value(le, sizeof le, m->f->bounds[i]);
        put_sample(b, m, "_bucket", i < nb ? le : "+Inf", (double)cum);
    }
    put_sample(b, m, "_sum", NULL, u2d(atomic_load_explicit(&m->sum_bits, memory_order_relaxed)));
    put_sample(b, m, "_count", NULL, (double)cum);
}

static void put_family(loom_sbuf_t *b, const family_t *f) {
    int any = 0;
    for (int j = 0; j < f->n && !any; j++)
        any = f->type != LOOM_METRIC_GAUGE || atomic_load_explicit(&f->series[j]->set, memory_order_acquire);
    if (!any) return;
    loom_sbuf_printf(b, "# HELP %s ", f->name);
    put_escaped(b, f->help, 0);
    loom_sbuf_printf(b, "\n# TYPE %s %s\n", f->name, type_name(f->type));
    for (int j = 0; j < f->n; j++) {
        const loom_metric_t *m = f->series[j];
        if (f->type == LOOM_METRIC_HISTOGRAM) {
            put_histogram(b, m);
        } else if (f->type != LOOM_METRIC_GAUGE || atomic_load_explicit(&m->set, memory_order_acquire)) {
            put_sample(b, m, "", NULL, u2d(atomic_load_explicit(&m->bits, memory_order_relaxed)));
        }
    }
}

char *loom_metrics_render(loom_metrics_t *r, size_t *len) {
    loom_metrics_collect(r);
    loom_sbuf_t b = {0};
    loom_sbuf_puts(&b, "");
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n; i++) put_family(&b, r->fam[i]);
    pthread_mutex_unlock(&r->lock);
    if (len) *len = b.len;
    return b.data;
}
