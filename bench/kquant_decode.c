/* The block formats' decode kernel alone (loom_cpu_matmul_forward_kq with
 * N = 1, one thread): per format, GB/s of weight bytes (as the file stores
 * them) and ns per weight block, on a weight that stays in cache (32-value
 * formats: OC 1536 x C 576, smollm2-135m's gate and up projections;
 * k-quants: 2048 x 2048, llama-3.2-1b's q and o) and on one that streams
 * from memory (OC 16384 x C 4096, beyond the L3 of most CPUs). "q8_0" is
 * loom's int8 weight with per-32 scales (how a GGUF's q8_0 loads) through
 * loom_cpu_matmul_forward_w8a8. Built with -DKQ_OLD and the previous
 * kernel's cpu_kquant.c renamed (old_*), both run alternately, round after
 * round; with LLAMA_CPU_LIB set to llama.cpp's libggml-cpu.so, its own dot
 * product (the type traits' vec_dot on activations quantized once by its
 * from_float, one output at a time) runs in the rounds too, as "llama".
 * The median (min-max) of each is printed. Times are the thread's CPU
 * time (on a shared machine: the cost of the work, not the wait for a
 * core); with KQ_BENCH_THREADS=T, T OpenMP threads and wall time
 * (KQ_BENCH_CPU=1 with OMP_WAIT_POLICY=passive: all threads' CPU time).
 * KQ_BENCH_LAYERS=smollm2|1b: a decode token's matvecs instead (below).
 * Built and run by bench/kquant-decode.sh. */
#include <dlfcn.h>
#include <sys/mman.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_kquant.h"
#include "backend/cpu/cpu_team.h"
#include "backend/qblock.h"

#ifdef KQ_OLD
void old_matmul_forward_kq(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu);
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(getenv("KQ_BENCH_CPU") ? CLOCK_PROCESS_CPUTIME_ID : getenv("KQ_BENCH_THREADS") ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t); /* 1 thread: the work's cost, not a shared machine's waits */
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

/* q8_0 (LOOM_INT8, per-32 scales, as loom loads a Q8_0 tensor) beside the
 * same weights in llama.cpp's blocks (d fp16, 32 int8) for its vec_dot. */
#define KQ_MAXW 512
static struct {
    const void *data, *raw;
} twins[KQ_MAXW];
static int ntwins;

static const char *fmt_name(loom_dtype d) { return d == LOOM_INT8 ? "q8_0" : loom_qblock_info(d)->name; }
static int fmt_block(loom_dtype d) { return d == LOOM_INT8 ? 32 : loom_qblock_info(d)->block; }
static int fmt_bytes(loom_dtype d) { return d == LOOM_INT8 ? 34 : loom_qblock_info(d)->bytes; }
static int fmt_ggml(loom_dtype d) { return d == LOOM_INT8 ? 8 : (int)loom_qblock_info(d)->ggml; }
static const uint8_t *raw_of(const loom_tensor_t *w) {
    for (int i = 0; w->dtype == LOOM_INT8 && i < ntwins; i++)
        if (twins[i].data == w->data) return twins[i].raw;
    return w->data;
}

/* Weight memory; KQ_BENCH_HUGE=1: on 2 MB pages (madvise). */
static void *weight_alloc(size_t n) {
    int huge = getenv("KQ_BENCH_HUGE") != NULL;
    size_t al = huge ? 1 << 21 : 64;
    void *p = aligned_alloc(al, (n + al - 1) / al * al);
    if (huge) madvise(p, (n + al - 1) / al * al, MADV_HUGEPAGE);
    return p;
}

/* A random weight (OC, C) of format d; its bytes as the file stores them. */
static loom_tensor_t make_weight(loom_dtype d, int OC, int C, unsigned seed, size_t *bytes) {
    size_t nblk = (size_t)OC * C / fmt_block(d);
    *bytes = nblk * fmt_bytes(d);
    uint8_t *p = weight_alloc(*bytes);
    loom_tensor_t w = {.data = p, .dtype = d, .rows = OC, .cols = C};
    if (d != LOOM_INT8) {
        fill(d, p, nblk, seed);
        if (getenv("KQ_BENCH_ROWS8") && loom_qblock_rows8_ok(d, OC)) /* as a GGUF load lays them out (llama's rows read wrong bytes) */
            loom_qblock_rows8(d, p, OC, C), w.layout = LOOM_LAYOUT_ROWS8;
        return w;
    }
    srand(seed);
    int8_t *v = weight_alloc((size_t)OC * C);
    float *sc = malloc(nblk * sizeof(float));
    for (size_t b = 0; b < nblk; b++) {
        uint16_t h = (uint16_t)(0x1400 + (rand() & 0x7FF));
        memcpy(p + 34 * b, &h, 2);
        sc[b] = _cvtsh_ss(h);
        for (int i = 0; i < 32; i++) p[34 * b + 2 + i] = (uint8_t)(v[32 * b + i] = (int8_t)(rand() % 255 - 127));
    }
    twins[ntwins].data = v, twins[ntwins++].raw = p;
    w = (loom_tensor_t){.data = v, .dtype = LOOM_INT8, .rows = OC, .cols = C, .scales = sc, .block = 32};
    if (getenv("KQ_BENCH_ROWS8") && loom_tensor_rows8_ok(&w)) loom_tensor_rows8(&w); /* llama's rows (raw) stay dense */
    return w;
}

