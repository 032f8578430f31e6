/* sbuf: a growable text buffer (see sbuf.h). */
#include "obs/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static void reserve(loom_sbuf_t *b, size_t more) {
    if (b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) loom_panic(__FILE__, __LINE__, "out of memory growing a text buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
}

void loom_sbuf_put(loom_sbuf_t *b, const void *data, size_t n) {
    reserve(b, n);
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = 0;
}

void loom_sbuf_puts(loom_sbuf_t *b, const char *s) { loom_sbuf_put(b, s, strlen(s)); }

void loom_sbuf_putc(loom_sbuf_t *b, char c) { loom_sbuf_put(b, &c, 1); }

void loom_sbuf_printf(loom_sbuf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
