"""Structured outputs through `loom serve` (issue 30, item 2): hundreds of
samples at temperature 1 over several schemas, each output parsed and
validated with the jsonschema package (an independent validator); the
openai client's chat.completions.parse with a pydantic model; json_object;
schemas loom cannot enforce refused by name. The test model is a barely
trained byte-level model: left alone it writes no JSON at all, so every
valid output is the constrained decoder's doing. The tests/serve_client.py
part "structured" runs it."""
import json, os, subprocess, sys

import jsonschema

PERSON = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"enum": ["a", "bc", 7, None]}, "maxItems": 3},
                         "nick": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
                         "ok": {"type": "boolean"}},
          "required": ["name", "age", "tags", "nick", "ok"]}
ITEMS = {"type": "object", "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                                "w": {"type": "number"}},
                                              "required": ["id", "w"], "additionalProperties": False}},
         "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1, "maxItems": 3}},
         "required": ["items"], "additionalProperties": False}
COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "shade": {"const": 3},
                                          "alt": {"type": ["string", "null"], "minLength": 2, "maxLength": 3}},
         "required": ["color", "shade", "alt"], "additionalProperties": False}
GRID = {"type": "object", "properties": {"grid": {"type": "array", "maxItems": 3,
                                                  "items": {"type": "array", "maxItems": 3, "items": {"type": "integer"}}},
                                         "name": {"type": "string", "maxLength": 3}},
        "required": ["grid"], "additionalProperties": False}
SCHEMAS = {"person": PERSON, "items": ITEMS, "color": COLOR, "grid": GRID}


def fmt(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def run(srv, cl, openai, report, post):
    msgs = [{"role": "user", "content": "json"}]
    ctx = cl.models.retrieve("run").model_extra.get("max_model_len")
    room = ctx - 32  # the rendered chat prompt is under 32 tokens
    bad, total, by_finish = [], 0, {}
    for name, schema in SCHEMAS.items():
        for seed in range(4):
            r = cl.chat.completions.create(model="run", messages=msgs, temperature=1.0, n=16, seed=seed, max_tokens=room,
                                           response_format=fmt(name, schema))
            for c in r.choices:
                total += 1
                by_finish[c.finish_reason] = by_finish.get(c.finish_reason, 0) + 1
                try:
                    jsonschema.validate(json.loads(c.message.content), schema)
                    if c.finish_reason != "stop":
                        bad.append((name, "finish %s" % c.finish_reason, c.message.content))
                except (ValueError, jsonschema.ValidationError) as e:
                    bad.append((name, str(e)[:120], c.message.content))
    report("serve_structured_all_valid", not bad and total == 256, "%d of %d invalid, e.g. %s; finish %s" %
           (len(bad), total, bad[:3], by_finish))
    print("  structured outputs: %d samples at temperature 1, all finish %s" % (total, by_finish), flush=True)
    stream(cl, report, msgs, room)
    json_object(cl, report, msgs, room)
    pydantic_parse(cl, report, msgs, room)
    langchain(srv, report)
    refusals(report, post)


def stream(cl, report, msgs, room):
    chunks = list(cl.chat.completions.create(model="run", messages=msgs, temperature=1.0, seed=3, max_tokens=room,
                                             response_format=fmt("person", PERSON), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    try:
        jsonschema.validate(json.loads(text), PERSON)
        ok = True
    except (ValueError, jsonschema.ValidationError) as e:
        ok = e
    report("serve_structured_stream", ok is True, (ok, text))


def json_object(cl, report, msgs, room):
    """Any object: free keys and values; those that end (the rest hit max_tokens) parse as objects."""
    r = cl.chat.completions.create(model="run", messages=msgs, temperature=1.0, n=16, seed=1, max_tokens=room,
                                   response_format={"type": "json_object"})
    ended = [c.message.content for c in r.choices if c.finish_reason == "stop"]
    bad = []
    for t in ended:
        try:
            if not isinstance(json.loads(t), dict):
                bad.append(t)
        except ValueError:
            bad.append(t)
    report("serve_structured_json_object", ended and not bad and all(c.message.content.startswith("{") for c in r.choices),
           "%d ended, bad %s" % (len(ended), bad[:2]))


def pydantic_parse(cl, report, msgs, room):
    """openai-python's chat.completions.parse: a pydantic model in, an instance out."""
    from typing import List, Literal, Optional

    import pydantic

    class Pet(pydantic.BaseModel):
        kind: Literal["cat", "dog"]
        legs: int

    class Owner(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=5)
        pets: List[Pet] = pydantic.Field(max_length=2)
        note: Optional[str] = pydantic.Field(max_length=4)

    try:
        got = []
        for seed in range(8):
            r = cl.chat.completions.parse(model="run", messages=msgs, temperature=1.0, seed=seed, max_tokens=room,
                                          response_format=Owner)
            got.append(r.choices[0].message.parsed)
        report("serve_structured_pydantic_parse", all(isinstance(p, Owner) for p in got), got)
    except Exception as e:  # a refusal or a parse error: say which
        report("serve_structured_pydantic_parse", False, repr(e)[:400])


def langchain(srv, report):
    lc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".deps", "lc")
    if not os.path.isdir(os.path.join(lc, "langchain_openai")):
        print("SKIP serve_structured_langchain: langchain-openai (scripts/deps.sh installs it into .deps/lc) is missing")
        return
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_langchain.py"),
                        srv.url("/v1")], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=lc), timeout=600)
    report("serve_structured_langchain", p.returncode == 0 and p.stdout.startswith("OK"), (p.stdout + p.stderr)[-600:])


def refusals(report, post):
    cases = [({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+$"}}}, "pattern"),
             ({"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}}}, "format"),
             ({"type": "object", "properties": {"u": {"anyOf": [{"type": "object"}, {"type": "object"}]}}}, "anyOf")]
    bad = []
    for schema, word in cases:
        st, _, j = post({"model": "run", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                         "response_format": fmt("x", schema)}, "/v1/chat/completions")
        if st != 400 or word not in j["error"]["message"] or j["error"]["param"] != "response_format":
            bad.append((word, st, j))
    report("serve_structured_refused_by_name", not bad, bad)
