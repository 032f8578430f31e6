/* chat_template: parsing (see chat_template.h). The template is cut into
 * text and tags with jinja2's whitespace rules as transformers sets them
 * (trim_blocks, lstrip_blocks, "-" and "+" markers), then each tag is
 * parsed by recursive descent with Jinja's operator precedence. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_pretok.h"
#include "chat_template_int.h"

loom_status loom_chat_fail(loom_status *err, loom_status code, const char *origin, int line, const char *fmt, ...) {
    if (*err != LOOM_OK) return *err;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return *err = loom_error(code, "%s: line %d: %s", origin, line, msg);
}

void *loom_chat_alloc(loom_chat_template_t *t, size_t n) {
    if (t->nblocks == t->capblocks) {
        t->capblocks = t->capblocks ? 2 * t->capblocks : 64;
        t->blocks = realloc(t->blocks, t->capblocks * sizeof *t->blocks);
        if (!t->blocks) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    return t->blocks[t->nblocks++] = loom_calloc(1, n ? n : 1);
}

void loom_chat_template_free(loom_chat_template_t *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nblocks; i++) free(t->blocks[i]);
    free(t->blocks);
    free(t->origin);
    free(t);
}

/* ---- cutting the text into segments -------------------------------------------- */

enum { SEG_TEXT, SEG_EXPR, SEG_STMT, SEG_COMMENT };

typedef struct {
    int kind;
    const char *p;       /* text, or the tag's inside (markers excluded) */
    size_t n;
    int minus_l, minus_r, plus_l, plus_r;
    int line;
} seg_t;

typedef struct {
    loom_chat_template_t *t;
    const char *src;
    seg_t *seg;
    int nseg, cap, at;   /* segments, and the parser's position */
    int loops;           /* for-loops around the statement being parsed */
    int nest;            /* blocks and expressions open around the parser (bounded: the stack is) */
    loom_status err;
} parser_t;

/* A template the parser cannot take: LOOM_EUNAVAIL (the caller may fall
 * back to a built-in format). */
#define perr(ps, line, ...) loom_chat_fail(&(ps)->err, LOOM_EUNAVAIL, (ps)->t->origin, line, __VA_ARGS__)

#define MAX_NEST 100

/* Count one level of nesting; refuse past MAX_NEST (a crafted template
 * must not exhaust the stack). */
static int enter(parser_t *ps, int line) {
    if (++ps->nest > MAX_NEST) return perr(ps, line, "blocks or expressions nest more than %d deep", MAX_NEST), 0;
    return 1;
}

/* The line of p, counting on from (at, line) where the last call stopped. */
static int line_at(const char *p, const char **at, int *line) {
    for (; *at < p; (*at)++) *line += **at == '\n';
    return *line;
}

