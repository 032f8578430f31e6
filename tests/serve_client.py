"""Drives `loom serve` with real clients (the official openai package, raw
HTTP): tests/test_serve.sh and tests/test_serve_san.sh run it.

usage: serve_client.py LOOM RUN PART...   PART: openai concurrency load
       quantmem draft overload disconnect badinput sigterm chattemplate cors structured
       tools (needs LOOM_TOOLS_RUN: a model with a 4096-token context) promptlogprobs.
       Prints PASS/FAIL lines."""
import http.client, json, os, re, signal, socket, subprocess, sys, threading, time, urllib.request

import loom_server, openai_check, serve_conformance, serve_structured, serve_tools

LOOM, RUN = sys.argv[1], sys.argv[2]
PARTS = sys.argv[3:]
SLOW = 4 if os.environ.get("LOOM_SANITIZED") else 1
PREFIX = "san_" if os.environ.get("LOOM_SANITIZED") else ""


def report(name, ok, why=""):
    print(("PASS %s%s" % (PREFIX, name)) if ok else ("FAIL %s%s: %s" % (PREFIX, name, why)), flush=True)


class Server(loom_server.LoomServer):
    def __init__(self, *flags, runs=None, env=None):
        args = [LOOM, "serve", "--port", "0", "--threads", "2", "--kv-memory", "64M"]
        for r in runs or [RUN]:
            args += ["--run", r]
        super().__init__(args + list(flags), env=dict(os.environ, **(env or {})), start_s=180 * SLOW, stop_s=60 * SLOW)

    def stop(self):
        rc = super().stop()
        if PREFIX and not getattr(self, "checked", False):  # under the sanitizers: a clean exit, no report
            self.checked = True
            time.sleep(0.2)
            bad = [l for l in self.log if "Sanitizer" in l or "runtime error" in l]
            report("serve_sanitizer_clean_%s" % self.p.pid, rc == 0 and not bad, "exit %s, %s" % (rc, "".join(bad[:5])))
        return rc


