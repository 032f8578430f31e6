/* gpus: the GPU table `loom plan` reads (src/plan/gpus.json): memory,
 * bandwidths, peak rates per dtype, MIG profiles with their placement
 * rules, typical prices, and beside each figure where it came from.
 *
 * The file is found, in order: the --gpu-table flag, $LOOM_GPU_TABLE,
 * gpus.json beside the loom binary, ../src/plan/gpus.json from it (the
 * build tree), ../share/loom/gpus.json from it (an install). */
#ifndef LOOM_PLAN_GPUS_H
#define LOOM_PLAN_GPUS_H

#include "core/core.h"

#define LOOM_MIG_MAX_PROFILES 12
#define LOOM_MIG_SLICES 8 /* memory slices of every MIG GPU in the table */

/* One MIG GPU instance profile and where it may be placed. */
typedef struct {
    char name[32];      /* "3g.40gb" */
    int compute_slices; /* 1..7 */
    int memory_slices;  /* 1..8: how many of the 8 memory slices it takes */
    int starts;         /* bit s set: the profile may start at memory slice s */
    int max_instances;  /* per GPU (1 for +me profiles) */
    double memory_gb;   /* nominal, from the name */
    int sms;
} loom_mig_profile_t;

/* Dtype columns of the peak table. */
enum { LOOM_PEAK_FP32, LOOM_PEAK_TF32, LOOM_PEAK_BF16, LOOM_PEAK_FP16, LOOM_PEAK_INT8, LOOM_PEAK_N };

typedef struct {
    char id[32];        /* "a100-80gb": what --gpu takes */
    char label[64];
    char cuda_name[64]; /* a CUDA device name the trainer's peak table (cuda_peak.c) matches */
    double memory_gb, hbm_gbs;
    double peak_tflops[LOOM_PEAK_N];
    double nvlink_gbs, pcie_gbs, ib_gbs; /* per direction per GPU */
    int gpus_per_node;
    int sms;           /* streaming multiprocessors of the whole GPU (the peak's); 0: not listed */
    int nvlink_domain; /* GPUs joined by one NVLink fabric: 8 on HGX boards, 2 for H100 NVL's bridged pairs */
    double default_mfu, runtime_mb;
    double price, spot_price; /* USD per GPU-hour; < 0 = not listed */
    int nprofiles;
    loom_mig_profile_t profiles[LOOM_MIG_MAX_PROFILES];
    const void *sources; /* the entry's "sources" object (cJSON) */
} loom_gpu_t;

typedef struct {
    char path[4096];
    int n;
    loom_gpu_t *gpus;
    double cpu_runtime_mb;
    const char *cpu_runtime_source;
    void *root; /* cJSON tree the sources point into */
} loom_gpu_table_t;

/* Find and load the table (`path` NULL = the search order above). */
loom_status loom_gpu_table_load(loom_gpu_table_t *t, const char *path);
void loom_gpu_table_free(loom_gpu_table_t *t);
/* The entry with id `id` (case-insensitive), or NULL. */
const loom_gpu_t *loom_gpu_find(const loom_gpu_table_t *t, const char *id);
/* "a100-40gb, a100-80gb, ..." into buf, for error messages. */
void loom_gpu_ids(const loom_gpu_table_t *t, char *buf, size_t cap);
/* The source text of figure `key` ("memory", "peak_tflops", ...) or "not given". */
const char *loom_gpu_source(const loom_gpu_t *g, const char *key);
/* The profile named `name` ("3g.40gb"), or NULL. */
const loom_mig_profile_t *loom_gpu_profile(const loom_gpu_t *g, const char *name);

#endif
