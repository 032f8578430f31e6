/* json_schema: schema compiler, byte matcher and token filter (see json_schema.h). */
#include "serve/json_schema.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LITS 64    /* enum values, or properties of one object (a 64-bit candidate mask) */
#define MAX_DIGITS 16  /* digits of a number (a bound so that every output can end) */
#define MAX_NODES 4096

/* Node kinds. ANY is any JSON value; OBJ_FREE any object (string keys, ANY values).
 * SEQ and SWITCH build grammars around schemas (loom_json_grammar_*): SEQ
 * is its children one after another; SWITCH one of its literals, then the
 * child that literal leads to. */
enum { N_ANY, N_OBJECT, N_OBJ_FREE, N_ARRAY, N_STRING, N_INTEGER, N_NUMBER, N_LITERAL, N_ANYOF, N_SEQ, N_SWITCH };
/* The nodes every schema has, at fixed places. */
enum { ANY, OBJ_FREE, ARR_FREE, STR_FREE, NUM_FREE, LIT_FREE, N_FIXED };

typedef struct {
    int kind;
    int n;            /* properties, literals or alternatives */
    int *child;       /* (n) property value nodes, or alternatives */
    char **lit;       /* (n) literals as JSON text; object: each key as "\"name\"" */
    int *lit_len;     /* (n) */
    uint64_t required; /* object: bit j = property j is required */
    int items, min, max; /* array: items node and bounds; string: length bounds */
} node_t;

struct loom_json_schema {
    node_t *nodes;
    int n_nodes;
};

/* ---- compiling ---- */

typedef struct {
    loom_json_schema_t *s;
    const cJSON *root;
    const cJSON *ref_of[256]; /* $ref targets compiled so far, and their nodes */
    int ref_node[256], n_refs;
    char path[256];
} compiler_t;

static int add_node(loom_json_schema_t *s, int kind) {
    if (s->n_nodes == MAX_NODES) return -1;
    s->nodes = realloc(s->nodes, (size_t)(s->n_nodes + 1) * sizeof *s->nodes);
    memset(&s->nodes[s->n_nodes], 0, sizeof *s->nodes);
    s->nodes[s->n_nodes].kind = kind;
    s->nodes[s->n_nodes].max = INT_MAX;
    return s->n_nodes++;
}

static void add_lit(node_t *n, const char *text) {
    n->lit = realloc(n->lit, (size_t)(n->n + 1) * sizeof *n->lit);
    n->lit_len = realloc(n->lit_len, (size_t)(n->n + 1) * sizeof *n->lit_len);
    n->lit[n->n] = loom_strdup(text);
    n->lit_len[n->n] = (int)strlen(text);
    n->n++;
}

static void add_child(node_t *n, int c) {
    n->child = realloc(n->child, (size_t)(n->n + 1) * sizeof *n->child);
    n->child[n->n] = c;
}

static loom_status refuse(compiler_t *c, const char *fmt, const char *what) {
    char msg[160];
    snprintf(msg, sizeof msg, fmt, what);
    return loom_error(LOOM_EINVAL, "json_schema: %s at %s", msg, c->path[0] ? c->path : "the top level");
}

static loom_status compile_node(compiler_t *c, const cJSON *j, int *out);

/* Compile j with path + suffix as its place in the error messages. */
static loom_status compile_at(compiler_t *c, const cJSON *j, const char *suffix, int *out) {
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, "%s%s", n ? "." : "", suffix);
    loom_status st = compile_node(c, j, out);
    c->path[n] = 0;
    return st;
}

/* The keywords loom enforces or that do not constrain; anything else is refused. */
static loom_status check_keywords(compiler_t *c, const cJSON *j) {
    static const char *const ok[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                     "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "$ref",
                                     "$defs", "definitions", "title", "description", "default", "examples", "$schema",
                                     "$id", "$comment", "uniqueItems"};
    for (const cJSON *k = j->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof ok / sizeof *ok && strcmp(ok[i], k->string)) i++;
        if (i == sizeof ok / sizeof *ok)
            return refuse(c, "'%s' is not supported by this server's constrained decoding (it would be ignored, so it is refused)",
                          k->string);
        if (!strcmp(k->string, "uniqueItems") && cJSON_IsTrue(k)) return refuse(c, "'%s': true is not supported", "uniqueItems");
    }
    return LOOM_OK;
}

