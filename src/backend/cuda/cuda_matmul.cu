/* cuda_matmul: the linear layers through cuBLASLt.
 *
 * Precision. With 16-bit activations (bf16/fp16, the default at those
 * dtypes) the GEMMs read and write 16-bit activations (A, B, D of type
 * g_cuda.act) with CUBLAS_COMPUTE_32F (fp32 accumulation); the fp32 master
 * weight of each call (and its bias) is rounded into scratch first (the
 * masters stay fp32, and AdamW updates them), and the weight gradient is
 * written in fp32 (16-bit A and B, fp32 C/D: dw accumulates into the fp32
 * gradients). With fp32 activations the tensors stay fp32 and the compute
 * type decides what the tensor cores do: fp32 -> CUBLAS_COMPUTE_32F (no
 * tensor cores), tf32 -> 32F_FAST_TF32, bf16 -> 32F_FAST_16BF, fp16 ->
 * 32F_FAST_16F (LOOM_CUDA_ACTIVATIONS=fp32 at bf16/fp16).
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
    int type_a, type_b, type_d; /* cudaDataType_t of A, B and C = D */
    int align_a, align_b, align_d, ld_aux;
    int align_bias, align_aux; /* 0 when absent: an algorithm picked for aligned epilogue pointers may need them */
} lt_key;

/* The descriptors of one problem: made once and kept with its algorithm
 * (a decode step makes ~50 GEMM calls; creating and destroying four
 * descriptors per call was host time on every token). Only the epilogue's
 * bias and aux pointers change between calls of one key: they are set on
 * the kept descriptor before each call. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
} lt_desc;

typedef struct {
    int used, found, has_desc;
    lt_key key;
    cublasLtMatmulAlgo_t algo;
    lt_desc desc;
} lt_entry;

#define LT_CACHE 512
static lt_entry g_cache[LT_CACHE];

static void desc_free(lt_desc *d) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(d->op));
}

void cuda_matmul_reset(void) {
    for (int i = 0; i < LT_CACHE; i++)
        if (g_cache[i].has_desc) desc_free(&g_cache[i].desc);
    memset(g_cache, 0, sizeof g_cache);
}

/* 16-bit inputs accumulate in fp32 (COMPUTE_32F); fp32 inputs use the
 * dtype's fast mode, where cuBLASLt rounds them inside the GEMM. */
static cublasComputeType_t compute_type(cudaDataType_t in) {
    if (in != CUDA_R_32F) return CUBLAS_COMPUTE_32F;
    switch (g_cuda.dtype) {
    case LOOM_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case LOOM_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case LOOM_FP16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F;
    }
}

/* Largest power of two (<= 16) dividing the address (2 is possible for
 * 16-bit activations). */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int r = 16;
    while (r > 1 && (a % (uintptr_t)r) != 0) r /= 2;
    return r;
}

static uint64_t key_hash(const lt_key *k) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *b = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* The cache slot of `key`: its own, or a free one (NULL when the 16 probed
 * slots are all taken by other keys: then nothing is kept). */
static lt_entry *lt_slot(const lt_key *key) {
    uint64_t h = key_hash(key);
    for (int probe = 0; probe < 16; probe++) {
        lt_entry *e = &g_cache[(h + probe) % LT_CACHE];
        if (!e->used || memcmp(&e->key, key, sizeof *key) == 0) return e;
    }
    return nullptr;
}

/* The algorithm for `key` (described by op and the layouts): from its
 * slot, else asked of the heuristic once and kept there. False when
 * cuBLASLt has none. */
static bool lt_algo(lt_entry *slot, const lt_key *key, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, cublasLtMatmulAlgo_t *algo) {
    bool found;
    if (slot && slot->used) {
        found = slot->found;
        *algo = slot->algo;
    } else {
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

/* One GEMM: column-major D (m, n) = op(A) op(B) (+ D when accumulate),
 * elements of A, B and D (= C) of types ta, tb, td, with epilogue `epi`
 * using `bias` (BIAS, GELU_AUX_BIAS: read, of type td; BGRADB: written, of
 * type td) and `aux` (GELU_AUX*: written; DGELU: read; type td, leading
 * dimension ld_aux). */
typedef struct {
    void *d;
    const void *a, *b;
    cudaDataType_t ta, tb, td;
    int m, n, k, lda, ldb, ldd;
    bool transa, transb, accumulate;
    cublasLtEpilogue_t epi;
    const void *bias;
    void *aux;
    int ld_aux;
} gemm_t;

static void gemm_key(const gemm_t *g, cublasComputeType_t ct, lt_key *key) {
    memset(key, 0, sizeof *key);
    key->transa = g->transa, key->transb = g->transb, key->m = g->m, key->n = g->n, key->k = g->k;
    key->lda = g->lda, key->ldb = g->ldb, key->ldd = g->ldd, key->epilogue = (int)g->epi;
    key->accumulate = g->accumulate, key->compute = (int)ct;
    key->type_a = (int)g->ta, key->type_b = (int)g->tb, key->type_d = (int)g->td;
    key->align_a = ptr_align(g->a), key->align_b = ptr_align(g->b), key->align_d = ptr_align(g->d);
    key->ld_aux = g->ld_aux;
    key->align_bias = g->bias ? ptr_align(g->bias) : 0;
    key->align_aux = g->aux ? ptr_align(g->aux) : 0;
}

/* The descriptors of g's problem (everything in its key; not the
 * epilogue's pointers, which lt_matmul sets per call). */
static lt_desc gemm_desc(const gemm_t *g, cublasComputeType_t ct) {
    lt_desc d;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, ct, CUDA_R_32F));
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi, sizeof g->epi));
    if (g->aux) {
        int64_t ld = g->ld_aux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    /* Stored shapes: op(A) is (m, k), op(B) is (k, n). */
    int m = g->m, n = g->n, k = g->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.la, g->ta, g->transa ? k : m, g->transa ? m : k, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.lb, g->tb, g->transb ? n : k, g->transb ? k : n, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.ld, g->td, m, n, g->ldd));
    return d;
}

