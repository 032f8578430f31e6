#!/usr/bin/env bash
# GGUF files quantized by llama.cpp's own llama-quantize (Q8_0, Q4_K_M,
# Q5_K_M, Q6_K), run by loom as stored and checked against llama.cpp on the
# same file (not part of `make test`: it needs llama.cpp built, see
# bench/llama-build.sh; LOOM_LLAMA_DIR names a built tree).
#
#   bench/llama-kquant.sh                 # a Llama (the default)
#   TYPES="Q4_K_M Q6_K" bench/llama-kquant.sh
#   FAMILY=gpt2 bench/llama-kquant.sh     # the GPT-2 check: trains a 4-layer, 256-channel GPT-2
#                                         # into .cache/kquant-run once (RUN=runs/NAME: an existing run)
#
# The Llama: bench/llama_random.py makes a randomly initialised
# transformers LlamaForCausalLM folder (4 layers, 256 channels, 4 heads, 2
# kv heads, FFN 768: widths multiples of 256, so the k-quants are not
# replaced by llama-quantize's 32-value fallbacks) with a Llama 3-style
# byte-level BPE trained by `tokenizers` on the KJV Bible; llama.cpp's
# convert_hf_to_gguf.py (bench/llama_convert.py: "llama-bpe") converts it to
# f32 and llama-quantize makes each type. Kept in .cache/kquant-llama.
# For each type:
#   1. perplexity: llama-perplexity -c C on held-out KJV text scores
#      positions C/2 .. C-2 of each chunk (its first token replaced by BOS);
#      `loom eval` scores the same tokens (the tokenization compared first)
#      as in bench/llama-check.sh: within 0.5%.
#   2. greedy: `loom generate`'s 50 greedy tokens against llama-simple's; where
#      they part, bench/llama_topgap.py prints both tokens' reference logits
#      (transformers on the file's dequantized weights) and the format's
#      error; a pass when they are within it (a near tie).
# Prints the figures and PASS/FAIL lines; exits 1 when a check fails.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LOOM=${LOOM:-build/loom}
THREADS=${THREADS:-2}
TYPES=${TYPES:-Q8_0 Q4_K_M Q5_K_M Q6_K}
FAMILY=${FAMILY:-llama}
work=$(mktemp -d /tmp/loom-llama-kquant-XXXXXX)
trap 'rm -rf "$work"' EXIT
LLAMA_DIR="${LOOM_LLAMA_DIR:-$ROOT/.cache/llama.cpp}"
BIN="$LLAMA_DIR/build/bin"
[ -x "$BIN/llama-quantize" ] && [ -x "$BIN/llama-perplexity" ] && [ -x "$BIN/llama-simple" ] || BIN="$(bench/llama-build.sh | tail -n 1)"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ "$FAMILY" = gpt2 ]; then
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
fi

C=${CTX:-128}  # llama-perplexity's chunk
K=${CHUNKS:-8} # chunks scored
NGEN=50
PROMPT="And it came to pass"
PY="/usr/bin/python3"
M=.cache/kquant-llama
bible Gen1:1-Rev22:21 </dev/null > "$work/kjv.txt"
head -c 1500000 "$work/kjv.txt" > "$work/train.txt"
tail -c 60000 "$work/kjv.txt" > "$work/eval.txt" # held out from the tokenizer's training
if [ ! -f "$M/f32.gguf" ]; then
    mkdir -p "$M"
    PYTHONPATH=.deps/hf44:.deps/py $PY bench/llama_random.py tiny "$work/train.txt" "$M/hf"
    (cd "$LLAMA_DIR/src" && LOOM_GGUF_PRE=llama-bpe PYTHONPATH="gguf-py:.:$ROOT/.deps/hf44" $PY "$ROOT/bench/llama_convert.py" "$ROOT/$M/hf" \
        --outtype f32 --outfile "$ROOT/$M/f32.gguf" > "$work/convert.log" 2>&1) || { tail -n 20 "$work/convert.log"; exit 1; }
fi
BOS=$($PY -c "import json,sys; t=json.load(open(sys.argv[1])); print([a['id'] for a in t['added_tokens'] if a['content']=='<|begin_of_text|>'][0])" "$M/hf/tokenizer.json")
$LOOM tokenize --tokenizer "$M/hf/tokenizer.json" --encode "$(cat "$work/eval.txt")" > "$work/loom_ids.txt"
echo "{\"prompt\": \"$PROMPT\", \"max_tokens\": $NGEN}" > "$work/prompt.jsonl"
fail=0

# The chunks of llama-perplexity's tokens (--kl-divergence-base), each a
# data folder whose val split is the chunk with BOS first, as it scores them.
chunks() {
    $PY - "$work" "$C" "$K" "$BOS" "$1" <<'PY'
import os, struct, sys
import numpy as np
work, C, K, bos, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
raw = open(work + "/base.bin", "rb").read()
assert raw[:8] == b"_logits_", "not a llama-perplexity logits file"
n_ctx, n_vocab, n_chunk = struct.unpack("<iii", raw[8:20])
llama = np.frombuffer(raw[20:20 + 4 * n_chunk * n_ctx], dtype=np.int32)
loom = np.array([bos] + [int(x) for x in open(work + "/loom_ids.txt").read().split()], dtype=np.int64)
same = len(loom) >= len(llama) and np.array_equal(loom[:len(llama)], llama)
print("  tokens: llama.cpp %d ids in %d chunks of %d, loom (BOS + loom tokenize) %d ids, first %d %s" %
      (len(llama), n_chunk, n_ctx, len(loom), len(llama), "identical" if same else "DIFFER"))
open(work + "/tokens_same", "w").write("1" if same else "0")
for i in range(min(K, n_chunk)):
    d = "%s/chunk%d" % (work, i)
    os.makedirs(d, exist_ok=True)
    ids = np.array(llama[i * C:(i + 1) * C], dtype=np.uint32)
    ids[0] = bos
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:7] = [0x4c4f4f4d, 1, 1024, V, len(ids), 0, 4]
    for split in ("val", "train"):
        with open("%s/%s_000000.bin" % (d, split), "wb") as f:
            f.write(hdr.tobytes()); f.write(ids.tobytes())
