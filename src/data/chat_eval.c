/* chat_eval: rendering a parsed chat template (see chat_template.h).
 * Values follow Python and jinja2: lists and dicts are cJSON nodes (the
 * request's own, or made while rendering and freed after it), strings
 * point into the template, the request or memory the render owns, and an
 * undefined value renders as "" but fails when looked into. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_int.h"

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_LOOP, V_NS };
static const char *const KIND[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "LoopContext", "Namespace"};

typedef struct {
    long long index0, length;
} loopinfo_t;

typedef struct {
    int k;
    long long i;         /* V_BOOL, V_INT */
    double f;            /* V_FLOAT */
    const char *s;       /* V_STR (n bytes); V_UNDEF: the name that was undefined, or NULL */
    size_t n;
    cJSON *j;            /* V_LIST, V_DICT, V_NS */
    loopinfo_t *loop;    /* V_LOOP */
} val_t;

/* A growable string (NUL-terminated once anything was put): values built
 * by filters and the rendered output alike. */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf_t;

typedef struct frame {
    const char *names[16];
    val_t vals[16];
    int n;
    struct frame *up;     /* the next frame to search */
    struct frame *parent; /* the scope around this one (frames between are this scope's overflow) */
} frame_t;

typedef struct {
    const loom_chat_template_t *t;
    sbuf_t out;
    frame_t *top;
    cJSON *owned;        /* an array holding every list, dict and namespace made here */
    void **strs;         /* strings made here */
    size_t nstrs, capstrs;
    loom_status err;
    int brk, cont, depth;
} ctx_t;

/* A render error: LOOM_EINVAL, the first one kept. */
#define fail(c, line, ...) loom_chat_fail(&(c)->err, LOOM_EINVAL, (c)->t->origin, line, __VA_ARGS__)

static val_t V(int k) { return (val_t){.k = k}; }
static val_t vint(long long i) { return (val_t){.k = V_INT, .i = i}; }
static val_t vbool(int b) { return (val_t){.k = V_BOOL, .i = b != 0}; }
static val_t vstr(const char *s, size_t n) { return (val_t){.k = V_STR, .s = s, .n = n}; }

static char *own_str(ctx_t *c, size_t n) {
    if (c->nstrs == c->capstrs) {
        c->capstrs = c->capstrs ? 2 * c->capstrs : 64;
        c->strs = realloc(c->strs, c->capstrs * sizeof *c->strs);
        if (!c->strs) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    return c->strs[c->nstrs++] = loom_malloc(n + 1);
}

static cJSON *own_json(ctx_t *c, cJSON *j) {
    cJSON_AddItemToArray(c->owned, j);
    return j;
}

/* ---- strings -------------------------------------------------------------------------- */

static void sb_put(sbuf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1) + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A string value holding b's bytes (b is consumed). */
static val_t sb_val(ctx_t *c, sbuf_t *b) {
    char *s = own_str(c, b->n);
    memcpy(s, b->p ? b->p : "", b->n);
    s[b->n] = 0;
    free(b->p);
    return vstr(s, b->n);
}

/* Python's repr of a float. */
static void py_float(sbuf_t *b, double f) {
    char t[64];
    if (isnan(f)) return sb_str(b, "nan");
    if (isinf(f)) return sb_str(b, f > 0 ? "inf" : "-inf");
    int p = 1;
    for (; p < 17; p++) { /* the shortest digits that read back */
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, f);
    int exp = atoi(strchr(t, 'e') + 1);
    if (exp < -4 || exp >= 16) {
        char *e = strchr(t, 'e');
        char m[40];
        snprintf(m, sizeof m, "%.*s", (int)(e - t), t);
        snprintf(t, sizeof t, "%se%c%02d", m, exp < 0 ? '-' : '+', abs(exp));
        return sb_str(b, t);
    }
    snprintf(t, sizeof t, "%.*f", p - 1 - exp > 0 ? p - 1 - exp : 0, f);
    sb_str(b, t);
    if (!strchr(t, '.')) sb_str(b, ".0");
}

static val_t from_json(const cJSON *j) {
    if (!j) return V(V_UNDEF);
    if (cJSON_IsNull(j)) return V(V_NONE);
    if (cJSON_IsBool(j)) return vbool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return vint((long long)d);
        return (val_t){.k = V_FLOAT, .f = d};
    }
    if (cJSON_IsString(j)) return vstr(j->valuestring, strlen(j->valuestring));
    return (val_t){.k = cJSON_IsArray(j) ? V_LIST : V_DICT, .j = (cJSON *)j};
}

/* A cJSON node for a value, to put into a list, dict or namespace. */
static cJSON *to_json(ctx_t *c, val_t v, int line) {
    switch (v.k) {
    case V_NONE: return cJSON_CreateNull();
    case V_BOOL: return cJSON_CreateBool((int)v.i);
    case V_INT: return cJSON_CreateNumber((double)v.i);
    case V_FLOAT: return cJSON_CreateNumber(v.f);
    case V_STR: {
        char *s = loom_malloc(v.n + 1);
        memcpy(s, v.s, v.n);
        s[v.n] = 0;
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    case V_LIST: return cJSON_CreateArrayReference(v.j->child);
    case V_DICT: return cJSON_CreateObjectReference(v.j->child);
    default: fail(c, line, "a %s value cannot be stored in a list, dict or namespace", KIND[v.k]); return cJSON_CreateNull();
    }
}

static void py_repr(sbuf_t *b, val_t v);

/* Python's repr of a string: single quotes unless it holds one and no double. */
static void repr_str(sbuf_t *b, const char *s, size_t n) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '\\' || ch == (unsigned char)q) snprintf(e, sizeof e, "\\%c", ch);
        else if (ch == '\n') snprintf(e, sizeof e, "\\n");
        else if (ch == '\r') snprintf(e, sizeof e, "\\r");
        else if (ch == '\t') snprintf(e, sizeof e, "\\t");
        else if (ch < 0x20 || ch == 0x7f) snprintf(e, sizeof e, "\\x%02x", ch);
        else e[0] = (char)ch, e[1] = 0;
        sb_str(b, e);
    }
    sb_put(b, &q, 1);
}

