#!/usr/bin/env bash
# libFuzzer (clang, coverage-guided) on the same targets as the mutation
# driver: every file reader of tests/fuzz/fuzz_readers.c (built with
# -DLOOM_LIBFUZZER, the target chosen by LOOM_FUZZ_READER) and the HTTP
# request parser (tests/fuzz/fuzz_request.c, target "request"), under ASan
# and UBSan.
# loom's library is built by clang into build-fuzz/ (make CC=clang
# BUILD=build-fuzz, -fsanitize=fuzzer-no-link), apart from build/ and
# build-san/. Each target runs for a bounded time or input count, starting
# from the seed files of tests/fuzz/seeds.sh; a crash leaves its input as
# build-fuzz/crash-* (rerun: LOOM_FUZZ_READER=R build-fuzz/fuzz_readers FILE).
#   bench/fuzz-libfuzzer.sh [SECONDS] [TARGET...]   (default 60 s each; all readers and "request")
#   FUZZ_RUNS=N bench/fuzz-libfuzzer.sh 0 gguf     (N inputs instead of a time)
# Without clang or libFuzzer's runtime it says so and exits 0 (nothing run).
# Run it under `nice -n 10` on a shared machine.
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}; shift 2> /dev/null
TARGETS=${*:-safetensors gguf tokenizer config state manifest shard chat_template request}
B=build-fuzz
if ! command -v clang > /dev/null; then echo "SKIP fuzz-libfuzzer: clang is not installed (Debian: clang)"; exit 0; fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *p, long n) { return 0; }' | clang -x c -fsanitize=fuzzer - -o /dev/null 2> /dev/null; then
    echo "SKIP fuzz-libfuzzer: clang $(clang -dumpversion) has no libFuzzer runtime (Debian: libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev)"; exit 0
fi
mkdir -p $B
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# -Wno-error: clang warns where gcc (the project's compiler, -Werror) does not.
# clang before 15 has no _Float16 on x86-64 (loom's fp16 conversions):
# __fp16 converts the same way (F16C instructions, or compiler-rt's builtins).
COMPAT=""; [ "$(clang -dumpversion | cut -d. -f1)" -lt 15 ] && COMPAT="-D_Float16=__fp16"
make NO_CUDA=1 -j2 build/loom > /dev/null || exit 2  # the seeds' writer (gcc)
make CC=clang BUILD=$B NO_CUDA=1 NO_MPI=1 OPT=-O1 EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $SAN $COMPAT -Wno-error" -j2 $B/libloom.a > $B/build.log 2>&1 \
    || { echo "fuzz-libfuzzer: the clang build failed, see $B/build.log"; tail -5 $B/build.log; exit 2; }
LIBS="-lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd $(clang -print-libgcc-file-name --rtlib=compiler-rt 2> /dev/null)"
clang -g -O1 -march=native -fopenmp -Isrc $COMPAT -DLOOM_LIBFUZZER -fsanitize=fuzzer $SAN tests/fuzz/fuzz_readers.c tests/fuzz/fuzz_request.c \
    -Wl,--whole-archive $B/libloom.a -Wl,--no-whole-archive $LIBS -o $B/fuzz_readers || exit 2
work=$(mktemp -d /tmp/loom-libfuzzer-XXXXXX); trap 'rm -rf "$work"' EXIT
tests/fuzz/seeds.sh "$work/seeds" build/loom || exit 2
echo "fuzz-libfuzzer: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), clang $(clang -dumpversion)," \
    "$(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "fuzz-libfuzzer: command: ${FUZZ_RUNS:+FUZZ_RUNS=$FUZZ_RUNS }bench/fuzz-libfuzzer.sh $SECS $TARGETS"
bound=(-max_total_time="$SECS"); [ -n "${FUZZ_RUNS:-}" ] && bound=(-runs="$FUZZ_RUNS")
fail=0
for t in $TARGETS; do
    mkdir -p "$work/corpus/$t"; t0=$(date +%s)
    LOOM_FUZZ_READER=$t $B/fuzz_readers "${bound[@]}" -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix=$B/"$t"- "$work/corpus/$t" "$work/seeds/$t" > "$work/$t.log" 2>&1; rc=$?
    execs=$(grep -m1 'stat::number_of_executed_units' "$work/$t.log" | awk '{print $2}')
    echo "$t: ${execs:-?} inputs, $(ls "$work/seeds/$t" | wc -l) seed file(s), $(( $(date +%s) - t0 )) s, corpus $(ls "$work/corpus/$t" | wc -l)," \
        "exit $rc $([ $rc = 0 ] && echo '(no crash)' || echo '(CRASH)')"
    [ $rc = 0 ] || { fail=1; grep -m5 -E 'ERROR|runtime error|SUMMARY|Test unit written' "$work/$t.log"; }
done
exit $fail
