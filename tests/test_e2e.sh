#!/usr/bin/env bash
# End to end on the real default corpus: gpt2-tiny trained on the first
# 300 KB of the King James Bible. The loss must fall from about ln(257) =
# 5.55 to below 2.6 within 150 steps (measured: 2.42), validation must
# follow, the run folder must hold what the docs promise, `loom sample`
# must print text and `loom eval` must agree with the run's own val loss;
# a second identical run must give bit-identical losses.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
if ! command -v bible >/dev/null; then echo "SKIP e2e: the bible-kjv package is not installed (scripts/deps.sh installs it)"; exit 0; fi
tmp=$(mktemp -d /tmp/loom-e2e-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bible Gen1:1-Rev22:21 </dev/null | head -c 300000 > "$tmp/kjv.txt"
args=(--model gpt2-tiny --steps 150 --batch 4 --seq 64 --lr 3e-3 --warmup 20
      --eval-every 50 --eval-batches 4 --threads 2 --sample-tokens 0 --seed 5)
if ! $LOOM train --data "$tmp/kjv.txt" "${args[@]}" --out "$tmp/a" > "$tmp/a.log" 2>&1; then
    echo "FAIL e2e_train: loom train failed:"; tail -5 "$tmp/a.log"; exit 1
fi
read -r first last val < <(/usr/bin/python3 - "$tmp/a/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
vals = [r["val_loss"] for r in rows if "val_loss" in r]
print(rows[0]["loss"], sum(r["loss"] for r in rows[-10:]) / 10, vals[-1] if vals else "nan")
PY
)
awk -v f="$first" 'BEGIN{exit !(f > 5.0 && f < 6.2)}' && echo "PASS e2e_initial_loss_near_ln257 ($first)" || echo "FAIL e2e_initial_loss_near_ln257: $first"
awk -v l="$last" 'BEGIN{exit !(l < 2.6)}' && echo "PASS e2e_loss_falls ($first -> $last)" || echo "FAIL e2e_loss_falls: $first -> $last, wanted < 2.6"
awk -v v="$val" 'BEGIN{exit !(v < 2.7)}' && echo "PASS e2e_val_loss ($val)" || echo "FAIL e2e_val_loss: $val, wanted < 2.7"
ok=1
for f in config.json metrics.jsonl loss.svg tokenizer.json latest checkpoints/step_00000150/model.safetensors \
         checkpoints/step_00000150/config.json checkpoints/step_00000150/state.json; do
    [ -s "$tmp/a/$f" ] || { ok=0; echo "  missing $f"; }
done
[ $ok = 1 ] && echo "PASS e2e_run_folder" || echo "FAIL e2e_run_folder"
grep -q "tokens/s" "$tmp/a.log" && grep -q "MFU" "$tmp/a.log" && grep -q "ETA" "$tmp/a.log" \
    && echo "PASS e2e_progress_line" || echo "FAIL e2e_progress_line"
out=$($LOOM sample --run "$tmp/a" --prompt "And God said" --tokens 80 --threads 2 2>&1)
n=$(printf '%s' "$out" | tr -cd 'a-zA-Z' | wc -c)
[ "$n" -gt 40 ] && echo "PASS e2e_sample_prints_text" || echo "FAIL e2e_sample_prints_text: $out"
ev=$($LOOM eval --run "$tmp/a" --data "$tmp/kjv.txt" --batch 4 --seq 64 --batches 4 --threads 2 | awk '{print $2}')
awk -v a="$ev" -v b="$val" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d < 1e-3)}' \
    && echo "PASS e2e_eval_matches_run ($ev)" || echo "FAIL e2e_eval_matches_run: eval $ev vs run $val"
# Determinism: same seed, threads and data give the same losses bit for bit.
$LOOM train --data "$tmp/kjv.txt" "${args[@]}" --steps 20 --out "$tmp/b" > /dev/null 2>&1
$LOOM train --data "$tmp/kjv.txt" "${args[@]}" --steps 20 --out "$tmp/c" > /dev/null 2>&1
if cmp -s <(grep -o '"loss":[^,]*' "$tmp/b/metrics.jsonl") <(grep -o '"loss":[^,]*' "$tmp/c/metrics.jsonl") \
   && [ "$(grep -c loss "$tmp/b/metrics.jsonl")" = 20 ]; then
    echo "PASS e2e_deterministic"
else
    echo "FAIL e2e_deterministic"
fi

# BPE: tokenize the same text into shards (512 ids), train on them. The loss
# must fall from about ln(512) = 6.24 to below 4.8 in 150 steps (measured:
# 4.25, val 4.23); sample must decode text; a run whose tokenizer.json was
# swapped for another must be refused.
$LOOM tokenize --input "$tmp/kjv.txt" --vocab 512 --val-fraction 0.05 --out "$tmp/bpe" --quiet > /dev/null 2>&1
if ! $LOOM train --data "$tmp/bpe" "${args[@]}" --out "$tmp/d" > "$tmp/d.log" 2>&1; then
    echo "FAIL e2e_bpe_train: loom train on BPE shards failed:"; tail -5 "$tmp/d.log"
else
    read -r first last val < <(/usr/bin/python3 - "$tmp/d/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
vals = [r["val_loss"] for r in rows if "val_loss" in r]
print(rows[0]["loss"], sum(r["loss"] for r in rows[-10:]) / 10, vals[-1] if vals else "nan")
PY
)
    awk -v f="$first" -v l="$last" -v v="$val" 'BEGIN{exit !(f > 5.8 && f < 6.8 && l < 4.8 && v < 4.8)}' \
        && echo "PASS e2e_bpe_loss_falls ($first -> $last, val $val)" \
        || echo "FAIL e2e_bpe_loss_falls: $first -> $last, val $val; wanted from ~6.24 to below 4.8"
    out=$($LOOM sample --run "$tmp/d" --prompt "And God said" --tokens 40 --threads 2 2>&1)
    n=$(printf '%s' "$out" | tr -cd 'a-zA-Z' | wc -c)
    [ "$n" -gt 40 ] && echo "PASS e2e_bpe_sample" || echo "FAIL e2e_bpe_sample: $out"
    cp "$tmp/a/tokenizer.json" "$tmp/d/tokenizer.json"   # the byte-level one of run a
    out=$($LOOM sample --run "$tmp/d" --tokens 5 2>&1); rc=$?
    if [ $rc = 2 ] && printf '%s' "$out" | grep -q "not the one the run trained with"; then
        echo "PASS e2e_bpe_tokenizer_mismatch_refused"
    else
        echo "FAIL e2e_bpe_tokenizer_mismatch_refused: exit $rc: $out"
    fi
fi