/* Runs g. Returns false when cuBLASLt has no algorithm for it (the caller
 * falls back); panics on any other failure. */
static bool lt_matmul(const gemm_t *g) {
    if (g->m == 0 || g->n == 0) return true;
    cublasComputeType_t ct = compute_type(g->ta);
    lt_key key;
    gemm_key(g, ct, &key);
    lt_entry *slot = lt_slot(&key);
    lt_desc d;
    if (slot && slot->used && slot->has_desc) {
        d = slot->desc;
    } else {
        d = gemm_desc(g, ct);
    }
    /* the key says whether there is a bias and an aux (by their alignment),
     * not where they are: set per call */
    if (g->bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    if (g->aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                    sizeof g->aux));
    cublasLtMatmulAlgo_t algo;
    bool found = lt_algo(slot, &key, d.op, d.la, d.lb, d.ld, &algo);
    if (found) {
        const float alpha = 1.f, beta = g->accumulate ? 1.f : 0.f;
        CUBLAS_CHECK(cublasLtMatmul(g_cuda.lt, d.op, &alpha, g->a, d.la, g->b, d.lb, &beta, g->d, d.ld, g->d, d.ld,
                                    &algo, g_cuda.workspace, g_cuda.workspace_bytes, g_cuda.stream));
    }
    if (slot && !slot->has_desc) { /* lt_algo has claimed the slot for this key: keep them there */
        slot->desc = d;
        slot->has_desc = 1;
    } else if (!slot) {
        desc_free(&d);
    }
    return found;
}

static void no_algorithm(const char *what, int N, int C, int OC) {
    loom_panic(__FILE__, __LINE__,
               "cuBLASLt has no algorithm for %s (N=%d C=%d OC=%d, dtype %s, activations %s) even without an "
               "epilogue",
               what, N, C, OC, loom_dtype_name(g_cuda.dtype), loom_dtype_name(g_cuda.act));
}

/* The cudaDataType_t of ACT tensors. */
static cudaDataType_t act_type(void) {
    return g_cuda.act == LOOM_BF16 ? CUDA_R_16BF : g_cuda.act == LOOM_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The weight w (n fp32) and bias (nb fp32, may be NULL) as the GEMM reads
 * them: themselves with fp32 activations, else rounded to the activation
 * type in scratch (one buffer: the bias after the weight, 256-byte
 * aligned). */
static const void *weight_in(const float *w, size_t n, const float *bias, size_t nb, const void **bias_out) {
    *bias_out = bias;
    if (!cuda_act16()) return w;
    size_t wbytes = (n * 2 + 255) / 256 * 256;
    char *s = (char *)cuda_scratch(SCRATCH_WLP, wbytes + nb * 2 + 256);
    cuda_act_from_f32(s, w, n);
    if (bias) {
        cuda_act_from_f32(s + wbytes, bias, nb);
        *bias_out = s + wbytes;
    }
    return s;
}

/* Row-major out (N, OC) = inp (N, C) @ w (OC, C)^T: column-major
 * out^T (OC, N) = w (OC, C) inp^T (C, N); w is stored column-major as
 * (C, OC) ld C, so op(A) transposes it; inp is stored (C, N) ld C. With
 * `pre`, GELU is applied in the epilogue and the pre-activation kept in
 * pre (aux, ld OC). Returns false when cuBLASLt cannot run the epilogue. */
static bool forward_gemm(float *out, float *pre, const float *inp, const float *w, const float *bias, int N, int C,
                         int OC, bool with_epilogue) {
    const void *b16;
    const void *wa = weight_in(w, (size_t)OC * C, with_epilogue ? bias : nullptr, (size_t)OC, &b16);
    cudaDataType_t t = act_type();
    cublasLtEpilogue_t epi = !with_epilogue ? CUBLASLT_EPILOGUE_DEFAULT
                             : pre          ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                             : bias         ? CUBLASLT_EPILOGUE_BIAS
                                            : CUBLASLT_EPILOGUE_DEFAULT;
    gemm_t g = {out, wa, inp, t, t, t, OC, N, C, C, C, OC, true, false, false, epi, with_epilogue ? b16 : nullptr,
                pre, pre ? OC : 0};
    return lt_matmul(&g);
}

void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                         int C, int OC) {
    if (forward_gemm(out, nullptr, inp, w, bias, N, C, OC, true)) return;
    if (!bias || !forward_gemm(out, nullptr, inp, w, bias, N, C, OC, false)) no_algorithm("matmul_forward", N, C, OC);
    cuda_bias_add(out, bias, N, OC);
}

