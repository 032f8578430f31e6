/* Op-by-op tests of the CPU backend against naive double-precision
 * references written here from the contract in src/backend/backend.h (not
 * from cpu.c). Every case runs with 1 and with 2 threads; with 2 it runs the
 * op twice on identical inputs and requires bit-identical results, since the
 * backend promises determinism for a given thread count.
 *
 * Gradient outputs are pre-filled with random "old" values: accumulating ops
 * must give old + new, overwriting ops must give new. The old values are as
 * large as the new ones, so either mistake costs a normalized error of order
 * 1, far above the bounds.
 *
 * Bound: normalized error ||got - ref|| / ||ref|| < 1e-5 (TOL) unless an op
 * says otherwise. fp32 rounding of a length-K sum is ~sqrt(K) * 6e-8
 * relative, so 1e-5 holds for the K here (up to 768) while a wrong index, a
 * missed term or a wrong factor gives errors of order 1e-1 and more.
 *
 * The CPU backend's memory is host memory, so host buffers are passed to
 * the ops directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

#define TOL 1e-5

static const loom_backend_t *be;
static int nthreads;   /* threads the backend was opened with */
static char shape[160]; /* the current case's shape, for failure messages */

/* Runs per case: a second one with more than one thread, for determinism. */
static int runs(void) { return nthreads > 1 ? 2 : 1; }

#define EXPECT_CLOSE(what, got, ref, n, bound)                                               \
    do {                                                                                     \
        double e_ = check_rel_err_d((got), (ref), (n));                                      \
        CHECK(e_ < (bound), "%s [%s, %d thread(s)]: normalized error %.3g, bound %.0e",      \
              (what), shape, nthreads, e_, (double)(bound));                                 \
    } while (0)

/* The second run (with more than one thread) must equal the first bit for bit. */
#define EXPECT_SAME(what, a, b, bytes)                                                       \
    do {                                                                                     \
        if (runs() > 1)                                                                      \
            CHECK(memcmp((a), (b), (bytes)) == 0,                                            \
                  "%s [%s, %d threads]: two runs on the same inputs differ", (what), shape,  \
                  nthreads);                                                                 \
    } while (0)

