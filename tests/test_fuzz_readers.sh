#!/usr/bin/env bash
# Every file reader and the HTTP request parser under mutated inputs
# (tests/fuzz/fuzz_readers.c, fuzz_request.c): a bounded count per reader
# (by inputs, not time), from fixed seeds, so a failure reproduces from
# READER COUNT SEED. The sanitizer build is used
# when make test built it (build-san/), else the plain one. Long runs:
# bench/fuzz-readers.sh.
set -u
cd "$(dirname "$0")/.."
LOOM=$(realpath "${LOOM:-build/loom}")
N=${FUZZ_READERS_COUNT:-400}
bin=build-san/tests/fuzz_readers; [ -x $bin ] || bin=build/tests/fuzz_readers
if [ ! -x $bin ]; then echo "FAIL fuzz_readers: $bin is not built (run make)"; exit 0; fi
tmp=$(mktemp -d /tmp/loom-fuzzr-XXXXXX); trap 'rm -rf "$tmp"' EXIT
tests/fuzz/seeds.sh "$tmp/seeds" "$LOOM" || { echo "FAIL fuzz_seeds: could not write the seed files"; exit 0; }
for r in safetensors gguf tokenizer config state manifest shard chat_template request; do
    out=$(TMPDIR=$tmp $bin $r $N 28 "$tmp/seeds/$r"/* 2>&1 > "$tmp/$r.out"); rc=$?
    if [ $rc = 0 ] && grep -q "no crash" "$tmp/$r.out"; then echo "PASS fuzz_${r} ($N inputs, $bin)"
    else echo "FAIL fuzz_${r}: exit $rc: $(printf '%s' "$out" | grep -m3 -E 'ERROR|runtime error|SUMMARY|Abort' | tr '\n' ' ')"; fi
done
