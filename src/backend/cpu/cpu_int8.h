/* cpu_int8: the CPU's int8 weight variants (ops.h VARIANT rows
 * matmul_forward_w8 and matmul_forward_w8a8). */
#ifndef LOOM_CPU_INT8_H
#define LOOM_CPU_INT8_H

#include "backend/backend.h"

/* out (N,OC) = inp (N,C) @ dequant(w (OC,C) int8)^T + bias, then GELU when
 * gelu != 0: the weight's int8 values are widened and scaled (per row, or
 * per block of w->block) in the kernel: the same bits as the fp32 row
 * kernel on the dequantized weight. */
void loom_cpu_matmul_forward_w8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                int N, int C, int OC, int gelu);
/* The same with each row of inp quantized to int8 on the fly (one scale
 * per token: max |x| / 127), int32 dot products (AVX-512 VNNI, AVX-VNNI,
 * AVX2 or portable C, the best the CPU has), then out = dot * sx[n] *
 * sw[o] + bias; with per-block scales each block's int32 sum is multiplied
 * by its scale: out = sx[n] * sum_b dot_b * sw[o, b] + bias. */
void loom_cpu_matmul_forward_w8a8(float *out, const float *inp, const loom_tensor_t *w, const float *bias,
                                  int N, int C, int OC, int gelu);
/* Per-token quantization of x (N,C): q (N,C) int8, s (N) scales (0 rows
 * get scale 1 and zeros). Round to nearest, ties away from zero. */
void loom_cpu_quantize_rows(const float *x, int N, int C, signed char *q, float *s);
/* The instruction set the W8A8 kernel uses: "avx512vnni", "avxvnni",
 * "avx2" or "portable" (LOOM_NO_VNNI=1 in the environment stops at avx2). */
const char *loom_cpu_int8_isa(void);
/* Use instruction set `name` (a name above) from now on: 1, or 0 when this
 * CPU lacks it (nothing changes); NULL: back to the best one. For tests
 * and benchmarks. */
int loom_cpu_int8_use(const char *name);

/* The paged-cache ops (backend.h) on an int8 cache: kv's int8 rows with one
 * scale per row (block, K or V, head; kv->scales, written here). A row's
 * scale is set by its first token (offset 0) and raised when a later token
 * is larger, the earlier tokens requantized to it. cpu_paged.c calls these
 * for kv->dtype == LOOM_INT8 (and reads the cache in its attention loop). */
void loom_cpu_kv_write_int8(const loom_tensor_t *kv, const float *qkv, const int *slot, int N, int NH, int NKV, int bs);
void loom_cpu_kv_copy_block_int8(const loom_tensor_t *kv, int src, int dst, int NH);

#endif
