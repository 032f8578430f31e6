#!/usr/bin/env bash
# The block formats' prefill GEMM beside the row kernel, GFLOP/s at N = 2
# .. 512 input rows (bench/kquant_gemm.c against build/libloom.a).
#   bench/kquant-gemm.sh [threads] [rounds] [wall|cpu] [N list: 16,64]
set -eu
cd "$(dirname "$0")/.."
make -s NO_CUDA=1 build/libloom.a
bin=$(mktemp /tmp/loom-kqgemm-bench-XXXXXX)
trap 'rm -f "$bin"' EXIT
mpi=$(command -v mpicc >/dev/null 2>&1 && mpicc --showme:link || true)
gcc -std=gnu11 -O3 -march=native -fopenmp -Isrc -o "$bin" bench/kquant_gemm.c \
    -Wl,--whole-archive build/libloom.a -Wl,--no-whole-archive -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd $mpi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$bin" "${1:-2}" "${2:-5}" "${3:-wall}" ${4:+"$4"}
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
