/* gguf_map: where each tensor of a GGUF model goes in loom's parameters,
 * for general.architecture gpt2 and the Llama family (llama, qwen2).
 *
 * GPT-2 is tensormap.h's table. The Llama family splits what loom fuses:
 *
 *   GGUF (llama, qwen2)            loom                       rows
 *   token_embd.weight              wte                        V
 *   output.weight (absent: tied)   lm_head                    V
 *   output_norm.weight             lnfw                       C
 *   blk.N.attn_norm.weight         ln1w                       C
 *   blk.N.attn_q/k/v.weight        qkvw: q, then k, then v    NH*hs, KV*hs, KV*hs
 *   blk.N.attn_q/k/v.bias (qwen2)  qkvb, the same order
 *   blk.N.attn_output.weight       attprojw                   C
 *   blk.N.ffn_norm.weight          ln2w                       C
 *   blk.N.ffn_gate/up.weight       fcw: gate, then up         H, H
 *   blk.N.ffn_down.weight          fcprojw                    C (H columns)
 *
 * llama.cpp's converter reorders the rows of attn_q and attn_k for the
 * `llama` architecture (its RoPE rotates adjacent pairs, Hugging Face's
 * the two halves of each head): within each head of hs rows, Hugging
 * Face's row a * hs/2 + i is the file's row 2i + a. Reading undoes it,
 * writing does it (qwen2 files keep Hugging Face's order). A row of a
 * block format holds its own scales, so reordering rows never touches a
 * value. */
#ifndef LOOM_GGUF_MAP_H
#define LOOM_GGUF_MAP_H

#include "ckpt/gguf_file.h"
#include "model/gpt.h"

typedef struct {
    char gguf[64];
    int param, layer;        /* loom parameter and layer (-1: not per layer) */
    size_t row0, rows, cols; /* rows row0 .. row0+rows-1 of that (R, cols) matrix; cols 0: a vector */
    int rope_heads;          /* > 0: the file holds the rows in llama.cpp's rotary order for this many heads */
    int qlin;                /* LOOM_QLIN_* of a linear weight, else -1 */
} loom_gguf_map_t;

/* The config from the file's metadata (gpt2.*, llama.*, qwen2.*) and its
 * tensors' shapes; another architecture, or a feature loom's model does
 * not have (partial rotary, YaRN scaling), is refused naming the key. */
loom_status loom_gguf_config(const loom_gguf_t *g, loom_gpt_config_t *c);
/* Llama 3's RoPE scaling as llama.cpp holds it (rope_freqs.weight):
 * head size / 2 divisors of the unscaled frequencies, 1 where kept. */
void loom_gguf_rope_divisors(const loom_gpt_config_t *c, float *out);
/* The tensors of config c for architecture `arch` ("gpt2", "llama",
 * "qwen2"), malloc'd into *out; returns the count. */
int loom_gguf_map(const loom_gpt_config_t *c, const char *arch, loom_gguf_map_t **out);
/* The file's row that holds loom's row r of entry m (rotary order undone). */
size_t loom_gguf_file_row(const loom_gguf_map_t *m, size_t r);
/* Where entry m's first row lives in a parameter block laid out by ptable
 * (in floats). */
size_t loom_gguf_param_at(const loom_gguf_map_t *m, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable);
/* Every mapped tensor, dequantized, into host (the parameter block laid
 * out by ptable, zeroed by the caller); a missing or misshapen tensor, or
 * a NaN or infinite value, is an error naming it. */
loom_status loom_gguf_read_params(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable,
                                  float *host);
/* The same, less the tensors whose every use on the inference path the
 * file's stored weights `stored` (loom_gguf_file_weights; NULL: none)
 * serve: linear weights stored in blocks, the head, a rotary model's
 * embedding. Those stay zero in host (loom_gguf_blocks_fp32 makes them).
 * *floats (NULL: not counted) += the values read. */
loom_status loom_gguf_read_params_except(const loom_gguf_t *g, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable,
                                         float *host, const loom_tensor_t *stored, size_t *floats);
/* The file's linear weights as stored (gpt.h file_q) into *out: those in
 * the block formats (q8_0 among them as int8 with fp32 scales per block
 * of 32), or NULL when none is. Each tensor's bytes are read once from the
 * mapping into their place (rows in loom's order, by all threads) and its
 * pages of the mapping given back; every block's fp16 scales are checked
 * on the way (finite scales make finite values, gguf_map.c scale_fields):
 * a NaN or infinite one, or a missing or misshapen tensor, is an error
 * naming it. A fused weight (qkv, gate + up) whose parts differ in type
 * is left out (data NULL) and counted in *mixed. After the (L, 4) linear
 * weights come two more tensors (gpt.h file_q): the embedding
 * (token_embd) and the head (output, or token_embd again when tied) when
 * stored in a block format or q8_0, else data NULL; then
 * LOOM_FILE_Q_PARTS part slots per linear weight: a fused weight whose
 * parts are each in a block format or q8_0 but not one type (a Q4_K_M
 * file's q4_K attn_q beside q6_K attn_v) has data NULL in its slot and
 * its parts there, in order (rows in loom's order); those are not
 * counted in *mixed. */
loom_status loom_gguf_file_weights(const loom_gguf_t *g, const loom_gpt_config_t *c, loom_tensor_t **out, int *mixed);
/* The fp32 values of the weights loom_gguf_read_params_except left out,
 * made from the stored ones (fq: loom_gguf_file_weights') into host, bit
 * for bit what loom_gguf_read_params reads; rows split over the threads.
 * ends_only: the embedding and the head only. */
void loom_gguf_blocks_fp32(const loom_tensor_t *fq, const loom_gpt_config_t *c, const loom_tensor_info_t *ptable, float *host,
                           int ends_only);

#endif
