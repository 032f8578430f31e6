/* cuda_devices: what the CUDA runtime sees, for C callers (`loom devices`,
 * tests). Only built with CUDA (LOOM_HAVE_CUDA); never creates a context
 * beyond what cudaGetDeviceProperties needs. */
#ifndef LOOM_CUDA_DEVICES_H
#define LOOM_CUDA_DEVICES_H

#include <stddef.h>

#include "backend/cuda/cuda_peak.h"

typedef struct {
    loom_cuda_gpu_t gpu;     /* name, compute capability, SMs, clock */
    size_t memory_bytes;     /* total device memory (of the slice, under MIG) */
    int is_mig;              /* a MIG instance */
    int pci_domain, pci_bus, pci_device;
    char uuid[48];           /* "GPU-xxxxxxxx-..." as nvidia-smi prints it */
} loom_cuda_device_t;

/* Number of CUDA devices, or -1 when the runtime cannot be used (no driver,
 * no GPU, driver too old): then `why` receives cudaGetErrorString of the
 * error from cudaGetDeviceCount. A count of 0 also fills `why`. */
int loom_cuda_device_count(char *why, size_t why_size);

/* Properties of device `index`; 0 on success, -1 with `why` filled. */
int loom_cuda_device_get(int index, loom_cuda_device_t *out, char *why, size_t why_size);

/* CUDA driver and runtime versions as 1000*major + 10*minor (0 = none). */
void loom_cuda_versions(int *driver, int *runtime);

#endif
