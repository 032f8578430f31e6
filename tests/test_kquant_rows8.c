/* q4_K, q6_K, the 32-value formats (q4_0, q4_1, q5_0, q5_1) and q8_0 as
 * loom holds it (int8 in blocks of 32) with 8 rows interleaved
 * (LOOM_LAYOUT_ROWS8,
 * backend/qblock.h), the layout a GGUF's weights in those formats take at
 * load, against the dense layout, whose kernels tests/test_quant.c and
 * tests/test_kquant_gemm.c check against the gguf Python package:
 *   - interleaving then gathering gives every block's bytes back, and the
 *     interleaved tensor dequantizes to the dense tensor's values (bits);
 *   - on every instruction set of the one-row kernels (cpu_kquant.c; for
 *     q8_0 cpu_int8.c's portable and AVX2 paths, whose dense tiles share
 *     the interleaved kernel's operations; its VNNI tiles are checked
 *     against the bound only) and
 *     of the prefill GEMM (cpu_kquant_gemm.c) this CPU has, at N = 1 ..
 *     7, 9 and 40 input rows, with and without bias and GELU, on rows of
 *     whole groups of 8 blocks and (32-value formats) of 18 blocks (the
 *     dense kernel's paired last groups), the product
 *     equals the dense weight's bit for bit;
 *   - and it is within the int8 activations' bound of the fp64 product
 *     of the dequantized values: per block of the format, each activation off by
 *     at most half its block's step (max|x| / 127 / 2), so the error is at
 *     most sum |w_i| * step_b / 2, plus the fp32 sums' rounding;
 *   - loom_tensor_check takes the layout only for those formats, rows a
 *     multiple of 8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_kquant.h"
#include "backend/cpu/cpu_kquant_gemm.h"
#include "backend/cpu/cpu_math.h"
#include "backend/qblock.h"
#include "check.h"

/* Random valid blocks of d: any bytes, finite fp16 scales near 2^-8. */
static uint8_t *random_blocks(loom_dtype d, int rows, int cols, unsigned seed) {
    size_t n = (size_t)rows * cols / (size_t)loom_qblock_info(d)->block, bytes = (size_t)loom_qblock_info(d)->bytes;
    uint8_t *p = loom_malloc(n * bytes);
    srand(seed);
    for (size_t i = 0; i < n * bytes; i++) p[i] = (uint8_t)rand();
    for (size_t b = 0; b < n; b++) {
        uint16_t h0 = (uint16_t)(0x1C00 + (rand() & 0x3FF)), h1 = (uint16_t)(0x1C00 + (rand() & 0x3FF));
        if (d == LOOM_Q6_K) memcpy(p + bytes * b + 208, &h0, 2);
        else memcpy(p + bytes * b, &h0, 2), memcpy(p + bytes * b + 2, &h1, 2);
    }
    return p;
}

static const loom_dtype fmts[] = {LOOM_Q4_K, LOOM_Q6_K, LOOM_Q4_0, LOOM_Q4_1, LOOM_Q5_0, LOOM_Q5_1};

static void test_round_trip(void) {
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        const loom_dtype d = fmts[f];
        const int R = 24, C = 768, nb = C / loom_qblock_info(d)->block, bytes = loom_qblock_info(d)->bytes;
        const size_t total = (size_t)R * nb * bytes;
        uint8_t *dense = random_blocks(d, R, C, 1), *r8 = loom_malloc(total);
        memcpy(r8, dense, total);
        CHECK(loom_qblock_rows8(d, r8, R, C) == LOOM_OK, "%s", loom_errmsg());
        CHECK(memcmp(r8, dense, total) != 0, "interleaving changed nothing");
        loom_tensor_t td = {.data = dense, .dtype = d, .rows = R, .cols = C}, tr = td;
        tr.data = r8, tr.layout = LOOM_LAYOUT_ROWS8;
        uint8_t tmp[256];
        for (int r = 0; r < R; r++)
            for (int b = 0; b < nb; b++)
                CHECK(!memcmp(loom_qblock_at(&tr, r, b, tmp), dense + ((size_t)r * nb + b) * bytes, (size_t)bytes),
                      "%s row %d block %d not given back", loom_qblock_info(d)->name, r, b);
        float *a = loom_malloc((size_t)R * C * sizeof(float)), *b = loom_malloc((size_t)R * C * sizeof(float));
        loom_tensor_dequantize(&td, a);
        loom_tensor_dequantize(&tr, b);
        CHECK(!memcmp(a, b, (size_t)R * C * sizeof(float)), "the interleaved %s dequantizes differently", loom_qblock_info(d)->name);
        CHECK(loom_tensor_check(&tr, "w") == LOOM_OK, "%s", loom_errmsg());
        loom_tensor_t odd = tr;
        odd.rows = 20;
        CHECK(loom_tensor_check(&odd, "w") != LOOM_OK, "20 rows interleaved by 8 accepted");
        free(dense), free(r8), free(a), free(b);
    }
    loom_tensor_t q5 = {.data = (void *)fmts, .dtype = LOOM_Q5_K, .rows = 8, .cols = 256, .layout = LOOM_LAYOUT_ROWS8};
    CHECK(loom_tensor_check(&q5, "w") != LOOM_OK, "q5_K interleaved accepted");
}

