#!/usr/bin/env bash
# A long fuzz run of every file reader (tests/fuzz/fuzz_readers.c), by input
# count, under ASan and UBSan: builds build-san/tests/fuzz_readers (make
# SANITIZE=address,undefined), writes the seeds, runs COUNT inputs per
# reader (in JOBS parallel slices with different seeds) and prints one line
# per reader for docs/fault-tolerance.md. A crash stops that slice with the
# sanitizer's report; rerun `fuzz_readers READER COUNT SEED SEEDS...` to
# reproduce it.
#   bench/fuzz-readers.sh [COUNT] [JOBS] [READER...]    (default 1000000, 2, all)
# With clang and libclang-rt-14-dev (scripts/deps.sh), --libfuzzer READER
# SECONDS runs libFuzzer on one reader instead.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --libfuzzer ]; then
    r=$2 secs=${3:-180}
    command -v clang > /dev/null || { echo "fuzz-readers: clang is missing (apt-get install clang libclang-rt-14-dev)"; exit 2; }
    make CC=clang SANITIZE=fuzzer-no-link,address,undefined NO_CUDA=1 -j2 build-san/libloom.a > /dev/null || exit 2
    clang -g -O1 -DLOOM_LIBFUZZER -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_readers.c \
        -Wl,--whole-archive build-san/libloom.a -Wl,--no-whole-archive -fopenmp -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd \
        -o build-san/fuzz_readers_lf || exit 2
    tests/fuzz/seeds.sh build-san/fuzz-seeds build/loom
    LOOM_FUZZ_READER=$r build-san/fuzz_readers_lf -max_total_time="$secs" -max_len=65536 build-san/fuzz-seeds/"$r"
    exit $?
fi
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
