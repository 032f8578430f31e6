#!/usr/bin/env bash
# The block formats' decode kernel alone, one thread, N = 1 (bench/kquant_decode.c):
# this tree's loom_cpu_matmul_forward_kq beside the one at git revision BASE
# (its cpu_kquant.c compiled with renamed symbols into the same program),
# alternating round by round, and with LOOM_LLAMA_DIR set, llama.cpp's own
# dot product (libggml-cpu.so's vec_dot) beside them; GB/s of weights and ns
# per block, medians.
#   bench/kquant-decode.sh [BASE (default: none, this tree only)] [rounds] [format]
#   (KQ_BENCH_THREADS=2: two OpenMP threads, wall time; KQ_BENCH_LAYERS=smollm2|1b: a model's decode token of
#   distinct weights, llama.cpp split over threads as its mul_mat does; format q8_0: loom's int8 per-32 kernel;
#   KQ_BENCH_KEEP=FILE keeps the program)
set -eu
cd "$(dirname "$0")/.."
make -s NO_CUDA=1 build/libloom.a
tmp=$(mktemp -d /tmp/loom-kq-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mpi=$(command -v mpicc >/dev/null 2>&1 && mpicc --showme:link || true)
cc="gcc -std=gnu11 -O3 -march=native -fopenmp -Isrc"
old=""
if [ -n "${1:-}" ]; then
    git show "$1:src/backend/cpu/cpu_kquant.c" > "$tmp/old.c"
    git show "$1:src/backend/cpu/cpu_kquant.h" > "$tmp/cpu_kquant.h"
    cp src/backend/cpu/cpu_math.h "$tmp/"
    $cc -I"$tmp" -Isrc/backend/cpu -Dloom_cpu_matmul_forward_kq=old_matmul_forward_kq -Dloom_cpu_kq_quantize_act=old_kq_quantize_act \
        -Dloom_cpu_kq_isa=old_kq_isa -Dloom_cpu_kq_use=old_kq_use -c -o "$tmp/old.o" "$tmp/old.c"
    old="-DKQ_OLD $tmp/old.o"
fi
$cc -o "$tmp/bench" bench/kquant_decode.c $old \
    -Wl,--whole-archive build/libloom.a -Wl,--no-whole-archive -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd $mpi
[ -n "${KQ_BENCH_KEEP:-}" ] && cp "$tmp/bench" "$KQ_BENCH_KEEP"
LLAMA_CPU_LIB=${LOOM_LLAMA_DIR:+$LOOM_LLAMA_DIR/build/bin/libggml-cpu.so} LD_LIBRARY_PATH=${LOOM_LLAMA_DIR:+$LOOM_LLAMA_DIR/build/bin} "$tmp/bench" "${2:-7}" ${3:-}
