#!/usr/bin/env bash
# --resume: a run stopped after its step-10 checkpoint and resumed must take
# exactly the steps an uninterrupted run takes (same losses bit for bit on
# one process; within 1e-6 relative for 2 ranks under ZeRO-1), keep its
# metrics log continuous, and refuse what it cannot continue.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
tmp=$(mktemp -d /tmp/loom-resume-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -c "import random; random.seed(3); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.']) for _ in range(30000)))" > "$tmp/text.txt"
A=(--data "$tmp/text.txt" --layers 2 --channels 64 --heads 2 --context 64 --batch 4 --seq 32
   --steps 20 --warmup 5 --lr 3e-3 --ckpt-every 10 --keep-ckpts 5 --eval-every 10 --eval-batches 2 --sample-tokens 0)

# Make B the state A was in right after step 10's checkpoint (plus a log
# line of step 11 that a crash could leave behind).
cut_back() { # src dst
    cp -r "$1" "$2"
    rm -rf "$2/checkpoints/step_00000020"
    echo step_00000010 > "$2/latest"
    head -11 "$1/metrics.jsonl" > "$2/metrics.jsonl"
}
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl"; }

$LOOM train "${A[@]}" --threads 1 --out "$tmp/a" > "$tmp/a.log" 2>&1 || { echo "FAIL resume_setup: $(tail -3 "$tmp/a.log")"; exit 1; }
cut_back "$tmp/a" "$tmp/b"
if $LOOM train "${A[@]}" --threads 1 --out "$tmp/b" --resume > "$tmp/b.log" 2>&1 \
   && grep -q "resuming" "$tmp/b.log" && cmp -s <(losses "$tmp/a") <(losses "$tmp/b") \
   && [ "$(wc -l < "$tmp/b/metrics.jsonl")" = 20 ]; then
    echo "PASS resume_same_losses_as_uninterrupted"
else
    echo "FAIL resume_same_losses_as_uninterrupted: $(tail -3 "$tmp/b.log")"; diff <(losses "$tmp/a") <(losses "$tmp/b") | head -6
fi
if cmp -s "$tmp/a/checkpoints/step_00000020/model.safetensors" "$tmp/b/checkpoints/step_00000020/model.safetensors"; then
    echo "PASS resume_same_final_weights"
else
    echo "FAIL resume_same_final_weights"
fi

out=$($LOOM train "${A[@]}" --threads 1 --out "$tmp/a" --resume 2>&1); rc=$?
[ $rc = 2 ] && printf '%s' "$out" | grep -q "already at step 20" && echo "PASS resume_finished_run_refused" \
    || echo "FAIL resume_finished_run_refused: exit $rc: $out"
out=$($LOOM train "${A[@]}" --threads 1 --out "$tmp/nothing" --resume 2>&1); rc=$?
[ $rc = 2 ] && printf '%s' "$out" | grep -q "does not exist" && echo "PASS resume_missing_run_refused" \
    || echo "FAIL resume_missing_run_refused: exit $rc: $out"
cut_back "$tmp/a" "$tmp/c"
$LOOM tokenize --input "$tmp/text.txt" --vocab 300 --out "$tmp/bpe" --quiet > /dev/null 2>&1
out=$($LOOM train "${A[@]/#$tmp\/text.txt/$tmp/bpe}" --threads 1 --out "$tmp/c" --resume 2>&1); rc=$?
[ $rc = 2 ] && printf '%s' "$out" | grep -q "tokenizer" && echo "PASS resume_other_tokenizer_refused" \
    || echo "FAIL resume_other_tokenizer_refused: exit $rc: $out"

# Two ranks, ZeRO-1: each rank's optimizer shard comes back.
if $LOOM train "${A[@]}" --nproc 2 --zero 1 --threads 1 --out "$tmp/z" > "$tmp/z.log" 2>&1; then
    cut_back "$tmp/z" "$tmp/y"
    if $LOOM train "${A[@]}" --nproc 2 --zero 1 --threads 1 --out "$tmp/y" --resume > "$tmp/y.log" 2>&1 &&
       /usr/bin/python3 - "$tmp/z/metrics.jsonl" "$tmp/y/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
sys.exit(0 if len(a) == len(b) == 20 and all(abs(x - y) <= 1e-6 * abs(x) for x, y in zip(a, b)) else 1)
PY
    then echo "PASS resume_zero1_two_ranks"
    else echo "FAIL resume_zero1_two_ranks: $(tail -3 "$tmp/y.log")"; fi
    # Elastic: the 2-rank ZeRO-1 checkpoint continues on 1 rank (tests/test_ft_resume.sh checks the losses).
    out=$($LOOM train "${A[@]}" --threads 1 --out "$tmp/y" --steps 30 --resume 2>&1); rc=$?
    [ $rc = 0 ] && printf '%s' "$out" | grep -q "regathered from 2 shard(s)" && grep -q '"world_size":\[2,1\]' "$tmp/y/events.jsonl" \
        && echo "PASS resume_other_zero_layout_regathered" || echo "FAIL resume_other_zero_layout_regathered: exit $rc: $out"
else
    echo "FAIL resume_zero1_setup: $(tail -3 "$tmp/z.log")"
fi

# SIGTERM (a preempted spot machine): the step in flight finishes, a
# checkpoint is written, the exit is 75 ("preempted, resumable"), and
# --resume continues.
$LOOM train "${A[@]}" --threads 1 --steps 100000 --ckpt-every 0 --eval-every 0 --out "$tmp/s" > "$tmp/s.log" 2>&1 &
pid=$!
for _ in $(seq 1200); do # a guard: the 3rd line ends it
    [ "$(cat "$tmp/s/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
    sleep 0.1
done
kill -TERM $pid; wait $pid; rc=$?
last=$(cat "$tmp/s/latest" 2>/dev/null)
if [ $rc = 75 ] && [ -n "$last" ] && [ -s "$tmp/s/checkpoints/$last/model.safetensors" ] && grep -q "stopped by signal 15" "$tmp/s.log" &&
   $LOOM train "${A[@]}" --threads 1 --ckpt-every 0 --eval-every 0 --out "$tmp/s" --resume --steps "$(( 10#${last#step_} + 2 ))" > "$tmp/s2.log" 2>&1; then
    echo "PASS sigterm_checkpoints_and_resumes ($last)"
else
    echo "FAIL sigterm_checkpoints_and_resumes: exit $rc, latest '$last': $(tail -2 "$tmp/s.log") $(tail -2 "$tmp/s2.log" 2>/dev/null)"
fi
