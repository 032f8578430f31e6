/* cpu_math: branch-free float exp and GELU that the compiler vectorizes
 * (glibc's expf and tanhf are scalar calls). Internal to src/backend/cpu/.
 * exp: Cody-Waite reduction and Cephes' degree-6 polynomial, within 2 ulp
 * on [-87, 88]; below -87.3 it returns 0, above 88.7 it saturates. */
#ifndef LOOM_CPU_MATH_H
#define LOOM_CPU_MATH_H

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline float loom_expf(float x) {
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: round to nearest */
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t ti, e;
    memcpy(&ti, &t, 4);
    e = (ti - 0x4B400000 + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return x < -87.3f ? 0.0f : p * s;
}

#define LOOM_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* GELU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = k (x + 0.044715 x^3). */
static inline float loom_gelu(float x) {
    float u = LOOM_GELU_K * (x + 0.044715f * x * x * x);
    return x / (1.0f + loom_expf(-2.0f * u));
}

/* d gelu / dx, with tanh(u) = 2 s - 1 and sech^2(u) = 4 s (1 - s), s = sigmoid(2u). */
static inline float loom_gelu_grad(float x) {
    float u = LOOM_GELU_K * (x + 0.044715f * x * x * x);
    float s = 1.0f / (1.0f + loom_expf(-2.0f * u));
    float th = 2.0f * s - 1.0f, sech2 = 4.0f * s * (1.0f - s);
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * LOOM_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* An instruction-set switch for kernels that dispatch on cpuid (cpu_int8.c,
 * cpu_kquant.c): names[0..n) the sets, supported(i) whether this CPU has
 * set i, *now the one in use (-1: the caller picks the best on next use).
 * Name NULL: back to the best (1); else 1 and *now = that set, or 0 when
 * the name is unknown or the CPU lacks it (nothing changes). */
static inline int loom_cpu_isa_use(const char *const *names, int n, int (*supported)(int), int *now, const char *name) {
    if (!name) {
        *now = -1;
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(name, names[i]) && supported(i)) {
            *now = i;
            return 1;
        }
    return 0;
}

#if defined(__x86_64__)
/* Fixed-order sum of the 8 lanes: the order the fp32 row kernels
 * (cpu_paged.c) and the int8 tiles' per-block sums (cpu_int8.c) use. */
__attribute__((target("avx2,fma"))) static inline float loom_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The same for int32 lanes (exact, so any order would do; one copy for
 * the int8 and k-quant kernels). */
__attribute__((target("avx2"))) static inline int32_t loom_hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif

#endif
