/* mem: bytes held per subsystem, in the manner of redis's zmalloc
 * accounting but split by owner, so that a test (and `loom plan`) can
 * compare what the model and optimizer really allocate with what was
 * planned. Allocation sites call loom_mem_count(kind, +bytes) and
 * (kind, -bytes) on free; nothing else changes how memory is obtained.
 *
 * With LOOM_MEM_REPORT=PATH in the environment, every process appends one
 * JSON line to PATH at exit: its pid, the RANK variable, the highest total
 * counted, each kind's bytes at that moment, and the process's peak
 * resident set (VmHWM from /proc/self/status). */
#ifndef LOOM_MEM_H
#define LOOM_MEM_H

#include <stddef.h>

typedef enum {
    LOOM_MEM_PARAMS, /* the model's parameter block */
    LOOM_MEM_GRADS,  /* the gradient block */
    LOOM_MEM_OPTIM,  /* AdamW moments (whole, or this rank's ZeRO shard) */
    LOOM_MEM_ACTS,   /* the activation block */
    LOOM_MEM_BATCH,  /* token and target ids on the device, per-position losses on the host */
    LOOM_MEM_KINDS
} loom_mem_kind;

/* Add `bytes` (negative on free) to `kind`'s count. Thread-safe. */
void loom_mem_count(loom_mem_kind kind, long long bytes);
/* Bytes `kind` holds now. */
size_t loom_mem_current(loom_mem_kind kind);
/* Each kind's bytes at the moment the sum over kinds was highest; returns that sum. */
size_t loom_mem_at_peak(size_t out[LOOM_MEM_KINDS]);
/* "params", "grads", "optim", "acts", "batch". */
const char *loom_mem_name(loom_mem_kind kind);
/* Peak resident set of this process in bytes (VmHWM; getrusage as a fallback). */
double loom_mem_peak_rss(void);

#endif