/* A literal node for enum / const (each value printed compactly). */
static loom_status compile_literals(compiler_t *c, const cJSON *vals, int single, int *out) {
    if ((*out = add_node(c->s, N_LITERAL)) < 0) return refuse(c, "%s", "the schema has too many nodes");
    int n = single ? 1 : cJSON_GetArraySize(vals);
    if (!single && (!cJSON_IsArray(vals) || n == 0)) return refuse(c, "'%s' must be a non-empty list", "enum");
    if (n > MAX_LITS) return refuse(c, "'enum' has more than %s values", "64");
    const cJSON *v = single ? vals : vals->child;
    for (int i = 0; i < n; i++, v = v->next) {
        char *t = cJSON_PrintUnformatted(v);
        add_lit(&c->s->nodes[*out], t);
        free(t);
    }
    node_t *nd = &c->s->nodes[*out];
    for (int a = 0; a < nd->n; a++) /* a value that is a prefix of another (1 and 12) would end ambiguously */
        for (int b = 0; b < nd->n; b++)
            if (a != b && !strncmp(nd->lit[a], nd->lit[b], (size_t)nd->lit_len[a]))
                return refuse(c, "'enum' value %s is a prefix of another value (or repeated)", nd->lit[a]);
    return LOOM_OK;
}

static int get_bound(const cJSON *j, const char *name, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e9 ? (int)v->valuedouble : dflt;
}

static loom_status compile_object(compiler_t *c, const cJSON *j, int *out) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(j, "properties"), *req = cJSON_GetObjectItemCaseSensitive(j, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties");
    if (cJSON_IsObject(addl) && addl->child) /* a map's values: loom's free objects hold any value */
        return refuse(c, "'%s' with a schema (a map of typed values) is not supported", "additionalProperties");
    if (!props && req && req->child) /* a free object would not hold them */
        return refuse(c, "'required' names '%s' but the object has no 'properties'", cJSON_IsString(req->child) ? req->child->valuestring : "?");
    if (!props && !cJSON_IsFalse(addl)) return *out = OBJ_FREE, LOOM_OK;
    if ((*out = add_node(c->s, N_OBJECT)) < 0) return refuse(c, "%s", "the schema has too many nodes");
    if (cJSON_GetArraySize(props) > MAX_LITS) return refuse(c, "an object with more than %s properties", "64");
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        int child;
        char key[200];
        LOOM_TRY(compile_at(c, p, p->string, &child));
        cJSON *ks = cJSON_CreateString(p->string);
        char *kt = cJSON_PrintUnformatted(ks);
        snprintf(key, sizeof key, "%s", kt);
        free(kt), cJSON_Delete(ks);
        node_t *nd = &c->s->nodes[*out];
        add_child(nd, child);
        add_lit(nd, key);
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        node_t *nd = &c->s->nodes[*out];
        int k = 0;
        size_t len = cJSON_IsString(r) ? strlen(r->valuestring) : 0;
        while (k < nd->n && (!cJSON_IsString(r) || nd->lit_len[k] != (int)len + 2 || strncmp(nd->lit[k] + 1, r->valuestring, len))) k++;
        if (k == nd->n) return refuse(c, "'required' names '%s', which is not in 'properties'", cJSON_IsString(r) ? r->valuestring : "?");
        nd->required |= 1ull << k;
    }
    return LOOM_OK;
}

static loom_status compile_type(compiler_t *c, const cJSON *j, const char *type, int *out) {
    if (!strcmp(type, "object")) return compile_object(c, j, out);
    if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        cJSON *lits = cJSON_CreateArray();
        if (!strcmp(type, "null")) cJSON_AddItemToArray(lits, cJSON_CreateNull());
        else cJSON_AddItemToArray(lits, cJSON_CreateTrue()), cJSON_AddItemToArray(lits, cJSON_CreateFalse());
        loom_status st = compile_literals(c, lits, 0, out);
        cJSON_Delete(lits);
        return st;
    }
    int kind = !strcmp(type, "array") ? N_ARRAY : !strcmp(type, "string") ? N_STRING : !strcmp(type, "integer") ? N_INTEGER
             : !strcmp(type, "number") ? N_NUMBER : -1;
    if (kind < 0) return refuse(c, "type '%s' is not a JSON schema type", type);
    if ((*out = add_node(c->s, kind)) < 0) return refuse(c, "%s", "the schema has too many nodes");
    if (kind == N_ARRAY) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(j, "items");
        int it = ANY;
        if (items) LOOM_TRY(compile_at(c, items, "items", &it));
        node_t *nd = &c->s->nodes[*out];
        nd->items = it, nd->min = get_bound(j, "minItems", 0), nd->max = get_bound(j, "maxItems", INT_MAX);
    } else if (kind == N_STRING) {
        node_t *nd = &c->s->nodes[*out];
        nd->min = get_bound(j, "minLength", 0), nd->max = get_bound(j, "maxLength", INT_MAX);
    }
    if (c->s->nodes[*out].min > c->s->nodes[*out].max) return refuse(c, "%s: the minimum is above the maximum", type);
    return LOOM_OK;
}

