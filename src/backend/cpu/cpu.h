/* cpu: the CPU backend's kernels, one per entry of src/backend/ops.h,
 * declared from the list: the kernel of entry X is loom_cpu_X (weak for
 * the optional kinds, so an entry the CPU lacks is a NULL slot). cpu.c
 * fills the table from the same list; a file that defines kernels
 * includes this header, so a definition that disagrees with its ops.h
 * row does not compile. The contracts are in backend.h. */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include "backend/backend.h"

#define LOOM_CPU_KERNEL_(name, ret, kind, fallback, flops, n, args) \
    LOOM_OP_KERNEL(loom_cpu_##name, ret, kind, n, args)
LOOM_OPS(LOOM_CPU_KERNEL_)
#undef LOOM_CPU_KERNEL_

#endif
