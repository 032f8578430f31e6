/* backend: the op table. The model calls every op through this table and
 * never branches on which backend it has, so the training loop, checkpoints
 * and the distributed layer are one piece of code for CPU and GPU.
 *
 * Conventions, for every backend:
 * - Tensors are row-major, in the backend's memory (device memory for
 *   CUDA). Their element type follows the argument's tag in ops.h: F32
 *   float32, I32 int32 (token ids), ACT be->act_dtype (float32 on the CPU;
 *   bf16/fp16 on CUDA at those dtypes), QT a loom_tensor_t that says its
 *   own type. An ACT argument is declared `float *` but points at
 *   act_dtype elements: callers size and offset ACT buffers with
 *   loom_dtype_size(be->act_dtype) and never read them on the host.
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
#include "ops.h"

/* Element types. The first four are also the precision of the matrix
 * work (loom_backend_t.dtype, --dtype): fp32 everywhere on the CPU; the
 * CUDA backend runs tensor cores at tf32/bf16/fp16 with fp32 master
 * weights (tf32 is stored as fp32). The rest are storage types that typed
 * tensors (loom_tensor_t) and token ids use. Append only: the values are
 * bits of loom_backend_t.dtypes. */
typedef enum {
    LOOM_FP32 = 0, LOOM_TF32, LOOM_BF16, LOOM_FP16, /* matrix precisions */
    LOOM_INT8, LOOM_INT32,                          /* storage only */
    /* llama.cpp's block formats (qblock.h): weights as a GGUF stores them */
    LOOM_Q4_0, LOOM_Q4_1, LOOM_Q5_0, LOOM_Q5_1, LOOM_Q4_K, LOOM_Q5_K, LOOM_Q6_K,
    LOOM_DTYPE_COUNT
} loom_dtype;
/* Parse a matrix precision: "fp32", "tf32", "bf16", "fp16"; -1 if unknown
 * (storage types are not precisions and do not parse). */
int loom_dtype_parse(const char *s);
/* "fp32", ..., "int8", "int32"; "?" out of range. */
const char *loom_dtype_name(loom_dtype d);
/* Bytes per element (tf32 is stored as fp32); 0 out of range and for the
 * block formats (loom_qblock_row_bytes sizes those). */
size_t loom_dtype_size(loom_dtype d);

/* How a typed tensor's elements are laid out. */
typedef enum {
    LOOM_LAYOUT_DENSE = 0, /* rows x cols, row-major */
    /* 2:4 structured sparsity along each row: of every 4 consecutive
     * elements 2 are kept. data holds rows x cols/2 kept values, row-major;
     * meta holds 4 bits per group of 4, two 2-bit column indices (the
     * first in bits 0-1, the second in bits 2-3, first < second), two
     * groups per byte (group g of a row in byte g / 2, the low nibble for
     * even g): rows x (cols + 7) / 8 bytes, each row starting on a byte. */
    LOOM_LAYOUT_SPARSE24,
    /* q4_K, q6_K and the 32-value formats (q4_0 ... q5_1), rows a
     * multiple of 8: each 8 rows' blocks
     * interleaved (qblock.h, "8 rows interleaved"), the same bytes as
     * dense in the same place; the CPU's one-row products read 8 rows at
     * once. */
    LOOM_LAYOUT_ROWS8,
} loom_layout;

/* A typed tensor: the argument kind QT of ops.h, for data whose element
 * type and scales travel with it (int8 weights, an int8 KV cache, 2:4
 * sparse weights). A matrix rows x cols, logically; element (r, c) of an
 * int8 tensor is data[r][c] * scale(r, c), where scale(r, c) is
 * scales[r] when block == 0 (one per row: per output channel for a
 * weight (OC, C)) and scales[r * (cols / block) + c / block] when
 * block > 0 (per block of `block` consecutive elements, 32 in the
 * quantization issue). fp32/bf16/fp16 tensors have no scales. A block
 * format (LOOM_Q4_0 ... LOOM_Q6_K, qblock.h) holds rows x cols / block
 * blocks, row-major, each with its own scales: scales NULL, block 0. */
