#!/usr/bin/env bash
# Every metric the shipped dashboards and alerts use is one loom exports:
# a real `loom train` and a real `loom serve` (both reading the NVML
# stand-in, tests/obs_nvml_stub.c, for the GPU series) are scraped, each
# scrape passes `promtool check metrics`, and every loom_*, process_* and
# DCGM_FI_* name in deploy/grafana/*.json and deploy/prometheus/*.yml
# (queries and rules) is in one of them. Also: `promtool check config`,
# `check rules` and `test rules` (each alert fires on its input series,
# none on a healthy run); the training endpoint lingers until the final
# state is scraped (loom_train_state finished, the last step); serve's
# 400/404/413 answers are OpenAI-style JSON and counted by status code,
# request_success_total counts requests; headless Chromium draws the serve
# dashboard page with its latency, error and model charts holding points
# (LOOM_SAVE_SCREENSHOT=PATH keeps the screenshot: docs/dashboard-serve.png).
# NAMES_FILES="a.json b.yml" checks other dashboard/rule files (to see the
# check fail on the old dashboard, for one).
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY=/usr/bin/python3
tmp=$(mktemp -d /tmp/loom-obsnames-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
if ! command -v promtool > /dev/null; then
    echo "SKIP obs_names: promtool not installed (Debian package prometheus)"; exit 0
fi
if ! cc -shared -fPIC -o "$tmp/libnvidia-ml.so.1" tests/obs_nvml_stub.c 2> "$tmp/cc.log"; then
    echo "FAIL obs_names_stub: cannot build the NVML stand-in: $(cat "$tmp/cc.log")"; exit 1
fi
export LOOM_NVML_LIB=$tmp/libnvidia-ml.so.1 LOOM_NVML_DEVICE=GPU-stub-0 NVML_STUB_XID=0
# wait_for FILE REGEX SECONDS: the first match of REGEX in FILE (the seconds only guard a hang).
wait_for() {
    for _ in $(seq 1 $(($3 * 10))); do
        m=$(grep -oE "$2" "$1" 2>/dev/null | head -1)
        [ -n "$m" ] && { echo "$m"; return 0; }
        sleep 0.1
    done
    return 1
}
free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
tport=$(free_port); sport=$(free_port); pport=$(free_port)
# A real Prometheus (with loom's alert rules) scrapes a second training run
# and the server every second.
if command -v prometheus > /dev/null; then
    cat > "$tmp/prom.yml" <<EOF2
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ['$PWD/deploy/prometheus/loom-rules.yml']
scrape_configs:
  - job_name: loom-train
    static_configs: [{targets: ['127.0.0.1:$tport']}]
  - job_name: loom-serve
    static_configs: [{targets: ['127.0.0.1:$sport']}]
EOF2
    prometheus --config.file="$tmp/prom.yml" --storage.tsdb.path="$tmp/tsdb" --web.listen-address="127.0.0.1:$pport" > "$tmp/prom.log" 2>&1 &
    pids+=($!)
fi
$PY -c "import random; random.seed(5); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.']) for _ in range(20000)))" > "$tmp/text.txt"

# ---- training: 6 steps, then the endpoint lingers until scraped ----
$LOOM train --data "$tmp/text.txt" --layers 2 --heads 2 --channels 64 --context 32 --batch 4 --seq 32 --steps 6 --eval-every 3 \
    --eval-batches 1 --ckpt-every 3 --sample-tokens 0 --threads 1 --out "$tmp/run" --metrics-port 0 --metrics-linger 600 > "$tmp/train.log" 2>&1 &
tpid=$!; pids+=($tpid)
if ! wait_for "$tmp/train.log" 'stays up until it is scraped' 300 > /dev/null; then
    echo "FAIL obs_train_linger: no linger line:"; tail -5 "$tmp/train.log"; exit 1
fi
url=$(grep -oE 'http://127\.0\.0\.1:[0-9]+' "$tmp/train.log" | head -1)
$PY -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=60).read().decode())" "$url/metrics" > "$tmp/train.txt"
wait $tpid; rc=$?
grep -q '^loom_train_state{rank="0",state="finished"} 1$' "$tmp/train.txt" && grep -q '^loom_train_step{rank="0"} 6$' "$tmp/train.txt" && [ $rc = 0 ] \
    && echo "PASS obs_train_final_state_scraped (the linger ended at the scrape)" \
    || echo "FAIL obs_train_final_state_scraped: exit $rc, $(grep -E '^loom_train_(state|step)\{' "$tmp/train.txt" | tr '\n' ' ')"