/* |y - exact| within the int8 activations' bound (the header). */
static void check_bound(const float *y, const float *wf, const float *x, const float *bias, int N, int C, int OC, int blk,
                        const char *what) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double exact = bias ? bias[o] : 0.0, lim = 0.0, mag = bias ? fabs(bias[o]) : 0.0;
            for (int b = 0; b < C / blk; b++) {
                double amax = 0.0;
                for (int i = blk * b; i < blk * b + blk; i++) amax = fmax(amax, fabs(x[(size_t)n * C + i]));
                for (int i = blk * b; i < blk * b + blk; i++) {
                    double w = wf[(size_t)o * C + i];
                    exact += w * x[(size_t)n * C + i], lim += fabs(w) * amax / 127.0 / 2.0, mag += fabs(w * x[(size_t)n * C + i]);
                }
            }
            lim = 1.01 * lim + 1e-5 * mag;
            CHECK(fabs(y[(size_t)n * OC + o] - exact) <= lim, "%s N %d row %d out %d: %.9g vs %.9g, over the bound %.3g", what, N, n, o,
                  y[(size_t)n * OC + o], exact, lim);
        }
}

/* Every product of dense td and interleaved tr (the same values wf) on
 * this CPU's instruction sets of their kernels (cpu_kquant.c, or
 * cpu_int8.c for q8_0) and of the prefill GEMM, at every N, without and
 * with bias and GELU: equal bit for bit where the kernels share their
 * operations (*same counts those), within the bound with bias. Returns
 * the products run. */
static int products(const loom_tensor_t *td, const loom_tensor_t *tr, const float *wf, const float *bias, int blk, int *same) {
    static const char *const kq_isas[] = {"portable", "avx2", "avx512", "avx512vnni"};
    static const char *const i8_isas[] = {"portable", "avx2", "avxvnni", "avx512vnni"};
    static const char *const gemm_isas[] = {"portable", "avx2", "avx512", "avx2int8", "avx512vnni"};
    static const int Ns[] = {1, 2, 3, 4, 5, 6, 7, 9, 40};
    const int q8 = td->dtype == LOOM_INT8, OC = (int)td->rows, C = (int)td->cols;
    const char *const *isas = q8 ? i8_isas : kq_isas;
    const char *name = q8 ? "q8_0" : loom_qblock_info(td->dtype)->name;
    int ran = 0;
    for (size_t i = 0; i < 4; i++) {
        if (!(q8 ? loom_cpu_int8_use(isas[i]) : loom_cpu_kq_use(isas[i]))) continue;
        for (size_t gi = 0; gi < sizeof gemm_isas / sizeof gemm_isas[0]; gi++) {
            if (!loom_cpu_kq_gemm_use(gemm_isas[gi])) continue;
            for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
                int N = Ns[k];
                float *x = check_rand((size_t)N * C, 1.0f, 11 + (unsigned)N);
                float *a = loom_malloc((size_t)N * OC * sizeof(float)), *b = loom_malloc((size_t)N * OC * sizeof(float));
                for (int variant = 0; variant < 3; variant++) {
                    const float *bs = variant ? bias : NULL;
                    int gelu = variant == 2;
                    if (q8) {
                        loom_cpu_matmul_forward_w8a8(a, x, td, bs, N, C, OC, gelu);
                        loom_cpu_matmul_forward_w8a8(b, x, tr, bs, N, C, OC, gelu);
                    } else {
                        loom_cpu_matmul_forward_kq(a, x, td, bs, N, C, OC, gelu);
                        loom_cpu_matmul_forward_kq(b, x, tr, bs, N, C, OC, gelu);
                    }
                    if (!q8 || i < 2) { /* q8_0's VNNI tiles keep their own order: the interleaved kernel is AVX2's */
                        CHECK(!memcmp(a, b, (size_t)N * OC * sizeof(float)),
                              "%s, %s / GEMM %s, %d x %d, N %d, bias %d GELU %d: interleaved differs from dense", name, isas[i],
                              gemm_isas[gi], OC, C, N, bs != NULL, gelu);
                        ++*same;
                    }
                    if (variant == 1) check_bound(b, wf, x, bs, N, C, OC, blk, isas[i]);
                    ran++;
                }
                free(x), free(a), free(b);
            }
        }
        loom_cpu_kq_gemm_use(NULL);
    }
    loom_cpu_kq_use(NULL), loom_cpu_int8_use(NULL);
    return ran;
}

