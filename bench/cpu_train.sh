#!/usr/bin/env bash
# The CPU training benchmark behind docs/perf.md: loom (own GEMM and
# OpenBLAS) against PyTorch, alternating, for each configuration of the
# issue (gpt2-tiny T=256, gpt2-small T=256 and T=1024; B=4; 2 threads, then
# 1). Prints the machine, load and date first. Usage:
#   bench/cpu_train.sh [LOOM_BINARY] [extra flags for loom bench train]
set -u
cd "$(dirname "$0")/.."
loom=${1:-build/loom}; shift || true
extra=("$@")
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
for threads in 2 1; do
    for cfg in "gpt2-tiny 256 3 2" "gpt2-small 256 2 1" "gpt2-small 1024 2 1"; do
        read -r model seq rounds steps <<<"$cfg"
        "$loom" bench train --model "$model" --seq "$seq" --threads "$threads" --rounds "$rounds" \
            --steps "$steps" ${extra[@]+"${extra[@]}"}
        echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    done
done
