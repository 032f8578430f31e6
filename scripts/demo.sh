#!/usr/bin/env bash
# The README's main job: prepare the King James Bible from Debian's bible-kjv,
# train a BPE tokenizer on it, train gpt2-tiny on the CPU for a few minutes,
# evaluate, sample.
set -eu
cd "$(dirname "$0")/.."
LOOM=build/loom
mkdir -p data
if [ ! -s data/kjv.txt ]; then
    echo "demo: writing data/kjv.txt from bible-kjv"
    bible Gen1:1-Rev22:21 </dev/null > data/kjv.txt.tmp
    mv data/kjv.txt.tmp data/kjv.txt
fi
STEPS=${STEPS:-2000}
# A byte-level BPE tokenizer with 4096 ids (256 bytes, <|endoftext|>, 3839
# merges) trained on the corpus; 5% of the text (Genesis on) is validation.
$LOOM tokenize --input data/kjv.txt --vocab 4096 --val-fraction 0.05 --out data/kjv
echo
$LOOM train --data data/kjv --model gpt2-tiny --out runs/kjv --force \
    --steps "$STEPS" --batch 8 --seq 128 --lr 2e-3 --warmup 100 --eval-every 250 \
    --sample-tokens 0
echo
$LOOM eval --run runs/kjv --data data/kjv --seq 128 --batches 16
echo
echo "sample (loom sample --run runs/kjv --prompt \"In the beginning\"):"
$LOOM sample --run runs/kjv --prompt "In the beginning" --tokens 120
echo
echo "demo: tokenizer and shards in data/kjv; run folder runs/kjv (config.json, metrics.jsonl, loss.svg, checkpoints/)"
