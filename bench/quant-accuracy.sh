#!/usr/bin/env bash
# What compressed inference (issue 16) costs in accuracy on a trained run:
# perplexity on its validation split (`loom eval`) and greedy tokens equal to
# fp32's on PROMPTS prompts x NEW tokens (`loom generate --temperature 0`),
# for each mode: fp32 (training forward and inference forward), loom's
# per-channel int8 weights W8A32 and W8A8, the int8 KV cache, W8A8 with it,
# and the run's Q8_0 GGUF (`loom export --dtype q8_0`) loaded back with its
# blocks of 32 (W8A32, W8A8; its embeddings are Q8_0 too). Prints a markdown
# table; docs/quantization.md records it.
#
#   RUN=runs/kjv DATA=data/kjv bench/quant-accuracy.sh
#   (SEQ=128 BATCH=8 BATCHES=16 PROMPTS=20 PLEN=16 NEW=50 THREADS=0)
#   LLAMA=1 adds llama.cpp's llama-perplexity on the Q8_0 GGUF against loom on
#   the same file and chunks (bench/llama-check.sh with DTYPE=q8_0).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
RUN=${RUN:?set RUN to a run folder (loom train --out)}
DATA=${DATA:?set DATA to the data folder of the run (loom tokenize --out)}
SEQ=${SEQ:-128} BATCH=${BATCH:-8} BATCHES=${BATCHES:-16}
PROMPTS=${PROMPTS:-20} PLEN=${PLEN:-16} NEW=${NEW:-50} THREADS=${THREADS:-0}
work=$(mktemp -d /tmp/loom-qacc-XXXXXX)
trap 'rm -rf "$work"' EXIT

$LOOM export --run "$RUN" --format gguf --dtype q8_0 --out "$work/q8.gguf" > /dev/null
# Prompts: PLEN-token windows spread evenly over the validation split.
/usr/bin/python3 - "$DATA" "$PROMPTS" "$PLEN" > "$work/prompts.jsonl" <<'PY'
import glob, json, sys
import numpy as np
d, n, plen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
f = sorted(glob.glob(d + "/val_*.bin"))[0]
hdr = np.fromfile(f, dtype=np.int32, count=256)
toks = np.fromfile(f, dtype=np.uint16 if hdr[6] == 2 else np.uint32, offset=1024)
step = (len(toks) - plen) // n
for i in range(n):
    print(json.dumps({"prompt_ids": [int(t) for t in toks[i * step:i * step + plen]]}))
PY

rows=(
    "fp32, training forward|$RUN|"
    "fp32, inference forward|$RUN|--quant none"
    "W8A32 (= W8A16 on the CPU), per channel|$RUN|--quant w8a32"
    "W8A8, per channel|$RUN|--quant w8a8"
    "fp32 weights, int8 KV|$RUN|--kv-dtype int8"
    "W8A8 + int8 KV|$RUN|--quant w8a8 --kv-dtype int8"
    "Q8_0 GGUF, W8A32, blocks of 32|$work/q8.gguf|--quant w8a32"
    "Q8_0 GGUF, W8A8, blocks of 32|$work/q8.gguf|--quant w8a8"
)
echo "run $RUN, data $DATA: perplexity over $BATCHES batches of $BATCH x $SEQ validation tokens; greedy: $PROMPTS prompts of $PLEN tokens x $NEW new tokens"
echo
echo "| path | perplexity | vs fp32 | greedy tokens equal to fp32 |"
echo "|---|---|---|---|"
base=
for i in "${!rows[@]}"; do
    IFS='|' read -r name run flags <<< "${rows[$i]}"
    # shellcheck disable=SC2086 # flags are words
    loss=$($LOOM eval --run "$run" --data "$DATA" --seq "$SEQ" --batch "$BATCH" --batches "$BATCHES" --threads "$THREADS" $flags |
           awk '/^val_loss/ {print $2}')
    # shellcheck disable=SC2086
    $LOOM generate --run "$run" --prompts "$work/prompts.jsonl" --out "$work/gen$i.jsonl" --max-tokens "$NEW" \
        --temperature 0 --kv-memory 256M --threads "$THREADS" $flags > /dev/null 2>&1
    [ -n "$base" ] || base=$loss
    /usr/bin/python3 - "$name" "$loss" "$base" "$work/gen0.jsonl" "$work/gen$i.jsonl" "$NEW" <<'PY'
import json, math, sys
name, loss, base, ref, got, new = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
ids = lambda p: [json.loads(l)["samples"][0]["token_ids"] for l in open(p)]
a, b = ids(ref), ids(got)
same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
total = len(a) * new
rel = math.exp(loss) / math.exp(base) - 1
print("| %s | %.4f | %s | %d / %d (%.1f%%) |" % (name, math.exp(loss), "-" if loss == base and "training" in name else "%+.3f%%" % (100 * rel),
                                              same, total, 100.0 * same / total))
PY
done
if [ -n "${LLAMA:-}" ]; then
    echo
    echo "llama.cpp on the Q8_0 GGUF (bench/llama-check.sh, DTYPE=q8_0):"
    RUN="$RUN" DTYPE=q8_0 QUANT=${QUANT:-w8a32} NO_CONVERTER=1 bash bench/llama-check.sh 2>&1 | grep -E "perplexity|PASS|FAIL|greedy" || true
fi
