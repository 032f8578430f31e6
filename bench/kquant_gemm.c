/* The block formats' prefill GEMM (cpu_kquant_gemm.c) beside the block-dot
 * row kernel (cpu_kquant.c; for q8_0, held as int8 with scales per 32,
 * cpu_int8.c's W8A8 tile) on one weight shape per model, for N input
 * rows: GFLOP/s (2 N C OC per call), median (min-max) of `rounds`, the two
 * kernels alternating call by call. The weights are random blocks with
 * finite fp16 scales (any such bytes are valid blocks). Arguments:
 * threads, rounds, wall|cpu, and a list of N ("16,64"); environment:
 * CASES (a substring of "model format"), COLD=1 (weights from memory).
 * Built and run by bench/kquant-gemm.sh against build/libloom.a. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_kquant.h"
#include "backend/cpu/cpu_kquant_gemm.h"
#include "backend/qblock.h"
#include "core/core.h"

static int use_cpu_time;

/* "q4_K", ..., "q8_0" for LOOM_INT8 with blocks of 32. */
static const char *fmt_name(loom_dtype d) { return d == LOOM_INT8 ? "q8_0" : loom_qblock_info(d)->name; }

/* Wall time, or with `cpu` the process's CPU time, clock() (on a shared
 * machine: the cost of the work, not the wait for a core). */
static double now(void) { return use_cpu_time ? (double)clock() / CLOCKS_PER_SEC : loom_now(); }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Random blocks of format d with every fp16 field a small finite value;
 * LOOM_INT8: random int8 with fp32 scales per 32 (a Q8_0 file as loom
 * holds it), the scales into *scales. */