# ---- the same run scraped by Prometheus only: its scrape after the end ends the linger ----
if command -v prometheus > /dev/null; then
    $LOOM train --data "$tmp/text.txt" --layers 2 --heads 2 --channels 64 --context 32 --batch 4 --seq 32 --steps 40 --eval-every 0 \
        --ckpt-every 0 --sample-tokens 0 --threads 1 --out "$tmp/prun" --metrics-port "$tport" --metrics-linger 600 > "$tmp/prun.log" 2>&1
    echo "prun exit $?" >> "$tmp/prun.log"
fi

# ---- serving: completions, errors, then a scrape ----
$LOOM serve --run "$tmp/run" --port "$sport" > "$tmp/serve.log" 2>&1 &
pids+=($!)
surl=$(wait_for "$tmp/serve.log" 'ready on http://[0-9.]+:[0-9]+' 120 | grep -oE 'http://.*')
if [ -z "$surl" ]; then echo "FAIL obs_serve_start:"; tail -5 "$tmp/serve.log"; exit 1; fi
$PY - "$surl" "$tmp" "${LOOM_SAVE_SCREENSHOT:-}" <<'PY'
import json, re, shutil, subprocess, sys, threading, time, urllib.request, urllib.error
base, tmp, save = sys.argv[1], sys.argv[2], sys.argv[3]
def req(path, body=None, method=None):
    r = urllib.request.Request(base + path, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=120) as f:
            return f.status, f.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
def report(name, ok, why=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
errs = {}
errs[400] = req("/v1/completions", b'{"prompt": "the", "max_tokens": -1}')
errs[404] = req("/nope")
errs[413] = req("/v1/completions", b'{"prompt": "' + b"a" * (17 << 20) + b'"}')
def openai_shape(st, body):
    try:
        e = json.loads(body)["error"]
        return all(k in e for k in ("message", "type", "param", "code"))
    except Exception:
        return False
bad = {c: (st, b[:120]) for c, (st, b) in errs.items() if st != c or not openai_shape(st, b)}
report("obs_serve_errors_openai_json (400, 404, 413 above 16 MiB)", not bad, str(bad))
# Traffic while the dashboard samples: one request after another (n = 2
# samples each) until the serve page's latency and error charts hold points.
stop = threading.Event()
done = [0]
def traffic():
    while not stop.is_set():
        st, _ = req("/v1/completions", json.dumps({"prompt": "in the beginning", "max_tokens": 8, "n": 2, "temperature": 0.8}).encode())
        done[0] += st == 200
        req("/v1/completions", b'{"prompt": ""}')  # a 400 for the errors chart
t = threading.Thread(target=traffic); t.start()
need = ["Inter-token latency (ms)", "End-to-end request latency (ms)", "Errors (responses/s)", "Time to first token (ms)"]
def points(d, title):
    c = [c for c in d["charts"] if c["title"] == title]
    return sum(1 for row in c[0]["data"] if any(v is not None for v in row[1:])) if c else -1
deadline, d = time.time() + 300, None
while time.time() < deadline:
    d = json.loads(req("/dashboard.json")[1])
    if all(points(d, n) >= 3 for n in need):
        break
    time.sleep(0.5)
stop.set(); t.join()
got = {n: points(d, n) for n in need}
report("obs_serve_dashboard_new_charts_have_points", all(v >= 3 for v in got.values()), str(got))
report("obs_serve_dashboard_model_and_device", "on cpu" in d["title"] and any("model" in n and "cpu" in n for n in d["notes"]),
       "title %r notes %r" % (d["title"], d["notes"]))
m = req("/metrics")[1].decode()
open(tmp + "/serve.txt", "w").write(m)
def val(name, labels):
    r = re.search(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(labels)), m, re.M)
    return float(r.group(1)) if r else None
