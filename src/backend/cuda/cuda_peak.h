/* cuda_peak: peak dense FLOP/s of NVIDIA GPUs per precision, for MFU. Pure C
 * with no CUDA calls, so it builds (and is tested) without CUDA too.
 *
 * Two rules, and the source string says which one was used:
 * 1. a table of known products, matched on the CUDA device name, holding the
 *    vendor's dense (not 2:4 sparse) tensor rates;
 * 2. for a name not in the table, or a MIG slice (whose name contains
 *    "MIG"), SMs x clock x per-SM dense rate of the architecture (from the
 *    compute capability); GeForce parts run fp16/bf16 with fp32 accumulate
 *    at half the rate of their data-center siblings.
 * A result is never negative; 0 means unknown (and the source says why). */
#ifndef LOOM_CUDA_PEAK_H
#define LOOM_CUDA_PEAK_H

#include <stddef.h>

#include "backend/backend.h"

typedef struct {
    char name[256];   /* CUDA device name, e.g. "NVIDIA A100-SXM4-80GB" */
    int cc_major, cc_minor;
    int sms;          /* streaming multiprocessors (of the slice, under MIG) */
    int clock_khz;    /* peak SM clock */
} loom_cuda_gpu_t;

/* Peak dense FLOP/s of `gpu` for matrix work at `dtype` (fp32 = no tensor
 * cores, tf32/bf16/fp16 = tensor cores with fp32 accumulate). Writes a
 * one-line description of the rule and numbers into source. */
double loom_cuda_peak_flops(const loom_cuda_gpu_t *gpu, loom_dtype dtype, char *source,
                            size_t source_size);

/* Whether a CUDA device name is a MIG slice. */
int loom_cuda_name_is_mig(const char *name);

#endif
