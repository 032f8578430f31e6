/* The CPU backend's fused entries against the unfused ops they replace
 * (which test_ops checks against double references): matmul_forward_gelu
 * = matmul_forward + gelu_forward, residual_layernorm_forward =
 * residual_forward + layernorm_forward, matmul_backward_gelu =
 * matmul_backward + gelu_backward. Shapes cover ragged micro-tiles
 * (rows and columns not multiples of the kernels' 12 x 32, 6 x 16, 4 x 16)
 * and K deeper than one packed slice (384). Runs with 1 and 2 threads, with
 * whatever LOOM_CPU_KERNEL / LOOM_GEMM select (tests/test_ops_variants.sh
 * runs every variant). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

#define TOL 1e-6

static const loom_backend_t *be;
static int nthreads;


static void gelu_case(int N, int C, int OC, int has_bias) {
    size_t NO = (size_t)N * OC;
    float *x = check_rand((size_t)N * C, 1, 1), *w = check_rand((size_t)OC * C, 0.1f, 2), *b = check_rand(OC, 1, 3);
    float *pre = check_rand(NO, 100, 4), *out = check_rand(NO, 100, 5), *rpre = check_rand(NO, 100, 6), *rout = check_rand(NO, 100, 7);
    be->matmul_forward_gelu(out, pre, x, w, has_bias ? b : NULL, N, C, OC);
    be->matmul_forward(rpre, x, w, has_bias ? b : NULL, N, C, OC);
    be->gelu_forward(rout, rpre, NO);
    double ep = check_rel_err(pre, rpre, NO), eo = check_rel_err(out, rout, NO);
    CHECK(ep < TOL && eo < TOL, "matmul_forward_gelu N=%d C=%d OC=%d bias=%d, %d thread(s): pre error %.3g, out error %.3g, bound %.0e",
          N, C, OC, has_bias, nthreads, ep, eo, TOL);
    free(x), free(w), free(b), free(pre), free(out), free(rpre), free(rout);
}

static void test_matmul_forward_gelu(void) {
    if (!be->matmul_forward_gelu) {
        check_fail_why("the CPU backend has no matmul_forward_gelu, which it is meant to have (cpu.c fills it at init)");
        return;
    }
    gelu_case(7, 13, 5, 1);
    gelu_case(64, 48, 130, 1);
    gelu_case(37, 800, 70, 0); /* K over one 384-deep slice */
    gelu_case(1, 1, 1, 1);
}

/* matmul_backward_gelu: dpre overwritten with gelu'(pre) * (dout @ w); dw,
 * dbias accumulated as matmul_backward. */
static void bgelu_case(int N, int C, int OC, int has_bias) {
    size_t NC = (size_t)N * C, WC = (size_t)OC * C;
    float *dout = check_rand((size_t)N * OC, 1, 31), *inp = check_rand(NC, 1, 32), *pre = check_rand(NC, 2, 33);
    float *w = check_rand(WC, 0.1f, 34);
    float *dpre = check_rand(NC, 100, 35), *dw = check_rand(WC, 1, 36), *db = check_rand(OC, 1, 37);
    float *rdpre = loom_calloc(NC ? NC : 1, sizeof(float)), *rdw = loom_calloc(WC, sizeof(float)), *rdb = loom_calloc(OC, sizeof(float));
    memcpy(rdw, dw, WC * sizeof(float));
    memcpy(rdb, db, OC * sizeof(float));
    be->matmul_backward_gelu(dpre, dw, has_bias ? db : NULL, dout, inp, pre, w, N, C, OC);
    be->matmul_backward(rdpre, rdw, has_bias ? rdb : NULL, dout, inp, w, N, C, OC);
    be->gelu_backward(rdpre, pre, rdpre, NC);
    double e1 = check_rel_err(dpre, rdpre, NC), e2 = check_rel_err(dw, rdw, WC), e3 = check_rel_err(db, rdb, OC);
    CHECK(e1 < TOL && e2 < TOL && e3 < TOL,
          "matmul_backward_gelu N=%d C=%d OC=%d bias=%d, %d thread(s): errors dpre %.3g dw %.3g dbias %.3g, bound %.0e",
          N, C, OC, has_bias, nthreads, e1, e2, e3, TOL);
    free(dout), free(inp), free(pre), free(w), free(dpre), free(dw), free(db), free(rdpre), free(rdw), free(rdb);
}

