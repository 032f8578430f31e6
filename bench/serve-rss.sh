#!/usr/bin/env bash
# Resident memory of `loom serve` on one model once it is ready: VmRSS and
# the loading peak VmHWM from /proc (docs/perf.md, Q8_0 held once).
#
#   bench/serve-rss.sh FILE.gguf [serve flags, e.g. --kv-memory 384M]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOOM=${LOOM:-$ROOT/build/loom}
f=$1; shift
log=$(mktemp /tmp/loom-serve-rss-XXXXXX)
port=$((20000 + RANDOM % 20000))
"$LOOM" serve --run "$f" --port "$port" --threads 2 "$@" > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 1200); do # a guard of 10 minutes, not a measurement
    grep -q "ready on" "$log" && break
    kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.5
done
grep -E "VmRSS|VmHWM" /proc/$pid/status | tr -s ' \t' ' ' | tr '\n' ' '; echo
grep -E "KV cache|given back" "$log" || true
