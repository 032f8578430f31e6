/* Chat templates (src/data/chat_template.h) against Python jinja2 set up as
 * transformers sets it up (tests/chat_template_oracle.py): the published
 * templates of Llama 3, Llama 3.1 (with tools), Qwen2 (ChatML), Mistral
 * Instruct (v0.1 / v0.3, and the later one with a system prompt), SmolLM2,
 * and one that uses the rest of the subset, render several conversations
 * (system message or not, multi-turn, generation prompt, broken
 * alternation) byte for byte as jinja2 does, or fail where it fails; each
 * unsupported construct is refused at parse time naming it; malformed
 * templates (cut and mutated published ones) give errors, never crashes,
 * and those loom renders, jinja2 renders alike. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/chat_template.h"

static char python[256];
static int have_oracle;

/* ---- the published templates (texts as their tokenizer_config.json holds them) ---- */

static const char LLAMA3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char LLAMA31[] =
    "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n"
    "{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n"
    "{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n"
    "{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- endif %}\n                {%- endfor %}\n"
    "            {{- \")\" }}\n        {%- else  %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n            {{- \"}\" }}\n        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n            {#- This means we're in ipython mode #}\n            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n            {{- \"<|eot_id|>\" }}\n        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n"
    "        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n";

static const char QWEN2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char MISTRAL[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
    "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' "
    "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

static const char MISTRAL_SYSTEM[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n"
    "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n"
    "    {%- endif %}\n{%- endfor %}\n";

static const char SMOLLM2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI "
    "assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* Not published: the rest of the subset, with jinja2's whitespace rules in
 * the layouts templates use. */
static const char KITCHEN[] =
    "{# a comment #}\n{%- set ns = namespace(n=0, last='') -%}\n"
    "  {% for m in messages %}\n    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
    "    {% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}\n"
    "[{{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ m.role | upper }}{{ '*' if loop.last else '' }}]"
    " {{ m['content'].strip().replace('o', '0')[:12] ~ '|' ~ m.content|length }}\n"
    "    {% if 'stop' in m.content %}{% break %}{% endif %}\n  {% endfor %}\n"
    "{{ ns.n }} {{ ns.last }} {{ (messages | selectattr('role', 'equalto', 'user') | list | length) * 2 - 1 }} {{ 7 // 2 }} {{ -7 % 3 }}"
    " {{ 2 ** 10 }} {{ 1 / 4 }} {{ 1 < 2 < 3 }} {{ none }} {{ true and 'x' }} {{ undefined_thing | default('dflt') }}\n"
    "{{ messages | map(attribute='role') | join(', ') }} {{ {'b': [1, 2.5, none, true], 'a': 'é\"\\n'} | tojson }}\n"
    "{{ {'k': {'x': [1, {'y': 'z'}]}, 'e': [], 'o': {}} | tojson(indent=2) }}\n"
    "{%- for k, v in {'one': 1, 'two': 2}.items() if v > 1 %} {{ k }}={{ v }}{% else %} none{% endfor %}\n"
    "{{ 'a,b,,c'.split(',') }} {{ '  x  y '.split() }} {{ 'Hello World'.lower().startswith('hello') }} {{ 'hello world'.title() }}"
    " {{ 'hELLO' | capitalize }} {{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }} {{ range(3) | list }} {{ 'abc'[-1] }} {{ [1, 2, 3][1:] }}"
    " {{ messages[0].missing is defined }} {{ (messages | length) is even }} {{ 'x' is string }} {{ 1.5 is number }}"
    " {{ 'ab' * 3 }} {{ '\\u00e9\\x41\\t' | trim }}|{{ ' \u3000 pad \u3000' | trim }}|\n"
    "{%+ if add_generation_prompt %}  <gen>\n{% endif %}\n  {%- if false %}never{% elif messages %}has messages{% endif +%}\n"
    "    {{ 'end' }}";

static const struct {
    const char *name, *text;
} TEMPLATES[] = {{"llama3", LLAMA3}, {"llama3.1", LLAMA31}, {"qwen2", QWEN2}, {"mistral", MISTRAL},
                 {"mistral-system", MISTRAL_SYSTEM}, {"smollm2", SMOLLM2}, {"kitchen", KITCHEN}};
#define NTEMPLATES (int)(sizeof TEMPLATES / sizeof TEMPLATES[0])

/* Conversations: system or not, one turn or several, ending with the
 * assistant, broken alternation, whitespace and non-ASCII at the edges, a
 * tool call and its result. */
static const char *const CHATS[] = {
    "[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Hello!\"}]",
    "[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]",
    "[{\"role\":\"system\",\"content\":\"  Be kind.\\n\"},{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello, how can I help?\"},"
    "{\"role\":\"user\",\"content\":\" Tell me a joke about cats and dogs, please. \"}]",
    "[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"assistant\",\"content\":\"two\"},{\"role\":\"user\",\"content\":\"three stop\"},"
    "{\"role\":\"assistant\",\"content\":\"four\"}]",
    "[{\"role\":\"user\",\"content\":\"first\"},{\"role\":\"user\",\"content\":\"second\"}]",
    "[{\"role\":\"user\",\"content\":\"\\u00c9t\\u00e9 \\u65e5\\u672c 🙂 \\t\\n\"},{\"role\":\"assistant\",\"content\":\"\"}]",
    "[{\"role\":\"system\",\"content\":\"Use tools.\"},{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}}]},"
    "{\"role\":\"tool\",\"content\":{\"temp\":21.5,\"sky\":\"clear\"}},{\"role\":\"user\",\"content\":\"Thanks\"}]",
};
#define NCHATS (int)(sizeof CHATS / sizeof CHATS[0])

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather now, in a city.\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}}}]";