static void push_seg(parser_t *ps, seg_t s) {
    if (ps->nseg == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 64;
        ps->seg = realloc(ps->seg, (size_t)ps->cap * sizeof *ps->seg);
        if (!ps->seg) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    ps->seg[ps->nseg++] = s;
}

/* Where a {{ }} or {% %} tag closes: the first `close` outside string
 * literals and brackets (a dict literal may hold "}}"), or NULL. */
static const char *tag_end(const char *p, const char *close) {
    int depth = 0;
    for (; *p; p++) {
        if (*p == '\'' || *p == '"') {
            const char *q = p + 1;
            while (*q && *q != *p) q += q[0] == '\\' && q[1] ? 2 : 1;
            if (!*q) return NULL;
            p = q;
        } else if (strchr("([{", *p)) {
            depth++;
        } else if (depth > 0 && strchr(")]}", *p)) {
            depth--;
        } else if (depth == 0 && p[0] == close[0] && p[1] == close[1]) {
            return p;
        } else if (depth == 0 && (p[0] == '-' || p[0] == '+') && p[1] == close[0] && p[2] == close[1]) {
            return p + 1;
        }
    }
    return NULL;
}

/* Cut src into text and tags (markers recorded, whitespace not yet applied). */
static loom_status cut_segments(parser_t *ps) {
    const char *p = ps->src, *end = p + strlen(p), *at = p;
    int line = 1;
    static const char *close[4] = {NULL, "}}", "%}", "#}"};
    while (p < end) {
        const char *o = p;
        while ((o = strchr(o, '{')) && o[1] != '{' && o[1] != '%' && o[1] != '#') o++;
        if (!o) o = end;
        if (o > p) push_seg(ps, (seg_t){.kind = SEG_TEXT, .p = p, .n = (size_t)(o - p), .line = line_at(p, &at, &line)});
        if (o == end) break;
        seg_t s = {.kind = o[1] == '{' ? SEG_EXPR : o[1] == '%' ? SEG_STMT : SEG_COMMENT, .line = line_at(o, &at, &line)};
        const char *in = o + 2;
        s.minus_l = *in == '-';
        s.plus_l = *in == '+';
        in += s.minus_l || s.plus_l;
        const char *c = s.kind == SEG_COMMENT ? strstr(in, close[s.kind]) : tag_end(in, close[s.kind]);
        if (!c) return perr(ps, s.line, "a tag opened with \"%.2s\" is never closed with \"%s\"", o, close[s.kind]);
        s.minus_r = c > in && c[-1] == '-';
        s.plus_r = c > in && c[-1] == '+';
        s.p = in;
        s.n = (size_t)(c - in) - (size_t)(s.minus_r || s.plus_r);
        push_seg(ps, s);
        p = c + 2;
    }
    return LOOM_OK;
}

int loom_chat_py_space(const unsigned char *s, size_t left, int *n) {
    *n = 1;
    if (*s == ' ' || (*s >= '\t' && *s <= '\r') || (*s >= 0x1c && *s <= 0x1f)) return 1;
    if (left >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return *n = 2;
    if (left < 3) return 0;
    unsigned cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    if ((s[0] & 0xF0) != 0xE0) return 0;
    *n = 3;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Leading / trailing Python whitespace of s[0..n): the bytes it spans. */
static size_t lead_space(const char *s, size_t n) {
    size_t i = 0;
    int k;
    while (i < n && loom_chat_py_space((const unsigned char *)s + i, n - i, &k)) i += (size_t)k;
    return i;
}

static size_t trail_space(const char *s, size_t n) {
    size_t e = n;
    for (;;) { /* step back one character at a time */
        size_t b = e;
        while (b > 0 && ((unsigned char)s[b - 1] & 0xC0) == 0x80) b--;
        if (b == 0) return n - e;
        b--;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        int k;
        if (!loom_chat_py_space((const unsigned char *)s + b, e - b, &k) || b + (size_t)k != e) return n - e;
        e = b;
    }
}

/* Apply jinja2's whitespace rules to the text segments: "-" strips all
 * whitespace on its side; trim_blocks drops the newline after a {% %} or
 * {# #} tag; lstrip_blocks drops the spaces and tabs before one when only
 * they stand between the start of the line and the tag ("+" keeps both). */
static void apply_whitespace(parser_t *ps) {
    for (int i = 0; i < ps->nseg; i++) {
        seg_t *s = &ps->seg[i];
        if (s->kind != SEG_TEXT) continue;
        const seg_t *prev = i > 0 ? &ps->seg[i - 1] : NULL, *next = i + 1 < ps->nseg ? &ps->seg[i + 1] : NULL;
        int line_start = !prev; /* what jinja2 calls line_starting: the text follows a newline its lexer consumed */
        if (prev && prev->minus_r) {
            size_t k = lead_space(s->p, s->n);
            line_start = k > 0 && s->p[k - 1] == '\n';
            s->p += k, s->n -= k;
        } else if (prev && prev->kind != SEG_EXPR && !prev->plus_r && s->n && s->p[0] == '\n') {
            s->p++, s->n--;
            line_start = 1;
        }
        if (next && next->minus_l) {
            s->n -= trail_space(s->p, s->n);
        } else if (next && next->kind != SEG_EXPR && !next->plus_l) {
            const char *nl = memrchr(s->p, '\n', s->n);
            size_t from = nl ? (size_t)(nl - s->p) + 1 : 0;
            if ((nl || line_start) && from < s->n && trail_space(s->p + from, s->n - from) == s->n - from) s->n = from;
        }
    }
}

/* ---- tokens inside a tag --------------------------------------------------------- */

enum { T_END, T_NAME, T_INT, T_FLOAT, T_STR, T_OP };

typedef struct {
    int kind;
    const char *p;       /* where it starts in the template */
    size_t n;
    char *str;           /* T_STR: the decoded literal (owned by the template) */
    size_t slen;
    long long ival;
    double fval;
} tok_t;

typedef struct {
    parser_t *ps;
    const char *p, *end;
    int line;
    tok_t tok;
} lex_t;

static int tok_is(const lex_t *lx, int kind, const char *text) {
    return lx->tok.kind == kind && (!text || (lx->tok.n == strlen(text) && !memcmp(lx->tok.p, text, lx->tok.n)));
}
static int is_op(const lex_t *lx, const char *op) { return tok_is(lx, T_OP, op); }
static int is_word(const lex_t *lx, const char *w) { return tok_is(lx, T_NAME, w); }

/* One escape after a backslash at s (Python's string escapes); returns the
 * bytes consumed, writes the result to out, *w its length. */
static size_t unescape(const char *s, const char *end, char *out, size_t *w) {
    static const char from[] = "nrt\\'\"abfv0", to[] = "\n\r\t\\'\"\a\b\f\v";
    const char *f = s < end ? strchr(from, *s) : NULL;
    if (f && *s) {
        out[0] = *s == '0' ? '\0' : to[f - from];
        *w = 1;
        return 1;
    }
    int digits = s < end ? (*s == 'x' ? 2 : *s == 'u' ? 4 : *s == 'U' ? 8 : 0) : 0;
    unsigned cp = 0;
    for (int k = 1; digits && k <= digits; k++) {
        if (s + k >= end || !isxdigit((unsigned char)s[k])) digits = 0;
        else cp = cp * 16 + (unsigned)(isdigit((unsigned char)s[k]) ? s[k] - '0' : (tolower((unsigned char)s[k]) - 'a' + 10));
    }
    if (digits && cp <= 0x10FFFF) {
        *w = loom_utf8_put((unsigned char *)out, cp);
        return (size_t)digits + 1;
    }
    out[0] = '\\'; /* an unknown escape keeps its backslash, as Python does */
    *w = 1;
    return 0;
}

static loom_status lex_string(lex_t *lx) {
    char q = *lx->p;
    const char *s = lx->p + 1;
    char *out = loom_chat_alloc(lx->ps->t, (size_t)(lx->end - s) * 4 + 1);
    size_t n = 0;
    while (s < lx->end && *s != q) {
        if (*s == '\\') {
            size_t w;
            s += 1 + unescape(s + 1, lx->end, out + n, &w);
            n += w;
        } else {
            out[n++] = *s++;
        }
    }
    if (s >= lx->end) return perr(lx->ps, lx->line, "a string literal is not closed");
    lx->tok = (tok_t){.kind = T_STR, .p = lx->p, .n = (size_t)(s + 1 - lx->p), .str = out, .slen = n};
    lx->p = s + 1;
    return LOOM_OK;
}

static loom_status lex_next(lex_t *lx) {
    while (lx->p < lx->end && isspace((unsigned char)*lx->p)) lx->line += *lx->p++ == '\n';
    const char *p = lx->p;
    if (p >= lx->end) {
        lx->tok = (tok_t){.kind = T_END, .p = p};
        return LOOM_OK;
    }
    if (*p == '\'' || *p == '"') return lex_string(lx);
    if (isalpha((unsigned char)*p) || *p == '_') {
        while (p < lx->end && (isalnum((unsigned char)*p) || *p == '_')) p++;
        lx->tok = (tok_t){.kind = T_NAME, .p = lx->p, .n = (size_t)(p - lx->p)};
    } else if (isdigit((unsigned char)*p)) {
        char *e;
        double f = strtod(p, &e);
        long long i = strtoll(p, NULL, 10);
        int fl = memchr(p, '.', (size_t)(e - p)) || memchr(p, 'e', (size_t)(e - p)) || memchr(p, 'E', (size_t)(e - p));
        lx->tok = (tok_t){.kind = fl ? T_FLOAT : T_INT, .p = p, .n = (size_t)(e - p), .ival = i, .fval = f};
        p = e;
    } else {
        static const char *two[] = {"**", "//", "==", "!=", "<=", ">="};
        size_t n = 1;
        for (int k = 0; k < 6; k++)
            if (p + 1 < lx->end && p[0] == two[k][0] && p[1] == two[k][1]) n = 2;
        if (n == 1 && !strchr("+-*/%~<>=()[]{},.:|", *p)) return perr(lx->ps, lx->line, "unexpected character '%c' in a tag", *p);
        lx->tok = (tok_t){.kind = T_OP, .p = p, .n = n};
        p += n;
    }
    lx->p = p;
    return LOOM_OK;
}

/* ---- expressions ------------------------------------------------------------------- */

static node_t *new_node(lex_t *lx, int kind) {
    node_t *n = loom_chat_alloc(lx->ps->t, sizeof *n);
    n->kind = kind;
    n->line = lx->line;
    return n;
}

static const char *tok_name(lex_t *lx) {
    char *s = loom_chat_alloc(lx->ps->t, lx->tok.n + 1);
    memcpy(s, lx->tok.p, lx->tok.n);
    return s;
}

#define NEXT(lx) do { if (lex_next(lx) != LOOM_OK) return NULL; } while (0)
#define EXPECT(lx, op, what) do { if (!is_op(lx, op)) { perr((lx)->ps, (lx)->line, "expected %s", what); return NULL; } NEXT(lx); } while (0)

static node_t *parse_expr(lex_t *lx);
static node_t *parse_or(lex_t *lx);
static node_t *parse_unary(lex_t *lx);
static node_t *parse_primary(lex_t *lx);

/* Arguments of a call, filter or test: "(" [expr | name=expr] ... ")". */
static int parse_args(lex_t *lx, node_t *n) {
    node_t *args[32];
    const char *kw[32];
    int k = 0;
    if (lex_next(lx) != LOOM_OK) return 0;
    while (!is_op(lx, ")")) {
        if (k == 32) return perr(lx->ps, lx->line, "more than 32 arguments"), 0;
        kw[k] = NULL;
        if (lx->tok.kind == T_NAME && lx->p < lx->end && *lx->p == '=' && (lx->p + 1 >= lx->end || lx->p[1] != '=')) {
            kw[k] = tok_name(lx);
            if (lex_next(lx) != LOOM_OK || lex_next(lx) != LOOM_OK) return 0;
        }
        if (!(args[k++] = parse_expr(lx))) return 0;
        if (is_op(lx, ",")) {
            if (lex_next(lx) != LOOM_OK) return 0;
        } else if (!is_op(lx, ")")) {
            return perr(lx->ps, lx->line, "expected ',' or ')' in an argument list"), 0;
        }
    }
    n->args = loom_chat_alloc(lx->ps->t, (size_t)k * sizeof *n->args);
    n->kw = loom_chat_alloc(lx->ps->t, (size_t)k * sizeof *n->kw);
    memcpy(n->args, args, (size_t)k * sizeof *args);
    memcpy(n->kw, kw, (size_t)k * sizeof *kw);
    n->nargs = k;
    return lex_next(lx) == LOOM_OK;
}

static int in_list(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(name, *list)) return 1;
    return 0;
}

static const char *const FILTERS[] = {"trim", "length", "count", "tojson", "join", "list", "first", "last", "upper", "lower",
                                      "title", "capitalize", "default", "d", "string", "int", "items", "select", "reject",
                                      "selectattr", "rejectattr", "map", "replace", "safe", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
                                    "mapping", "iterable", "sequence", "true", "false", "equalto", "eq", "even", "odd", NULL};
static const char *const METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper", "lower",
                                      "title", "capitalize", "replace", "items", "keys", "values", "get", NULL};
static const char *const GLOBALS[] = {"raise_exception", "namespace", "range", NULL};

/* A call: only the globals and methods above exist. */
static node_t *parse_call(lex_t *lx, node_t *callee) {
    if (callee->kind == E_NAME && !in_list(callee->name, GLOBALS))
        return perr(lx->ps, lx->line, "calling %s() is not supported (loom's templates call %s)", callee->name,
                    "raise_exception, namespace and range"), NULL;
    if (callee->kind == E_ATTR && !in_list(callee->name, METHODS))
        return perr(lx->ps, lx->line, "the method .%s() is not supported", callee->name), NULL;
    if (callee->kind != E_NAME && callee->kind != E_ATTR) return perr(lx->ps, lx->line, "only named functions and methods can be called"), NULL;
    node_t *n = new_node(lx, E_CALL);
    n->a = callee;
    return parse_args(lx, n) ? n : NULL;
}

/* x.name, x[i], x[a:b], x(...) */
static node_t *parse_postfix(lex_t *lx, node_t *x) {
    for (;;) {
        if (is_op(lx, ".")) {
            NEXT(lx);
            if (lx->tok.kind != T_NAME && lx->tok.kind != T_INT) return perr(lx->ps, lx->line, "expected a name after '.'"), NULL;
            node_t *n = new_node(lx, E_ATTR);
            n->a = x;
            n->name = tok_name(lx);
            NEXT(lx);
            x = n;
        } else if (is_op(lx, "[")) {
            NEXT(lx);
            node_t *n = new_node(lx, E_INDEX), *lo = NULL;
            if (!is_op(lx, ":") && !(lo = parse_expr(lx))) return NULL;
            n->a = x;
            n->b = lo;
            if (is_op(lx, ":")) {
                n->kind = E_SLICE;
                NEXT(lx);
                if (!is_op(lx, "]") && !is_op(lx, ":") && !(n->c = parse_expr(lx))) return NULL;
                if (is_op(lx, ":")) return perr(lx->ps, lx->line, "a slice with a step is not supported"), NULL;
            }
            EXPECT(lx, "]", "']'");
            x = n;
        } else if (is_op(lx, "(")) {
            if (!(x = parse_call(lx, x))) return NULL;
        } else {
            return x;
        }
    }
}

/* |filter(args) and "is [not] test [arg]" after a unary expression. */
static node_t *parse_filters(lex_t *lx, node_t *x) {
    for (;;) {
        int filter = is_op(lx, "|");
        if (!filter && !is_word(lx, "is")) return x;
        NEXT(lx);
        node_t *n = new_node(lx, filter ? E_FILTER : E_TEST);
        if (!filter && is_word(lx, "not")) {
            n->negate = 1;
            NEXT(lx);
        }
        if (lx->tok.kind != T_NAME) return perr(lx->ps, lx->line, "expected a %s name", filter ? "filter" : "test"), NULL;
        n->name = tok_name(lx);
        if (!in_list(n->name, filter ? FILTERS : TESTS))
            return perr(lx->ps, lx->line, "the %s \"%s\" is not supported", filter ? "filter" : "test", n->name), NULL;
        n->a = x;
        NEXT(lx);
        if (is_op(lx, "(")) {
            if (!parse_args(lx, n)) return NULL;
        } else if (!filter && (lx->tok.kind == T_STR || lx->tok.kind == T_INT || lx->tok.kind == T_FLOAT ||
                               (lx->tok.kind == T_NAME && !is_word(lx, "and") && !is_word(lx, "or") && !is_word(lx, "else") &&
                                !is_word(lx, "if") && !is_word(lx, "in") && !is_word(lx, "is") && !is_word(lx, "not")))) {
            n->args = loom_chat_alloc(lx->ps->t, sizeof *n->args);
            n->kw = loom_chat_alloc(lx->ps->t, sizeof *n->kw);
            if (!(n->args[0] = parse_primary(lx))) return NULL;
            n->nargs = 1;
        }
        x = n;
    }
}

/* [a, b], {k: v}, (a) or (a, b): `close` ends it; dicts take pairs. */
static node_t *parse_collection(lex_t *lx, int kind, const char *close) {
    node_t *n = new_node(lx, kind), *items[256];
    int k = 0, tuple = 0;
    NEXT(lx);
    while (!is_op(lx, close)) {
        if (k >= 254) return perr(lx->ps, lx->line, "more than 127 items in a literal"), NULL;
        if (!(items[k++] = parse_expr(lx))) return NULL;
        if (kind == E_DICT) {
            EXPECT(lx, ":", "':' in a dict literal");
            if (!(items[k++] = parse_expr(lx))) return NULL;
        }
        if (!is_op(lx, ",")) break;
        tuple = 1;
        NEXT(lx);
    }
    EXPECT(lx, close, close);
    if (!strcmp(close, ")") && k == 1 && !tuple) return items[0];
    n->op = !strcmp(close, ")"); /* a tuple: prints as (a, b) */
    n->args = loom_chat_alloc(lx->ps->t, (size_t)k * sizeof *n->args);
    memcpy(n->args, items, (size_t)k * sizeof *items);
    n->nargs = k;
    return n;
}

static node_t *parse_primary(lex_t *lx) {
    node_t *n;
    if (lx->tok.kind == T_STR) {
        n = new_node(lx, E_LIT_STR);
        n->name = lx->tok.str;
        n->len = lx->tok.slen;
        NEXT(lx);
        while (lx->tok.kind == T_STR) { /* "a" "b" is "ab" */
            char *s = loom_chat_alloc(lx->ps->t, n->len + lx->tok.slen + 1);
            memcpy(s, n->name, n->len);
            memcpy(s + n->len, lx->tok.str, lx->tok.slen);
            n->name = s;
            n->len += lx->tok.slen;
            NEXT(lx);
        }
        return n;
    }
    if (lx->tok.kind == T_INT || lx->tok.kind == T_FLOAT) {
        n = new_node(lx, lx->tok.kind == T_INT ? E_LIT_INT : E_LIT_FLOAT);
        n->ival = lx->tok.ival;
        n->fval = lx->tok.fval;
        NEXT(lx);
        return n;
    }
    if (lx->tok.kind == T_NAME) {
        const char *w = tok_name(lx);
        int t = !strcmp(w, "true") || !strcmp(w, "True"), f = !strcmp(w, "false") || !strcmp(w, "False");
        n = new_node(lx, t || f ? E_LIT_BOOL : (!strcmp(w, "none") || !strcmp(w, "None")) ? E_LIT_NONE : E_NAME);
        n->ival = t;
        n->name = w;
        NEXT(lx);
        return n;
    }
    if (is_op(lx, "(")) return parse_collection(lx, E_LIST, ")");
    if (is_op(lx, "[")) return parse_collection(lx, E_LIST, "]");
    if (is_op(lx, "{")) return parse_collection(lx, E_DICT, "}");
    if (lx->tok.kind == T_END) return perr(lx->ps, lx->line, "an expression ends too early"), NULL;
    return perr(lx->ps, lx->line, "unexpected \"%.*s\" in an expression", (int)lx->tok.n, lx->tok.p), NULL;
}

static node_t *parse_unary(lex_t *lx) {
    node_t *x;
    if (is_op(lx, "-") || is_op(lx, "+")) {
        int neg = is_op(lx, "-");
        NEXT(lx);
        if (!enter(lx->ps, lx->line)) return NULL;
        x = parse_unary(lx);
        lx->ps->nest--;
        if (!x) return NULL;
        if (!neg) return x;
        node_t *n = new_node(lx, E_NEG);
        n->a = x;
        return n;
    }
    if (!(x = parse_primary(lx)) || !(x = parse_postfix(lx, x))) return NULL;
    return parse_filters(lx, x);
}

static node_t *binary(lex_t *lx, int kind, int op, node_t *a, node_t *b) {
    if (!b) return NULL;
    node_t *n = new_node(lx, kind);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* One precedence level: operands from `next`, operators from `ops`. */
static node_t *parse_level(lex_t *lx, node_t *(*next)(lex_t *), const char *const *ops, const int *codes, int right) {
    node_t *x = next(lx);
    while (x) {
        int k = 0;
        while (ops[k] && !is_op(lx, ops[k])) k++;
        if (!ops[k]) return x;
        NEXT(lx);
        x = binary(lx, E_BIN, codes[k], x, right ? parse_level(lx, next, ops, codes, right) : next(lx));
        if (right) return x;
    }
    return NULL;
}

static node_t *parse_pow(lex_t *lx) {
    static const char *const ops[] = {"**", NULL};
    static const int codes[] = {OP_POW};
    return parse_level(lx, parse_unary, ops, codes, 0);
}
static node_t *parse_math2(lex_t *lx) {
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    static const int codes[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return parse_level(lx, parse_pow, ops, codes, 0);
}
static node_t *parse_concat(lex_t *lx) {
    static const char *const ops[] = {"~", NULL};
    static const int codes[] = {OP_CAT};
    return parse_level(lx, parse_math2, ops, codes, 0);
}
static node_t *parse_math1(lex_t *lx) {
    static const char *const ops[] = {"+", "-", NULL};
    static const int codes[] = {OP_ADD, OP_SUB};
    return parse_level(lx, parse_concat, ops, codes, 0);
}

/* Comparisons, chained as Python chains them (a < b < c: a < b and b < c). */
static node_t *parse_compare(lex_t *lx) {
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">=", NULL};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    node_t *x = parse_math1(lx), *chain = NULL;
    while (x) {
        int op = -1;
        for (int k = 0; ops[k]; k++)
            if (is_op(lx, ops[k])) op = codes[k];
        if (is_word(lx, "in")) op = OP_IN;
        if (is_word(lx, "not") && lx->p < lx->end) { /* "not in" */
            const char *q = lx->p;
            while (q < lx->end && isspace((unsigned char)*q)) q++;
            if (lx->end - q >= 2 && !memcmp(q, "in", 2) && (lx->end - q == 2 || !isalnum((unsigned char)q[2]))) {
                NEXT(lx);
                op = OP_NOTIN;
            }
        }
        if (op < 0) return chain ? chain : x;
        NEXT(lx);
        node_t *y = parse_math1(lx), *c = binary(lx, E_CMP, op, x, y);
        if (!c) return NULL;
        chain = chain ? binary(lx, E_AND, 0, chain, c) : c;
        x = y;
    }
    return NULL;
}

static node_t *parse_not(lex_t *lx) {
    if (!is_word(lx, "not")) return parse_compare(lx);
    NEXT(lx);
    node_t *n = new_node(lx, E_NOT);
    if (!enter(lx->ps, lx->line)) return NULL;
    n->a = parse_not(lx);
    lx->ps->nest--;
    return n->a ? n : NULL;
}

static node_t *parse_logic(lex_t *lx, const char *word, int kind, node_t *(*next)(lex_t *)) {
    node_t *x = next(lx);
    while (x && is_word(lx, word)) {
        NEXT(lx);
        x = binary(lx, kind, 0, x, next(lx));
    }
    return x;
}

static node_t *parse_and(lex_t *lx) { return parse_logic(lx, "and", E_AND, parse_not); }
static node_t *parse_or(lex_t *lx) { return parse_logic(lx, "or", E_OR, parse_and); }

static node_t *parse_cond(lex_t *lx);

/* An expression, its depth counted. */
static node_t *parse_expr(lex_t *lx) {
    if (!enter(lx->ps, lx->line)) return NULL;
    node_t *x = parse_cond(lx);
    lx->ps->nest--;
    return x;
}

/* x if cond [else y] */
static node_t *parse_cond(lex_t *lx) {
    node_t *x = parse_or(lx);
    while (x && is_word(lx, "if")) {
        NEXT(lx);
        node_t *n = new_node(lx, E_COND);
        n->b = x;
        if (!(n->a = parse_or(lx))) return NULL;
        if (is_word(lx, "else")) {
            NEXT(lx);
            if (!(n->c = parse_expr(lx))) return NULL;
        }
        x = n;
    }
    return x;
}

/* ---- statements ---------------------------------------------------------------------- */

static void lex_init(lex_t *lx, parser_t *ps, const seg_t *s) {
    *lx = (lex_t){.ps = ps, .p = s->p, .end = s->p + s->n, .line = s->line};
}

static node_t *parse_body(parser_t *ps, const char *const *ends, const char **ended);

/* The expression that ends a tag. */
static node_t *tag_expr(lex_t *lx, node_t *(*how)(lex_t *)) {
    node_t *x = how(lx);
    if (x && lx->tok.kind != T_END) return perr(lx->ps, lx->line, "unexpected \"%.*s\" after an expression", (int)lx->tok.n, lx->tok.p), NULL;
    return x;
}

static node_t *parse_if(parser_t *ps, lex_t *lx) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    node_t *n = new_node(lx, S_IF);
    const char *ended = NULL;
    if (!(n->a = tag_expr(lx, parse_expr)) || (n->b = parse_body(ps, ends, &ended), ps->err != LOOM_OK)) return NULL;
    if (!strcmp(ended, "elif")) {
        lex_t l2;
        lex_init(&l2, ps, &ps->seg[ps->at - 1]);
        if (lex_next(&l2) != LOOM_OK || lex_next(&l2) != LOOM_OK) return NULL; /* past "elif" */
        n->c = parse_if(ps, &l2);
        return n->c ? n : NULL;
    }
    if (!strcmp(ended, "else")) {
        static const char *const endif[] = {"endif", NULL};
        n->c = parse_body(ps, endif, &ended);
        if (ps->err != LOOM_OK) return NULL;
    }
    return n;
}

/* The node of a for or set tag with its target: a name (n->name), then
 * after `sep` ("," in for, "." in set) a second one (n->name2). NULL,
 * with "expected <what>", when a name is missing. */
static node_t *targets(parser_t *ps, lex_t *lx, int kind, const char *sep, const char *what, const char *what2) {
    node_t *n = new_node(lx, kind);
    if (lx->tok.kind != T_NAME) return perr(ps, lx->line, "expected %s", what), NULL;
    n->name = tok_name(lx);
    NEXT(lx);
    if (!is_op(lx, sep)) return n;
    NEXT(lx);
    if (lx->tok.kind != T_NAME) return perr(ps, lx->line, "expected %s", what2), NULL;
    n->name2 = tok_name(lx);
    NEXT(lx);
    return n;
}

static node_t *parse_for(parser_t *ps, lex_t *lx) {
    node_t *n = targets(ps, lx, S_FOR, ",", "a loop variable after \"for\"", "a second loop variable");
    if (!n) return NULL;
    if (!is_word(lx, "in")) return perr(ps, lx->line, "expected \"in\" in a for loop (more than two loop variables are not supported)"), NULL;
    NEXT(lx);
    if (!(n->a = parse_or(lx))) return NULL;
    if (is_word(lx, "if")) {
        NEXT(lx);
        if (!(n->d = parse_or(lx))) return NULL;
    }
    if (is_word(lx, "recursive")) return perr(ps, lx->line, "recursive for loops are not supported"), NULL;
    if (lx->tok.kind != T_END) return perr(ps, lx->line, "unexpected \"%.*s\" in a for tag", (int)lx->tok.n, lx->tok.p), NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *ended = NULL;
    ps->loops++;
    n->b = parse_body(ps, ends, &ended);
    ps->loops--;
    if (ps->err != LOOM_OK) return NULL;
    if (!strcmp(ended, "else")) {
        static const char *const endfor[] = {"endfor", NULL};
        n->c = parse_body(ps, endfor, &ended);
    }
    return ps->err == LOOM_OK ? n : NULL;
}

static node_t *parse_set(parser_t *ps, lex_t *lx) {
    node_t *n = targets(ps, lx, S_SET, ".", "a name after \"set\"", "an attribute name in \"set\"");
    if (!n) return NULL;
    if (is_op(lx, ",")) return perr(ps, lx->line, "\"set\" with several targets is not supported"), NULL;
    if (lx->tok.kind == T_END) return perr(ps, lx->line, "the block form of \"set\" ({%% set x %%}...{%% endset %%}) is not supported"), NULL;
    if (!is_op(lx, "=")) return perr(ps, lx->line, "expected '=' in \"set\""), NULL;
    NEXT(lx);
    return (n->a = tag_expr(lx, parse_expr)) ? n : NULL;
}

/* One {% %} tag at ps->at - 1 (its keyword in lx->tok). */
static node_t *parse_stmt(parser_t *ps, lex_t *lx, const char *word) {
    if (lex_next(lx) != LOOM_OK) return NULL;
    if (!strcmp(word, "if")) return parse_if(ps, lx);
    if (!strcmp(word, "for")) return parse_for(ps, lx);
    if (!strcmp(word, "set")) return parse_set(ps, lx);
    if (!strcmp(word, "break") || !strcmp(word, "continue")) {
        if (!ps->loops) return perr(ps, lx->line, "\"%s\" outside a for loop", word), NULL;
        if (lx->tok.kind != T_END) return perr(ps, lx->line, "unexpected text after \"%s\"", word), NULL;
        return new_node(lx, word[0] == 'b' ? S_BREAK : S_CONTINUE);
    }
    return perr(ps, lx->line, "the {%% %s %%} statement is not supported", word), NULL;
}

/* Statements up to one of `ends` (NULL: the end of the template); *ended
 * names the keyword that closed the body. */
static node_t *parse_body(parser_t *ps, const char *const *ends, const char **ended) {
    node_t *head = NULL, **tail = &head;
    if (ends && !enter(ps, ps->at > 0 ? ps->seg[ps->at - 1].line : 1)) return NULL;
    while (ps->err == LOOM_OK && ps->at < ps->nseg) {
        const seg_t *s = &ps->seg[ps->at++];
        lex_t lx;
        lex_init(&lx, ps, s);
        node_t *n = NULL;
        if (s->kind == SEG_COMMENT) continue;
        if (s->kind == SEG_TEXT) {
            if (!s->n) continue;
            n = new_node(&lx, S_TEXT);
            n->name = s->p;
            n->len = s->n;
        } else if (s->kind == SEG_EXPR) {
            n = new_node(&lx, S_OUT);
            if (lex_next(&lx) != LOOM_OK || !(n->a = tag_expr(&lx, parse_expr))) return NULL;
        } else {
            if (lex_next(&lx) != LOOM_OK) return NULL;
            if (lx.tok.kind != T_NAME) return perr(ps, s->line, "a {%% %%} tag without a statement name"), NULL;
            const char *word = tok_name(&lx);
            if (ends && in_list(word, ends)) {
                *ended = word;
                ps->nest--;
                return head;
            }
            if (!(n = parse_stmt(ps, &lx, word))) return NULL;
        }
        *tail = n;
        tail = &n->next;
    }
    if (ends && ps->err == LOOM_OK) perr(ps, ps->nseg ? ps->seg[ps->nseg - 1].line : 1, "the template ends inside a block: expected {%% %s %%}", ends[0]);
    return head;
}

loom_status loom_chat_template_parse(loom_chat_template_t **out, const char *origin, const char *text) {
    *out = NULL;
    loom_chat_template_t *t = loom_calloc(1, sizeof *t);
    t->origin = loom_strdup(origin ? origin : "chat template");
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one final newline
     * (newline_sequence, keep_trailing_newline=False). */
    char *src = loom_chat_alloc(t, strlen(text) + 1);
    size_t n = 0;
    for (const char *p = text; *p; p++) {
        src[n++] = *p == '\r' ? '\n' : *p;
        if (p[0] == '\r' && p[1] == '\n') p++;
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    parser_t ps = {.t = t, .src = src};
    if (cut_segments(&ps) == LOOM_OK) {
        apply_whitespace(&ps);
        t->body = parse_body(&ps, NULL, NULL);
    }
    free(ps.seg);
    if (ps.err != LOOM_OK) {
        loom_chat_template_free(t);
        return ps.err;
    }
    static const char *const eot[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", NULL};
    for (int k = 0; eot[k] && !t->end_of_turn; k++)
        if (strstr(src, eot[k])) t->end_of_turn = eot[k];
    *out = t;
    return LOOM_OK;
}

const char *loom_chat_template_end_of_turn(const loom_chat_template_t *t) { return t->end_of_turn; }
