/* The block formats' prefill GEMM (backend/cpu/cpu_kquant_gemm.c) against
 * the gguf Python package.
 *
 * tests/gguf_blocks.py OUT gemm writes one 100 x 768 tensor per block
 * format (q4_0 ... q6_K) and its values as gguf.quants.dequantize reads
 * them. For every format, on every dequantization instruction set and
 * GEMM micro-kernel this CPU has, at N = 1 .. 40 input rows (not
 * multiples of the micro-kernels' 12 or 6 rows), OC = 100, 37 and 7 (not
 * multiples of the panels' 32 or 64), with slices of 256 values (so that
 * the sums cross slice edges) or of the whole row, with and without bias:
 *   - out is within the bound below of the fp64 product of gguf's values
 *     and the fp32 input, plus the bias;
 *   - every dequantization set gives the same bits (each computes gguf's
 *     values exactly);
 *   - with GELU, out is loom_gelu of the same product (the epilogue);
 *   - matmul_forward_kq at the threshold's N runs this GEMM (same bits).
 * The int8 tiles (sets avx2int8 and avx512vnni, where the CPU has them:
 * per 256 values on the k-quants, per 32 on the 32-value formats) are
 * checked against their own bound (int8_bound below), with and without
 * GELU.
 *
 * The bound. The weights are gguf's values exactly and the input is used
 * as given, so only the fp32 sums round: per output, C fused multiply-adds
 * in k order, one add per (slice, GEMM depth block) partial sum (at most
 * C / 32 + 1) and one for the bias, each rounding once (relative u =
 * 2^-24) a value at most S = |bias| + sum_i |w_i x_i|: error <= gamma_n S
 * with n = C + C / 32 + 2 and gamma_n = n u / (1 - n u) <= 1.01 n u. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_kquant.h"
#include "backend/cpu/cpu_kquant_gemm.h"
#include "backend/cpu/cpu_math.h"
#include "backend/qblock.h"
#include "backend/qblock_impl.h"
#include "check.h"
#include "ckpt/gguf_file.h"

#define PYTHON "/usr/bin/python3"

static char dir[256];

/* gemm.gguf and gemm_ref.gguf in dir: 1, or 0 (skipped or failed). The
 * script's output goes to dir/oracle.log, read back only when it fails. */