def request(srv, method, path, body=None, headers=None, timeout=120):
    """(status, headers, body bytes) over one connection."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout * SLOW)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    openai_check.check(path, r.status, r.getheader("Content-Type"), data)
    return r.status, dict(r.getheaders()), data


def post(srv, body, path="/v1/completions", **kw):
    st, h, data = request(srv, "POST", path, body, {"Content-Type": "application/json"}, **kw)
    return st, h, json.loads(data) if data else None


def metric(srv, name, labels=""):
    _, _, text = request(srv, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def greedy(srv, prompt, n=16, model=None):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if model:
        body["model"] = model
    st, _, j = post(srv, body)
    return j["choices"][0]["text"] if st == 200 else None


# --- the official client ---------------------------------------------------
def part_openai():
    import openai
    srv = Server("--api-key", "sekret", runs=[RUN, "second=" + RUN])
    try:
        cl = openai.OpenAI(base_url=srv.url("/v1"), api_key="sekret", max_retries=0, http_client=openai_check.transport())
        openai_completions(srv, cl)
        openai_chat(srv, cl)
        openai_sampling(srv, cl)
        openai_errors(srv, cl, openai)
        serve_conformance.run(srv, cl, openai, report, request)
        st, _, text = request(srv, "GET", "/metrics")
        names = set(re.findall(r"^(loom_serve_\w+?)(?:_bucket|_sum|_count)?\{model=", text.decode(), re.M))
        want = {"loom_serve_requests_running", "loom_serve_requests_waiting", "loom_serve_kv_cache_usage_ratio",
                "loom_serve_prompt_tokens_total", "loom_serve_generation_tokens_total", "loom_serve_preemptions_total",
                "loom_serve_request_success_total", "loom_serve_time_to_first_token_seconds",
                "loom_serve_inter_token_latency_seconds", "loom_serve_e2e_request_latency_seconds",
                "loom_serve_request_queue_time_seconds"}
        report("serve_metrics_names", st == 200 and want <= names, "missing %s" % (want - names))
        promtool = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True) \
            if shutil_which("promtool") else None
        if promtool is None:
            print("SKIP serve_metrics_promtool: promtool (Debian's prometheus) is not installed")
        else:
            # promtool lints too (help text style); a parse error is what fails here
            bad = [l for l in promtool.stdout.decode().splitlines() + promtool.stderr.decode().splitlines()
                   if "error" in l.lower() and "parse" in l.lower()]
            report("serve_metrics_promtool", not bad, bad)
        st, h, page = request(srv, "GET", "/")
        st2, _, dj = request(srv, "GET", "/dashboard.json")
        report("serve_dashboard", st == 200 and b"<html" in page.lower() and st2 == 200 and
               "loom serve" in json.loads(dj).get("title", ""), (st, st2, dj[:200]))
        gen = metric(srv, "loom_serve_generation_tokens_total", 'model="run"')
        report("serve_metrics_counts", gen is not None and gen > 0, "generation tokens %s" % gen)
    finally:
        rc = srv.stop()
        report("serve_sigterm_idle_exit0", rc == 0, "exit %s" % rc)


def shutil_which(x):
    import shutil
    return shutil.which(x)


def openai_completions(srv, cl):
    prompt = "the cat sat on"
    r = cl.completions.create(model="run", prompt=prompt, max_tokens=24, temperature=0)
    text = r.choices[0].text
    out = subprocess.run([LOOM, "sample", "--run", RUN, "--prompt", prompt, "--tokens", "24", "--temperature", "0",
                          "--threads", "2"], capture_output=True).stdout.decode("utf-8", "replace")
    report("serve_greedy_equals_sample", out.rstrip("\n") == prompt + text, "server %r, loom sample %r" % (text, out))
    report("serve_usage", r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0 and
           r.choices[0].finish_reason == "length", r.usage)
    chunks = list(cl.completions.create(model="run", prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
    st = "".join(c.choices[0].text for c in chunks if c.choices)
    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    report("serve_stream_equals_full", st == text and fin == ["length"], "%r vs %r, %s" % (st, text, fin))
    report("serve_stream_usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24,
           chunks[-1])
    r2 = cl.completions.create(model="second", prompt=prompt, max_tokens=24, temperature=0)
    report("serve_second_model", r2.choices[0].text == text and r2.model == "second", r2)
    ids = [m.id for m in cl.models.list()]
    report("serve_models_list", ids == ["run", "second"], ids)
    two = cl.completions.create(model="run", prompt=[prompt, "a dog"], max_tokens=8, temperature=0)
    one = cl.completions.create(model="run", prompt="a dog", max_tokens=8, temperature=0)
    report("serve_prompt_list", [c.text for c in two.choices] == [text[:len(two.choices[0].text)], one.choices[0].text]
           and two.choices[0].text == cl.completions.create(model="run", prompt=prompt, max_tokens=8, temperature=0).choices[0].text,
           two)
    e = cl.completions.create(model="run", prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2)
    lp = e.choices[0].logprobs
    # with echo the prompt's tokens come first, the first one's logprob null (part promptlogprobs checks the values)
    n = len(lp.tokens) - 4
    ok = e.choices[0].text.startswith(prompt) and "".join(lp.tokens) == e.choices[0].text and \
        lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and \
        all(abs(l - max(t.values())) < 1e-6 for l, t in zip(lp.token_logprobs[n:], lp.top_logprobs[n:]))
    report("serve_echo_logprobs", ok, e)


def openai_chat(srv, cl):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the dog"}]
    r = cl.chat.completions.create(model="run", messages=msgs, max_tokens=12, temperature=0)
    rendered = "system: be brief\nuser: the dog\nassistant: "
    c = cl.completions.create(model="run", prompt=rendered, max_tokens=12, temperature=0)
    report("serve_chat_template", r.choices[0].message.content == c.choices[0].text and
           r.choices[0].message.role == "assistant", "%r vs %r" % (r.choices[0].message.content, c.choices[0].text))
    chunks = list(cl.chat.completions.create(model="run", messages=msgs, max_tokens=12, temperature=0, stream=True))
    st = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    report("serve_chat_stream", st == r.choices[0].message.content and chunks[0].choices[0].delta.role == "assistant",
           "%r vs %r" % (st, r.choices[0].message.content))


def openai_sampling(srv, cl):
    kw = dict(model="run", prompt="the", max_tokens=16, temperature=1.0, n=3)
    a = cl.completions.create(seed=7, **kw)
    b = cl.completions.create(seed=7, **kw)
    c = cl.completions.create(seed=8, **kw)
    ta, tb, tc = ([x.text for x in sorted(r.choices, key=lambda x: x.index)] for r in (a, b, c))
    report("serve_n_seed", len(ta) == 3 and ta == tb and ta != tc and len(set(ta)) > 1, (ta, tb, tc))
    base = cl.completions.create(model="run", prompt="the cat", max_tokens=24, temperature=0).choices[0].text
    stop = base[6:8] if len(base) > 8 else None
    if stop and stop in base:
        s = cl.completions.create(model="run", prompt="the cat", max_tokens=24, temperature=0, stop=[stop, "zzzz"])
        report("serve_stop_string", s.choices[0].text == base[:base.index(stop)] and
               s.choices[0].finish_reason == "stop", "%r stop %r in %r" % (s.choices[0].text, stop, base))
        ss = list(cl.completions.create(model="run", prompt="the cat", max_tokens=24, temperature=0, stop=stop, stream=True))
        report("serve_stop_string_stream", "".join(x.choices[0].text for x in ss if x.choices) == base[:base.index(stop)], ss)
    else:
        report("serve_stop_string", False, "greedy output too short to pick a stop string: %r" % base)


def openai_errors(srv, cl, openai):
    try:
        openai.OpenAI(base_url=srv.url("/v1"), api_key="wrong", max_retries=0).models.list()
        report("serve_api_key", False, "wrong key accepted")
    except openai.AuthenticationError as e:
        report("serve_api_key", e.status_code == 401, e)
    st, _, j = post(srv, {"prompt": "a"})
    report("serve_api_key_missing", st == 401 and j["error"]["code"] == "invalid_api_key", (st, j))
    st, _, _ = request(srv, "GET", "/health")
    report("serve_health_open", st == 200, st)
    try:
        cl.completions.create(model="nope", prompt="a", max_tokens=1)
        report("serve_unknown_model", False, "accepted")
    except openai.NotFoundError as e:
        report("serve_unknown_model", "run" in str(e) and "second" in str(e), e)
    try:
        cl.completions.create(model="run", prompt="a" * 2000, max_tokens=1)
        report("serve_prompt_too_long", False, "accepted")
    except openai.BadRequestError as e:
        report("serve_prompt_too_long", e.body.get("code") == "context_length_exceeded", e)


def part_structured():
    """response_format by constrained decoding (tests/serve_structured.py)."""
    import openai
    srv = Server()
    try:
        cl = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0, http_client=openai_check.transport())
        serve_structured.run(srv, cl, openai, report, lambda body, path: post(srv, body, path))
    except Exception:
        print("".join(srv.log[-20:]))
        raise
    finally:
        srv.stop()


def part_tools():
    """Tool calling (tests/serve_tools.py) on a model whose context holds a prompt with tools."""
    import openai, tempfile
    run = os.environ.get("LOOM_TOOLS_RUN")
    if not run:
        print("SKIP serve_tools: LOOM_TOOLS_RUN (a run with a 4096-token context, tests/test_serve.sh trains one) is not set")
        return
    d = tempfile.mkdtemp(prefix="loom-tools-")

    def write_template(tag, text):
        p = os.path.join(d, tag + ".jinja")
        with open(p, "w") as f:
            f.write(text)
        return p

    def make_server(template):
        return Server(*(["--chat-template", template] if template else []), runs=["run=" + run])

    serve_tools.run(make_server, lambda srv: openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0,
                                                            http_client=openai_check.transport()),
                    report, lambda srv: (lambda body, path: post(srv, body, path)), write_template)


def part_promptlogprobs():
    """logprobs with echo on /v1/completions: the prompt's tokens scored too (the first null, as OpenAI
    does), equal to transformers on the same checkpoint (tests/serve_logprobs_oracle.py); streamed equal
    to whole; max_tokens 0 scores the prompt alone; a prompt longer than one step's prompt-logit rows (64)."""
    import glob, openai, tempfile
    py = "env PYTHONPATH=%s /usr/bin/python3" % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".deps", "hf")
    if subprocess.run(py + " -c 'import torch, transformers'", shell=True, capture_output=True).returncode:
        print("SKIP serve_prompt_logprobs: transformers (scripts/deps.sh installs it into .deps/hf) or torch is missing")
        return
    ck = sorted(glob.glob(os.path.join(RUN, "checkpoints", "step_*")))[-1]
    srv = Server()
    try:
        cl = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0, http_client=openai_check.transport())
        cases, got = (("short", list(b"the cat sat on a mat"), 4), ("long", list(b"by river the dog ran " * 8), 3),
                      ("prompt_only", list(b"a dog who was under"), 0)), []
        for name, prompt, gen in cases:
            r = cl.completions.create(model="run", prompt=prompt, max_tokens=gen, temperature=0, logprobs=3, echo=True)
            lp = r.choices[0].logprobs
            got.append((r, prompt + [ord(t) if len(t) == 1 else -1 for t in lp.tokens[len(prompt):]]))
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump([ids for _, ids in got], f)
        f.close()
        o = subprocess.run(py + " %s %s %s 3" % (os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_logprobs_oracle.py"),
                                                 ck, f.name), shell=True, capture_output=True, text=True)
        os.unlink(f.name)
        if o.returncode:
            return report("serve_prompt_logprobs_oracle", False, o.stderr[-500:])
        for (name, prompt, gen), (r, ids), want in zip(cases, got, json.loads(o.stdout)):
            lp = r.choices[0].logprobs
            bad = []
            if len(lp.tokens) != len(prompt) + gen or lp.token_logprobs[0] is not None or lp.top_logprobs[0] is not None:
                bad.append(("shape", len(lp.tokens), lp.token_logprobs[:1], lp.top_logprobs[:1]))
            for i in range(1, min(len(ids), len(lp.token_logprobs))):
                got_lp, w = lp.token_logprobs[i], want[i]
                # a byte above 127 alone shows as U+FFFD; the token itself is appended when not among the top;
                # an alternative outside the oracle's top must tie with its last one
                tops = {chr(a): b for a, b in w["top"] if a < 128}
                odd = [(t, v) for t, v in lp.top_logprobs[i].items() if t != "\ufffd" and t != lp.tokens[i] and
                       abs(tops.get(t, w["top"][-1][1]) - v) > 2e-4]
                if abs(got_lp - w["logprob"]) > 2e-4 or odd:
                    bad.append((i, got_lp, w["logprob"], lp.top_logprobs[i], tops))
            report("serve_prompt_logprobs_%s_equal_transformers" % name, not bad and r.choices[0].text.startswith("".join(map(chr, prompt))),
                   bad[:3])
            chunks = list(cl.completions.create(model="run", prompt=prompt, max_tokens=gen, temperature=0, logprobs=3, echo=True,
                                                stream=True))
            st = [(t, l, o) for c in chunks if c.choices and c.choices[0].logprobs for t, l, o in
                  zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs, c.choices[0].logprobs.text_offset)]
            whole = list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))
            report("serve_prompt_logprobs_%s_stream_equals_whole" % name, st == whole and
                   "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text, (st[:4], whole[:4]))
    finally:
        srv.stop()


def part_cors():
    """--cors-origin: every answer names the origin; a browser's preflight gets 204."""
    srv = Server("--cors-origin", "http://localhost:3000")
    try:
        st, h, _ = request(srv, "OPTIONS", "/v1/chat/completions", None,
                           {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        report("serve_cors_preflight", st == 204 and h.get("Access-Control-Allow-Origin") == "http://localhost:3000"
               and "POST" in h.get("Access-Control-Allow-Methods", "")
               and "Authorization" in h.get("Access-Control-Allow-Headers", ""), (st, h))
        st, h, _ = post(srv, {"prompt": "the", "max_tokens": 2})
        report("serve_cors_answer", st == 200 and h.get("Access-Control-Allow-Origin") == "http://localhost:3000", (st, h))
    finally:
        srv.stop()


# --- load -------------------------------------------------------------------
PROMPTS = ["the", "the cat sat on a mat and", "a dog who was under old tree by river then it ran to see " * 2,
           "on", "the dog", "by river the cat sat on a mat " * 3]


def run_threads(fn, n):
    out = [None] * n
    ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def part_concurrency():
    srv = Server("--max-seqs", "16")
    try:
        single = {p: greedy(srv, p) for p in PROMPTS}

        def one(i):
            try:
                st, _, j = post(srv, {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16, "temperature": 0})
                return j["choices"][0]["text"] if st == 200 and j["choices"][0]["finish_reason"] == "length" else ("status", st, j)
            except Exception as e:
                return ("error", repr(e))
        got = run_threads(one, 32)
        bad = [(i, g) for i, g in enumerate(got) if g != single[PROMPTS[i % len(PROMPTS)]]]
        report("serve_concurrent_32_equal_single", not bad, bad[:3])
        st, _, _ = request(srv, "GET", "/health")
        report("serve_concurrent_health", st == 200, st)
    finally:
        srv.stop()


# --- load: 64 clients through the official package ---------------------------
SYSTEM = "by river the cat sat on a mat and then it ran to see the dog who was under old tree "


def load_solo(cl, prompts, stops):
    """Each (prompt, stop) answered alone, one request at a time: (text, finish)."""
    out = {}
    for p in prompts:
        for stop in stops.get(p, [None]):
            c = cl.completions.create(model="run", prompt=p, max_tokens=12, temperature=0, stop=stop)
            out[(p, stop)] = (c.choices[0].text, c.choices[0].finish_reason)
    return out


def load_client(cl, i, prompts, stops):
    """Client i: plain, streamed, streamed with a stop string, or streamed and
    dropped after two chunks (i % 4). Returns (key, text, finish) or ("cancel",)."""
    p = prompts[i % len(prompts)]
    kind = i % 4
    stop = stops[p][1] if kind == 2 else None
    if kind == 0:
        c = cl.completions.create(model="run", prompt=p, max_tokens=12, temperature=0)
        return (p, None), c.choices[0].text, c.choices[0].finish_reason
    st = cl.completions.create(model="run", prompt=p, max_tokens=12, temperature=0, stop=stop, stream=True)
    text, fin, n = "", None, 0
    for ch in st:
        n += 1
        if ch.choices:
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
        if kind == 3 and n == 2:
            st.close()  # the client goes away mid-stream: the server cancels it
            return ("cancel",)
    return (p, stop), text, fin


def part_load():
    """64 concurrent clients (streams, stop strings, cancellations) on prompts
    sharing a system prefix: every answer equals the same request answered
    alone; at the end no KV block is in use; the prefix cache hit; a server
    with --no-prefix-cache and --speculate 4 answers every request alone the
    same."""
    import openai
    prompts = [SYSTEM + q for q in PROMPTS]
    srv = Server("--max-seqs", "16")
    try:
        cl = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0, timeout=120 * SLOW)
        plain = load_solo(cl, prompts, {})
        # a stop string from inside each solo answer, so it does stop there
        stops = {p: [None, (plain[(p, None)][0][3:6] or "zz")] for p in prompts}
        solo = load_solo(cl, prompts, stops)
        t0 = time.time()
        got = run_threads(lambda i: load_client(cl, i, prompts, stops), 64)
        wall = time.time() - t0
        bad = [(i, g, solo.get(g[0])) for i, g in enumerate(got) if g[0] != "cancel" and solo.get(g[0]) != tuple(g[1:])]
        nstop = sum(1 for g in got if g[0] != "cancel" and g[0][1] is not None and g[2] == "stop")
        report("serve_load_64_equal_solo", not bad and nstop > 0, "%d differ, e.g. %s; %d stopped by a stop string" %
               (len(bad), bad[:2], nstop))
        used = running = None
        for _ in range(600 * SLOW):  # a guard: cancelled streams end at the engine's next step
            used = metric(srv, "loom_serve_kv_cache_used_blocks", 'model="run"')
            running = metric(srv, "loom_serve_requests_running", 'model="run"')
            if used == 0 and running == 0:
                break
            time.sleep(0.1)
        report("serve_load_kv_blocks_free", used == 0 and running == 0, "used blocks %s, running %s" % (used, running))
        hits = metric(srv, "loom_serve_prefix_cache_hits_total", 'model="run"')
        queries = metric(srv, "loom_serve_prefix_cache_queries_total", 'model="run"')
        report("serve_prefix_cache_metrics", hits is not None and queries is not None and 0 < hits <= queries,
               "hits %s, queries %s" % (hits, queries))
        print("  64 clients in %.1f s; prefix cache %s of %s prompt tokens" % (wall, hits, queries))
    finally:
        srv.stop()
    srv = Server("--no-prefix-cache", "--speculate", "4")
    try:
        cl = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0, timeout=120 * SLOW)
        again = load_solo(cl, prompts, stops)
        diff = [k for k in solo if solo[k] != again[k]]
        hits = metric(srv, "loom_serve_prefix_cache_hits_total", 'model="run"')
        report("serve_no_prefix_cache_speculate_same_answers", not diff and hits == 0,
               "%d differ (%s); hits %s" % (len(diff), diff[:2], hits))
    finally:
        srv.stop()


def part_quantmem():
    """--quant w8a8: the server gives the fp32 linear weights back (start
    log), logs its resident memory, and answers as `loom sample --quant
    w8a8` (which keeps them): the int8 path never read them."""
    srv = Server("--quant", "w8a8")
    try:
        log = "".join(srv.log)
        report("serve_quant_gives_back_fp32", "fp32 linear weights given back" in log and "resident memory" in log,
               [l for l in srv.log if "model run" in l or "resident" in l])
        prompt = "the cat sat on"
        text = greedy(srv, prompt, n=24)
        out = subprocess.run([LOOM, "sample", "--run", RUN, "--prompt", prompt, "--tokens", "24", "--temperature", "0",
                              "--quant", "w8a8", "--threads", "2"], capture_output=True).stdout.decode("utf-8", "replace")
        report("serve_quant_equals_sample", text is not None and out.rstrip("\n") == prompt + text,
               "server %r, loom sample %r" % (text, out))
    finally:
        srv.stop()


def part_draft():
    """--draft-run: the run as its own draft model answers greedy requests as
    `loom sample --temperature 0` does, with drafts proposed and accepted
    (/metrics); a draft of another tokenizer (the run's Hugging Face export
    with two ids of its tokenizer.json swapped) is refused naming both."""
    srv = Server("--draft-run", RUN, "--speculate", "3")
    try:
        log = "".join(srv.log)
        same = []
        for prompt in ["the cat sat on", "a dog ran to the old tree and"]:
            text = greedy(srv, prompt, n=20)
            out = subprocess.run([LOOM, "sample", "--run", RUN, "--prompt", prompt, "--tokens", "20", "--temperature", "0",
                                  "--threads", "2"], capture_output=True).stdout.decode("utf-8", "replace")
            same.append(text is not None and out.rstrip("\n") == prompt + text)
        drafted = metric(srv, "loom_serve_spec_decode_num_draft_tokens_total", 'model="run"')
        accepted = metric(srv, "loom_serve_spec_decode_num_accepted_tokens_total", 'model="run"')
        report("serve_draft_model_equals_sample", all(same) and "draft model" in log and drafted and accepted,
               "equal %s; drafted %s, accepted %s; log %s" % (same, drafted, accepted, [l for l in srv.log if "draft" in l]))
        print("  draft model: %s drafted, %s accepted" % (drafted, accepted))
    finally:
        srv.stop()
    hf = RUN.rstrip("/") + "-hf-othertok"
    subprocess.run([LOOM, "export", "--run", RUN, "--format", "hf", "--out", hf, "--force"], capture_output=True)
    for f in ("vocab.json", "merges.txt"):  # the tokenizer.json below is then the folder's
        if os.path.exists(hf + "/" + f):
            os.remove(hf + "/" + f)
    tj = json.load(open(hf + "/tokenizer.json"))
    v = tj["model"]["vocab"]
    a, b = sorted(v, key=v.get)[100:102]
    v[a], v[b] = v[b], v[a]
    json.dump(tj, open(hf + "/tokenizer.json", "w"))
    p = subprocess.run([LOOM, "serve", "--port", "0", "--threads", "2", "--kv-memory", "64M", "--run", RUN, "--draft-run", hf],
                       capture_output=True, text=True, timeout=180 * SLOW)
    report("serve_draft_other_tokenizer_refused", p.returncode != 0 and "tokenizer" in p.stderr and hf in p.stderr and RUN in p.stderr,
           "exit %s: %s" % (p.returncode, p.stderr[-600:]))


def part_overload():
    # LOOM_TEST_SERVE_HOLD=0:FILE (src/serve/serve_req.c): no first token
    # leaves the server until FILE exists, so the 4 requests the queue takes
    # are still waiting when the other 60 arrive, however fast the machine:
    # exactly 4 answers and 60 refusals.
    # --threads 1 (the last --threads wins): the stepping thread must run the
    # model on it, not on OpenMP's default for a new thread (all cores).
    release = "/tmp/loom-serve-release-%d" % os.getpid()
    srv = Server("--max-queue", "4", "--max-seqs", "2", "--threads", "1", env={"LOOM_TEST_SERVE_HOLD": "0:" + release})
    try:
        ran = [l for l in srv.log if "OpenMP thread" in l]
        report("serve_threads_flag_on_stepping_thread", ran and "with 1 OpenMP thread\n" in ran[0], ran)
        def one(i):
            try:
                st, h, data = request(srv, "POST", "/v1/completions",
                                      json.dumps({"prompt": PROMPTS[i % 6], "max_tokens": 24, "temperature": 0}))
                j = json.loads(data)
                if st == 200:
                    return ("ok", j["usage"]["completion_tokens"] == 24 and len(j["choices"]) == 1)
                return (st, h.get("Retry-After") == "1" and j["error"]["type"] == "rate_limit_error")
            except Exception as e:
                return ("error", repr(e))
        got = [None] * 64
        ts = [threading.Thread(target=lambda i=i: got.__setitem__(i, one(i))) for i in range(64)]
        for t in ts:
            t.start()
        for _ in range(1200 * SLOW):  # a guard only: the 60th refusal ends it
            if sum(1 for g in got if g) >= 60:
                break
            time.sleep(0.05)
        open(release, "w").close()
        for t in ts:
            t.join()
        n429 = sum(1 for g in got if g[0] == 429)
        nok = sum(1 for g in got if g[0] == "ok")
        wrong = [g for g in got if not g[1] or g[0] not in ("ok", 429)]
        report("serve_overload_429", n429 == 60 and nok == 4 and not wrong, "ok %d, 429 %d, wrong %s" % (nok, n429, wrong[:3]))
        report("serve_overload_recovers", greedy(srv, "the") is not None, "no answer after the burst")
        rej = metric(srv, "loom_serve_requests_rejected_total", 'model="run"')
        report("serve_overload_metric", rej == n429, "%s vs %d" % (rej, n429))
    finally:
        srv.stop()
        if os.path.exists(release):
            os.unlink(release)


def part_disconnect():
    # LOOM_TEST_SERVE_HOLD=3: no sample gets past its 3rd token until its
    # client has gone, so every one of the 20 is cut mid-stream on a machine
    # of any speed (a fast one could otherwise finish 120 tokens first; the
    # longest prompt, 114 tokens, plus 120 fits the context of 256).
    release = "/tmp/loom-serve-release-%d" % os.getpid()
    srv = Server("--max-seqs", "32", env={"LOOM_TEST_SERVE_HOLD": "3:" + release})
    try:
        def one(i):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=60 * SLOW)
            body = json.dumps({"prompt": PROMPTS[i % 6], "max_tokens": 120, "temperature": 0, "stream": True})
            s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
            got = b""
            while got.count(b"data: ") < 3:
                d = s.recv(4096)
                if not d:
                    break
                got += d
            s.close()
            return got.count(b"data: ") >= 3
        started = run_threads(one, 20)
        used, aborted = None, None
        for _ in range(600 * SLOW):  # a guard only: the last abort ends it
            used = metric(srv, "loom_serve_kv_cache_used_blocks", 'model="run"')
            aborted = metric(srv, "loom_serve_request_success_total", 'finish_reason="abort"')
            if used == 0 and aborted == 20:
                break
            time.sleep(0.2)
        report("serve_disconnect_frees_kv", all(started) and used == 0 and aborted == 20,
               "streams started %d/20, used blocks %s, aborted %s" % (sum(started), used, aborted))
        open(release, "w").close()  # the hold ends: a whole answer again
        report("serve_disconnect_then_serves", greedy(srv, "the") is not None, "no answer")
    finally:
        srv.stop()
        if os.path.exists(release):
            os.unlink(release)


