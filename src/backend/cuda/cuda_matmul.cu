/* cuda_matmul: the linear layers through cuBLASLt.
 *
 * Precision: tensors stay float32 in memory (the op table's seam); the
 * compute type decides what the tensor cores do with them: fp32 ->
 * CUBLAS_COMPUTE_32F (no tensor cores), tf32 -> 32F_FAST_TF32, bf16 ->
 * 32F_FAST_16BF, fp16 -> 32F_FAST_16F. With the fast types cuBLASLt rounds
 * the fp32 inputs to the 16/19-bit format inside the kernel and accumulates
 * in fp32, so weights and optimizer state stay fp32 masters.
 *
 * Layout: cuBLASLt is column-major; a row-major (R, K) matrix is the same
 * memory as a column-major (K, R) one, so every row-major product here is
 * written as its transpose (see the comment at each call).
 *
 * Algorithms: for each distinct problem (shape, transposes, epilogue,
 * compute type, pointer alignment) the heuristic is asked once and its
 * first answer cached (the key holds the alignment of every pointer, the
 * epilogue's bias and aux ones too); an epilogue it cannot serve falls back to a plain
 * GEMM plus an own kernel. */
#include <string.h>

#include "cuda_internal.h"

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, epilogue, accumulate, compute;
    int align_a, align_b, align_d, ld_aux;
    int align_bias, align_aux; /* 0 when absent: an algorithm picked for aligned epilogue pointers may need them */
} lt_key;

typedef struct {
    int used, found;
    lt_key key;
    cublasLtMatmulAlgo_t algo;
} lt_entry;

#define LT_CACHE 512
static lt_entry g_cache[LT_CACHE];
static long g_queries, g_hits;

void cuda_matmul_reset(void) { memset(g_cache, 0, sizeof g_cache); }

void cuda_matmul_stats(long *queries, long *hits) {
    *queries = g_queries;
    *hits = g_hits;
}

static cublasComputeType_t compute_type(void) {
    switch (g_cuda.dtype) {
    case LOOM_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case LOOM_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case LOOM_FP16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F;
    }
}

/* Largest power of two (<= 16) dividing the address. */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int r = 16;
    while (r > 4 && (a % (uintptr_t)r) != 0) r /= 2;
    return r;
}

static uint64_t key_hash(const lt_key *k) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *b = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* The algorithm for `key` (described by op and the layouts): from the
 * cache, else asked of the heuristic once and cached. False when cuBLASLt
 * has none. */
static bool lt_algo(const lt_key *key, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                    cublasLtMatmulAlgo_t *algo) {
    lt_entry *slot = nullptr;
    uint64_t h = key_hash(key);
    for (int probe = 0; probe < 16; probe++) {
        lt_entry *e = &g_cache[(h + probe) % LT_CACHE];
        if (!e->used) {
            slot = e;
            break;
        }
        if (memcmp(&e->key, key, sizeof *key) == 0) {
            slot = e;
            break;
        }
    }
    bool found;
    if (slot && slot->used) {
        g_hits++;
        found = slot->found;
        *algo = slot->algo;
    } else {
        g_queries++;
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = g_cuda.workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        uint32_t al[3] = {(uint32_t)key->align_a, (uint32_t)key->align_b, (uint32_t)key->align_d};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        cublasStatus_t s =
            cublasLtMatmulAlgoGetHeuristic(g_cuda.lt, op, la, lb, ld, ld, pref, 1, &res, &nres);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        found = s == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (found) *algo = res.algo;
        if (slot) {
            slot->used = 1;
            slot->key = *key;
            slot->found = found;
            if (found) slot->algo = *algo;
        }
    }
    return found;
}

/* Column-major D (m, n) = op(A) op(B) (+ D when accumulate), fp32 storage,
 * with epilogue `epi` using `bias` (BIAS, GELU_AUX_BIAS: read; BGRADB:
 * written) and `aux` (GELU_AUX*: written; DGELU: read; leading dimension
 * ld_aux).
 * Returns false when cuBLASLt has no algorithm for it (the caller falls
 * back); panics on any other failure. */
