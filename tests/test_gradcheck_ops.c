/* Finite-difference gradient checks of the CPU backend's backward ops,
 * using nothing but the backend's own float forward ops.
 *
 * For each op, L(x) = sum_i r_i * op(x)_i with a fixed random r, summed in
 * double from the op's float outputs (crossentropy: L = mean of the losses).
 * The backward op, fed dout = r, must match the central difference
 * (L(x + h e_j) - L(x - h e_j)) / (x_j+ - x_j-) for every input element j,
 * h = 1e-3, divided by the step actually taken in float.
 *
 * Bound: ||g_backward - g_fd|| / ||g_fd|| < 1e-2 for each gradient tensor.
 * Noise in g_fd: the M float outputs carry ~6e-8 relative rounding, so L is
 * off by ~sqrt(M) * 6e-8 and g_fd by that over 2h, ~1e-4 of a unit gradient
 * for M ~ 100; the truncation error h^2 f'''/6 is ~1e-7. A wrong term, sign
 * or factor gives errors of 1e-1 and more. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

#define FD_STEP 1e-3f
#define GRAD_TOL 1e-2

static const loom_backend_t *be;

static float *fnew(size_t n) { return loom_calloc(n ? n : 1, sizeof(float)); }
static double *dnew(size_t n) { return loom_calloc(n ? n : 1, sizeof(double)); }

/* sum r * y in double */
static double dot_loss(const float *r, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    return s;
}

/* Central differences of loss(ctx) with respect to every element of x (n),
 * which loss reads through ctx. */
static void fd_grad(double (*loss)(void *), void *ctx, float *x, size_t n, double *g) {
    for (size_t j = 0; j < n; j++) {
        float x0 = x[j], xp = x0 + FD_STEP, xm = x0 - FD_STEP;
        x[j] = xp;
        double lp = loss(ctx);
        x[j] = xm;
        double lm = loss(ctx);
        x[j] = x0;
        g[j] = (lp - lm) / ((double)xp - (double)xm);
    }
}

#define EXPECT_GRAD(what, got, fd, n, shape)                                                  \
    do {                                                                                      \
        double e_ = check_rel_err_d((got), (fd), (n));                                        \
        CHECK(e_ < GRAD_TOL, "%s [%s]: backward vs finite differences, normalized error %.3g, " \
              "bound %.0e", (what), (shape), e_, (double)GRAD_TOL);                                   \
    } while (0)

/* ---- layernorm ---- */

typedef struct {
    int N, C;
    float *x, *w, *b, *r, *out, *mean, *rstd;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    be->layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C);
    return dot_loss(c->r, c->out, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
    const int N = 4, C = 9;
    size_t NC = (size_t)N * C;
    ln_ctx c = {N, C, check_rand(NC, 1, 1), check_rand(C, 1, 2), check_rand(C, 1, 3), check_rand(NC, 1, 4), fnew(NC),
                fnew(N), fnew(N)};
    for (size_t i = 0; i < NC; i++) c.x[i] += 0.3f;
    float *dx = fnew(NC), *dw = fnew(C), *db = fnew(C);
    ln_loss(&c);
    be->layernorm_backward(dx, dw, db, c.r, c.x, c.w, c.mean, c.rstd, N, C);
    double *gx = dnew(NC), *gw = dnew(C), *gb = dnew(C);
    fd_grad(ln_loss, &c, c.x, NC, gx);
    fd_grad(ln_loss, &c, c.w, C, gw);
    fd_grad(ln_loss, &c, c.b, C, gb);
    EXPECT_GRAD("layernorm dinp", dx, gx, NC, "N=4 C=9");
    EXPECT_GRAD("layernorm dw", dw, gw, C, "N=4 C=9");
    EXPECT_GRAD("layernorm db", db, gb, C, "N=4 C=9");
    free(c.x), free(c.w), free(c.b), free(c.r), free(c.out), free(c.mean), free(c.rstd);
    free(dx), free(dw), free(db), free(gx), free(gw), free(gb);
}

