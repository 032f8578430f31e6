/* cuda_sparselt: 2:4 weights on the sparse tensor cores through NVIDIA's
 * cuSPARSELt. Compiled, not yet run on a GPU.
 *
 * Host-only C++ (the conversions, bias and GELU are the backend's own
 * kernels). Built against cuSPARSELt's header when the Makefile finds it
 * (PyPI nvidia-cusparselt-cu13 in .deps/cusparselt, scripts/deps.sh;
 * LOOM_HAVE_CUSPARSELT); the library itself is opened with dlopen at the
 * first 2:4 weight (libcusparseLt.so.0 on the loader's path, or the file
 * LOOM_CUSPARSELT names), so a machine without it still runs the plugin
 * and the 2:4 weights run dense, saying why.
 *
 * Layout: as every matmul here, row-major out (N,OC) = x (N,C) W (OC,C)^T
 * is column-major out^T (OC,N) = op(A) B with A = W stored (C,OC) ld C and
 * transposed (the 2:4 groups run along C, the reduction dimension, as the
 * sparse tensor cores need), B = x stored (C,N) ld C. cuSPARSELt's 16-bit
 * kernels keep 2:4 (its fp32 ones want 1:2), so it runs only when the
 * backend's dtype is bf16 or fp16, with 16-bit activations and output and
 * fp32 accumulation; N is padded to a multiple of 16 with zero rows so
 * that few plans (one per padded N, 8 kept per weight) serve every batch. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sparse24.h"

#ifndef LOOM_HAVE_CUSPARSELT

cuda_sparselt_w *cuda_sparselt_weight(const float *dense_host, int OC, int C, char *why, size_t why_size) {
    snprintf(why, why_size, "this build has no cuSPARSELt: its header was not found when the plugin was built; "
                            "scripts/deps.sh installs it into .deps/cusparselt");
    return nullptr;
}
void cuda_sparselt_matmul(cuda_sparselt_w *w, float *out, const float *inp, const float *bias, int N, int C, int OC,
                          int gelu) {
    loom_panic(__FILE__, __LINE__, "cuda_sparselt_matmul without cuSPARSELt");
}
void cuda_sparselt_free(cuda_sparselt_w *w) {}

#else
#include <cusparseLt.h>

/* The entry points used, resolved with dlsym (typed by the header). */
#define SPLT_FUNCS(X)                                                                                             \
    X(cusparseLtInit) X(cusparseLtGetErrorString) X(cusparseLtStructuredDescriptorInit)                            \
    X(cusparseLtDenseDescriptorInit) X(cusparseLtMatDescriptorDestroy) X(cusparseLtMatmulDescriptorInit)           \
    X(cusparseLtMatmulAlgSelectionInit) X(cusparseLtMatmulPlanInit) X(cusparseLtMatmulPlanDestroy)                 \
    X(cusparseLtMatmulGetWorkspace) X(cusparseLtSpMMAPruneCheck2) X(cusparseLtSpMMACompressedSize2)                \
    X(cusparseLtSpMMACompress2) X(cusparseLtMatmul)

/* Filled by loom_dl_load in the order of SPLT_FUNCS. */
static struct {
#define SPLT_PTR(f) decltype(&::f) p_##f;
    SPLT_FUNCS(SPLT_PTR)
#undef SPLT_PTR
} L;
/* Optional (absent from older libraries): called when there. */
static decltype(&cusparseLtMatmulAlgSelectionDestroy) alg_destroy;
static int g_state; /* 0 not tried, 1 ready, -1 unavailable (g_why says why) */
static char g_why[300];
static cusparseLtHandle_t g_handle;