static void py_repr(sbuf_t *b, val_t v) {
    const cJSON *x;
    int first = 1;
    switch (v.k) {
    case V_STR: return repr_str(b, v.s, v.n);
    case V_LIST: /* v.i: a tuple */
        sb_str(b, v.i ? "(" : "[");
        cJSON_ArrayForEach(x, v.j) {
            if (!first) sb_str(b, ", ");
            first = 0;
            py_repr(b, from_json(x));
        }
        if (v.i && v.j->child && !v.j->child->next) sb_str(b, ",");
        return sb_str(b, v.i ? ")" : "]");
    case V_DICT:
        sb_str(b, "{");
        cJSON_ArrayForEach(x, v.j) {
            if (!first) sb_str(b, ", ");
            first = 0;
            repr_str(b, x->string, strlen(x->string));
            sb_str(b, ": ");
            py_repr(b, from_json(x));
        }
        return sb_str(b, "}");
    case V_NONE: return sb_str(b, "None");
    case V_BOOL: return sb_str(b, v.i ? "True" : "False");
    case V_INT: {
        char t[32];
        snprintf(t, sizeof t, "%lld", v.i);
        return sb_str(b, t);
    }
    case V_FLOAT: return py_float(b, v.f);
    case V_UNDEF: return;
    default: return sb_str(b, v.k == V_LOOP ? "<LoopContext>" : "<Namespace>");
    }
}

/* str(v) as jinja2 prints it (undefined: ""). */
static val_t to_str(ctx_t *c, val_t v) {
    if (v.k == V_STR) return v;
    sbuf_t b = {0};
    py_repr(&b, v);
    return sb_val(c, &b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent), transformers' tojson. */
static int json_dump(sbuf_t *b, val_t v, int indent, int level) {
    const cJSON *x;
    int first = 1;
    switch (v.k) {
    case V_NONE: sb_str(b, "null"); return 1;
    case V_BOOL: sb_str(b, v.i ? "true" : "false"); return 1;
    case V_INT:
    case V_FLOAT:
        if (v.k == V_FLOAT && isnan(v.f)) sb_str(b, "NaN");
        else if (v.k == V_FLOAT && isinf(v.f)) sb_str(b, v.f > 0 ? "Infinity" : "-Infinity");
        else py_repr(b, v);
        return 1;
    case V_STR:
        sb_str(b, "\"");
        for (size_t i = 0; i < v.n; i++) {
            unsigned char ch = (unsigned char)v.s[i];
            char e[8] = {(char)ch, 0};
            static const char esc[] = "\"\\\n\r\t\b\f", rep[] = "\"\\nrtbf";
            const char *f = ch ? strchr(esc, ch) : NULL;
            if (f) snprintf(e, sizeof e, "\\%c", rep[f - esc]);
            else if (ch < 0x20) snprintf(e, sizeof e, "\\u%04x", ch);
            sb_put(b, e, strlen(e) ? strlen(e) : 1);
        }
        sb_str(b, "\"");
        return 1;
    case V_LIST:
    case V_DICT:
        sb_str(b, v.k == V_LIST ? "[" : "{");
        cJSON_ArrayForEach(x, v.j) {
            if (!first) sb_str(b, indent >= 0 ? "," : ", ");
            first = 0;
            if (indent >= 0) {
                sb_str(b, "\n");
                for (int k = 0; k < indent * (level + 1); k++) sb_str(b, " ");
            }
            if (v.k == V_DICT) {
                json_dump(b, vstr(x->string, strlen(x->string)), indent, level + 1);
                sb_str(b, ": ");
            }
            if (!json_dump(b, from_json(x), indent, level + 1)) return 0;
        }
        if (!first && indent >= 0) {
            sb_str(b, "\n");
            for (int k = 0; k < indent * level; k++) sb_str(b, " ");
        }
        sb_str(b, v.k == V_LIST ? "]" : "}");
        return 1;
    default: return 0;
    }
}

static int truthy(val_t v) {
    switch (v.k) {
    case V_BOOL:
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.n > 0;
    case V_LIST:
    case V_DICT: return v.j->child != NULL;
    case V_LOOP:
    case V_NS: return 1;
    default: return 0;
    }
}

/* ---- variables ------------------------------------------------------------------------- */

static val_t *lookup(ctx_t *c, const char *name) {
    for (frame_t *f = c->top; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return &f->vals[i];
    return NULL;
}

/* Bind name in the innermost frame (a new frame when it is full). */
static void bind(ctx_t *c, const char *name, val_t v) {
    for (int i = 0; i < c->top->n; i++)
        if (!strcmp(c->top->names[i], name)) {
            c->top->vals[i] = v;
            return;
        }
    if (c->top->n == 16) { /* chain a frame that counts as the same scope */
        frame_t *f = loom_calloc(1, sizeof *f);
        *f = *c->top;
        c->top->n = 0;
        c->top->up = f;
    }
    c->top->names[c->top->n] = name;
    c->top->vals[c->top->n++] = v;
}

static void push_frame(ctx_t *c, frame_t *f) {
    memset(f, 0, sizeof *f);
    f->up = f->parent = c->top;
    c->top = f;
}

static void pop_frame(ctx_t *c, frame_t *f) {
    for (frame_t *g = f->up; g != f->parent;) { /* the overflow frames bind() chained */
        frame_t *next = g->up;
        free(g);
        g = next;
    }
    c->top = f->parent;
}

/* ---- lists -------------------------------------------------------------------------------- */

static cJSON *new_list(ctx_t *c) { return own_json(c, cJSON_CreateArray()); }

static void list_add(ctx_t *c, cJSON *l, val_t v, int line) { cJSON_AddItemToArray(l, to_json(c, v, line)); }

static long long count_of(val_t v) {
    if (v.k == V_STR) {
        long long n = 0;
        for (size_t i = 0; i < v.n; i++) n += ((unsigned char)v.s[i] & 0xC0) != 0x80;
        return n;
    }
    return v.k == V_LIST || v.k == V_DICT ? cJSON_GetArraySize(v.j) : 0;
}

/* Byte offset of code point k (0 <= k <= count) of a string. */
static size_t cp_offset(val_t v, long long k) {
    size_t i = 0;
    for (long long m = 0; i < v.n; i++)
        if (((unsigned char)v.s[i] & 0xC0) != 0x80 && m++ == k) return i;
    return v.n;
}

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static val_t iter_list(ctx_t *c, val_t v, int line) {
    if (v.k == V_LIST) return v;
    cJSON *l = new_list(c);
    const cJSON *x;
    if (v.k == V_DICT) cJSON_ArrayForEach(x, v.j) cJSON_AddItemToArray(l, cJSON_CreateString(x->string));
    else if (v.k == V_STR)
        for (long long k = 0, n = count_of(v); k < n; k++) {
            size_t a = cp_offset(v, k), b = cp_offset(v, k + 1);
            list_add(c, l, vstr(v.s + a, b - a), line);
        }
    else if (v.k != V_UNDEF) fail(c, line, "a %s value is not iterable", KIND[v.k]);
    return (val_t){.k = V_LIST, .j = l};
}

/* ---- operators ------------------------------------------------------------------------- */

static int numeric(val_t v) { return v.k == V_BOOL || v.k == V_INT || v.k == V_FLOAT; }
static double num(val_t v) { return v.k == V_FLOAT ? v.f : (double)v.i; }

static int equal(val_t a, val_t b) {
    if (numeric(a) && numeric(b)) return num(a) == num(b) && (a.k == V_FLOAT || b.k == V_FLOAT || a.i == b.i);
    if (a.k != b.k) return 0;
    switch (a.k) {
    case V_STR: return a.n == b.n && !memcmp(a.s, b.s, a.n);
    case V_LIST:
    case V_DICT: return cJSON_Compare(a.j, b.j, 1);
    case V_UNDEF:
    case V_NONE: return 1;
    default: return a.j == b.j && a.loop == b.loop;
    }
}

/* -1, 0, 1; *ok = 0 when the two cannot be ordered. */
static int order(val_t a, val_t b, int *ok) {
    *ok = 1;
    if (numeric(a) && numeric(b)) return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a.k == V_STR && b.k == V_STR) { /* UTF-8 byte order is code point order */
        int r = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
        return r ? (r < 0 ? -1 : 1) : (a.n < b.n ? -1 : a.n > b.n);
    }
    *ok = 0;
    return 0;
}

static int contains(ctx_t *c, val_t hay, val_t x, int line) {
    const cJSON *it;
    if (hay.k == V_STR && x.k == V_STR) return x.n == 0 || memmem(hay.s, hay.n, x.s, x.n) != NULL;
    if (hay.k == V_LIST) {
        cJSON_ArrayForEach(it, hay.j) if (equal(from_json(it), x)) return 1;
        return 0;
    }
    if (hay.k == V_DICT) {
        if (x.k != V_STR) return 0;
        cJSON_ArrayForEach(it, hay.j) if (strlen(it->string) == x.n && !memcmp(it->string, x.s, x.n)) return 1;
        return 0;
    }
    fail(c, line, "'in' needs a string, list or dict on its right, not %s", KIND[hay.k]);
    return 0;
}

static val_t concat(ctx_t *c, val_t a, val_t b) {
    sbuf_t s = {0};
    sb_put(&s, a.s, a.n);
    sb_put(&s, b.s, b.n);
    if (!s.p) sb_put(&s, "", 0);
    return sb_val(c, &s);
}

static val_t arith_num(ctx_t *c, int op, val_t a, val_t b, int line) {
    int fl = a.k == V_FLOAT || b.k == V_FLOAT;
    double x = num(a), y = num(b);
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0) return fail(c, line, "division by zero"), V(V_UNDEF);
    switch (op) {
    case OP_ADD: return fl ? (val_t){.k = V_FLOAT, .f = x + y} : vint(a.i + b.i);
    case OP_SUB: return fl ? (val_t){.k = V_FLOAT, .f = x - y} : vint(a.i - b.i);
    case OP_MUL: return fl ? (val_t){.k = V_FLOAT, .f = x * y} : vint(a.i * b.i);
    case OP_DIV: return (val_t){.k = V_FLOAT, .f = x / y};
    case OP_FLOORDIV: return fl ? (val_t){.k = V_FLOAT, .f = floor(x / y)} : vint((a.i - (((a.i % b.i) + b.i) % b.i)) / b.i);
    case OP_MOD: return fl ? (val_t){.k = V_FLOAT, .f = x - y * floor(x / y)} : vint(((a.i % b.i) + b.i) % b.i);
    default: return (fl || b.i < 0) ? (val_t){.k = V_FLOAT, .f = pow(x, y)} : vint((long long)llround(pow(x, y)));
    }
}