/* Render every job with loom and with jinja2, compare. */
static void compare_jobs(cJSON *jobs) {
    const char *jp = check_tmp_path("jobs.json"), *op = check_tmp_path("out.json");
    cJSON *jb;
    cJSON_ArrayForEach(jb, jobs) if (!cJSON_GetObjectItem(jb, "bos_token")) { /* both sides get the tokens loom renders with */
        cJSON_AddStringToObject(jb, "bos_token", "<s>");
        cJSON_AddStringToObject(jb, "eos_token", "</s>");
    }
    char *text = cJSON_PrintUnformatted(jobs);
    loom_file_write_atomic(jp, text, strlen(text));
    free(text);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tests/chat_template_oracle.py %s %s", python, jp, op);
    if (system(cmd) != 0) return check_fail_why("the jinja2 oracle failed: %s", cmd);
    char *out;
    size_t len;
    if (loom_file_read(op, &out, &len) != LOOM_OK) return check_fail_why("the oracle wrote no results");
    cJSON *res = cJSON_Parse(out);
    free(out);
    int i = 0, same = 0, total = cJSON_GetArraySize(jobs);
    const cJSON *job;
    cJSON_ArrayForEach(job, jobs) {
        const cJSON *r = cJSON_GetArrayItem(res, i++), *want = cJSON_GetObjectItem(r, "text");
        loom_chat_template_t *t = NULL;
        char *got = NULL;
        loom_status st = loom_chat_template_parse(&t, "template", cJSON_GetObjectItem(job, "template")->valuestring);
        loom_chat_vars_t v = {.messages = cJSON_GetObjectItem(job, "messages"), .tools = cJSON_GetObjectItem(job, "tools"),
                              .bos_token = "<s>", .eos_token = "</s>",
                              .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(job, "add_generation_prompt"))};
        if (st == LOOM_OK) st = loom_chat_template_render(t, &v, &got);
        int ok = want ? (st == LOOM_OK && !strcmp(got, want->valuestring)) : st != LOOM_OK;
        same += ok;
        CHECK(ok, "job %d (%s, chat %d, generation prompt %d):\n  loom:   %s\n  jinja2: %s", i - 1,
              cJSON_GetObjectItem(job, "name")->valuestring, cJSON_GetObjectItem(job, "chat")->valueint, v.add_generation_prompt,
              st == LOOM_OK ? got : loom_errmsg(), want ? want->valuestring : cJSON_GetObjectItem(r, "error")->valuestring);
        free(got);
        loom_chat_template_free(t);
    }
    printf("  %d of %d renderings equal jinja2's\n", same, total);
    cJSON_Delete(res);
}

