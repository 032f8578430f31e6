#!/usr/bin/env bash
# Chaos (issue 17): `loom train --resume auto` interrupted 10 times at random
# moments (SIGKILL of the process group, SIGTERM then SIGKILL, SIGKILL inside
# the checkpoint protocol via LOOM_TEST_KILL_AT), on 1 and on 2 ranks, and
# restarted with the same command each time: the final weights must be
# bit-identical to an uninterrupted run's. tests/chaos.py does the work;
# bench/chaos.sh runs 100 interruptions. CHAOS_SEED fixes the randomness.
# A failing run's folder (every attempt's log, the run folders) is kept and
# its path printed; a passing run's is removed.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
tmp=$(mktemp -d /tmp/loom-chaos-XXXXXX)
keep=0
trap '[ "$keep" = 1 ] || rm -rf "$tmp"' EXIT
seed=${CHAOS_SEED:-$(date +%s)}
for n in 1 2; do
    mkdir -p "$tmp/$n"
    out=$(/usr/bin/python3 tests/chaos.py "$LOOM" "$tmp/$n" 10 $n $((seed + n)) 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed -n '/^PASS\|^FAIL\|^SKIP\|^chaos:/p'
    if [ $rc -ne 0 ]; then
        keep=1
        printf '%s\n' "$out" | grep -q '^FAIL' || echo "FAIL chaos_$n: tests/chaos.py exited $rc: $(printf '%s\n' "$out" | tail -3)"
    fi
done
[ "$keep" = 1 ] && echo "chaos: the logs of the failing runs are kept in $tmp (CHAOS_SEED=$seed repeats its random choices; the timing differs)"
exit 0
