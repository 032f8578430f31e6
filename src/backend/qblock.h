/* qblock: llama.cpp's (ggml's) block-quantized weight formats, as a GGUF
 * file stores them and as loom computes with them (never re-quantized).
 *
 * A row of `cols` values is cols / block consecutive blocks (all fields
 * little-endian; fp16 scales are IEEE half):
 *
 *   type  ggml  values bytes  layout                               value i
 *   q4_0    2     32    18    d, qs[16]                            d * (q - 8)
 *   q4_1    3     32    20    d, m, qs[16]                         d * q + m
 *   q5_0    6     32    22    d, qh (uint32), qs[16]               d * (q - 16)
 *   q5_1    7     32    24    d, m, qh, qs[16]                     d * q + m
 *   q4_K   12    256   144    d, dmin, scales[12], qs[128]         d * sc_j * q - dmin * m_j
 *   q5_K   13    256   176    d, dmin, scales[12], qh[32], qs[128] d * sc_j * q - dmin * m_j
 *   q6_K   14    256   210    ql[128], qh[64], scales[16] (int8), d  d * sc_k * (q - 32)
 *
 * 4-bit values: in a 32-block, value j < 16 is the low nibble of qs[j],
 * value j >= 16 the high nibble of qs[j - 16]; in a k-quant, each 64-value
 * chunk c uses qs[32c .. 32c + 31], low nibbles then high nibbles. q5
 * types add bit j of qh (q5_K: bit j/32 of qh[j % 32]) as the fifth bit.
 * q4_K/q5_K have 8 sub-blocks of 32 values with 6-bit scale sc_j and min
 * m_j packed in 12 bytes; q6_K has 16 sub-blocks of 16 with int8 scales,
 * values from 4 low bits (ql) and 2 high bits (qh) per 128-value half.
 * docs/quantization.md has the byte-level detail and the memory costs.
 *
 * The dequantized values are those of the gguf Python package
 * (gguf.quants.dequantize), bit for bit: the same float operations in the
 * same order, without fused multiply-adds. */
#ifndef LOOM_QBLOCK_H
#define LOOM_QBLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct {
    const char *name; /* ggml's name: "q4_K" */
    uint32_t ggml;    /* the GGUF tensor type */
    int block;        /* values per block */
    int bytes;        /* bytes per block */
} loom_qblock_info_t;

/* The format of block type `d` (LOOM_Q4_0 ... LOOM_Q6_K), or NULL when d is
 * not a block type. */
const loom_qblock_info_t *loom_qblock_info(loom_dtype d);
/* The loom dtype of GGUF tensor type `ggml`, or -1 when it is not one of
 * the block types above. */
int loom_qblock_of_ggml(uint32_t ggml);
/* Bytes of a row of `cols` values (cols a multiple of the block). */
size_t loom_qblock_row_bytes(loom_dtype d, long long cols);
/* Bytes of typed tensor t's data and scales: whole blocks for a block
 * format, values plus fp32 scales for int8, values for the rest. */
size_t loom_qblock_tensor_bytes(const loom_tensor_t *t);
/* n values (a multiple of the block) from src into out, as
 * gguf.quants.dequantize computes them. */
void loom_qblock_dequantize(loom_dtype d, const void *src, size_t n, float *out);

/* One block in the form every kernel computes with: value i of the block
 * is d * sc[i / 16] * u[i] - dmin * mn[i / 16] (real arithmetic), with
 * u in 0..63, integer scales and mins per 16 values. A 32-value block
 * (q4_0 ... q5_1) fills n = 32 and two groups; q4_0 is d * u - d * 8,
 * q4_1 d * u - (-m) * 1, q6_K d * sc * u - d * (32 * sc). */
typedef struct {
    int n;             /* values: 32 or 256 */
    float d, dmin;
    int16_t sc[16];    /* per 16 values: |sc| <= 127 */
    int16_t mn[16];    /* per 16 values: |mn| <= 4096 */
} loom_qblock_scales_t;

