/* gguf_file: a GGUF v2/v3 file mapped read-only, parsed and checked
 * before anything reads a weight (the format itself is in gguf.h).
 *
 * Opening refuses, naming the file, the tensor or key, and what to do:
 *   - a wrong magic, a version other than 2 or 3, a header, metadata or
 *     tensor list that runs past the end of the file;
 *   - a tensor type loom does not read (it reads f32, f16, bf16, q8_0,
 *     q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K);
 *   - a row that is not whole blocks of its type, 0 or more than 4
 *     dimensions, a size that overflows, a duplicate name, an offset off
 *     the file's alignment;
 *   - a file cut inside a tensor (its bytes end past the end of the file);
 *   - tensors that overlap, two tensors at one offset, and a tensor whose
 *     type and shape do not account for the bytes the file gives it (the
 *     span up to the next tensor, or to the end of the file, is longer by
 *     a whole alignment or more: a tensor written in another type). */
#ifndef LOOM_GGUF_FILE_H
#define LOOM_GGUF_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* GGUF metadata value types (gguf-py GGUFValueType). */
enum { LOOM_GV_U8, LOOM_GV_I8, LOOM_GV_U16, LOOM_GV_I16, LOOM_GV_U32, LOOM_GV_I32, LOOM_GV_F32, LOOM_GV_BOOL,
       LOOM_GV_STR, LOOM_GV_ARR, LOOM_GV_U64, LOOM_GV_I64, LOOM_GV_F64 };
/* ggml tensor types loom reads by number (the block formats: qblock.h). */
enum { LOOM_GT_F32 = 0, LOOM_GT_F16 = 1, LOOM_GT_Q8_0 = 8, LOOM_GT_BF16 = 30 };

typedef struct {
    char name[96];
    uint32_t type;    /* ggml type */
    uint32_t ndim;
    uint64_t ne[4];   /* ne[0] contiguous: a matrix (rows, cols) is [cols, rows] */
    uint64_t offset;  /* in the data section */
    uint64_t numel;
    size_t bytes;     /* as its type and shape make it */
    const void *data; /* in the mapping */
} loom_gguf_tensor_t;

/* A metadata array: element type, count and its first element. */
typedef struct {
    uint32_t elem;
    uint64_t count;
    const unsigned char *val;
} loom_gguf_array_t;

typedef struct loom_gguf loom_gguf_t;

/* Map `path`, parse and check it (the list above). */
loom_status loom_gguf_open(loom_gguf_t **out, const char *path);
void loom_gguf_close(loom_gguf_t *g);
const char *loom_gguf_path(const loom_gguf_t *g);

int loom_gguf_ntensors(const loom_gguf_t *g);
const loom_gguf_tensor_t *loom_gguf_tensor_at(const loom_gguf_t *g, int i);
/* Tensor `name`, or NULL. */
const loom_gguf_tensor_t *loom_gguf_find(const loom_gguf_t *g, const char *name);
/* ggml's name of a type ("q4_K", "f32"), or NULL when loom does not read it. */
const char *loom_gguf_type_name(uint32_t ggml);
/* Ask the system to read the data section ahead (a file not yet in the
 * page cache is then read in large sequential requests). */
void loom_gguf_prefetch(const loom_gguf_t *g);
/* Give back the whole pages of the mapping inside [p, p + bytes) (part
 * of a tensor's data) once they are read: the process's resident memory
 * then holds the copies it keeps, not the file as well (the bytes stay
 * readable: their pages come back from the page cache). */
void loom_gguf_drop(const void *p, size_t bytes);
/* t's numel values as floats, dequantized as gguf.quants.dequantize does
 * (bit for bit). */
void loom_gguf_values(const loom_gguf_tensor_t *t, float *out);

/* Metadata: 1 and the value when `key` is present with a type that fits,
 * else 0. Integers of any integer type; floats f32 or f64; strings as a
 * malloc'd C string (NULL when absent). */
int loom_gguf_int(const loom_gguf_t *g, const char *key, long long *out);
int loom_gguf_float(const loom_gguf_t *g, const char *key, double *out);
char *loom_gguf_str(const loom_gguf_t *g, const char *key);
int loom_gguf_array(const loom_gguf_t *g, const char *key, loom_gguf_array_t *a);
/* The next string of a string array: *cur starts at a->val; NULL past
 * the end of the file. */
const unsigned char *loom_gguf_next_str(const loom_gguf_t *g, const unsigned char **cur, uint64_t *len);

#endif