static int oracle_files(void) {
    if (access(PYTHON, X_OK) != 0) {
        check_skip("%s not found", PYTHON);
        return 0;
    }
    snprintf(dir, sizeof dir, "%s", check_tmpdir("kquant-gemm"));
    char cmd[768], log[2048] = "";
    snprintf(cmd, sizeof cmd, "PYTHONPATH=.deps/py " PYTHON " tests/gguf_blocks.py %s gemm > %s/oracle.log 2>&1", dir, dir);
    if (system(cmd) == 0) return 1;
    FILE *f = fopen(check_tmp_path("oracle.log"), "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = 0;
    if (f) fclose(f);
    if (strstr(log, "ModuleNotFoundError")) check_skip("the gguf Python package is missing (.deps/py): %s", log);
    else CHECK(0, "tests/gguf_blocks.py gemm failed: %s", log);
    return 0;
}

static loom_gguf_t *open_file(const char *name) {
    loom_gguf_t *g = NULL;
    CHECK(loom_gguf_open(&g, check_tmp_path(name)) == LOOM_OK, "%s", loom_errmsg());
    return g;
}

typedef struct {
    const loom_tensor_t *w; /* its first OC rows */
    const float *wf;        /* gguf's values (rows, C) */
    const float *x, *bias;  /* (N, C), (OC) or NULL */
    int N, C, OC;
} gemm_case_t;

/* out against the fp64 product; the worst error over the bound. */
static double check_bound(const gemm_case_t *k, const float *out, const char *what) {
    const double u = ldexp(1.0, -24), n = k->C + k->C / 32 + 2;
    double worst = 0;
    for (int r = 0; r < k->N; r++)
        for (int o = 0; o < k->OC; o++) {
            double want = k->bias ? k->bias[o] : 0.0, S = fabs(want);
            for (int i = 0; i < k->C; i++) {
                double p = (double)k->wf[(size_t)o * k->C + i] * k->x[(size_t)r * k->C + i];
                want += p, S += fabs(p);
            }
            double err = fabs(out[(size_t)r * k->OC + o] - want), lim = 1.01 * n * u * S + 1e-30;
            CHECK(err <= lim, "%s row %d out %d: %.9g vs %.9g, error %.3g over the bound %.3g", what, r, o,
                  out[(size_t)r * k->OC + o], want, err, lim);
            worst = fmax(worst, err / lim);
        }
    return worst;
}

/* The int8 tiles' bound. They compute, per output and block b of the
 * activations' rounding (256 values on the k-quants, 32 on the 32-value
 * formats), xd_b (d sumi - dmin summ) (32-value: xd_b (d sumi + m sumq))
 * with exact integer sums, where x_i is replaced by xd_b q_i,
 * |x_i - xd_b q_i| <= xd_b / 2 (round to nearest; xd_b = amax_b / 127, so
 * no clamping), and w_i by the real d sc_j u_i - dmin m_j (d (u_i - off) or
 * d u_i + m) (gguf's w_i rounds its products and difference: within 2u A_i
 * of it, A_i = |d sc_j| umax + |dmin m_j|; q6_K: |d sc_j| (63 + 32), its
 * "min" being 32 sc_j; 32-value: |d| 31 + |m|). So
 *   |out - sum w_i x_i| <= sum_b (xd_b / 2) sum_{i in b} |w_i|   (activations)
 *                        + 2u sum_i A_i (|x_i| + xd_b / 2)        (weights)
 *                        + gamma_n (sum_b xd_b sum_i A_i |q_i| + |bias|)
 * the last for the float operations: int->float conversions, products, a
 * difference, the product by xd_b and the sum over C / block blocks plus
 * the bias, n = C / block + 8 roundings, each of a value at most that sum
 * (|q_i| xd_b <= |x_i| + xd_b / 2). With 2u <= gamma_n:
 *   bound = sum_b (xd_b / 2) sum |w_i| + gamma_n (sum_i A_i (2 |x_i| + 2 xd_b) + |bias|). */
static double weight_mag(loom_dtype d, const uint8_t *blk, int i) {
    if (d == LOOM_Q6_K) return fabs((double)qblock_f16(blk + 208) * (int8_t)blk[192 + i / 16]) * 95;
    if (d < LOOM_Q4_K) return fabs((double)qblock_f16(blk)) * 31 + (d == LOOM_Q4_1 || d == LOOM_Q5_1 ? fabs((double)qblock_f16(blk + 2)) : 0);
    int sc, m;
    qblock_scale_min_k4(i / 32, blk + 4, &sc, &m);
    return fabs((double)qblock_f16(blk) * sc) * (d == LOOM_Q4_K ? 15 : 31) + fabs((double)qblock_f16(blk + 2) * m);
}

static double int8_bound(const loom_tensor_t *w, int o, const float *wf, const float *x, int C, double bias) {
    const loom_qblock_info_t *qi = loom_qblock_info(w->dtype);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * loom_qblock_row_bytes(w->dtype, C);
    int bl = qi->block;
    double act = 0, big = 0, n = C / bl + 8, gamma = 1.01 * n * ldexp(1.0, -24);
    for (int b = 0; b < C / bl; b++) {
        const uint8_t *blk = row + (size_t)b * qi->bytes;
        double amax = 0, xd;
        for (int i = bl * b; i < bl * b + bl; i++) amax = fmax(amax, fabs(x[i]));
        xd = (double)((float)amax / 127.0f);
        for (int i = 0; i < bl; i++) {
            act += xd / 2 * fabs(wf[bl * b + i]);
            big += weight_mag(w->dtype, blk, i) * (2 * fabs(x[bl * b + i]) + 2 * xd);
        }
    }
    return act + gamma * (big + fabs(bias)) + 1e-30;
}

/* The int8 tile on a block format: within int8_bound, GELU of the same. */
static double check_int8(const gemm_case_t *k, const char *name) {
    size_t n = (size_t)k->N * k->OC;
    float *out = loom_malloc(n * sizeof(float)), *g = loom_malloc(n * sizeof(float));
    double worst = 0;
    CHECK(loom_cpu_kq_gemm_run(out, k->x, k->w, k->bias, k->N, k->C, k->OC, 0), "out of memory");
    CHECK(loom_cpu_kq_gemm_run(g, k->x, k->w, k->bias, k->N, k->C, k->OC, 1), "out of memory");
    for (int r = 0; r < k->N; r++)
        for (int o = 0; o < k->OC; o++) {
            const float *xr = k->x + (size_t)r * k->C, *wr = k->wf + (size_t)o * k->C;
            double want = k->bias ? k->bias[o] : 0.0;
            for (int i = 0; i < k->C; i++) want += (double)wr[i] * xr[i];
            double got = out[(size_t)r * k->OC + o], lim = int8_bound(k->w, o, wr, xr, k->C, k->bias ? k->bias[o] : 0.0);
            CHECK(fabs(got - want) <= lim, "%s int8 N %d OC %d row %d out %d: %.9g vs %.9g, over the bound %.3g", name, k->N,
                  k->OC, r, o, got, want, lim);
            CHECK(g[(size_t)r * k->OC + o] == loom_gelu((float)got), "%s int8 with GELU: row %d out %d", name, r, o);
            worst = fmax(worst, fabs(got - want) / lim);
        }
    free(out), free(g);
    return worst;
}

/* One shape: every dequantization set on the best micro-kernel (the same
 * bits), the other micro-kernels with the best set, each within the
 * bound; GELU on the best. */
static double check_shape(const gemm_case_t *k, const char *name) {
    /* the fp32 path's sets (avx512vnni is the int8 tile, checked below) */
    static const char *const isas[] = {"portable", "avx2", "avx512"}, *const kernels[] = {"avx512", "avx2", "scalar"};
    int nisa = 3;
    size_t n = (size_t)k->N * k->OC;
    float *out = loom_malloc(n * sizeof(float)), *first = loom_malloc(n * sizeof(float));
    double worst = 0;
    char what[160];
    for (int kn = 0, best = 1; kn < 3; kn++) {
        const char *why;
        if (loom_cpu_gemm_select(kernels[kn], &why) != 0) continue;
        int ran = 0;
        for (int i = best ? 0 : 2; i < nisa; i++) {
            if (!loom_cpu_kq_gemm_use(isas[i])) continue;
            snprintf(what, sizeof what, "%s N %d OC %d (dequant %s, gemm %s)", name, k->N, k->OC, isas[i], kernels[kn]);
            CHECK(loom_cpu_kq_gemm_run(ran ? out : first, k->x, k->w, k->bias, k->N, k->C, k->OC, 0), "%s: out of memory", what);
            if (ran) CHECK(!memcmp(out, first, n * sizeof(float)), "%s differs from the portable dequantization", what);
            ran++;
        }
        loom_cpu_kq_gemm_use(NULL);
        worst = fmax(worst, check_bound(k, first, what));
        if (!best) continue;
        best = 0;
        for (int i = 2; i > 0 && !loom_cpu_kq_gemm_use(isas[i]); i--) /* the fp32 path's best set */
            ;
        loom_cpu_kq_gemm_run(out, k->x, k->w, k->bias, k->N, k->C, k->OC, 1);
        loom_cpu_kq_gemm_use(NULL);
        for (size_t i = 0; i < n; i++)
            if (out[i] != loom_gelu(first[i])) {
                CHECK(0, "%s with GELU: element %zu is %.9g, gelu of the product %.9g", what, i, out[i], loom_gelu(first[i]));
                break;
            }
    }
    const char *why;
    loom_cpu_gemm_select(NULL, &why);
    free(out), free(first);
    static const char *const tiles[] = {"avx2int8", "avx512vnni"};
    for (int i = 0; i < 2; i++)
        if (loom_cpu_kq_gemm_use(tiles[i])) {
            printf("  %s N %d OC %d int8 tile (%s): worst error %.3f of its bound\n", name, k->N, k->OC, tiles[i], check_int8(k, name));
            loom_cpu_kq_gemm_use(NULL);
        }
    return worst;
}

static void test_gemm_bound(void) {
    if (!oracle_files()) return;
    loom_gguf_t *g = open_file("gemm.gguf"), *r = open_file("gemm_ref.gguf");
    if (!g || !r) return;
    CHECK(loom_gguf_ntensors(g) == 7, "%d tensors", loom_gguf_ntensors(g));
    /* N, OC, slice (0: the whole row), bias */
    static const int shapes[][4] = {{1, 100, 0, 1}, {13, 37, 256, 0}, {16, 100, 256, 1}, {40, 7, 0, 1}, {40, 100, 256, 1}};
    for (int t = 0; t < loom_gguf_ntensors(g); t++) {
        const loom_gguf_tensor_t *bt = loom_gguf_tensor_at(g, t), *ref = loom_gguf_find(r, bt->name);
        if (!ref) continue;
        int C = (int)bt->ne[0];
        double worst = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int N = shapes[s][0], OC = shapes[s][1];
            loom_cpu_kq_gemm_slice(shapes[s][2]);
            loom_tensor_t w = {.data = (void *)bt->data, .dtype = (loom_dtype)loom_qblock_of_ggml(bt->type), .rows = OC, .cols = C};
            float *x = check_rand((size_t)N * C, 1.0f, 11 + (unsigned)s), *bias = check_rand((size_t)OC, 0.5f, 5);
            gemm_case_t k = {&w, ref->data, x, shapes[s][3] ? bias : NULL, N, C, OC};
            worst = fmax(worst, check_shape(&k, bt->name));
            free(x), free(bias);
        }
        loom_cpu_kq_gemm_slice(0);
        printf("  %s: worst error %.3f of the bound\n", bt->name, worst);
    }
    printf("  dequantization %s, gemm %s\n", loom_cpu_kq_gemm_isa(), loom_cpu_gemm_kernel());
    loom_gguf_close(g);
    loom_gguf_close(r);
}

