/* cuda_devices: device enumeration for C callers (see cuda_devices.h). */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "cuda_devices.h"
}

extern "C" int loom_cuda_device_count(char *why, size_t why_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        int driver = 0;
        if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
        cudaGetLastError();
        snprintf(why, why_size, "%s%s", cudaGetErrorString(e),
                 driver == 0 ? " (no NVIDIA driver is loaded on this machine)" : "");
        return -1;
    }
    if (n == 0) snprintf(why, why_size, "the CUDA runtime reports no devices");
    return n;
}

extern "C" int loom_cuda_device_get(int index, loom_cuda_device_t *out, char *why,
                                    size_t why_size) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    int clock = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, why_size, "cuda:%d: %s", index, cudaGetErrorString(e));
        return -1;
    }
    memset(out, 0, sizeof *out);
    snprintf(out->gpu.name, sizeof out->gpu.name, "%s", p.name);
    out->gpu.cc_major = p.major;
    out->gpu.cc_minor = p.minor;
    out->gpu.sms = p.multiProcessorCount;
    out->gpu.clock_khz = clock;
    out->memory_bytes = p.totalGlobalMem;
    out->is_mig = loom_cuda_name_is_mig(p.name);
    out->pci_domain = p.pciDomainID;
    out->pci_bus = p.pciBusID;
    out->pci_device = p.pciDeviceID;
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out->uuid, sizeof out->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    return 0;
}

extern "C" void loom_cuda_versions(int *driver, int *runtime) {
    *driver = *runtime = 0;
    if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
    if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = 0;
    cudaGetLastError();
}