static void published_templates(void) {
    if (!have_oracle) return check_skip("jinja2 is not importable by %s (scripts/deps.sh installs python3-jinja2)", python);
    cJSON *jobs = cJSON_CreateArray();
    for (int t = 0; t < NTEMPLATES; t++)
        for (int c = 0; c < NCHATS; c++)
            for (int g = 0; g < 2; g++)
                for (int tools = 0; tools < 1 + (strstr(TEMPLATES[t].name, "3.1") != NULL); tools++) {
                    cJSON *j = cJSON_CreateObject();
                    cJSON_AddStringToObject(j, "name", TEMPLATES[t].name);
                    cJSON_AddNumberToObject(j, "chat", c);
                    cJSON_AddStringToObject(j, "template", TEMPLATES[t].text);
                    cJSON_AddItemToObject(j, "messages", cJSON_Parse(CHATS[c]));
                    if (tools) cJSON_AddItemToObject(j, "tools", cJSON_Parse(TOOLS));
                    cJSON_AddStringToObject(j, "bos_token", "<s>");
                    cJSON_AddStringToObject(j, "eos_token", "</s>");
                    cJSON_AddBoolToObject(j, "add_generation_prompt", g);
                    cJSON_AddItemToArray(jobs, j);
                }
    compare_jobs(jobs);
    cJSON_Delete(jobs);
}

/* Whitespace control and literal corner cases, each its own small template. */
static void whitespace_rules(void) {
    if (!have_oracle) return check_skip("jinja2 is not importable by %s", python);
    static const char *const cases[] = {
        "a\n  {% if true %}\n  b\n  {% endif %}\nc", "a {%- if true -%} b {%- endif -%} c", "  {{ 'x' }}  \n  {# c #}\ny",
        "{% for i in [1,2] %}\n{{ i }}\n{% endfor %}\n", "{%+ if true %}x{% endif +%}\n  y", "\t {% if true %}\t x\n{% endif %}",
        "{{ '\\'q\\'' }}{{ \"\\\"d\\\"\" }}{{ 'a\\\\b' }}{{ '\\u263a\\U0001F600\\x41\\z' }}", "{% for c in 'héllo' %}{{ c }}.{% endfor %}",
        "{{ [1, 'a', none, true, 2.50, {'k': [1]}] }} {{ 1e-5 }} {{ 100000.0 }} {{ 1e16 }} {{ 0.1 + 0.2 }}",
        "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "{{ messages[5].content }}",
        "{{ (1, 2) }}{{ 'abc' ~ 1 ~ none }}{{ 'ab' in 'cabd' }}{{ 3 not in [1, 2] }}", "{{ 'a' + 1 }}", "{{ x.y }}",
        "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{% endfor %}", "x\r\n{% if true %}\r\ny{% endif %}",
        "{{ 'Ab' < 'a' }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 1 == 1.0 }} {{ true == 1 }}",
    };
    cJSON *jobs = cJSON_CreateArray();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", "case");
        cJSON_AddNumberToObject(j, "chat", (double)k);
        cJSON_AddStringToObject(j, "template", cases[k]);
        cJSON_AddItemToObject(j, "messages", cJSON_Parse(CHATS[2]));
        cJSON_AddBoolToObject(j, "add_generation_prompt", 1);
        cJSON_AddItemToArray(jobs, j);
    }
    compare_jobs(jobs);
    cJSON_Delete(jobs);
}

