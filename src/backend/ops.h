/* ops: every entry of the backend table, listed once.
 *
 * LOOM_OPS(X) calls X once per entry, in table order:
 *
 *   X(name, ret, kind, fallback, flops, nargs, (args))
 *
 *   name      the slot in loom_backend_t and the name printed by tools
 *   ret       return type (one token; `loom_ptr` for alloc's void *)
 *   kind      one token (the table's contract for each kind is below):
 *     MEM     memory entry; synchronizes with the host. Required.
 *     OP      op on the backend's stream; may be recorded into a graph. Required.
 *     HOST    required op that returns a value to the host or takes a
 *             per-step scalar by value: never recorded into a graph.
 *     FUSED   optional op; `fallback` says what the model composes without it.
 *     DEV     optional op that reads step scalars from device memory
 *             (for graphs); `fallback` names the plain op used without it.
 *     GRAPH   optional graph control (begin, end, replay, reset).
 *     VARIANT optional op for another element type (quantized weights,
 *             sparse weights, bf16 activations); `fallback` names the
 *             fp32 path (matmul_forward_w8, matmul_forward_w8a8,
 *             matmul_forward_s24, matmul_forward_kq).
 *   fallback  text: what happens without an optional entry ("" if required)
 *   flops     FLOPs of one call as an expression of the arguments (0 when
 *             memory-bound), for `loom bench ops`
 *   nargs     number of arguments (0 to 12)
 *   args      ((tag, C type, name), ...), or () with nargs 0
 *
 * Argument tags say what each argument holds, hence its element type
 * (docs/design.md, "Op list and tensor types"):
 *   ACT    activation or activation gradient: element type be->act_dtype
 *          (fp32 on the CPU, bf16/fp16 on CUDA at those dtypes)
 *   F32    always float32: parameters, their gradients, optimizer state,
 *          per-row statistics (mean, rstd, lse), losses, step scalars
 *   I32    int32 token ids
 *   QT     const loom_tensor_t *: a typed tensor whose element type and
 *          scales travel with it (int8 weights, int8 KV cache, 2:4 sparse)
 *   BYTES  untyped memory (alloc, zero, copies)
 *   VAL    a scalar passed by value (sizes, dloss, graph keys)
 *   HP     const loom_adamw_t *: read at call time (a recorder copies it)
 *
 * Shapes and what each op computes are documented in backend.h, beside
 * the kind contracts. Append new entries at the end of their group; the
 * table's layout follows this list. */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

