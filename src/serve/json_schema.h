/* json_schema: structured outputs by constrained decoding (docs/serving.md,
 * "Structured outputs"). A JSON schema (the subset below) is compiled into
 * a table of nodes; a matcher walks them as a pushdown automaton over
 * bytes (a stack of frames, one per open value), so "is this byte a valid
 * continuation" is a small step and "which tokens may come next" is the
 * bytes of each token fed to a copy of the matcher. The engine asks
 * through loom_token_filter_t (serve/engine.h).
 *
 * The output is compact JSON (no whitespace) whose every accepted prefix
 * can still be completed into a value valid under the schema, and the
 * output ends when the top-level object closes. What it supports: type
 * (object, array, string, integer, number, boolean, null, or a list of
 * them), properties (in schema order; each required one present), required,
 * additionalProperties (outputs never add properties, so any value is
 * honoured), items, minItems, maxItems, minLength, maxLength, enum, const,
 * anyOf / oneOf whose alternatives start with different bytes (a string or
 * null, an object or an array, ...), $ref into $defs / definitions
 * (recursion included), and the annotations (title, description, default,
 * examples, $schema, $id, $comment). Anything else (pattern, format,
 * minimum, maximum, multipleOf, allOf, not, if, patternProperties,
 * prefixItems, uniqueItems true, anyOf alternatives that start alike) is
 * refused with its name and where it is: never ignored. */
#ifndef LOOM_JSON_SCHEMA_H
#define LOOM_JSON_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "serve/engine.h"

#define LOOM_JSON_MAX_DEPTH 32 /* nested values at most (deeper output is refused byte by byte) */

typedef struct loom_json_schema loom_json_schema_t;

/* One open value: the node, where in it the output is, and counters. */
typedef struct {
    int node;
    int phase;
    int count;     /* characters of a string, items of an array, next property of an object, digits */
    int pos;       /* bytes of a literal or key matched; the chosen property once a key is complete */
    uint64_t mask; /* literal or key candidates still matching */
} loom_json_frame_t;

/* A matcher's whole state: plain data, copied to try bytes. */
typedef struct {
    const loom_json_schema_t *s;
    int depth, done;
    loom_json_frame_t f[LOOM_JSON_MAX_DEPTH];
} loom_json_match_t;

/* Compile a schema (JSON text; NULL: any JSON object, for response_format
 * json_object). LOOM_EINVAL with a message naming the construct and its
 * place ("'pattern' at properties.name is not supported ...") otherwise. */
loom_status loom_json_schema_compile(const char *schema, loom_json_schema_t **out);
void loom_json_schema_free(loom_json_schema_t *s);

/* Grammars around schemas (tool calls, serve/tools.c): literal text,
 * compiled schemas, sequences, a choice among literals each leading to its
 * own continuation, arrays. Each returns a node (-1: the table is full, or
 * a switch whose literals are prefixes of each other); finish checks the
 * whole and makes `top` what a matcher starts with. */
loom_json_schema_t *loom_json_grammar_new(void);
/* Compile schema text (its top an object) into s; `where` names it in errors ("tools[0].function.parameters"). */
loom_status loom_json_grammar_schema(loom_json_schema_t *s, const char *schema, const char *where, int *node);
int loom_json_grammar_literal(loom_json_schema_t *s, const char *text);
int loom_json_grammar_seq(loom_json_schema_t *s, const int *parts, int n);
int loom_json_grammar_switch(loom_json_schema_t *s, const char *const *lits, const int *next, int n);
int loom_json_grammar_array(loom_json_schema_t *s, int items, int min, int max);
loom_status loom_json_grammar_finish(loom_json_schema_t *s, int top);

/* Start matching a top-level value of schema s. */
void loom_json_match_init(loom_json_match_t *m, const loom_json_schema_t *s);
/* Feed one byte: 1 when the output so far is still a valid prefix (m
 * advanced), 0 when not (m is then undefined: feed copies). */
int loom_json_match_byte(loom_json_match_t *m, unsigned char c);
/* Feed n bytes (0 on the first refused one). */
int loom_json_match_bytes(loom_json_match_t *m, const unsigned char *b, size_t n);
/* 1 when the top-level value is complete (nothing more may follow). */
int loom_json_match_done(const loom_json_match_t *m);

/* A token filter for the engine: tokens of `tok` (ids below V) allowed by
 * schema s (which must outlive it). The per-tokenizer work (each token's
 * bytes, grouped by first byte) is done here once. */
loom_status loom_json_filter_new(const loom_json_schema_t *s, const loom_tokenizer_t *tok, int V,
                                 loom_token_filter_t **out);
/* Let the filter use the special token whose text is `text` (a tool-call
 * marker such as <tool_call>, which the model writes as one token) like
 * any other token of those bytes. No-op when the tokenizer has none. */
void loom_json_filter_allow(loom_token_filter_t *f, const loom_tokenizer_t *tok, const char *text);
void loom_json_filter_free(loom_token_filter_t *f);

#endif
