#!/usr/bin/env bash
# Under ThreadSanitizer, built from the few sources each needs (any data
# race report fails):
#  - the metrics registry, HTTP server and dashboard: tests/test_metrics.c
#    (2 writer threads x 10^6 updates while a reader renders, HTTP handler
#    threads, the dashboard's sampler thread);
#  - the CPU backend's thread team (cpu_team.c: a claim word a member, the
#    others taking a range's last tasks): tests/test_cpu_team.c's jobs from
#    1-4 threads, two callers and nested.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/loom-tsan-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! echo 'int main(void){return 0;}' | cc -x c -fsanitize=thread -o "$tmp/probe" - 2> /dev/null; then
    echo "SKIP metrics_tsan: this compiler cannot build with -fsanitize=thread"; exit 0
fi
# tsan NAME CC-ARGS...: build NAME with -fsanitize=thread from CC-ARGS, run it, count the reports.
tsan() {
    local name=$1 out rc races
    shift
    if ! cc -std=gnu11 -O1 -g -fsanitize=thread -Isrc -Itests -o "$tmp/$name" "$@" > "$tmp/$name.log" 2>&1; then
        echo "FAIL ${name}_build: $(tail -5 "$tmp/$name.log")"; return
    fi
    out=$(TSAN_OPTIONS=halt_on_error=0 "$tmp/$name" 2>&1); rc=$?
    races=$(printf '%s\n' "$out" | grep -c "WARNING: ThreadSanitizer")
    if [ "$races" -eq 0 ] && [ $rc -eq 0 ]; then
        echo "PASS ${name}_no_races ($(printf '%s\n' "$out" | grep -c '^PASS') cases)"
    else
        echo "FAIL ${name}_no_races: exit $rc, $races reports:"; printf '%s\n' "$out" | grep -A12 "WARNING: ThreadSanitizer" | head -40
    fi
}
tsan metrics_tsan tests/test_metrics.c tests/check.c src/obs/metrics.c src/obs/sbuf.c src/obs/dashboard.c src/obs/http.c \
    src/core/core.c -lcjson -lm -lpthread -lmicrohttpd
tsan team_tsan -fopenmp tests/test_cpu_team.c tests/check.c src/backend/cpu/cpu_team.c src/core/core.c -lm -lpthread
