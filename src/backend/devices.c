#include "backend/devices.h"

#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_devices.h"
#include "backend/plugin.h"

typedef int (*count_fn)(char *, size_t);
typedef int (*get_fn)(int, loom_cuda_device_t *, char *, size_t);
typedef void (*versions_fn)(int *, int *);
typedef void (*mem_stats_fn)(size_t *, size_t *);

int loom_gpu_count(char *why, size_t why_size) {
    count_fn count = (count_fn)loom_cuda_symbol("loom_cuda_device_count", why, why_size);
    return count ? count(why, why_size) : -1;
}

int loom_gpu_get(int index, loom_gpu_t *out, char *why, size_t why_size) {
    get_fn get = (get_fn)loom_cuda_symbol("loom_cuda_device_get", why, why_size);
    loom_cuda_device_t d;
    if (!get || get(index, &d, why, why_size) != 0) return -1;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", d.gpu.name);
    out->cc_major = d.gpu.cc_major, out->cc_minor = d.gpu.cc_minor;
    out->sms = d.gpu.sms, out->clock_khz = d.gpu.clock_khz;
    out->memory_bytes = d.memory_bytes, out->is_mig = d.is_mig;
    out->pci_domain = d.pci_domain, out->pci_bus = d.pci_bus, out->pci_device = d.pci_device;
    snprintf(out->uuid, sizeof out->uuid, "%s", d.uuid);
    out->peak_dtype = d.gpu.cc_major >= 8 ? LOOM_BF16 : LOOM_FP16;
    out->peak_flops = loom_cuda_peak_flops(&d.gpu, out->peak_dtype, out->peak_source, sizeof out->peak_source);
    return 0;
}

void loom_gpu_versions(int *driver, int *runtime) {
    char why[256];
    versions_fn versions = (versions_fn)loom_cuda_symbol("loom_cuda_versions", why, sizeof why);
    *driver = *runtime = 0;
    if (versions) versions(driver, runtime);
}

size_t loom_gpu_peak_bytes(void) {
    char why[256];
    mem_stats_fn stats = (mem_stats_fn)loom_cuda_symbol("loom_cuda_mem_stats", why, sizeof why);
    size_t now = 0, peak = 0;
    if (stats) stats(&now, &peak);
    return peak;
}