/* Opens the library once; false with g_why set when it cannot. */
static bool splt_load(void) {
    if (g_state) return g_state > 0;
    g_state = -1;
#define SPLT_NAME(f) #f,
    static const char *const names[] = {SPLT_FUNCS(SPLT_NAME)};
#undef SPLT_NAME
    static const loom_dl_spec_t spec = {
        .env = "LOOM_CUSPARSELT", .dflt = "libcusparseLt.so.0", .what = "cuSPARSELt",
        .hint = "PyPI nvidia-cusparselt-cu13; put its lib folder on LD_LIBRARY_PATH or name the file in LOOM_CUSPARSELT",
        .too_old = "a cuSPARSELt older than this build's header", .names = names, .n = sizeof names / sizeof *names};
    void *h = loom_dl_load(&spec, (void **)&L, g_why, sizeof g_why);
    if (!h) return false;
    alg_destroy = (decltype(alg_destroy))dlsym(h, "cusparseLtMatmulAlgSelectionDestroy");
    cusparseStatus_t s = L.p_cusparseLtInit(&g_handle);
    if (s != CUSPARSE_STATUS_SUCCESS) {
        snprintf(g_why, sizeof g_why, "cusparseLtInit: %s", L.p_cusparseLtGetErrorString(s));
        return false;
    }
    g_state = 1;
    return true;
}

#define SPLT_PLANS 8

typedef struct {
    int n, used; /* padded rows this plan multiplies */
    cusparseLtMatDescriptor_t b, c;
    cusparseLtMatmulDescriptor_t mm;
    cusparseLtMatmulAlgSelection_t alg;
    cusparseLtMatmulPlan_t plan;
    size_t ws;
} splt_plan;

struct cuda_sparselt_w {
    int OC, C, next;
    bool bf16;
    cusparseLtMatDescriptor_t a; /* W stored (C,OC) ld C, 2:4 along C */
    void *compressed;            /* cuSPARSELt's own compressed form */
    splt_plan plans[SPLT_PLANS];
};

/* Failed cuSPARSELt calls during preparation: the reason, and false. */
static bool splt_ok(cusparseStatus_t s, const char *call, char *why, size_t why_size) {
    if (s == CUSPARSE_STATUS_SUCCESS) return true;
    snprintf(why, why_size, "cuSPARSELt refused it: %s: %s", call, L.p_cusparseLtGetErrorString(s));
    return false;
}
#define SPLT_TRY(call) splt_ok((call), #call, why, why_size)

static void plan_drop(splt_plan *p) {
    if (!p->used) return;
    L.p_cusparseLtMatmulPlanDestroy(&p->plan);
    if (alg_destroy) alg_destroy(&p->alg);
    L.p_cusparseLtMatDescriptorDestroy(&p->b);
    L.p_cusparseLtMatDescriptorDestroy(&p->c);
    p->used = 0;
}

/* A plan for n (padded) rows: made and kept (SPLT_PLANS per weight, the
 * oldest replaced). False with the reason when cuSPARSELt refuses. */
static bool plan_make(cuda_sparselt_w *w, int n, splt_plan **out, char *why, size_t why_size) {
    for (int i = 0; i < SPLT_PLANS; i++)
        if (w->plans[i].used && w->plans[i].n == n) return (*out = &w->plans[i]), true;
    splt_plan *p = &w->plans[w->next++ % SPLT_PLANS];
    plan_drop(p);
    cudaDataType t = w->bf16 ? CUDA_R_16BF : CUDA_R_16F;
    if (!SPLT_TRY(L.p_cusparseLtDenseDescriptorInit(&g_handle, &p->b, w->C, n, w->C, 16, t, CUSPARSE_ORDER_COL)))
        return false;
    if (!SPLT_TRY(L.p_cusparseLtDenseDescriptorInit(&g_handle, &p->c, w->OC, n, w->OC, 16, t, CUSPARSE_ORDER_COL))) {
        L.p_cusparseLtMatDescriptorDestroy(&p->b);
        return false;
    }
    bool ok = SPLT_TRY(L.p_cusparseLtMatmulDescriptorInit(&g_handle, &p->mm, CUSPARSE_OPERATION_TRANSPOSE,
                                                         CUSPARSE_OPERATION_NON_TRANSPOSE, &w->a, &p->b, &p->c,
                                                         &p->c, CUSPARSE_COMPUTE_32F)) &&
              SPLT_TRY(L.p_cusparseLtMatmulAlgSelectionInit(&g_handle, &p->alg, &p->mm, CUSPARSELT_MATMUL_ALG_DEFAULT)) &&
              SPLT_TRY(L.p_cusparseLtMatmulPlanInit(&g_handle, &p->plan, &p->mm, &p->alg)) &&
              SPLT_TRY(L.p_cusparseLtMatmulGetWorkspace(&g_handle, &p->plan, &p->ws));
    if (!ok) {
        L.p_cusparseLtMatDescriptorDestroy(&p->b);
        L.p_cusparseLtMatDescriptorDestroy(&p->c);
        return false;
    }
    p->n = n, p->used = 1;
    *out = p;
    return true;
}

