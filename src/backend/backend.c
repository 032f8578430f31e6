#include "backend.h"

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
#ifdef LOOM_HAVE_CUDA
        return loom_backend_cuda_init(out, index, dtype);
#else
        (void)index;
        return loom_error(LOOM_EUNAVAIL, "--device %s: this loom was built without CUDA (nvcc was not found at build time); use --device cpu", device);
#endif
    }
    return loom_error(LOOM_EINVAL, "--device %s: unknown device; use cpu, cuda or cuda:N", device);
}
