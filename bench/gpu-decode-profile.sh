#!/usr/bin/env bash
# gpu-decode-profile: where a GPU's single-stream decode time goes. Runs
# `loom bench generate --device cuda` (one request at a time) for its wall
# time per token, then the same under Nsight Compute (ncu) reading only each
# kernel's duration, and prints: kernels launched per generated token, the
# kernels' own time per token, and the rest (launch gaps, host work,
# synchronizations), with the kernels that take the most time. On the lent
# GPU machine (bench/gpu-check.sh's setup sets the library path).
#
# Usage: bench/gpu-decode-profile.sh LOOM OUTDIR [MODEL]   (default gpt2-small)
set -u
LOOM=${1:?usage: bench/gpu-decode-profile.sh LOOM OUTDIR [MODEL]}
OUTD=${2:?usage: bench/gpu-decode-profile.sh LOOM OUTDIR [MODEL]}
MODEL=${3:-gpt2-small}
mkdir -p "$OUTD"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
GEN=9
args=(bench generate --device cuda --model "$MODEL" --concurrency 1 --repeat 1 --prompt-len 16 --gen $GEN)
"$LOOM" "${args[@]}" >"$OUTD/decode-wall.log" 2>&1 || { echo "decode-profile: loom bench generate failed: $(tail -n 1 "$OUTD/decode-wall.log")"; exit 1; }
[ -n "$NCU" ] || { echo "decode-profile: no ncu here"; exit 1; }
timeout 110 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --launch-count 6000 "$LOOM" "${args[@]}" >"$OUTD/decode-ncu.csv" 2>"$OUTD/decode-ncu.err"
echo "decode-profile: ncu exit $?"
python3 - "$OUTD/decode-ncu.csv" "$OUTD/decode-wall.log" "$GEN" <<'PY'
import csv, re, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 2:
    print("decode-profile: ncu wrote no kernels"); sys.exit(1)
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value")
per = {}
for r in rows[1:]:
    ns = float(r[v].replace(",", ""))
    c, t = per.get(r[k][:70], (0, 0.0)); per[r[k][:70]] = (c + 1, t + ns)
n = sum(c for c, _ in per.values()); tot = sum(t for _, t in per.values())
gen = int(sys.argv[3]); reqs = 2  # bench generate's one-at-a-time level runs 2 requests
wall = open(sys.argv[2]).read()
d = re.search(r"one request at a time.*?x\s+([0-9.]+) \(", wall)
print(f"decode-profile: {n} kernels, {tot/1e6:.2f} ms of kernel time over {reqs} requests of {gen} tokens "
      f"(prefill included): {n/(reqs*gen):.0f} kernels and {tot/1e6/(reqs*gen):.3f} ms of kernels per token")
if d:
    print(f"decode-profile: wall, without ncu: {float(d.group(1)):.1f} decode tok/s = {1000/float(d.group(1)):.3f} ms per token")
for name, (c, t) in sorted(per.items(), key=lambda x: -x[1][1])[:12]:
    print(f"  {t/1e6:8.3f} ms {c:6d}x  {name}")
PY