/* matmul_forward_kq hands N >= loom_cpu_kq_gemm_rows(d) to the GEMM. */
static void test_dispatch(void) {
    if (!oracle_files()) return;
    loom_gguf_t *g = open_file("gemm.gguf");
    if (!g) return;
    const loom_gguf_tensor_t *bt = loom_gguf_find(g, "q4_k");
    CHECK(bt != NULL, "no q4_k tensor");
    if (bt) {
        int C = (int)bt->ne[0], OC = (int)bt->ne[1], N = loom_cpu_kq_gemm_rows(LOOM_Q4_K);
        loom_tensor_t w = {.data = (void *)bt->data, .dtype = LOOM_Q4_K, .rows = OC, .cols = C};
        float *x = check_rand((size_t)N * C, 1.0f, 3), *a = loom_malloc((size_t)N * OC * sizeof(float)),
              *b = loom_malloc((size_t)N * OC * sizeof(float));
        loom_cpu_matmul_forward_kq(a, x, &w, NULL, N, C, OC, 0);
        loom_cpu_kq_gemm_run(b, x, &w, NULL, N, C, OC, 0);
        CHECK(!memcmp(a, b, (size_t)N * OC * sizeof(float)), "matmul_forward_kq at N %d is not the GEMM", N);
        printf("  N %d and above: the GEMM\n", N);
        free(x), free(a), free(b);
    }
    loom_gguf_close(g);
}

int main(void) {
    RUN(test_gemm_bound);
    RUN(test_dispatch);
    return check_main_end();
}