typedef struct {
    void *data;          /* in the backend's memory */
    loom_dtype dtype;    /* element type of data */
    long long rows, cols;
    const float *scales; /* int8 only, in the backend's memory, fp32 */
    int block;           /* 0 = one scale per row; else elements per scale, divides cols */
    loom_layout layout;
    const unsigned char *meta; /* LOOM_LAYOUT_SPARSE24 only: rows x (cols + 7) / 8 bytes */
} loom_tensor_t;

/* LOOM_OK when `t` is self-consistent (a known dtype and layout, scales
 * where int8 needs them and none elsewhere, block dividing cols, cols a
 * multiple of 4 for 2:4); else LOOM_EINVAL saying what is wrong, prefixed
 * by `what` (the tensor's name). */
loom_status loom_tensor_check(const loom_tensor_t *t, const char *what);
/* The reference meaning of a typed tensor in host memory: out (rows,
 * cols) fp32, dense. The fallback of every VARIANT op is "dequantize into
 * a scratch buffer, then the fp32 op"; backends and tests check against
 * it. `t` must pass loom_tensor_check. */
void loom_tensor_dequantize(const loom_tensor_t *t, float *out);
/* Host conversions between fp32 and a storage type `d` (fp32, bf16,
 * fp16; n elements): to_f32 widens exactly, from_f32 rounds to nearest
 * even (overflow to inf, as the GPU's conversions do). The reference for
 * ACT tensors of a backend whose act_dtype is 16-bit. */
void loom_dtype_to_f32(float *dst, const void *src, loom_dtype d, size_t n);
void loom_dtype_from_f32(void *dst, const float *src, loom_dtype d, size_t n);

/* alloc's return type, one token for ops.h. */
typedef void *loom_ptr;

/* AdamW hyperparameters for one update call. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* gradients are multiplied by this first (clipping, 1/accum) */
    int t;            /* 1-based step count, for bias correction */
} loom_adamw_t;

/* The kinds of ops.h, as values. */
typedef enum {
    LOOM_OPK_MEM, LOOM_OPK_OP, LOOM_OPK_HOST, LOOM_OPK_FUSED, LOOM_OPK_DEV, LOOM_OPK_GRAPH,
    LOOM_OPK_VARIANT
} loom_op_kind;

/* The argument tags of ops.h, as values. */
typedef enum {
    LOOM_ARG_ACT, LOOM_ARG_F32, LOOM_ARG_I32, LOOM_ARG_QT, LOOM_ARG_BYTES, LOOM_ARG_VAL, LOOM_ARG_HP
} loom_arg_tag;

/* One id per entry of ops.h: LOOM_OP_alloc, ..., LOOM_OP_COUNT. */
typedef enum {
#define LOOM_OP_ENUM_(name, ret, kind, fallback, flops, n, args) LOOM_OP_##name,
    LOOM_OPS(LOOM_OP_ENUM_)
#undef LOOM_OP_ENUM_
    LOOM_OP_COUNT
} loom_op_id;

#define LOOM_OP_MAX_ARGS 12

/* What ops.h says about one entry, for tools and tests. */
typedef struct {
    const char *name;
    loom_op_kind kind;
    int required;         /* a backend must fill it */
    const char *fallback; /* what the model does without it ("" if required) */
    int nargs;
    const char *arg_names[LOOM_OP_MAX_ARGS];
    loom_arg_tag arg_tags[LOOM_OP_MAX_ARGS];
} loom_op_info_t;

/* Everything ops.h says about entry `op` (0 <= op < LOOM_OP_COUNT). */
const loom_op_info_t *loom_op_info(loom_op_id op);

struct loom_backend;
/* The element type of argument `arg` of `op` on backend `be`: LOOM_FP32
 * for F32, LOOM_INT32 for I32, be->act_dtype for ACT; -1 for arguments
 * that are not tensors of one fixed type (QT tensors carry theirs, BYTES,
 * VAL, HP) or out of range. */
