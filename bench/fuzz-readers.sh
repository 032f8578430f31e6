#!/usr/bin/env bash
# A long fuzz run of every file reader (tests/fuzz/fuzz_readers.c), by input
# count, under ASan and UBSan: builds build-san/tests/fuzz_readers (make
# SANITIZE=address,undefined), writes the seeds, runs COUNT inputs per
# reader (in JOBS parallel slices with different seeds) and prints one line
# per reader for docs/fault-tolerance.md: inputs, seed files, wall and CPU
# time, crashing slices. A crash stops that slice with the sanitizer's
# report; rerun `fuzz_readers READER COUNT SEED SEEDS...` to reproduce it.
#   bench/fuzz-readers.sh [COUNT] [JOBS] [READER...]    (default 1000000, 2, all)
# Run it under `nice -n 10` on a shared machine. libFuzzer: bench/fuzz-libfuzzer.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000} JOBS=${2:-2}; shift 2 2> /dev/null || shift $#
READERS=${*:-safetensors gguf tokenizer config state manifest shard chat_template request}
make SANITIZE=address,undefined NO_CUDA=1 -j2 build-san/tests/fuzz_readers build/loom > /dev/null || exit 2
seeds=$(mktemp -d /tmp/loom-fuzzseeds-XXXXXX); trap 'rm -rf "$seeds"' EXIT
tests/fuzz/seeds.sh "$seeds" build/loom || exit 2
echo "fuzz-readers: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs:" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "fuzz-readers: command: bench/fuzz-readers.sh $COUNT $JOBS $READERS"
fail=0
for r in $READERS; do
    t0=$(date +%s); per=$((COUNT / JOBS)); bad=0
    for j in $(seq 1 "$JOBS"); do
        /usr/bin/time -f '%U %S' -o "$seeds/$r.$j.cpu" \
            build-san/tests/fuzz_readers "$r" "$per" "$j" "$seeds/$r"/* > "$seeds/$r.$j.out" 2> "$seeds/$r.$j.err" &
    done
    for j in $(seq 1 "$JOBS"); do wait -n || bad=$((bad + 1)); done
    cpu=$(awk '/^[0-9.]+ [0-9.]+$/ {s += $1 + $2} END {printf "%.0f", s}' "$seeds/$r".*.cpu)
    echo "$r: $((per * JOBS)) inputs, $(ls "$seeds/$r" | wc -l) seed file(s), $(( $(date +%s) - t0 )) s wall, $cpu s CPU," \
        "$bad crashing slice(s) (slices seeded 1..$JOBS, $per inputs each)"
    [ $bad = 0 ] || { fail=1; grep -h -m5 -E 'ERROR|runtime error|SUMMARY' "$seeds/$r".*.err; }
done
exit $fail