static void free_weight(loom_tensor_t *w) {
    if (w->dtype == LOOM_INT8) free((void *)raw_of(w)), free((void *)w->scales);
    free(w->data);
}

static void loom_fn(float *y, const float *x, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu) {
    if (w->dtype == LOOM_INT8) loom_cpu_matmul_forward_w8a8(y, x, w, bias, N, C, OC, gelu);
    else loom_cpu_matmul_forward_kq(y, x, w, bias, N, C, OC, gelu);
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
    const ggml_traits_t *t = ggml_traits(fmt_ggml(w->dtype));
    t->from_float(x, ggml_q8, C); /* once per product, as llama.cpp's matmul does */
    size_t rb = (size_t)C / fmt_block(w->dtype) * fmt_bytes(w->dtype);
    for (int o = 0; o < OC; o++) t->vec_dot(C, y + o, 0, raw_of(w) + (size_t)o * rb, 0, ggml_q8, 0, 1);
}

typedef void (*kq_fn)(float *, const float *, const loom_tensor_t *, const float *, int, int, int, int);

static double time_one(kq_fn f, const loom_tensor_t *w, const float *x, float *y, int reps) {
    double t0 = now();
    for (int r = 0; r < reps; r++) f(y, x, w, NULL, 1, (int)w->cols, (int)w->rows, 0);
    return (now() - t0) / reps;
}

/* llama.cpp's split of a matvec over threads (ggml_compute_forward_mul_mat
 * for one input row: chunks of 64 output rows taken in turn). */
static void llama_threads_fn(float *y, const float *x, const loom_tensor_t *w, const float *bias, int N, int C, int OC, int gelu) {
    (void)bias, (void)N, (void)gelu;
    const ggml_traits_t *t = ggml_traits(fmt_ggml(w->dtype));
    t->from_float(x, ggml_q8, C);
    size_t rb = (size_t)C / fmt_block(w->dtype) * fmt_bytes(w->dtype);
    const uint8_t *raw = raw_of(w);
#pragma omp parallel for schedule(dynamic, 1)
    for (int o0 = 0; o0 < OC; o0 += 64)
        for (int o = o0; o < o0 + 64 && o < OC; o++) t->vec_dot(C, y + o, 0, raw + (size_t)o * rb, 0, ggml_q8, 0, 1);
}

/* A decode token's matvecs: the layer shapes of a model (q, k, v, o,
 * gate, up, down), `layers` layers of distinct weights (more than the L3
 * holds), one input row each, in order, wall time: what the kernel meets
 * in a model (each weight streamed from memory once per token, small
 * matrices), unlike one large weight. KQ_BENCH_LAYERS=smollm2|1b;
 * KQ_BENCH_ONE_LAYER=1: every layer the first one's weights (in cache). */
