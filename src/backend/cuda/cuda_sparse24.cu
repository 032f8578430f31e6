/* cuda_sparse24: 2:4-sparse weights on the GPU (ops.h VARIANT row
 * matmul_forward_s24), the same contract as the CPU's (cpu_paged.c).
 * Compiled, not yet run on a GPU.
 *
 * Two ways, chosen once per weight at its first use:
 * - cuSPARSELt (NVIDIA's sparse tensor-core GEMM, loaded with dlopen from
 *   libcusparseLt.so.0; compiled in when its header was found at build
 *   time, cuda_sparselt.cpp) at bf16 and fp16: the weight, widened to dense
 *   on the host by loom_tensor_dequantize (the format's one reference),
 *   goes to the run's 16-bit type, cuSPARSELt compresses it to its own
 *   layout once, and each call converts the activations to 16 bits,
 *   multiplies on the sparse tensor cores and widens the result, adding the
 *   bias (and GELU). Its fp32 kernels (tf32) need 1:2 sparsity, which a
 *   2:4 weight does not have in general, so fp32 and tf32 runs take
 *   the dense way.
 * - dense: the same host widening once, kept on the device in fp32, then
 *   the backend's cuBLASLt matmul: correct, as fast as an unpruned model,
 *   and with the fp32 weight bytes; one line on stderr says so and why.
 * A weight is known by its device address; freeing device memory drops
 * the entries inside it (cuda_sparse24_forget), so a new weight at an old
 * address is never mistaken for the old one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sparse24.h"
#include "cuda_paged.h"

#define S24_CACHE 256

typedef struct {
    const void *data; /* the QT tensor's values: the key */
    long long rows, cols;
    float *dense;         /* (rows, cols) fp32, dense way; else NULL */
    cuda_sparselt_w *lt;  /* the cuSPARSELt way; else NULL */
} s24_entry;

static s24_entry g_s24[S24_CACHE];
static int g_said, g_said_lt; /* the one-line messages have been printed */

/* Bytes of the host copies of t's parts (backend.h, LOOM_LAYOUT_SPARSE24). */
static size_t values_bytes(const loom_tensor_t *t) {
    return (size_t)t->rows * (size_t)(t->cols / 2) * loom_dtype_size(t->dtype);
}
static size_t meta_bytes(const loom_tensor_t *t) { return (size_t)t->rows * (size_t)((t->cols + 7) / 8); }
static size_t scales_count(const loom_tensor_t *t) {
    if (!t->scales) return 0;
    return t->block ? (size_t)t->rows * (size_t)(t->cols / t->block) : (size_t)t->rows;
}

/* dense (rows, cols) fp32 on the host: w's parts downloaded, then
 * loom_tensor_dequantize, the format's reference. */
static float *widen_on_host(const loom_tensor_t *w) {
    if (cuda_capturing())
        loom_panic(__FILE__, __LINE__, "matmul_forward_s24 met a new 2:4 weight during CUDA graph capture; run one "
                                       "plain step first");
    loom_tensor_t h = *w;
    size_t nv = values_bytes(w), nm = meta_bytes(w), ns = scales_count(w);
    void *values = loom_malloc(nv ? nv : 1);
    unsigned char *meta = (unsigned char *)loom_malloc(nm ? nm : 1);
    float *scales = ns ? (float *)loom_malloc(ns * sizeof(float)) : nullptr;
    CUDA_CHECK(cudaMemcpyAsync(values, w->data, nv, cudaMemcpyDeviceToHost, g_cuda.stream));
    CUDA_CHECK(cudaMemcpyAsync(meta, w->meta, nm, cudaMemcpyDeviceToHost, g_cuda.stream));
    if (ns) CUDA_CHECK(cudaMemcpyAsync(scales, w->scales, ns * sizeof(float), cudaMemcpyDeviceToHost, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    h.data = values, h.meta = meta, h.scales = scales;
    float *dense = (float *)loom_malloc((size_t)w->rows * (size_t)w->cols * sizeof(float));
    loom_tensor_dequantize(&h, dense);
    free(values);
    free(meta);
    free(scales);
    return dense;
}

/* The entry of w, made at its first use. */
static s24_entry *s24_entry_of(const loom_tensor_t *w) {
    s24_entry *free_slot = nullptr;
    for (int i = 0; i < S24_CACHE; i++) {
        s24_entry *e = &g_s24[i];
        if (e->data == w->data && e->rows == w->rows && e->cols == w->cols) return e;
        if (!e->data && !free_slot) free_slot = e;
    }
    if (!free_slot)
        loom_panic(__FILE__, __LINE__, "more than %d 2:4 weights on the GPU at once", S24_CACHE);
    float *host = widen_on_host(w);
    char why[256] = "";
    s24_entry *e = free_slot;
    e->data = w->data, e->rows = w->rows, e->cols = w->cols;
    e->lt = cuda_sparselt_weight(host, (int)w->rows, (int)w->cols, why, sizeof why);
    if (e->lt && !g_said_lt++)
        loom_info("2:4 weights run on the sparse tensor cores of cuda:%d (cuSPARSELt, %s)", g_cuda.device,
                  loom_dtype_name(g_cuda.dtype));
    if (!e->lt) {
        size_t n = (size_t)w->rows * (size_t)w->cols * sizeof(float);
        CUDA_CHECK(cudaMalloc(&e->dense, n));
        /* on the backend's stream, and landed before `host` is freed: a
         * legacy-stream cudaMemcpy from pageable memory may return before
         * the copy is done, and the non-blocking stream does not wait for it */
        CUDA_CHECK(cudaMemcpyAsync(e->dense, host, n, cudaMemcpyHostToDevice, g_cuda.stream));
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
        if (!g_said++)
            loom_warn("2:4 weights run dense on cuda:%d (%s): fp32 weights, no sparse speed-up", g_cuda.device, why);
    }
    free(host);
    return e;
}

void cuda_matmul_forward_s24(float *out, const float *inp, const loom_tensor_t *w, const float *bias, int N, int C,
                             int OC, int gelu) {
    if (N <= 0 || OC <= 0) return;
    s24_entry *e = s24_entry_of(w);
    if (e->lt)
        cuda_sparselt_matmul(e->lt, out, inp, bias, N, C, OC, gelu);
    else
        cuda_matmul_forward_rows(out, inp, e->dense, bias, N, C, OC, gelu);
}

void cuda_sparse24_forget(const void *p, size_t bytes) {
    for (int i = 0; i < S24_CACHE; i++) {
        s24_entry *e = &g_s24[i];
        if (!e->data || (const char *)e->data < (const char *)p || (const char *)e->data >= (const char *)p + bytes)
            continue;
        if (e->dense) CUDA_CHECK(cudaFree(e->dense));
        cuda_sparselt_free(e->lt);
        memset(e, 0, sizeof *e);
    }
}