# --- bad input ----------------------------------------------------------------
def bad_cases():
    return [
        ("truncated_json", b'{"prompt": "a", "max_tok', 400, None),
        ("not_an_object", b'[1, 2]', 400, None),
        ("json_null", b'null', 400, None),
        ("trailing_garbage", b'{"prompt": "a"} x', 400, None),
        ("prompt_wrong_type", {"prompt": 5}, 400, "prompt"),
        ("prompt_missing", {"max_tokens": 5}, 400, "prompt"),
        ("prompt_empty", {"prompt": ""}, 400, "prompt"),
        ("prompt_mixed_list", {"prompt": ["a", 3]}, 400, "prompt"),
        ("max_tokens_string", {"prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
        ("max_tokens_negative", {"prompt": "a", "max_tokens": -3}, 400, "max_tokens"),
        ("max_tokens_huge", b'{"prompt": "a", "max_tokens": 1e300}', 400, "max_tokens"),
        ("max_tokens_fraction", {"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens"),
        ("temperature_string", {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
        ("temperature_negative", {"prompt": "a", "temperature": -1}, 400, "temperature"),
        ("top_p_zero", {"prompt": "a", "top_p": 0}, 400, "top_p"),
        ("top_k_huge", {"prompt": "a", "top_k": 1e20}, 400, "top_k"),
        ("seed_huge", b'{"prompt": "a", "seed": 1e30}', 400, "seed"),
        ("n_zero", {"prompt": "a", "n": 0}, 400, "n"),
        ("n_huge", {"prompt": "a", "n": 100000}, 400, "n"),
        ("stream_string", {"prompt": "a", "stream": "yes"}, 400, "stream"),
        ("stop_number", {"prompt": "a", "stop": 3}, 400, "stop"),
        ("stop_too_many", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ("logprobs_huge", {"prompt": "a", "logprobs": 50}, 400, "logprobs"),
        ("model_number", {"prompt": "a", "model": 7}, 400, "model"),
        ("presence_penalty", {"prompt": "a", "presence_penalty": 1.0}, 400, "presence_penalty"),
        ("token_outside_vocab", {"prompt": [999999], "max_tokens": 1}, 400, "prompt"),
        ("token_negative", {"prompt": [-1], "max_tokens": 1}, 400, "prompt"),
        ("invalid_utf8", b'{"prompt": "\xff\xfe\xc0\xaf", "max_tokens": 1}', 400, None),
        ("lone_surrogate", b'{"prompt": "\\ud800", "max_tokens": 1}', 400, None),
        ("deep_nesting", b'{"prompt": ' + b'[' * 5000 + b']' * 5000 + b'}', 400, None),
        ("body_10mb", b'{"prompt": "' + b'a' * (10 << 20) + b'"}', 413, None),
        ("empty_body", b'', 400, None),
        ("unknown_fields_ok", {"prompt": "a", "max_tokens": 1, "frobnicate": {"x": [1]}, "user": "u"}, 200, None),
        ("chat_messages_wrong", {"messages": [{"role": "user"}]}, 400, "messages", "/v1/chat/completions"),
        ("chat_messages_string", {"messages": "hi"}, 400, "messages", "/v1/chat/completions"),
        ("chat_logprobs_type", {"messages": [{"role": "user", "content": "a"}], "logprobs": 3}, 400, "logprobs",
         "/v1/chat/completions"),
    ]


def part_badinput():
    srv = Server()
    try:
        for case in bad_cases():
            name, body, want, param = case[:4]
            path = case[4] if len(case) > 4 else "/v1/completions"
            try:
                st, _, data = request(srv, "POST", path, body, {"Content-Type": "application/json"})
                j = json.loads(data)
                if want == 200:
                    ok = st == 200 and j["choices"][0]["text"] is not None
                else:
                    e = j["error"]
                    ok = st == want and isinstance(e["message"], str) and e["message"] and "type" in e and \
                        "code" in e and e["param"] == param
                why = "status %d, %s" % (st, data[:300])
            except Exception as ex:
                ok, why = False, repr(ex)
            hs, _, _ = request(srv, "GET", "/health")
            report("serve_bad_" + name, ok and hs == 200, why + ("" if hs == 200 else "; /health %d" % hs))
        raw_cases(srv)
    finally:
        rc = srv.stop()
        report("serve_bad_exit0", rc == 0, "exit %s" % rc)


def raw(srv, data, read=True):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30 * SLOW)
    s.sendall(data)
    got = b""
    if read:
        s.shutdown(socket.SHUT_WR)
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                got += d
        except socket.timeout:
            pass
    s.close()
    return got


def raw_cases(srv):
    got = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n")
    report("serve_bad_headers_no_body", got.startswith(b"HTTP/1.1 400") and b'"error"' in got, got[:200])
    raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\"", read=False)
    got = raw(srv, b"GARBAGE\r\n\r\n")
    st, _, _ = request(srv, "GET", "/health")
    report("serve_bad_short_body_and_garbage", st == 200, "health %d" % st)
    st, _, data = request(srv, "GET", "/v1/nothing")
    report("serve_bad_unknown_route", st == 404 and "error" in json.loads(data), (st, data[:200]))
    st, _, data = request(srv, "GET", "/v1/completions")
    report("serve_bad_wrong_method", st == 405, (st, data[:200]))


# --- SIGTERM ------------------------------------------------------------------
def stream_one(srv, body, first_event):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120 * SLOW)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    text, fin, done = "", None, False
    seen = []
    for line in r:
        line = line.decode().strip()
        seen.append(line)
        if not line.startswith("data: "):
            continue
        first_event.set()
        if line == "data: [DONE]":
            done = True
            break
        ch = json.loads(line[6:])["choices"][0]
        text += ch["text"]
        fin = ch["finish_reason"] or fin
    c.close()
    openai_check.check("/v1/completions", r.status, r.getheader("Content-Type"), "\n".join(seen))
    return text, fin, done


def wait_draining(srv):
    """Wait until the server has stopped taking requests (/health says 503)."""
    for _ in range(600 * SLOW):  # a guard only: the signal's handling ends it
        try:
            if request(srv, "GET", "/health")[0] == 503:
                return True
        except (ConnectionError, OSError):
            return True  # already closed: also no request is taken
        time.sleep(0.05)
    return False


def part_sigterm():
    # The grace period runs on the decision clock (src/core/clock.h); here a
    # file that is never written, so it stands still: the streams finish
    # inside the grace however slow the machine.
    srv = Server("--grace", "60", env={"LOOM_TEST_CLOCK": "file:/nonexistent/loom-test-clock"})
    try:
        evs = [threading.Event() for _ in range(4)]
        res = [None] * 4
        body = {"prompt": "the cat", "max_tokens": 120, "temperature": 0, "stream": True}
        full = greedy(srv, "the cat", 120)
        ts = [threading.Thread(target=lambda i=i: res.__setitem__(i, stream_one(srv, body, evs[i]))) for i in range(4)]
        for t in ts:
            t.start()
        for e in evs:
            e.wait(60 * SLOW)
        srv.p.send_signal(signal.SIGTERM)
        wait_draining(srv)
        try:
            st, _, j = post(srv, {"prompt": "a", "max_tokens": 1})
            late = st == 503 and j["error"]["code"] == "shutting_down"
        except (ConnectionError, OSError):
            late = True  # already closed: also no request is taken
        for t in ts:
            t.join()
        t0 = time.time()
        try:
            rc = srv.p.wait(90 * SLOW)
        except subprocess.TimeoutExpired:
            rc = None
        report("serve_sigterm_streams_finish", all(r and r == (full, "length", True) for r in res),
               [r and (r[0][:20], r[1], r[2]) for r in res])
        report("serve_sigterm_refuses_new", late, "a request during the drain was not refused with 503")
        report("serve_sigterm_exit0", rc == 0, "exit %s after %.1f s" % (rc, time.time() - t0))
    finally:
        srv.stop()
    # --grace 0 with a stream held after its 3rd token (LOOM_TEST_SERVE_HOLD=3):
    # the stream is in flight at SIGTERM on any machine, and must be cut
    # with [DONE] and a finish reason OpenAI's API defines ("length": the
    # output ended short; loom's metrics call it "abort").
    srv = Server("--grace", "0", env={"LOOM_TEST_SERVE_HOLD": "3"})
    try:
        ev = threading.Event()
        res = [None]
        body = {"prompt": "the", "max_tokens": 240, "temperature": 0, "stream": True}
        t = threading.Thread(target=lambda: res.__setitem__(0, stream_one(srv, body, ev)))
        t.start()
        ev.wait(60 * SLOW)
        srv.p.send_signal(signal.SIGTERM)
        t.join(120 * SLOW)
        rc = srv.p.wait(60 * SLOW)
        r = res[0]
        report("serve_sigterm_grace_cancels", rc == 0 and r and r[2] and r[1] == "length" and len(r[0]) < 240,
               "exit %s, stream %s after %d bytes" % (rc, r and r[1:], len(r[0]) if r else 0))
    finally:
        srv.stop()


# --- the model's own chat template (Jinja) ---------------------------------------
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
          "You are helpful.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
ALTERNATE = ("{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}")


def part_chattemplate():
    """--chat-template with a Jinja template: the chat endpoint's prompt is the
    template rendered as jinja2 renders it (tests/chat_template_oracle.py's
    setup); a template error is a 400 naming it; a construct loom does not
    implement stops the server at start, named."""
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chat_template_oracle
    d = tempfile.mkdtemp(prefix="loom-chat-")
    paths = {}
    for name, text in (("chatml", CHATML), ("alternate", ALTERNATE), ("macro", "{% macro f() %}x{% endmacro %}")):
        paths[name] = os.path.join(d, name + ".jinja")
        with open(paths[name], "w") as f:
            f.write(text)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the dog"}]
    job = {"template": CHATML, "messages": msgs, "add_generation_prompt": True}
    import jinja2.sandbox, jinja2.ext
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    rendered = chat_template_oracle.render(env, job)["text"]
    srv = Server("--chat-template", paths["chatml"])
    try:
        st, _, j = post(srv, {"messages": msgs, "max_tokens": 10, "temperature": 0}, path="/v1/chat/completions")
        want = greedy(srv, rendered, n=10)
        report("serve_chat_jinja_template", st == 200 and j["choices"][0]["message"]["content"] == want,
               "%s %r vs %r" % (st, j, want))
    finally:
        srv.stop()
    srv = Server("--chat-template", paths["alternate"])
    try:
        st, _, j = post(srv, {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 4},
                        path="/v1/chat/completions")
        report("serve_chat_template_raises_400", st == 400 and "must alternate" in j["error"]["message"], (st, j))
    finally:
        srv.stop()
    p = subprocess.run([LOOM, "serve", "--port", "0", "--run", RUN, "--chat-template", paths["macro"]],
                       capture_output=True, text=True, timeout=120 * SLOW)
    report("serve_chat_template_refused", p.returncode != 0 and "macro" in p.stderr, (p.returncode, p.stderr[-400:]))


for part in PARTS:
    try:
        globals()["part_" + part]()
    except Exception as e:
        import traceback
        traceback.print_exc()
        report("serve_" + part, False, repr(e))
if openai_check.checked["objects"] + openai_check.checked["chunks"]:
    openai_check.report(report)