static float *fnew(size_t n) { return loom_calloc(n ? n : 1, sizeof(float)); }
static double *dnew(size_t n) { return loom_calloc(n ? n : 1, sizeof(double)); }
static float *fcopy(const float *x, size_t n) {
    float *y = fnew(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
static double *dfrom(const float *x, size_t n) {
    double *y = dnew(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
static float *ffrom(const double *x, size_t n) {
    float *y = fnew(n);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
/* Tokens in [0, V) with 0 and V-1 present and, for small V, many repeats. */
static int *tokens_new(int n, int V, unsigned seed) {
    int *t = loom_calloc(n ? (size_t)n : 1, sizeof(int));
    for (int i = 0; i < n; i++) t[i] = (int)(((unsigned)i * 2654435761u + seed * 40503u) >> 7) % V;
    t[0] = 0;
    if (n > 1) t[n - 1] = V - 1;
    return t;
}

/* ---- encoder ---- bound TOL on out, dwte, dwpe (sums of a few floats) */

static void encoder_case(int B, int T, int C, int V, int Vp, int maxT) {
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d Vp=%d maxT=%d", B, T, C, V, Vp, maxT);
    size_t N = (size_t)B * T, nte = (size_t)Vp * C, npe = (size_t)maxT * C;
    int *tok = tokens_new((int)N, V, 1);
    float *wte = check_rand(nte, 1, 2), *wpe = check_rand(npe, 1, 3), *dout = check_rand(N * C, 1, 4);
    float *dwte0 = check_rand(nte, 1, 5), *dwpe0 = check_rand(npe, 1, 6);

    /* forward overwrites out */
    float *out[2], *dwte[2], *dwpe[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(N * C, 100, 7);
        be->encoder_forward(out[r], tok, wte, wpe, B, T, C);
        dwte[r] = fcopy(dwte0, nte);
        dwpe[r] = fcopy(dwpe0, npe);
        be->encoder_backward(dwte[r], dwpe[r], dout, tok, B, T, C);
    }
    double *ref = dnew(N * C), *rdwte = dfrom(dwte0, nte), *rdwpe = dfrom(dwpe0, npe);
    for (size_t n = 0; n < N; n++) {
        int t = (int)(n % T), v = tok[n];
        for (int c = 0; c < C; c++) {
            ref[n * C + c] = (double)wte[(size_t)v * C + c] + wpe[(size_t)t * C + c];
            rdwte[(size_t)v * C + c] += dout[n * C + c];
            rdwpe[(size_t)t * C + c] += dout[n * C + c];
        }
    }
    EXPECT_CLOSE("encoder_forward out", out[0], ref, N * C, TOL);
    EXPECT_CLOSE("encoder_backward dwte (old + new)", dwte[0], rdwte, nte, TOL);
    EXPECT_CLOSE("encoder_backward dwpe (old + new)", dwpe[0], rdwpe, npe, TOL);
    EXPECT_SAME("encoder_forward out", out[0], out[1], N * C * sizeof(float));
    EXPECT_SAME("encoder_backward dwte", dwte[0], dwte[1], nte * sizeof(float));
    EXPECT_SAME("encoder_backward dwpe", dwpe[0], dwpe[1], npe * sizeof(float));
    for (int r = 0; r < runs(); r++) {
        free(out[r]);
        free(dwte[r]);
        free(dwpe[r]);
    }
    free(tok), free(wte), free(wpe), free(dout), free(dwte0), free(dwpe0);
    free(ref), free(rdwte), free(rdwpe);
}

static void test_encoder(void) {
    encoder_case(2, 7, 13, 5, 64, 9);     /* few tokens: many repeats per row */
    encoder_case(3, 37, 48, 50, 64, 40);  /* ragged T */
    encoder_case(2, 33, 200, 50, 64, 33); /* C not a multiple of 16 */
    encoder_case(1, 1, 1, 1, 64, 1);
}

/* ---- layernorm ---- bound TOL on out, mean, rstd, dinp, dw, db (C up to 768) */

static void layernorm_case(int N, int C, float shift) {
    snprintf(shape, sizeof shape, "N=%d C=%d shift=%g", N, C, shift);
    size_t NC = (size_t)N * C;
    float *x = check_rand(NC, 1, 11), *w = check_rand(C, 0.5f, 12), *b = check_rand(C, 0.5f, 13);
    for (size_t i = 0; i < NC; i++) x[i] += shift;
    for (int i = 0; i < C; i++) w[i] += 1.0f;
    float *dout = check_rand(NC, 1, 14), *dinp0 = check_rand(NC, 1, 15), *dw0 = check_rand(C, 1, 16),
          *db0 = check_rand(C, 1, 17);

    /* reference forward */
    double *ref = dnew(NC), *rmean = dnew(N), *rrstd = dnew(N);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double m = 0, var = 0;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= C;
        for (int i = 0; i < C; i++) var += (xr[i] - m) * (xr[i] - m);
        var /= C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int i = 0; i < C; i++) ref[(size_t)n * C + i] = (xr[i] - m) * s * w[i] + b[i];
        rmean[n] = m;
        rrstd[n] = s;
    }
    /* reference backward through the full Jacobian of one row:
     * d out_i / d x_j = w_i s (delta_ij - 1/C - xhat_i xhat_j / C). */
    double *rdinp = dfrom(dinp0, NC), *rdw = dfrom(dw0, C), *rdb = dfrom(db0, C);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *d = dout + (size_t)n * C;
        double m = rmean[n], s = rrstd[n];
        for (int j = 0; j < C; j++) {
            double xj = (xr[j] - m) * s, acc = 0;
            for (int i = 0; i < C; i++) {
                double xi = (xr[i] - m) * s;
                acc += d[i] * w[i] * s * ((i == j) - 1.0 / C - xi * xj / C);
            }
            rdinp[(size_t)n * C + j] += acc;
            rdw[j] += d[j] * xj;
            rdb[j] += d[j];
        }
    }
    /* backward gets the reference statistics, so that it is tested alone */
    float *fmean = ffrom(rmean, N), *frstd = ffrom(rrstd, N);

    float *out[2], *mean[2], *rstd[2], *dinp[2], *dw[2], *db[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(NC, 100, 18); /* overwritten */
        mean[r] = check_rand(N, 100, 19);
        rstd[r] = check_rand(N, 100, 20);
        be->layernorm_forward(out[r], mean[r], rstd[r], x, w, b, N, C);
        dinp[r] = fcopy(dinp0, NC);
        dw[r] = fcopy(dw0, C);
        db[r] = fcopy(db0, C);
        be->layernorm_backward(dinp[r], dw[r], db[r], dout, x, w, fmean, frstd, N, C);
    }
    EXPECT_CLOSE("layernorm_forward out", out[0], ref, NC, TOL);
    EXPECT_CLOSE("layernorm_forward mean", mean[0], rmean, N, TOL);
    EXPECT_CLOSE("layernorm_forward rstd", rstd[0], rrstd, N, TOL);
    EXPECT_CLOSE("layernorm_backward dinp (old + new)", dinp[0], rdinp, NC, TOL);
    EXPECT_CLOSE("layernorm_backward dw (old + new)", dw[0], rdw, C, TOL);
    EXPECT_CLOSE("layernorm_backward db (old + new)", db[0], rdb, C, TOL);
    EXPECT_SAME("layernorm_forward out", out[0], out[1], NC * sizeof(float));
    EXPECT_SAME("layernorm_forward mean", mean[0], mean[1], N * sizeof(float));
    EXPECT_SAME("layernorm_forward rstd", rstd[0], rstd[1], N * sizeof(float));
    EXPECT_SAME("layernorm_backward dinp", dinp[0], dinp[1], NC * sizeof(float));
    EXPECT_SAME("layernorm_backward dw", dw[0], dw[1], C * sizeof(float));
    EXPECT_SAME("layernorm_backward db", db[0], db[1], C * sizeof(float));
    for (int r = 0; r < runs(); r++) free(out[r]), free(mean[r]), free(rstd[r]), free(dinp[r]), free(dw[r]), free(db[r]);
    free(x), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0);
    free(ref), free(rmean), free(rrstd), free(rdinp), free(rdw), free(rdb), free(fmean), free(frstd);
}

static void test_layernorm(void) {
    layernorm_case(7, 13, 0);
    layernorm_case(64, 48, 2.5f); /* a mean far from 0 */
    layernorm_case(5, 768, 0);
    layernorm_case(3, 3, 0.5f);   /* (C = 1 or 2 normalize to constants: dinp ~ 0, rounding dominates) */
}

/* ---- matmul ---- bound TOL on out, dinp, dw, dbias (dot products up to K=768) */

/* which: bit 0 dinp given, bit 1 dbias given; bias for forward when has_bias. */
static void matmul_case(int N, int C, int OC, int has_bias, int which) {
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d bias=%d dinp=%s dbias=%s", N, C, OC, has_bias,
             which & 1 ? "yes" : "NULL", which & 2 ? "yes" : "NULL");
    size_t NC = (size_t)N * C, WC = (size_t)OC * C, NO = (size_t)N * OC;
    float *x = check_rand(NC, 1, 21), *w = check_rand(WC, 1, 22), *bias = has_bias ? check_rand(OC, 1, 23) : NULL;
    float *dout = check_rand(NO, 1, 24), *dinp0 = check_rand(NC, 1, 25), *dw0 = check_rand(WC, 1, 26),
          *db0 = check_rand(OC, 1, 27);
    /* Old values scaled like the new ones: a gradient of K terms is ~sqrt(K)/3. */
    for (size_t i = 0; i < NC; i++) dinp0[i] *= sqrtf((float)OC);
    for (size_t i = 0; i < WC; i++) dw0[i] *= sqrtf((float)N);
    for (int i = 0; i < OC; i++) db0[i] *= sqrtf((float)N);

    double *ref = dnew(NO), *rdinp = dfrom(dinp0, NC), *rdw = dfrom(dw0, WC), *rdb = dfrom(db0, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0;
            for (int c = 0; c < C; c++) acc += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
            ref[(size_t)n * OC + o] = acc;
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int o = 0; o < OC; o++) acc += (double)dout[(size_t)n * OC + o] * w[(size_t)o * C + c];
            rdinp[(size_t)n * C + c] += acc;
        }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int n = 0; n < N; n++) acc += (double)dout[(size_t)n * OC + o] * x[(size_t)n * C + c];
            rdw[(size_t)o * C + c] += acc;
        }
        for (int n = 0; n < N; n++) rdb[o] += dout[(size_t)n * OC + o];
    }

    float *out[2], *dinp[2] = {0}, *dw[2], *db[2] = {0};
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(NO, 100, 28); /* overwritten */
        be->matmul_forward(out[r], x, w, bias, N, C, OC);
        if (which & 1) dinp[r] = fcopy(dinp0, NC);
        if (which & 2) db[r] = fcopy(db0, OC);
        dw[r] = fcopy(dw0, WC);
        be->matmul_backward(dinp[r], dw[r], db[r], dout, x, w, N, C, OC);
    }
    EXPECT_CLOSE("matmul_forward out", out[0], ref, NO, TOL);
    EXPECT_CLOSE("matmul_backward dw (old + new)", dw[0], rdw, WC, TOL);
    EXPECT_SAME("matmul_forward out", out[0], out[1], NO * sizeof(float));
    EXPECT_SAME("matmul_backward dw", dw[0], dw[1], WC * sizeof(float));
    if (which & 1) {
        EXPECT_CLOSE("matmul_backward dinp (old + new)", dinp[0], rdinp, NC, TOL);
        EXPECT_SAME("matmul_backward dinp", dinp[0], dinp[1], NC * sizeof(float));
    }
    if (which & 2) {
        EXPECT_CLOSE("matmul_backward dbias (old + new)", db[0], rdb, OC, TOL);
        EXPECT_SAME("matmul_backward dbias", db[0], db[1], OC * sizeof(float));
    }
    for (int r = 0; r < runs(); r++) free(out[r]), free(dinp[r]), free(dw[r]), free(db[r]);
    free(x), free(w), free(bias), free(dout), free(dinp0), free(dw0), free(db0);
    free(ref), free(rdinp), free(rdw), free(rdb);
}

