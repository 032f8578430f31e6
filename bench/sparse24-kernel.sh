#!/usr/bin/env bash
# The 2:4 kernel (matmul_forward_s24) beside the dense one
# (matmul_forward_rows) on gpt2-small's linear shapes, N = 1..256 input
# rows: bench/sparse24_kernel.c against build/libloom.a.
#   bench/sparse24-kernel.sh [threads] [rounds]
set -eu
cd "$(dirname "$0")/.."
make -s NO_CUDA=1 build/libloom.a
bin=$(mktemp /tmp/loom-s24-bench-XXXXXX)
trap 'rm -f "$bin"' EXIT
mpi=$(command -v mpicc >/dev/null 2>&1 && mpicc --showme:link || true)
gcc -std=gnu11 -O3 -march=native -fopenmp -Isrc -o "$bin" bench/sparse24_kernel.c \
    -Wl,--whole-archive build/libloom.a -Wl,--no-whole-archive -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd $mpi
"$bin" "${1:-2}" "${2:-9}"
