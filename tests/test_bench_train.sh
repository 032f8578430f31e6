#!/usr/bin/env bash
# loom bench train never prints nonsense (issue 9, part 6), with a stand-in
# for the PyTorch side (tests/bench_train_fake_torch.py):
# - a side killed by SIGKILL mid-run is reported with its signal, and the
#   loom side's row still prints (exit 0);
# - a side faster than the measured peak raises the peak and says so, and
#   no MFU reads above 100%;
# - only one side's process is alive at a time (the stand-in checks).
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
args=(bench train --model gpt2-tiny --seq 32 --batch 1 --steps 1 --threads 2 --gemm own
      --torch-script tests/bench_train_fake_torch.py)

out=$(FAKE_MODE=kill $LOOM "${args[@]}" --rounds 2 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q 'pytorch *failed: died during its steps in round 1, killed by signal 9' <<<"$out" &&
   grep -q '^  loom (gemm own) *[0-9]' <<<"$out"; then echo "PASS bench_train_dead_side_reported"
else echo "FAIL bench_train_dead_side_reported: rc $rc: $(tail -4 <<<"$out")"; fi

out=$(FAKE_MODE=fast $LOOM "${args[@]}" --rounds 2 2>&1); rc=$?
mfus=$(grep -E '^  (loom|pytorch)' <<<"$out" | grep -oE '[0-9.]+%' )
over=$(awk '{ v = $1 + 0; if (v > 100.0) print }' <<<"${mfus//%/}")
if [ $rc -eq 0 ] && grep -q 'peak raised: a step of pytorch ran at' <<<"$out" && [ -n "$mfus" ] && [ -z "$over" ] &&
   grep -q '^  pytorch .* 100.0%' <<<"$out"; then echo "PASS bench_train_mfu_never_above_100"
else echo "FAIL bench_train_mfu_never_above_100: rc $rc, MFU above 100: '$over': $(tail -5 <<<"$out")"; fi
if grep -q 'another side is alive' <<<"$out"; then echo "FAIL bench_train_one_process_at_a_time: $(grep 'another side' <<<"$out")"
elif grep -q '^  pytorch *0.0' <<<"$out"; then echo "PASS bench_train_one_process_at_a_time"
else echo "FAIL bench_train_one_process_at_a_time: the stand-in did not run: $(tail -3 <<<"$out")"; fi
