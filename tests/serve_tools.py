"""Tool calling through `loom serve` (issue 30, item 3), for the published
templates of Qwen2.5 (Hermes <tool_call>), Llama 3.1 (JSON) and Mistral
Nemo ([TOOL_CALLS]), and loom's fallback for a template without tools:

- the prompt rendered with tools and a whole tool round trip (an assistant
  turn with tool_calls, a tool result) equals jinja2's rendering of the same
  template with the same tools (arguments as objects, as transformers
  expects), checked as greedy output equal to /v1/completions on jinja2's
  text, and prompt_tokens equal;
- tool_choice required and named through the official openai client: the
  call parses, its name is a tool's, its arguments validate against the
  function's schema with jsonschema, finish_reason is tool_calls; the call
  fed back with a role tool result gives an answer;
- a streamed forced call reassembled equals the non-streamed one (greedy),
  and its deltas have OpenAI's shape (head with id, type, name and empty
  arguments, then argument fragments);
- parallel_tool_calls false gives one call;
- a schema construct loom cannot enforce is refused 400 naming it;
- langchain-openai's bind_tools with tool_choice forcing a call.

The model (a barely trained byte-level gpt2-tiny with a 4096 context) never
chooses tools by itself: every call here is the constrained decoder's.
tests/serve_client.py's part "tools" runs it."""
import json, os, subprocess, sys

import jsonschema

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"},
                                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
       "required": ["a", "b", "tags"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now, in a city.", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add numbers.", "parameters": ADD}}]
SCHEMA = {"get_weather": WEATHER, "add": ADD}
HERE = os.path.dirname(os.path.abspath(__file__))


def templates():
    """(name, template text) of the published templates this test uses, from the llama.cpp source tree."""
    d = os.path.join(os.environ.get("LOOM_LLAMA_DIR", "/work/cache/llama.cpp"), "src", "models", "templates")
    out = []
    for name, f in (("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"), ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
                    ("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja")):
        p = os.path.join(d, f)
        if os.path.exists(p):
            out.append((name, open(p).read()))
    return out


def jinja_render(text, messages, tools):
    sys.path.insert(0, HERE)
    import chat_template_oracle, jinja2.ext, jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = chat_template_oracle.tojson
    env.globals["raise_exception"] = chat_template_oracle.raise_exception
    # the test tokenizer's EOS (its end-of-text token) and no BOS, as loom serve passes them
    return chat_template_oracle.render(env, {"template": text, "messages": messages, "tools": tools, "add_generation_prompt": True,
                                             "eos_token": "<|endoftext|>"})


def history(call_id):
    """A finished round trip: the user asks, the assistant calls, the tool answers."""
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "21 C, clear"}]


def check_call(c, choice_name=None):
    """None when tool call c is well formed (a known name, arguments valid under its schema), else why."""
    name = c.function.name
    if name not in SCHEMA or (choice_name and name != choice_name):
        return "name %r" % name
    try:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA[name])
    except (ValueError, jsonschema.ValidationError) as e:
        return "arguments %r: %s" % (c.function.arguments, str(e)[:100])
    return None