/* clang-format off */
#define LOOM_OPS(X) \
    X(alloc,    loom_ptr, MEM, "", 0, 1, ((VAL, size_t, bytes))) \
    X(free,     void,     MEM, "", 0, 1, ((BYTES, void *, p))) \
    X(upload,   void,     MEM, "", 0, 3, ((BYTES, void *, dst), (BYTES, const void *, src_host), (VAL, size_t, bytes))) \
    X(download, void,     MEM, "", 0, 3, ((BYTES, void *, dst_host), (BYTES, const void *, src), (VAL, size_t, bytes))) \
    X(zero,     void,     OP,  "", 0, 2, ((BYTES, void *, p), (VAL, size_t, bytes))) \
    X(sync,     void,     MEM, "", 0, 0, ()) \
    X(encoder_forward, void, OP, "", 0, 7, \
      ((ACT, float *, out), (I32, const int *, tokens), (F32, const float *, wte), (F32, const float *, wpe), \
       (VAL, int, B), (VAL, int, T), (VAL, int, C))) \
    X(encoder_backward, void, OP, "", 0, 7, \
      ((F32, float *, dwte), (F32, float *, dwpe), (ACT, const float *, dout), (I32, const int *, tokens), \
       (VAL, int, B), (VAL, int, T), (VAL, int, C))) \
    X(layernorm_forward, void, OP, "", 0, 8, \
      ((ACT, float *, out), (F32, float *, mean), (F32, float *, rstd), (ACT, const float *, inp), \
       (F32, const float *, w), (F32, const float *, b), (VAL, int, N), (VAL, int, C))) \
    X(layernorm_backward, void, OP, "", 0, 10, \
      ((ACT, float *, dinp), (F32, float *, dw), (F32, float *, db), (ACT, const float *, dout), \
       (ACT, const float *, inp), (F32, const float *, w), (F32, const float *, mean), \
       (F32, const float *, rstd), (VAL, int, N), (VAL, int, C))) \
    X(matmul_forward, void, OP, "", 2.0 * N * C * OC, 7, \
      ((ACT, float *, out), (ACT, const float *, inp), (F32, const float *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC))) \
    X(matmul_backward, void, OP, "", (dinp ? 4.0 : 2.0) * N * C * OC, 9, \
      ((ACT, float *, dinp), (F32, float *, dw), (F32, float *, dbias), (ACT, const float *, dout), \
       (ACT, const float *, inp), (F32, const float *, w), (VAL, int, N), (VAL, int, C), (VAL, int, OC))) \
    X(attention_forward, void, OP, "", 4.0 * B * T * T * C, 8, \
      ((ACT, float *, out), (F32, float *, lse), (ACT, const float *, qkv), (VAL, int, B), (VAL, int, T), \
       (VAL, int, C), (VAL, int, NH), (VAL, int, NKV))) \
    X(attention_backward, void, OP, "", 8.0 * B * T * T * C, 10, \
      ((ACT, float *, dqkv), (ACT, const float *, dout), (ACT, const float *, qkv), (ACT, const float *, out), \
       (F32, const float *, lse), (VAL, int, B), (VAL, int, T), (VAL, int, C), (VAL, int, NH), (VAL, int, NKV))) \
    X(gelu_forward, void, OP, "", 0, 3, ((ACT, float *, out), (ACT, const float *, inp), (VAL, size_t, n))) \
    X(gelu_backward, void, OP, "", 0, 4, \
      ((ACT, float *, dinp), (ACT, const float *, inp), (ACT, const float *, dout), (VAL, size_t, n))) \
    X(residual_forward, void, OP, "", 0, 4, \
      ((ACT, float *, out), (ACT, const float *, a), (ACT, const float *, b), (VAL, size_t, n))) \
    X(accumulate, void, OP, "", 0, 3, ((F32, float *, dst), (F32, const float *, src), (VAL, size_t, n))) \
    X(crossentropy, void, HOST, "", 0, 7, \
      ((F32, float *, losses), (ACT, float *, logits), (I32, const int *, targets), (VAL, int, N), \
       (VAL, int, V), (VAL, int, Vp), (VAL, float, dloss))) \
    X(adamw, void, HOST, "", 0, 6, \
      ((F32, float *, params), (F32, const float *, grads), (F32, float *, m), (F32, float *, v), \
       (VAL, size_t, n), (HP, const loom_adamw_t *, hp))) \
    X(sumsq, double, HOST, "", 0, 2, ((F32, const float *, x), (VAL, size_t, n))) \
    X(graph_begin, loom_status, GRAPH, "the trainer launches the ops each step", 0, 1, ((VAL, int, key))) \
    X(graph_end, loom_status, GRAPH, "the trainer launches the ops each step", 0, 1, ((VAL, int, key))) \
    X(graph_replay, loom_status, GRAPH, "the trainer launches the ops each step", 0, 1, ((VAL, int, key))) \
    X(graph_reset, void, GRAPH, "the trainer launches the ops each step", 0, 0, ()) \
    X(sumsq_dev, void, DEV, "sumsq (the host step)", 0, 3, \
      ((F32, float *, acc), (F32, const float *, x), (VAL, size_t, n))) \
    X(adamw_dev, void, DEV, "adamw (the host step)", 0, 7, \
      ((F32, float *, params), (F32, const float *, grads), (F32, float *, m), (F32, float *, v), \
       (VAL, size_t, n), (HP, const loom_adamw_t *, hp), (F32, const float *, scalars))) \
    X(crossentropy_dev, void, DEV, "crossentropy (the host step)", 0, 7, \
      ((F32, float *, losses), (ACT, float *, logits), (I32, const int *, targets), (VAL, int, N), \
       (VAL, int, V), (VAL, int, Vp), (F32, const float *, scalars))) \
    X(residual_layernorm_forward, void, FUSED, "residual_forward then layernorm_forward", 0, 10, \
      ((ACT, float *, res), (ACT, float *, out), (F32, float *, mean), (F32, float *, rstd), \
       (ACT, const float *, a), (ACT, const float *, b_res), (F32, const float *, w), (F32, const float *, b), \
       (VAL, int, N), (VAL, int, C))) \
    X(matmul_forward_gelu, void, FUSED, "matmul_forward then gelu_forward", 2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, float *, pre), (ACT, const float *, inp), (F32, const float *, w), \
       (F32, const float *, bias), (VAL, int, N), (VAL, int, C), (VAL, int, OC))) \
    X(matmul_backward_gelu, void, FUSED, "matmul_backward into a zeroed dinp, then gelu_backward", \
      4.0 * N * C * OC, 10, \
      ((ACT, float *, dpre), (F32, float *, dw), (F32, float *, dbias), (ACT, const float *, dout), \
       (ACT, const float *, inp), (ACT, const float *, pre), (F32, const float *, w), (VAL, int, N), \
       (VAL, int, C), (VAL, int, OC))) \
    X(embed_positions, void, OP, "", 0, 7, \
      ((ACT, float *, out), (I32, const int *, tokens), (I32, const int *, pos), (F32, const float *, wte), \
       (F32, const float *, wpe), (VAL, int, N), (VAL, int, C))) \
    X(matmul_forward_rows, void, OP, "", 2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, const float *, inp), (F32, const float *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC), (VAL, int, gelu))) \
    X(kv_write, void, OP, "", 0, 7, \
      ((QT, const loom_tensor_t *, kv), (ACT, const float *, qkv), (I32, const int *, slot), (VAL, int, N), \
       (VAL, int, NH), (VAL, int, NKV), (VAL, int, block_size))) \
    X(paged_attention, void, OP, "", 0, 11, \
      ((ACT, float *, out), (ACT, const float *, qkv), (QT, const loom_tensor_t *, kv), \
       (I32, const int *, pos), (I32, const int *, seq), (I32, const int *, block_tables), \
       (VAL, int, max_blocks), (VAL, int, N), (VAL, int, NH), (VAL, int, NKV), (VAL, int, block_size))) \
    X(gather_rows, void, OP, "", 0, 5, \
      ((ACT, float *, out), (ACT, const float *, inp), (I32, const int *, rows), (VAL, int, R), (VAL, int, C))) \
    X(kv_copy_block, void, OP, "", 0, 4, \
      ((QT, const loom_tensor_t *, kv), (VAL, int, src), (VAL, int, dst), (VAL, int, NH))) \
    X(matmul_forward_w8, void, VARIANT, \
      "dequantize w with loom_tensor_dequantize into a scratch buffer, then matmul_forward_rows", \
      2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, const float *, inp), (QT, const loom_tensor_t *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC), (VAL, int, gelu))) \
    X(matmul_forward_w8a8, void, VARIANT, "matmul_forward_w8 (int8 weights, fp32 activations)", \
      2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, const float *, inp), (QT, const loom_tensor_t *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC), (VAL, int, gelu))) \
    X(matmul_forward_s24, void, VARIANT, "matmul_forward_rows on the model's dense (pruned) fp32 weights", \
      2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, const float *, inp), (QT, const loom_tensor_t *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC), (VAL, int, gelu))) \
    X(matmul_forward_kq, void, VARIANT, \
      "dequantize w (a llama.cpp block format, qblock.h) to fp32 at load, then matmul_forward_rows", \
      2.0 * N * C * OC, 8, \
      ((ACT, float *, out), (ACT, const float *, inp), (QT, const loom_tensor_t *, w), (F32, const float *, bias), \
       (VAL, int, N), (VAL, int, C), (VAL, int, OC), (VAL, int, gelu))) \
    X(rmsnorm_forward, void, OP, "", 0, 7, \
      ((ACT, float *, out), (F32, float *, rstd), (ACT, const float *, inp), (F32, const float *, w), \
       (VAL, int, N), (VAL, int, C), (VAL, float, eps))) \
    X(rmsnorm_backward, void, OP, "", 0, 8, \
      ((ACT, float *, dinp), (F32, float *, dw), (ACT, const float *, dout), (ACT, const float *, inp), \
       (F32, const float *, w), (F32, const float *, rstd), (VAL, int, N), (VAL, int, C))) \
    X(rope_forward, void, OP, "", 0, 7, \
      ((ACT, float *, qkv), (I32, const int *, pos), (F32, const float *, freq), (VAL, int, N), \
       (VAL, int, NH), (VAL, int, NKV), (VAL, int, hs))) \
    X(rope_backward, void, OP, "", 0, 7, \
      ((ACT, float *, dqkv), (I32, const int *, pos), (F32, const float *, freq), (VAL, int, N), \
       (VAL, int, NH), (VAL, int, NKV), (VAL, int, hs))) \
    X(swiglu_forward, void, OP, "", 0, 4, \
      ((ACT, float *, out), (ACT, const float *, inp), (VAL, int, N), (VAL, int, H))) \
    X(swiglu_backward, void, OP, "", 0, 5, \
      ((ACT, float *, dinp), (ACT, const float *, inp), (ACT, const float *, dout), (VAL, int, N), (VAL, int, H))) \
    X(vocab_embed_forward, void, OP, "", 0, 9, \
      ((ACT, float *, out), (I32, const int *, tokens), (F32, const float *, wte), (F32, const float *, wpe), \
       (VAL, int, B), (VAL, int, T), (VAL, int, C), (VAL, int, v0), (VAL, int, nv))) \
    X(vocab_embed_backward, void, OP, "", 0, 9, \
      ((F32, float *, dwte), (F32, float *, dwpe), (ACT, const float *, dout), (I32, const int *, tokens), \
       (VAL, int, B), (VAL, int, T), (VAL, int, C), (VAL, int, v0), (VAL, int, nv))) \
    X(vocab_ce_stats, void, OP, "", 0, 7, \
      ((F32, float *, stats), (ACT, const float *, logits), (I32, const int *, targets), (VAL, int, N), \
       (VAL, int, Vp), (VAL, int, v0), (VAL, int, nv))) \
    X(vocab_ce_finish, void, HOST, "", 0, 10, \
      ((F32, float *, losses), (ACT, float *, logits), (I32, const int *, targets), (F32, const float *, stats), \
       (VAL, int, ranks), (VAL, int, N), (VAL, int, Vp), (VAL, int, v0), (VAL, int, nv), (VAL, float, dloss)))