/* Each construct outside the subset is refused when parsed, by name. */
static void unsupported_refused(void) {
    static const char *const cases[][2] = {
        {"{% macro f() %}x{% endmacro %}", "macro"}, {"{% include 'other.jinja' %}", "include"},
        {"{% extends 'base' %}", "extends"}, {"{% import 'm' as m %}", "import"}, {"{% raw %}{{ x }}{% endraw %}", "raw"},
        {"{% filter upper %}x{% endfilter %}", "filter"}, {"{% call f() %}x{% endcall %}", "call"},
        {"{% with a = 1 %}{{ a }}{% endwith %}", "with"}, {"{% set x %}block{% endset %}", "block form"},
        {"{{ x | wordcount }}", "wordcount"}, {"{{ x is divisibleby 3 }}", "divisibleby"}, {"{{ cycler(1, 2) }}", "cycler"},
        {"{{ s.format(1) }}", "format"}, {"{{ x[1:5:2] }}", "step"}, {"{% for a, b, c in x %}{% endfor %}", "two loop variables"},
        {"{% for x in y recursive %}{% endfor %}", "recursive"}, {"{% set a, b = 1, 2 %}", "several targets"},
        {"{% break %}", "outside a for loop"}, {"{% generation %}x{% endgeneration %}", "generation"},
        {"{{ lipsum() }}", "lipsum"}, {"{{ x | indent(4) }}", "indent"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        loom_chat_template_t *t = NULL;
        loom_status s = loom_chat_template_parse(&t, "tmpl.jinja", cases[k][0]);
        CHECK(s != LOOM_OK && strstr(loom_errmsg(), cases[k][1]) && strstr(loom_errmsg(), "tmpl.jinja: line 1"),
              "\"%s\": %s", cases[k][0], s == LOOM_OK ? "accepted" : loom_errmsg());
        loom_chat_template_free(t);
    }
}

/* The published templates cut short and mutated at random: parsing and
 * rendering must end with an error or a text, never a crash (the
 * sanitizer build runs this too). */
static void malformed_never_crash(void) {
    unsigned seed = 12345;
    const char noise[] = "{}%#-+|()[]'\".,:~=!<>*/ \n\\abcxyz0123456789";
    cJSON *msgs = cJSON_Parse(CHATS[6]), *tools = cJSON_Parse(TOOLS);
    int parsed = 0, rendered = 0, runs = 0;
    cJSON *jobs = cJSON_CreateArray();
    for (int t = 0; t < NTEMPLATES; t++) {
        size_t n = strlen(TEMPLATES[t].text);
        char *buf = loom_malloc(n + 64);
        for (int r = 0; r < 150; r++, runs++) {
            memcpy(buf, TEMPLATES[t].text, n + 1);
            seed = seed * 1103515245u + 12345u;
            if (r % 3 == 0) {
                buf[(seed >> 8) % (n + 1)] = 0; /* cut */
            } else {
                for (int k = 0; k < 1 + (int)((seed >> 20) % 4); k++) { /* overwrite a few characters */
                    seed = seed * 1103515245u + 12345u;
                    buf[(seed >> 8) % n] = noise[(seed >> 16) % (sizeof noise - 1)];
                }
            }
            loom_chat_template_t *tp = NULL;
            char *out = NULL;
            if (loom_chat_template_parse(&tp, "fuzz", buf) != LOOM_OK) continue;
            parsed++;
            loom_chat_vars_t v = {.messages = msgs, .tools = tools, .bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = 1};
            if (loom_chat_template_render(tp, &v, &out) == LOOM_OK) { /* what loom renders, jinja2 must render alike */
                rendered++;
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "name", "mutated");
                cJSON_AddNumberToObject(j, "chat", runs);
                cJSON_AddStringToObject(j, "template", buf);
                cJSON_AddItemToObject(j, "messages", cJSON_Duplicate(msgs, 1));
                cJSON_AddItemToObject(j, "tools", cJSON_Duplicate(tools, 1));
                cJSON_AddBoolToObject(j, "add_generation_prompt", 1);
                cJSON_AddItemToArray(jobs, j);
            }
            free(out);
            loom_chat_template_free(tp);
        }
        free(buf);
    }
    /* random text from the template alphabet, and nesting past any stack */
    for (int r = 0; r < 400; r++) {
        char junk[256];
        seed = seed * 1103515245u + 12345u;
        int len = (int)((seed >> 8) % 255);
        for (int k = 0; k < len; k++) {
            seed = seed * 1103515245u + 12345u;
            junk[k] = noise[(seed >> 16) % (sizeof noise - 1)];
        }
        junk[len] = 0;
        loom_chat_template_t *tp = NULL;
        char *out = NULL;
        loom_chat_vars_t v = {.messages = msgs, .add_generation_prompt = 1};
        if (loom_chat_template_parse(&tp, "junk", junk) == LOOM_OK) loom_chat_template_render(tp, &v, &out);
        free(out);
        loom_chat_template_free(tp);
    }
    const char *deep[][5] = {{"{{ ", "(", "1", ")", " }}"}, {"{{ ", "[", "1", "]", " }}"}, {"{{ ", "not ", "1", "", " }}"},
                             {"{{ ", "- ", "1", "", " }}"}, {"", "{% if 1 %}", "x", "{% endif %}", ""},
                             {"", "{% for x in [1] %}", "x", "{% endfor %}", ""}};
    for (int k = 0; k < 6; k++) { /* 100000 levels, opened and closed */
        size_t n = 100000 * (strlen(deep[k][1]) + strlen(deep[k][3])) + 64, o = 0;
        char *b = loom_malloc(n);
        o += (size_t)sprintf(b + o, "%s", deep[k][0]);
        for (int i = 0; i < 100000; i++) o += (size_t)sprintf(b + o, "%s", deep[k][1]);
        o += (size_t)sprintf(b + o, "%s", deep[k][2]);
        for (int i = 0; i < 100000; i++) o += (size_t)sprintf(b + o, "%s", deep[k][3]);
        sprintf(b + o, "%s", deep[k][4]);
        loom_chat_template_t *tp = NULL;
        CHECK(loom_chat_template_parse(&tp, "deep", b) != LOOM_OK && strstr(loom_errmsg(), "nest"), "100000 levels of \"%s\": %s",
              deep[k][1], tp ? "parsed" : loom_errmsg());
        loom_chat_template_free(tp);
        free(b);
    }
    printf("  %d mutated templates: %d parsed, %d rendered, the rest refused with an error\n", runs, parsed, rendered);
    CHECK(parsed > 0 && parsed < runs, "the mutations should both break and keep some templates (%d of %d parsed)", parsed, runs);
    if (have_oracle && !getenv("LOOM_SANITIZED")) compare_jobs(jobs);
    cJSON_Delete(jobs);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
}