PY
}

check_type() { # $1: the GGUF, $2: its type's name
    local f=$1 t=$2 ppl_llama= sum=0 a b
    # llama.cpp may lose its last log lines at exit: it scores K + 1 chunks
    # and the figure is its running estimate after K ("[K]...").
    for try in 1 2 3; do
        "$BIN/llama-perplexity" -m "$f" -f "$work/eval.txt" -c "$C" -b "$C" --chunks $((K + 1)) -t "$THREADS" \
            --kl-divergence-base "$work/base.bin" --log-file "$work/ppl-file.log" > "$work/ppl.log" 2>&1 || { tail -n 20 "$work/ppl.log"; return 1; }
        ppl_llama=$(cat "$work/ppl.log" "$work/ppl-file.log" | grep -o "\[$K\][0-9.]*" | head -n 1 | sed 's/.*\]//')
        [ -n "$ppl_llama" ] && break
    done
    [ -n "$ppl_llama" ] || { echo "FAIL llama_kquant_${t}_perplexity: no running estimate after $K chunks in three runs"; return 1; }
    local V
    V=$($PY -c "import sys; sys.path.insert(0, sys.argv[2]); import gguf; r = gguf.GGUFReader(sys.argv[1]); print([t.shape[1] for t in r.tensors if t.name == 'token_embd.weight'][0])" "$f" "$LLAMA_DIR/src/gguf-py")
    chunks "$V"
    [ "$(cat "$work/tokens_same")" = 1 ] && echo "PASS llama_kquant_${t}_tokenization_equal" || { echo "FAIL llama_kquant_${t}_tokenization_equal"; fail=1; }
    for ((i = 0; i < K; i++)); do
        a=$($LOOM eval --run "$f" --data "$work/chunk$i" --batch 1 --seq $((C - 1)) --batches 1 --threads "$THREADS" 2>/dev/null | awk '{print $2}')
        b=$($LOOM eval --run "$f" --data "$work/chunk$i" --batch 1 --seq $((C / 2)) --batches 1 --threads "$THREADS" 2>/dev/null | awk '{print $2}')
        sum=$(awk -v s="$sum" -v a="$a" -v b="$b" -v C="$C" 'BEGIN{printf "%.9f", s + a*(C-1) - b*(C/2)}')
    done
    local ppl_loom rel
    ppl_loom=$(awk -v s="$sum" -v K="$K" -v C="$C" 'BEGIN{printf "%.4f", exp(s / (K * (C/2 - 1)))}')
    rel=$(awk -v a="$ppl_loom" -v b="$ppl_llama" 'BEGIN{d=(a-b)/b; if(d<0)d=-d; printf "%.2e", d}')
    echo "  perplexity on $K chunks of $C tokens (positions $((C/2))..$((C-2))): llama.cpp $ppl_llama, loom eval $ppl_loom, relative difference $rel"
    awk -v r="$rel" 'BEGIN{exit !(r <= 5e-3)}' && echo "PASS llama_kquant_${t}_perplexity_within_0.5%" || { echo "FAIL llama_kquant_${t}_perplexity_within_0.5%"; fail=1; }
    "$BIN/llama-simple" -m "$f" -n "$NGEN" "$PROMPT" > "$work/llama_gen.txt" 2> "$work/simple.log" || { tail -n 20 "$work/simple.log"; return 1; }
    $LOOM generate --run "$f" --prompts "$work/prompt.jsonl" --out "$work/loom_gen.jsonl" --threads "$THREADS" --kv-memory 32M 2>/dev/null
    echo "  llama.cpp: $(head -c 200 "$work/llama_gen.txt" | tr '\n' ' ')"
    local gap
    if gap=$(PYTHONPATH="$LLAMA_DIR/src/gguf-py:.deps/hf44:.deps/py" $PY bench/llama_topgap.py "$f" "$M/hf" "$PROMPT" "$work/llama_gen.txt" \
             "$work/loom_gen.jsonl" 2>/dev/null); then
        echo "  $gap"; echo "PASS llama_kquant_${t}_greedy_${NGEN}"
    else
        echo "  $gap"; echo "FAIL llama_kquant_${t}_greedy_${NGEN}"; fail=1
    fi
}

for t in $TYPES; do
    echo "== $t"
    "$BIN/llama-quantize" "$M/f32.gguf" "$work/m.gguf" "$t" > "$work/quantize.log" 2>&1 || { tail -n 20 "$work/quantize.log"; exit 1; }
    grep -E "type +[a-z0-9_]+: +[0-9]+ tensors|model size" "$work/quantize.log" | sed 's/^/  llama-quantize: /' | head -n 8 || true
    check_type "$work/m.gguf" "$t" || fail=1
done
exit $fail
