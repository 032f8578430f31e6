#include "gpus.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static double num(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static void str(char *dst, size_t cap, const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(dst, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static loom_status parse_profiles(loom_gpu_t *g, const cJSON *mig, const char *path) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(mig, "profiles"), *p;
    cJSON_ArrayForEach(p, ps) {
        if (g->nprofiles == LOOM_MIG_MAX_PROFILES)
            return loom_error(LOOM_EFORMAT, "%s: %s has more than %d MIG profiles", path, g->id, LOOM_MIG_MAX_PROFILES);
        loom_mig_profile_t *q = &g->profiles[g->nprofiles++];
        str(q->name, sizeof q->name, p, "name");
        q->compute_slices = (int)num(p, "compute_slices", 0);
        q->memory_slices = (int)num(p, "memory_slices", 0);
        q->max_instances = (int)num(p, "max_instances", 7);
        q->memory_gb = num(p, "memory_gb", 0);
        q->sms = (int)num(p, "sms", 0);
        const cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(p, "starts")) {
            int v = cJSON_IsNumber(s) ? s->valueint : -1;
            if (v < 0 || v >= LOOM_MIG_SLICES)
                return loom_error(LOOM_EFORMAT, "%s: %s profile %s: start slice %d is outside 0..7", path, g->id, q->name, v);
            q->starts |= 1 << v;
        }
        if (!q->name[0] || q->compute_slices < 1 || q->compute_slices > 7 || q->memory_slices < 1 ||
            q->memory_slices > LOOM_MIG_SLICES || !q->starts || q->memory_gb <= 0)
            return loom_error(LOOM_EFORMAT, "%s: %s MIG profile \"%s\": needs name, compute_slices 1-7, memory_slices 1-8, starts and memory_gb", path, g->id, q->name);
    }
    return LOOM_OK;
}

static loom_status parse_gpu(loom_gpu_t *g, const cJSON *o, const char *path) {
    str(g->id, sizeof g->id, o, "id");
    str(g->label, sizeof g->label, o, "label");
    str(g->cuda_name, sizeof g->cuda_name, o, "cuda_name");
    g->memory_gb = num(o, "memory_gb", 0);
    g->hbm_gbs = num(o, "hbm_gbs", 0);
    static const char *const dt[LOOM_PEAK_N] = {"fp32", "tf32", "bf16", "fp16", "int8"};
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(o, "peak_tflops");
    for (int i = 0; i < LOOM_PEAK_N; i++) g->peak_tflops[i] = num(pk, dt[i], 0);
    g->nvlink_gbs = num(o, "nvlink_gbs", 0);
    g->pcie_gbs = num(o, "pcie_gbs", 0);
    g->ib_gbs = num(o, "ib_gbs", 0);
    g->gpus_per_node = (int)num(o, "gpus_per_node", 8);
    g->nvlink_domain = (int)num(o, "nvlink_domain", g->gpus_per_node);
    g->sms = (int)num(o, "sms", 0);
    if (g->nvlink_domain < 1 || g->nvlink_domain > g->gpus_per_node) g->nvlink_domain = g->gpus_per_node;
    g->default_mfu = num(o, "default_mfu", 0.4);
    g->runtime_mb = num(o, "runtime_mb", 0);
    g->price = num(o, "price_per_hour", -1);
    g->spot_price = num(o, "spot_price_per_hour", -1);
    g->sources = cJSON_GetObjectItemCaseSensitive(o, "sources");
    if (!g->id[0] || g->memory_gb <= 0 || g->hbm_gbs <= 0 || g->peak_tflops[LOOM_PEAK_FP32] <= 0)
        return loom_error(LOOM_EFORMAT, "%s: entry \"%s\" needs id, memory_gb, hbm_gbs and peak_tflops.fp32", path, g->id);
    const cJSON *mig = cJSON_GetObjectItemCaseSensitive(o, "mig");
    return mig ? parse_profiles(g, mig, path) : LOOM_OK;
}

/* The first readable candidate path. */
static int find_table(char *out, size_t cap, const char *given) {
    if (given) {
        snprintf(out, cap, "%s", given);
        return loom_path_exists(out);
    }
    const char *env = getenv("LOOM_GPU_TABLE");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return loom_path_exists(out);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    static const char *const rel[] = {"/gpus.json", "/../src/plan/gpus.json", "/../share/loom/gpus.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(out, cap, "%s%s", exe, rel[i]);
        if (loom_path_exists(out)) return 1;
    }
    snprintf(out, cap, "%s/gpus.json", exe);
    return 0;
}

loom_status loom_gpu_table_load(loom_gpu_table_t *t, const char *path) {
    memset(t, 0, sizeof *t);
    if (!find_table(t->path, sizeof t->path, path))
        return loom_error(LOOM_EINVAL, "GPU table %s not found; pass --gpu-table FILE or set LOOM_GPU_TABLE (the repository's is src/plan/gpus.json)", t->path);
    char *text;
    size_t len;
    LOOM_TRY(loom_file_read(t->path, &text, &len));
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(root, "gpus");
    if (!root || !cJSON_IsArray(gpus)) {
        cJSON_Delete(root);
        return loom_error(LOOM_EFORMAT, "%s: not a GPU table (expected JSON with a \"gpus\" array)", t->path);
    }
    t->root = root;
    t->n = cJSON_GetArraySize(gpus);
    t->gpus = loom_calloc((size_t)(t->n ? t->n : 1), sizeof *t->gpus);
    int i = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, gpus) {
        loom_status s = parse_gpu(&t->gpus[i++], g, t->path);
        if (s != LOOM_OK) {
            loom_gpu_table_free(t);
            return s;
        }
    }
    const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(root, "cpu");
    t->cpu_runtime_mb = num(cpu, "runtime_mb", 20);
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(cpu, "source");
    t->cpu_runtime_source = cJSON_IsString(cs) ? cs->valuestring : "assumption";
    return LOOM_OK;
}

void loom_gpu_table_free(loom_gpu_table_t *t) {
    free(t->gpus);
    cJSON_Delete(t->root);
    memset(t, 0, sizeof *t);
}

const loom_gpu_t *loom_gpu_find(const loom_gpu_table_t *t, const char *id) {
    for (int i = 0; i < t->n; i++)
        if (!strcasecmp(t->gpus[i].id, id)) return &t->gpus[i];
    return NULL;
}

void loom_gpu_ids(const loom_gpu_table_t *t, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < t->n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", t->gpus[i].id);
}

const char *loom_gpu_source(const loom_gpu_t *g, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)g->sources, key);
    return cJSON_IsString(v) ? v->valuestring : "not given in the GPU table";
}

const loom_mig_profile_t *loom_gpu_profile(const loom_gpu_t *g, const char *name) {
    for (int i = 0; i < g->nprofiles; i++)
        if (!strcasecmp(g->profiles[i].name, name)) return &g->profiles[i];
    return NULL;
}
