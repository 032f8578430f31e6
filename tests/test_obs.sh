#!/usr/bin/env bash
# Observability end to end, against real tools: a `loom train
# --metrics-port` run's /metrics passes Debian's promtool; a real
# Prometheus scrapes it and its HTTP API returns loom's series with
# plausible values (tokens/s above zero, step increasing) and evaluates
# every query of deploy/grafana/loom.json; headless Chromium renders the
# dashboard page with data points in its charts, "no GPU telemetry" in the
# GPU charts of a CPU run, and a screenshot that is not blank; two ranks
# serve on the port plus their local rank; a busy port and a missing
# charting library give one-line reasons; `loom devices` reads an NVML
# stand-in's values and says why without one.
#
# LOOM_SAVE_SCREENSHOT=PATH keeps the screenshot (docs/dashboard.png).
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY=/usr/bin/python3
tmp=$(mktemp -d /tmp/loom-obs-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
$PY -c "import random; random.seed(4); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.']) for _ in range(40000)))" > "$tmp/text.txt"
# A tiny model that trains until stopped; each step takes milliseconds.
TRAIN=(train --data "$tmp/text.txt" --layers 2 --heads 2 --channels 64 --context 32 --batch 4 --seq 32 --lr 3e-3 --warmup 50
       --steps 1000000 --eval-every 20 --eval-batches 1 --ckpt-every 0 --sample-tokens 0 --log-every 1000000 --threads 1)
free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
get() { $PY - "$1" <<'PY'
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except Exception as e:
    print("GET failed:", e)
    sys.exit(1)
PY
}
# wait_for FILE REGEX SECONDS: the first match of REGEX's group 1 in FILE.
wait_for() {
    for _ in $(seq 1 $(($3 * 10))); do
        m=$(grep -oE "$2" "$1" 2>/dev/null | head -1)
        [ -n "$m" ] && { echo "$m"; return 0; }
        sleep 0.1
    done
    return 1
}

$LOOM "${TRAIN[@]}" --out "$tmp/run" --metrics-port 0 > "$tmp/run.log" 2>&1 &
pids+=($!)
url=$(wait_for "$tmp/run.log" 'http://127\.0\.0\.1:[0-9]+' 60)
if [ -z "$url" ]; then
    echo "FAIL obs_metrics_endpoint: no 'metrics on http://...' line:"; tail -5 "$tmp/run.log"; exit 1
fi
wait_for "$tmp/run.log" 'no GPU telemetry[^\n]*' 60 > /dev/null && echo "PASS obs_telemetry_status_logged" \
    || echo "FAIL obs_telemetry_status_logged: $(head -5 "$tmp/run.log")"
want_series="loom_train_step loom_train_loss loom_train_val_loss loom_train_learning_rate loom_train_grad_norm
loom_train_tokens_per_second loom_train_flops_per_second loom_train_mfu_ratio loom_train_compute_seconds
loom_train_comm_wait_seconds loom_train_data_wait_seconds loom_train_skipped_steps_total loom_train_step_seconds_bucket
loom_train_checkpoint_write_seconds_count process_resident_memory_bytes loom_train_info"
# Scrape until every series is there (the validation loss comes at step
# 20), however long the machine takes; the 120 s is only a guard.
for _ in $(seq 1 600); do
    get "$url/metrics" > "$tmp/metrics.txt"
    missing=""
    for s in $want_series; do grep -q "^$s{[^}]*rank=\"0\"" "$tmp/metrics.txt" || missing="$missing $s"; done
    [ -z "$missing" ] && break
    sleep 0.2
done
[ -z "$missing" ] && echo "PASS obs_training_series" || { echo "FAIL obs_training_series: missing$missing"; head -20 "$tmp/metrics.txt"; }

if command -v promtool > /dev/null; then
    out=$(promtool check metrics < "$tmp/metrics.txt" 2>&1) && echo "PASS obs_promtool_training_exposition" \
        || echo "FAIL obs_promtool_training_exposition: $out"
else
    echo "SKIP obs_promtool_training_exposition: promtool not installed (Debian package prometheus)"
fi

# ---- a real Prometheus scraping the run ----
prom_check() {
    local pport; pport=$(free_port)
    local target=${url#http://}
    cat > "$tmp/prom.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: loom-train
    static_configs: [{targets: ['$target']}]
EOF
    prometheus --config.file="$tmp/prom.yml" --storage.tsdb.path="$tmp/tsdb" --web.listen-address="127.0.0.1:$pport" \
        > "$tmp/prom.log" 2>&1 &
    pids+=($!)
    $PY - "http://127.0.0.1:$pport" deploy/grafana/loom.json <<'PY'
import json, sys, time, urllib.parse, urllib.request
base, dash = sys.argv[1], sys.argv[2]
def q(expr):
    u = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.loads(urllib.request.urlopen(u, timeout=10).read())
def value(expr):
    r = q(expr)["data"]["result"]
    return float(r[0]["value"][1]) if r else None
deadline, steps = time.time() + 180, []  # a guard: the loop ends at the second rising sample
while time.time() < deadline and len(steps) < 2:
    try:
        s = value('loom_train_step{job="loom-train",rank="0"}')
        if s is not None and (not steps or s > steps[-1]):
            steps.append(s)
    except Exception:
        pass
    time.sleep(1)
ok = len(steps) >= 2 and steps[1] > steps[0]
print(("PASS" if ok else "FAIL") + " obs_prometheus_step_increasing" + ("" if ok else ": loom_train_step samples %s" % steps))
tps = value('loom_train_tokens_per_second{job="loom-train"}')
ok = tps is not None and tps > 0
print(("PASS" if ok else "FAIL") + " obs_prometheus_tokens_per_s" + (" (%.0f tokens/s)" % tps if ok else ": %s" % tps))
loss = value("loom_train_loss")
ok = loss is not None and 0 < loss < 10
print(("PASS" if ok else "FAIL") + " obs_prometheus_loss_plausible" + ("" if ok else ": %s" % loss))
# Every query of the Grafana dashboard is valid PromQL here, and the
# training ones find data.
exprs = [(p["title"], t["expr"]) for p in json.load(open(dash))["panels"] for t in p.get("targets", [])]
bad, empty = [], []
for title, e in exprs:
    e2 = e.replace("$job", ".*")
    try:
        r = q(e2)
        if r.get("status") != "success":
            bad.append((title, e, r))
        elif title in ("Loss", "Tokens/s", "MFU", "Step time") and not r["data"]["result"]:
            empty.append((title, e))
    except Exception as ex:
        bad.append((title, e, str(ex)))
print(("PASS" if not bad else "FAIL") + " obs_grafana_queries_valid (%d queries)" % len(exprs) + ("" if not bad else ": %s" % bad[:3]))
print(("PASS" if not empty else "FAIL") + " obs_grafana_training_panels_have_data" + ("" if not empty else ": %s" % empty))
PY
}
if command -v prometheus > /dev/null; then
    prom_check
else
    echo "SKIP obs_prometheus: prometheus not installed (Debian package prometheus)"
fi

# ---- the dashboard in headless Chromium ----
browser_check() {
    local shot="$tmp/dashboard.png"
    (cd "$tmp" && timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/chrome" \
        --virtual-time-budget=8000 --dump-dom "$url/" > "$tmp/dom.html" 2> "$tmp/chrome.log")
    (cd "$tmp" && timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/chrome" \
        --virtual-time-budget=8000 --window-size=1440,1000 --screenshot="$shot" "$url/" >> "$tmp/chrome.log" 2>&1)
    $PY - "$tmp/dom.html" "$shot" "${LOOM_SAVE_SCREENSHOT:-}" <<'PY'
import re, shutil, struct, sys, zlib
dom = open(sys.argv[1]).read()
charts = {m.group(1): (int(m.group(2)), m.group(3)) for m in re.finditer(
    r'<div class="chart" id="chart\d+" data-title="([^"]*)" data-points="(\d+)"(?: data-missing="([^"]*)")?', dom)}
need = ["loss", "tokens/s", "MFU (%)", "step time (s)"]
bad = [c for c in need if charts.get(c, (0, None))[0] < 2]
canvases = dom.count("<canvas")
ok = not bad and canvases >= 2 * len(need)
print(("PASS" if ok else "FAIL") + " obs_dashboard_charts_have_points" +
      (" (%s)" % ", ".join("%s: %d" % (c, charts[c][0]) for c in need) if ok else ": charts %s, %d canvases" % (charts, canvases)))
gpu = charts.get("GPU power (W)", (None, None))[1] or ""
ok = gpu.startswith("no GPU telemetry") and "no GPU telemetry" in dom
print(("PASS" if ok else "FAIL") + " obs_dashboard_says_no_gpu_telemetry" + ("" if ok else ": %r" % gpu))
# Not blank: decompress the PNG's pixel data; a blank page is one byte value.
try:
    png = open(sys.argv[2], "rb").read()
    w, h = struct.unpack(">II", png[16:24])
    idat, i = b"", 8
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        if kind == b"IDAT":
            idat += png[i + 8:i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    distinct = len(set(raw))
    odd = sum(1 for b in raw[::7] if b not in (0, 255)) / max(1, len(raw[::7]))
    ok = w >= 800 and h >= 600 and distinct > 40 and odd > 0.005
    print(("PASS" if ok else "FAIL") + " obs_dashboard_screenshot_not_blank (%dx%d, %d byte values, %.1f%% not 0/255)" % (w, h, distinct, 100 * odd))
    if ok and sys.argv[3]:
        shutil.copyfile(sys.argv[2], sys.argv[3])
except Exception as e:
    print("FAIL obs_dashboard_screenshot_not_blank: %s" % e)
PY
}
if command -v chromium > /dev/null; then
    browser_check
else
    echo "SKIP obs_dashboard_browser: chromium not installed (Debian package chromium)"
fi

# ---- the same port again: a one-line reason, exit non-zero ----
port=${url##*:}
out=$($LOOM "${TRAIN[@]}" --steps 2 --out "$tmp/busy" --metrics-port "$port" 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q "in use" && printf '%s' "$out" | grep -q -- "--metrics-port" \
    && echo "PASS obs_busy_port_refused" || echo "FAIL obs_busy_port_refused: exit $rc: $out"
kill "${pids[0]}" 2>/dev/null
wait "${pids[0]}" 2>/dev/null

# ---- two ranks: rank r on the base port + r, each with its rank label ----
base=$($PY -c "
import socket
for p in range(30000, 60000, 7):
    try:
        a = socket.socket(); a.bind(('127.0.0.1', p)); b = socket.socket(); b.bind(('127.0.0.1', p + 1))
        a.close(); b.close(); print(p); break
    except OSError:
        pass")
$LOOM "${TRAIN[@]}" --nproc 2 --out "$tmp/two" --metrics-port "$base" > "$tmp/two.log" 2>&1 &
pids+=($!)
ok=0
for _ in $(seq 1 300); do
    a=$(get "http://127.0.0.1:$base/metrics" 2>/dev/null | grep -c '^loom_train_step{rank="0"}')
    b=$(get "http://127.0.0.1:$((base + 1))/metrics" 2>/dev/null | grep -c '^loom_train_step{rank="1"}')
    [ "$a" = 1 ] && [ "$b" = 1 ] && { ok=1; break; }
    sleep 0.2
done
[ $ok = 1 ] && echo "PASS obs_two_ranks_port_plus_local_rank" || { echo "FAIL obs_two_ranks_port_plus_local_rank:"; tail -5 "$tmp/two.log"; }
for r in 0 1; do get "http://127.0.0.1:$((base + r))/metrics" > "$tmp/rank$r.txt"; done
out=$(promtool check metrics < "$tmp/rank0.txt" 2>&1 && promtool check metrics < "$tmp/rank1.txt" 2>&1) \
    && echo "PASS obs_promtool_two_ranks" || echo "FAIL obs_promtool_two_ranks: $out"
kill "${pids[-1]}" 2>/dev/null
wait "${pids[-1]}" 2>/dev/null

# ---- one job, one peak: a short two-rank run's final scrapes (each rank
# lingers until scraped after its last step, so both show the end) carry
# the same peak FLOP/s: rank 0's measure, raised together when steps beat it ----
$LOOM "${TRAIN[@]}" --nproc 2 --steps 40 --out "$tmp/peak" --metrics-port "$base" --metrics-linger 300 > "$tmp/peak.log" 2>&1 &
pids+=($!)
for r in 0 1; do
    : > "$tmp/final$r.txt"
    for _ in $(seq 1 600); do  # a guard: the run takes seconds
        get "http://127.0.0.1:$((base + r))/metrics" > "$tmp/final$r.txt" 2>/dev/null
        grep -q "^loom_train_state{rank=\"$r\",state=\"finished\"} 1" "$tmp/final$r.txt" && break
        sleep 0.2
    done
done
wait "${pids[-1]}"; rc=$?
p0=$(grep -oP '^loom_train_peak_flops_per_second\{rank="0"\} \K\S+' "$tmp/final0.txt")
p1=$(grep -oP '^loom_train_peak_flops_per_second\{rank="1"\} \K\S+' "$tmp/final1.txt")
steps=$(grep -hoP '^loom_train_step\{rank="[01]"\} \K\S+' "$tmp/final0.txt" "$tmp/final1.txt" | tr '\n' ' ')
[ $rc = 0 ] && [ "$steps" = "40 40 " ] && [ -n "$p0" ] && [ "$p0" = "$p1" ] && echo "PASS obs_two_ranks_same_peak ($p0 FLOP/s)" \
    || { echo "FAIL obs_two_ranks_same_peak: exit $rc, steps '$steps', rank 0 '$p0', rank 1 '$p1'"; tail -3 "$tmp/peak.log"; }

# ---- no charting library: said once, the run still works ----
out=$(LOOM_DYGRAPHS_JS=/nonexistent/dygraph.min.js $LOOM "${TRAIN[@]}" --steps 3 --out "$tmp/nojs" --metrics-port 0 --metrics-linger 0 2>&1); rc=$?
[ $rc = 0 ] && [ "$(printf '%s' "$out" | grep -c 'charting library is missing')" = 1 ] && printf '%s' "$out" | grep -q "libjs-dygraphs" \
    && echo "PASS obs_missing_charting_library_said_once" || echo "FAIL obs_missing_charting_library_said_once: exit $rc: $out"

# ---- energy per token on the CPU: a powercap tree whose counter rises ----
mkdir -p "$tmp/powercap/intel-rapl:0"
echo 262143328850 > "$tmp/powercap/intel-rapl:0/max_energy_range_uj"
# energy_uj is a FIFO that answers every read with a counter 50000 uJ
# above the last: the energy rises with each read, not with the wall
# clock, so a machine fast enough to run 300 steps between two timed
# updates still sees it rise.
mkfifo "$tmp/powercap/intel-rapl:0/energy_uj"
$PY - "$tmp/powercap/intel-rapl:0/energy_uj" <<'PY' 2>/dev/null &
import fcntl, os, struct, sys, termios, time
e = 1000000
while True:
    e += 50000
    fd = os.open(sys.argv[1], os.O_WRONLY)  # blocks until loom opens it to read
    try:
        os.write(fd, b"%d\n" % e)
        # Wait until this one record is read, so a later reader never meets
        # the rest of an older one (the pipe keeps data while a writer is open).
        while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] > 0:
            time.sleep(0.001)
    except OSError:
        pass
    os.close(fd)
PY
pids+=($!)
out=$(LOOM_POWERCAP_ROOT="$tmp/powercap" $LOOM "${TRAIN[@]}" --steps 300 --out "$tmp/energy" 2>&1); rc=$?
$PY - "$tmp/energy/metrics.jsonl" "$rc" "$out" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[2] == "0" else []
e = [r.get("energy_j_per_token") for r in rows]
done = re.search(r"energy: ([0-9.e+-]+) J per trained token", sys.argv[3])
ok = len(rows) == 300 and all(x is not None for x in e) and e[-1] > 0 and done and abs(float(done.group(1)) - e[-1]) <= 1e-3 * e[-1]
print(("PASS" if ok else "FAIL") + " obs_energy_per_token_in_log_and_summary" +
      (" (%.3g J/token)" % e[-1] if ok else ": exit %s, %d rows, last %s, summary %s" % (sys.argv[2], len(rows), e[-1:] , done and done.group(0))))
PY
kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
rm -rf "$tmp/powercap"
out=$($LOOM "${TRAIN[@]}" --steps 3 --out "$tmp/noenergy" 2>&1)
! grep -q energy_j_per_token "$tmp/noenergy/metrics.jsonl" && ! printf '%s' "$out" | grep -q "J per trained token" \
    && echo "PASS obs_no_energy_counter_no_figure" || echo "FAIL obs_no_energy_counter_no_figure: $(head -2 "$tmp/noenergy/metrics.jsonl")"

# ---- loom devices: an NVML stand-in's values, or the reason ----
out=$(LOOM_NVML_LIB=/nonexistent/libnvidia-ml.so.1 $LOOM devices 2>&1); rc=$?
[ $rc -le 2 ] && printf '%s' "$out" | grep -q "GPU telemetry unavailable: cannot load /nonexistent/libnvidia-ml.so.1" \
    && echo "PASS obs_devices_without_nvml" || echo "FAIL obs_devices_without_nvml: exit $rc: $out"
if cc -shared -fPIC -o "$tmp/libnvidia-ml.so.1" tests/obs_nvml_stub.c 2> "$tmp/cc.log"; then
    out=$(LOOM_NVML_LIB="$tmp/libnvidia-ml.so.1" $LOOM devices 2>&1)
    printf '%s' "$out" | grep -q "power 123.5 W" && printf '%s' "$out" | grep -q "memory 1536 / 40960 MiB used, SM clock 1410 MHz, 45 C" \
        && printf '%s' "$out" | grep -q "utilisation 87% (memory 33%)" && echo "PASS obs_devices_nvml_stand_in" \
        || echo "FAIL obs_devices_nvml_stand_in: $out"
    LOOM_NVML_LIB="$tmp/libnvidia-ml.so.1" $LOOM devices --json 2>/dev/null | $PY -c "
import json, sys
d = json.load(sys.stdin)['telemetry']
g = d['gpus'][0]
ok = d['nvml'] == 'ok' and g['power_w'] == 123.456 and g['energy_j'] == 1000 and g['memory_used_bytes'] == 1610612736 and g['mig'] is False
print(('PASS' if ok else 'FAIL') + ' obs_devices_json' + ('' if ok else ': %s' % d))
" || echo "FAIL obs_devices_json: not JSON"
else
    echo "SKIP obs_devices_nvml_stand_in: no C compiler: $(cat "$tmp/cc.log")"
fi
