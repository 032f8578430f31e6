#!/usr/bin/env bash
# loom against llama.cpp on llama.cpp's own GGUF files (issue 23's speed
# table, docs/perf.md): for each FILE, ROUNDS invocations of `loom bench
# generate --run FILE` (loom one request at a time and 16 in flight, then
# llama.cpp's llama-bench and llama-batched-bench on the same file: the
# sides alternate round by round), and the medians (min-max) of
#   decode tok/s, one stream: loom's tokens after the first over their time;
#       llama-bench tg
#   prompt tok/s: loom's PLEN / time to first token, one request at a time;
#       llama-bench pp
#   16 in flight, output tok/s over the whole run (prefill included): loom's
#       continuous batching; llama-batched-bench -npl 16's
#
#   ROUNDS=3 PLEN=64 GEN=32 bench/llama-speed.sh FILE.gguf ...
# (KV_MEMORY: loom's --kv-memory, at least one full context: 9G for llama-3.2-1b's 131072
# tokens, or KV_DTYPE=int8 KV_MEMORY=2400M)
# The files: bench/llama_random.py makes a transformers folder of
# smollm2-135m's or llama-3.2-1b's shape, bench/llama_convert.py converts
# it, llama-quantize makes Q4_K_M, Q6_K, Q8_0 (see docs/perf.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LOOM=${LOOM:-build/loom}
ROUNDS=${ROUNDS:-3}
PLEN=${PLEN:-64}
GEN=${GEN:-32}
THREADS=${THREADS:-2}
out=$(mktemp -d /tmp/loom-llama-speed-XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for f in "$@"; do
    for ((r = 1; r <= ROUNDS; r++)); do
        OMP_WAIT_POLICY=passive $LOOM bench generate --run "$f" --threads "$THREADS" --repeat 1 --kv-memory "${KV_MEMORY:-512M}" --kv-dtype "${KV_DTYPE:-fp32}" \
            --prompt-len "$PLEN" --gen "$GEN" --concurrency 1,16 > "$out/r$r.txt" 2>&1 || { tail -n 5 "$out/r$r.txt"; exit 1; }
        echo "  $f round $r done at $(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg)"
    done
    /usr/bin/python3 - "$f" "$PLEN" "$out"/r*.txt <<'PY'
import re, statistics, sys
f, plen, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cols = {k: [] for k in ("ld", "lp", "l16", "cd", "cp", "c16", "bw")}
for p in files:
    t = open(p).read()
    m = re.search(r"one request at a time\s+([\d.]+)\s+\S+\s+(\d+)\s+[\d.]+x\s+([\d.]+)", t)
    if m:
        cols["ld"].append(float(m.group(3))); cols["lp"].append(plen / (float(m.group(2)) / 1000))
    m = re.search(r"continuous batching, 16\s+([\d.]+)", t)
    if m: cols["l16"].append(float(m.group(1)))
    m = re.search(r"llama-bench\s+([\d.]+).*prompt processing", t)
    if m: cols["cp"].append(float(m.group(1)))
    m = re.search(r"llama-bench\s+([\d.]+).*generation", t)
    if m: cols["cd"].append(float(m.group(1)))
    m = re.search(r"batched-bench\s+([\d.]+)\s+output tokens/s", t)
    if m: cols["c16"].append(float(m.group(1)))
    m = re.search(r"memory read bandwidth ([\d.]+) GB/s", t)
    if m: cols["bw"].append(float(m.group(1)))
def med(v):
    return "%.1f (%.1f-%.1f)" % (statistics.median(v), min(v), max(v)) if v else "-"
def ratio(a, b):
    return "%.2fx" % (statistics.median(cols[a]) / statistics.median(cols[b])) if cols[a] and cols[b] else "-"
print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
    f.split("/")[-2] + " " + f.split("/")[-1].replace(".gguf", ""), med(cols["ld"]), med(cols["cd"]), ratio("ld", "cd"),
    med(cols["lp"]), med(cols["cp"]), ratio("lp", "cp"), med(cols["l16"]), med(cols["c16"]), ratio("l16", "c16"), med(cols["bw"])))
PY
done
