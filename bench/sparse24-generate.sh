#!/usr/bin/env bash
# loom bench generate on a pruned run, dense (--sparse off) and 2:4
# compressed (--sparse auto) alternating, ROUNDS rounds each: single-stream
# decode and 16-client throughput (docs/perf.md, compressed inference).
#   bench/sparse24-generate.sh RUN [ROUNDS]    RUN: a `loom prune` output
set -eu
cd "$(dirname "$0")/.."
RUN=${1:?usage: bench/sparse24-generate.sh RUN [ROUNDS]}
ROUNDS=${2:-3}
LOOM=${LOOM:-build/loom}
for r in $(seq "$ROUNDS"); do
    for sp in off auto; do
        out=$($LOOM bench generate --run "$RUN" --prompt-len 32 --gen 32 --concurrency 1,16 --repeat 1 \
            --threads 2 --kv-memory 512M --sparse "$sp" 2>&1)
        bw=$(printf '%s\n' "$out" | grep -o 'bandwidth [0-9.]* GB/s' | head -1)
        one=$(printf '%s\n' "$out" | grep '^one request at a time' | awk '{print $6 " tok/s, TTFT " $8 " ms"}')
        six=$(printf '%s\n' "$out" | grep '^continuous batching, 16' | awk '{print $4 " tok/s, TTFT " $6 " ms"}')
        echo "round $r --sparse $sp: 1 stream $one | 16 clients $six | $bw | $(printf '%s\n' "$out" | grep -c 'run compressed') compressed"
    done
done
