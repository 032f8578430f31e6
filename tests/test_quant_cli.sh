#!/usr/bin/env bash
# --quant on loom sample / generate / eval: a tiny run trained for a few
# steps; greedy samples run with each mode, eval's int8 loss is within 1%
# of fp32's (the accuracy bounds proper are in tests/test_quant.c), and a
# bad value is a usage error.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
tmp=$(mktemp -d /tmp/loom-quant-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
head -c 60000 /usr/share/common-licenses/GPL-3 > "$tmp/small.txt" 2>/dev/null || \
    python3 -c "import random; random.seed(1); print(' '.join(random.choice(['the','word','of','light']) for _ in range(12000)))" > "$tmp/small.txt"
if ! $LOOM train --data "$tmp/small.txt" --out "$tmp/r" --steps 30 --batch 4 --seq 64 --threads 2 >"$tmp/train.log" 2>&1; then
    echo "FAIL quant_cli_train: $(tail -3 "$tmp/train.log")"; exit 0
fi
for q in none int8 w8a8; do
    if out=$($LOOM sample --run "$tmp/r" --prompt "the" --tokens 20 --temperature 0 --quant $q --threads 2 2>&1) && [ -n "$out" ]; then
        echo "PASS sample_quant_$q"
    else
        echo "FAIL sample_quant_$q: $out"
    fi
done
echo '{"prompt": "the", "max_tokens": 8}' > "$tmp/p.jsonl"
if $LOOM generate --run "$tmp/r" --prompts "$tmp/p.jsonl" --out "$tmp/o.jsonl" --quant w8a8 --kv-memory 16M --threads 2 >/dev/null 2>&1 \
   && grep -q '"text"' "$tmp/o.jsonl"; then
    echo "PASS generate_quant_w8a8"
else
    echo "FAIL generate_quant_w8a8: $(cat "$tmp/o.jsonl" 2>/dev/null)"
fi
if $LOOM generate --run "$tmp/r" --prompts "$tmp/p.jsonl" --out "$tmp/k.jsonl" --kv-dtype int8 --kv-memory 16M --threads 2 >/dev/null 2>&1 \
   && grep -q '"text"' "$tmp/k.jsonl"; then
    echo "PASS generate_kv_int8"
else
    echo "FAIL generate_kv_int8: $(cat "$tmp/k.jsonl" 2>/dev/null)"
fi
a=$($LOOM eval --run "$tmp/r" --batches 4 --threads 2 2>&1 | awk '/^val_loss/ {print $2}')
b=$($LOOM eval --run "$tmp/r" --batches 4 --threads 2 --quant int8 2>&1 | awk '/^val_loss/ {print $2}')
if [ -n "$a" ] && [ -n "$b" ] && python3 -c "import sys; a,b=float('$a'),float('$b'); sys.exit(0 if abs(b-a)/a < 0.01 else 1)"; then
    echo "PASS eval_quant_int8: val_loss fp32 $a, int8 $b"
else
    echo "FAIL eval_quant_int8: fp32 '$a', int8 '$b'"
fi
out=$($LOOM sample --run "$tmp/r" --quant int4 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q "quant"; then echo "PASS quant_bad_value"; else echo "FAIL quant_bad_value: exit $rc: $out"; fi
out=$($LOOM eval --run "$tmp/r" --quant w8a8 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q "w8a8"; then echo "PASS eval_w8a8_refused"; else echo "FAIL eval_w8a8_refused: exit $rc: $out"; fi