/* A $ref into #/$defs or #/definitions: compiled once (recursion reuses the node). */
static loom_status compile_ref(compiler_t *c, const char *ref, int *out) {
    const cJSON *t = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), ref + 14);
    else if (!strcmp(ref, "#")) t = c->root;
    if (!t) return refuse(c, "'$ref' %s does not name an entry of $defs or definitions", ref);
    for (int i = 0; i < c->n_refs; i++)
        if (c->ref_of[i] == t) return *out = c->ref_node[i], LOOM_OK;
    if (c->n_refs == 256) return refuse(c, "%s", "more than 256 $ref targets");
    /* reserve the node first: a recursive reference finds it */
    int me = add_node(c->s, N_ANYOF);
    if (me < 0) return refuse(c, "%s", "the schema has too many nodes");
    c->ref_of[c->n_refs] = t, c->ref_node[c->n_refs++] = me;
    int body;
    LOOM_TRY(compile_at(c, t, ref, &body));
    add_child(&c->s->nodes[me], body);
    c->s->nodes[me].n = 1;
    return *out = me, LOOM_OK;
}

static loom_status compile_node(compiler_t *c, const cJSON *j, int *out) {
    if (cJSON_IsTrue(j)) return *out = ANY, LOOM_OK;
    if (!cJSON_IsObject(j)) return refuse(c, "%s", "a schema must be an object");
    LOOM_TRY(check_keywords(c, j));
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "$ref"))) {
        if (!cJSON_IsString(v)) return refuse(c, "'%s' must be a string", "$ref");
        return compile_ref(c, v->valuestring, out);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "const"))) return compile_literals(c, v, 1, out);
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "enum"))) return compile_literals(c, v, 0, out);
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "anyOf")) || (v = cJSON_GetObjectItemCaseSensitive(j, "oneOf"))) {
        if (!cJSON_IsArray(v) || !v->child) return refuse(c, "'%s' must be a non-empty list of schemas", v->string);
        int me = add_node(c->s, N_ANYOF), k = 0;
        if (me < 0) return refuse(c, "%s", "the schema has too many nodes");
        for (const cJSON *a = v->child; a; a = a->next, k++) {
            char at[32];
            snprintf(at, sizeof at, "%s[%d]", v->string, k);
            int alt;
            LOOM_TRY(compile_at(c, a, at, &alt));
            add_child(&c->s->nodes[me], alt);
            c->s->nodes[me].n++;
        }
        return *out = me, LOOM_OK;
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!v && cJSON_GetObjectItemCaseSensitive(j, "properties")) return compile_object(c, j, out);
    if (!v) return *out = ANY, LOOM_OK;
    if (cJSON_IsString(v)) return compile_type(c, j, v->valuestring, out);
    if (!cJSON_IsArray(v) || !v->child) return refuse(c, "'%s' must be a type name or a list of them", "type");
    int me = add_node(c->s, N_ANYOF);
    if (me < 0) return refuse(c, "%s", "the schema has too many nodes");
    for (const cJSON *t = v->child; t; t = t->next) {
        int alt;
        if (!cJSON_IsString(t)) return refuse(c, "'%s' must be a list of type names", "type");
        LOOM_TRY(compile_type(c, j, t->valuestring, &alt));
        add_child(&c->s->nodes[me], alt);
        c->s->nodes[me].n++;
    }
    return *out = me, LOOM_OK;
}

/* The bytes a value of node n may start with (bit b of first[b / 64]). */
static void first_bytes(const loom_json_schema_t *s, int n, uint64_t first[4], int depth) {
    const node_t *nd = &s->nodes[n];
    const char *set = NULL;
    switch (nd->kind) {
    case N_ANY: set = "{[\"-0123456789tfn"; break;
    case N_OBJECT: case N_OBJ_FREE: set = "{"; break;
    case N_ARRAY: set = "["; break;
    case N_STRING: set = "\""; break;
    case N_INTEGER: case N_NUMBER: set = "-0123456789"; break;
    case N_LITERAL: case N_SWITCH:
        for (int i = 0; i < nd->n; i++) first[(unsigned char)nd->lit[i][0] / 64] |= 1ull << ((unsigned char)nd->lit[i][0] % 64);
        return;
    case N_SEQ:
        if (nd->n && depth < 64) first_bytes(s, nd->child[0], first, depth + 1);
        return;
    default:
        if (depth < 64)
            for (int i = 0; i < nd->n; i++) first_bytes(s, nd->child[i], first, depth + 1);
        return;
    }
    for (; *set; set++) first[(unsigned char)*set / 64] |= 1ull << ((unsigned char)*set % 64);
}