/* The weight in 16 bits on the device, checked 2:4 and compressed. */
static bool compress(cuda_sparselt_w *w, const float *dense_host, char *why, size_t why_size) {
    size_t n = (size_t)w->OC * w->C, csize = 0, cbuf = 0;
    float *f32 = nullptr;
    void *lp = nullptr, *buf = nullptr;
    int *valid = nullptr, bad = 1;
    CUDA_CHECK(cudaMalloc(&f32, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&lp, n * 2));
    CUDA_CHECK(cudaMalloc(&valid, sizeof(int)));
    /* on the backend's stream: a legacy-stream cudaMemcpy from pageable memory
     * may return before the copy lands, and the non-blocking stream does not
     * wait for the legacy one */
    CUDA_CHECK(cudaMemcpyAsync(f32, dense_host, n * sizeof(float), cudaMemcpyHostToDevice, g_cuda.stream));
    cuda_to_lp16(lp, f32, n, w->bf16);
    cusparseOperation_t op = CUSPARSE_OPERATION_TRANSPOSE;
    bool ok = SPLT_TRY(L.p_cusparseLtSpMMAPruneCheck2(&g_handle, &w->a, 1, op, lp, valid, g_cuda.stream));
    if (ok) {
        CUDA_CHECK(cudaMemcpyAsync(&bad, valid, sizeof(int), cudaMemcpyDeviceToHost, g_cuda.stream));
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
        if (bad) snprintf(why, why_size, "cuSPARSELt does not see 2:4 sparsity along C in this weight");
        ok = !bad && SPLT_TRY(L.p_cusparseLtSpMMACompressedSize2(&g_handle, &w->a, &csize, &cbuf));
    }
    if (ok) {
        CUDA_CHECK(cudaMalloc(&w->compressed, csize));
        if (cbuf) CUDA_CHECK(cudaMalloc(&buf, cbuf));
        ok = SPLT_TRY(L.p_cusparseLtSpMMACompress2(&g_handle, &w->a, 1, op, lp, w->compressed, buf, g_cuda.stream));
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream)); /* dense_host may be freed after this returns */
    CUDA_CHECK(cudaFree(f32));
    CUDA_CHECK(cudaFree(lp));
    CUDA_CHECK(cudaFree(valid));
    if (buf) CUDA_CHECK(cudaFree(buf));
    return ok;
}