static val_t arith(ctx_t *c, int op, val_t a, val_t b, int line) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == OP_CAT) return concat(c, to_str(c, a), to_str(c, b));
    if (numeric(a) && numeric(b)) return arith_num(c, op, a, b, line);
    if (op == OP_ADD && a.k == V_STR && b.k == V_STR) return concat(c, a, b);
    if (op == OP_ADD && a.k == V_LIST && b.k == V_LIST) {
        cJSON *l = new_list(c);
        const cJSON *x;
        cJSON_ArrayForEach(x, a.j) cJSON_AddItemReferenceToArray(l, (cJSON *)x);
        cJSON_ArrayForEach(x, b.j) cJSON_AddItemReferenceToArray(l, (cJSON *)x);
        return (val_t){.k = V_LIST, .j = l};
    }
    if (op == OP_MUL && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        val_t s = a.k == V_STR ? a : b;
        long long k = a.k == V_INT ? a.i : b.i;
        sbuf_t r = {0};
        sb_put(&r, "", 0);
        for (long long i = 0; i < k && r.n < (1u << 24); i++) sb_put(&r, s.s, s.n);
        return sb_val(c, &r);
    }
    if (a.k == V_UNDEF || b.k == V_UNDEF) {
        const char *nm = a.k == V_UNDEF ? a.s : b.s;
        return fail(c, line, "'%s' is undefined (used with '%s')", nm ? nm : "a value", sym[op]), V(V_UNDEF);
    }
    return fail(c, line, "unsupported operand types for %s: '%s' and '%s'", sym[op], KIND[a.k], KIND[b.k]), V(V_UNDEF);
}