static void end_of_turn(void) {
    const char *want[] = {"<|eot_id|>", "<|eot_id|>", "<|im_end|>", NULL, NULL, "<|im_end|>"};
    for (int t = 0; t < 6; t++) {
        loom_chat_template_t *tp = NULL;
        CHECK(loom_chat_template_parse(&tp, TEMPLATES[t].name, TEMPLATES[t].text) == LOOM_OK, "%s: %s", TEMPLATES[t].name, loom_errmsg());
        if (!tp) continue;
        const char *e = loom_chat_template_end_of_turn(tp);
        CHECK((!e && !want[t]) || (e && want[t] && !strcmp(e, want[t])), "%s: end of turn %s", TEMPLATES[t].name, e ? e : "(none)");
        loom_chat_template_free(tp);
    }
}

int main(void) {
    check_tmpdir("chat-template");
    loom_log_quiet(1);
    snprintf(python, sizeof python, "%s", getenv("LOOM_PYTHON") ? getenv("LOOM_PYTHON") : "/usr/bin/python3");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s -c 'import jinja2' 2>/dev/null", python);
    have_oracle = system(cmd) == 0;
    RUN(published_templates);
    RUN(whitespace_rules);
    RUN(unsupported_refused);
    RUN(malformed_never_crash);
    RUN(end_of_turn);
    return check_main_end();
}
