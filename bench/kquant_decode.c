/* The block formats' decode kernel alone (loom_cpu_matmul_forward_kq with
 * N = 1, one thread): per format, GB/s of weight bytes and ns per weight
 * block, on a weight that stays in cache (32-value formats: OC 1536 x
 * C 576, smollm2-135m's gate and up projections; k-quants: 2048 x 2048,
 * llama-3.2-1b's q and o) and on one that streams from memory (OC 16384 x
 * C 4096, beyond the L3 of most CPUs). Built with -DKQ_OLD and the previous kernel's cpu_kquant.c
 * renamed (old_*), both run alternately, round after round; with
 * LLAMA_CPU_LIB set to llama.cpp's libggml-cpu.so, its own dot product
 * (the type traits' vec_dot on activations quantized once by its
 * from_float, one output at a time, no threads) runs in the rounds too,
 * as "llama". The
 * median (min-max) of each is printed. Times are the thread's CPU time
 * (on a shared machine: the cost of the work, not the wait for a core);
 * with KQ_BENCH_THREADS=T, T OpenMP threads and wall time. Built and run by
 * bench/kquant-decode.sh. */
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_kquant.h"
#include "backend/qblock.h"

#ifdef KQ_OLD
void old_matmul_forward_kq(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu);
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(getenv("KQ_BENCH_THREADS") ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t); /* 1 thread: the work's cost, not a shared machine's waits */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Random blocks with finite fp16 scales in 2^-10 .. 2^-7 (valid blocks:
 * every bit pattern of the values is a value). */
static void fill(loom_dtype d, uint8_t *p, size_t nblk, unsigned seed) {
    const loom_qblock_info_t *q = loom_qblock_info(d);
    srand(seed);
    for (size_t i = 0; i < nblk * (size_t)q->bytes; i++) p[i] = (uint8_t)rand();
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *k = p + b * (size_t)q->bytes;
        uint16_t h = (uint16_t)(0x1400 + (rand() & 0x7FF)); /* fp16 around 2^-10 */
        if (d == LOOM_Q6_K) memcpy(k + 208, &h, 2);
        else memcpy(k, &h, 2), memcpy(k + 2, &h, 2); /* d, and m or dmin (or q5_0's qh: any bits) */
    }
}

/* llama.cpp's CPU type traits (ggml-cpu.h), looked up at run time. */
typedef struct {
    void (*from_float)(const float *x, void *y, int64_t k);
    void (*vec_dot)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
    int vec_dot_type;
    int64_t nrows;
} ggml_traits_t;
static const ggml_traits_t *(*ggml_traits)(int type);
static void *ggml_q8; /* the activations in llama.cpp's vec_dot_type */

static void llama_fn(float *y, const float *x, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu) {
    (void)bias, (void)N, (void)gelu;
    const ggml_traits_t *t = ggml_traits((int)loom_qblock_info(w->dtype)->ggml);
    t->from_float(x, ggml_q8, C); /* once per product, as llama.cpp's matmul does */
    size_t rb = loom_qblock_row_bytes(w->dtype, C);
    for (int o = 0; o < OC; o++) t->vec_dot(C, y + o, 0, (const uint8_t *)w->data + (size_t)o * rb, 0, ggml_q8, 0, 1);
}

typedef void (*kq_fn)(float *, const float *, const loom_tensor_t *, const float *, int, int, int, int);

static double time_one(kq_fn f, const loom_tensor_t *w, const float *x, float *y, int reps) {
    double t0 = now();
    for (int r = 0; r < reps; r++) f(y, x, w, NULL, 1, (int)w->cols, (int)w->rows, 0);
    return (now() - t0) / reps;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    const char *only = argc > 2 ? argv[2] : NULL;
    int threads = getenv("KQ_BENCH_THREADS") ? atoi(getenv("KQ_BENCH_THREADS")) : 1;
    omp_set_num_threads(threads > 0 ? threads : 1);
    const char *lib = getenv("LLAMA_CPU_LIB");
    if (lib && *lib) {
        void *h = dlopen(lib, RTLD_NOW);
        void (*init)(void) = h ? (void (*)(void))dlsym(h, "ggml_cpu_init") : NULL;
        ggml_traits = h ? (const ggml_traits_t *(*)(int))dlsym(h, "ggml_get_type_traits_cpu") : NULL;
        if (!init || !ggml_traits) return fprintf(stderr, "%s: %s\n", lib, dlerror()), 1;
        init();
        ggml_q8 = malloc(1 << 20);
    }
    static const loom_dtype fmts[] = {LOOM_Q4_0, LOOM_Q4_1, LOOM_Q5_0, LOOM_Q5_1, LOOM_Q4_K, LOOM_Q5_K, LOOM_Q6_K};
    static const int shapes[3][2] = {{1536, 576}, {16384, 4096}, {2048, 2048}}; /* [0]: 32-value, [2]: k-quants */
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    if (la) fclose(la);
    printf("kernels: %s, %d thread(s) (%s time), %d rounds, load %.2f %.2f %.2f\n", loom_cpu_kq_isa(), omp_get_max_threads(), getenv("KQ_BENCH_THREADS") ? "wall" : "CPU", rounds, load[0], load[1], load[2]);
    printf("%-5s %-8s %-6s %22s %22s %s\n", "fmt", "weight", "kernel", "GB/s median (min-max)", "ns/block median", "");
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const loom_qblock_info_t *q = loom_qblock_info(fmts[fi]);
        if (only && strcmp(only, q->name)) continue;
        for (int s = 0; s < 2; s++) {
            int sh = s == 0 && q->block == 256 ? 2 : s, OC = shapes[sh][0], C = shapes[sh][1];
            size_t nblk = (size_t)OC * C / q->block, bytes = nblk * q->bytes;
            uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
            fill(fmts[fi], p, nblk, 1 + (unsigned)fi);
            loom_tensor_t w = {.data = p, .dtype = fmts[fi], .rows = OC, .cols = C};
            float *x = malloc((size_t)C * sizeof(float)), *y = malloc((size_t)OC * sizeof(float));
            for (int i = 0; i < C; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
            int reps = s == 0 ? 200 : 3;
            int nk = 1;
            kq_fn fns[3] = {loom_cpu_matmul_forward_kq, NULL, NULL};
            const char *names[3] = {"new", "old", "llama"};
#ifdef KQ_OLD
            fns[nk] = old_matmul_forward_kq, names[nk++] = "old";
#endif
            if (ggml_traits) fns[nk] = llama_fn, names[nk++] = "llama";
            double t[3][64];
            for (int k = 0; k < nk; k++) time_one(fns[k], &w, x, y, 1); /* warm */
            for (int r = 0; r < rounds && r < 64; r++)
                for (int i = 0; i < nk; i++) { /* the order alternates round by round */
                    int k = (i + r) % nk;
                    t[k][r] = time_one(fns[k], &w, x, y, reps);
                }
            for (int k = nk - 1; k >= 0; k--) {
                qsort(t[k], (size_t)rounds, sizeof(double), cmp);
                double med = t[k][rounds / 2];
                printf("%-5s %-8s %-6s %8.2f (%.2f-%.2f) %12.2f\n", q->name, s ? "memory" : "cache", names[k], bytes / med * 1e-9,
                       bytes / t[k][rounds - 1] * 1e-9, bytes / t[k][0] * 1e-9, med / nblk * 1e9);
            }
            free(p), free(x), free(y);
        }
    }
    return 0;
}