static val_t compare(ctx_t *c, int op, val_t a, val_t b, int line) {
    if (op == OP_EQ || op == OP_NE) return vbool(equal(a, b) == (op == OP_EQ));
    if (op == OP_IN || op == OP_NOTIN) return vbool(contains(c, b, a, line) == (op == OP_IN));
    int ok, r = order(a, b, &ok);
    if (!ok) return fail(c, line, "'%s' and '%s' cannot be compared with < or >", KIND[a.k], KIND[b.k]), V(V_UNDEF);
    return vbool(op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0);
}

/* ---- attributes and items --------------------------------------------------------------- */

static val_t dict_get(val_t d, const char *key, size_t n) {
    const cJSON *x;
    cJSON_ArrayForEach(x, d.j) if (strlen(x->string) == n && !memcmp(x->string, key, n)) return from_json(x);
    return V(V_UNDEF);
}

static val_t attr(ctx_t *c, val_t o, const char *name, int line) {
    if (o.k == V_UNDEF) return fail(c, line, "'%s' is undefined, so it has no attribute '%s'", o.s ? o.s : "a value", name), o;
    if (o.k == V_DICT || o.k == V_NS) return dict_get(o, name, strlen(name));
    if (o.k == V_LOOP) {
        loopinfo_t *l = o.loop;
        static const char *const f[] = {"index", "index0", "first", "last", "length", "revindex", "revindex0", NULL};
        long long v[] = {l->index0 + 1, l->index0, l->index0 == 0, l->index0 == l->length - 1, l->length, l->length - l->index0,
                         l->length - l->index0 - 1};
        for (int k = 0; f[k]; k++)
            if (!strcmp(name, f[k])) return (k == 2 || k == 3) ? vbool((int)v[k]) : vint(v[k]);
        return fail(c, line, "loop.%s is not supported", name), V(V_UNDEF);
    }
    val_t u = V(V_UNDEF);
    u.s = name;
    return u;
}

static val_t item(ctx_t *c, val_t o, val_t key, int line) {
    if (key.k == V_STR && (o.k == V_DICT || o.k == V_NS)) return dict_get(o, key.s, key.n);
    if (key.k == V_STR && o.k != V_UNDEF) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(key.n < 63 ? key.n : 63), key.s);
        return o.k == V_LOOP ? attr(c, o, name, line) : V(V_UNDEF);
    }
    if (o.k == V_UNDEF) return fail(c, line, "'%s' is undefined, so it cannot be indexed", o.s ? o.s : "a value"), o;
    if (key.k != V_INT && key.k != V_BOOL) return V(V_UNDEF);
    long long n = count_of(o), i = key.i < 0 ? key.i + n : key.i;
    if (i < 0 || i >= n) return V(V_UNDEF);
    if (o.k == V_LIST) return from_json(cJSON_GetArrayItem(o.j, (int)i));
    if (o.k == V_STR) {
        size_t a = cp_offset(o, i), b = cp_offset(o, i + 1);
        return vstr(o.s + a, b - a);
    }
    return V(V_UNDEF);
}

/* o[lo:hi] with Python's clamping and negative indexes. */
static val_t slice(ctx_t *c, val_t o, val_t lo, val_t hi, int line) {
    if (o.k != V_LIST && o.k != V_STR) return fail(c, line, "a %s value cannot be sliced", KIND[o.k]), V(V_UNDEF);
    long long n = count_of(o), a = lo.k == V_INT ? lo.i : 0, b = hi.k == V_INT ? hi.i : n;
    if ((lo.k != V_INT && lo.k != V_UNDEF && lo.k != V_NONE) || (hi.k != V_INT && hi.k != V_UNDEF && hi.k != V_NONE))
        return fail(c, line, "slice bounds must be integers"), V(V_UNDEF);
    if (a < 0) a = a + n < 0 ? 0 : a + n;
    if (b < 0) b = b + n < 0 ? 0 : b + n;
    if (a > n) a = n;
    if (b > n) b = n;
    if (b < a) b = a;
    if (o.k == V_STR) {
        size_t x = cp_offset(o, a), y = cp_offset(o, b);
        return vstr(o.s + x, y - x);
    }
    cJSON *l = new_list(c);
    for (long long i = a; i < b; i++) cJSON_AddItemReferenceToArray(l, cJSON_GetArrayItem(o.j, (int)i));
    return (val_t){.k = V_LIST, .j = l};
}

/* ---- strings: Python's methods and jinja2's filters --------------------------------------- */

static int space_at(const char *s, size_t n, int *k) { return loom_chat_py_space((const unsigned char *)s, n, k); }

/* Is the character at s[i] (k bytes) one of `chars` (NULL: whitespace)? */
static int strip_char(val_t v, size_t i, size_t *k, const val_t *chars) {
    int kk;
    if (!chars) {
        int sp = space_at(v.s + i, v.n - i, &kk);
        *k = (size_t)kk;
        return sp;
    }
    *k = 1;
    while (i + *k < v.n && ((unsigned char)v.s[i + *k] & 0xC0) == 0x80) (*k)++;
    for (size_t j = 0; j + *k <= chars->n; j++)
        if (!memcmp(chars->s + j, v.s + i, *k)) return 1;
    return 0;
}

/* str.strip / lstrip / rstrip (`how`: 3 both, 1 left, 2 right). */
static val_t strip(val_t v, int how, const val_t *chars) {
    size_t a = 0, b = v.n, k;
    while ((how & 1) && a < b && strip_char(v, a, &k, chars)) a += k;
    while ((how & 2) && b > a) {
        size_t s = b - 1;
        while (s > a && ((unsigned char)v.s[s] & 0xC0) == 0x80) s--;
        if (!strip_char(v, s, &k, chars) || s + k != b) break;
        b = s;
    }
    return vstr(v.s + a, b - a);
}

/* upper / lower / capitalize / Python's title / jinja2's title filter (ASCII;
 * other letters would need Unicode case tables, so they are an error). */
