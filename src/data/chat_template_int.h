/* chat_template_int: the parsed form of a chat template, shared by the
 * parser (chat_template.c) and the renderer (chat_eval.c); private to
 * src/data. */
#ifndef LOOM_CHAT_TEMPLATE_INT_H
#define LOOM_CHAT_TEMPLATE_INT_H

#include <stddef.h>

#include "chat_template.h"

/* Node kinds: statements (S_*) and expressions (E_*). */
enum {
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE,
    E_LIT_STR, E_LIT_INT, E_LIT_FLOAT, E_LIT_BOOL, E_LIT_NONE, E_LIST, E_DICT,
    E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NOT, E_NEG, E_AND, E_OR, E_BIN, E_CMP, E_COND,
};

/* Binary operators (E_BIN, E_CMP: `op`). */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node node_t;
struct node {
    int kind, op;
    int negate;          /* E_TEST: "is not" */
    node_t *a, *b, *c;   /* operands; statements: a = expression, b = body, c = else body */
    node_t *d;           /* S_FOR: the if filter; E_SLICE: the step (unsupported, NULL) */
    node_t **args;       /* E_CALL, E_FILTER, E_TEST, E_LIST, E_DICT (keys and values alternate) */
    const char **kw;     /* keyword names of args (NULL entries: positional) */
    int nargs;
    const char *name;    /* names, attributes, filters, tests, methods; S_TEXT and E_LIT_STR: the text */
    size_t len;          /* length of name (S_TEXT, E_LIT_STR may hold NULs) */
    const char *name2;   /* S_FOR: the second target; S_SET: the attribute of a namespace */
    long long ival;
    double fval;
    node_t *next;        /* the next statement */
    int line;            /* where it starts, for messages */
};

struct loom_chat_template {
    char *origin;
    node_t *body;
    const char *end_of_turn;
    void **blocks;       /* everything allocated for the tree */
    size_t nblocks, capblocks;
};

/* Python's str.isspace() for the character at s (left bytes); *n gets its
 * length in bytes. */
int loom_chat_py_space(const unsigned char *s, size_t left, int *n);

/* The first error of a parse or a render: *err becomes `code` with
 * "origin: line N: message"; once set, later errors leave it. Returns *err. */
loom_status loom_chat_fail(loom_status *err, loom_status code, const char *origin, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Allocate n bytes (zeroed) owned by the template. */
void *loom_chat_alloc(loom_chat_template_t *t, size_t n);

#endif
