/* cpu_isa: the instruction sets this CPU offers, read from cpuid (whatever
 * -march said at build time), the one probe the kernels choose their paths
 * from (cpu_gemm.c, cpu_int8.c, cpu_paged.c). */
#ifndef LOOM_CPU_ISA_H
#define LOOM_CPU_ISA_H

enum {
    LOOM_ISA_AVX2 = 1u << 0,        /* AVX2 with FMA */
    LOOM_ISA_AVX512 = 1u << 1,      /* AVX-512 F */
    LOOM_ISA_AVXVNNI = 1u << 2,     /* AVX-VNNI, with AVX2 and FMA */
    LOOM_ISA_AVX512VNNI = 1u << 3,  /* AVX-512 F, BW and VNNI */
};

/* 1 when this CPU has every set in `isa` (LOOM_ISA_* bits); 0 off x86-64. */
int loom_cpu_has(unsigned isa);

#endif
