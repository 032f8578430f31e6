/* Tool calling's pure parts (serve/tools.h) against known answers: the
 * style chosen from a template's text; the forced-call grammar accepting
 * a valid call of each format byte by byte and refusing wrong names,
 * wrong arguments and text around the call; outputs read back into
 * content and tool_calls for each format (calls, text before them,
 * malformed calls left as text, parallel_tool_calls false); and a stream's
 * deltas, fed the output cut at every byte, reassembled equal to the one
 * final delta (what the non-streamed answer is made of). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "obs/sbuf.h"
#include "serve/tools.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":8},\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\",\"unit\"],"
    "\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"no parameters\"}}]";

static const loom_tools_style_t HERMES = {LOOM_TOOLS_HERMES, 1, 0}, LLAMA = {LOOM_TOOLS_LLAMA, 1, 0},
                                MISTRAL = {LOOM_TOOLS_MISTRAL, 1, 1};

static void test_style(void) {
    loom_tools_style_t s = loom_tools_style("{% for m in messages %}{{ m.content }}{% endfor %}");
    CHECK(s.fmt == LOOM_TOOLS_HERMES && !s.native, "a template without tools: the fallback");
    CHECK(!loom_tools_style(NULL).native, "no template: the fallback");
    s = loom_tools_style("{% if tools %}<tool_call>{% endif %}");
    CHECK(s.fmt == LOOM_TOOLS_HERMES && s.native, "Qwen2.5 / Hermes");
    s = loom_tools_style("{%- if tools is not none %}{\"name\": function name, \"parameters\": ...}{% endif %}");
    CHECK(s.fmt == LOOM_TOOLS_LLAMA && s.native, "Llama 3.1");
    s = loom_tools_style("{% if tools %}[AVAILABLE_TOOLS]{% endif %}{{ \"[TOOL_CALLS] [\" }}");
    CHECK(s.fmt == LOOM_TOOLS_MISTRAL && s.native && s.space_after, "Mistral v0.3");
    s = loom_tools_style("{% if tools %}{{ \"[TOOL_CALLS][\" }}{% endif %}");
    CHECK(s.fmt == LOOM_TOOLS_MISTRAL && !s.space_after, "Mistral Nemo");
}

static loom_json_schema_t *grammar(loom_tools_style_t st, loom_tool_choice choice, const char *name, int parallel) {
    loom_api_request_t r = {.tools = cJSON_Parse(TOOLS), .tool_choice = choice, .parallel_tool_calls = parallel};
    snprintf(r.tool_name, sizeof r.tool_name, "%s", name ? name : "");
    loom_json_schema_t *g = NULL;
    loom_api_error_t err;
    CHECK(loom_tools_grammar(&r, st, &g, &err) == LOOM_OK, "%s", err.message);
    cJSON_Delete(r.tools);
    return g;
}

static int accepts(const loom_json_schema_t *g, const char *doc) {
    loom_json_match_t m;
    loom_json_match_init(&m, g);
    return loom_json_match_bytes(&m, (const unsigned char *)doc, strlen(doc)) && loom_json_match_done(&m);
}

static void test_grammar(void) {
    loom_json_schema_t *g = grammar(HERMES, LOOM_TOOL_REQUIRED, NULL, 1);
    CHECK(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>"), "hermes");
    CHECK(accepts(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>"), "no parameters: {}");
    CHECK(!accepts(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"x\":1}}\n</tool_call>"), "no parameters: nothing else");
    CHECK(!accepts(g, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"), "unknown name");
    CHECK(!accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"k\"}}\n</tool_call>"), "enum");
    CHECK(!accepts(g, "Sure! <tool_call>"), "text before the call");
    loom_json_schema_free(g);
    g = grammar(HERMES, LOOM_TOOL_NAMED, "get", 1);
    CHECK(!accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"a\",\"unit\":\"c\"}}\n</tool_call>"), "named: another function");
    CHECK(accepts(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>"), "named");
    loom_json_schema_free(g);
    g = grammar(LLAMA, LOOM_TOOL_REQUIRED, NULL, 1);
    CHECK(accepts(g, "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"x\",\"unit\":\"f\"}}"), "llama");
    loom_json_schema_free(g);
    g = grammar(MISTRAL, LOOM_TOOL_REQUIRED, NULL, 1);
    CHECK(accepts(g, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {}},{\"name\": \"get\", \"arguments\": {}}]"), "mistral, parallel");
    loom_json_schema_free(g);
    g = grammar(MISTRAL, LOOM_TOOL_REQUIRED, NULL, 0);
    CHECK(!accepts(g, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {}},{\"name\": \"get\", \"arguments\": {}}]"), "mistral, one call");
    CHECK(accepts(g, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {}}]"), "mistral");
    loom_json_schema_free(g);
    loom_api_request_t r = {.tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                                                 "\"properties\":{\"d\":{\"type\":\"string\",\"pattern\":\"x+\"}}}}}]"),
                            .tool_choice = LOOM_TOOL_AUTO};
    loom_api_error_t err;
    CHECK(loom_tools_grammar(&r, HERMES, NULL, &err) != LOOM_OK && strstr(err.message, "pattern") && strstr(err.message, "tools[0]"),
          "an unsupported construct is refused by name: %s", err.message);
    cJSON_Delete(r.tools);
}

/* The one final delta of text as a message: content (or "<null>") and the calls as "name(args);". */
static void read_back(loom_tools_style_t st, int forced, int parallel, const char *text, char *content, char *calls) {
    loom_tools_stream_t s = {.seed = 7};
    cJSON *d = loom_tools_delta(st, forced, parallel, text, strlen(text), 1, &s), *msg = cJSON_CreateObject();
    loom_tools_message_out(d, msg);
    const cJSON *c = cJSON_GetObjectItem(msg, "content");
    snprintf(content, 256, "%s", cJSON_IsString(c) ? c->valuestring : "<null>");
    calls[0] = 0;
    const cJSON *tc;
    cJSON_ArrayForEach(tc, cJSON_GetObjectItem(msg, "tool_calls")) {
        const cJSON *f = cJSON_GetObjectItem(tc, "function");
        snprintf(calls + strlen(calls), 256 - strlen(calls), "%s(%s);", cJSON_GetObjectItem(f, "name")->valuestring,
                 cJSON_GetObjectItem(f, "arguments")->valuestring);
    }
    cJSON_Delete(d), cJSON_Delete(msg);
}

