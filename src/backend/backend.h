/* backend: the op table. The model calls every op through this table and
 * never branches on which backend it has, so the training loop, checkpoints
 * and the distributed layer are one piece of code for CPU and GPU.
 *
 * Conventions, for every backend:
 * - All tensors are float32, row-major, in the backend's memory (device
 *   memory for CUDA). Token ids are int32 in backend memory.
 * - B batch, T sequence length, C channels, NH heads, N = B*T rows,
 *   V vocabulary, Vp padded vocabulary (V <= Vp, Vp % 64 == 0).
 * - Backward ops ACCUMULATE (+=) into parameter gradients and into `dinp`
 *   unless the entry says "overwrites". Callers zero what must start at 0.
 * - Ops may run asynchronously; `sync` waits for all of them. download()
 *   is synchronous.
 * - The CPU backend is the reference every other backend is tested against.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../core/core.h"

/* Precision of the matrix work. fp32 everywhere on the CPU; the CUDA backend
 * runs tensor cores at tf32/bf16/fp16 with fp32 master weights. */
typedef enum { LOOM_FP32 = 0, LOOM_TF32, LOOM_BF16, LOOM_FP16 } loom_dtype;
/* Parse "fp32", "tf32", "bf16", "fp16"; -1 if unknown. */
int loom_dtype_parse(const char *s);
const char *loom_dtype_name(loom_dtype d);

/* AdamW hyperparameters for one update call. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* gradients are multiplied by this first (clipping, 1/accum) */
    int t;            /* 1-based step count, for bias correction */
} loom_adamw_t;

