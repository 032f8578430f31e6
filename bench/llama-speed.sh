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
#       continuous batching; llama-batched-bench -npl 16's. Every loom
#       request has a prompt of its own (none from the prefix cache: the
#       batched bench computes each prompt too), and loom runs with
#       --prefill-ratio ${PREFILL_RATIO:-0}: 0 lets prompts fill the step
#       beside decodes, throughput first, as the batched bench computes its
#       prompts at full batch; the serving default (1) bounds running
#       sequences' inter-token latency instead (PREFILL_RATIO=1 measures it)
#
#   ROUNDS=3 PLEN=64 GEN=32 bench/llama-speed.sh FILE.gguf ...
# loom's KV cache is sized for what each round runs (bench generate's
# --kv-memory auto; KV_MEMORY=SIZE overrides it, KV_DTYPE=int8 for an int8
# cache), so llama-3.2-1b's 131072-token context needs no setting. llama.cpp
# from LOOM_LLAMA_DIR (default .cache/llama.cpp; bench/llama-build.sh). Each
# round prints the load average before and after it and how busy the CPUs
# were meanwhile (all processes, this one included). Both sides run with
# OpenMP's default wait policy (llama-bench is started by bench generate and
# inherits its environment: an OMP_WAIT_POLICY=passive here slowed
# llama.cpp's decode by a third on a quiet machine, so none is set).
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
LLAMA_BIN="${LOOM_LLAMA_DIR:-$ROOT/.cache/llama.cpp}/build/bin"
KVFLAG=()
[[ -n "${KV_MEMORY:-}" ]] && KVFLAG=(--kv-memory "$KV_MEMORY")
# busy share of all CPUs since the last call (/proc/stat: user..steal over all)
cpu_prev=()
cpu_busy() {
    local -a c
    read -ra c < /proc/stat
    c=("${c[@]:1}") # less the "cpu" label
    local idle=$((c[3] + c[4])) total=0 v
    for v in "${c[@]:0:8}"; do total=$((total + v)); done
    if ((${#cpu_prev[@]})); then
        local dt=$((total - cpu_prev[0])) di=$((idle - cpu_prev[1]))
        ((dt > 0)) && echo "$(( (100 * (dt - di)) / dt ))%" || echo "-"
    fi
    cpu_prev=("$total" "$idle")
}
out=$(mktemp -d /tmp/loom-llama-speed-XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for f in "$@"; do
    for ((r = 1; r <= ROUNDS; r++)); do
        load0=$(cut -d' ' -f1 /proc/loadavg)
        cpu_busy > /dev/null
        $LOOM bench generate --run "$f" --threads "$THREADS" --repeat 1 "${KVFLAG[@]}" --kv-dtype "${KV_DTYPE:-fp32}" \
            --llama-bench "$LLAMA_BIN/llama-bench" --prompt-len "$PLEN" --gen "$GEN" --concurrency 1,16 --prefill-ratio "${PREFILL_RATIO:-0}" > "$out/r$r.txt" 2>&1 \
            || { tail -n 5 "$out/r$r.txt"; exit 1; }
        echo "  $f round $r (loom, then llama.cpp) done at $(date -u +%H:%M:%S): load $load0 -> $(cut -d' ' -f1 /proc/loadavg), CPUs $(cpu_busy) busy"
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