/* ---- matmul ---- */

typedef struct {
    int N, C, OC;
    float *x, *w, *bias, *r, *out;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    be->matmul_forward(c->out, c->x, c->w, c->bias, c->N, c->C, c->OC);
    return dot_loss(c->r, c->out, (size_t)c->N * c->OC);
}

static void test_matmul(void) {
    const int N = 5, C = 7, OC = 6;
    size_t NC = (size_t)N * C, WC = (size_t)OC * C, NO = (size_t)N * OC;
    mm_ctx c = {N, C, OC, check_rand(NC, 1, 11), check_rand(WC, 1, 12), check_rand(OC, 1, 13), check_rand(NO, 1, 14),
                fnew(NO)};
    float *dx = fnew(NC), *dw = fnew(WC), *db = fnew(OC);
    be->matmul_backward(dx, dw, db, c.r, c.x, c.w, N, C, OC);
    double *gx = dnew(NC), *gw = dnew(WC), *gb = dnew(OC);
    fd_grad(mm_loss, &c, c.x, NC, gx);
    fd_grad(mm_loss, &c, c.w, WC, gw);
    fd_grad(mm_loss, &c, c.bias, OC, gb);
    EXPECT_GRAD("matmul dinp", dx, gx, NC, "N=5 C=7 OC=6");
    EXPECT_GRAD("matmul dw", dw, gw, WC, "N=5 C=7 OC=6");
    EXPECT_GRAD("matmul dbias", db, gb, OC, "N=5 C=7 OC=6");
    free(c.x), free(c.w), free(c.bias), free(c.r), free(c.out);
    free(dx), free(dw), free(db), free(gx), free(gw), free(gb);
}

/* ---- attention ---- */

typedef struct {
    int B, T, C, NH, NKV;
    float *qkv, *r, *out, *lse;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    be->attention_forward(c->out, c->lse, c->qkv, c->B, c->T, c->C, c->NH, c->NKV);
    return dot_loss(c->r, c->out, (size_t)c->B * c->T * c->C);
}

/* Multi-head (NKV = NH), grouped-query and multi-query: qkv rows are NH
 * query heads, then NKV key and NKV value heads (QR = C + 2*NKV*hs). */
static void attention_case(int NH, int NKV) {
    const int B = 2, T = 6, hs = 4, C = NH * hs, KC = NKV * hs, QR = C + 2 * KC;
    size_t NC = (size_t)B * T * C, NQ = (size_t)B * T * QR;
    att_ctx c = {B, T, C, NH, NKV, check_rand(NQ, 1.5f, 21), check_rand(NC, 1, 22), fnew(NC), fnew((size_t)B * NH * T)};
    float *dqkv = fnew(NQ);
    att_loss(&c);
    be->attention_backward(dqkv, c.r, c.qkv, c.out, c.lse, B, T, C, NH, NKV);
    double *g = dnew(NQ);
    fd_grad(att_loss, &c, c.qkv, NQ, g);
    /* q, k and v separately, so that a small part cannot hide behind a large one */
    static const char *const names[3] = {"attention dq", "attention dk", "attention dv"};
    const int off[3] = {0, C, C + KC}, width[3] = {C, KC, KC};
    float *gp = fnew(NC);
    double *fp = dnew(NC);
    char shape[64];
    snprintf(shape, sizeof shape, "B=2 T=6 hs=4 NH=%d NKV=%d", NH, NKV);
    for (int part = 0; part < 3; part++) {
        size_t k = 0;
        for (int n = 0; n < B * T; n++)
            for (int i = 0; i < width[part]; i++, k++) {
                gp[k] = dqkv[(size_t)n * QR + off[part] + i];
                fp[k] = g[(size_t)n * QR + off[part] + i];
            }
        EXPECT_GRAD(names[part], gp, fp, k, shape);
    }
    free(c.qkv), free(c.r), free(c.out), free(c.lse), free(dqkv), free(g), free(gp), free(fp);
}

