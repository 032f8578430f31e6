#!/usr/bin/env bash
# The W8A8 kernel on block-32 weights, per-block activations (this tree)
# against per-row ones (BASE's cpu_int8.c, default 41ee2f7, compiled beside
# it with its symbols renamed), alternating in one process: median ms of 15
# calls at N=1 (decode) and N=64 (prefill) on smollm2's and llama-3.2-1b's
# MLP shapes (docs/perf.md, Q8_0 section). Needs build/libloom.a.
#
#   bench/w8a8-actblock.sh [BASE]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BASE=${1:-41ee2f7}
tmp=$(mktemp -d /tmp/loom-w8a8-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git show "$BASE:src/backend/cpu/cpu_int8.c" > "$tmp/old_int8.c"
cat > "$tmp/mb.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_int8.h"
void old_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(void) {
    int shapes[][2] = {{576, 3072}, {1536, 576}, {2048, 16384}, {8192, 2048}};
    int Ns[] = {1, 64};
    for (int s = 0; s < 4; s++) for (int ni = 0; ni < 2; ni++) {
        int C = shapes[s][0], OC = shapes[s][1], N = Ns[ni];
        signed char *wq = malloc((size_t)OC * C); float *ws = malloc(sizeof(float) * OC * C / 32);
        float *x = malloc(sizeof(float) * N * C), *o = malloc(sizeof(float) * N * OC);
        for (size_t i = 0; i < (size_t)OC * C; i++) wq[i] = (signed char)(rand() % 255 - 127);
        for (size_t i = 0; i < (size_t)OC * C / 32; i++) ws[i] = 0.001f;
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
        loom_tensor_t w = {.data = wq, .dtype = LOOM_INT8, .rows = OC, .cols = C, .scales = ws, .block = 32};
        enum { R = 15 };
        double tn[R], to[R];
        for (int r = 0; r < R; r++) {
            double t0 = now(); loom_cpu_matmul_forward_w8a8(o, x, &w, NULL, N, C, OC, 0); tn[r] = now() - t0;
            t0 = now(); old_w8a8(o, x, &w, NULL, N, C, OC, 0); to[r] = now() - t0;
        }
        qsort(tn, R, sizeof(double), cmp), qsort(to, R, sizeof(double), cmp);
        printf("C=%5d OC=%5d N=%2d  per-row act %8.3f ms  per-32 act %8.3f ms  new/old %.3f  (GB/s new %.1f)\n", C, OC, N, to[R/2]*1e3, tn[R/2]*1e3,
               tn[R/2]/to[R/2], (double)OC*C*1.125/tn[R/2]/1e9);
        free(wq), free(ws), free(x), free(o);
    }
    return 0;
}
C
F="-std=gnu11 -O3 -march=native -fopenmp -Isrc -Isrc/backend/cpu"
R=""
for s in matmul_forward_w8a8:old_w8a8 quantize_rows:old_quantize_rows int8_isa:old_isa int8_use:old_use matmul_forward_w8:old_w8 \
         kv_write_int8:old_kvw kv_copy_block_int8:old_kvc; do R="$R -Dloom_cpu_${s%%:*}=${s##*:}"; done
cc $F $R -c -o "$tmp/old.o" "$tmp/old_int8.c"
cc $F -o "$tmp/mb" "$tmp/mb.c" "$tmp/old.o" -Wl,--whole-archive build/libloom.a -Wl,--no-whole-archive \
    -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd $(pkg-config --libs mpi 2>/dev/null || echo -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=${THREADS:-2} OMP_WAIT_POLICY=passive "$tmp/mb"
