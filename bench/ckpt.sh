#!/usr/bin/env bash
# Checkpoint cost (issue 17): what a checkpoint costs the training loop,
# background writes (the default) against --ckpt-sync, on gpt2-small.
# Each mode trains the same steps with a checkpoint every K steps; loom
# reports the seconds the loop was held by checkpoints (async: the host
# snapshot and any wait for the previous write; sync: the whole write) and
# the seconds spent writing. The step-time cost at --ckpt-every N is
#   held per checkpoint / (N x median step time)
# and the slowdown of the steps that overlap a background write is shown
# too (median step time with and without checkpoints).
#   bench/ckpt.sh [MODEL] [BATCH] [SEQ] [REPEATS]
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
model=${1:-gpt2-small}; batch=${2:-1}; seq=${3:-128}; reps=${4:-3}
steps=${STEPS:-9}; every=${EVERY:-4}; default_every=500
tmp=$(mktemp -d /tmp/loom-ckptbench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
[ -f "$tmp/text.txt" ] || /usr/bin/python3 -c "import random; random.seed(1); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.']) for _ in range(60000)))" > "$tmp/text.txt"
A=(--data "$tmp/text.txt" --model "$model" --batch "$batch" --seq "$seq" --steps $steps --warmup 2 --eval-every 0 --sample-tokens 0 --log-every 1000)
echo "bench/ckpt.sh: $model, batch $batch x seq $seq, $steps steps, checkpoint every $every; $reps repeats; $(nproc) cores; $(date -u +%FT%TZ)"
for rep in $(seq "$reps"); do
    for mode in none async sync; do
        extra=(--ckpt-every $every); [ $mode = none ] && extra=(--ckpt-every 0); [ $mode = sync ] && extra+=(--ckpt-sync)
        rm -rf "$tmp/run"
        $LOOM train "${A[@]}" "${extra[@]}" --out "$tmp/run" > "$tmp/$mode.log" 2>&1 || { echo "loom failed: $(tail -2 "$tmp/$mode.log")"; exit 1; }
        /usr/bin/python3 - "$mode" "$tmp/run/metrics.jsonl" "$tmp/$mode.log" "$every" >> "$tmp/rows" <<'PY'
import json, re, statistics, sys
mode, metrics, log, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
steps = [json.loads(l) for l in open(metrics)]
st = [s["step_s"] for s in steps[1:]]  # the first step warms up
m = re.search(r"(\d+) checkpoint\(s\): ([\d.]+)s of the loop's time.*?, ([\d.]+)s writing", open(log).read())
n, held, wrote = (int(m.group(1)), float(m.group(2)), float(m.group(3))) if m else (0, 0.0, 0.0)
# Checkpoints during the loop (the last one is written after it).
inloop = max(n - 1, 0)
print(mode, statistics.median(st), held, wrote, n, inloop)
PY
    done
done
/usr/bin/python3 - "$tmp/rows" "$default_every" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
N = int(sys.argv[2])
by = {}
for mode, step, held, wrote, n, inloop in rows:
    by.setdefault(mode, []).append((float(step), float(held), float(wrote), int(n)))
base = statistics.median(r[0] for r in by["none"])
print("%-6s %12s %16s %16s %18s" % ("mode", "step s (med)", "held/ckpt s", "write/ckpt s", "cost at every %d" % N))
for mode in ("none", "async", "sync"):
    r = by[mode]
    step = statistics.median(x[0] for x in r)
    held = [x[1] / x[3] for x in r if x[3]]
    wrote = [x[2] / x[3] for x in r if x[3]]
    if not held:
        print("%-6s %12.3f %16s %16s %18s" % (mode, step, "-", "-", "-"))
        continue
    h = statistics.median(held)
    spread = "%.3f-%.3f" % (min(held), max(held))
    print("%-6s %12.3f %16s %16.3f %17.2f%%   (held %s; steps %+.1f%% vs none)" % (
        mode, step, "%.3f" % h, statistics.median(wrote), 100 * h / (N * base), spread, 100 * (step / base - 1)))
PY
