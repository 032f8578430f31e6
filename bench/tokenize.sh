#!/usr/bin/env bash
# Tokenizer benchmark: BPE training time to a vocabulary and encode throughput,
# loom against Hugging Face `tokenizers`, in one run, on the same input and
# thread count (1 and all cores). Prints both and the ratio.
#
#   bench/tokenize.sh [INPUT] [VOCAB]     (default: the KJV Bible x4, 8192)
#   LOOM=path/to/loom  PY=python-with-tokenizers  THREADS="1 2"
#
# loom's figures come from `loom tokenize` itself (its "timing:" line):
# training includes reading and counting the input; encoding includes reading
# the input and writing the shards. tokenizers' training is
# Tokenizer.train([file]) (it reads the file too); its encoding is encode_batch
# over ~1 KiB pieces of the text (its fastest batch size here), timed
# without reading the file.
set -eu
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY=${PY:-/usr/bin/python3}
VOCAB=${2:-8192}
THREADS=${THREADS:-"1 $(nproc)"}
T=$(mktemp -d /tmp/loom_bench_tokenize.XXXXXX)
trap 'rm -rf "$T"' EXIT
if [ -n "${1:-}" ]; then INPUT=$1; NAME=$(basename "$1")
else
    bible Gen1:1-Rev22:21 </dev/null >"$T/kjv.txt"
    for i in 1 2 3 4; do cat "$T/kjv.txt"; done >"$T/input.txt"
    INPUT=$T/input.txt; NAME="KJV Bible x4"
fi
"$LOOM" tokenize --help >/dev/null 2>&1 || { echo "bench/tokenize.sh: $LOOM has no tokenize command; build loom first" >&2; exit 2; }
"$PY" -c 'import tokenizers' 2>/dev/null || { echo "bench/tokenize.sh: $PY cannot import tokenizers; run scripts/deps.sh" >&2; exit 2; }
cat >"$T/hf.py" <<'PYEOF'
import sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
path, vocab = sys.argv[1], int(sys.argv[2])
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
t0 = time.perf_counter(); tok.train([path], tr); t1 = time.perf_counter()
text = open(path, encoding="utf-8").read()
pieces, i = [], 0
while i < len(text):  # ~1 KiB pieces cut after a newline
    j = text.find("\n", i + 1024)
    j = len(text) if j < 0 else j + 1
    pieces.append(text[i:j]); i = j
t2 = time.perf_counter(); enc = tok.encode_batch(pieces); t3 = time.perf_counter()
mb = len(text.encode()) / 1e6
print(f"{t1 - t0:.3f} {mb / (t3 - t2):.2f} {sum(len(e.ids) for e in enc)}")
PYEOF
MB=$(awk "BEGIN{printf \"%.1f\", $(stat -c %s "$INPUT")/1e6}")
echo "tokenize bench: $NAME ($MB MB), vocabulary $VOCAB, $(nproc) cores"
printf "%-8s %-14s %10s %12s %8s\n" threads measure loom tokenizers ratio
for th in $THREADS; do
    rm -rf "$T/out"
    line=$("$LOOM" tokenize --input "$INPUT" --vocab "$VOCAB" --out "$T/out" --threads "$th" --val-fraction 0 --quiet | grep '^timing:')
    ltrain=$(echo "$line" | sed -E 's/.*train ([0-9.]+) s.*/\1/')
    lenc=$(echo "$line" | sed -E 's/.*\(([0-9.]+) MB\/s.*/\1/')
    read -r htrain henc htok < <(RAYON_NUM_THREADS=$th TOKENIZERS_PARALLELISM=true "$PY" "$T/hf.py" "$INPUT" "$VOCAB")
    printf "%-8s %-14s %10s %12s %7.1fx\n" "$th" "train (s)" "$ltrain" "$htrain" "$(awk "BEGIN{print $htrain/$ltrain}")"
    printf "%-8s %-14s %10s %12s %7.1fx\n" "$th" "encode (MB/s)" "$lenc" "$henc" "$(awk "BEGIN{print $lenc/$henc}")"
done
echo "ratio: tokenizers time / loom time (above 1: loom is faster)"
