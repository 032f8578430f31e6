/* sbuf: a growable text buffer for building responses (exposition text,
 * JSON by hand where cJSON would be heavier, HTML). */
#ifndef LOOM_SBUF_H
#define LOOM_SBUF_H

#include <stddef.h>

typedef struct {
    char *data; /* NUL-terminated once anything was put; malloc'd, the owner frees it */
    size_t len, cap;
} loom_sbuf_t;

/* Append text (printf-style, a string, one character). Aborts when memory
 * runs out, like loom_malloc. */
void loom_sbuf_printf(loom_sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void loom_sbuf_puts(loom_sbuf_t *b, const char *s);
void loom_sbuf_putc(loom_sbuf_t *b, char c);
void loom_sbuf_put(loom_sbuf_t *b, const void *data, size_t n);

#endif
