#include "cpu_isa.h"

#if defined(__x86_64__) && defined(__clang__) && __clang_major__ < 15
#include <cpuid.h>
/* clang before 15 has no "avxvnni" for __builtin_cpu_supports (the
 * libFuzzer build, bench/fuzz-libfuzzer.sh): CPUID leaf 7, subleaf 1, EAX bit 4. */
static int has_avxvnni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}
#else
#define has_avxvnni() __builtin_cpu_supports("avxvnni")
#endif

/* The sets, probed once (-1: not yet). A race only probes twice. */
static int isa = -1;

static int probe(void) {
    int v = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) v |= LOOM_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f")) v |= LOOM_ISA_AVX512;
    if (avx2 && has_avxvnni()) v |= LOOM_ISA_AVXVNNI;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        v |= LOOM_ISA_AVX512VNNI;
#endif
    return v;
}

int loom_cpu_has(unsigned want) {
    int v = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (v < 0) __atomic_store_n(&isa, v = probe(), __ATOMIC_RELAXED);
    return ((unsigned)v & want) == want;
}
