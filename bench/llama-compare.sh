#!/usr/bin/env bash
# loom beside llama.cpp (issue 25's and issue 22's Speed sections) and beside
# PyTorch for training, on the same weights, alternating sides and repeating:
# medians and spread (docs/perf.md, "loom beside llama.cpp"). Not part of
# `make test`: it needs llama.cpp built (bench/llama-build.sh) and takes
# most of an hour on a loaded 2-core machine.
#
#   bench/llama-compare.sh                  # gpt2-small and smollm2-135m shapes, 3 rounds
#   MODELS=gpt2-small ROUNDS=2 bench/llama-compare.sh
#   THREADS=1 GEN=32 bench/llama-compare.sh   # on a loaded machine (a 2-thread team thrashes there)
#   PARTS="generate serve train" bench/llama-compare.sh   # any subset
#   R0=4 ROUNDS=1 PARTS=generate bench/llama-compare.sh    # one more round, same WORK
#
# Models: the preset's shape with a 4096-id BPE vocabulary trained on the
# KJV Bible, weights from one training step (as good as random for speed),
# exported by loom as f32 and Q8_0 GGUF; for the Llama-family shape also
# converted by llama.cpp's own convert_hf_to_gguf.py from loom's Hugging Face
# export where that works (the file llama.cpp then runs; else loom's own).
# Per round, each pair runs loom first then llama.cpp:
#   generate  loom bench generate (128 in, GEN out; 1 stream and 16) vs
#             llama-bench pp128/tg and llama-batched-bench -npl 16, fp32
#             then W8A8 against Q8_0
#   serve     loom bench serve vs llama-server (it drives both), 1 and 16 clients
#   train     loom bench train (own GEMM) vs PyTorch, llama-tiny and the
#             135M shape (bench/torch_train.py --llama)
# Raw outputs go to $WORK; the tables come from bench/llama_compare.py.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$ROOT/build/loom}
ROUNDS=${ROUNDS:-3}
SERVE_ROUNDS=${SERVE_ROUNDS:-2}
THREADS=${THREADS:-2}
GEN=${GEN:-64} # new tokens per request (prompts are 128)
MODELS=${MODELS:-gpt2-small smollm2-135m}
PARTS=${PARTS:-generate serve train}
LLAMA_DIR="${LOOM_LLAMA_DIR:-$ROOT/.cache/llama.cpp}"
BIN="$LLAMA_DIR/build/bin"
WORK=${WORK:-/tmp/loom-llama-compare}
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$WORK"
RES="$WORK/results.tsv" # appended to: a later call adds rounds (FRESH=1 starts over)
[ -n "${FRESH:-}" ] && : > "$RES"
touch "$RES"
R0=${R0:-1} # the first round's number (a later call continues the count)

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|L2|L3)' | sed 's/  */ /g'
    echo "avx512: $(grep -o -m1 -w 'avx512f\|avx512_vnni\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "llama.cpp: $(ls "$LLAMA_DIR"/dl 2>/dev/null | head -1)"
} | tee "$WORK/machine.txt"

rec() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$RES"; } # model measure side round value
load() { cut -d' ' -f1 /proc/loadavg; }