static val_t recase(ctx_t *c, val_t v, const char *how, int line) {
    for (size_t i = 0; i < v.n; i++)
        if ((unsigned char)v.s[i] >= 0x80) return fail(c, line, "%s() of non-ASCII text is not supported", how), V(V_UNDEF);
    char *s = own_str(c, v.n);
    int word_start = 1;
    for (size_t i = 0; i < v.n; i++) {
        char ch = v.s[i];
        int alpha = (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z';
        int up = !strcmp(how, "upper") || (!strcmp(how, "capitalize") && i == 0) || (how[0] == 't' && word_start);
        s[i] = alpha ? (char)(up ? (ch & ~0x20) : (ch | 0x20)) : ch;
        if (!strcmp(how, "title")) word_start = !alpha; /* str.title: after any non-letter */
        else if (!strcmp(how, "title_filter")) word_start = strchr("-({[< \t\n\r\v\f", ch) != NULL;
    }
    s[v.n] = 0;
    return vstr(s, v.n);
}

static val_t replace(ctx_t *c, val_t v, val_t from, val_t to, long long count) {
    sbuf_t b = {0};
    sb_put(&b, "", 0);
    size_t i = 0;
    for (long long done = 0; i <= v.n && (count < 0 || done < count); done++) {
        const char *p = from.n ? memmem(v.s + i, v.n - i, from.s, from.n) : (i < v.n || done == 0 ? v.s + i : NULL);
        if (!p) break;
        sb_put(&b, v.s + i, (size_t)(p - (v.s + i)));
        sb_put(&b, to.s, to.n);
        i = (size_t)(p - v.s) + from.n;
        if (!from.n) { /* an empty pattern goes between every character */
            if (i >= v.n) { i = v.n + 1; break; }
            size_t k = 1;
            while (i + k < v.n && ((unsigned char)v.s[i + k] & 0xC0) == 0x80) k++;
            sb_put(&b, v.s + i, k);
            i += k;
        }
    }
    if (i < v.n) sb_put(&b, v.s + i, v.n - i);
    return sb_val(c, &b);
}

/* str.split(sep=None) */
static val_t split(ctx_t *c, val_t v, const val_t *sep, int line) {
    cJSON *l = new_list(c);
    if (sep && sep->n == 0) return fail(c, line, "split() with an empty separator"), V(V_UNDEF);
    size_t i = 0;
    while (i <= v.n) {
        if (!sep) {
            int k;
            while (i < v.n && space_at(v.s + i, v.n - i, &k)) i += (size_t)k;
            if (i >= v.n) break;
            size_t j = i;
            while (j < v.n && !space_at(v.s + j, v.n - j, &k)) j++;
            list_add(c, l, vstr(v.s + i, j - i), line);
            i = j;
            continue;
        }
        const char *p = memmem(v.s + i, v.n - i, sep->s, sep->n);
        size_t j = p ? (size_t)(p - v.s) : v.n;
        list_add(c, l, vstr(v.s + i, j - i), line);
        i = j + sep->n;
        if (!p) break;
    }
    return (val_t){.k = V_LIST, .j = l};
}

/* ---- tests, filters, methods, functions -------------------------------------------------- */

static val_t eval(ctx_t *c, const node_t *n);

/* The positional argument i of a call node, or the keyword `kw`; *have set. */
static val_t arg(ctx_t *c, const node_t *n, int i, const char *kw, int *have) {
    int pos = 0;
    for (int k = 0; k < n->nargs; k++) {
        if ((n->kw[k] && kw && !strcmp(n->kw[k], kw)) || (!n->kw[k] && pos++ == i)) {
            if (have) *have = 1;
            return eval(c, n->args[k]);
        }
    }
    if (have) *have = 0;
    return V(V_UNDEF);
}

static int run_test(ctx_t *c, const char *name, val_t v, val_t a, int line) {
    if (!strcmp(name, "defined")) return v.k != V_UNDEF;
    if (!strcmp(name, "undefined")) return v.k == V_UNDEF;
    if (!strcmp(name, "none")) return v.k == V_NONE;
    if (!strcmp(name, "string")) return v.k == V_STR;
    if (!strcmp(name, "number")) return numeric(v);
    if (!strcmp(name, "integer")) return v.k == V_INT;
    if (!strcmp(name, "float")) return v.k == V_FLOAT;
    if (!strcmp(name, "boolean")) return v.k == V_BOOL;
    if (!strcmp(name, "mapping")) return v.k == V_DICT;
    if (!strcmp(name, "iterable")) return v.k == V_LIST || v.k == V_DICT || v.k == V_STR || v.k == V_UNDEF;
    if (!strcmp(name, "sequence")) return v.k == V_LIST || v.k == V_DICT || v.k == V_STR || v.k == V_UNDEF;
    if (!strcmp(name, "true")) return v.k == V_BOOL && v.i;
    if (!strcmp(name, "false")) return v.k == V_BOOL && !v.i;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return equal(v, a);
    if ((!strcmp(name, "even") || !strcmp(name, "odd")) && v.k == V_INT) return (int)(((v.i % 2) + 2) % 2) == (name[0] == 'o');
    fail(c, line, "the test \"%s\" does not apply to a %s value", name, KIND[v.k]);
    return 0;
}

/* select / reject / selectattr / rejectattr */
static val_t select_items(ctx_t *c, const node_t *n, val_t v, int attr_form, int keep) {
    val_t l = iter_list(c, v, n->line), an = V(V_UNDEF), tn = V(V_UNDEF), ta = V(V_UNDEF);
    if (attr_form) an = arg(c, n, 0, NULL, NULL);
    tn = arg(c, n, attr_form, NULL, NULL);
    ta = arg(c, n, attr_form + 1, NULL, NULL);
    if ((attr_form && an.k != V_STR) || (tn.k != V_STR && tn.k != V_UNDEF))
        return fail(c, n->line, "%s needs %s", n->name, attr_form ? "an attribute name and a test name" : "a test name"), V(V_UNDEF);
    cJSON *out = new_list(c);
    const cJSON *x;
    cJSON_ArrayForEach(x, l.j) {
        val_t e = from_json(x), t = attr_form ? item(c, e, an, n->line) : e;
        char tname[32];
        snprintf(tname, sizeof tname, "%.*s", (int)(tn.n < 31 ? tn.n : 31), tn.k == V_STR ? tn.s : "");
        int pass = tn.k == V_STR ? run_test(c, tname, t, ta, n->line) : truthy(t);
        if (c->err != LOOM_OK) return V(V_UNDEF);
        if (pass == keep) cJSON_AddItemReferenceToArray(out, (cJSON *)x);
    }
    return (val_t){.k = V_LIST, .j = out};
}

static val_t join(ctx_t *c, const node_t *n, val_t v) {
    val_t l = iter_list(c, v, n->line), sep = arg(c, n, 0, "d", NULL), at = arg(c, n, 1, "attribute", NULL);
    sbuf_t b = {0};
    sb_put(&b, "", 0);
    const cJSON *x;
    int first = 1;
    cJSON_ArrayForEach(x, l.j) {
        if (!first && sep.k == V_STR) sb_put(&b, sep.s, sep.n);
        first = 0;
        val_t e = from_json(x);
        if (at.k == V_STR) e = item(c, e, at, n->line);
        e = to_str(c, e);
        sb_put(&b, e.s, e.n);
    }
    return sb_val(c, &b);
}

static val_t pairs(ctx_t *c, val_t v, int what, int line) {
    if (v.k == V_UNDEF) return (val_t){.k = V_LIST, .j = new_list(c)};
    if (v.k != V_DICT) return fail(c, line, "items(), keys() and values() need a dict, not %s", KIND[v.k]), V(V_UNDEF);
    cJSON *l = new_list(c);
    const cJSON *x;
    cJSON_ArrayForEach(x, v.j) {
        if (what == 1) cJSON_AddItemToArray(l, cJSON_CreateString(x->string));
        else if (what == 2) cJSON_AddItemReferenceToArray(l, (cJSON *)x);
        else {
            cJSON *p = cJSON_CreateArray();
            cJSON_AddItemToArray(p, cJSON_CreateString(x->string));
            cJSON_AddItemReferenceToArray(p, (cJSON *)x);
            cJSON_AddItemToArray(l, p);
        }
    }
    return (val_t){.k = V_LIST, .j = l};
}

static val_t tojson(ctx_t *c, const node_t *n, val_t v) {
    val_t ind = arg(c, n, 0, "indent", NULL);
    sbuf_t b = {0};
    if (!json_dump(&b, v, ind.k == V_INT ? (int)ind.i : -1, 0)) {
        free(b.p);
        return fail(c, n->line, "tojson: a %s value is not JSON", KIND[v.k]), V(V_UNDEF);
    }
    return sb_val(c, &b);
}

static val_t filter_more(ctx_t *c, const node_t *n, const char *f, val_t v) {
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        val_t b = arg(c, n, 1, "boolean", NULL);
        int have;
        val_t d = arg(c, n, 0, "default_value", &have);
        return v.k == V_UNDEF || (truthy(b) && !truthy(v)) ? (have ? d : vstr("", 0)) : v;
    }
    if (!strcmp(f, "int")) {
        if (v.k == V_STR) return vint(strtoll(strip(v, 3, NULL).s, NULL, 10));
        return vint(v.k == V_FLOAT ? (long long)v.f : numeric(v) ? v.i : 0);
    }
    if (!strcmp(f, "map")) {
        val_t at = arg(c, n, 0, "attribute", NULL), l = iter_list(c, v, n->line);
        if (at.k != V_STR || n->kw[0] == NULL) return fail(c, n->line, "map() is supported with attribute= only"), V(V_UNDEF);
        cJSON *out = new_list(c);
        const cJSON *x;
        cJSON_ArrayForEach(x, l.j) list_add(c, out, item(c, from_json(x), at, n->line), n->line);
        return (val_t){.k = V_LIST, .j = out};
    }
    if (!strcmp(f, "replace")) {
        val_t a = to_str(c, arg(c, n, 0, "old", NULL)), b = to_str(c, arg(c, n, 1, "new", NULL)), k = arg(c, n, 2, "count", NULL);
        return replace(c, to_str(c, v), a, b, k.k == V_INT ? k.i : -1);
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject")) return select_items(c, n, v, 0, f[0] == 's');
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) return select_items(c, n, v, 1, f[0] == 's');
    return fail(c, n->line, "the filter \"%s\" is not supported", f), V(V_UNDEF);
}