/* clang-format on */

/* ---- helpers to expand the argument lists ---- */

/* LOOM_OP_MAP(F, SEP, nargs, (args)) expands F(tag, type, name) for each
 * argument, with SEP() between them. */
#define LOOM_OP_MAP(F, SEP, n, args) LOOM_OP_APPLY_(LOOM_OP_MAP_##n, (F, SEP, LOOM_OP_STRIP_ args))
#define LOOM_OP_APPLY_(m, a) m a
#define LOOM_OP_STRIP_(...) __VA_ARGS__
#define LOOM_OP_MAP_0(F, S, ...)
#define LOOM_OP_MAP_1(F, S, a) F a
#define LOOM_OP_MAP_2(F, S, a, ...) F a S() LOOM_OP_MAP_1(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_3(F, S, a, ...) F a S() LOOM_OP_MAP_2(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_4(F, S, a, ...) F a S() LOOM_OP_MAP_3(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_5(F, S, a, ...) F a S() LOOM_OP_MAP_4(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_6(F, S, a, ...) F a S() LOOM_OP_MAP_5(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_7(F, S, a, ...) F a S() LOOM_OP_MAP_6(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_8(F, S, a, ...) F a S() LOOM_OP_MAP_7(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_9(F, S, a, ...) F a S() LOOM_OP_MAP_8(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_10(F, S, a, ...) F a S() LOOM_OP_MAP_9(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_11(F, S, a, ...) F a S() LOOM_OP_MAP_10(F, S, __VA_ARGS__)
#define LOOM_OP_MAP_12(F, S, a, ...) F a S() LOOM_OP_MAP_11(F, S, __VA_ARGS__)
#define LOOM_OP_COMMA() ,
#define LOOM_OP_SEMI() ;
#define LOOM_OP_NOSEP()

