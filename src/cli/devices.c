/* loom devices: what CUDA sees (name, SMs, memory, compute capability, MIG
 * or not, peak rate used for MFU), or plainly why there is nothing to see. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/plugin.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/core.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_devices.h"
#endif

#ifdef LOOM_HAVE_CUDA
static void print_version(const char *what, int v) {
    if (v > 0) printf("%s %d.%d", what, v / 1000, (v % 1000) / 10);
    else printf("%s none", what);
}

static int list_devices(int json) {
    int driver = 0, runtime = 0;
    char why[1200] = "";
    /* The CUDA runtime lives in the plugin (src/backend/plugin.h). */
    void (*versions)(int *, int *) = (void (*)(int *, int *))loom_cuda_symbol("loom_cuda_versions", why, sizeof why);
    int (*device_count)(char *, size_t) = (int (*)(char *, size_t))loom_cuda_symbol("loom_cuda_device_count", why, sizeof why);
    int (*device_get)(int, loom_cuda_device_t *, char *, size_t) =
        (int (*)(int, loom_cuda_device_t *, char *, size_t))loom_cuda_symbol("loom_cuda_device_get", why, sizeof why);
    int n = -1;
    if (versions && device_count && device_get) {
        versions(&driver, &runtime);
        n = device_count(why, sizeof why);
    }
    if (json) {
        printf("{\"cuda_build\": true, \"driver_version\": %d, \"runtime_version\": %d, "
               "\"devices\": [", driver, runtime);
    } else {
        print_version("CUDA driver", driver);
        print_version(", runtime", runtime);
        printf("\n");
    }
    if (n <= 0) {
        if (json) {
            printf("], \"error\": \"");
            for (const char *p = why; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
            printf("\"}\n");
        } else {
            printf("no usable GPU: %s\n", why);
            printf("(loom runs on the CPU here: --device cpu)\n");
        }
        return 2;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        loom_cuda_device_t d;
        if (device_get(i, &d, why, sizeof why) != 0) {
            if (!json) printf("  cuda:%d  unreadable: %s\n", i, why);
            bad++;
            continue;
        }
        char src[320];
        loom_dtype dt = d.gpu.cc_major >= 8 ? LOOM_BF16 : LOOM_FP16;
        double peak = loom_cuda_peak_flops(&d.gpu, dt, src, sizeof src);
        double gib = (double)d.memory_bytes / (1024.0 * 1024.0 * 1024.0);
        if (json) {
            printf("%s{\"index\": %d, \"name\": \"%s\", \"compute_capability\": \"%d.%d\", "
                   "\"sms\": %d, \"memory_bytes\": %zu, \"clock_khz\": %d, \"mig\": %s, "
                   "\"uuid\": \"%s\", \"pci\": \"%04x:%02x:%02x.0\", \"peak_dtype\": \"%s\", "
                   "\"peak_flops\": %.6g}",
                   i ? ", " : "", i, d.gpu.name, d.gpu.cc_major, d.gpu.cc_minor, d.gpu.sms,
                   d.memory_bytes, d.gpu.clock_khz, d.is_mig ? "true" : "false", d.uuid,
                   d.pci_domain, d.pci_bus, d.pci_device, loom_dtype_name(dt), peak);
        } else {
            printf("  cuda:%d  %s\n", i, d.gpu.name);
            printf("          compute capability %d.%d (sm_%d%d), %d SMs at %.2f GHz, "
                   "%.1f GiB, %s\n",
                   d.gpu.cc_major, d.gpu.cc_minor, d.gpu.cc_major, d.gpu.cc_minor, d.gpu.sms,
                   d.gpu.clock_khz / 1e6, gib, d.is_mig ? "MIG instance" : "whole GPU (not MIG)");
            printf("          PCI %04x:%02x:%02x.0, %s\n", d.pci_domain, d.pci_bus,
                   d.pci_device, d.uuid);
            printf("          peak %s %.1f TFLOP/s (%s)\n", loom_dtype_name(dt), peak / 1e12,
                   src);
            if (d.gpu.cc_major < 8)
                printf("          note: loom's kernels are built for sm_80 and sm_90; this "
                       "GPU needs a rebuild with its own CUDA_ARCHS\n");
        }
    }
    if (json) printf("]}\n");
    else printf("%d device%s; use --device cuda:N\n", n, n == 1 ? "" : "s");
    return bad ? 1 : 0;
}
#endif

int cmd_devices(int argc, char **argv) {
    int json = 0;
    const loom_arg_t args[] = {
        {"json", ARG_BOOL, &json, "0", 0, 0, "print one JSON object instead of text"},
    };
    int r = loom_args_parse("devices", "loom devices [--json]", args,
                            (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r != 0) return 2;
#ifdef LOOM_HAVE_CUDA
    return list_devices(json);
#else
    if (json)
        printf("{\"cuda_build\": false, \"devices\": [], \"error\": \"built without CUDA\"}\n");
    else
        printf("no GPUs: this loom was built without CUDA (nvcc was not found at build time, or "
               "NO_CUDA was set);\nrebuild with the CUDA toolkit installed to use --device cuda. "
               "The CPU works: --device cpu\n");
    return 2;
#endif
}