static bool lt_matmul(float *d, const float *a, const float *b, int m, int n, int k, int lda,
                      int ldb, int ldd, bool transa, bool transb, bool accumulate,
                      cublasLtEpilogue_t epi, const float *bias, float *aux, int ld_aux) {
    if (m == 0 || n == 0) return true;
    cublasComputeType_t ct = compute_type();
    lt_key key;
    memset(&key, 0, sizeof key);
    key.transa = transa, key.transb = transb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.epilogue = (int)epi;
    key.accumulate = accumulate, key.compute = (int)ct;
    key.align_a = ptr_align(a), key.align_b = ptr_align(b), key.align_d = ptr_align(d);
    key.ld_aux = ld_aux;
    key.align_bias = bias ? ptr_align(bias) : 0;
    key.align_aux = aux ? ptr_align(aux) : 0;

    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F));
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof epi));
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
    if (aux) {
        int64_t ld = ld_aux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld, sizeof ld));
    }
    /* Stored shapes: op(A) is (m, k), op(B) is (k, n). */
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, transa ? k : m, transa ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, transb ? n : k, transb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));

    cublasLtMatmulAlgo_t algo;
    bool found = lt_algo(&key, op, la, lb, ld, &algo);
    if (found) {
        const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
        CUBLAS_CHECK(cublasLtMatmul(g_cuda.lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                                    &algo, g_cuda.workspace, g_cuda.workspace_bytes,
                                    g_cuda.stream));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
    return found;
}

static void no_algorithm(const char *what, int N, int C, int OC) {
    loom_panic(__FILE__, __LINE__,
               "cuBLASLt has no algorithm for %s (N=%d C=%d OC=%d, dtype %s) even without an "
               "epilogue",
               what, N, C, OC, loom_dtype_name(g_cuda.dtype));
}

/* Row-major out (N, OC) = inp (N, C) @ w (OC, C)^T: column-major
 * out^T (OC, N) = w (OC, C) inp^T (C, N); w is stored column-major as
 * (C, OC) ld C, so op(A) transposes it; inp is stored (C, N) ld C. */
void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                         int C, int OC) {
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (lt_matmul(out, w, inp, OC, N, C, C, C, OC, true, false, false, epi, bias, nullptr, 0))
        return;
    if (!bias || !lt_matmul(out, w, inp, OC, N, C, C, C, OC, true, false, false,
                            CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_forward", N, C, OC);
    cuda_bias_add(out, bias, N, OC);
}

/* As matmul_forward, with GELU applied in the epilogue and the
 * pre-activation written to `pre` (the epilogue's aux output). */
void cuda_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w,
                              const float *bias, int N, int C, int OC) {
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    /* cuBLASLt wants the aux leading dimension a multiple of 8. */
    if (OC % 8 == 0 &&
        lt_matmul(out, w, inp, OC, N, C, C, C, OC, true, false, false, epi, bias, pre, OC))
        return;
    cuda_matmul_forward(pre, inp, w, bias, N, C, OC);
    cuda_gelu_forward(out, pre, (size_t)N * OC);
}

/* dpre (N, C) = gelu'(pre) * (dout @ w), overwritten: the dinp GEMM of
 * matmul_backward (see there) with the DGELU epilogue reading pre as aux. */
void cuda_matmul_backward_gelu(float *dpre, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *pre, const float *w, int N, int C,
                               int OC) {
    cuda_matmul_backward(nullptr, dw, dbias, dout, inp, w, N, C, OC);
    if (C % 8 == 0 && lt_matmul(dpre, w, dout, C, N, OC, C, OC, C, false, false, false,
                                CUBLASLT_EPILOGUE_DGELU, nullptr, (float *)pre, C))
        return;
    if (!lt_matmul(dpre, w, dout, C, N, OC, C, OC, C, false, false, false,
                   CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_backward_gelu (dpre)", N, C, OC);
    cuda_gelu_backward(dpre, pre, dpre, (size_t)N * C);
}

void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC) {
    /* dinp (N, C) += dout (N, OC) @ w (OC, C): column-major dinp^T (C, N) =
     * w^T (C, OC) dout^T (OC, N); w stored (C, OC) ld C, dout stored (OC, N)
     * ld OC, neither transposed. */
    if (dinp && !lt_matmul(dinp, w, dout, C, N, OC, C, OC, C, false, false, true,
                           CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_backward (dinp)", N, C, OC);
    /* dw (OC, C) += dout^T @ inp: column-major dw^T (C, OC) = inp^T (C, N)
     * dout (N, OC); inp stored (C, N) ld C, dout stored (OC, N) ld OC and
     * transposed. BGRADB sums op(B) = dout over k = N: the bias gradient,
     * which the epilogue overwrites into scratch; it is then added. */
    if (dbias) {
        float *tmp = (float *)cuda_scratch(SCRATCH_BIAS, (size_t)OC * sizeof(float));
        if (lt_matmul(dw, inp, dout, C, OC, N, C, OC, C, false, true, true,
                      CUBLASLT_EPILOGUE_BGRADB, tmp, nullptr, 0)) {
            cuda_accumulate(dbias, tmp, (size_t)OC);
            return;
        }
    }
    if (!lt_matmul(dw, inp, dout, C, OC, N, C, OC, C, false, true, true,
                   CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_backward (dw)", N, C, OC);
    if (dbias) cuda_bias_grad(dbias, dout, N, OC);
}