/* anyOf alternatives must start with different bytes: the matcher picks one by its first byte. */
static loom_status check_alternatives(const loom_json_schema_t *s) {
    for (int n = 0; n < s->n_nodes; n++) {
        const node_t *nd = &s->nodes[n];
        if (nd->kind != N_ANYOF) continue;
        uint64_t seen[4] = {0};
        for (int i = 0; i < nd->n; i++) {
            uint64_t f[4] = {0};
            first_bytes(s, nd->child[i], f, 0);
            for (int w = 0; w < 4; w++)
                if (seen[w] & f[w])
                    return loom_error(LOOM_EINVAL, "json_schema: anyOf/oneOf (or a list of types) whose alternatives start "
                                      "alike (two objects, two strings, an integer and a number, ...) is not supported; "
                                      "merge those alternatives into one");
            for (int w = 0; w < 4; w++) seen[w] |= f[w];
        }
    }
    return LOOM_OK;
}

static void fixed_nodes(loom_json_schema_t *s) {
    add_node(s, N_ANY);
    add_node(s, N_OBJ_FREE);
    int a = add_node(s, N_ARRAY);
    s->nodes[a].items = ANY;
    add_node(s, N_STRING);
    add_node(s, N_NUMBER);
    int l = add_node(s, N_LITERAL);
    add_lit(&s->nodes[l], "true"), add_lit(&s->nodes[l], "false"), add_lit(&s->nodes[l], "null");
}

/* Compile schema text into s (its own $ref root); *top: the node of its
 * top level, which must be an object. `where` prefixes the messages. */
static loom_status compile_into(loom_json_schema_t *s, const char *schema, const char *where, int *top) {
    cJSON *j = cJSON_Parse(schema);
    compiler_t *c = loom_calloc(1, sizeof *c);
    c->s = s, c->root = j;
    snprintf(c->path, sizeof c->path, "%s", where);
    *top = 0;
    loom_status st = j ? compile_node(c, j, top) : loom_error(LOOM_EINVAL, "json_schema: the schema is not JSON");
    if (st == LOOM_OK && s->nodes[*top].kind != N_OBJECT && s->nodes[*top].kind != N_OBJ_FREE && s->nodes[*top].kind != N_ANY &&
        !(s->nodes[*top].kind == N_ANYOF && s->nodes[*top].n == 1))
        st = loom_error(LOOM_EINVAL, "json_schema: the top level%s%s must be an object (\"type\": \"object\"), as OpenAI asks",
                        where[0] ? " of " : "", where);
    cJSON_Delete(j);
    free(c);
    return st;
}

loom_status loom_json_schema_compile(const char *schema, loom_json_schema_t **out) {
    *out = NULL;
    loom_json_schema_t *s = loom_json_grammar_new();
    if (!schema) return *out = s, LOOM_OK; /* the top is an object (see loom_json_match_init) */
    int top = 0;
    loom_status st = compile_into(s, schema, "", &top);
    if (st == LOOM_OK) st = loom_json_grammar_finish(s, top);
    if (st != LOOM_OK) return loom_json_schema_free(s), st;
    *out = s;
    return LOOM_OK;
}

/* ---- grammars around schemas ---- */

loom_json_schema_t *loom_json_grammar_new(void) {
    loom_json_schema_t *s = loom_calloc(1, sizeof *s);
    fixed_nodes(s);
    return s;
}

loom_status loom_json_grammar_schema(loom_json_schema_t *s, const char *schema, const char *where, int *node) {
    return compile_into(s, schema, where, node);
}

int loom_json_grammar_literal(loom_json_schema_t *s, const char *text) {
    int n = add_node(s, N_LITERAL);
    if (n >= 0) add_lit(&s->nodes[n], text);
    return n;
}

int loom_json_grammar_seq(loom_json_schema_t *s, const int *parts, int n) {
    int me = add_node(s, N_SEQ);
    for (int i = 0; me >= 0 && i < n; i++) add_child(&s->nodes[me], parts[i]), s->nodes[me].n++;
    return me;
}

int loom_json_grammar_switch(loom_json_schema_t *s, const char *const *lits, const int *next, int n) {
    int me = n > 0 && n <= MAX_LITS ? add_node(s, N_SWITCH) : -1;
    for (int i = 0; me >= 0 && i < n; i++) {
        add_child(&s->nodes[me], next[i]);
        add_lit(&s->nodes[me], lits[i]); /* counts n */
    }
    node_t *nd = me >= 0 ? &s->nodes[me] : NULL;
    for (int a = 0; nd && a < n; a++) /* one literal a prefix of another: the choice would be ambiguous */
        for (int b = 0; b < n; b++)
            if (a != b && !strncmp(nd->lit[a], nd->lit[b], (size_t)nd->lit_len[a])) return -1;
    return me;
}

int loom_json_grammar_array(loom_json_schema_t *s, int items, int min, int max) {
    int me = add_node(s, N_ARRAY);
    if (me >= 0) s->nodes[me].items = items, s->nodes[me].min = min, s->nodes[me].max = max;
    return me;
}

