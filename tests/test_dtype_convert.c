/* test_dtype_convert: the host conversions between fp32 and the 16-bit
 * storage types (loom_dtype_to_f32, loom_dtype_from_f32), which the CPU
 * reference of every 16-bit ACT tensor goes through (tests, the simulated
 * bf16 device, loom_backend_download_act).
 *
 * Oracles: for fp16 the compiler's _Float16 conversion (hardware or
 * libgcc round to nearest even); for bf16 the nearest of the two bf16
 * neighbours computed in double, ties to the even one. Both on edge
 * values (ties, subnormals, overflow, inf, NaN) and 200000 random floats
 * over the whole exponent range; every 16-bit pattern widens and narrows
 * back to itself. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The bf16 nearest to f: the candidates are f with its low 16 bits cut
 * (toward zero) and the next bf16 away from zero; ties go to the even
 * mantissa. Compared in double, where both differences are exact. */
static uint16_t bf16_oracle(float f) {
    if (isnan(f)) return 0x7fc0;
    if (isinf(f)) return (uint16_t)(f_bits(f) >> 16);
    uint32_t lo = f_bits(f) & 0xffff0000u, hi = lo + 0x10000u;
    /* past the largest bf16 the next value up is 2^128 (rounding there overflows to inf) */
    double vh = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(ldexp(1.0, 128), f) : (double)bits_f(hi);
    double dl = fabs((double)f - (double)bits_f(lo)), dh = fabs(vh - (double)f);
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static uint16_t half_oracle(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static int same16(uint16_t a, uint16_t b, loom_dtype d) {
    /* NaNs compare as NaN, whatever their payload */
    uint16_t exp = d == LOOM_BF16 ? 0x7f80 : 0x7c00, man = d == LOOM_BF16 ? 0x7f : 0x3ff;
    int na = (a & exp) == exp && (a & man), nb = (b & exp) == exp && (b & man);
    return na || nb ? na == nb : a == b;
}

static int check_one(loom_dtype d, float f) {
    uint16_t got, want = d == LOOM_BF16 ? bf16_oracle(f) : half_oracle(f);
    loom_dtype_from_f32(&got, &f, d, 1);
    if (same16(got, want, d)) return 1;
    CHECK(0, "%s(%.9g = 0x%08x): got 0x%04x, want 0x%04x", loom_dtype_name(d), f, f_bits(f), got, want);
    return 0;
}

static void rounding_matches_oracle(void) {
    const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f, 1.001953125f, 1.0009765625f, 1.00048828125f,
                          65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e-8f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                          3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN, 1.17549435e-38f, 1e-45f};
    unsigned long long state = 0x9e3779b97f4a7c15ull;
    for (int d = LOOM_BF16; d <= LOOM_FP16; d++) {
        int bad = 0;
        for (size_t i = 0; i < sizeof edge / sizeof edge[0] && bad < 5; i++) bad += !check_one(d, edge[i]);
        for (int i = 0; i < 200000 && bad < 5; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(state >> 32);
            if (i % 2) u = (u & 0x8000ffffu) | ((uint32_t)(100 + (u >> 16) % 60) << 23); /* fp16's range, densely */
            bad += !check_one(d, bits_f(u));
        }
        /* ties exactly halfway between two 16-bit values */
        for (uint32_t m = 0; m < 4096 && bad < 5; m++) {
            float f = d == LOOM_BF16 ? bits_f(0x3f800000u | (m << 16) | 0x8000u) : 1.0f + ((float)m + 0.5f) / 1024.0f;
            bad += !check_one(d, f);
        }
    }
}

static void every_pattern_round_trips(void) {
    for (int d = LOOM_BF16; d <= LOOM_FP16; d++) {
        int bad = 0;
        for (uint32_t p = 0; p < 65536 && bad < 5; p++) {
            uint16_t in = (uint16_t)p, out;
            float f;
            loom_dtype_to_f32(&f, &in, d, 1);
            loom_dtype_from_f32(&out, &f, d, 1);
            if (!same16(in, out, d)) {
                bad++;
                CHECK(0, "%s 0x%04x -> %.9g -> 0x%04x", loom_dtype_name(d), in, f, out);
            }
            if (d == LOOM_FP16 && !isnan(f)) {
                _Float16 h;
                memcpy(&h, &in, 2);
                CHECK(f == (float)h, "fp16 0x%04x widens to %.9g, the compiler says %.9g", in, f, (float)h);
            }
        }
    }
}

int main(void) {
    RUN(rounding_matches_oracle);
    RUN(every_pattern_round_trips);
    return check_main_end();
}