int loom_op_arg_dtype(const struct loom_backend *be, loom_op_id op, int arg);

/* Capability flags (loom_backend_t.caps): what a caller may rely on
 * without knowing which backend it has. */
enum {
    /* Tensors live in device memory and ops run asynchronously on a
     * stream: call sync before another stream (NCCL) or the host reads. */
    LOOM_CAP_DEVICE_MEMORY = 1u << 0,
    /* The device-resident step: sumsq_dev, adamw_dev, crossentropy_dev. */
    LOOM_CAP_DEVICE_STEP = 1u << 1,
    /* Whole-step graphs: graph_begin, graph_end, graph_replay, graph_reset. */
    LOOM_CAP_GRAPHS = 1u << 2,
    /* The matrix precision (dtype) needs a dynamic loss scale (fp16). */
    LOOM_CAP_LOSS_SCALING = 1u << 3,
};

/* Bit of `d` in loom_backend_t.dtypes. */
#define LOOM_DTYPE_BIT(d) (1u << (unsigned)(d))

typedef struct loom_backend {
    const char *name; /* "cpu", "cuda:0", ... for messages only: never compare it */
    loom_dtype dtype; /* precision of the matrix work */
    /* Peak dense FLOP/s for this dtype, for MFU; 0 = unknown. */
    double peak_flops;
    const char *peak_source; /* how peak_flops was found, for the log */
    unsigned caps;           /* LOOM_CAP_* */
    /* Element types the ops accept (LOOM_DTYPE_BIT of each): tensors
     * tagged F32 and I32 in ops.h are always fp32 and int32, ACT tensors
     * are act_dtype, QT tensors say their own type (loom_tensor_t). */
    unsigned dtypes;
    /* Element type of ACT arguments: fp32 on the CPU; on CUDA the 16-bit
     * matrix precision (bf16, fp16) when the backend is opened at one,
     * else fp32 (docs/cuda.md, "bf16 activations"). */
    loom_dtype act_dtype;
    /* Host threads its ops run on: the CPU backend's OpenMP team. OpenMP
     * counts threads per calling thread, so a thread that runs ops (the
     * engine's stepping thread) sets its own count from this. 0 where no
     * op's work runs on the host. */
    int threads;
    /* The kernels it chose for this machine, in words, for reports
     * ("gemm avx512, int8 avx512vnni"); NULL when there is nothing to say. */
    const char *kernels;

    /* One slot per entry of ops.h, in its order; the contract of each: */
#define LOOM_OP_SLOT_(name, ret, kind, fallback, flops, n, args) ret(*name) LOOM_OP_PARAMS(n, args);
    LOOM_OPS(LOOM_OP_SLOT_)
#undef LOOM_OP_SLOT_
} loom_backend_t;