loom_status loom_json_grammar_finish(loom_json_schema_t *s, int top) {
    if (top < 0) return loom_error(LOOM_EINVAL, "json_schema: the grammar has too many nodes (at most %d)", MAX_NODES);
    LOOM_TRY(check_alternatives(s));
    s->nodes[ANY].items = top; /* the compiled top: node 0's stand-in */
    return LOOM_OK;
}

void loom_json_schema_free(loom_json_schema_t *s) {
    if (!s) return;
    for (int n = 0; n < s->n_nodes; n++) {
        node_t *nd = &s->nodes[n];
        if (nd->lit)
            for (int i = 0; i < nd->n; i++) free(nd->lit[i]);
        free(nd->lit), free(nd->lit_len), free(nd->child);
    }
    free(s->nodes);
    free(s);
}

/* ---- matching ---- */

enum { REJECT, TAKEN, POPPED }; /* a frame's answer to a byte: refused, consumed, or complete without it */

void loom_json_match_init(loom_json_match_t *m, const loom_json_schema_t *s) {
    memset(m, 0, sizeof *m - sizeof m->f);
    m->s = s;
    m->depth = 1;
    int top = s->nodes[ANY].items; /* the compiled top; 0 (ANY) for json_object: an object */
    m->f[0] = (loom_json_frame_t){.node = top == ANY ? OBJ_FREE : top};
}

static int push(loom_json_match_t *m, int node) {
    if (m->depth == LOOM_JSON_MAX_DEPTH) return 0;
    m->f[m->depth++] = (loom_json_frame_t){.node = node};
    return 1;
}

/* Literal candidates (in f->mask) that go on with c at f->pos; sets
 * *complete when one of them ends there. */
static int literal_step(const node_t *nd, loom_json_frame_t *f, unsigned char c, int *complete) {
    uint64_t keep = 0;
    *complete = -1;
    for (int i = 0; i < nd->n; i++) {
        if (!(f->mask >> i & 1) || f->pos >= nd->lit_len[i] || (unsigned char)nd->lit[i][f->pos] != c) continue;
        keep |= 1ull << i;
        if (nd->lit_len[i] == f->pos + 1) *complete = i;
    }
    f->mask = keep;
    f->pos++;
    return keep != 0;
}

static int string_step(const node_t *nd, loom_json_frame_t *f, unsigned char c) {
    switch (f->phase) {
    case 0: return c == '"' ? (f->phase = 1, TAKEN) : REJECT;
    case 1:
        if (c == '"') return f->count >= nd->min ? POPPED + 1 : REJECT; /* POPPED + 1: complete, consumed */
        if (c < 0x20 || f->count >= nd->max) return REJECT;
        f->count++;
        if (c == '\\') return f->phase = 2, TAKEN;
        if (c < 0x80) return TAKEN;
        if (c < 0xC2 || c > 0xF4) return REJECT;
        f->pos = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        /* the first continuation's range: no overlong forms, no surrogates, nothing above U+10FFFF
         * (the server would replace such bytes with U+FFFD, changing the string) */
        f->mask = c == 0xE0 ? 0xA0 | 0xBF << 8 : c == 0xED ? 0x80 | 0x9F << 8 : c == 0xF0 ? 0x90 | 0xBF << 8
                : c == 0xF4 ? 0x80 | 0x8F << 8 : 0x80 | 0xBF << 8;
        return f->phase = 4, TAKEN;
    case 2:
        if (c == 'u') return f->phase = 3, f->pos = 4, TAKEN;
        return strchr("\"\\/bfnrt", c) && c ? (f->phase = 1, TAKEN) : REJECT;
    case 3:
        if (!strchr("0123456789abcdefABCDEF", c) || !c) return REJECT;
        if (--f->pos == 0) f->phase = 1;
        return TAKEN;
    default:
        if (c < (f->mask & 0xFF) || c > (f->mask >> 8 & 0xFF)) return REJECT;
        f->mask = 0x80 | 0xBF << 8;
        if (--f->pos == 0) f->phase = 1;
        return TAKEN;
    }
}

/* Numbers: phases 0 start, 1 after '-', 2 integer digits, 3 after a leading
 * 0, 4 after '.', 5 fraction digits, 6 after 'e', 7 after the exponent's
 * sign, 8 exponent digits. Ends (POPPED) on a byte it cannot take. */