codes = {c: val("loom_serve_http_responses_total", 'code="%d"' % c) for c in (200, 400, 404, 413)}
report("obs_serve_responses_by_code", codes[404] == 1 and codes[413] == 1 and codes[400] >= done[0] + 1 and codes[200] >= done[0],
       "%s with %d completions" % (codes, done[0]))
# n = 2 samples per request, counted once per request (as vLLM does).
succ = sum(val("loom_serve_request_success_total", 'model="run",finish_reason="%s"' % r) or 0 for r in ("length", "stop", "abort"))
hist = val("loom_serve_request_generation_tokens_count", 'model="run"')
report("obs_serve_success_counts_requests", succ == done[0] == hist, "success_total %s, generation histogram %s, requests %d" % (succ, hist, done[0]))
open(tmp + "/served.txt", "w").write("%d %d\n" % (done[0], val("loom_serve_request_generation_tokens_sum", 'model="run"') or -1))
# The serve page in headless Chromium: the new charts drawn, a screenshot that is not blank.
shot = tmp + "/serve.png"
common = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + tmp + "/chrome",
          "--virtual-time-budget=8000"]
dom = subprocess.run(common + ["--dump-dom", base + "/"], capture_output=True, text=True, timeout=120, cwd=tmp).stdout
subprocess.run(common + ["--window-size=1440,1400", "--screenshot=" + shot, base + "/"], capture_output=True, timeout=120, cwd=tmp)
charts = {m.group(1): int(m.group(2)) for m in re.finditer(r'<div class="chart" id="chart\d+" data-title="([^"]*)" data-points="(\d+)"', dom)}
report("obs_serve_page_charts_drawn", all(charts.get(n, 0) >= 3 for n in need) and dom.count("<canvas") >= 2 * len(need), str(charts))
import struct, zlib
try:
    png = open(shot, "rb").read()
    w, h = struct.unpack(">II", png[16:24])
    idat, i = b"", 8
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        idat += png[i + 8:i + 8 + n] if kind == b"IDAT" else b""
        i += 12 + n
    raw = zlib.decompress(idat)
    ok = w >= 800 and len(set(raw)) > 40
    report("obs_serve_page_screenshot_not_blank (%dx%d)" % (w, h), ok, "%d byte values" % len(set(raw)))
    if ok and save:
        shutil.copyfile(shot, save)
except Exception as e:
    report("obs_serve_page_screenshot_not_blank", False, str(e))
PY

# ---- promtool on both scrapes; every dashboard and rule name exported ----
for f in train serve; do
    out=$(promtool check metrics < "$tmp/$f.txt" 2>&1) && echo "PASS obs_promtool_${f}_with_gpu_series" \
        || echo "FAIL obs_promtool_${f}_with_gpu_series: $out"