static void bench_layers(const char *model, loom_dtype d, int rounds) {
    int big = !strcmp(model, "1b"), D = big ? 2048 : 576, KV = big ? 512 : 192, F = big ? 8192 : 1536, L = big ? 4 : 30;
    const int shp[7][2] = {{D, D}, {KV, D}, {KV, D}, {D, D}, {F, D}, {F, D}, {D, F}};
    if (D % fmt_block(d)) return (void)printf("%s: %d columns are not whole %s blocks\n", model, D, fmt_name(d));
    loom_tensor_t w[64 * 7];
    size_t total = 0, bytes;
    for (int i = 0; i < 7 * L; i++) {
        int OC = shp[i % 7][0], C = shp[i % 7][1];
        if (i < 7 || !getenv("KQ_BENCH_ONE_LAYER")) w[i] = make_weight(d, OC, C, 1 + (unsigned)i, &bytes);
        else w[i] = w[i % 7]; /* one layer: in cache */
        total += bytes;
    }
    float *x = malloc((size_t)F * sizeof(float)), *y = malloc((size_t)F * sizeof(float));
    for (int i = 0; i < F; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    kq_fn fns[3] = {loom_fn, llama_threads_fn, NULL};
    const char *names[3] = {"loom", "llama", "old"};
    int nk = ggml_traits ? 2 : 1;
#ifdef KQ_OLD
    if (d != LOOM_INT8) fns[nk] = old_matmul_forward_kq, names[nk++] = "old";
#endif
    double t[3][64];
    for (int r = -1; r < rounds && r < 64; r++)
        for (int i = 0; i < nk; i++) {
            int k = (i + (r < 0 ? 0 : r)) % nk;
            double t0 = now();
            for (int rep = 0; rep < 4; rep++)
                for (int j = 0; j < 7 * L; j++) fns[k](y, x, &w[j], NULL, 1, (int)w[j].cols, (int)w[j].rows, 0);
            if (r >= 0) t[k][r] = (now() - t0) / 4;
        }
    for (int k = 0; k < nk; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), cmp);
        printf("%-5s %-8s %-6s %8.2f (%.2f-%.2f) %9.1f us/token (%zu MB, %d matvecs)\n", fmt_name(d), model, names[k],
               total / t[k][rounds / 2] * 1e-9, total / t[k][rounds - 1] * 1e-9, total / t[k][0] * 1e-9, t[k][rounds / 2] * 1e6,
               total >> 20, 7 * L);
    }
    for (int i = 0; i < 7 * L; i++)
        if (i < 7 || !getenv("KQ_BENCH_ONE_LAYER")) free_weight(&w[i]);
    free(x), free(y);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    const char *only = argc > 2 ? argv[2] : NULL;
    int threads = getenv("KQ_BENCH_THREADS") ? atoi(getenv("KQ_BENCH_THREADS")) : 1;
    omp_set_num_threads(threads > 0 ? threads : 1);
    loom_cpu_team_set_threads(threads > 0 ? threads : 1); /* one-row products run on the team, as in a model */
    const char *lib = getenv("LLAMA_CPU_LIB");
    if (lib && *lib) {
        void *h = dlopen(lib, RTLD_NOW);
        void (*init)(void) = h ? (void (*)(void))dlsym(h, "ggml_cpu_init") : NULL;
        ggml_traits = h ? (const ggml_traits_t *(*)(int))dlsym(h, "ggml_get_type_traits_cpu") : NULL;
        if (!init || !ggml_traits) return fprintf(stderr, "%s: %s\n", lib, dlerror()), 1;
        init();
        ggml_q8 = malloc(1 << 20);
    }
    static const loom_dtype fmts[] = {LOOM_Q4_0, LOOM_Q4_1, LOOM_Q5_0, LOOM_Q5_1, LOOM_Q4_K, LOOM_Q5_K, LOOM_Q6_K, LOOM_INT8};
    static const int shapes[3][2] = {{1536, 576}, {16384, 4096}, {2048, 2048}}; /* [0]: 32-value, [2]: k-quants */
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    if (la) fclose(la);
    printf("kernels: %s, %d thread(s) (%s time), %d rounds, load %.2f %.2f %.2f\n", loom_cpu_kq_isa(), omp_get_max_threads(), getenv("KQ_BENCH_THREADS") ? "wall" : "CPU", rounds, load[0], load[1], load[2]);
    printf("%-5s %-8s %-6s %22s %22s %s\n", "fmt", "weight", "kernel", "GB/s median (min-max)", "ns/block median", "");
    const char *layers = getenv("KQ_BENCH_LAYERS");
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        if (only && strcmp(only, fmt_name(fmts[fi]))) continue;
        if (layers) {
            bench_layers(layers, fmts[fi], rounds);
            continue;
        }
        for (int s = 0; s < 2; s++) {
            int sh = s == 0 && fmt_block(fmts[fi]) == 256 ? 2 : s, OC = shapes[sh][0], C = shapes[sh][1];
            if (getenv("KQ_BENCH_SHAPE") && sscanf(getenv("KQ_BENCH_SHAPE"), "%dx%d", &OC, &C) == 2 && s == 0) continue; /* OCxC: the memory row only */
            size_t bytes, nblk = (size_t)OC * C / fmt_block(fmts[fi]);
            loom_tensor_t w = make_weight(fmts[fi], OC, C, 1 + (unsigned)fi, &bytes);
            float *x = malloc((size_t)C * sizeof(float)), *y = malloc((size_t)OC * sizeof(float));
            for (int i = 0; i < C; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
            int reps = s == 0 ? 200 : 3;
            int nk = 1;
            kq_fn fns[3] = {loom_fn, NULL, NULL};
            const char *names[3] = {"new", "old", "llama"};
#ifdef KQ_OLD
            if (fmts[fi] != LOOM_INT8) fns[nk] = old_matmul_forward_kq, names[nk++] = "old";
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
                printf("%-5s %-8s %-6s %8.2f (%.2f-%.2f) %12.2f\n", fmt_name(fmts[fi]), s ? "memory" : "cache", names[k], bytes / med * 1e-9,
                       bytes / t[k][rounds - 1] * 1e-9, bytes / t[k][0] * 1e-9, med / nblk * 1e9);
            }
            free_weight(&w), free(x), free(y);
        }
    }
    return 0;
}
