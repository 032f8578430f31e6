/* cpu_paged: the CPU implementation of the paged-cache ops (backend/paged.h).
 * Internal to src/backend/cpu/. */
#ifndef LOOM_CPU_PAGED_H
#define LOOM_CPU_PAGED_H

#include "backend/paged.h"

/* The CPU's table of paged ops (static, never freed). */
const loom_paged_ops_t *loom_cpu_paged_ops(void);

#endif
