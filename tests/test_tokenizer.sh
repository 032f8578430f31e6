#!/usr/bin/env bash
# `loom tokenize` as a user runs it: flags, bad input and its exit codes,
# folders of text and binary files, --encode/--decode, and memory that stays
# bounded on a corpus several times larger than the bound.
# One line per case: PASS name / FAIL name: why / SKIP name: why.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY=${LOOM_PYTHON:-/usr/bin/python3}
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failed=1; }
if [ ! -x "$LOOM" ] || ! "$LOOM" tokenize --help >/dev/null 2>&1; then
    echo "SKIP tokenize_cli: $LOOM has no tokenize command (build it with make)"
    exit 0
fi
T=$(mktemp -d /tmp/loom_test_tokenize.XXXXXX)
trap 'rm -rf "$T"' EXIT

# expect NAME RC PATTERN -- command...: exit code RC and PATTERN in stderr
expect() {
    local name=$1 want=$2 pat=$3; shift 4
    local rc=0
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then fail "$name" "exit $rc, expected $want: $(head -c 300 "$T/err")"
    elif ! grep -q -- "$pat" "$T/err" "$T/out"; then fail "$name" "no \"$pat\" in: $(head -c 300 "$T/err")"
    else pass "$name"; fi
}

expect help 0 "--vocab" -- "$LOOM" tokenize --help
expect no_input 2 "needs --input" -- "$LOOM" tokenize --vocab 300
: >"$T/empty.txt"
expect empty_input 2 "empty" -- "$LOOM" tokenize --input "$T/empty.txt" --out "$T/e" --quiet
[ -z "$(ls "$T/e" 2>/dev/null | grep '\.bin')" ] && pass empty_input_writes_nothing || fail empty_input_writes_nothing "$(ls "$T/e")"
printf 'some text\n' >"$T/small.txt"
expect vocab_too_small 2 "must be between" -- "$LOOM" tokenize --input "$T/small.txt" --out "$T/v" --vocab 256 --quiet
expect vocab_too_large 2 "must be between" -- "$LOOM" tokenize --input "$T/small.txt" --out "$T/v" --vocab 5000000000 --quiet
expect missing_input 2 "nope.txt" -- "$LOOM" tokenize --input "$T/nope.txt" --out "$T/v" --quiet
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, \n "merges": [' >"$T/bad.json"
expect bad_tokenizer_json 2 "bad.json:2:" -- "$LOOM" tokenize --tokenizer "$T/bad.json" --encode hi
printf 'a b c\n' >"$T/merges.txt"
printf '{"a": 0}' >"$T/vocab.json"
expect bad_gpt2_pair 2 "merges.txt: line 1" -- "$LOOM" tokenize --tokenizer "$T/vocab.json" --merges "$T/merges.txt" --encode hi
expect special_with_space 2 "whitespace" -- "$LOOM" tokenize --input "$T/small.txt" --out "$T/v" --special "<a b>"

# A folder of text and a binary file: shards, tokenizer.json, no temporary files.
mkdir -p "$T/corpus"
if command -v bible >/dev/null; then bible Gen1:1-Gen50:26 </dev/null >"$T/corpus/a.txt"
else for i in $(seq 3000); do echo "In the beginning $i was the word, and the word was with text $i."; done >"$T/corpus/a.txt"; fi
head -c 65536 /dev/urandom >"$T/corpus/b.bin"
if "$LOOM" tokenize --input "$T/corpus" --vocab 1000 --out "$T/d" --quiet --shard-tokens 50000 >"$T/out" 2>"$T/err"; then
    if [ -f "$T/d/tokenizer.json" ] && [ -f "$T/d/train_000000.bin" ] && [ -f "$T/d/train_000001.bin" ] && [ -f "$T/d/val_000000.bin" ] &&
        [ -z "$(ls "$T/d" | grep tmp)" ]; then pass folder_to_shards
    else fail folder_to_shards "files: $(ls "$T/d" | tr '\n' ' ')"; fi
else fail folder_to_shards "exit $?: $(cat "$T/err")"; fi

# Re-tokenizing into the same folder with fewer shards leaves no stale shard.
if "$LOOM" tokenize --input "$T/corpus" --vocab 1000 --out "$T/d" --quiet >/dev/null 2>"$T/err" &&
    [ -f "$T/d/train_000000.bin" ] && [ ! -f "$T/d/train_000001.bin" ]; then pass no_stale_shards
else fail no_stale_shards "files: $(ls "$T/d" | tr '\n' ' ')"; fi

ids=$("$LOOM" tokenize --out "$T/d" --encode "In the beginning God created" 2>/dev/null)
back=$("$LOOM" tokenize --out "$T/d" --decode "$ids" 2>/dev/null)
if [ "$back" = "In the beginning God created" ] && [ "$(echo "$ids" | wc -w)" -lt 20 ]; then pass encode_decode
else fail encode_decode "ids \"$ids\" decode to \"$back\""; fi
expect decode_beyond_vocab 2 "position 1" -- "$LOOM" tokenize --out "$T/d" --decode "5 99999"
expect decode_not_a_number 2 "not a token id" -- "$LOOM" tokenize --out "$T/d" --decode "5 x7"

# Binary data is tokenized byte-exactly: the shard decodes to the file.
"$LOOM" tokenize --input "$T/corpus/b.bin" --tokenizer "$T/d/tokenizer.json" --out "$T/b" --val-fraction 0 --quiet >/dev/null 2>"$T/err"
if [ -f "$T/b/train_000000.bin" ] && "$PY" tests/tokenizer_oracle.py shard-ids "$T/b/train_000000.bin" 1 >"$T/ids" 2>"$T/err" &&
    "$LOOM" tokenize --tokenizer "$T/d/tokenizer.json" --decode - <"$T/ids" >"$T/b.out" 2>>"$T/err" &&
    cmp -s "$T/b.out" "$T/corpus/b.bin"; then pass binary_byte_exact
else fail binary_byte_exact "$(head -c 300 "$T/err")"; fi

# Memory: a 256 MB corpus through training and encoding in well under that.
if command -v bible >/dev/null && [ -x /usr/bin/time ] && [ "${LOOM_SANITIZED:-}" = "" ]; then
    bible Gen1:1-Rev22:21 </dev/null >"$T/kjv.txt"
    for i in $(seq 60); do cat "$T/kjv.txt"; done >"$T/big.txt"
    rm -rf "$T/d" "$T/b"
    mb=$(($(stat -c %s "$T/big.txt") / 1000000))
    if /usr/bin/time -f "%M" -o "$T/rss" "$LOOM" tokenize --input "$T/big.txt" --vocab 4096 --out "$T/big" --threads 2 --quiet >"$T/out" 2>"$T/err"; then
        rss=$(($(tail -1 "$T/rss") / 1024))
        echo "  memory: ${mb} MB corpus, peak resident ${rss} MB"
        if [ "$rss" -lt 100 ] && [ "$mb" -gt 200 ]; then pass memory_bounded
        else fail memory_bounded "peak resident ${rss} MB for a ${mb} MB corpus (limit 100 MB)"; fi
    else fail memory_bounded "exit: $(head -c 300 "$T/err")"; fi
else
    echo "SKIP memory_bounded: needs bible-kjv and /usr/bin/time, and no sanitizer"
fi
exit $failed