static val_t filter(ctx_t *c, const node_t *n, val_t v) {
    const char *f = n->name;
    if (!strcmp(f, "trim")) {
        int have;
        val_t ch = arg(c, n, 0, "chars", &have);
        return strip(to_str(c, v), 3, have && ch.k == V_STR ? &ch : NULL);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (v.k != V_STR && v.k != V_LIST && v.k != V_DICT && v.k != V_UNDEF) return fail(c, n->line, "a %s value has no length", KIND[v.k]), v;
        return vint(count_of(v));
    }
    if (!strcmp(f, "tojson")) return tojson(c, n, v);
    if (!strcmp(f, "join")) return join(c, n, v);
    if (!strcmp(f, "list")) return iter_list(c, v, n->line);
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        val_t l = iter_list(c, v, n->line);
        return l.k == V_LIST ? item(c, l, vint(f[0] == 'f' ? 0 : -1), n->line) : l;
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize")) return recase(c, to_str(c, v), f, n->line);
    if (!strcmp(f, "title")) return recase(c, to_str(c, v), "title_filter", n->line);
    if (!strcmp(f, "string")) return to_str(c, v);
    if (!strcmp(f, "items")) return pairs(c, v, 0, n->line);
    if (!strcmp(f, "safe")) return v;
    return filter_more(c, n, f, v);
}

static val_t str_method(ctx_t *c, const node_t *n, const char *m, val_t s) {
    int have;
    val_t a = arg(c, n, 0, NULL, &have);
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
        return strip(s, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, have && a.k == V_STR ? &a : NULL);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (a.k != V_STR) return fail(c, n->line, "%s() needs a string", m), V(V_UNDEF);
        if (a.n > s.n) return vbool(0);
        return vbool(!memcmp(m[0] == 's' ? s.s : s.s + s.n - a.n, a.s, a.n));
    }
    if (!strcmp(m, "split")) return split(c, s, have && a.k == V_STR ? &a : NULL, n->line);
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) return recase(c, s, m, n->line);
    if (!strcmp(m, "replace")) {
        val_t b = arg(c, n, 1, NULL, NULL), k = arg(c, n, 2, NULL, NULL);
        if (a.k != V_STR || b.k != V_STR) return fail(c, n->line, "replace() needs two strings"), V(V_UNDEF);
        return replace(c, s, a, b, k.k == V_INT ? k.i : -1);
    }
    return fail(c, n->line, "strings have no method %s()", m), V(V_UNDEF);
}

