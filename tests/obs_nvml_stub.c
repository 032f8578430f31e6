/* A stand-in for libnvidia-ml.so.1 with known values, for
 * tests/test_obs_telemetry.c (which builds it with cc -shared). It has the
 * entry points src/obs/nvml.c resolves, with NVML's C signatures.
 *
 * GPU 0 ("GPU-stub-0"): 123456 mW, energy NVML_STUB_ENERGY_MJ (read at
 * every call; default 1000000 mJ), 40 GiB of which 1.5 GiB used, 87 % / 33 %
 * utilisation, SM clock 1410 MHz, 45 C, MIG mode NVML_STUB_MIG_MODE (0).
 * "MIG-stub-0": a MIG 1g.5gb instance of GPU 0 (5 GiB, 1 GiB used), for
 * which utilisation and power are "not supported", as NVML answers.
 * NVML_STUB_INIT_FAIL=1: nvmlInit fails as with no driver loaded.
 * GPU 0's NVML index is NVML_STUB_INDEX (default 0; nvmlDeviceGetHandleByIndex
 * answers that index), its PCI bus id 00000000:07:00.0, the MIG instance's
 * GPU instance id 7. NVML_STUB_XID=N: one critical XID event with code N,
 * delivered by the first nvmlEventSetWait_v2 after registration. */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef void *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define OK 0
#define NOT_SUPPORTED 3
#define NOT_FOUND 6
#define DRIVER_NOT_LOADED 9
#define TIMEOUT 10

static int gpu0, mig0;
#define GPU ((nvmlDevice_t)&gpu0)
#define MIG ((nvmlDevice_t)&mig0)

static unsigned long long env_ull(const char *name, unsigned long long def) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : def;
}

nvmlReturn_t nvmlInit_v2(void) { return env_ull("NVML_STUB_INIT_FAIL", 0) ? DRIVER_NOT_LOADED : OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
    return r == DRIVER_NOT_LOADED ? "Driver Not Loaded" : r == NOT_SUPPORTED ? "Not Supported" : r == NOT_FOUND ? "Not Found" : "Unknown Error";
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) {
    strncpy(v, "999.99-stub", n);
    return OK;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    *n = 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i != env_ull("NVML_STUB_INDEX", 0)) return NOT_FOUND;
    *d = GPU;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!strcmp(uuid, "GPU-stub-0")) *d = GPU;
    else if (!strcmp(uuid, "MIG-stub-0")) *d = MIG;
    else return NOT_FOUND;
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
    strncpy(name, d == MIG ? "NVIDIA A100-SXM4-40GB MIG 1g.5gb" : "NVIDIA A100-SXM4-40GB", n);
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned int n) {
    strncpy(u, d == MIG ? "MIG-stub-0" : "GPU-stub-0", n);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (d == MIG) return NOT_SUPPORTED;
    *mw = 123456;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    if (d == MIG) return NOT_SUPPORTED;
    *mj = env_ull("NVML_STUB_ENERGY_MJ", 1000000);
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (d == MIG) return NOT_SUPPORTED;
    u->gpu = 87;
    u->memory = 33;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    m->total = d == MIG ? 5ULL << 30 : 40ULL << 30;
    m->used = d == MIG ? 1ULL << 30 : 3ULL << 29;
    m->free = m->total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (d == MIG || type != 1) return NOT_SUPPORTED;
    *mhz = 1410;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
    if (d == MIG || sensor != 0) return NOT_SUPPORTED;
    *c = 45;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
    if (d == MIG) return NOT_SUPPORTED;
    *cur = *pend = (unsigned int)env_ull("NVML_STUB_MIG_MODE", 0);
    return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) {
    *is = d == MIG;
    return OK;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    if (d != MIG) return NOT_FOUND;
    *parent = GPU;
    return OK;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    if (d == MIG) return NOT_SUPPORTED;
    *i = (unsigned int)env_ull("NVML_STUB_INDEX", 0);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (d != MIG) return NOT_SUPPORTED;
    *id = 7;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    if (d == MIG) return NOT_SUPPORTED;
    memset(p, 0, sizeof *p);
    strcpy(p->busIdLegacy, "0000:07:00.0");
    strcpy(p->busId, "00000000:07:00.0");
    p->bus = 7;
    return OK;
}
static int event_set, xid_pending;
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    *set = &event_set;
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    if (d == MIG) return NOT_SUPPORTED;
    xid_pending = (types & 0x8) && env_ull("NVML_STUB_XID", 0) != 0;
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!xid_pending) return TIMEOUT;
    xid_pending = 0;
    memset(data, 0, sizeof *data);
    data->device = GPU;
    data->eventType = 0x8;
    data->eventData = env_ull("NVML_STUB_XID", 0);
    return OK;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { return OK; }