cuda_sparselt_w *cuda_sparselt_weight(const float *dense_host, int OC, int C, char *why, size_t why_size) {
    if (g_cuda.dtype != LOOM_BF16 && g_cuda.dtype != LOOM_FP16) {
        snprintf(why, why_size, "the run's dtype is %s: cuSPARSELt's fp32/tf32 kernels need 1:2 sparsity, not 2:4; "
                 "--dtype bf16 or fp16 uses the sparse tensor cores", loom_dtype_name(g_cuda.dtype));
        return nullptr;
    }
    if (!splt_load()) {
        snprintf(why, why_size, "%s", g_why);
        return nullptr;
    }
    cuda_sparselt_w *w = (cuda_sparselt_w *)loom_calloc(1, sizeof *w);
    w->OC = OC, w->C = C, w->bf16 = g_cuda.dtype == LOOM_BF16;
    splt_plan *p;
    if (!SPLT_TRY(L.p_cusparseLtStructuredDescriptorInit(&g_handle, &w->a, C, OC, C, 16,
                                                        w->bf16 ? CUDA_R_16BF : CUDA_R_16F, CUSPARSE_ORDER_COL,
                                                        CUSPARSELT_SPARSITY_50_PERCENT))) {
        free(w);
        return nullptr;
    }
    /* compress, and make the smallest plan now so that a shape cuSPARSELt
     * refuses is found here (the dense way takes it) and not mid-run */
    if (!compress(w, dense_host, why, why_size) || !plan_make(w, 16, &p, why, why_size)) {
        cuda_sparselt_free(w);
        return nullptr;
    }
    return w;
}

/* Bytes rounded up to 256, so that each part of the scratch stays aligned. */
static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

void cuda_sparselt_matmul(cuda_sparselt_w *w, float *out, const float *inp, const float *bias, int N, int C, int OC,
                          int gelu) {
    int np = (N + 15) / 16 * 16;
    char why[300];
    splt_plan *p;
    if (!plan_make(w, np, &p, why, sizeof why))
        loom_panic(__FILE__, __LINE__, "matmul_forward_s24 (N=%d C=%d OC=%d): %s", N, C, OC, why);
    /* scratch: x (np,C) 16-bit | y (np,OC) 16-bit | cuSPARSELt's workspace */
    size_t bx = round256((size_t)np * C * 2), by = round256((size_t)np * OC * 2);
    char *s = (char *)cuda_scratch(SCRATCH_QUANT, bx + by + p->ws);
    /* 16-bit activations are the run's dtype (act == dtype at bf16/fp16),
     * so they are copied as they are; fp32 ones are rounded */
    if (cuda_act16())
        CUDA_CHECK(cudaMemcpyAsync(s, inp, (size_t)N * C * 2, cudaMemcpyDeviceToDevice, g_cuda.stream));
    else
        cuda_to_lp16(s, inp, (size_t)N * C, w->bf16);
    if (np > N) CUDA_CHECK(cudaMemsetAsync(s + (size_t)N * C * 2, 0, (size_t)(np - N) * C * 2, g_cuda.stream));
    const float alpha = 1.f, beta = 0.f;
    cudaStream_t st = g_cuda.stream;
    cusparseStatus_t e = L.p_cusparseLtMatmul(&g_handle, &p->plan, &alpha, w->compressed, s, &beta, s + bx, s + bx,
                                            p->ws ? s + bx + by : nullptr, &st, 1);
    if (e != CUSPARSE_STATUS_SUCCESS)
        cuda_check_failed(__FILE__, __LINE__, "cusparseLtMatmul", L.p_cusparseLtGetErrorString(e));
    if (cuda_act16()) /* the first N rows */
        CUDA_CHECK(cudaMemcpyAsync(out, s + bx, (size_t)N * OC * 2, cudaMemcpyDeviceToDevice, g_cuda.stream));
    else
        cuda_from_lp16(out, s + bx, (size_t)N * OC, w->bf16);
    if (bias) cuda_bias_add(out, bias, N, OC);
    if (gelu) cuda_gelu_forward(out, out, (size_t)N * OC);
}

void cuda_sparselt_free(cuda_sparselt_w *w) {
    if (!w) return;
    for (int i = 0; i < SPLT_PLANS; i++) plan_drop(&w->plans[i]);
    L.p_cusparseLtMatDescriptorDestroy(&w->a);
    if (w->compressed) CUDA_CHECK(cudaFree(w->compressed));
    free(w);
}

#endif
