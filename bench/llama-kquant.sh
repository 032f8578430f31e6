#!/usr/bin/env bash
# GGUF files quantized by llama.cpp's own llama-quantize (Q8_0, Q4_K_M,
# Q5_K_M, Q6_K), run by loom as stored and checked against llama.cpp on the
# same file (not part of `make test`: it needs bench/llama-build.sh's
# 15+ minute build, and trains a model first).
#
#   bench/llama-kquant.sh                 # trains a 4-layer, 256-channel GPT-2 (widths multiples of 256,
#                                         # so the k-quants are not replaced by llama-quantize's 32-value fallbacks)
#                                         # into .cache/kquant-run once; later runs reuse it
#   RUN=runs/NAME bench/llama-kquant.sh   # or an existing run
#   TYPES="Q4_K_M Q6_K" bench/llama-kquant.sh
#
# For each type, bench/llama-check.sh with QTYPE: perplexity of `loom eval`
# against llama-perplexity on the same tokens within 0.5%, and loom's greedy
# tokens beside llama-simple's (differences reported, with where they
# start). Prints PASS/FAIL lines; exits 1 when a check fails.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LOOM=${LOOM:-build/loom}
THREADS=${THREADS:-2}
TYPES=${TYPES:-Q8_0 Q4_K_M Q5_K_M Q6_K}
work=$(mktemp -d /tmp/loom-llama-kquant-XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "${RUN:-}" ] && [ -d .cache/kquant-run/checkpoints ]; then RUN=.cache/kquant-run; fi
if [ -z "${RUN:-}" ]; then
    bible Gen1:1-Rev22:21 </dev/null > "$work/kjv.txt"
    head -c 1500000 "$work/kjv.txt" > "$work/train.txt"
    $LOOM tokenize --input "$work/train.txt" --vocab 2048 --out "$work/data" --quiet --threads "$THREADS" > /dev/null
    echo "llama-kquant: training a 4-layer, 256-channel GPT-2 for ${STEPS:-300} steps"
    $LOOM train --data "$work/data" --layers 4 --heads 4 --channels 256 --context 128 --steps "${STEPS:-300}" --batch 8 --seq 128 \
        --lr 2e-3 --warmup 30 --eval-every 0 --sample-tokens 0 --threads "$THREADS" --out .cache/kquant-run 2>&1 | tail -n 1
    RUN=.cache/kquant-run
fi
fail=0
for t in $TYPES; do
    echo "== $t"
    RUN="$RUN" QTYPE="$t" NO_CONVERTER=1 bench/llama-check.sh || fail=1
done
exit $fail