static void test_matmul(void) {
    matmul_case(7, 13, 5, 1, 3);
    matmul_case(7, 13, 5, 0, 3);
    matmul_case(64, 48, 130, 1, 3); /* dbias spans three blocks of 64, the last ragged */
    matmul_case(64, 48, 130, 1, 1); /* dbias NULL */
    matmul_case(64, 48, 130, 0, 2); /* dinp NULL */
    matmul_case(33, 768, 67, 1, 0); /* dinp and dbias NULL; long dot products */
    matmul_case(1, 1, 1, 1, 3);
}

/* ---- attention ---- bound TOL on out, lse and each of dq, dk, dv (T up to 100) */

/* Reference causal attention of one (B,T,3C) qkv in double: out (B,T,C),
 * lse (B,NH,T) and, when dout is given, dqkv (B,T,3C) by the full softmax
 * Jacobian: dS_j = P_j (dP_j - sum_k P_k dP_k). */
static void attention_ref(double *out, double *lse, double *dqkv, const float *dout,
                          const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    double scale = 1.0 / sqrt((double)hs);
    double *P = dnew(T), *dP = dnew(T);
    if (dqkv) memset(dqkv, 0, (size_t)B * T * C3 * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * C3 + (size_t)h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + (size_t)h * hs;
                    double dot = 0;
                    for (int e = 0; e < hs; e++) dot += (double)q[e] * k[e];
                    P[j] = dot * scale;
                    mx = fmax(mx, P[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(P[j] - mx);
                double L = mx + log(sum);
                lse[((size_t)b * NH + h) * T + i] = L;
                for (int j = 0; j <= i; j++) P[j] = exp(P[j] - L);
                double *o = out + ((size_t)b * T + i) * C + (size_t)h * hs;
                for (int e = 0; e < hs; e++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        acc += P[j] * qkv[((size_t)b * T + j) * C3 + 2 * C + (size_t)h * hs + e];
                    o[e] = acc;
                }
                if (!dqkv) continue;
                const float *dO = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
                double PdP = 0;
                for (int j = 0; j <= i; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + (size_t)h * hs;
                    dP[j] = 0;
                    for (int e = 0; e < hs; e++) dP[j] += (double)dO[e] * v[e];
                    PdP += P[j] * dP[j];
                }
                double *dq = dqkv + ((size_t)b * T + i) * C3 + (size_t)h * hs;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + (size_t)h * hs;
                    double *dk = dqkv + ((size_t)b * T + j) * C3 + C + (size_t)h * hs;
                    double *dv = dk + C;
                    double dS = P[j] * (dP[j] - PdP);
                    for (int e = 0; e < hs; e++) {
                        dq[e] += dS * scale * k[e];
                        dk[e] += dS * scale * q[e];
                        dv[e] += P[j] * dO[e];
                    }
                }
            }
    free(P), free(dP);
}

/* Column block `part` (0 q, 1 k, 2 v) of an (N,3C) tensor, as (N,C). */
static void take_part_f(float *dst, const float *src, size_t N, int C, int part) {
    for (size_t n = 0; n < N; n++) memcpy(dst + n * C, src + n * 3 * C + (size_t)part * C, C * sizeof(float));
}
static void take_part_d(double *dst, const double *src, size_t N, int C, int part) {
    for (size_t n = 0; n < N; n++) memcpy(dst + n * C, src + n * 3 * C + (size_t)part * C, C * sizeof(double));
}

static void attention_case(int B, int T, int C, int NH, float qk_scale) {
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d qk scale %g", B, T, C, NH, qk_scale);
    size_t N = (size_t)B * T, NC = N * C, N3 = 3 * NC, NL = (size_t)B * NH * T;
    float *qkv = check_rand(N3, 1, 31), *dout = check_rand(NC, 1, 32);
    for (size_t n = 0; n < N; n++)
        for (int c = 0; c < 2 * C; c++) qkv[n * 3 * C + c] *= qk_scale; /* sharper softmax */
    double *ref = dnew(NC), *rlse = dnew(NL), *rdqkv = dnew(N3);
    attention_ref(ref, rlse, rdqkv, dout, qkv, B, T, C, NH);
    /* backward gets the reference out and lse, so that it is tested alone */
    float *fout = ffrom(ref, NC), *flse = ffrom(rlse, NL);

    float *out[2], *lse[2], *dqkv[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(NC, 100, 33); /* all three overwritten */
        lse[r] = check_rand(NL, 100, 34);
        dqkv[r] = check_rand(N3, 100, 35);
        be->attention_forward(out[r], lse[r], qkv, B, T, C, NH, NH);
        be->attention_backward(dqkv[r], dout, qkv, fout, flse, B, T, C, NH, NH);
    }
    EXPECT_CLOSE("attention_forward out", out[0], ref, NC, TOL);
    EXPECT_CLOSE("attention_forward lse", lse[0], rlse, NL, TOL);
    static const char *const names[3] = {"attention_backward dq (overwrite)",
                                         "attention_backward dk (overwrite)",
                                         "attention_backward dv (overwrite)"};
    float *gp = fnew(NC);
    double *rp = dnew(NC);
    for (int part = 0; part < 3; part++) {
        take_part_f(gp, dqkv[0], N, C, part);
        take_part_d(rp, rdqkv, N, C, part);
        EXPECT_CLOSE(names[part], gp, rp, NC, TOL);
    }
    EXPECT_SAME("attention_forward out", out[0], out[1], NC * sizeof(float));
    EXPECT_SAME("attention_forward lse", lse[0], lse[1], NL * sizeof(float));
    EXPECT_SAME("attention_backward dqkv", dqkv[0], dqkv[1], N3 * sizeof(float));
    for (int r = 0; r < runs(); r++) free(out[r]), free(lse[r]), free(dqkv[r]);
    free(qkv), free(dout), free(ref), free(rlse), free(rdqkv), free(fout), free(flse), free(gp), free(rp);
}

static void test_attention(void) {
    attention_case(1, 1, 4, 1, 1);
    attention_case(2, 37, 48, 3, 1);  /* ragged T, three heads */
    attention_case(1, 7, 30, 2, 2);   /* head size 15 */
    attention_case(2, 64, 64, 4, 1.5f);
    attention_case(1, 100, 96, 2, 1);
}

/* ---- GELU ---- bound TOL on out and dinp */

static double gelu_ref(double x) {
    const double k = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double gelu_grad_ref(double x) {
    const double k = sqrt(2.0 / M_PI);
    double u = k * (x + 0.044715 * x * x * x), th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3 * 0.044715 * x * x);
}

/* Inputs in [-scale, scale). Where gelu is near 0 (x below about -2) the
 * float 1 + tanh(u) cancels; a norm over many inputs is dominated by the
 * others, but a single input must stay out of that tail. */
static void gelu_case(size_t n, float scale) {
    snprintf(shape, sizeof shape, "n=%zu scale=%g", n, scale);
    float *x = check_rand(n, scale, 41), *dout = check_rand(n, 1, 42);
    double *ref = dnew(n), *rd = dnew(n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = gelu_ref(x[i]);
        rd[i] = gelu_grad_ref(x[i]) * dout[i];
    }
    float *out[2], *dinp[2], *alias[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(n, 100, 43); /* overwritten */
        be->gelu_forward(out[r], x, n);
        dinp[r] = check_rand(n, 100, 44); /* overwritten */
        be->gelu_backward(dinp[r], x, dout, n);
        alias[r] = fcopy(dout, n); /* dinp aliases dout */
        be->gelu_backward(alias[r], x, alias[r], n);
    }
    EXPECT_CLOSE("gelu_forward out", out[0], ref, n, TOL);
    EXPECT_CLOSE("gelu_backward dinp (overwrite)", dinp[0], rd, n, TOL);
    EXPECT_CLOSE("gelu_backward dinp aliasing dout", alias[0], rd, n, TOL);
    EXPECT_SAME("gelu_forward out", out[0], out[1], n * sizeof(float));
    EXPECT_SAME("gelu_backward dinp", dinp[0], dinp[1], n * sizeof(float));
    for (int r = 0; r < runs(); r++) free(out[r]), free(dinp[r]), free(alias[r]);
    free(x), free(dout), free(ref), free(rd);
}

static void test_gelu(void) {
    gelu_case(1, 1);
    gelu_case(1031, 5);
    gelu_case(65536 + 7, 5);
}

/* ---- residual, accumulate ---- bound TOL (one float add: exact up to rounding) */

static void elementwise_case(size_t n) {
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *a = check_rand(n, 1, 51), *b = check_rand(n, 1, 52), *dst0 = check_rand(n, 1, 53);
    double *sum = dnew(n), *acc = dnew(n);
    for (size_t i = 0; i < n; i++) {
        sum[i] = (double)a[i] + b[i];
        acc[i] = (double)dst0[i] + b[i];
    }
    float *out[2], *oa[2], *ob[2], *dst[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = check_rand(n, 100, 54); /* overwritten */
        be->residual_forward(out[r], a, b, n);
        oa[r] = fcopy(a, n); /* out aliases a */
        be->residual_forward(oa[r], oa[r], b, n);
        ob[r] = fcopy(b, n); /* out aliases b */
        be->residual_forward(ob[r], a, ob[r], n);
        dst[r] = fcopy(dst0, n);
        be->accumulate(dst[r], b, n);
    }
    EXPECT_CLOSE("residual_forward out", out[0], sum, n, TOL);
    EXPECT_CLOSE("residual_forward out aliasing a", oa[0], sum, n, TOL);
    EXPECT_CLOSE("residual_forward out aliasing b", ob[0], sum, n, TOL);
    EXPECT_CLOSE("accumulate dst (old + src)", dst[0], acc, n, TOL);
    EXPECT_SAME("residual_forward out", out[0], out[1], n * sizeof(float));
    EXPECT_SAME("accumulate dst", dst[0], dst[1], n * sizeof(float));
    for (int r = 0; r < runs(); r++) free(out[r]), free(oa[r]), free(ob[r]), free(dst[r]);
    free(a), free(b), free(dst0), free(sum), free(acc);
}

static void test_residual_accumulate(void) {
    elementwise_case(1);
    elementwise_case(1031);
    elementwise_case(65536 + 7);
}

/* ---- crossentropy ---- bound TOL on losses and gradient; padded columns exactly 0;
 * dloss = 0 leaves the logits bit for bit */

/* Logits scaled by `scale` and shifted by `shift` (a large shift overflows
 * expf unless the maximum is subtracted); padded columns hold large garbage
 * that must neither count nor survive in the gradient. */
static void crossentropy_case(int N, int V, int Vp, float scale, float shift, float dloss) {
    snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d scale=%g shift=%g dloss=%g", N, V, Vp, scale,
             shift, dloss);
    size_t NV = (size_t)N * Vp;
    float *logits = check_rand(NV, scale, 61), *pad = check_rand(NV, 10, 62);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < Vp; i++) {
            float *z = logits + (size_t)n * Vp + i;
            *z = i < V ? *z + shift : 50.0f + pad[(size_t)n * Vp + i];
        }
    int *targets = tokens_new(N, V, 63);

    double *rloss = dnew(N), *rgrad = dnew(NV);
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vp;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, z[i]);
        for (int i = 0; i < V; i++) sum += exp(z[i] - mx);
        double lse = mx + log(sum);
        rloss[n] = lse - z[targets[n]];
        for (int i = 0; i < V; i++)
            rgrad[(size_t)n * Vp + i] = dloss * (exp(z[i] - lse) - (i == targets[n]));
    }

    float *loss[2], *grad[2], *loss0[2], *kept[2];
    for (int r = 0; r < runs(); r++) {
        loss[r] = check_rand(N, 100, 64); /* overwritten */
        grad[r] = fcopy(logits, NV);
        be->crossentropy(loss[r], grad[r], targets, N, V, Vp, dloss);
        loss0[r] = check_rand(N, 100, 65);
        kept[r] = fcopy(logits, NV);
        be->crossentropy(loss0[r], kept[r], targets, N, V, Vp, 0.0f);
    }
    EXPECT_CLOSE("crossentropy losses", loss[0], rloss, N, TOL);
    EXPECT_CLOSE("crossentropy gradient in place", grad[0], rgrad, NV, TOL);
    size_t nonzero_pad = 0;
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) nonzero_pad += grad[0][(size_t)n * Vp + i] != 0.0f;
    CHECK(nonzero_pad == 0, "crossentropy [%s]: %zu padded gradient columns not zeroed", shape,
          nonzero_pad);
    EXPECT_CLOSE("crossentropy losses with dloss=0", loss0[0], rloss, N, TOL);
    CHECK(memcmp(kept[0], logits, NV * sizeof(float)) == 0,
          "crossentropy [%s]: dloss=0 changed the logits", shape);
    EXPECT_SAME("crossentropy losses", loss[0], loss[1], N * sizeof(float));
    EXPECT_SAME("crossentropy gradient", grad[0], grad[1], NV * sizeof(float));
    EXPECT_SAME("crossentropy losses with dloss=0", loss0[0], loss0[1], N * sizeof(float));
    for (int r = 0; r < runs(); r++) free(loss[r]), free(grad[r]), free(loss0[r]), free(kept[r]);
    free(logits), free(pad), free(targets), free(rloss), free(rgrad);
}

