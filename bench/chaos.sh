#!/usr/bin/env bash
# Chaos benchmark (issue 17): 100 random interruptions of `loom train
# --resume auto` on 1 and on 2 ranks (tests/chaos.py: SIGKILL of the
# process group, SIGTERM then SIGKILL, SIGKILL inside the checkpoint
# protocol), each run restarted until it completes, final weights compared
# bit for bit with an uninterrupted run. Prints trials (runs carried to the
# end), interruptions, resumes (restarts that found a checkpoint) and the
# time lost against uninterrupted runs (startups, redone steps, waits).
#   bench/chaos.sh [ROUNDS] [SEED]
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
rounds=${1:-100}
seed=${2:-$(date +%s)}
tmp=$(mktemp -d /tmp/loom-chaosbench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "bench/chaos.sh: $rounds interruptions per world size, seed $seed, $(nproc) cores, $(date -u +%F)"
for n in 1 2; do
    mkdir -p "$tmp/$n"
    /usr/bin/python3 tests/chaos.py "$LOOM" "$tmp/$n" "$rounds" $n $((seed + n))
done
