#!/usr/bin/env bash
# The metrics registry, HTTP server and dashboard (and, below, the CPU
# thread team) under ThreadSanitizer:
# tests/test_metrics.c (2 writer threads x 10^6 updates while a reader
# renders, HTTP handler threads, the dashboard's sampler thread) built with
# -fsanitize=thread from the few sources it needs; any data race report
# fails.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/loom-tsan-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! echo 'int main(void){return 0;}' | cc -x c -fsanitize=thread -o "$tmp/probe" - 2> /dev/null; then
    echo "SKIP metrics_tsan: this compiler cannot build with -fsanitize=thread"; exit 0
fi
if ! cc -std=gnu11 -O1 -g -fsanitize=thread -Isrc -Itests -o "$tmp/t" tests/test_metrics.c tests/check.c src/obs/metrics.c \
    src/obs/sbuf.c src/obs/dashboard.c src/obs/http.c src/core/core.c -lcjson -lm -lpthread -lmicrohttpd > "$tmp/cc.log" 2>&1; then
    echo "FAIL metrics_tsan_build: $(tail -5 "$tmp/cc.log")"; exit 1
fi
out=$(TSAN_OPTIONS=halt_on_error=0 "$tmp/t" 2>&1); rc=$?
races=$(printf '%s\n' "$out" | grep -c "WARNING: ThreadSanitizer")
if [ "$races" -eq 0 ] && [ $rc -eq 0 ]; then
    echo "PASS metrics_tsan_no_races ($(printf '%s\n' "$out" | grep -c '^PASS') cases)"
else
    echo "FAIL metrics_tsan_no_races: exit $rc, $races reports:"; printf '%s\n' "$out" | grep -A12 "WARNING: ThreadSanitizer" | head -40
fi

# The CPU backend's thread team (cpu_team.c: per-member claim words, the
# others taking a range's last tasks) under the same sanitizer:
# tests/test_cpu_team.c's jobs from 1-4 threads, two callers and nested.
if ! cc -std=gnu11 -O1 -g -fsanitize=thread -fopenmp -Isrc -Itests -o "$tmp/team" tests/test_cpu_team.c tests/check.c \
    src/backend/cpu/cpu_team.c src/core/core.c -lm -lpthread > "$tmp/cc2.log" 2>&1; then
    echo "FAIL team_tsan_build: $(tail -5 "$tmp/cc2.log")"; exit 1
fi
out=$(TSAN_OPTIONS=halt_on_error=0 "$tmp/team" 2>&1); rc=$?
races=$(printf '%s\n' "$out" | grep -c "WARNING: ThreadSanitizer")
if [ "$races" -eq 0 ] && [ $rc -eq 0 ]; then
    echo "PASS team_tsan_no_races ($(printf '%s\n' "$out" | grep -c '^PASS') cases)"
else
    echo "FAIL team_tsan_no_races: exit $rc, $races reports:"; printf '%s\n' "$out" | grep -A12 "WARNING: ThreadSanitizer" | head -40
fi