static void test_read_back(void) {
    static const struct {
        loom_tools_style_t st;
        int forced, parallel;
        const char *text, *content, *calls;
    } cases[] = {
        {HERMES, 0, 1, "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"a\": [1, \"}\"]}}\n</tool_call>", "Let me look.\n",
         "get({\"a\": [1, \"}\"]});"},
        {HERMES, 0, 1, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"arguments\":{\"x\":1},\"name\":\"b\"}</tool_call>",
         "<null>", "a({});b({\"x\":1});"},
        {HERMES, 0, 0, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"arguments\":{\"x\":1},\"name\":\"b\"}</tool_call>",
         "<null>", "a({});"},
        {HERMES, 0, 1, "just text, no call", "just text, no call", ""},
        {HERMES, 0, 1, "<tool_call>{\"name\": \"a\", \"arguments\": {oops}}</tool_call>",
         "<tool_call>{\"name\": \"a\", \"arguments\": {oops}}</tool_call>", ""},
        {HERMES, 0, 1, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\":", "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\":", ""},
        {HERMES, 1, 1, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\":\"ab", "<null>", "a({\"x\":\"ab);"},
        {HERMES, 0, 1, "no close <tool_c", "no close <tool_c", ""},
        {LLAMA, 0, 1, " {\"name\": \"get\", \"parameters\": {\"q\": \"x\"}}", "<null>", "get({\"q\": \"x\"});"},
        {LLAMA, 0, 1, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}", "<null>", "a({});b({});"},
        {LLAMA, 0, 1, "{\"answer\": 42}", "{\"answer\": 42}", ""},
        {LLAMA, 0, 1, "The answer is 42.", "The answer is 42.", ""},
        {MISTRAL, 0, 1, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", "<null>",
         "a({\"k\": 1});b({});"},
        {MISTRAL, 0, 1, "Hm. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]", "Hm. ", "a({});"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char content[256], calls[256];
        read_back(cases[i].st, cases[i].forced, cases[i].parallel, cases[i].text, content, calls);
        CHECK(!strcmp(content, cases[i].content) && !strcmp(calls, cases[i].calls), "case %zu %s: content %s calls %s", i,
              cases[i].text, content, calls);
    }
}

/* Every delta of text fed a byte at a time, merged: content, calls, the ids and heads in order. */
static void merge_stream(loom_tools_style_t st, int forced, const char *text, char *content, char *calls) {
    loom_tools_stream_t s = {.seed = 7};
    loom_sbuf_t c = {0}, args[LOOM_TOOLS_MAX_CALLS] = {{0}};
    char names[LOOM_TOOLS_MAX_CALLS][64] = {{0}};
    int n = 0, bad = 0;
    size_t len = strlen(text);
    for (size_t k = 0; k <= len; k++) {
        cJSON *d = loom_tools_delta(st, forced, 1, text, k, k == len, &s);
        if (!d) continue;
        const cJSON *ct = cJSON_GetObjectItem(d, "content"), *tc;
        if (ct) loom_sbuf_puts(&c, ct->valuestring);
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(d, "tool_calls")) {
            int i = cJSON_GetObjectItem(tc, "index")->valueint;
            const cJSON *f = cJSON_GetObjectItem(tc, "function"), *name = cJSON_GetObjectItem(f, "name");
            if (name) bad |= i != n || !cJSON_GetObjectItem(tc, "id") || strcmp(cJSON_GetObjectItem(f, "arguments")->valuestring, ""), n++;
            else bad |= i >= n || cJSON_GetObjectItem(tc, "id") != NULL;
            if (name) snprintf(names[i], sizeof names[i], "%s", name->valuestring);
            if (!name) loom_sbuf_puts(&args[i], cJSON_GetObjectItem(f, "arguments")->valuestring);
        }
        cJSON_Delete(d);
    }
    snprintf(content, 256, "%s", c.len ? c.data : "<null>");
    calls[0] = 0;
    for (int i = 0; i < n; i++) snprintf(calls + strlen(calls), 256 - strlen(calls), "%s(%s);", names[i], args[i].data ? args[i].data : "");
    if (bad) snprintf(calls, 256, "a head out of order, or a later delta with an id");
    free(c.data);
    for (int i = 0; i < LOOM_TOOLS_MAX_CALLS; i++) free(args[i].data);
}

