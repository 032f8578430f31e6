"""Decode speed with and without constrained decoding on a running `loom
serve` (docs/perf.md, "Structured outputs" and "Tool calling"): rounds of
the same chat request (n samples at temperature 1), plain with ignore_eos
and constrained, interleaved; prints completion tokens/s of each and the
ratio of the medians. MODE schema: a response_format json_schema; tools:
the same tools in both, tool_choice none (plain) and required (a forced
call, the call grammar of serve/tools.c).
usage: structured_outputs.py PORT [ROUNDS] [N] [MAX_TOKENS] [schema|tools]"""
import json, statistics, sys, time, urllib.request

port = int(sys.argv[1])
rounds, n, max_tokens = (int(x) for x in (sys.argv[2:5] + ["5", "16", "160"][len(sys.argv[2:5]):])[:3])
mode = sys.argv[5] if len(sys.argv) > 5 else "schema"
schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "note"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 8},
                         "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}}}


tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now, in a city.", "parameters": {
             "type": "object", "additionalProperties": False, "required": ["city", "unit", "days"],
             "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["c", "f"]},
                            "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 8}}}}},
         {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": schema}}]


def run(fmt):
    body = {"messages": [{"role": "user", "content": "json"}], "temperature": 1.0, "n": n, "seed": 1,
            "max_tokens": max_tokens}
    if mode == "tools":
        body["tools"], body["tool_choice"] = tools, "required" if fmt else "none"
    elif fmt:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    if not fmt:
        body["ignore_eos"] = True
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.load(urllib.request.urlopen(req))
    return r["usage"]["completion_tokens"] / (time.perf_counter() - t0)


run(False), run(True)  # warm: the prompt into the prefix cache
plain, constrained = [], []
for _ in range(rounds):
    plain.append(run(False))
    constrained.append(run(True))
a, b = statistics.median(plain), statistics.median(constrained)
print(("plain %s tok/s\n" + mode + " %s tok/s\nmedian ratio %.2f") % ([round(x) for x in plain], [round(x) for x in constrained], b / a))