static void test_crossentropy(void) {
    crossentropy_case(7, 50, 64, 3, 0, 1.0f / 7);
    crossentropy_case(5, 64, 64, 3, 0, 0.37f);  /* no padding */
    crossentropy_case(9, 130, 192, 4, 200, 1.0f / 9); /* needs max subtraction */
    crossentropy_case(4, 1, 64, 1, 0, 1.0f);   /* one class: loss 0, gradient 0 */
    crossentropy_case(3, 1000, 1024, 2, -30, 0.25f);
}

/* ---- AdamW ---- bound TOL on m, v and the parameter step */

static double rel_err_dd(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

/* first: m and v start at 0 (step 1), else at random moments. */
static void adamw_case(size_t n, loom_adamw_t hp, int first) {
    snprintf(shape, sizeof shape, "n=%zu lr=%g b1=%g b2=%g eps=%g wd=%g gs=%g t=%d%s", n, hp.lr,
             hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_scale, hp.t,
             first ? " (zero moments)" : "");
    float *p0 = check_rand(n, 1, 71), *g = check_rand(n, 2, 72), *m0 = check_rand(n, 0.1f, 73), *v0 = check_rand(n, 0.1f, 74);
    for (size_t i = 0; i < n; i++) {
        if (first) m0[i] = v0[i] = 0;
        v0[i] *= v0[i];
    }
    double *rm = dnew(n), *rv = dnew(n), *rdp = dnew(n), *dp = dnew(n);
    double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * hp.grad_scale;
        rm[i] = b1 * m0[i] + (1 - b1) * gi;
        rv[i] = b2 * v0[i] + (1 - b2) * gi * gi;
        double mhat = rm[i] / (1 - pow(b1, hp.t)), vhat = rv[i] / (1 - pow(b2, hp.t));
        rdp[i] = -lr * (mhat / (sqrt(vhat) + eps) + wd * p0[i]);
    }
    float *p[2], *m[2], *v[2];
    for (int r = 0; r < runs(); r++) {
        p[r] = fcopy(p0, n);
        m[r] = fcopy(m0, n);
        v[r] = fcopy(v0, n);
        be->adamw(p[r], g, m[r], v[r], n, &hp);
    }
    /* The step is compared, not the parameters: it is ~lr of them, and an
     * error in it would hide behind their size. lr is large enough that the
     * float rounding of the new parameters stays ~1e-6 of the step. */
    for (size_t i = 0; i < n; i++) dp[i] = (double)p[0][i] - p0[i];
    double e = rel_err_dd(dp, rdp, n);
    CHECK(e < TOL, "adamw step [%s, %d thread(s)]: normalized error %.3g, bound %.0e", shape,
          nthreads, e, (double)TOL);
    EXPECT_CLOSE("adamw m", m[0], rm, n, TOL);
    EXPECT_CLOSE("adamw v", v[0], rv, n, TOL);
    EXPECT_SAME("adamw params", p[0], p[1], n * sizeof(float));
    EXPECT_SAME("adamw m", m[0], m[1], n * sizeof(float));
    EXPECT_SAME("adamw v", v[0], v[1], n * sizeof(float));
    for (int r = 0; r < runs(); r++) free(p[r]), free(m[r]), free(v[r]);
    free(p0), free(g), free(m0), free(v0), free(rm), free(rv), free(rdp), free(dp);
}