static void test_stream_equals_whole(void) {
    static const struct {
        loom_tools_style_t st;
        int forced;
        const char *text;
    } cases[] = {
        {HERMES, 0, "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"a\": [1, \"}\"]}}\n</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>"},
        {HERMES, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"P\xc3\xa9ris\",\"unit\":\"c\"}}\n</tool_call>"},
        {HERMES, 0, "<tool_call>{\"name\": \"a\", \"arguments\": {oops}} and more"},
        {HERMES, 0, "plain text with < and <tool in it"},
        {LLAMA, 0, "{\"name\": \"get\", \"parameters\": {\"q\": \"x\"}}"},
        {LLAMA, 1, "{\"name\": \"get\", \"parameters\": {\"q\": \"x\"}}"},
        {LLAMA, 0, "{\"answer\": 42}"},
        {MISTRAL, 1, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": 1}},{\"name\": \"b\", \"arguments\": {}}]"},
        {MISTRAL, 0, "Hm. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}] trailing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char c1[256], k1[256], c2[256], k2[256];
        read_back(cases[i].st, cases[i].forced, 1, cases[i].text, c1, k1);
        merge_stream(cases[i].st, cases[i].forced, cases[i].text, c2, k2);
        CHECK(!strcmp(c1, c2) && !strcmp(k1, k2), "case %zu: whole content %s calls %s; stream content %s calls %s", i, c1, k1, c2, k2);
    }
}

static void test_fallback(void) {
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                              "[{\"id\":\"abc\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":{\"q\":1}}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"abc\",\"content\":\"42\"}]");
    cJSON *tools = cJSON_Parse(TOOLS);
    loom_tools_fallback(msgs, tools);
    const cJSON *m0 = cJSON_GetArrayItem(msgs, 0), *m2 = cJSON_GetArrayItem(msgs, 2), *m3 = cJSON_GetArrayItem(msgs, 3);
    CHECK(!strcmp(cJSON_GetObjectItem(m0, "role")->valuestring, "system") &&
          strstr(cJSON_GetObjectItem(m0, "content")->valuestring, "\"name\":\"get_weather\""), "a system message describes the tools");
    CHECK(!strcmp(cJSON_GetObjectItem(m2, "content")->valuestring,
                  "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"q\":1}}\n</tool_call>") && !cJSON_GetObjectItem(m2, "tool_calls"),
          "the call as text: %s", cJSON_GetObjectItem(m2, "content")->valuestring);
    CHECK(!strcmp(cJSON_GetObjectItem(m3, "content")->valuestring, "<tool_response>\n42\n</tool_response>"), "the result wrapped");
    cJSON_Delete(msgs), cJSON_Delete(tools);
}

int main(void) {
    RUN(test_style);
    RUN(test_grammar);
    RUN(test_read_back);
    RUN(test_stream_equals_whole);
    RUN(test_fallback);
    return check_main_end();
}
