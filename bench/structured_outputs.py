"""Decode speed with and without a response_format schema on a running
`loom serve` (docs/perf.md, "Structured outputs"): rounds of the same chat
request (n samples at temperature 1), plain with ignore_eos and with the
schema, interleaved; prints completion tokens/s of each and the ratio of
the medians.  usage: structured_outputs.py PORT [ROUNDS] [N] [MAX_TOKENS]"""
import json, statistics, sys, time, urllib.request

port = int(sys.argv[1])
rounds, n, max_tokens = (int(x) for x in (sys.argv[2:] + ["5", "16", "160"][len(sys.argv[2:]):])[:3])
schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "note"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 8},
                         "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}}}


def run(fmt):
    body = {"messages": [{"role": "user", "content": "json"}], "temperature": 1.0, "n": n, "seed": 1,
            "max_tokens": max_tokens}
    if fmt:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    else:
        body["ignore_eos"] = True
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.load(urllib.request.urlopen(req))
    return r["usage"]["completion_tokens"] / (time.perf_counter() - t0)


plain, constrained = [], []
for _ in range(rounds):
    plain.append(run(False))
    constrained.append(run(True))
a, b = statistics.median(plain), statistics.median(constrained)
print("plain %s tok/s\nschema %s tok/s\nmedian ratio %.2f" % ([round(x) for x in plain], [round(x) for x in constrained], b / a))