static void test_adamw(void) {
    loom_adamw_t hp = {.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.1f, .grad_scale = 0.5f, .t = 1};
    adamw_case(1031, hp, 1);
    hp.t = 10;
    adamw_case(1031, hp, 0);
    hp.t = 1000, hp.weight_decay = 0, hp.grad_scale = 1, hp.eps = 1e-3f; /* eps matters */
    adamw_case(65536 + 7, hp, 0);
    hp.t = 3, hp.beta1 = 0.8f, hp.beta2 = 0.95f, hp.weight_decay = 0.5f, hp.grad_scale = 0.01f;
    adamw_case(1, hp, 0);
    adamw_case(4097, hp, 0);
}

/* ---- sumsq ---- bound 1e-12 relative (it returns double) */

static void sumsq_case(size_t n) {
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *x = check_rand(n, 3, 81);
    double ref = 0, got[2];
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    for (int r = 0; r < runs(); r++) got[r] = be->sumsq(x, n);
    /* Squares of floats are exact in double; only the summation order
     * differs, ~n * 1e-16 relative. */
    double e = fabs(got[0] - ref) / fmax(ref, 1e-300);
    if (n == 0) CHECK(got[0] == 0.0, "sumsq [%s]: %g for an empty vector", shape, got[0]);
    else CHECK(e < 1e-12, "sumsq [%s, %d thread(s)]: %.17g, reference %.17g, relative error %.3g, bound 1e-12",
               shape, nthreads, got[0], ref, e);
    EXPECT_SAME("sumsq", &got[0], &got[1], sizeof(double));
    free(x);
}

