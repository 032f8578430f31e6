#!/usr/bin/env bash
# 2:4 accuracy on the KJV validation split (issue 16): a model trained on
# data/kjv (scripts/demo.sh's corpus and recipe), its 2:4 pruning without
# fine-tuning, and after a short `--keep-sparsity` fine-tune; validation
# loss and perplexity from `loom eval` on the held-out split (5%, Genesis on).
#   STEPS=2000 FT_STEPS=200 MODEL=gpt2-tiny bench/sparse24-kjv.sh [OUT]
set -eu
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
OUT=${1:-runs/s24-kjv}
MODEL=${MODEL:-gpt2-tiny} STEPS=${STEPS:-2000} FT_STEPS=${FT_STEPS:-200}
BATCH=${BATCH:-8} SEQ=${SEQ:-128} LR=${LR:-2e-3} FT_LR=${FT_LR:-5e-4} THREADS=${THREADS:-2}
EVAL="--data data/kjv --seq $SEQ --batches ${EVAL_BATCHES:-16} --threads $THREADS"
mkdir -p data "$OUT"
if [ ! -s data/kjv.txt ]; then bible Gen1:1-Rev22:21 </dev/null > data/kjv.txt.tmp && mv data/kjv.txt.tmp data/kjv.txt; fi
[ -s data/kjv/tokenizer.json ] || $LOOM tokenize --input data/kjv.txt --vocab 4096 --val-fraction 0.05 --out data/kjv
T="--data data/kjv --batch $BATCH --seq $SEQ --threads $THREADS --sample-tokens 0"
[ -d "$OUT/dense/checkpoints" ] || $LOOM train $T --model "$MODEL" --out "$OUT/dense" --force --steps "$STEPS" \
    --lr "$LR" --warmup "${WARMUP:-100}" --eval-every 0
$LOOM prune --run "$OUT/dense" --sparsity 2:4 --out "$OUT/pruned" --force --threads "$THREADS"
$LOOM train $T --init-from-run "$OUT/pruned" --keep-sparsity --out "$OUT/ft" --force --steps "$FT_STEPS" \
    --lr "$FT_LR" --warmup 20 --eval-every 0
for r in dense pruned ft; do
    l=$($LOOM eval --run "$OUT/$r" $EVAL | grep -o 'val_loss [0-9.]*' | cut -d' ' -f2)
    echo "$r val_loss $l perplexity $(python3 -c "import math; print(f'{math.exp($l):.3f}')")"
done