static int number_step(const node_t *nd, loom_json_frame_t *f, unsigned char c) {
    /* '.' and 'e' need a digit after them: only while one is left (no dead end) */
    int digit = c >= '0' && c <= '9', real = nd->kind != N_INTEGER && f->count < MAX_DIGITS;
    if (digit && ++f->count > MAX_DIGITS) return REJECT;
    switch (f->phase) {
    case 0: if (c == '-') return f->phase = 1, TAKEN; /* fall through */
    case 1: return !digit ? REJECT : (f->phase = c == '0' ? 3 : 2, TAKEN);
    case 2: if (digit) return TAKEN; /* fall through */
    case 3:
        if (real && c == '.') return f->phase = 4, TAKEN;
        if (real && (c == 'e' || c == 'E')) return f->phase = 6, TAKEN;
        return POPPED;
    case 4: return digit ? (f->phase = 5, TAKEN) : REJECT;
    case 5:
        if (digit) return TAKEN;
        return real && (c == 'e' || c == 'E') ? (f->phase = 6, TAKEN) : POPPED;
    case 6: if (c == '+' || c == '-') return f->phase = 7, TAKEN; /* fall through */
    case 7: return digit ? (f->phase = 8, TAKEN) : REJECT;
    default: return digit ? TAKEN : POPPED;
    }
}

/* The candidates for the next key of a schema object: properties from the
 * next one on, up to and including the first required one. */
static uint64_t key_candidates(const node_t *nd, int from) {
    uint64_t m = 0;
    for (int j = from; j < nd->n; j++) {
        m |= 1ull << j;
        if (nd->required >> j & 1) break;
    }
    return m;
}

static int required_left(const node_t *nd, int from) { return from < 64 && (nd->required >> from) != 0; }

/* Objects: 0 '{', 1 after '{', 2 after a value, 3 after ',', 4 in a key
 * (schema objects), 5 after a key, 6 after ':' (the value comes). */
static int object_step(loom_json_match_t *m, const node_t *nd, loom_json_frame_t *f, unsigned char c) {
    int free_keys = nd->kind == N_OBJ_FREE;
    switch (f->phase) {
    case 0: return c == '{' ? (f->phase = 1, TAKEN) : REJECT;
    case 1: case 3:
        if (f->phase == 1 && c == '}') return free_keys || !required_left(nd, f->count) ? POPPED + 1 : REJECT;
        if (free_keys) return push(m, STR_FREE) ? -1 : REJECT; /* -1: feed c to the new top */
        f->mask = key_candidates(nd, f->count), f->pos = 0, f->phase = 4; /* fall through */
    case 4: {
        int done;
        if (!literal_step(nd, f, c, &done)) return REJECT;
        if (done >= 0) f->phase = 5, f->pos = done, f->count = done + 1;
        return TAKEN;
    }
    case 5: return c == ':' ? (f->phase = 6, TAKEN) : REJECT;
    case 6: return push(m, free_keys ? ANY : nd->child[f->pos]) ? -1 : REJECT;
    default:
        if (c == '}') return free_keys || !required_left(nd, f->count) ? POPPED + 1 : REJECT;
        return c == ',' && (free_keys || f->count < nd->n) ? (f->phase = 3, TAKEN) : REJECT;
    }
}

/* Arrays: 0 '[', 1 after '[', 2 after an item, 3 after ','. */
static int array_step(loom_json_match_t *m, const node_t *nd, loom_json_frame_t *f, unsigned char c) {
    switch (f->phase) {
    case 0: return c == '[' ? (f->phase = 1, TAKEN) : REJECT;
    case 1:
        if (c == ']') return nd->min == 0 ? POPPED + 1 : REJECT;
        /* fall through */
    case 3: return f->count < nd->max && push(m, nd->items) ? -1 : REJECT;
    default:
        if (c == ']') return f->count >= nd->min ? POPPED + 1 : REJECT;
        return c == ',' && f->count < nd->max ? (f->phase = 3, TAKEN) : REJECT;
    }
}

/* A value of the ANY node or an anyOf: becomes the node its first byte picks. */
static int pick_node(const loom_json_schema_t *s, int n, unsigned char c) {
    const node_t *nd = &s->nodes[n];
    if (nd->kind == N_ANY)
        return c == '{' ? OBJ_FREE : c == '[' ? ARR_FREE : c == '"' ? STR_FREE : c == '-' || (c >= '0' && c <= '9') ? NUM_FREE
             : c == 't' || c == 'f' || c == 'n' ? LIT_FREE : -1;
    for (int i = 0; i < nd->n; i++) {
        uint64_t f[4] = {0};
        first_bytes(s, nd->child[i], f, 0);
        if (f[c / 64] >> (c % 64) & 1) return nd->child[i];
    }
    return -1;
}

/* One byte to the top frame: REJECT, TAKEN, POPPED (complete, byte not
 * taken), POPPED + 1 (complete with it), or -1 (a child was pushed: feed it). */
