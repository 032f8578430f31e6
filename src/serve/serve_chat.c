/* serve_chat: a served model's chat template. A template with Jinja tags
 * ({{ or {%) is the model's own (tokenizer_config.json, GGUF metadata, or
 * --chat-template), rendered by src/data/chat_template.h as transformers
 * renders it; the model then also stops at the template's end-of-turn
 * token (<|eot_id|>, <|im_end|>, ...). Every model stops at the tokenizer's
 * end-of-text and EOS tokens. Any other template text is the
 * fixed "{role}"/"{content}" form of loom_api_render_chat. A template that
 * renders tools gets the request's `tools` as transformers passes them;
 * any other gets loom's fallback (serve/tools.h). */
#include <stdlib.h>
#include <string.h>

#include "serve/server_int.h"

/* Add id to the model's stop ids once (ids < 0 are none). */
static void add_stop(srv_model_t *sm, int id) {
    if (id < 0 || sm->n_stop == (int)(sizeof sm->stop_ids / sizeof sm->stop_ids[0])) return;
    for (int i = 0; i < sm->n_stop; i++)
        if (sm->stop_ids[i] == id) return;
    sm->stop_ids[sm->n_stop++] = id;
}

loom_status loom_srv_chat_setup(srv_model_t *sm, const char *name, const char *tmpl) {
    sm->n_stop = 0;
    sm->tools = loom_tools_style(NULL);
    add_stop(sm, sm->eot);
    add_stop(sm, loom_tokenizer_eos(sm->tok));
    if (!tmpl) return LOOM_OK;
    if (!strstr(tmpl, "{{") && !strstr(tmpl, "{%")) {
        sm->chat_template = loom_strdup(tmpl);
        return LOOM_OK;
    }
    char origin[160];
    snprintf(origin, sizeof origin, "model %s: chat template", name);
    LOOM_TRY(loom_chat_template_parse(&sm->tmpl, origin, tmpl));
    sm->tools = loom_tools_style(tmpl);
    const char *eot = loom_chat_template_end_of_turn(sm->tmpl);
    add_stop(sm, eot ? loom_tokenizer_find(sm->tok, eot) : -1);
    return LOOM_OK;
}

void loom_srv_chat_free(srv_model_t *sm) {
    free(sm->chat_template);
    loom_chat_template_free(sm->tmpl);
    sm->chat_template = NULL;
    sm->tmpl = NULL;
}

/* The text of a token for the template's bos_token / eos_token (NULL: none). */
static char *token_text(const loom_tokenizer_t *tok, int id) {
    size_t n = 0;
    const unsigned char *b = id >= 0 ? loom_tokenizer_token(tok, (uint32_t)id, &n) : NULL;
    if (!b) return NULL;
    char *s = loom_malloc(n + 1);
    memcpy(s, b, n);
    s[n] = 0;
    return s;
}

/* The fixed form over the messages as JSON (content null: empty). */
static char *render_fixed(const srv_model_t *sm, const cJSON *msgs) {
    int n = cJSON_GetArraySize(msgs), i = 0;
    loom_api_message_t *m = loom_calloc((size_t)n + 1, sizeof *m);
    for (const cJSON *x = msgs->child; x; x = x->next, i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        m[i].role = cJSON_GetObjectItemCaseSensitive(x, "role")->valuestring;
        m[i].content = cJSON_IsString(c) ? c->valuestring : "";
    }
    char *out = loom_api_render_chat(m, n, sm->chat_template);
    free(m);
    return out;
}

loom_status loom_srv_chat_render(const srv_model_t *sm, const loom_api_request_t *a, char **out) {
    cJSON *arr = cJSON_Duplicate(a->messages, 1);
    if (!sm->tools.native) loom_tools_fallback(arr, a->tools);
    if (!sm->tmpl) {
        *out = render_fixed(sm, arr);
        cJSON_Delete(arr);
        return LOOM_OK;
    }
    char *bos = token_text(sm->tok, loom_tokenizer_bos(sm->tok)), *eos = token_text(sm->tok, loom_tokenizer_eos(sm->tok));
    loom_chat_vars_t v = {.messages = arr, .tools = sm->tools.native ? a->tools : NULL, .bos_token = bos, .eos_token = eos,
                          .add_generation_prompt = 1};
    loom_status s = loom_chat_template_render(sm->tmpl, &v, out);
    cJSON_Delete(arr);
    free(bos);
    free(eos);
    return s;
}