static void *random_blocks(loom_dtype d, int rows, int cols, float **scales) {
    if (d == LOOM_INT8) {
        signed char *q = loom_malloc((size_t)rows * cols);
        *scales = loom_malloc((size_t)rows * cols / 32 * sizeof(float));
        for (size_t i = 0; i < (size_t)rows * cols; i++) q[i] = (signed char)(rand() % 255 - 127);
        for (size_t i = 0; i < (size_t)rows * cols / 32; i++) (*scales)[i] = (rand() / (float)RAND_MAX) * 0.001f;
        return q;
    }
    const loom_qblock_info_t *qi = loom_qblock_info(d);
    size_t n = (size_t)rows * cols / qi->block, bytes = n * qi->bytes;
    unsigned char *p = loom_malloc(bytes);
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(rand() >> 7);
    for (size_t b = 0; b < n; b++) {
        unsigned char *blk = p + b * qi->bytes;
        _Float16 h = (_Float16)((rand() / (float)RAND_MAX - 0.5f) * 0.002f);
        int at[2] = {d == LOOM_Q6_K ? 208 : 0, d == LOOM_Q4_K || d == LOOM_Q5_K || d == LOOM_Q4_1 || d == LOOM_Q5_1 ? 2 : -1};
        for (int k = 0; k < 2; k++)
            if (at[k] >= 0) memcpy(blk + at[k], &h, 2);
    }
    return p;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 5;
    use_cpu_time = argc > 3 && !strcmp(argv[3], "cpu");
    setenv("LOOM_KQ_GEMM_ROWS", "1000000000", 1); /* matmul_forward_kq: the row kernel at every N */
    omp_set_num_threads(threads);
    const char *why = NULL;
    if (loom_cpu_gemm_select(getenv("LOOM_CPU_KERNEL"), &why) != 0) { /* as the CPU backend picks it */
        fprintf(stderr, "LOOM_CPU_KERNEL: %s\n", why);
        return 1;
    }
    struct { const char *model; loom_dtype d; int C, OC; } cases[] = {
        {"llama-3.2-1b", LOOM_Q4_K, 2048, 2048}, {"llama-3.2-1b", LOOM_Q5_K, 2048, 2048},
        {"llama-3.2-1b", LOOM_Q6_K, 2048, 2048}, {"smollm2-135m", LOOM_Q5_0, 576, 1536},
        {"smollm2-135m", LOOM_Q4_K, 1536, 576}, {"llama-3.2-1b", LOOM_Q4_K, 2048, 8192},
        {"llama-3.2-1b", LOOM_Q6_K, 8192, 2048}, {"smollm2-135m", LOOM_INT8, 576, 1536},
        {"smollm2-135m", LOOM_INT8, 1536, 576}, {"llama-3.2-1b", LOOM_INT8, 2048, 2048},
        {"llama-3.2-1b", LOOM_INT8, 2048, 8192}, {"smollm2-135m", LOOM_Q5_0, 1536, 576},
        {"smollm2-135m", LOOM_Q4_0, 576, 1536}};
    if (getenv("CASES")) /* a substring of "model format": "q8_0" */
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char name[64];
            snprintf(name, sizeof name, "%s %s", cases[c].model, fmt_name(cases[c].d));
            if (!strstr(name, getenv("CASES"))) cases[c].C = 0;
        }
    int Ns[16] = {2, 4, 8, 16, 32, 64, 512}, nN = 7;
    if (argc > 4) { /* a list of N: "16,64" */
        nN = 0;
        for (char *p = argv[4], *e; *p && nN < 16; p = *e ? e + 1 : e) {
            Ns[nN++] = (int)strtol(p, &e, 10);
            if (e == p) return 1;
        }
    }
    printf("threads %d, rounds %d, %s time, dequant %s, gemm %s, row kernel %s\n", threads, rounds,
           use_cpu_time ? "cpu" : "wall", loom_cpu_kq_gemm_isa(), loom_cpu_gemm_kernel(), loom_cpu_kq_isa());
    printf("| shape | format | N | row kernel GFLOP/s | fp32 GEMM | best GEMM (%s) | fp32 / row | best / fp32 | best / row |\n"
           "|---|---|---|---|---|---|---|---|---|\n", loom_cpu_kq_gemm_isa());
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int C = cases[c].C, OC = cases[c].OC, i8 = cases[c].d == LOOM_INT8;
        if (!C) continue;
        float *scales = NULL;
        loom_tensor_t w = {.data = random_blocks(cases[c].d, OC, C, &scales), .dtype = cases[c].d, .rows = OC, .cols = C};
        w.scales = scales, w.block = i8 ? 32 : 0;
        /* COLD=1: copies of the weights over 128 MB, a call on each in turn,
         * so that they come from memory as a model's do in a forward */
        size_t bytes = i8 ? (size_t)OC * C : (size_t)OC * loom_qblock_row_bytes(cases[c].d, C);
        int nw = getenv("COLD") && atoi(getenv("COLD")) ? (int)fmin(64, ceil(128e6 / bytes)) : 1;
        loom_tensor_t ws[64];
        for (int i = 0; i < nw; i++) {
            ws[i] = w;
            if (i) ws[i].data = memcpy(loom_malloc(bytes), w.data, bytes);
        }
        for (int k = 0; k < nN; k++) {
            int N = Ns[k];
            float *x = loom_malloc((size_t)N * C * sizeof(float)), *out = loom_malloc((size_t)N * OC * sizeof(float));
            for (size_t i = 0; i < (size_t)N * C; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
            double flop = 2.0 * N * C * OC, t[3][64];
            int reps = (int)fmax(nw, 2e8 / flop); /* calls per timing: ~0.2 GFLOP, every copy at least once */
            for (int r = 0; r < rounds + 1; r++)
                for (int s = 0; s < 3; s++) {
                    if (s == 1 && i8) { /* int8 has no fp32 panel path */
                        if (r) t[s][r - 1] = NAN;
                        continue;
                    }
                    /* 1: the fp32 panel GEMM (dequantization avx512, else avx2), 2: the best (the int8 tile where it runs) */
                    loom_cpu_kq_gemm_use(s == 1 ? (loom_cpu_kq_gemm_use("avx512") ? "avx512" : "avx2") : NULL);
                    double t0 = now();
                    for (int q = 0; q < reps; q++) {
                        const loom_tensor_t *wq = &ws[q % nw];
                        if (s) loom_cpu_kq_gemm_run(out, x, wq, NULL, N, C, OC, 0);
                        else if (i8) loom_cpu_matmul_forward_w8a8(out, x, wq, NULL, N, C, OC, 0);
                        else loom_cpu_matmul_forward_kq(out, x, wq, NULL, N, C, OC, 0);
                    }
                    if (r) t[s][r - 1] = flop * reps / (now() - t0) / 1e9; /* round 0 warms up */
                }
            loom_cpu_kq_gemm_use(NULL);
            for (int s = 0; s < 3; s++) qsort(t[s], rounds, sizeof(double), cmp);
            printf("| %s %dx%d | %s | %d", cases[c].model, OC, C, fmt_name(cases[c].d), N);
            for (int s = 0; s < 3; s++) printf(" | %.1f (%.1f-%.1f)", t[s][rounds / 2], t[s][0], t[s][rounds - 1]);
            printf(" | %.2fx | %.2fx | %.2fx |\n", t[1][rounds / 2] / t[0][rounds / 2], t[2][rounds / 2] / t[1][rounds / 2],
                   t[2][rounds / 2] / t[0][rounds / 2]);
            fflush(stdout);
            free(x), free(out);
        }
        for (int i = 1; i < nw; i++) free(ws[i].data);
        free(w.data), free(scales);
    }
    return 0;
}