/* The contract of each slot (shapes, what it computes). Memory: alloc
 * returns zeroed memory or NULL; upload/download copy bytes between host
 * and backend memory (download is synchronous); zero clears bytes; sync
 * waits for every op launched.
 *
 * encoder_forward: out (B,T,C) = wte[tokens] + wpe[t]; wte (Vp,C), wpe
 *   (maxT,C), tokens (B,T). wpe NULL: no position term (rotary models).
 * encoder_backward: dwte += scatter(dout by token), dwpe += sum over
 *   batch (skipped when dwpe is NULL); dout (B,T,C).
 * layernorm_forward: out (N,C) = (inp - mean) * rstd * w + b, eps 1e-5;
 *   mean, rstd (N) saved for backward.
 * layernorm_backward: dinp += , dw += , db += .
 * matmul_forward: out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC); bias
 *   may be NULL. Overwrites out.
 * matmul_backward: dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp;
 *   dbias (OC) += colsum(dout). dinp and dbias may be NULL (not needed).
 * attention_forward: causal attention with NH query heads of hs = C/NH and
 *   NKV key/value heads (NKV divides NH; query head h reads kv head
 *   h / (NH/NKV): multi-head at NKV = NH, grouped-query below, multi-query
 *   at 1). qkv (B,T,QR), QR = C + 2*NKV*hs, holds per row the NH query
 *   heads, then the NKV key heads, then the NKV value heads (3C at NKV =
 *   NH). out (B,T,C) overwritten; lse (B,NH,T) receives each query row's
 *   log-sum-exp of scaled scores, which is all backward needs (no T x T
 *   tensor is kept).
 * attention_backward: dqkv (B,T,QR) overwritten, from dout (B,T,C), qkv,
 *   out and lse of forward; a kv head's dk, dv sum over its query heads.
 * gelu_forward, gelu_backward: GELU, tanh approximation. backward
 *   overwrites dinp (may alias dout).
 * residual_forward: out = a + b (out may alias a or b). accumulate: dst += src
 *   over fp32 (F32: the trainer sums per-position losses with it).
 * crossentropy: fused softmax + cross-entropy over logits (N,Vp), only the
 *   first V columns count. losses (N) = -log softmax(logits)[target]. If
 *   dloss != 0 the logits are overwritten in place by their gradient
 *   dloss * (softmax - onehot(target)), with padded columns set to 0; no
 *   probability tensor is ever stored. targets (N) int32 in [0,V).
 * adamw: AdamW over n contiguous parameters with decoupled weight decay.
 * sumsq: sum of squares of x (n), returned to the host in double.
 * rmsnorm_forward: out (N,C) = inp * rstd * w, rstd (N) = 1/sqrt(mean(inp^2)
 *   + eps), saved for backward. No bias (Llama's RMSNorm).
 * rmsnorm_backward: dinp (N,C) += , dw (C) += , from dout, inp, w, rstd.
 * vocab_embed_forward, vocab_embed_backward: encoder_forward/backward for
 *   a shard of the vocabulary (tensor parallelism, parallel/tp.h): wte
 *   (nv, C) holds rows v0 .. v0+nv-1; a token outside them contributes 0
 *   (its row lives on another rank; the ranks' outputs are summed). wpe
 *   NULL: no position term (also how only one rank adds it).
 * vocab_ce_stats: per row n of logits (N, Vp), the shard's columns
 *   v0 .. v0+Vp-1 of the whole vocabulary, of which the first nv are real:
 *   stats[3n] = their max (-inf when nv = 0), stats[3n+1] = sum of
 *   exp(logit - max), stats[3n+2] = the target's logit when the target is
 *   in the shard, else 0.
 * vocab_ce_finish: stats (ranks, N, 3), every rank's vocab_ce_stats side by
 *   side, combine into the whole row's log-sum-exp; losses (N) as
 *   crossentropy's; dloss != 0: the shard's logits overwritten by their
 *   gradient (padded columns 0). The full logits are never gathered.
 * rope_forward: rotary position embedding, in place, of the NH query and
 *   NKV key heads of qkv (N, C + 2*NKV*hs) (values untouched). Row i at
 *   position pos[i] (N); for each head, pairs (j, j + hs/2), j < hs/2,
 *   rotate by angle pos[i] * freq[j] (freq (hs/2) fp32: Hugging Face's
 *   inv_freq after rope scaling): x' = x cos - y sin, y' = y cos + x sin.
 * rope_backward: the transpose (rotation by -angle) of dq and dk in dqkv,
 *   in place: the gradient before rope_forward.
 * swiglu_forward: out (N,H) = silu(gate) * up, inp (N,2H) holding gate
 *   then up per row.
 * swiglu_backward: dinp (N,2H) OVERWRITTEN with d gate, d up from dout
 *   (N,H) and inp.
 *
 * Optional entries (NULL where a backend has none; ops.h says what the
 * model does without each):
 *
 * graph_*: CUDA graphs (CUDA backend; NULL on the CPU, where ops are simply
 *   launched). graph_begin(key) starts recording every op launched after
 *   it instead of running it; graph_end(key) ends the recording and keeps
 *   it under `key` (replacing an older one); nothing recorded has run yet,
 *   so call graph_replay(key) to run it, now and on every later step.
 *   Between begin and end call only entries of kind OP, FUSED and DEV:
 *   MEM and HOST entries synchronize with the host and abort the process
 *   if called while recording; alloc must not be called. Scalars passed by
 *   value (dloss, hp->lr, hp->t, ...) are frozen at capture, which is why
 *   the DEV entries read them from device memory. Buffers are frozen too:
 *   replay reads and writes the same pointers, so upload each step's
 *   tokens into the same buffers before replay. Run one plain step first
 *   (it sizes the backend's scratch buffers). A later op that needs more
 *   scratch than any before (larger shapes) makes the backend drop every
 *   graph: graph_replay then returns LOOM_EINVAL and the caller captures
 *   again. graph_reset drops every captured graph (shapes changed).
 *
 * DEV entries: step scalars in device memory, for graphs. `scalars` is a
 *   device array of 8 floats: [0] lr, [1] grad_scale, [2] t (1-based step,
 *   as a float), [3] max_norm for global-norm clipping (0 = none), [4]
 *   sumsq of all gradients (filled by sumsq_dev), [5] dloss for
 *   crossentropy_dev, [6], [7] unused (0). The trainer uploads [0..3], [5]
 *   before each replay and zeroes [4] inside the graph before the
 *   sumsq_dev calls.
 * sumsq_dev: acc[0] += sum of squares of x (n), all on the device.
 * adamw_dev: adamw with lr, grad_scale and t from scalars (hp's are
 *   ignored; beta1, beta2, eps, weight_decay come from hp). If max_norm > 0
 *   and sqrt(sumsq) * grad_scale > max_norm, the gradients are scaled down
 *   to max_norm. If sumsq is inf or nan the update is skipped (params, m, v
 *   unchanged): the trainer downloads scalars[4] after the step to log the
 *   skip and adjust an fp16 loss scale.
 * crossentropy_dev: crossentropy with dloss read from scalars[5].
 *
 * FUSED entries:
 * residual_layernorm_forward: res (N,C) = a + b_res, then out, mean, rstd
 *   = layernorm_forward(res) in one pass. res may alias a.
 * matmul_forward_gelu: pre (N,OC) = inp @ w^T + bias; out (N,OC) =
 *   gelu(pre) in one GEMM (epilogue), pre kept for gelu_backward.
 * matmul_backward_gelu: backward of inp = gelu(pre) followed by a matmul:
 *   dw (OC,C) += dout^T @ inp and dbias (OC) += colsum(dout) as
 *   matmul_backward; then dpre (N,C) = gelu_backward(pre, dout @ w),
 *   OVERWRITTEN, the GELU derivative applied in the same GEMM (epilogue).
 *   dbias may be NULL.
 *
 * Inference over a paged KV cache (the engine, src/serve/; PagedAttention).
 * A layer's cache is a typed tensor `kv` of num_blocks blocks: rows
 * num_blocks * 2 * NH, cols block_size * hs; row (b * 2 + 0) * NH + h holds
 * head h's keys of block b (block_size tokens x hs, token-major), row
 * (b * 2 + 1) * NH + h its values. fp32 today; an int8 cache has one scale
 * per row (per block, K or V, head: loom_tensor_t with block 0). A
 * sequence's token at position p lives in block block_tables[seq][p /
 * block_size] at offset p % block_size; its slot is block * block_size +
 * offset. Every op computes each output row from its own input row and
 * its own sequence's cache only; on the CPU in an order that depends
 * neither on N nor on the threads, so a sequence's tokens are bitwise the
 * same alone or in a batch.
 * embed_positions: out (N,C) = wte[tokens[i]] + wpe[pos[i]]; tokens, pos (N); wpe
 *   NULL: wte rows only (rotary models).
 * matmul_forward_rows: out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (may be
 *   NULL), then GELU when gelu != 0; each weight is read from memory once
 *   per call whatever N (decode's matrix-vector path, all sequences of a
 *   step at once).
 * kv_write: the K and V parts of qkv (N, NH*hs + 2*NKV*hs; attention_forward's
 *   row layout) go into the cache at each row's slot (N). The cache holds
 *   NKV heads: read NH above as NKV for its rows.
 * paged_attention: out (N,C): causal attention of each row's NH query
 *   heads (in qkv) over positions 0..pos[i] of sequence seq[i], read through
 *   its row of block_tables (S, max_blocks); query head h reads cache head
 *   h / (NH/NKV). Scale 1/sqrt(hs).
 * gather_rows: out (R,C) = inp[rows[r]].
 * matmul_forward_s24: matmul_forward_rows with w (OC,C) a typed tensor of
 *   layout LOOM_LAYOUT_SPARSE24 (fp32 kept values, C a multiple of 4): the
 *   same result as matmul_forward_rows on loom_tensor_dequantize(w), reading
 *   about half the weight bytes.
 * kv_copy_block: block src to block dst, K and V of every head (copy-on-write);
 *   its NH is the cache's head count (NKV). */

