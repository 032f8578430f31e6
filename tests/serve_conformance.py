"""The OpenAI API's details as clients meet them (issue 30, item 1), on a
running `loom serve` (the openai part of tests/serve_client.py calls run()).
Each case names the rule of the OpenAI API reference it checks; the shapes
of every answer are checked apart, by tests/openai_check.py."""
import json


def run(srv, cl, openai, report, request):
    key = {"Authorization": "Bearer sekret", "Content-Type": "application/json"}

    def post(body, path="/v1/completions"):
        st, h, data = request(srv, "POST", path, body, key)
        return st, h, json.loads(data) if data else None

    models(srv, cl, openai, report, request, key)
    logprobs(cl, report)
    chat_inputs(cl, openai, report, post)
    limits(srv, cl, report, post, request, key)


def models(srv, cl, openai, report, request, key):
    m = cl.models.retrieve("second")
    report("serve_models_retrieve", m.id == "second" and m.object == "model", m)
    try:
        cl.models.retrieve("nope")
        report("serve_models_retrieve_unknown", False, "accepted")
    except openai.NotFoundError as e:
        report("serve_models_retrieve_unknown", e.body.get("code") == "model_not_found", e)
    st, h, _ = request(srv, "GET", "/v1/models", None, key)
    report("serve_no_cors_by_default", st == 200 and "Access-Control-Allow-Origin" not in h, h)


def logprobs(cl, report):
    """The sampled token is among its own alternatives; chat entries carry
    their bytes; a stream's text_offset counts the text before each token."""
    r = cl.completions.create(model="run", prompt="the", max_tokens=12, temperature=1.0, n=4, seed=5, logprobs=2)
    miss = [(c.index, i) for c in r.choices for i, (t, top) in
            enumerate(zip(c.logprobs.tokens, c.logprobs.top_logprobs)) if t not in top]
    report("serve_logprobs_sampled_in_top", not miss and len(r.choices) == 4, miss[:5])
    ch = cl.chat.completions.create(model="run", messages=[{"role": "user", "content": "the dog"}], max_tokens=12,
                                    temperature=1.0, n=3, seed=5, logprobs=True, top_logprobs=2)
    bad = []
    for c in ch.choices:
        for e in c.logprobs.content:
            if e.token not in [t.token for t in e.top_logprobs]:
                bad.append(("not in top", e.token))
            text = bytes(e.bytes).decode("utf-8", "replace")
            if "\ufffd" not in text and text != e.token:
                bad.append(("bytes", e.token, e.bytes))
    report("serve_chat_logprobs_bytes_and_top", not bad and all(c.message.refusal is None for c in ch.choices), bad[:5])
    kw = dict(model="run", prompt="the cat", max_tokens=10, temperature=0, logprobs=1)
    full = cl.completions.create(**kw).choices[0].logprobs
    offs, toks = [], []
    for c in cl.completions.create(stream=True, **kw):
        if c.choices and c.choices[0].logprobs:
            offs += c.choices[0].logprobs.text_offset
            toks += c.choices[0].logprobs.tokens
    want = [sum(len(t) for t in full.tokens[:i]) for i in range(len(full.tokens))]
    report("serve_stream_text_offset", offs == full.text_offset == want and toks == full.tokens,
           "stream %s, full %s, want %s" % (offs, full.text_offset, want))


def chat_inputs(cl, openai, report, post):
    """Content as a list of text parts; an assistant turn with tool_calls and
    no content; a role OpenAI does not know."""
    greedy = dict(model="run", max_tokens=8, temperature=0)
    a = cl.chat.completions.create(messages=[{"role": "user", "content": "the dog sat"}], **greedy)
    b = cl.chat.completions.create(messages=[{"role": "user", "content": [{"type": "text", "text": "the dog"},
                                                                            {"type": "text", "text": " sat"}]}], **greedy)
    report("serve_chat_content_parts", a.choices[0].message.content == b.choices[0].message.content, (a, b))
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    st, _, j = post(dict(greedy, messages=msgs), "/v1/chat/completions")
    report("serve_chat_assistant_null_content", st == 200, (st, j))
    st, _, j = post(dict(greedy, messages=[{"role": "robot", "content": "hi"}]), "/v1/chat/completions")
    report("serve_chat_unknown_role", st == 400 and j["error"]["code"] == "invalid_value", (st, j))
    st, _, j = post(dict(greedy, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
                    "/v1/chat/completions")
    report("serve_chat_image_part_refused", st == 400 and "image_url" in j["error"]["message"], (st, j))
    st, _, j = post(dict(greedy, messages=[{"role": "user", "content": "hi"}], response_format={"type": "xml"}),
                    "/v1/chat/completions")
    report("serve_response_format_unknown", st == 400 and j["error"]["param"] == "response_format.type", (st, j))


def limits(srv, cl, report, post, request, key):
    """The context refuses what does not fit; max_tokens 0 with echo; the
    error codes OpenAI names; 413 in the OpenAI shape."""
    ctx = cl.models.retrieve("run").model_extra.get("max_model_len")
    st, _, j = post({"model": "run", "prompt": "the cat", "max_tokens": ctx})
    report("serve_prompt_plus_max_tokens_refused", st == 400 and j["error"]["code"] == "context_length_exceeded", (st, j))
    st, _, j = post({"model": "run", "prompt": "the cat", "max_tokens": 0, "echo": True, "logprobs": 1})
    c = j["choices"][0] if st == 200 else {}
    report("serve_max_tokens_0_echo", st == 200 and c["text"] == "the cat" and c["finish_reason"] == "length"
           and j["usage"]["completion_tokens"] == 0, (st, j))
    chunks = list(cl.completions.create(model="run", prompt="the cat", max_tokens=0, echo=True, stream=True))
    report("serve_max_tokens_0_echo_stream", "".join(x.choices[0].text for x in chunks if x.choices) == "the cat" and
           [x.choices[0].finish_reason for x in chunks if x.choices][-1] == "length", chunks)
    cases = [({"model": "run"}, "missing_required_parameter", "prompt"),
             ({"prompt": "a", "max_tokens": 0}, "integer_below_min_value", "max_tokens"),
             ({"prompt": "a", "max_tokens": -3}, "integer_below_min_value", "max_tokens"),
             ({"prompt": "a", "max_tokens": "9"}, "invalid_type", "max_tokens"),
             ({"prompt": "a", "temperature": 7e2}, "decimal_above_max_value", "temperature"),
             ({"prompt": "a", "stream": "yes"}, "invalid_type", "stream")]
    bad = []
    for body, code, param in cases:
        st, _, j = post(body)
        if st != 400 or j["error"]["code"] != code or j["error"]["param"] != param:
            bad.append((body, st, j))
    report("serve_error_codes_named", not bad, bad[:3])
    st, h, data = request(srv, "POST", "/v1/completions", b"{" + b" " * (17 << 20) + b"}", key)
    report("serve_413_openai_shape", st == 413 and h.get("Content-Type", "").startswith("application/json")
           and "error" in json.loads(data), (st, data[:200]))
