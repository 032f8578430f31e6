#include "backend.h"
#include "plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[LOOM_DTYPE_COUNT] = {"fp32", "tf32", "bf16", "fp16", "int8", "int32",
                                                               "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"};
static const unsigned char dtype_sizes[LOOM_DTYPE_COUNT] = {4, 4, 2, 2, 1, 4, 0, 0, 0, 0, 0, 0, 0};

int loom_dtype_parse(const char *s) {
    for (int i = 0; i <= LOOM_FP16; i++)
        if (strcmp(s, dtype_names[i]) == 0) return i;
    return -1;
}

const char *loom_dtype_name(loom_dtype d) { return (unsigned)d < LOOM_DTYPE_COUNT ? dtype_names[d] : "?"; }

size_t loom_dtype_size(loom_dtype d) { return (unsigned)d < LOOM_DTYPE_COUNT ? dtype_sizes[d] : 0; }

/* ---- the op list as data ---- */

#define ARG_NAME_(tag, type, name) #name
#define ARG_TAG_(tag, type, name) LOOM_ARG_##tag
#define INFO_(name, ret, kind, fallback, flops, n, args)                                   \
    {#name, LOOM_OPK_##kind, LOOM_OP_REQUIRED_##kind, fallback, n,                        \
     {LOOM_OP_MAP(ARG_NAME_, LOOM_OP_COMMA, n, args)}, {LOOM_OP_MAP(ARG_TAG_, LOOM_OP_COMMA, n, args)}},
static const loom_op_info_t op_info[LOOM_OP_COUNT] = {LOOM_OPS(INFO_)};
#undef INFO_

const loom_op_info_t *loom_op_info(loom_op_id op) {
    return (unsigned)op < LOOM_OP_COUNT ? &op_info[op] : NULL;
}

void *loom_backend_slot(const loom_backend_t *be, loom_op_id op) {
    switch (op) {
#define SLOT_(name, ret, kind, fallback, flops, n, args) \
    case LOOM_OP_##name: return (void *)be->name;
        LOOM_OPS(SLOT_)
#undef SLOT_
    default: return NULL;
    }
}

/* Which optional entries each capability flag promises. */
static int caps_agree(const loom_backend_t *be, char *why, size_t n) {
    static const struct {
        unsigned cap;
        loom_op_kind kind;
        const char *flag;
    } need[] = {{LOOM_CAP_DEVICE_STEP, LOOM_OPK_DEV, "LOOM_CAP_DEVICE_STEP"},
                {LOOM_CAP_GRAPHS, LOOM_OPK_GRAPH, "LOOM_CAP_GRAPHS"}};
    for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            int has = loom_backend_slot(be, (loom_op_id)op) != NULL;
            if (op_info[op].kind != need[k].kind || has == !!(be->caps & need[k].cap)) continue;
            snprintf(why, n, "%s %s but %s is %s", need[k].flag, be->caps & need[k].cap ? "is set" : "is not set",
                     op_info[op].name, has ? "filled" : "empty");
            return 0;
        }
    return 1;
}

int loom_op_arg_dtype(const loom_backend_t *be, loom_op_id op, int arg) {
    if ((unsigned)op >= LOOM_OP_COUNT || arg < 0 || arg >= op_info[op].nargs) return -1;
    switch (op_info[op].arg_tags[arg]) {
    case LOOM_ARG_F32: return LOOM_FP32;
    case LOOM_ARG_I32: return LOOM_INT32;
    case LOOM_ARG_ACT: return (int)be->act_dtype;
    default: return -1;
    }
}