static void test_sumsq(void) {
    sumsq_case(0);
    sumsq_case(1);
    sumsq_case(1031);
    sumsq_case(100003);
}

/* ---- paged attention (grouped-query) ---- bound TOL on out
 * Rows of 3 sequences at various positions, the cache's blocks scattered
 * over the pool; the reference: each query head h attends, in double, to
 * cache head h / (NH / NKV) of its sequence's keys 0..pos. The shapes take
 * each way the CPU splits the work: a cache head's query heads in one task,
 * split in uneven chunks (one row, 3 or 7 query heads a cache head), more
 * than a task's 8 (12), head sizes 64, 40 (the 8-keys-a-time scores, with a
 * last block not a multiple of 8) and 36 (the plain loop). */
static void paged_case(int N, int NH, int NKV, int hs) {
    enum { bs = 16, NB = 8, MB = 4 };
    int C = NH * hs, KC = NKV * hs, QR = C + 2 * KC, G = NH / NKV;
    snprintf(shape, sizeof shape, "N=%d NH=%d NKV=%d hs=%d", N, NH, NKV, hs);
    size_t cols = (size_t)bs * hs, rows = (size_t)NB * 2 * NKV;
    float *cache = check_rand(rows * cols, 1.0f, 31 + (unsigned)(NH * hs)), *qkv = check_rand((size_t)N * QR, 1.0f, 7 + (unsigned)N);
    int tables[3 * MB] = {5, 2, 7, 0, 1, 6, 3, 4, 4, 0, 2, 6}, pos[64], seq[64];
    for (int i = 0; i < N; i++) seq[i] = i % 3, pos[i] = (i * 17 + 5 * seq[i] + 43) % (bs * MB);
    loom_tensor_t kv = {.data = cache, .dtype = LOOM_FP32, .rows = (long long)rows, .cols = (long long)cols};
    double *ref = dnew((size_t)N * C), sc[bs * MB];
    for (int i = 0; i < N; i++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)i * QR + (size_t)h * hs;
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                const float *k = cache + ((size_t)tables[seq[i] * MB + t / bs] * 2 * NKV + h / G) * cols + (size_t)(t % bs) * hs;
                double d = 0;
                for (int e = 0; e < hs; e++) d += (double)q[e] * k[e];
                sc[t] = d / sqrt((double)hs);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = 0; t <= pos[i]; t++) sum += sc[t] = exp(sc[t] - mx);
            for (int t = 0; t <= pos[i]; t++) {
                const float *v = cache + (((size_t)tables[seq[i] * MB + t / bs] * 2 + 1) * NKV + h / G) * cols + (size_t)(t % bs) * hs;
                for (int e = 0; e < hs; e++) ref[(size_t)i * C + (size_t)h * hs + e] += sc[t] / sum * v[e];
            }
        }
    float *out[2];
    for (int r = 0; r < runs(); r++) {
        out[r] = fnew((size_t)N * C);
        be->paged_attention(out[r], qkv, &kv, pos, seq, tables, MB, N, NH, NKV, bs);
        EXPECT_CLOSE("paged_attention out", out[r], ref, (size_t)N * C, TOL);
    }
    EXPECT_SAME("paged_attention out", out[0], out[runs() - 1], (size_t)N * C * sizeof(float));
    for (int r = 0; r < runs(); r++) free(out[r]);
    free(cache), free(qkv), free(ref);
}

