#!/usr/bin/env bash
# Runs every test: the C test binaries in build/tests (and, when it was built,
# build-san/tests under the sanitizers), then the tests/test_*.sh scripts.
# Each case prints PASS/FAIL/SKIP lines; a binary that exits non-zero
# without a FAIL line (a crash, a sanitizer report) counts as one failure.
# A test_*.c whose binary is missing fails, and so does a run in which no
# case ran at all (a filter that matches nothing included).
# Ends with "N passed, N failed, N skipped" and exits 1 if anything failed.
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0; skip=0; failed_names=(); timings=()
run_one() { # label, command...
    local label=$1; shift
    local out rc t0=$(date +%s.%N)
    out=$("$@" 2>&1); rc=$?
    timings+=("$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') $label")
    printf '%s\n' "$out" | sed "s|^|[$label] |"
    local p f s
    p=$(printf '%s\n' "$out" | grep -c '^PASS ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1; echo "[$label] FAIL $label: exited with status $rc and no FAIL line"
    fi
    if [ "$rc" -eq 0 ] && [ "$p" -eq 0 ] && [ "$s" -eq 0 ]; then
        f=$((f + 1)); echo "[$label] FAIL $label: ran no test case"
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    [ "$f" -gt 0 ] && failed_names+=("$label")
}
filter=${1:-}
# Every tests/test_*.c must have its binary: one that is missing (a build
# that failed or was not run) fails instead of silently running fewer cases.
build=${LOOM_TEST_BUILD:-build}
for src in tests/test_*.c; do
    b=$build/tests/$(basename "$src" .c)
    case "$b" in *"$filter"*) ;; *) continue ;; esac
    if [ ! -x "$b" ]; then
        echo "[$(basename "$b")] FAIL $(basename "$b"): $b is not built (run make)"
        fail=$((fail + 1)); failed_names+=("$(basename "$b")")
        continue
    fi
    run_one "$(basename "$b")" "$b"
done
if [ -d build-san/tests ]; then
    for b in build-san/tests/test_*; do
        [ -x "$b" ] || continue
        case "$b" in *"$filter"*) ;; *) continue ;; esac
        # The slow whole-program tests run once, in the plain build.
        case "$(basename "$b")" in test_e2e*|test_oracle*) continue ;; esac
        LOOM_SANITIZED=1 run_one "san:$(basename "$b")" "$b"
    done
fi
for s in tests/test_*.sh; do
    [ -f "$s" ] || continue
    case "$s" in *"$filter"*) ;; *) continue ;; esac
    run_one "$(basename "$s")" bash "$s"
done
echo
# Where the suite's time goes (it must stay under 15 minutes on 2 cores).
printf '%s\n' "${timings[@]}" | sort -rn | head -12 | awk '{printf "time %7.1f s  %s\n", $1, $2}'
printf '%s\n' "${timings[@]}" | awk '{t += $1} END {printf "time %7.1f s  in all\n", t}'
if [ $((pass + fail + skip)) -eq 0 ]; then
    echo "FAIL run.sh: no test case ran${filter:+ (filter '$filter')}"
    fail=1
fi
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