/* The element types every backend must take, and act_dtype among them. */
static int dtypes_agree(const loom_backend_t *be, char *why, size_t n) {
    unsigned need = LOOM_DTYPE_BIT(LOOM_FP32) | LOOM_DTYPE_BIT(LOOM_INT32);
    if ((be->dtypes & need) != need) {
        snprintf(why, n, "its dtypes lack fp32 or int32, which the required ops take");
        return 0;
    }
    if ((unsigned)be->act_dtype >= LOOM_DTYPE_COUNT || !(be->dtypes & LOOM_DTYPE_BIT(be->act_dtype))) {
        snprintf(why, n, "its activation type %s is not among its dtypes", loom_dtype_name(be->act_dtype));
        return 0;
    }
    return 1;
}

loom_status loom_backend_check(const loom_backend_t *be) {
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        if (op_info[op].required && !loom_backend_slot(be, (loom_op_id)op))
            return loom_error(LOOM_EINTERNAL, "the %s backend has no %s, which every backend must have (src/backend/ops.h)",
                              be->name, op_info[op].name);
    char why[256];
    if (!caps_agree(be, why, sizeof why))
        return loom_error(LOOM_EINTERNAL, "the %s backend's capability flags disagree with its table: %s", be->name, why);
    if (!dtypes_agree(be, why, sizeof why)) return loom_error(LOOM_EINTERNAL, "the %s backend: %s", be->name, why);
    return LOOM_OK;
}

static int is_cuda_device(const char *device) {
    return strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':');
}

loom_dtype loom_backend_default_dtype(const char *device) {
    return is_cuda_device(device) ? LOOM_BF16 : LOOM_FP32;
}

void loom_backend_rank_device(char *out, size_t n, const char *device, int local_rank) {
    if (local_rank >= 0 && strcmp(device, "cuda") == 0) snprintf(out, n, "cuda:%d", local_rank);
    else snprintf(out, n, "%s", device);
}

unsigned loom_backend_device_caps(const char *device) {
    return is_cuda_device(device) ? LOOM_CAP_DEVICE_MEMORY : 0u;
}

int loom_backend_gpu_ordinal(const char *device) {
    if (!is_cuda_device(device)) return -1;
    return device[4] == ':' ? atoi(device + 5) : 0;
}

loom_status loom_backend_open(const loom_backend_t **out, const char *device, int threads,
                              loom_dtype dtype) {
    if (strcmp(device, "cpu") == 0) {
        if (dtype != LOOM_FP32)
            return loom_error(LOOM_EINVAL, "--dtype %s: the CPU backend computes in fp32; use --dtype fp32 or --device cuda", loom_dtype_name(dtype));
        return loom_backend_cpu_init(out, threads);
    }
    if (is_cuda_device(device)) {
        int index = 0;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || v < 0 || v > 1024)
                return loom_error(LOOM_EINVAL, "--device %s: expected cuda:N with N a device index", device);
            index = (int)v;
        }
        char why[1200];
        loom_status (*init)(const loom_backend_t **, int, loom_dtype) =
            (loom_status(*)(const loom_backend_t **, int, loom_dtype))loom_cuda_symbol("loom_backend_cuda_init", why, sizeof why);
        if (!init) return loom_error(LOOM_EUNAVAIL, "--device %s: %s; use --device cpu", device, why);
        LOOM_TRY(init(out, index, dtype));
        return loom_backend_check(*out);
    }
    return loom_error(LOOM_EINVAL, "--device %s: unknown device; use cpu, cuda or cuda:N", device);
}

size_t loom_backend_act_bytes(const loom_backend_t *be, size_t n) { return n * loom_dtype_size(be->act_dtype); }

void loom_backend_download_act(const loom_backend_t *be, float *dst, const void *src, size_t n) {
    if (be->act_dtype == LOOM_FP32 || be->act_dtype == LOOM_TF32) {
        be->download(dst, src, n * sizeof(float));
        return;
    }
    void *tmp = loom_malloc(n * loom_dtype_size(be->act_dtype) + 1);
    be->download(tmp, src, n * loom_dtype_size(be->act_dtype));
    loom_dtype_to_f32(dst, tmp, be->act_dtype, n);
    free(tmp);
}
