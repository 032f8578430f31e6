#include "plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
        b->buf = realloc(b->buf, b->cap);
        if (!b->buf) loom_panic(__FILE__, __LINE__, "out of memory");
    }
}

loom_status loom_plot_loss_svg(const char *path, const char *title, const double *steps,
                               const double *loss, int n, const double *vsteps,
                               const double *vloss, int nv) {
    const double W = 720, H = 420, L = 60, R = 20, T = 40, B = 50;
    double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (steps[i] > x1) x1 = steps[i];
        if (isfinite(loss[i])) { y0 = fmin(y0, loss[i]); y1 = fmax(y1, loss[i]); }
    }
    for (int i = 0; i < nv; i++) {
        if (vsteps[i] > x1) x1 = vsteps[i];
        if (isfinite(vloss[i])) { y0 = fmin(y0, vloss[i]); y1 = fmax(y1, vloss[i]); }
    }
    if (!isfinite(y0)) { y0 = 0; y1 = 1; }
    if (y1 - y0 < 1e-6) { y0 -= 0.5; y1 += 0.5; }
    double pad = 0.05 * (y1 - y0);
    y0 -= pad; y1 += pad;
#define PX(x) (L + ((x) - x0) / (x1 - x0) * (W - L - R))
#define PY(y) (H - B - ((y) - y0) / (y1 - y0) * (H - T - B))
    sbuf_t b = {0};
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    sb_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    sb_printf(&b, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">", L);
    for (const char *c = title; *c; c++) { /* the title holds user paths: escape XML */
        if (*c == '<') sb_printf(&b, "&lt;");
        else if (*c == '>') sb_printf(&b, "&gt;");
        else if (*c == '&') sb_printf(&b, "&amp;");
        else sb_printf(&b, "%c", *c);
    }
    sb_printf(&b, "</text>\n");
    for (int k = 0; k <= 5; k++) {
        double y = y0 + (y1 - y0) * k / 5, x = x0 + (x1 - x0) * k / 5;
        sb_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(y), W - R, PY(y));
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, PY(y) + 4, y);
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", PX(x), H - B + 18, x);
    }
    sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12);
    sb_printf(&b, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">loss</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    if (n > 0) {
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
        for (int i = 0; i < n; i++)
            if (isfinite(loss[i])) sb_printf(&b, "%.1f,%.1f ", PX(steps[i]), PY(loss[i]));
        sb_printf(&b, "\"/>\n");
    }
    if (nv > 0) {
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"");
        for (int i = 0; i < nv; i++)
            if (isfinite(vloss[i])) sb_printf(&b, "%.1f,%.1f ", PX(vsteps[i]), PY(vloss[i]));
        sb_printf(&b, "\"/>\n");
        for (int i = 0; i < nv; i++)
            if (isfinite(vloss[i])) sb_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n", PX(vsteps[i]), PY(vloss[i]));
    }
    sb_printf(&b, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train</text>\n", W - R - 90, T + 14);
    sb_printf(&b, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">val</text>\n", W - R - 40, T + 14);
    sb_printf(&b, "</svg>\n");
#undef PX
#undef PY
    loom_status s = loom_file_write_atomic(path, b.buf, b.len);
    free(b.buf);
    return s;
}