static void test_matmul_backward_gelu(void) {
    if (!be->matmul_backward_gelu) {
        check_fail_why("the CPU backend has no matmul_backward_gelu, which it is meant to have (cpu.c fills it at init)");
        return;
    }
    bgelu_case(7, 13, 5, 1);
    bgelu_case(64, 130, 48, 1);
    bgelu_case(37, 70, 800, 0); /* K (= OC here) over one 384-deep slice */
    bgelu_case(1, 1, 1, 1);
}

static void resln_case(int N, int C) {
    size_t n = (size_t)N * C;
    float *a = check_rand(n, 1, 11), *r = check_rand(n, 1, 12), *w = check_rand(C, 1, 13), *b = check_rand(C, 1, 14);
    float *res = check_rand(n, 100, 15), *out = check_rand(n, 100, 16), *mean = check_rand(N, 100, 17), *rstd = check_rand(N, 100, 18);
    float *rres = check_rand(n, 100, 19), *rout = check_rand(n, 100, 20), *rmean = check_rand(N, 100, 21), *rrstd = check_rand(N, 100, 22);
    be->residual_layernorm_forward(res, out, mean, rstd, a, r, w, b, N, C);
    be->residual_forward(rres, a, r, n);
    be->layernorm_forward(rout, rmean, rrstd, rres, w, b, N, C);
    double e1 = check_rel_err(res, rres, n), e2 = check_rel_err(out, rout, n);
    double e3 = check_rel_err(mean, rmean, N), e4 = check_rel_err(rstd, rrstd, N);
    CHECK(e1 < TOL && e2 < TOL && e3 < TOL && e4 < TOL,
          "residual_layernorm_forward N=%d C=%d, %d thread(s): errors res %.3g out %.3g mean %.3g rstd %.3g, bound %.0e",
          N, C, nthreads, e1, e2, e3, e4, TOL);
    /* res may alias a */
    memcpy(rres, a, n * sizeof(float));
    be->residual_layernorm_forward(rres, out, mean, rstd, rres, r, w, b, N, C);
    CHECK(check_rel_err(rres, res, n) < TOL, "residual_layernorm_forward with res aliasing a differs");
    free(a), free(r), free(w), free(b), free(res), free(out), free(mean), free(rstd);
    free(rres), free(rout), free(rmean), free(rrstd);
}

static void test_residual_layernorm_forward(void) {
    if (!be->residual_layernorm_forward) {
        check_fail_why("the CPU backend has no residual_layernorm_forward, which it is meant to have (cpu.c fills it at init)");
        return;
    }
    resln_case(1, 1);
    resln_case(5, 7);
    resln_case(33, 768);
}

int main(void) {
    static const int counts[] = {1, 2};
    for (int i = 0; i < 2; i++) {
        nthreads = counts[i];
        if (loom_backend_cpu_init(&be, nthreads) != LOOM_OK) {
            printf("FAIL cpu backend init (%d threads): %s\n", nthreads, loom_errmsg());
            return 1;
        }
        char name[96];
        snprintf(name, sizeof name, "matmul_forward_gelu (%d thread%s)", nthreads, nthreads == 1 ? "" : "s");
        check_run(name, test_matmul_forward_gelu);
        snprintf(name, sizeof name, "residual_layernorm_forward (%d thread%s)", nthreads, nthreads == 1 ? "" : "s");
        check_run(name, test_residual_layernorm_forward);
        snprintf(name, sizeof name, "matmul_backward_gelu (%d thread%s)", nthreads, nthreads == 1 ? "" : "s");
        check_run(name, test_matmul_backward_gelu);
    }
    return check_main_end();
}
