#!/usr/bin/env bash
# Bad input on the command line: each case must exit 2 with a one-line
# error that names the problem, and must not touch an existing run.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
tmp=$(mktemp -d /tmp/loom-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
head -c 60000 /usr/share/common-licenses/GPL-3 > "$tmp/small.txt" 2>/dev/null || \
    python3 -c "import random; random.seed(1); print(' '.join(random.choice(['the','word','of','light']) for _ in range(12000)))" > "$tmp/small.txt"
: > "$tmp/empty.txt"
mkdir -p "$tmp/emptydir" "$tmp/notarun"
echo hello > "$tmp/notarun/file.txt"

# expect NAME EXPECTED_TEXT -- COMMAND...
expect() {
    local name=$1 want=$2; shift 3
    local out rc lines
    out=$("$@" 2>&1 >/dev/null); rc=$?
    lines=$(printf '%s\n' "$out" | grep -c .)
    if [ "$rc" -eq 2 ] && printf '%s' "$out" | grep -q -- "$want" && [ "$lines" -le 2 ]; then
        echo "PASS $name"
    else
        echo "FAIL $name: exit $rc, wanted 2 and '$want' in: $out"
    fi
}
T="$LOOM train --steps 2 --batch 2 --seq 32 --threads 1"
expect missing_data "no data" -- $T --out "$tmp/r"
expect nonexistent_data "no such file" -- $T --data "$tmp/nope.txt" --out "$tmp/r"
expect empty_data "empty" -- $T --data "$tmp/empty.txt" --out "$tmp/r"
expect dir_without_shards "no train_" -- $T --data "$tmp/emptydir" --out "$tmp/r"
expect unknown_model "unknown model" -- $T --data "$tmp/small.txt" --model gpt2-huge --out "$tmp/r"
expect non_numeric_flag "not an integer" -- $T --data "$tmp/small.txt" --out "$tmp/r" --steps many
expect out_of_range_flag "out of range" -- $T --data "$tmp/small.txt" --out "$tmp/r" --lr 50
expect batch_zero "out of range" -- $LOOM train --data "$tmp/small.txt" --out "$tmp/r" --batch 0
expect seq_above_model "above the model" -- $T --data "$tmp/small.txt" --out "$tmp/r" --seq 100000
expect unknown_flag "unknown flag" -- $T --data "$tmp/small.txt" --out "$tmp/r" --bogus 1
expect missing_value "needs a value" -- $T --data "$tmp/small.txt" --out "$tmp/r" --lr
expect unknown_device "unknown device" -- $T --data "$tmp/small.txt" --out "$tmp/r" --device tpu
expect unknown_command "unknown command" -- $LOOM frobnicate
expect sample_not_a_run "is neither a run folder" -- $LOOM sample --run "$tmp/notarun"
expect sample_missing_run "no such folder" -- $LOOM sample --run "$tmp/nothing"
expect eval_not_a_run "is neither a run folder" -- $LOOM eval --run "$tmp/notarun" --data "$tmp/small.txt"
expect sample_text_file "is neither a run folder" -- $LOOM sample --run "$tmp/small.txt"
expect out_not_empty "already exists" -- $T --data "$tmp/small.txt" --out "$tmp/notarun"
if [ "$(cat "$tmp/notarun/file.txt")" = hello ] && [ "$(ls "$tmp/notarun")" = file.txt ]; then
    echo "PASS existing_folder_untouched"
else
    echo "FAIL existing_folder_untouched: $(ls "$tmp/notarun")"
fi

# A real run, then a second train into it without --force: refused, intact.
if $T --data "$tmp/small.txt" --out "$tmp/run" --layers 1 --channels 32 --heads 2 --context 32 >/dev/null 2>&1; then
    before=$(cd "$tmp/run" && find . -type f -exec md5sum {} + | sort)
    expect rerun_refused "already exists" -- $T --data "$tmp/small.txt" --out "$tmp/run"
    after=$(cd "$tmp/run" && find . -type f -exec md5sum {} + | sort)
    if [ "$before" = "$after" ]; then echo "PASS run_untouched_without_force"; else echo "FAIL run_untouched_without_force"; fi
    expect sample_bad_flag "not a number" -- $LOOM sample --run "$tmp/run" --temperature hot
    ck=$(ls -d "$tmp/run/checkpoints/step_"* | tail -1)
    expect export_missing_step "has no checkpoint of that step" -- $LOOM export --run "$tmp/run" --format gguf --step 99 --out "$tmp/x.gguf"
    expect step_of_a_checkpoint "only a run folder" -- $LOOM export --run "$ck" --format gguf --step 2 --out "$tmp/x.gguf"
    expect eval_checkpoint_without_data "names no data; pass --data" -- $LOOM eval --run "$ck"
    expect prune_needs_a_run "makes a new run from a run folder" -- $LOOM prune --run "$ck" --out "$tmp/pruned"
else
    echo "FAIL small_run: training a 2-step run failed"
fi
# Help lists every flag with its default, and exits 0.
if $LOOM train --help | grep -q -- "--grad-accum N.*(default: 1)" && $LOOM --help | grep -q "train"; then
    echo "PASS help_lists_flags"
else
    echo "FAIL help_lists_flags"
fi
