/* cuda_peak: peak dense FLOP/s per GPU and precision (see cuda_peak.h). */
#include "cuda_peak.h"

#include <stdio.h>
#include <string.h>

/* Vendor datasheet rates in TFLOP/s, dense (2:4 sparse figures halved),
 * fp32 accumulate: fp32 (CUDA cores), tf32, bf16, fp16 (tensor cores).
 * 0 = the GPU has no such tensor cores. sms_full is the whole chip's SM
 * count, used to scale a MIG slice (0 = MIG not offered). The first entry
 * whose pattern matches wins, so more specific names come first. */
typedef struct {
    const char *pattern, *label;
    double tflops[4];
    int sms_full;
} peak_entry;

static const peak_entry peak_table[] = {
    {"H100 NVL", "NVIDIA H100 NVL", {60, 417.5, 835.5, 835.5}, 132},
    {"H100 PCIe", "NVIDIA H100 PCIe", {51.2, 378, 756, 756}, 114},
    {"H100", "NVIDIA H100 SXM", {67, 494.7, 989.4, 989.4}, 132},
    {"H800", "NVIDIA H800 SXM", {67, 494.7, 989.4, 989.4}, 132},
    {"H200 NVL", "NVIDIA H200 NVL", {60, 417.5, 835.5, 835.5}, 132},
    {"H200", "NVIDIA H200 SXM", {67, 494.7, 989.4, 989.4}, 132},
    {"GH200", "NVIDIA GH200", {67, 494.7, 989.4, 989.4}, 132},
    {"B200", "NVIDIA B200", {75, 1125, 2250, 2250}, 148},
    {"A100", "NVIDIA A100", {19.5, 156, 312, 312}, 108},
    {"A30", "NVIDIA A30", {10.3, 82, 165, 165}, 56},
    {"A40", "NVIDIA A40", {37.4, 74.8, 149.7, 149.7}, 0},
    {"A10", "NVIDIA A10", {31.2, 62.5, 125, 125}, 0},
    {"RTX A6000", "NVIDIA RTX A6000", {38.7, 77.4, 154.8, 154.8}, 0},
    {"L40S", "NVIDIA L40S", {91.6, 183, 362, 362}, 0},
    {"L40", "NVIDIA L40", {90.5, 90.5, 181, 181}, 0},
    {"L4", "NVIDIA L4", {30.3, 60, 121, 121}, 0},
    {"RTX 4090", "NVIDIA GeForce RTX 4090", {82.6, 82.6, 165.2, 165.2}, 0},
    {"RTX 3090 Ti", "NVIDIA GeForce RTX 3090 Ti", {40, 40, 80, 80}, 0},
    {"RTX 3090", "NVIDIA GeForce RTX 3090", {35.6, 35.6, 71, 71}, 0},
    {"V100S", "NVIDIA V100S", {16.4, 0, 0, 130}, 0},
    {"V100-PCIE", "NVIDIA V100 PCIe", {14, 0, 0, 112}, 0},
    {"V100", "NVIDIA V100 SXM2", {15.7, 0, 0, 125}, 0},
    {"T4", "NVIDIA T4", {8.1, 0, 0, 65}, 0},
};
#define NPEAK (int)(sizeof peak_table / sizeof peak_table[0])

/* Dense FLOP per clock per SM by architecture, data-center parts:
 * fp32, tf32, bf16, fp16 (0 = none). */
typedef struct {
    int major, minor;
    int per_sm[4];
} arch_rate;

static const arch_rate arch_table[] = {
    {7, 0, {128, 0, 0, 1024}},       /* Volta */
    {7, 5, {128, 0, 0, 1024}},       /* Turing */
    {8, 0, {128, 1024, 2048, 2048}}, /* A100 */
    {8, 6, {256, 512, 1024, 1024}},  /* GA10x */
    {8, 9, {256, 512, 1024, 1024}},  /* Ada */
    {9, 0, {256, 2048, 4096, 4096}}, /* Hopper */
    {10, 0, {256, 4096, 8192, 8192}},/* Blackwell data center */
    {12, 0, {256, 512, 1024, 1024}}, /* Blackwell workstation/GeForce */
};
#define NARCH (int)(sizeof arch_table / sizeof arch_table[0])

int loom_cuda_name_is_mig(const char *name) { return strstr(name, "MIG") != NULL; }

/* `pattern` occurs in `name` as whole words: preceded by the start or a
 * space, followed by the end, a space or a '-' ("A10" is not in "A100"). */