static void test_products(void) {
    static const int shapes[][2] = {{48, 768}, {16, 2048}, {24, 576}};
    const size_t nf = sizeof fmts / sizeof fmts[0];
    for (size_t s = 0; s < nf * sizeof shapes / sizeof shapes[0]; s++) {
        loom_dtype d = fmts[s % nf];
        int OC = shapes[s / nf][0], C = shapes[s / nf][1], blk = loom_qblock_info(d)->block;
        if (C % blk) continue;
        size_t total = (size_t)OC * C / blk * (size_t)loom_qblock_info(d)->bytes;
        uint8_t *dense = random_blocks(d, OC, C, 7 + (unsigned)s), *r8 = loom_malloc(total);
        memcpy(r8, dense, total);
        CHECK(loom_qblock_rows8(d, r8, OC, C) == LOOM_OK, "%s", loom_errmsg());
        loom_tensor_t td = {.data = dense, .dtype = d, .rows = OC, .cols = C}, tr = td;
        tr.data = r8, tr.layout = LOOM_LAYOUT_ROWS8;
        float *wf = loom_malloc((size_t)OC * C * sizeof(float)), *bias = check_rand((size_t)OC, 0.5f, 5);
        loom_tensor_dequantize(&td, wf);
        int same = 0, ran = products(&td, &tr, wf, bias, blk, &same);
        printf("  %s %d x %d: %d products on this CPU's instruction sets equal the dense layout's\n", loom_qblock_info(d)->name, OC, C, ran);
        free(dense), free(r8), free(wf), free(bias);
    }
}

/* q8_0 as loom holds it: random int8 values and fp32 block scales. */
static loom_tensor_t random_q8(int rows, int cols, unsigned seed) {
    size_t n = (size_t)rows * cols, nb = n / 32;
    int8_t *q = loom_malloc(n);
    float *s = loom_malloc(nb * sizeof(float));
    srand(seed);
    for (size_t i = 0; i < n; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (size_t b = 0; b < nb; b++) s[b] = ldexpf(1.0f + (float)(rand() & 1023) / 1024.0f, -8);
    return (loom_tensor_t){.data = q, .dtype = LOOM_INT8, .rows = rows, .cols = cols, .scales = s, .block = 32};
}

static loom_tensor_t q8_copy(const loom_tensor_t *t) {
    size_t n = (size_t)t->rows * t->cols;
    loom_tensor_t c = *t;
    c.data = loom_malloc(n), c.scales = loom_malloc(n / 32 * sizeof(float));
    memcpy(c.data, t->data, n), memcpy((float *)c.scales, t->scales, n / 32 * sizeof(float));
    return c;
}

static void q8_free(loom_tensor_t *t) { free(t->data), free((float *)t->scales); }

static void test_q8_round_trip(void) {
    const int R = 24, C = 768;
    loom_tensor_t td = random_q8(R, C, 3), tr = q8_copy(&td);
    CHECK(loom_tensor_rows8_ok(&tr), "q8_0 24 x 768 not interleavable");
    CHECK(loom_tensor_rows8(&tr) == LOOM_OK && tr.layout == LOOM_LAYOUT_ROWS8, "%s", loom_errmsg());
    CHECK(memcmp(tr.data, td.data, (size_t)R * C) != 0, "interleaving changed nothing");
    int8_t *q = loom_malloc((size_t)R * C);
    float *s = loom_malloc((size_t)R * C / 32 * sizeof(float));
    loom_tensor_rows8_dense(&tr, q, s);
    CHECK(!memcmp(q, td.data, (size_t)R * C) && !memcmp(s, td.scales, (size_t)R * C / 32 * sizeof(float)), "values or scales not given back");
    float *a = loom_malloc((size_t)R * C * sizeof(float)), *b = loom_malloc((size_t)R * C * sizeof(float));
    loom_tensor_dequantize(&td, a);
    loom_tensor_dequantize(&tr, b);
    CHECK(!memcmp(a, b, (size_t)R * C * sizeof(float)), "the interleaved q8_0 dequantizes differently");
    CHECK(loom_tensor_check(&tr, "w") == LOOM_OK, "%s", loom_errmsg());
    loom_tensor_t odd = tr;
    odd.rows = 20;
    CHECK(loom_tensor_check(&odd, "w") != LOOM_OK, "int8 of 20 rows interleaved by 8 accepted");
    odd = tr, odd.block = 0;
    CHECK(loom_tensor_check(&odd, "w") != LOOM_OK, "int8 with per-row scales interleaved accepted");
    q8_free(&td), q8_free(&tr), free(q), free(s), free(a), free(b);
}

static void test_q8_products(void) {
    static const int shapes[][2] = {{48, 768}, {16, 2048}, {24, 576}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int OC = shapes[s][0], C = shapes[s][1];
        loom_tensor_t td = random_q8(OC, C, 17 + (unsigned)s), tr = q8_copy(&td);
        CHECK(loom_tensor_rows8(&tr) == LOOM_OK, "%s", loom_errmsg());
        float *wf = loom_malloc((size_t)OC * C * sizeof(float)), *bias = check_rand((size_t)OC, 0.5f, 5);
        loom_tensor_dequantize(&td, wf);
        int same = 0, ran = products(&td, &tr, wf, bias, 32, &same);
        printf("  q8_0 %d x %d: %d products on this CPU's instruction sets within the bound, %d equal to the dense layout's\n", OC, C, ran, same);
        q8_free(&td), q8_free(&tr), free(wf), free(bias);
    }
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_products);
    RUN(test_q8_round_trip);
    RUN(test_q8_products);
    return check_main_end();
}