/* Pieces for F: a parameter declaration, the name alone (a call's
 * arguments), a struct field. */
#define LOOM_OP_PARAM(tag, type, name) type name
#define LOOM_OP_NAME(tag, type, name) name
#define LOOM_OP_FIELD(tag, type, name) type name;

/* The parameter list `(type name, ...)` and argument list `(name, ...)` of
 * an entry; `(void)` / `()` for nargs 0. */
#define LOOM_OP_PARAMS(n, args) (LOOM_OP_MAP_VOID_##n LOOM_OP_MAP(LOOM_OP_PARAM, LOOM_OP_COMMA, n, args))
#define LOOM_OP_ARGS(n, args) (LOOM_OP_MAP(LOOM_OP_NAME, LOOM_OP_COMMA, n, args))
#define LOOM_OP_MAP_VOID_0 void
#define LOOM_OP_MAP_VOID_1
#define LOOM_OP_MAP_VOID_2
#define LOOM_OP_MAP_VOID_3
#define LOOM_OP_MAP_VOID_4
#define LOOM_OP_MAP_VOID_5
#define LOOM_OP_MAP_VOID_6
#define LOOM_OP_MAP_VOID_7
#define LOOM_OP_MAP_VOID_8
#define LOOM_OP_MAP_VOID_9
#define LOOM_OP_MAP_VOID_10
#define LOOM_OP_MAP_VOID_11
#define LOOM_OP_MAP_VOID_12