def forced(cl, report, tag, msgs):
    """Sampled at temperature 1: every call valid. Mistral's format is an array: with parallel_tool_calls (the
    default) it may hold several calls; the others hold one."""
    bad = []
    for seed, (choice, want) in enumerate((("required", None), ({"type": "function", "function": {"name": "add"}}, "add"),
                                           ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"))):
        r = cl.chat.completions.create(model="run", messages=msgs, tools=TOOLS, tool_choice=choice, temperature=1.0,
                                       seed=seed, max_tokens=300)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        why = [check_call(c, want) for c in calls]
        if ch.finish_reason != "tool_calls" or not calls or (len(calls) > 1 and tag != "mistral-nemo") or any(why):
            bad.append((choice, seed, ch.finish_reason, why, ch.message))
    report("serve_tools_%s_forced_calls_valid" % tag, not bad, bad[:2])
    return r


def stream_equal(cl, report, tag, msgs):
    kw = dict(model="run", messages=msgs, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=300)
    whole = cl.chat.completions.create(**kw).choices[0]
    chunks = list(cl.chat.completions.create(stream=True, **kw))
    calls, shape_bad, fin = {}, [], None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        fin = ch.choices[0].finish_reason or fin
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                if not (tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""):
                    shape_bad.append(tc)
                calls[tc.index] = [tc.function.name, ""]
            else:
                if tc.id or tc.function.name:
                    shape_bad.append(tc)
                calls[tc.index][1] += tc.function.arguments or ""
    got = [tuple(calls[i]) for i in sorted(calls)]
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    report("serve_tools_%s_stream_equals_whole" % tag, got == want and not shape_bad and fin == whole.finish_reason == "tool_calls",
           "stream %s (%s), whole %s (%s); bad deltas %s" % (got, fin, want, whole.finish_reason, shape_bad[:2]))


def round_trip(cl, report, tag, msgs, r):
    """The call the server made, fed back with a tool result: an answer."""
    call = r.choices[0].message.tool_calls[0]
    cid = call.id
    back = msgs + [{"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {
        "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": cid, "content": "42"}]
    a = cl.chat.completions.create(model="run", messages=back, tools=TOOLS, temperature=0, max_tokens=8)
    report("serve_tools_%s_round_trip" % tag, a.choices[0].finish_reason in ("stop", "length", "tool_calls")
           and a.usage.prompt_tokens > r.usage.prompt_tokens, a)


def rendered(srv, cl, report, tag, text, post):
    """tool_choice none (tools shown, no call read): greedy output equals /v1/completions on jinja2's text."""
    msgs = history("abcDEF123")
    o = jinja_render(text, [dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                                                for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in msgs], TOOLS)
    if "text" not in o:
        return report("serve_tools_%s_rendered_as_jinja2" % tag, False, o)
    st, _, j = post({"model": "run", "messages": msgs, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8, "temperature": 0},
                    "/v1/chat/completions")
    st2, _, c = post({"model": "run", "prompt": o["text"], "max_tokens": 8, "temperature": 0}, "/v1/completions")
    ok = st == 200 and st2 == 200 and j["choices"][0]["message"]["content"] == c["choices"][0]["text"] and \
        j["usage"]["prompt_tokens"] == c["usage"]["prompt_tokens"]
    report("serve_tools_%s_rendered_as_jinja2" % tag, ok, (st, st2, j, c))


def parallel_off(cl, report, tag, msgs):
    r = cl.chat.completions.create(model="run", messages=msgs, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                   temperature=1.0, seed=5, max_tokens=300)
    report("serve_tools_%s_parallel_false_one_call" % tag, len(r.choices[0].message.tool_calls or []) == 1, r.choices[0])


def refusals(report, post):
    cases = [({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "format"),
             ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}, "pattern")]
    bad = []
    for schema, word in cases:
        st, _, j = post({"model": "run", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "tool_choice": "auto",
                         "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}, "/v1/chat/completions")
        if st != 400 or word not in j["error"]["message"] or j["error"]["param"] != "tools":
            bad.append((word, st, j))
    for body, param in (({"tool_choice": "required"}, "tool_choice"),
                        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools")):
        st, _, j = post(dict({"model": "run", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}, **body),
                        "/v1/chat/completions")
        if st != 400 or j["error"]["param"] != param:
            bad.append((body, st, j))
    report("serve_tools_refused_by_name", not bad, bad)


def langchain(srv, report, tag):
    lc = os.path.join(HERE, "..", ".deps", "lc")
    if not os.path.isdir(os.path.join(lc, "langchain_openai")):
        print("SKIP serve_tools_langchain: langchain-openai (scripts/deps.sh installs it into .deps/lc) is missing")
        return
    code = ("import sys\nfrom langchain_openai import ChatOpenAI\nimport pydantic\n"
            "class add(pydantic.BaseModel):\n    '''Add numbers.'''\n    a: int\n    b: int\n"
            "llm = ChatOpenAI(base_url=sys.argv[1], api_key='none', model='run', temperature=0, max_tokens=300, max_retries=0)\n"
            "m = llm.bind_tools([add], tool_choice='add').invoke('add 2 and 3')\n"
            "tc = m.tool_calls\n"
            "print('OK' if len(tc) == 1 and tc[0]['name'] == 'add' and set(tc[0]['args']) == {'a', 'b'} else 'BAD', tc)\n")
    p = subprocess.run([sys.executable, "-c", code, srv.url("/v1")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=lc), timeout=600)
    report("serve_tools_%s_langchain_bind_tools" % tag, p.returncode == 0 and p.stdout.startswith("OK"), (p.stdout + p.stderr)[-600:])


def run(make_server, cl_for, report, post_for, write_template):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    cases = [(name, text) for name, text in templates()] + [("fallback", None)]
    if len(cases) < 4:
        print("SKIP serve_tools_published_templates: llama.cpp's models/templates (LOOM_LLAMA_DIR) is missing")
    for tag, text in cases:
        srv = make_server(write_template(tag, text) if text else None)
        try:
            cl, post = cl_for(srv), post_for(srv)
            m = msgs
            r = forced(cl, report, tag, m)
            if tag != "fallback":  # the fallback reads calls as Qwen2.5's do
                stream_equal(cl, report, tag, m)
            round_trip(cl, report, tag, m, r)
            if tag == "mistral-nemo":
                parallel_off(cl, report, tag, m)
            if text:
                rendered(srv, cl, report, tag, text, post)
            if tag == "fallback":
                refusals(report, post)
            if tag == "qwen2.5":
                langchain(srv, report, tag)
        finally:
            srv.stop()