static val_t method(ctx_t *c, const node_t *n) {
    const char *m = n->a->name;
    val_t o = eval(c, n->a->a);
    if (c->err != LOOM_OK) return o;
    if (o.k == V_STR) return str_method(c, n, m, o);
    if (o.k == V_DICT && (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")))
        return pairs(c, o, m[0] == 'i' ? 0 : m[0] == 'k' ? 1 : 2, n->line);
    if (o.k == V_DICT && !strcmp(m, "get")) {
        val_t k = arg(c, n, 0, NULL, NULL), r = k.k == V_STR ? dict_get(o, k.s, k.n) : V(V_UNDEF);
        return r.k == V_UNDEF ? (n->nargs > 1 ? arg(c, n, 1, NULL, NULL) : V(V_NONE)) : r;
    }
    if (o.k == V_UNDEF) return fail(c, n->line, "'%s' is undefined, so it has no method %s()", o.s ? o.s : "a value", m), o;
    return fail(c, n->line, "a %s value has no method %s()", KIND[o.k], m), V(V_UNDEF);
}

static val_t call(ctx_t *c, const node_t *n) {
    if (n->a->kind == E_ATTR) return method(c, n);
    const char *f = n->a->name;
    if (!strcmp(f, "raise_exception")) {
        val_t m = to_str(c, arg(c, n, 0, NULL, NULL));
        c->err = loom_error(LOOM_EINVAL, "%s: the template raised an exception: %.*s", c->t->origin, (int)m.n, m.s);
        return V(V_UNDEF);
    }
    if (!strcmp(f, "namespace")) {
        cJSON *ns = own_json(c, cJSON_CreateObject());
        for (int k = 0; k < n->nargs; k++)
            if (n->kw[k]) cJSON_AddItemToObject(ns, n->kw[k], to_json(c, eval(c, n->args[k]), n->line));
        return (val_t){.k = V_NS, .j = ns};
    }
    val_t a = arg(c, n, 0, NULL, NULL), b = arg(c, n, 1, NULL, NULL), s = arg(c, n, 2, NULL, NULL); /* range */
    long long lo = n->nargs > 1 ? a.i : 0, hi = n->nargs > 1 ? b.i : a.i, st = n->nargs > 2 ? s.i : 1;
    if (a.k != V_INT || (n->nargs > 1 && b.k != V_INT) || (n->nargs > 2 && s.k != V_INT) || st == 0 || n->nargs > 3)
        return fail(c, n->line, "range() takes 1 to 3 integers and a step that is not 0"), V(V_UNDEF);
    cJSON *l = new_list(c);
    long long made = 0;
    for (long long i = lo; (st > 0 ? i < hi : i > hi) && made++ < 100000; i += st) cJSON_AddItemToArray(l, cJSON_CreateNumber((double)i));
    return (val_t){.k = V_LIST, .j = l};
}

/* ---- expressions -------------------------------------------------------------------------- */

static val_t make_list(ctx_t *c, const node_t *n) {
    cJSON *l = own_json(c, n->kind == E_LIST ? cJSON_CreateArray() : cJSON_CreateObject());
    for (int k = 0; k < n->nargs && c->err == LOOM_OK; k++) {
        if (n->kind == E_LIST) {
            list_add(c, l, eval(c, n->args[k]), n->line);
            continue;
        }
        val_t key = eval(c, n->args[k++]);
        if (key.k != V_STR) return fail(c, n->line, "dict keys must be strings"), V(V_UNDEF);
        char *ks = own_str(c, key.n);
        memcpy(ks, key.s, key.n);
        ks[key.n] = 0;
        cJSON_DeleteItemFromObjectCaseSensitive(l, ks);
        cJSON_AddItemToObject(l, ks, to_json(c, eval(c, n->args[k]), n->line));
    }
    return (val_t){.k = n->kind == E_LIST ? V_LIST : V_DICT, .j = l, .i = n->op};
}

static val_t eval_node(ctx_t *c, const node_t *n) {
    val_t a, b;
    switch (n->kind) {
    case E_LIT_STR: return vstr(n->name, n->len);
    case E_LIT_INT: return vint(n->ival);
    case E_LIT_FLOAT: return (val_t){.k = V_FLOAT, .f = n->fval};
    case E_LIT_BOOL: return vbool((int)n->ival);
    case E_LIT_NONE: return V(V_NONE);
    case E_LIST:
    case E_DICT: return make_list(c, n);
    case E_NAME: {
        val_t *v = lookup(c, n->name);
        if (v) return *v;
        a = V(V_UNDEF);
        a.s = n->name;
        return a;
    }
    case E_ATTR: return a = eval(c, n->a), c->err ? a : attr(c, a, n->name, n->line);
    case E_INDEX: return a = eval(c, n->a), b = eval(c, n->b), c->err ? a : item(c, a, b, n->line);
    case E_SLICE: {
        a = eval(c, n->a);
        val_t lo = n->b ? eval(c, n->b) : V(V_NONE), hi = n->c ? eval(c, n->c) : V(V_NONE);
        return c->err ? a : slice(c, a, lo, hi, n->line);
    }
    case E_CALL: return call(c, n);
    case E_FILTER: return a = eval(c, n->a), c->err ? a : filter(c, n, a);
    case E_TEST:
        a = eval(c, n->a);
        b = n->nargs ? eval(c, n->args[0]) : V(V_UNDEF);
        return c->err ? a : vbool(run_test(c, n->name, a, b, n->line) != n->negate);
    case E_NOT: return vbool(!truthy(eval(c, n->a)));
    case E_NEG:
        a = eval(c, n->a);
        if (!numeric(a)) return fail(c, n->line, "'-' needs a number, not %s", KIND[a.k]), V(V_UNDEF);
        return a.k == V_FLOAT ? (val_t){.k = V_FLOAT, .f = -a.f} : vint(-a.i);
    case E_AND: return a = eval(c, n->a), truthy(a) ? eval(c, n->b) : a; /* Python's and/or give an operand */
    case E_OR: return a = eval(c, n->a), truthy(a) ? a : eval(c, n->b);
    case E_BIN: return a = eval(c, n->a), b = eval(c, n->b), c->err ? a : arith(c, n->op, a, b, n->line);
    case E_CMP: return a = eval(c, n->a), b = eval(c, n->b), c->err ? a : compare(c, n->op, a, b, n->line);
    case E_COND: return truthy(eval(c, n->a)) ? eval(c, n->b) : n->c ? eval(c, n->c) : V(V_UNDEF);
    default: return fail(c, n->line, "internal: node %d is not an expression", n->kind), V(V_UNDEF);
    }
}

static val_t eval(ctx_t *c, const node_t *n) {
    if (c->err != LOOM_OK) return V(V_UNDEF);
    if (++c->depth > 200) {
        c->depth--;
        return fail(c, n->line, "expressions nest more than 200 deep"), V(V_UNDEF);
    }
    val_t v = eval_node(c, n);
    c->depth--;
    return c->err != LOOM_OK ? V(V_UNDEF) : v;
}

/* ---- statements ----------------------------------------------------------------------------- */

static void run(ctx_t *c, const node_t *n);

/* Bind the loop variables to one item ("a, b" takes a pair). */
static void bind_targets(ctx_t *c, const node_t *n, val_t v) {
    if (!n->name2) return bind(c, n->name, v);
    if ((v.k != V_LIST && v.k != V_STR) || count_of(v) != 2) {
        fail(c, n->line, "\"for %s, %s\" needs items of two values", n->name, n->name2);
        return;
    }
    bind(c, n->name, item(c, v, vint(0), n->line));
    bind(c, n->name2, item(c, v, vint(1), n->line));
}

/* The loop's items after its if filter (the loop variable bound while testing it). */
static val_t loop_items(ctx_t *c, const node_t *n) {
    val_t l = iter_list(c, eval(c, n->a), n->line);
    if (c->err != LOOM_OK || !n->d) return l;
    cJSON *out = new_list(c);
    const cJSON *x;
    cJSON_ArrayForEach(x, l.j) {
        frame_t f;
        push_frame(c, &f);
        bind_targets(c, n, from_json(x));
        int keep = truthy(eval(c, n->d));
        pop_frame(c, &f);
        if (keep) cJSON_AddItemReferenceToArray(out, (cJSON *)x);
    }
    return (val_t){.k = V_LIST, .j = out};
}

static void run_for(ctx_t *c, const node_t *n) {
    val_t l = loop_items(c, n);
    if (c->err != LOOM_OK) return;
    loopinfo_t info = {0, count_of(l)};
    const cJSON *x;
    cJSON_ArrayForEach(x, l.j) {
        frame_t f;
        push_frame(c, &f);
        bind_targets(c, n, from_json(x));
        bind(c, "loop", (val_t){.k = V_LOOP, .loop = &info});
        run(c, n->b);
        pop_frame(c, &f);
        info.index0++;
        c->cont = 0;
        if (c->brk || c->err != LOOM_OK) break;
    }
    c->brk = 0;
    if (info.length == 0 && n->c) run(c, n->c);
}

static void run_set(ctx_t *c, const node_t *n) {
    val_t v = eval(c, n->a);
    if (c->err != LOOM_OK) return;
    if (!n->name2) return bind(c, n->name, v);
    val_t *ns = lookup(c, n->name);
    if (!ns || ns->k != V_NS) {
        fail(c, n->line, "\"set %s.%s\": %s is not a namespace", n->name, n->name2, n->name);
        return;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(ns->j, n->name2);
    cJSON_AddItemToObject(ns->j, n->name2, to_json(c, v, n->line));
}

static void run(ctx_t *c, const node_t *n) {
    for (; n && c->err == LOOM_OK && !c->brk && !c->cont; n = n->next) {
        switch (n->kind) {
        case S_TEXT: sb_put(&c->out, n->name, n->len); break;
        case S_OUT: {
            val_t v = to_str(c, eval(c, n->a));
            if (c->err == LOOM_OK) sb_put(&c->out, v.s, v.n);
            break;
        }
        case S_IF: run(c, truthy(eval(c, n->a)) ? n->b : n->c); break;
        case S_FOR: run_for(c, n); break;
        case S_SET: run_set(c, n); break;
        case S_BREAK: c->brk = 1; break;
        case S_CONTINUE: c->cont = 1; break;
        default: fail(c, n->line, "internal: node %d is not a statement", n->kind);
        }
    }
}

loom_status loom_chat_template_render(const loom_chat_template_t *t, const loom_chat_vars_t *v, char **out) {
    *out = NULL;
    ctx_t c = {.t = t, .owned = cJSON_CreateArray()};
    frame_t globals, root;
    push_frame(&c, &globals);
    if (v->messages) bind(&c, "messages", from_json(v->messages));
    if (v->tools) bind(&c, "tools", from_json(v->tools));
    if (v->bos_token) bind(&c, "bos_token", vstr(v->bos_token, strlen(v->bos_token)));
    if (v->eos_token) bind(&c, "eos_token", vstr(v->eos_token, strlen(v->eos_token)));
    bind(&c, "add_generation_prompt", vbool(v->add_generation_prompt));
    const cJSON *x;
    cJSON_ArrayForEach(x, v->extra) bind(&c, x->string, from_json(x));
    push_frame(&c, &root); /* the template's own top-level names shadow the globals */
    sb_put(&c.out, "", 0);
    run(&c, t->body);
    pop_frame(&c, &root);
    pop_frame(&c, &globals);
    for (size_t i = 0; i < c.nstrs; i++) free(c.strs[i]);
    free(c.strs);
    cJSON_Delete(c.owned);
    if (c.err != LOOM_OK) {
        free(c.out.p);
        return c.err;
    }
    *out = c.out.p;
    return LOOM_OK;
}
