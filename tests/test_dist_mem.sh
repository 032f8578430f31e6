#!/usr/bin/env bash
# Memory per rank under --tp 2 and --pp 2 (issue 24; docs/dist.md "Memory
# per rank"): checkpoints are written and read unit by unit
# (src/train/ckpt_stream.h), so rank 0 holds no whole copy of the model or
# of its AdamW state, neither while it trains and writes checkpoints nor
# when it resumes. Measured with the trainer's own report of every rank's
# peak resident memory (VmHWM, from /proc): rank 0's peak may exceed rank
# 1's by less than half of the whole model's weights, 4P bytes (before:
# several times 4P, a host copy of the weights, of the AdamW moments and
# the writer's snapshot of both). P is the whole model's parameter count,
# computed here from the shape (GPT-2: 12 L C^2 + the embedding). Both
# runs take a checkpoint every step, and the resumed run reads one; that
# its files are the single-model layout and resume bit for bit is what
# test_pp.sh, test_dist_tp.sh and test_pp_tp.sh check. Memory, not time:
# nothing here depends on the machine's speed.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-$PWD/build/loom}
tmp=$(mktemp -d /tmp/loom-distmem-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
python3 -c "import random; random.seed(1); print(' '.join(random.choice(['the','word','of','light','and','darkness','in','beginning']) for _ in range(20000)))" > "$tmp/data.txt"
L=4; C=256
A=(--data "$tmp/data.txt" --layers $L --channels $C --heads 4 --context 32 --seq 16 --batch 1 --grad-accum 2 --eval-every 0
   --sample-tokens 0 --seed 3 --threads 1 --ckpt-every 1 --dist-timeout 600)
P=$(( 12 * L * C * C + 320 * C ))

peaks() { # LOG -> "rank0_MB rank1_MB"
    grep -oE 'peak resident memory \(VmHWM\) per rank: rank 0 [0-9.]+ MB, rank 1 [0-9.]+ MB' "$1" | awk '{print $9, $13}'
}
check() { # NAME LOG
    local name=$1 log=$2 p
    p=$(peaks "$log")
    if [ -z "$p" ]; then echo "FAIL $name: no peak memory line"; tail -3 "$log"; return; fi
    python3 - "$name" $p "$P" <<'PY'
import sys
name, r0, r1, P = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
limit = 0.5 * 4 * P / 1e6
ok = r0 - r1 < limit
print(f"{'PASS' if ok else 'FAIL'} {name} (rank 0 {r0:.1f} MB, rank 1 {r1:.1f} MB: rank 0 above by {r0 - r1:.1f} MB, limit 2P = {limit:.1f} MB)")
PY
}
for lay in tp pp; do
    $LOOM train "${A[@]}" --steps 1 --nproc 2 --$lay 2 --out "$tmp/$lay" > "$tmp/$lay.log" 2>&1 || { echo "FAIL dist_mem_${lay}2_run: $(tail -2 "$tmp/$lay.log")"; continue; }
    check "dist_mem_${lay}2_rank0_no_whole_copy" "$tmp/$lay.log"
    $LOOM train "${A[@]}" --steps 2 --nproc 2 --$lay 2 --out "$tmp/$lay" --resume auto > "$tmp/${lay}_r.log" 2>&1 \
        || { echo "FAIL dist_mem_${lay}2_resume_run: $(tail -2 "$tmp/${lay}_r.log")"; continue; }
    grep -q "resuming .* from step 1" "$tmp/${lay}_r.log" && check "dist_mem_${lay}2_resume_rank0_no_whole_copy" "$tmp/${lay}_r.log" \
        || echo "FAIL dist_mem_${lay}2_resume: $(grep -m1 resuming "$tmp/${lay}_r.log")"
done

# A shape whose tensors are not multiples of 16 floats (C = 36, 3 layers):
# the parameter block has alignment gaps between tensors, which the
# optimizer file holds too; a tp2 and a pp2 checkpoint of it resume in one
# process (the reader checks that the file covers the whole block).
G=(--data "$tmp/data.txt" --layers 3 --channels 36 --heads 2 --context 32 --seq 16 --batch 1 --grad-accum 2 --eval-every 0
   --sample-tokens 0 --seed 3 --threads 1)
for lay in tp pp; do
    if $LOOM train "${G[@]}" --steps 1 --nproc 2 --$lay 2 --out "$tmp/g$lay" > "$tmp/g$lay.log" 2>&1 \
       && $LOOM train "${G[@]}" --steps 2 --out "$tmp/g$lay" --resume auto > "$tmp/g${lay}_r.log" 2>&1 && grep -q "resuming" "$tmp/g${lay}_r.log"; then
        echo "PASS dist_mem_${lay}2_aligned_gaps_resume_in_1"
    else
        echo "FAIL dist_mem_${lay}2_aligned_gaps_resume_in_1: $(tail -2 "$tmp/g$lay.log" "$tmp/g${lay}_r.log" 2>/dev/null)"
    fi
done

# loom bench dist measures on a shared machine: the sides alternate round
# by round, the table shows medians with the min-max of the rounds, the
# efficiency is the median of the per-round ratios, and the load average
# is printed before and after. Checked here: the lines are there and each
# median lies in its range (the figures themselves are the machine's).
out=$($LOOM bench dist --layout zero3,pp2 --ranks 2 --layers 2 --channels 32 --heads 2 --seq 16 --batch 1 --vocab 64 --micro-batches 2 \
      --steps 1 --warmup 0 --rounds 2 2>&1)
printf '%s\n' "$out" | python3 -c '
import re, sys
out = sys.stdin.read()
ok = out.count("load average before:") == 2 and out.count("load average after:") == 2
eff = re.search(r"median \(min-max\) of 2 alternating rounds\): prefetch ([0-9.]+) \(([0-9.]+)-([0-9.]+)\)", out)
ok = ok and eff is not None and float(eff.group(2)) <= float(eff.group(1)) <= float(eff.group(3))
rows = re.findall(r"^(?:1 rank|2 ranks)[^\n]*?([0-9.]+) +([0-9.]+)-([0-9.]+) ", out, re.M)
ok = ok and len(rows) == 3 and all(float(lo) <= float(m) <= float(hi) for m, lo, hi in rows)
bub = re.search(r"measured bubble ([0-9.]+)% \(mean over stages; median of 2 rounds, ([0-9.]+)-([0-9.]+)%\)", out)
ok = ok and bub is not None and float(bub.group(2)) <= float(bub.group(1)) <= float(bub.group(3))
print(("PASS" if ok else "FAIL") + " dist_bench_medians_ranges_load" + ("" if ok else ": " + out[-1500:]))
'
