/* The 2:4 kernel beside the dense one on gpt2-small's four linear shapes
 * (one layer's worth: qkv, attention projection, fc, fc projection), for
 * N input rows; alternating dense and 2:4 calls, median of `reps` rounds.
 * Built and run by bench/sparse24-kernel.sh against build/libloom.a. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/core.h"
#include "model/quant.h"
#include "model/sparse24.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 9;
    const loom_backend_t *be;
    if (loom_backend_cpu_init(&be, threads) != LOOM_OK) return fprintf(stderr, "%s\n", loom_errmsg()), 1;
    const int C0 = 768, layers = 12; /* 12 copies of each weight: 340 MB dense, more than the caches */
    const int shapes[4][2] = {{3 * C0, C0}, {C0, C0}, {4 * C0, C0}, {C0, 4 * C0}}; /* OC, C */
    const int Ns[] = {1, 4, 16, 64, 256};
    float *w[4], *vals[4], *x = malloc(sizeof(float) * 256 * 4 * C0), *out = malloc(sizeof(float) * 256 * 4 * C0);
    unsigned char *meta[4];
    loom_tensor_t t[4];
    for (int i = 0; i < 256 * 4 * C0; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int s = 0; s < 4; s++) {
        size_t n = (size_t)layers * shapes[s][0] * shapes[s][1];
        w[s] = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) w[s][i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
        loom_prune24_rows(w[s], (long long)layers * shapes[s][0], shapes[s][1]);
        vals[s] = malloc(sizeof(float) * n / 2);
        meta[s] = malloc(n / 8 + 1);
        loom_sparse24_compress(w[s], (long long)layers * shapes[s][0], shapes[s][1], vals[s], meta[s]);
    }
    printf("N   dense ms  2:4 ms  speedup  (one pass over 12 layers' linear weights, %d threads, median of %d)\n", threads, reps);
    for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
        int N = Ns[k];
        double td[64], ts[64];
        for (int r = 0; r < reps && r < 64; r++) {
            for (int pass = 0; pass < 2; pass++) {
                double t0 = loom_now();
                for (int l = 0; l < layers; l++)
                    for (int s = 0; s < 4; s++) {
                        int OC = shapes[s][0], C = shapes[s][1];
                        size_t off = (size_t)l * OC * C;
                        t[s] = (loom_tensor_t){.data = vals[s] + off / 2, .dtype = LOOM_FP32, .rows = OC, .cols = C,
                                               .layout = LOOM_LAYOUT_SPARSE24, .meta = meta[s] + off / 8};
                        if (pass == 0) be->matmul_forward_rows(out, x, w[s] + off, NULL, N, C, OC, 0);
                        else be->matmul_forward_s24(out, x, &t[s], NULL, N, C, OC, 0);
                    }
                (pass == 0 ? td : ts)[r] = loom_now() - t0;
            }
        }
        qsort(td, (size_t)reps, sizeof(double), cmp);
        qsort(ts, (size_t)reps, sizeof(double), cmp);
        printf("%-3d %8.2f %7.2f %7.2fx  (dense %.2f-%.2f, 2:4 %.2f-%.2f)\n", N, td[reps / 2] * 1e3, ts[reps / 2] * 1e3,
               td[reps / 2] / ts[reps / 2], td[0] * 1e3, td[reps - 1] * 1e3, ts[0] * 1e3, ts[reps - 1] * 1e3);
    }
    return 0;
}