/* As matmul_forward, with GELU applied in the epilogue and the
 * pre-activation written to `pre` (the epilogue's aux output). */
void cuda_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w,
                              const float *bias, int N, int C, int OC) {
    /* cuBLASLt wants the aux leading dimension a multiple of 8. */
    if (OC % 8 == 0 && forward_gemm(out, pre, inp, w, bias, N, C, OC, true)) return;
    cuda_matmul_forward(pre, inp, w, bias, N, C, OC);
    cuda_gelu_forward(out, pre, (size_t)N * OC);
}

/* dinp (N, C) (+)= dout (N, OC) @ w (OC, C): column-major dinp^T (C, N) =
 * w^T (C, OC) dout^T (OC, N); w stored (C, OC) ld C, dout stored (OC, N)
 * ld OC, neither transposed. With `pre` (aux, ld C) the DGELU epilogue
 * multiplies by gelu'(pre) and dinp is overwritten. */
static bool dinp_gemm(float *dinp, const float *dout, const void *w, const float *pre, int N, int C, int OC,
                      bool accumulate) {
    cudaDataType_t t = act_type();
    gemm_t g = {dinp, w, dout, t, t, t, C, N, OC, C, OC, C, false, false, accumulate,
                pre ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr, (void *)pre, pre ? C : 0};
    return lt_matmul(&g);
}

/* dpre (N, C) = gelu'(pre) * (dout @ w), overwritten: the dinp GEMM of
 * matmul_backward with the DGELU epilogue reading pre as aux. */
void cuda_matmul_backward_gelu(float *dpre, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *pre, const float *w, int N, int C,
                               int OC) {
    cuda_matmul_backward(nullptr, dw, dbias, dout, inp, w, N, C, OC);
    const void *unused;
    const void *wa = weight_in(w, (size_t)OC * C, nullptr, 0, &unused);
    if (C % 8 == 0 && dinp_gemm(dpre, dout, wa, pre, N, C, OC, false)) return;
    if (!dinp_gemm(dpre, dout, wa, nullptr, N, C, OC, false)) no_algorithm("matmul_backward_gelu (dpre)", N, C, OC);
    cuda_gelu_backward(dpre, pre, dpre, (size_t)N * C);
}

/* dw (OC, C) += dout^T @ inp: column-major dw^T (C, OC) = inp^T (C, N)
 * dout (N, OC); inp stored (C, N) ld C, dout stored (OC, N) ld OC and
 * transposed; dw is fp32 whatever the activations. With `bgrad`, the
 * BGRADB epilogue sums op(B) = dout over k = N into it (fp32, overwritten). */
static bool dw_gemm(float *dw, float *bgrad, const float *dout, const float *inp, int N, int C, int OC) {
    cudaDataType_t t = act_type();
    gemm_t g = {dw, inp, dout, t, t, CUDA_R_32F, C, OC, N, C, OC, C, false, true, true,
                bgrad ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT, bgrad, nullptr, 0};
    return lt_matmul(&g);
}

void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC) {
    if (dinp) {
        const void *unused;
        const void *wa = weight_in(w, (size_t)OC * C, nullptr, 0, &unused);
        if (!dinp_gemm(dinp, dout, wa, nullptr, N, C, OC, true)) no_algorithm("matmul_backward (dinp)", N, C, OC);
    }
    /* The bias gradient from the dw GEMM's epilogue into scratch, then added. */
    if (dbias) {
        float *tmp = (float *)cuda_scratch(SCRATCH_BIAS, (size_t)OC * sizeof(float));
        if (dw_gemm(dw, tmp, dout, inp, N, C, OC)) {
            cuda_accumulate(dbias, tmp, (size_t)OC);
            return;
        }
    }
    if (!dw_gemm(dw, nullptr, dout, inp, N, C, OC)) no_algorithm("matmul_backward (dw)", N, C, OC);
    if (dbias) cuda_bias_grad(dbias, dout, N, OC);
}