static void test_attention(void) {
    attention_case(3, 3);
    attention_case(4, 2);
    attention_case(4, 1);
}

/* ---- RMSNorm ---- */

typedef struct {
    int N, C;
    float *x, *w, *r, *out, *rstd;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    be->rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, 1e-5f);
    return dot_loss(c->r, c->out, (size_t)c->N * c->C);
}

static void test_rmsnorm(void) {
    const int N = 5, C = 9;
    size_t NC = (size_t)N * C;
    rms_ctx c = {N, C, check_rand(NC, 2, 41), check_rand(C, 1, 42), check_rand(NC, 1, 43), fnew(NC), fnew(N)};
    float *dx = fnew(NC), *dw = fnew(C);
    rms_loss(&c);
    be->rmsnorm_backward(dx, dw, c.r, c.x, c.w, c.rstd, N, C);
    double *gx = dnew(NC), *gw = dnew(C);
    fd_grad(rms_loss, &c, c.x, NC, gx);
    fd_grad(rms_loss, &c, c.w, C, gw);
    EXPECT_GRAD("rmsnorm dinp", dx, gx, NC, "N=5 C=9");
    EXPECT_GRAD("rmsnorm dw", dw, gw, C, "N=5 C=9");
    free(c.x), free(c.w), free(c.r), free(c.out), free(c.rstd), free(dx), free(dw), free(gx), free(gw);
}

/* ---- rotary embedding ---- */

typedef struct {
    int N, NH, NKV, hs;
    const int *pos;
    const float *freq;
    float *x, *r, *y;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->N * (c->NH + 2 * c->NKV) * c->hs;
    memcpy(c->y, c->x, n * sizeof(float));
    be->rope_forward(c->y, c->pos, c->freq, c->N, c->NH, c->NKV, c->hs);
    return dot_loss(c->r, c->y, n);
}

/* Rotation is linear: its backward is the transpose, checked here on q, k
 * and the untouched v together. */
static void test_rope(void) {
    const int N = 4, NH = 4, NKV = 2, hs = 6;
    const int pos[4] = {0, 3, 17, 250};
    const float freq[3] = {1.0f, 0.1f, 0.003f};
    size_t n = (size_t)N * (NH + 2 * NKV) * hs;
    rope_ctx c = {N, NH, NKV, hs, pos, freq, check_rand(n, 1, 51), check_rand(n, 1, 52), fnew(n)};
    float *d = fnew(n);
    memcpy(d, c.r, n * sizeof(float));
    be->rope_backward(d, pos, freq, N, NH, NKV, hs);
    double *g = dnew(n);
    fd_grad(rope_loss, &c, c.x, n, g);
    EXPECT_GRAD("rope dqkv", d, g, n, "N=4 NH=4 NKV=2 hs=6");
    free(c.x), free(c.r), free(c.y), free(d), free(g);
}

/* ---- SwiGLU ---- */

typedef struct {
    int N, H;
    float *x, *r, *out;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    be->swiglu_forward(c->out, c->x, c->N, c->H);
    return dot_loss(c->r, c->out, (size_t)c->N * c->H);
}

static void test_swiglu(void) {
    const int N = 3, H = 11;
    size_t n2 = 2 * (size_t)N * H;
    swiglu_ctx c = {N, H, check_rand(n2, 4, 61), check_rand((size_t)N * H, 1, 62), fnew((size_t)N * H)};
    float *dx = fnew(n2);
    be->swiglu_backward(dx, c.x, c.r, N, H);
    double *g = dnew(n2);
    fd_grad(swiglu_loss, &c, c.x, n2, g);
    EXPECT_GRAD("swiglu dinp", dx, g, n2, "N=3 H=11");
    free(c.x), free(c.r), free(c.out), free(dx), free(g);
}

/* ---- GELU ---- */

typedef struct {
    size_t n;
    float *x, *r, *out;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    be->gelu_forward(c->out, c->x, c->n);
    return dot_loss(c->r, c->out, c->n);
}

