/* Decode kernel probe (docs/perf.md, "Where fp32 decode time goes"): loom's
 * row kernel at N = 1 (matmul_forward_rows, the 1x4 tile), a plain
 * one-row-at-a-time AVX-512 dot (4 accumulators of 16, llama.cpp's
 * ggml_vec_dot_f32 shape) and a read-only sum (the bandwidth floor) over 12
 * of gpt2-small's fc weights (113 MB, past the caches), one thread,
 * alternating, best of 12. Not part of `make test`. Build and run:
 *   cc -O3 -march=native -fopenmp bench/row_kernel_probe.c -o /tmp/probe \
 *     -Wl,--whole-archive build/libloom.a -Wl,--no-whole-archive \
 *     -lopenblas -lcjson -lm -lpthread -ldl -lmicrohttpd \
 *     -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi && /tmp/probe */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
void loom_cpu_matmul_forward_rows(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC, int gelu);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((target("avx512f"))) static void plain(float *out, const float *x, const float *w, int C, int OC) {
    for (int j = 0; j < OC; j++) {
        const float *r = w + (size_t)j * C;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < C; k += 64) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(r + k), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(r + k + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 32), _mm512_loadu_ps(r + k + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 48), _mm512_loadu_ps(r + k + 48), a3);
        }
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}
__attribute__((target("avx512f"))) static float readsum(const float *w, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t k = 0; k < n; k += 64) {
        a0 = _mm512_add_ps(_mm512_loadu_ps(w + k), a0); a1 = _mm512_add_ps(_mm512_loadu_ps(w + k + 16), a1);
        a2 = _mm512_add_ps(_mm512_loadu_ps(w + k + 32), a2); a3 = _mm512_add_ps(_mm512_loadu_ps(w + k + 48), a3);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
int main(void) {
    omp_set_num_threads(1);
    int C = 768, OC = 3072, L = 12; /* 12 layers' fc weights: 113 MB, past the caches */
    float *w = aligned_alloc(64, (size_t)L * C * OC * 4), *x = aligned_alloc(64, C * 4), *o = aligned_alloc(64, OC * 4);
    for (size_t i = 0; i < (size_t)L * C * OC; i++) w[i] = (float)(i % 7) * 0.01f;
    for (int i = 0; i < C; i++) x[i] = 0.5f;
    double best[3] = {1e9, 1e9, 1e9}; volatile float sink = 0;
    for (int r = 0; r < 12; r++)
        for (int v = 0; v < 3; v++) {
            double t0 = now();
            for (int l = 0; l < L; l++) {
                const float *wl = w + (size_t)l * C * OC;
                if (v == 0) loom_cpu_matmul_forward_rows(o, x, wl, NULL, 1, C, OC, 0);
                else if (v == 1) plain(o, x, wl, C, OC);
                else sink += readsum(wl, (size_t)C * OC);
            }
            double t = now() - t0;
            if (t < best[v]) best[v] = t;
        }
    double gb = (double)L * C * OC * 4 / 1e9;
    printf("loom row kernel N=1: %.1f GB/s | plain 1-row avx512 dot: %.1f GB/s | read-only sum: %.1f GB/s (best of 12, %.0f MB)\n",
           gb / best[0], gb / best[1], gb / best[2], gb * 1e3);
    return 0;
}