static int name_has(const char *name, const char *pattern) {
    size_t n = strlen(pattern);
    for (const char *p = strstr(name, pattern); p; p = strstr(p + 1, pattern)) {
        char before = p == name ? ' ' : p[-1], after = p[n];
        if (before == ' ' && (after == 0 || after == ' ' || after == '-')) return 1;
    }
    return 0;
}

static const peak_entry *table_find(const char *name) {
    for (int i = 0; i < NPEAK; i++)
        if (name_has(name, peak_table[i].pattern)) return &peak_table[i];
    return NULL;
}

/* The architecture entry for a compute capability: exact, else the newest
 * one not newer than it (an unknown newer chip is at least that fast). */
static const arch_rate *arch_find(int major, int minor, int *exact) {
    const arch_rate *best = NULL;
    for (int i = 0; i < NARCH; i++) {
        const arch_rate *a = &arch_table[i];
        if (a->major == major && a->minor == minor) {
            *exact = 1;
            return a;
        }
        if (a->major < major || (a->major == major && a->minor < minor)) best = a;
    }
    *exact = 0;
    return best;
}

double loom_cuda_peak_flops(const loom_cuda_gpu_t *gpu, loom_dtype dtype, char *source,
                            size_t source_size) {
    const char *dn = loom_dtype_name(dtype);
    int d = (unsigned)dtype < 4 ? (int)dtype : 0;
    int mig = loom_cuda_name_is_mig(gpu->name);
    const peak_entry *e = table_find(gpu->name);
    const char *what = d == 0 ? "fp32 CUDA cores" : "tensor cores, fp32 accumulate";

    if (e && !mig) {
        double t = e->tflops[d];
        if (t > 0) {
            snprintf(source, source_size, "table: %s, %s dense %s, %.1f TFLOP/s", e->label, dn,
                     what, t);
            return t * 1e12;
        }
        snprintf(source, source_size,
                 "table: %s has no %s tensor cores; fp32 rate %.1f TFLOP/s", e->label, dn,
                 e->tflops[0]);
        return e->tflops[0] * 1e12;
    }
    if (e && mig && e->sms_full > 0 && gpu->sms > 0 && gpu->sms <= e->sms_full &&
        e->tflops[d] > 0) {
        double t = e->tflops[d] * gpu->sms / e->sms_full;
        snprintf(source, source_size,
                 "MIG slice: %d of %d SMs x table rate of %s (%s %.1f TFLOP/s) = %.1f TFLOP/s",
                 gpu->sms, e->sms_full, e->label, dn, e->tflops[d], t);
        return t * 1e12;
    }

    /* SM count x clock x per-SM rate of the architecture. */
    int exact = 0;
    const arch_rate *a = arch_find(gpu->cc_major, gpu->cc_minor, &exact);
    if (!a || gpu->sms <= 0 || gpu->clock_khz <= 0) {
        snprintf(source, source_size,
                 "unknown: \"%s\" (sm_%d%d, %d SMs, clock %d kHz) is not in the table and "
                 "its architecture or clock is unknown; MFU not computed",
                 gpu->name, gpu->cc_major, gpu->cc_minor, gpu->sms, gpu->clock_khz);
        return 0;
    }
    int rate = a->per_sm[d], fallback_fp32 = 0;
    if (rate == 0) {
        rate = a->per_sm[0];
        fallback_fp32 = 1;
    }
    int geforce = strstr(gpu->name, "GeForce") != NULL;
    if (geforce && d > 0 && !fallback_fp32 && gpu->cc_major >= 7) rate /= 2;
    double ghz = gpu->clock_khz / 1e6;
    double flops = (double)gpu->sms * ghz * 1e9 * rate;
    char arch[64] = "";
    if (!exact) snprintf(arch, sizeof arch, ", sm_%d%d unknown: assumed sm_%d%d rates",
                         gpu->cc_major, gpu->cc_minor, a->major, a->minor);
    snprintf(source, source_size,
             "rule%s: %d SMs x %.3f GHz x %d FLOP/clk/SM (sm_%d%d %s %s%s%s) = %.1f TFLOP/s",
             mig ? " (MIG slice)" : "", gpu->sms, ghz, rate, a->major, a->minor, dn,
             fallback_fp32 ? "has no tensor cores for it: fp32 rate" : what,
             geforce && d > 0 && !fallback_fp32 ? ", GeForce half rate" : "", arch,
             flops / 1e12);
    return flops;
}
