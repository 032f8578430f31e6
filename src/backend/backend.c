#include "backend.h"
#include "plugin.h"

#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[] = {"fp32", "tf32", "bf16", "fp16"};

int loom_dtype_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, dtype_names[i]) == 0) return i;
    return -1;
}

const char *loom_dtype_name(loom_dtype d) { return (unsigned)d < 4 ? dtype_names[d] : "?"; }

loom_status loom_backend_open(const loom_backend_t **out, const char *device, int threads,
                              loom_dtype dtype) {
    if (strcmp(device, "cpu") == 0) {
        if (dtype != LOOM_FP32)
            return loom_error(LOOM_EINVAL, "--dtype %s: the CPU backend computes in fp32; use --dtype fp32 or --device cuda", loom_dtype_name(dtype));
        return loom_backend_cpu_init(out, threads);
    }
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':')) {
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
        return init(out, index, dtype);
    }
    return loom_error(LOOM_EINVAL, "--device %s: unknown device; use cpu, cuda or cuda:N", device);
}