/* Copy n elements of an ACT tensor (be->act_dtype) from backend memory to
 * host fp32 `dst` (a plain download when act_dtype is fp32). */
void loom_backend_download_act(const struct loom_backend *be, float *dst, const void *src, size_t n);
/* Bytes of n elements of an ACT tensor on `be`. */
size_t loom_backend_act_bytes(const struct loom_backend *be, size_t n);

/* LOOM_OK when every required entry of `be` is filled and its type flags
 * agree with its slots; else LOOM_EINTERNAL naming the first missing op. */
loom_status loom_backend_check(const loom_backend_t *be);

/* The slot of entry `op` in `be` (NULL when the backend has none). */
void *loom_backend_slot(const loom_backend_t *be, loom_op_id op);

/* The dtype `--dtype auto` means on `device` (bf16 on CUDA, fp32 on the
 * CPU), without opening it; LOOM_FP32 for a name it does not know. */
loom_dtype loom_backend_default_dtype(const char *device);
/* The device a rank opens: "cuda" becomes "cuda:<local_rank>" (one GPU
 * per process) when local_rank >= 0; anything else is copied as given. */
void loom_backend_rank_device(char *out, size_t n, const char *device, int local_rank);
/* The LOOM_CAP_DEVICE_MEMORY bit `device` will have once opened, without
 * opening it (for choosing a transport before the backend exists). */