static void test_gelu(void) {
    const size_t n = 101;
    gelu_ctx c = {n, check_rand(n, 4, 31), check_rand(n, 1, 32), fnew(n)};
    float *dx = fnew(n);
    be->gelu_backward(dx, c.x, c.r, n);
    double *g = dnew(n);
    fd_grad(gelu_loss, &c, c.x, n, g);
    EXPECT_GRAD("gelu dinp", dx, g, n, "n=101");
    free(c.x), free(c.r), free(c.out), free(dx), free(g);
}

/* ---- encoder ---- */

typedef struct {
    int B, T, C;
    const int *tokens;
    float *wte, *wpe, *r, *out;
} enc_ctx;

static double enc_loss(void *p) {
    enc_ctx *c = p;
    be->encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_loss(c->r, c->out, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void) {
    const int B = 2, T = 5, C = 6, Vp = 64, V = 7;
    size_t N = (size_t)B * T;
    int tokens[10];
    for (size_t i = 0; i < N; i++) tokens[i] = (int)(i * 3 % V); /* repeats */
    enc_ctx c = {B, T, C, tokens, check_rand((size_t)Vp * C, 1, 41), check_rand((size_t)T * C, 1, 42),
                 check_rand(N * C, 1, 43), fnew(N * C)};
    float *dwte = fnew((size_t)Vp * C), *dwpe = fnew((size_t)T * C);
    be->encoder_backward(dwte, dwpe, c.r, tokens, B, T, C);
    double *gte = dnew((size_t)Vp * C), *gpe = dnew((size_t)T * C);
    fd_grad(enc_loss, &c, c.wte, (size_t)Vp * C, gte);
    fd_grad(enc_loss, &c, c.wpe, (size_t)T * C, gpe);
    EXPECT_GRAD("encoder dwte", dwte, gte, (size_t)Vp * C, "B=2 T=5 C=6 V=7 Vp=64");
    EXPECT_GRAD("encoder dwpe", dwpe, gpe, (size_t)T * C, "B=2 T=5 C=6 V=7 Vp=64");
    free(c.wte), free(c.wpe), free(c.r), free(c.out), free(dwte), free(dwpe), free(gte), free(gpe);
}

/* ---- crossentropy ---- */

typedef struct {
    int N, V, Vp;
    float *logits, *losses;
    const int *targets;
} ce_ctx;

/* mean loss; dloss = 0 leaves the logits alone */
static double ce_loss(void *p) {
    ce_ctx *c = p;
    be->crossentropy(c->losses, c->logits, c->targets, c->N, c->V, c->Vp, 0.0f);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return s / c->N;
}

static void test_crossentropy(void) {
    const int N = 4, V = 11, Vp = 64;
    size_t NV = (size_t)N * Vp;
    int targets[4] = {0, 3, 10, 3};
    ce_ctx c = {N, V, Vp, check_rand(NV, 2, 51), fnew(N), targets};
    float *grad = fnew(NV);
    memcpy(grad, c.logits, NV * sizeof(float));
    be->crossentropy(c.losses, grad, targets, N, V, Vp, 1.0f / N);
    /* every column, padded ones included: their gradient is 0 both ways */
    double *g = dnew(NV);
    fd_grad(ce_loss, &c, c.logits, NV, g);
    EXPECT_GRAD("crossentropy dlogits", grad, g, NV, "N=4 V=11 Vp=64, mean loss");
    free(c.logits), free(c.losses), free(grad), free(g);
}

int main(void) {
    if (loom_backend_cpu_init(&be, 1) != LOOM_OK) {
        printf("FAIL cpu backend init: %s\n", loom_errmsg());
        return 1;
    }
    RUN(test_layernorm);
    RUN(test_matmul);
    RUN(test_attention);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_gelu);
    RUN(test_encoder);
    RUN(test_crossentropy);
    return check_main_end();
}