done
$PY - "$tmp/train.txt" "$tmp/serve.txt" ${NAMES_FILES:-deploy/grafana/*.json deploy/prometheus/*.yml} <<'PY'
import json, re, sys
exported = set()
for f in sys.argv[1:3]:
    for line in open(f):
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if m and not line.startswith("#"):
            exported.add(m.group(1))
            exported.add(re.sub(r"_(bucket|sum|count)$", "", m.group(1)))
used = {}
for f in sys.argv[3:]:
    text = open(f).read()
    exprs = [t["expr"] for p in json.loads(text)["panels"] for t in p.get("targets", [])] if f.endswith(".json") \
        else re.findall(r"(?:expr|series): *['|]?([^\n]*(?:\n {10,}[^\n]*)*)", text)
    for e in exprs:
        e = re.sub(r'"[^"]*"', '""', e)  # label values
        for n in re.findall(r"\b(loom_[a-z0-9_]+|process_[a-z_]+|DCGM_FI_[A-Z0-9_]+)\b", e):
            used.setdefault(n, f)
missing = {n: f for n, f in used.items() if n not in exported}
print(("PASS" if used and not missing else "FAIL") + " obs_dashboard_and_rule_names_exported (%d names)" % len(used) +
      ("" if not missing else ": not in a train or serve scrape: %s" % missing))
PY
(cd deploy/prometheus && promtool check config prometheus.yml > "$tmp/pc.log" 2>&1) && echo "PASS obs_promtool_check_config_and_rules" \
    || echo "FAIL obs_promtool_check_config_and_rules: $(cat "$tmp/pc.log")"
(cd deploy/prometheus && promtool test rules loom-rules.test.yml > "$tmp/pt.log" 2>&1) \
    && echo "PASS obs_promtool_test_rules (7 alerts fire on their input, none on a healthy run)" \
    || echo "FAIL obs_promtool_test_rules: $(cat "$tmp/pt.log")"

# ---- what Prometheus recorded equals what loom logged ----
if command -v prometheus > /dev/null; then
    $PY - "http://127.0.0.1:$pport" "$tmp" <<'PY'
import json, math, re, sys, time, urllib.parse, urllib.request
base, tmp = sys.argv[1], sys.argv[2]
def q(expr):
    u = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    r = json.loads(urllib.request.urlopen(u, timeout=10).read())["data"]["result"]
    return [float(x["value"][1]) for x in r]
def report(name, ok, why=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
log = open(tmp + "/prun.log").read()
rows = [json.loads(l) for l in open(tmp + "/prun/metrics.jsonl")]
served, gen_sum = map(float, open(tmp + "/served.txt").read().split())
want = {"step": rows[-1]["step"], "served": served}
deadline, got = time.time() + 120, {}
while time.time() < deadline:  # Prometheus's scrape of the server after the traffic
    try:
        got = {"step": q('max_over_time(loom_train_step{job="loom-train"}[10m])'),
               "finished": q('max_over_time(loom_train_state{job="loom-train",state="finished"}[10m])'),
               "served": q('sum(loom_serve_request_success_total{job="loom-serve"})'),
               "gen": q('sum(loom_serve_request_generation_tokens_sum{job="loom-serve"})')}
        if got["served"] and got["served"][0] >= served and got["finished"]:
            break
    except Exception:
        pass
    time.sleep(0.5)
report("obs_prometheus_saw_the_end_of_the_run (state finished, step %s)" % want["step"],
       "prun exit 0" in log and got.get("step") == [want["step"]] and got.get("finished") == [1.0], "%s; %s" % (got, log[-200:]))
report("obs_prometheus_serve_requests_equal_sent (%d requests)" % served,
       got.get("served") == [served] and got.get("gen") == [gen_sum], "%s, sent %d, generated %s" % (got, served, gen_sum))
# The peak behind MFU is the one the log names (GFLOP/s to 0.1).
peak = q('max_over_time(loom_train_peak_flops_per_second{job="loom-train"}[10m])')
m = re.search(r"peak measured .*?: ([0-9.]+) GFLOP/s", log)
raised = "above the measured peak" in log
report("obs_prometheus_peak_flops_as_logged", peak and m and (raised or "%.1f" % (peak[0] / 1e9) == m.group(1)),
       "prometheus %s, log %s" % (peak, m and m.group(1)))
# Step-time quantiles from the fine buckets against the exact ones from metrics.jsonl.
steps = sorted(r["step_s"] for r in rows)
bad = []
for qq in (0.5, 0.9):
    est = q('histogram_quantile(%g, max_over_time(loom_train_step_seconds_bucket{job="loom-train"}[10m]))' % qq)
    exact = steps[min(len(steps) - 1, int(math.ceil(qq * len(steps))) - 1)]
    # Both lie in the bucket holding the ceil(q n)-th step: apart by at most its
    # width, 28% of its lower bound at most (0.25..0.32); metrics.jsonl rounds to 0.1 ms.
    if not est or abs(est[0] - exact) > 0.28 * exact + 2e-4:
        bad.append((qq, est, exact))
report("obs_prometheus_step_quantiles_within_a_bucket", not bad, str(bad))
# The alert rules evaluated, and none fires on these healthy runs.
groups = json.loads(urllib.request.urlopen(base + "/api/v1/rules", timeout=10).read())["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
alerts = json.loads(urllib.request.urlopen(base + "/api/v1/alerts", timeout=10).read())["data"]["alerts"]
report("obs_prometheus_alerts_silent_on_healthy_runs (%d rules)" % len(rules),
       len(rules) == 7 and all(r["health"] == "ok" for r in rules) and not alerts, "rules %s, alerts %s" % (
           [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"], alerts))
PY
else
    echo "SKIP obs_prometheus_names: prometheus not installed (Debian package prometheus)"
fi