unsigned loom_backend_device_caps(const char *device);
/* The GPU ordinal a device name asks for ("cuda" 0, "cuda:N" N), -1 for
 * a device without GPU memory ("cpu"). */
int loom_backend_gpu_ordinal(const char *device);

/* Look up a backend by device name: "cpu", "cuda", "cuda:N". `threads` is
 * the CPU thread count (0 = all cores). Returns LOOM_EUNAVAIL with the
 * reason when the device cannot be used on this build or machine, and
 * LOOM_EINTERNAL when the backend leaves a required op empty. */
loom_status loom_backend_open(const loom_backend_t **out, const char *device, int threads,
                              loom_dtype dtype);

/* The CPU backend (always available, fp32 only). Measures its peak with a
 * short SGEMM the first time it is opened in a process. */
loom_status loom_backend_cpu_init(const loom_backend_t **out, int threads);
#ifdef LOOM_HAVE_CUDA
/* The CUDA backend on device `index` (src/backend/cuda/). */
loom_status loom_backend_cuda_init(const loom_backend_t **out, int index, loom_dtype dtype);
#endif
/* The CPU's SGEMM rate in FLOP/s: the best of `reps` n^3 products with
 * the GEMM and threads of the open CPU backend; `how` says so in words.
 * Larger n and more reps than the quick measurement at open, for
 * benchmarks (n = 2048, 5 reps take about 2 s on 2 cores). */
double loom_backend_cpu_measure_peak(int n, int reps, char *how, size_t how_size);

#endif