static int frame_step(loom_json_match_t *m, unsigned char c) {
    loom_json_frame_t *f = &m->f[m->depth - 1];
    const loom_json_schema_t *s = m->s;
    while (s->nodes[f->node].kind == N_ANY || s->nodes[f->node].kind == N_ANYOF) {
        if ((f->node = pick_node(s, f->node, c)) < 0) return REJECT;
    }
    const node_t *nd = &s->nodes[f->node];
    switch (nd->kind) {
    case N_STRING: return string_step(nd, f, c);
    case N_INTEGER: case N_NUMBER: return number_step(nd, f, c);
    case N_LITERAL: {
        if (f->phase == 0) f->mask = nd->n >= 64 ? ~0ull : (1ull << nd->n) - 1, f->phase = 1;
        int done;
        if (!literal_step(nd, f, c, &done)) return REJECT;
        return done >= 0 ? POPPED + 1 : TAKEN;
    }
    case N_ARRAY: return array_step(m, nd, f, c);
    case N_SEQ: /* the next part takes c; none left: complete without it */
        return f->count < nd->n ? (push(m, nd->child[f->count++]) ? -1 : REJECT) : POPPED;
    case N_SWITCH: {
        if (f->phase == 0) f->mask = nd->n >= 64 ? ~0ull : (1ull << nd->n) - 1, f->phase = 1;
        int done;
        if (!literal_step(nd, f, c, &done)) return REJECT;
        if (done >= 0) *f = (loom_json_frame_t){.node = nd->child[done]}; /* the frame becomes what the literal leads to */
        return TAKEN;
    }
    default: return object_step(m, nd, f, c);
    }
}

/* The parent of a value that just completed moves past it. */
static void child_done(loom_json_match_t *m) {
    if (m->depth == 0) {
        m->done = 1;
        return;
    }
    loom_json_frame_t *f = &m->f[m->depth - 1];
    const node_t *nd = &m->s->nodes[f->node];
    if (nd->kind == N_SEQ) {
        if (f->count < nd->n) return;
        m->depth--; /* its last part: the sequence is complete now, not at the next byte */
        child_done(m);
        return;
    }
    if (nd->kind == N_ARRAY) f->count++, f->phase = 2;
    else if (f->phase == 1 || f->phase == 3) f->phase = 5; /* a free object's key */
    else f->phase = 2;
}

int loom_json_match_byte(loom_json_match_t *m, unsigned char c) {
    for (int guard = 0; guard < 2 * LOOM_JSON_MAX_DEPTH + 2; guard++) {
        if (m->done || m->depth == 0) return 0;
        int r = frame_step(m, c);
        if (r == REJECT) return 0;
        if (r == TAKEN) return 1;
        if (r == -1) continue; /* a child frame was pushed: it takes c */
        m->depth--;
        child_done(m);
        if (r == POPPED + 1) return 1;
    }
    return 0;
}

int loom_json_match_bytes(loom_json_match_t *m, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!loom_json_match_byte(m, b[i])) return 0;
    return n > 0;
}

int loom_json_match_done(const loom_json_match_t *m) { return m->done; }

/* ---- the token filter ---- */

typedef struct {
    loom_token_filter_t f;
    const loom_json_schema_t *s;
    int V;
    const unsigned char **bytes; /* (V) each token's bytes (NULL: never allowed) */
    size_t *len;                 /* (V) */
    int *by_first;               /* token ids grouped by first byte: group b is [start[b], start[b+1]) */
    unsigned char *plain;        /* (V) 1: every byte is printable ASCII other than '"' and '\\' (plain string text) */
    int start[257];
} json_filter_t;

static void *filter_begin(const loom_token_filter_t *f) {
    const json_filter_t *jf = (const json_filter_t *)f;
    loom_json_match_t *m = loom_malloc(sizeof *m + sizeof jf);
    loom_json_match_init(m, jf->s);
    memcpy(m + 1, &jf, sizeof jf); /* the state knows its filter */
    return m;
}

static const json_filter_t *filter_of(void *st) {
    const json_filter_t *jf;
    memcpy(&jf, (loom_json_match_t *)st + 1, sizeof jf);
    return jf;
}

/* Copy the part of a matcher in use (the frames below its depth). */
static void match_copy(loom_json_match_t *dst, const loom_json_match_t *src) {
    memcpy(dst, src, offsetof(loom_json_match_t, f) + (size_t)src->depth * sizeof src->f[0]);
}

static int filter_allowed(void *st, int tok) {
    const json_filter_t *jf = filter_of(st);
    if (tok < 0 || tok >= jf->V || !jf->bytes[tok]) return 0;
    loom_json_match_t m;
    match_copy(&m, st);
    return loom_json_match_bytes(&m, jf->bytes[tok], jf->len[tok]);
}

/* Inside a string (not in an escape or a character) with room for k more
 * characters: how many, else -1. A plain token then fits iff it is not longer. */
static int string_room(const loom_json_match_t *m) {
    if (m->depth == 0 || m->done) return -1;
    const loom_json_frame_t *f = &m->f[m->depth - 1];
    const node_t *nd = &m->s->nodes[f->node];
    return nd->kind == N_STRING && f->phase == 1 ? nd->max - f->count : -1;
}

