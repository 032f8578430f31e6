#!/usr/bin/env bash
# A long fuzz run of every file reader (tests/fuzz/fuzz_readers.c), by input
# count, under ASan and UBSan: builds build-san/tests/fuzz_readers (make
# SANITIZE=address,undefined), writes the seeds, runs COUNT inputs per
# reader (in JOBS parallel slices with different seeds) and prints one line
# per reader for docs/fault-tolerance.md. A crash stops that slice with the
# sanitizer's report; rerun `fuzz_readers READER COUNT SEED SEEDS...` to
# reproduce it.
#   bench/fuzz-readers.sh [COUNT] [JOBS] [READER...]    (default 1000000, 2, all)
# The target also builds for libFuzzer (-DLOOM_LIBFUZZER, LOOM_FUZZ_READER);
# that needs the library built by clang in a folder of its own, not done yet.
set -uo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000} JOBS=${2:-2}; shift 2 2> /dev/null || shift $#
READERS=${*:-safetensors gguf tokenizer config state manifest shard chat_template}
make SANITIZE=address,undefined NO_CUDA=1 -j2 build-san/tests/fuzz_readers build/loom > /dev/null || exit 2
seeds=$(mktemp -d /tmp/loom-fuzzseeds-XXXXXX); trap 'rm -rf "$seeds"' EXIT
tests/fuzz/seeds.sh "$seeds" build/loom || exit 2
for r in $READERS; do
    t0=$(date +%s); per=$((COUNT / JOBS)); bad=0
    for j in $(seq 1 "$JOBS"); do
        TMPDIR=$seeds build-san/tests/fuzz_readers "$r" "$per" "$j" "$seeds/$r"/* > "$seeds/$r.$j.out" 2> "$seeds/$r.$j.err" &
    done
    for j in $(seq 1 "$JOBS"); do wait -n || bad=$((bad + 1)); done
    echo "$r: $((per * JOBS)) inputs in $(( $(date +%s) - t0 )) s, $bad crashing slice(s) (seeds 1..$JOBS)"
    [ $bad = 0 ] || grep -h -m5 -E 'ERROR|runtime error|SUMMARY' "$seeds/$r".*.err
done