# The model folder, its f32 and Q8_0 GGUFs (llama.cpp's converter's where it works).
make_model() {
    local name=$1 d="$WORK/$1"
    [ -f "$d/q8_0.gguf" ] && return 0
    if [ ! -d "$WORK/data" ]; then
        bible Gen1:1-Rev22:21 < /dev/null > "$WORK/kjv.txt"
        "$LOOM" tokenize --input "$WORK/kjv.txt" --vocab 4096 --out "$WORK/data" --quiet --threads "$THREADS" > /dev/null
    fi
    "$LOOM" train --data "$WORK/data" --model "$name" --steps 1 --batch 1 --seq 64 --eval-every 0 --sample-tokens 0 \
        --threads "$THREADS" --out "$d/run" > "$d.train.log" 2>&1 || { tail -3 "$d.train.log"; return 1; }
    "$LOOM" export --run "$d/run" --format gguf --dtype f32 --out "$d/f32.gguf" --force > /dev/null
    "$LOOM" export --run "$d/run" --format gguf --dtype q8_0 --out "$d/q8_0.gguf" --force > /dev/null
    echo "$name: loom's own GGUF export" > "$d/gguf-origin.txt"
    if [ "$name" != gpt2-small ] && "$LOOM" export --run "$d/run" --format hf --out "$d/hf" --force > /dev/null 2>&1; then
        local ok=1 t
        for t in f32 q8_0; do
            (cd "$LLAMA_DIR/src" && PYTHONPATH="gguf-py:.:$ROOT/.deps/hf44" /usr/bin/python3 "$ROOT/bench/llama_convert.py" "$d/hf" \
                --outtype "$t" --outfile "$d/conv-$t.gguf" > "$d/convert-$t.log" 2>&1) || ok=0
        done
        if [ $ok = 1 ]; then
            mv "$d/conv-f32.gguf" "$d/f32.gguf" && mv "$d/conv-q8_0.gguf" "$d/q8_0.gguf"
            echo "$name: llama.cpp's convert_hf_to_gguf.py on loom's Hugging Face export" > "$d/gguf-origin.txt"
        else
            echo "$name: loom's own GGUF export (the converter failed: $(tail -1 "$d"/convert-*.log | tr '\n' ' '))" > "$d/gguf-origin.txt"
        fi
    fi
    cat "$d/gguf-origin.txt"
}

# One round of `generate` for model $1, side $2 (fp32 or w8a8), round $3.
generate_round() {
    local m=$1 q=$2 r=$3 d="$WORK/$1" g qf=() out
    if [ "$q" = fp32 ]; then g="$d/f32.gguf"; else g="$d/q8_0.gguf"; qf=(--quant w8a8); fi
    out="$d/gen-$q-$r.txt"
    rec "$m" load "-" "$r" "$(load)"
    "$LOOM" bench generate --run "$d/run" --prompt-len 128 --gen "$GEN" --concurrency 1,16 --repeat 1 --threads "$THREADS" \
        --kv-memory 1G "${qf[@]}" --llama-bench /nonexistent > "$out" 2>&1
    awk -v m="$m" -v q="$q" -v r="$r" '
        / one request at a time / && $1 == q { printf "%s\t%s_one_out\tloom\t%s\t%s\n%s\t%s_ttft_ms\tloom\t%s\t%s\n%s\t%s_decode\tloom\t%s\t%s\n%s\t%s_floor\tloom\t%s\t%s\n", m,q,r,$7, m,q,r,$9, m,q,r,$11, m,q,r,$14 }
        / continuous batching, 16 / && $1 == q { printf "%s\t%s_16_out\tloom\t%s\t%s\n", m,q,r,$5 }
        /^memory read bandwidth/ { printf "%s\tbandwidth_gbs\tprobe\t%s\t%s\n", m,r,$4 }
        / GB of weights per decode token| MB of weights per decode token/ && $1 == q { for (i = 1; i <= NF; i++) if ($i ~ /^(MB|GB)$/) printf "%s\t%s_bytes_per_token_%s\tloom\t%s\t%s\n", m,q,$i,r,$(i-1) }' "$out" >> "$RES"
    "$BIN/llama-bench" -m "$g" -t "$THREADS" -p 128 -n "$GEN" -r 1 -o json > "$d/llb-$q-$r.json" 2> /dev/null
    /usr/bin/python3 - "$d/llb-$q-$r.json" "$m" "$q" "$r" >> "$RES" <<'PY'
import json, sys
f, m, q, r = sys.argv[1:]
try:
    rows = json.load(open(f))
except Exception:
    rows = []
for t in rows:
    kind = "pp" if t.get("n_prompt", 0) > 0 else "tg"
    print("%s\t%s_%s\tllama\t%s\t%.2f" % (m, q, kind, r, t["avg_ts"]))
PY
    "$BIN/llama-batched-bench" -m "$g" -t "$THREADS" -c $((16 * (128 + GEN) + 64)) -b 2048 -ub 512 -npp 128 -ntg "$GEN" -npl 16 \
        --output-format jsonl > "$d/llbb-$q-$r.jsonl" 2> /dev/null
    /usr/bin/python3 - "$d/llbb-$q-$r.jsonl" "$m" "$q" "$r" >> "$RES" <<'PY'
import json, sys
f, m, q, r = sys.argv[1:]
for line in open(f):
    if line.startswith("{"):
        o = json.loads(line)
        if o.get("pl") == 16:
            print("%s\t%s_16_out\tllama\t%s\t%.2f" % (m, q, r, o["pl"] * o["tg"] / o["t"]))
            print("%s\t%s_16_decode_only\tllama\t%s\t%.2f" % (m, q, r, o["speed_tg"]))
PY
}

