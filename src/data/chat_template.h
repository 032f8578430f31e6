/* chat_template: the subset of Jinja that published chat templates use
 * (tokenizer_config.json's "chat_template", GGUF's tokenizer.chat_template),
 * rendered as Hugging Face transformers renders it: jinja2 with
 * trim_blocks and lstrip_blocks, the loop controls, raise_exception, and
 * its tojson (json.dumps without sorting or ASCII escaping).
 *
 * Supported: text, {{ }}, {% %}, {# #}, whitespace control (-), if / elif /
 * else, for (over lists, dicts, strings; "a, b" targets; an if filter;
 * else), loop.index / index0 / first / last / length / revindex /
 * revindex0, set (names and namespace attributes), break, continue;
 * literals (strings with escapes, numbers, true / false / none, lists,
 * dicts), + - * / // % ** ~, comparisons, in / not in, and / or / not,
 * a if c else b, x[i], x[a:b], x.attr; tests defined, undefined, none,
 * string, number, integer, float, boolean, mapping, iterable, sequence,
 * true, false, equalto, eq, even, odd; filters trim, length, count,
 * tojson, join, list, first, last, upper, lower, title, capitalize,
 * default, string, int, items, select, reject, selectattr, rejectattr, map
 * (attribute), replace, safe; the string methods strip, lstrip, rstrip,
 * startswith, endswith, split, upper, lower, title, capitalize, replace;
 * the dict methods items, keys, values, get; the globals raise_exception,
 * namespace, range.
 *
 * Anything else (macros, includes, other filters, tests and methods) is
 * refused when the template is parsed, with the construct named: a
 * template loom cannot render is never rendered wrong. Errors at render
 * time (raise_exception, adding a string to a number) are errors too. */
#ifndef LOOM_CHAT_TEMPLATE_H
#define LOOM_CHAT_TEMPLATE_H

#include <cjson/cJSON.h>

#include "../core/core.h"

typedef struct loom_chat_template loom_chat_template_t;

/* Parse `text` (`origin` names it in messages: a file, or a GGUF key).
 * Refuses a construct outside the subset above, naming it and where. */
loom_status loom_chat_template_parse(loom_chat_template_t **out, const char *origin, const char *text);
void loom_chat_template_free(loom_chat_template_t *t);

/* What a template sees. messages is a JSON array of {"role", "content", ...}
 * as in an OpenAI request (tool calls and all); tools a JSON array or NULL
 * (then `tools` is undefined, as transformers leaves it); extra an object
 * of more variables or NULL. */
typedef struct {
    const cJSON *messages;
    const cJSON *tools;
    const char *bos_token, *eos_token; /* NULL: undefined */
    int add_generation_prompt;
    const cJSON *extra;
} loom_chat_vars_t;

/* Render; *out is malloc'd and NUL-terminated. raise_exception("m")
 * becomes an error whose message holds m. */
loom_status loom_chat_template_render(const loom_chat_template_t *t, const loom_chat_vars_t *v, char **out);

/* The end-of-turn token a chat model stops at: the first of <|eot_id|>,
 * <|im_end|>, <|end|>, <end_of_turn> that the template text holds, else
 * NULL (then the tokenizer's EOS ends a turn, e.g. Mistral's </s>). */
const char *loom_chat_template_end_of_turn(const loom_chat_template_t *t);

#endif
