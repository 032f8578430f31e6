#!/usr/bin/env bash
# loom's GGUF export checked by llama.cpp itself (not part of `make test`: it
# needs the 15+ minute build of bench/llama-build.sh).
#
#   bench/llama-check.sh                 # trains a small model first (a few minutes)
#   RUN=runs/NAME bench/llama-check.sh   # or checks an existing run (its tokenizer must be BPE)
#
# 1. Perplexity: `llama-perplexity -c C` on loom's f32 GGUF scores, in each
#    chunk of C tokens, the predictions of positions C/2 .. C-2 (each chunk
#    on its own context). loom scores the same predictions with `loom eval`:
#    per chunk, the mean loss over positions 0..C-2 (--seq C-1) times C-1
#    minus the mean over 0..C/2-1 (--seq C/2) times C/2. The chunks are the
#    same tokens: llama.cpp's tokenization (read back from its
#    --kl-divergence-base file) must equal `loom tokenize --encode`'s.
#    Pass: the two perplexities within 0.1%.
# 2. Greedy: llama-simple's 50 greedy tokens must equal `loom sample
#    --temperature 0`'s, byte for byte.
# 0. (before the build) llama.cpp's convert_hf_to_gguf.py on loom's hf export
#    writes the same GGUF as `loom export --format gguf`; loom reads it.
# DTYPE=q8_0 (QUANT=w8a32 or w8a8) checks a Q8_0 GGUF instead: llama.cpp
# runs its Q8_0 kernels, loom the same file with --quant (the file's int8
# blocks); perplexity within 1% (llama.cpp also quantizes activations to
# blocks of 32), the greedy tokens compared and reported. NO_CONVERTER=1
# skips section 0.
# QTYPE=Q4_K_M (or Q5_K_M, Q6_K, Q8_0, any llama-quantize type) checks the
# f32 export quantized by llama.cpp's llama-quantize: loom runs the file's
# blocks as stored (docs/quantization.md), `loom eval` the dequantized
# weights; perplexity within 0.5%, the greedy tokens compared and reported
# (bench/llama-kquant.sh runs the four types on one model).
# Prints the figures and PASS/FAIL lines; exits 1 when a check fails.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LOOM=${LOOM:-build/loom}
THREADS=${THREADS:-2}
C=${CTX:-128}      # llama-perplexity's chunk (<= the model's context)
K=${CHUNKS:-8}     # chunks scored
NGEN=50
DTYPE=${DTYPE:-f32}
QFLAGS=; BOUND=1e-3
[ "$DTYPE" = f32 ] || { QFLAGS="--quant ${QUANT:-w8a32}"; BOUND=1e-2; }
QTYPE=${QTYPE:-}
[ -z "$QTYPE" ] || { DTYPE=f32; QFLAGS=; BOUND=5e-3; }
LLAMA_DIR="${LOOM_LLAMA_DIR:-$ROOT/.cache/llama.cpp}"
work=$(mktemp -d /tmp/loom-llama-check-XXXXXX)
cleanup() { if [ -n "${KEEP:-}" ]; then echo "llama-check: files kept in $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
fail=0

# The model: a run to check, or a small one trained now on the KJV Bible.
bible Gen1:1-Rev22:21 </dev/null > "$work/kjv.txt"
head -c 1500000 "$work/kjv.txt" > "$work/train.txt"
tail -c 60000 "$work/kjv.txt" > "$work/eval.txt" # held out: never trained on
if [ -z "${RUN:-}" ]; then
    RUN="$work/run"
    $LOOM tokenize --input "$work/train.txt" --vocab 2048 --out "$work/data" --quiet --threads "$THREADS" > /dev/null
    echo "llama-check: training a 4-layer, 128-channel GPT-2 for 400 steps (a few minutes)"
    $LOOM train --data "$work/data" --layers 4 --heads 4 --channels 128 --context 128 --steps 400 --batch 8 --seq 128 \
        --lr 3e-3 --warmup 40 --eval-every 0 --sample-tokens 0 --threads "$THREADS" --out "$RUN" 2>&1 | tail -n 1
fi
$LOOM export --run "$RUN" --format gguf --dtype "$DTYPE" --out "$work/m.gguf"
if [ -n "$QTYPE" ]; then
    QBIN="$LLAMA_DIR/build/bin"
    [ -x "$QBIN/llama-quantize" ] || QBIN="$(bench/llama-build.sh | tail -n 1)"
    LD_LIBRARY_PATH="$QBIN" "$QBIN/llama-quantize" "$work/m.gguf" "$work/mq.gguf" "$QTYPE" > "$work/quantize.log" 2>&1 \
        || { tail -n 20 "$work/quantize.log"; exit 1; }
    grep -E "type +[a-z0-9_]+: +[0-9]+ tensors|llama_model_quantize_impl: model size|falling back" "$work/quantize.log" | sed 's/^/  llama-quantize: /' | head -n 12 || true
    mv "$work/mq.gguf" "$work/m.gguf"
    DTYPE="$QTYPE"
    NO_CONVERTER=1 # the converter writes f32/f16/q8_0 only
fi

# 0. llama.cpp's own converter on loom's Hugging Face export writes the same
#    GGUF (metadata, tensor names, shapes, types, bytes) as loom, and loom
#    reads the converter's file. Needs only the source tree.
if [ -z "${NO_CONVERTER:-}" ]; then
[ -f "$LLAMA_DIR/src/convert_hf_to_gguf.py" ] || bench/llama-build.sh > /dev/null
$LOOM export --run "$RUN" --format hf --out "$work/hf" > /dev/null
(cd "$LLAMA_DIR/src" && PYTHONPATH="gguf-py:.:$ROOT/.deps/hf" /usr/bin/python3 "$ROOT/bench/llama_convert.py" "$work/hf" \
    --outtype f32 --outfile "$work/conv.gguf" > "$work/convert.log" 2>&1) || { tail -n 20 "$work/convert.log"; exit 1; }
PYTHONPATH="$LLAMA_DIR/src/gguf-py" /usr/bin/python3 - "$work/conv.gguf" "$work/m.gguf" <<'PY' && echo "PASS llama_converter_same_gguf" || { echo "FAIL llama_converter_same_gguf"; fail=1; }
import sys
import numpy as np
import gguf
a, b = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
ka, kb = set(a.fields), set(b.fields)
print("converter-only keys:", sorted(ka - kb), "loom-only keys:", sorted(kb - ka))
diff = [k for k in sorted(ka & kb) if k != "general.name" and not k.startswith("GGUF.") and
        (a.fields[k].types != b.fields[k].types or a.fields[k].contents() != b.fields[k].contents())]
print("keys with other values:", diff)
ta = {t.name: t for t in a.tensors}
tb = {t.name: t for t in b.tensors}
same = set(ta) == set(tb) and all(list(ta[n].shape) == list(tb[n].shape) and ta[n].tensor_type == tb[n].tensor_type
                                  and np.array_equal(ta[n].data, tb[n].data) for n in ta)
print("tensors: %d vs %d, names, shapes, types and bytes %s" % (len(ta), len(tb), "identical" if same else "DIFFER"))
sys.exit(0 if same and not diff and not (kb - ka) and (ka - kb) <= {"general.size_label"} else 1)
PY
a=$($LOOM sample --gguf "$work/conv.gguf" --prompt "And" --tokens 30 --temperature 0 --threads "$THREADS" 2>/dev/null)
b=$($LOOM sample --run "$RUN" --prompt "And" --tokens 30 --temperature 0 --threads "$THREADS" 2>/dev/null)
[ "$a" = "$b" ] && echo "PASS loom_reads_converter_gguf" || { echo "FAIL loom_reads_converter_gguf: '$a' vs '$b'"; fail=1; }
fi

BIN="$LLAMA_DIR/build/bin" # the two tools this check needs, else wait for (or run) the build
[ -x "$BIN/llama-perplexity" ] && [ -x "$BIN/llama-simple" ] || BIN="$(bench/llama-build.sh | tail -n 1)"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# 1. Perplexity.
# llama.cpp logs from a thread that may lose the last lines at exit: the
# figure is read from stdout or --log-file, with up to three tries.
ppl_llama=
for try in 1 2 3; do
    "$BIN/llama-perplexity" -m "$work/m.gguf" -f "$work/eval.txt" -c "$C" -b "$C" --chunks "$K" -t "$THREADS" \
        --kl-divergence-base "$work/base.bin" --log-file "$work/ppl-file.log" > "$work/ppl.log" 2>&1 || { tail -n 20 "$work/ppl.log"; exit 1; }
    ppl_llama=$(cat "$work/ppl.log" "$work/ppl-file.log" | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' | tail -n 1)
    [ -n "$ppl_llama" ] && break
done
[ -n "$ppl_llama" ] || { echo "FAIL llama_perplexity: no 'Final estimate' in three runs (log: $work/ppl.log)"; exit 1; }
$LOOM tokenize --tokenizer "$RUN/tokenizer.json" --encode "$(cat "$work/eval.txt")" > "$work/loom_ids.txt"
# Per chunk: a data folder whose val split is exactly the chunk's C tokens.
/usr/bin/python3 - "$work" "$C" "$K" "$RUN/tokenizer.json" <<'PY'
import os, shutil, struct, sys
import numpy as np
work, C, K, tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
raw = open(work + "/base.bin", "rb").read()
assert raw[:8] == b"_logits_", "not a llama-perplexity logits file"
n_ctx, n_vocab, n_chunk = struct.unpack("<iii", raw[8:20])
llama = np.frombuffer(raw[20:20 + 4 * n_chunk * n_ctx], dtype=np.int32)
loom = np.array([int(x) for x in open(work + "/loom_ids.txt").read().split()], dtype=np.int64)
same = len(loom) >= len(llama) and np.array_equal(loom[:len(llama)], llama)
print("tokens: llama.cpp %d ids in %d chunks of %d, loom %d ids, first %d %s" %
      (len(llama), n_chunk, n_ctx, len(loom), len(llama), "identical" if same else "DIFFER"))
open(work + "/tokens_same", "w").write("1" if same else "0")
def shard(path, ids, vocab):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:7] = [0x4c4f4f4d, 1, 1024, vocab, len(ids) & 0xffffffff, len(ids) >> 32, 4]
    with open(path, "wb") as f:
        f.write(hdr.tobytes()); f.write(np.asarray(ids, dtype=np.uint32).tobytes())
import json
vocab = len(json.load(open(tok))["model"]["vocab"])
for i in range(min(K, n_chunk)):
    d = "%s/chunk%d" % (work, i)
    os.makedirs(d, exist_ok=True)
    ids = llama[i * C:(i + 1) * C]
    shard(d + "/val_000000.bin", ids, vocab)
    shard(d + "/train_000000.bin", ids, vocab)
    shutil.copy(tok, d + "/tokenizer.json")
PY
[ "$(cat "$work/tokens_same")" = 1 ] && echo "PASS llama_tokenization_equal" || { echo "FAIL llama_tokenization_equal"; fail=1; }
sum=0
for ((i = 0; i < K; i++)); do
    # shellcheck disable=SC2086 # QFLAGS are words
    a=$($LOOM eval --run "$work/m.gguf" --data "$work/chunk$i" --batch 1 --seq $((C - 1)) --batches 1 --threads "$THREADS" $QFLAGS | awk '{print $2}')
    # shellcheck disable=SC2086
    b=$($LOOM eval --run "$work/m.gguf" --data "$work/chunk$i" --batch 1 --seq $((C / 2)) --batches 1 --threads "$THREADS" $QFLAGS | awk '{print $2}')
    sum=$(awk -v s="$sum" -v a="$a" -v b="$b" -v C="$C" 'BEGIN{printf "%.9f", s + a*(C-1) - b*(C/2)}')
done
ppl_loom=$(awk -v s="$sum" -v K="$K" -v C="$C" 'BEGIN{printf "%.4f", exp(s / (K * (C/2 - 1)))}')
rel=$(awk -v a="$ppl_loom" -v b="$ppl_llama" 'BEGIN{d=(a-b)/b; if(d<0)d=-d; printf "%.2e", d}')
echo "perplexity of the $DTYPE GGUF on $K chunks of $C tokens (positions $((C/2))..$((C-2)) scored): llama.cpp $ppl_llama, loom eval ${QFLAGS:-(fp32)} $ppl_loom, relative difference $rel"
pct=$(awk -v b="$BOUND" 'BEGIN{print b * 100}')
awk -v r="$rel" -v b="$BOUND" 'BEGIN{exit !(r <= b)}' && echo "PASS llama_perplexity_within_${pct}%" || { echo "FAIL llama_perplexity_within_${pct}%"; fail=1; }

# 2. Greedy generation: llama.cpp's llama-simple (greedy sampler; prints the
#    prompt's and each new token's bytes) against loom sample --temperature 0.
prompt="And it came to pass"
"$BIN/llama-simple" -m "$work/m.gguf" -n "$NGEN" "$prompt" > "$work/llama_gen.txt" 2> "$work/simple.log" || { tail -n 20 "$work/simple.log"; exit 1; }
# shellcheck disable=SC2086
$LOOM sample --run "$work/m.gguf" --prompt "$prompt" --tokens "$NGEN" --temperature 0 --threads "$THREADS" $QFLAGS > "$work/loom_gen.txt" 2>/dev/null
echo "greedy, $NGEN tokens after \"$prompt\":"
echo "  llama.cpp: $(head -c 300 "$work/llama_gen.txt")"
echo "  loom:      $(head -c 300 "$work/loom_gen.txt")"
if cmp -s "$work/llama_gen.txt" "$work/loom_gen.txt"; then echo "PASS llama_greedy_${NGEN}_tokens_equal"
elif [ "$DTYPE" != f32 ]; then # different quantized arithmetic: report where the texts part
    echo "greedy texts differ from byte $(cmp "$work/llama_gen.txt" "$work/loom_gen.txt" | awk '{print $5}' | tr -d ,) on (not a failure for $DTYPE)"
else echo "FAIL llama_greedy_${NGEN}_tokens_equal"; fail=1; fi
exit $fail