static void test_paged_attention(void) {
    paged_case(1, 9, 3, 64);
    paged_case(16, 9, 3, 64);
    paged_case(1, 14, 2, 64);
    paged_case(3, 14, 2, 40);
    paged_case(2, 12, 1, 64);
    paged_case(5, 4, 4, 36);
    paged_case(40, 8, 2, 128);
}

static void run_with_threads(const char *name, void (*fn)(void)) {
    char full[96];
    snprintf(full, sizeof full, "%s (%d thread%s)", name, nthreads, nthreads == 1 ? "" : "s");
    check_run(full, fn);
}
#define RUN_T(fn) run_with_threads(#fn, fn)

int main(void) {
    static const int thread_counts[] = {1, 2};
    for (int i = 0; i < 2; i++) {
        nthreads = thread_counts[i];
        if (loom_backend_cpu_init(&be, nthreads) != LOOM_OK) {
            printf("FAIL cpu backend init (%d threads): %s\n", nthreads, loom_errmsg());
            return 1;
        }
        RUN_T(test_encoder);
        RUN_T(test_layernorm);
        RUN_T(test_matmul);
        RUN_T(test_attention);
        RUN_T(test_paged_attention);
        RUN_T(test_gelu);
        RUN_T(test_residual_accumulate);
        RUN_T(test_crossentropy);
        RUN_T(test_adamw);
        RUN_T(test_sumsq);
    }
    return check_main_end();
}