/* 8 rows interleaved (LOOM_LAYOUT_ROWS8; q4_K, q6_K and the 32-value
 * formats): rows 8g .. 8g + 7 keep their place (8 x row bytes) but block
 * b of all 8 becomes one group block of 8 x the block's bytes at 8 b x
 * bytes, each field of the 8 rows side by side, bytes of the values 4 at
 * a time (so 32 bytes hold 4 bytes of each row and a product's 8 rows
 * come out in the 8 int32 lanes of a vector). Row r's fields, in a group
 * block:
 *   q4_K (1152 bytes): d at 2r, dmin at 16 + 2r; scales byte k (0..11) at
 *     32 + 8k + r; qs bytes 4i .. 4i + 3 of chunk c (0..3) at
 *     128 + 256c + 32i + 4r
 *   q6_K (1680 bytes): d at 2r; scale g (0..15) at 16 + 8g + r; ql bytes
 *     4i .. 4i + 3 of quarter q (0..3: 32 bytes each) at
 *     144 + 256q + 32i + 4r; qh bytes 4i .. 4i + 3 of half h at
 *     1168 + 256h + 32i + 4r
 *   q4_0, q4_1, q5_0, q5_1 (144, 160, 176, 192 bytes): d at 2r; then m
 *     (q4_1, q5_1) at 16 + 2r; then qh (q5_0, q5_1: 4 bytes) at
 *     A + 4r; then qs bytes 4p .. 4p + 3 (p 0..3) at Q + 32p + 4r (A, Q:
 *     the bytes of the fields before them) */
/* 1 when format d may be interleaved with `rows` rows. */
int loom_qblock_rows8_ok(loom_dtype d, long long rows);
/* Rows x cols of format d in data (loom_qblock_rows8_ok) from dense to 8
 * rows interleaved, in place (LOOM_ENOMEM when 8 rows' scratch cannot be
 * had: data unchanged). */
loom_status loom_qblock_rows8(loom_dtype d, void *data, long long rows, long long cols);
/* Row r (0..7) of group block g as a dense block: its bytes into blk. */
void loom_qblock_rows8_block(loom_dtype d, const void *g, int r, void *blk);
/* 1 when typed tensor t may take LOOM_LAYOUT_ROWS8: a block format of
 * loom_qblock_rows8_ok, or q8_0 as loom holds it (int8 in blocks of 32;
 * block b of rows 8g .. 8g + 7 is then 256 bytes at 8 g cols + 256 b, value
 * 4p + i of row r at 32p + 4r + i; its 8 scales at 8 g nb + 8 b + r), rows a
 * multiple of 8. */
int loom_tensor_rows8_ok(const loom_tensor_t *t);
/* t (dense, loom_tensor_rows8_ok) to 8 rows interleaved in place, its
 * layout then LOOM_LAYOUT_ROWS8 (LOOM_ENOMEM: t unchanged). */
loom_status loom_tensor_rows8(loom_tensor_t *t);
/* The dense int8 values (rows x cols) and block scales of int8 tensor t
 * held 8 rows interleaved. */
void loom_tensor_rows8_dense(const loom_tensor_t *t, int8_t *q, float *scales);
/* Block b of row r of block-format tensor t as dense bytes: in place, or
 * (8 rows interleaved) gathered into tmp (the largest block's bytes). */
const uint8_t *loom_qblock_at(const loom_tensor_t *t, long long r, long long b, uint8_t *tmp);
/* Row r of typed block-format tensor t (dense or 8 rows interleaved) as
 * gguf.quants.dequantize computes it, or of an int8 tensor (each value
 * times its scale): t->cols values into out. */
void loom_qblock_row_values(const loom_tensor_t *t, long long r, float *out);

/* The scales and mins of block `blk`. */
void loom_qblock_scales(loom_dtype d, const void *blk, loom_qblock_scales_t *s);
/* The unsigned values u[0 .. block) of block `blk` (portable C). */
void loom_qblock_values(loom_dtype d, const void *blk, uint8_t *u);

#endif