typedef struct loom_backend {
    const char *name; /* "cpu", "cuda:0", ... */
    loom_dtype dtype; /* precision of the matrix work */
    /* Peak dense FLOP/s for this dtype, for MFU; 0 = unknown. */
    double peak_flops;
    const char *peak_source; /* how peak_flops was found, for the log */

    /* Memory. alloc returns zeroed memory or NULL. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*upload)(void *dst, const void *src_host, size_t bytes);
    void (*download)(void *dst_host, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);
    void (*sync)(void);

    /* out (B,T,C) = wte[tokens] + wpe[t]; wte (Vp,C), wpe (maxT,C), tokens (B,T). */
    void (*encoder_forward)(float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* dwte += scatter(dout by token), dwpe += sum over batch; dout (B,T,C). */
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C);

    /* out (N,C) = (inp - mean) * rstd * w + b, eps 1e-5; mean, rstd (N) saved for backward. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    /* dinp += , dw += , db += . */
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);

    /* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC); bias may be NULL. Overwrites out. */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC);
    /* dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp; dbias (OC) += colsum(dout).
     * dinp and dbias may be NULL (not needed). */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);

    /* Causal multi-head attention. qkv (B,T,3C) holds q, k, v side by side,
     * each split into NH heads of C/NH. out (B,T,C) overwritten; lse (B,NH,T)
     * receives each query row's log-sum-exp of scaled scores, which is all
     * backward needs (no T x T tensor is kept). */
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int C,
                              int NH);
    /* dqkv (B,T,3C) overwritten, from dout (B,T,C), qkv, out and lse of forward. */
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C,
                               int NH);

    /* GELU, tanh approximation. backward overwrites dinp (may alias dout). */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);

    /* out = a + b (out may alias a or b); dst += src. */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    void (*accumulate)(float *dst, const float *src, size_t n);

    /* Fused softmax + cross-entropy over logits (N,Vp), only the first V
     * columns count. losses (N) = -log softmax(logits)[target]. If dloss != 0
     * the logits are overwritten in place by their gradient
     * dloss * (softmax - onehot(target)), with padded columns set to 0; no
     * probability tensor is ever stored. targets (N) int32 in [0,V). */
    void (*crossentropy)(float *losses, float *logits, const int *targets, int N, int V,
                         int Vp, float dloss);

    /* AdamW over n contiguous parameters with decoupled weight decay. */
    void (*adamw)(float *params, const float *grads, float *m, float *v, size_t n,
                  const loom_adamw_t *hp);

    /* Sum of squares of x (n), returned to the host in double. */
    double (*sumsq)(const float *x, size_t n);

    /* Optional entries (NULL where a backend has none) go below; append
     * only, each with a comment saying what the model does without it. */

    /* --- CUDA graphs (CUDA backend; NULL on the CPU, where ops are simply
     * launched). graph_begin(key) starts recording every op launched after
     * it instead of running it; graph_end(key) ends the recording and keeps
     * it under `key` (replacing an older one); nothing recorded has run yet,
     * so call graph_replay(key) to run it, now and on every later step.
     * Between begin and end call only ops, zero, and the *_dev entries below:
     * upload, download, sync and sumsq synchronize with the host and abort
     * the process if called while recording; alloc must not be called.
     * Scalars passed by value (dloss, hp->lr, hp->t, ...) are frozen at
     * capture, which is why the *_dev entries read them from device memory.
     * Buffers are frozen too: replay reads and writes the same pointers, so
     * upload each step's tokens into the same buffers before replay. Run one
     * plain step first (it sizes the backend's scratch buffers). A later op
     * that needs more scratch than any before (larger shapes) makes the
     * backend drop every graph: graph_replay then returns LOOM_EINVAL and
     * the caller captures again. Without these entries the trainer launches
     * the ops each step. */
    loom_status (*graph_begin)(int key);
    loom_status (*graph_end)(int key);
    loom_status (*graph_replay)(int key);
    void (*graph_reset)(void); /* drop every captured graph (shapes changed) */

    /* --- Step scalars in device memory, for graphs. `scalars` is a device
     * array of 8 floats: [0] lr, [1] grad_scale, [2] t (1-based step, as a
     * float), [3] max_norm for global-norm clipping (0 = none), [4] sumsq of
     * all gradients (filled by sumsq_dev), [5] dloss for crossentropy_dev,
     * [6], [7] unused (0). The trainer uploads [0..3], [5] before each
     * replay and zeroes [4] inside the graph before the sumsq_dev calls.
     * Without these entries the trainer uses sumsq, adamw, crossentropy. */
    /* acc[0] += sum of squares of x (n), all on the device. */
    void (*sumsq_dev)(float *acc, const float *x, size_t n);
    /* adamw with lr, grad_scale and t from scalars (hp's are ignored;
     * beta1, beta2, eps, weight_decay come from hp). If max_norm > 0 and
     * sqrt(sumsq) * grad_scale > max_norm, the gradients are scaled down to
     * max_norm. If sumsq is inf or nan the update is skipped (params, m, v
     * unchanged): the trainer downloads scalars[4] after the step to log the
     * skip and adjust an fp16 loss scale. */
    void (*adamw_dev)(float *params, const float *grads, float *m, float *v, size_t n,
                      const loom_adamw_t *hp, const float *scalars);
    /* crossentropy with dloss read from scalars[5]. */
    void (*crossentropy_dev)(float *losses, float *logits, const int *targets, int N, int V,
                             int Vp, const float *scalars);

    /* --- Fusions. Without them the model calls the unfused ops named. */
    /* res (N,C) = a + b_res, then out, mean, rstd = layernorm_forward(res):
     * residual_forward + layernorm_forward in one pass. res may alias a. */
    void (*residual_layernorm_forward)(float *res, float *out, float *mean, float *rstd,
                                       const float *a, const float *b_res, const float *w,
                                       const float *b, int N, int C);
    /* pre (N,OC) = inp @ w^T + bias; out (N,OC) = gelu(pre): matmul_forward
     * + gelu_forward in one GEMM (epilogue), pre kept for gelu_backward. */
    void (*matmul_forward_gelu)(float *out, float *pre, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC);
    /* Backward of inp = gelu(pre) followed by a matmul: dw (OC,C) +=
     * dout^T @ inp and dbias (OC) += colsum(dout) as matmul_backward; then
     * dpre (N,C) = gelu_backward(pre, dout @ w), OVERWRITTEN, the GELU
     * derivative applied in the same GEMM (epilogue). dbias may be NULL.
     * Without it: matmul_backward into a zeroed dinp, then gelu_backward. */
    void (*matmul_backward_gelu)(float *dpre, float *dw, float *dbias, const float *dout,
                                 const float *inp, const float *pre, const float *w, int N,
                                 int C, int OC);

    /* --- Inference over a paged KV cache (backend/paged.h): the engine's
     * ops. NULL where a backend has none: the engine then refuses the
     * device with a message. */
    const struct loom_paged_ops *paged;
} loom_backend_t;

/* Look up a backend by device name: "cpu", "cuda", "cuda:N". `threads` is
 * the CPU thread count (0 = all cores). Returns LOOM_EUNAVAIL with the
 * reason when the device cannot be used on this build or machine. */
loom_status loom_backend_open(const loom_backend_t **out, const char *device, int threads,
                              loom_dtype dtype);

/* The CPU backend (always available, fp32 only). Measures its peak with a
 * short SGEMM the first time it is opened in a process. */
loom_status loom_backend_cpu_init(const loom_backend_t **out, int threads);
#ifdef LOOM_HAVE_CUDA
/* The CUDA backend on device `index` (src/backend/cuda/). */
loom_status loom_backend_cuda_init(const loom_backend_t **out, int index, loom_dtype dtype);
#endif
/* Threads the CPU backend uses. */
int loom_backend_cpu_threads(void);

#endif