static int filter_mask(void *st, float *logits, int V) {
    const json_filter_t *jf = filter_of(st);
    int left = 0, room = string_room(st);
    for (int t = jf->V; t < V; t++) logits[t] = -INFINITY;
    for (int b = 0; b < 256; b++) {
        loom_json_match_t first;
        match_copy(&first, st);
        int ok = loom_json_match_byte(&first, (unsigned char)b);
        for (int i = jf->start[b]; i < jf->start[b + 1]; i++) {
            int t = jf->by_first[i];
            if (room >= 0 && jf->plain[t]) { /* most tokens inside a string: no walk needed */
                if ((size_t)room >= jf->len[t]) left++;
                else logits[t] = -INFINITY;
                continue;
            }
            loom_json_match_t m;
            if (ok) match_copy(&m, &first);
            if (ok && loom_json_match_bytes(&m, jf->bytes[t] + 1, jf->len[t] - 1) | (jf->len[t] == 1)) left++;
            else logits[t] = -INFINITY;
        }
    }
    for (int t = 0; t < jf->V && t < V; t++)
        if (!jf->bytes[t]) logits[t] = -INFINITY;
    return left;
}

static int filter_accept(void *st, int tok) {
    const json_filter_t *jf = filter_of(st);
    if (tok >= 0 && tok < jf->V && jf->bytes[tok]) loom_json_match_bytes(st, jf->bytes[tok], jf->len[tok]);
    return loom_json_match_done(st);
}

static void filter_end(void *st) { free(st); }

loom_status loom_json_filter_new(const loom_json_schema_t *s, const loom_tokenizer_t *tok, int V, loom_token_filter_t **out) {
    json_filter_t *jf = loom_calloc(1, sizeof *jf);
    jf->f = (loom_token_filter_t){filter_begin, filter_allowed, filter_mask, filter_accept, filter_end};
    jf->s = s, jf->V = V;
    jf->bytes = loom_calloc((size_t)V, sizeof *jf->bytes);
    jf->len = loom_calloc((size_t)V, sizeof *jf->len);
    jf->by_first = loom_calloc((size_t)V, sizeof *jf->by_first);
    jf->plain = loom_calloc((size_t)V, 1);
    int count[257] = {0};
    char *special = loom_calloc((size_t)V, 1); /* specials are control, not text the output may hold */
    for (int i = 0; i < loom_tokenizer_nspecial(tok); i++) {
        uint32_t id;
        loom_tokenizer_special(tok, i, &id);
        if ((int)id < V) special[id] = 1;
    }
    if (loom_tokenizer_eot(tok) >= 0 && loom_tokenizer_eot(tok) < V) special[loom_tokenizer_eot(tok)] = 1;
    for (int t = 0; t < V; t++) {
        size_t n = 0;
        const unsigned char *b = loom_tokenizer_token(tok, (uint32_t)t, &n);
        if (!b || n == 0 || special[t] || loom_tokenizer_is_control(tok, (uint32_t)t)) continue;
        jf->bytes[t] = b, jf->len[t] = n;
        jf->plain[t] = 1;
        for (size_t i = 0; i < n; i++) jf->plain[t] &= b[i] >= 0x20 && b[i] < 0x7F && b[i] != '"' && b[i] != '\\';
        count[b[0] + 1]++;
    }
    for (int b = 0; b < 256; b++) jf->start[b + 1] = jf->start[b] + count[b + 1];
    int fill[256];
    memcpy(fill, jf->start, sizeof fill);
    for (int t = 0; t < V; t++)
        if (jf->bytes[t]) jf->by_first[fill[jf->bytes[t][0]]++] = t;
    free(special);
    *out = &jf->f;
    return LOOM_OK;
}

void loom_json_filter_allow(loom_token_filter_t *f, const loom_tokenizer_t *tok, const char *text) {
    json_filter_t *jf = (json_filter_t *)f;
    int id = loom_tokenizer_find(tok, text);
    if (id < 0 || id >= jf->V || jf->bytes[id]) return;
    size_t n = 0;
    const unsigned char *b = loom_tokenizer_token(tok, (uint32_t)id, &n);
    if (!b || n == 0) return;
    /* into its first byte's group: the group's end moves up one, every later group shifts */
    int at = jf->start[b[0] + 1];
    memmove(&jf->by_first[at + 1], &jf->by_first[at], (size_t)(jf->start[256] - at) * sizeof(int));
    jf->by_first[at] = id;
    for (int g = b[0] + 1; g <= 256; g++) jf->start[g]++;
    jf->bytes[id] = b, jf->len[id] = n;
}

void loom_json_filter_free(loom_token_filter_t *f) {
    json_filter_t *jf = (json_filter_t *)f;
    if (!jf) return;
    free(jf->bytes), free(jf->len), free(jf->by_first), free(jf->plain);
    free(jf);
}