/* ---- a backend's table, generated from the list ----
 *
 * The kernel of entry `name` on a backend is the function named by a
 * per-backend prefix: loom_cpu_<name> on the CPU (src/backend/cpu/cpu.h),
 * cuda_<name> on CUDA (src/backend/cuda/cuda_internal.h). Each backend
 * declares every kernel with LOOM_OP_KERNEL and fills its table with one
 * LOOM_OPS expansion, so a new entry needs no edit in any table:
 *   - required kinds (MEM, OP, HOST) are declared plainly: a backend that
 *     has no kernel for one fails to link, naming loom_cpu_<name> or
 *     cuda_<name>;
 *   - optional kinds (FUSED, DEV, GRAPH, VARIANT) are declared weak: with
 *     no kernel anywhere the slot is NULL and the model takes the fallback.
 * A weak declaration makes the definition it precedes weak too, which
 * changes nothing while each kernel is defined once. */
#define LOOM_OP_LINK_MEM
#define LOOM_OP_LINK_OP
#define LOOM_OP_LINK_HOST
#define LOOM_OP_LINK_FUSED __attribute__((weak))
#define LOOM_OP_LINK_DEV __attribute__((weak))
#define LOOM_OP_LINK_GRAPH __attribute__((weak))
#define LOOM_OP_LINK_VARIANT __attribute__((weak))
/* `ret fn(params);`, weak for the optional kinds. */
#define LOOM_OP_KERNEL(fn, ret, kind, n, args) ret fn LOOM_OP_PARAMS(n, args) LOOM_OP_LINK_##kind;

/* 1 for the kinds every backend must fill. */
#define LOOM_OP_REQUIRED_MEM 1
#define LOOM_OP_REQUIRED_OP 1
#define LOOM_OP_REQUIRED_HOST 1
#define LOOM_OP_REQUIRED_FUSED 0
#define LOOM_OP_REQUIRED_DEV 0
#define LOOM_OP_REQUIRED_GRAPH 0
#define LOOM_OP_REQUIRED_VARIANT 0

#endif