serve_round() {
    local m=$1 r=$2 d="$WORK/$1" out="$WORK/$1/serve-$2.txt"
    rec "$m" load "-" "$r" "$(load)"
    "$LOOM" bench serve --run "$d/run" --gguf "$d/f32.gguf" --text "$WORK/kjv.txt" --clients 1,16 --in 128 --out "$GEN" \
        --threads "$THREADS" --kv-memory 1G --max-seqs 16 --llama-server "$BIN/llama-server" > "$out" 2>&1
    # | server | load | ok | req/s | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 |
    awk -F'|' -v m="$m" -v r="$r" '$2 ~ /loom|llama/ && $3 ~ /clients/ {
        gsub(/ /, "", $2); split($3, c, " "); side = ($2 ~ /llama/) ? "llama" : "loom";
        printf "%s\tserve%s_out\t%s\t%s\t%s\n%s\tserve%s_ttft_p50\t%s\t%s\t%s\n%s\tserve%s_itl_p50\t%s\t%s\t%s\n%s\tserve%s_itl_p99\t%s\t%s\t%s\n",
            m,c[1],side,r,$6+0, m,c[1],side,r,$7+0, m,c[1],side,r,$9+0, m,c[1],side,r,$10+0 }' "$out" >> "$RES"
}

train_part() {
    local m shape
    for m in llama-tiny smollm2-135m; do
        shape="--seq 256 --batch 4"
        [ "$m" = llama-tiny ] || shape="--seq ${TRAIN_SEQ:-128} --batch ${TRAIN_BATCH:-1}" # 0.1 TFLOP a step
        # shellcheck disable=SC2086 # shape is words
        "$LOOM" bench train --model "$m" $shape --threads "$THREADS" --rounds "$ROUNDS" --steps 1 --gemm own \
            > "$WORK/train-$m.txt" 2>&1
        echo "load after $m: $(load)" >> "$WORK/train-$m.txt"
    done
}

for m in $MODELS; do make_model "$m" || exit 1; done
case " $PARTS " in *" generate "*)
    for r in $(seq "$R0" $((R0 + ROUNDS - 1))); do
        for m in $MODELS; do
            for q in fp32 w8a8; do generate_round "$m" "$q" "$r"; done
        done
        echo "generate round $r done, load $(load)"
    done ;;
esac
case " $PARTS " in *" serve "*)
    for r in $(seq "$R0" $((R0 + SERVE_ROUNDS - 1))); do
        for m in $MODELS; do serve_round "$m" "$r"; done
        echo "serve round $r done, load $(load)"
    done ;;
esac
case " $PARTS " in *" train "*) train_part ;; esac
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$WORK/machine.txt"
/usr/bin/python3 bench/llama_compare.py "$WORK"
