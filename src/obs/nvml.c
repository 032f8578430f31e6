/* nvml: NVML loaded with dlopen (see nvml.h). Only the few entry points
 * below are used; their C types are NVML's (nvml.h from the CUDA toolkit),
 * restated here so that the build needs no NVIDIA header. */
#define _GNU_SOURCE
#include "obs/nvml.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef void *nvml_dev; /* nvmlDevice_t */
typedef int nvml_ret;   /* nvmlReturn_t: 0 success, 3 not supported */
#define NVML_SUCCESS 0
#define NVML_CLOCK_SM 1
#define NVML_TEMPERATURE_GPU 0

typedef struct {
    unsigned int gpu, memory;
} nvml_util; /* nvmlUtilization_t */

typedef struct {
    unsigned long long total, free, used;
} nvml_memory; /* nvmlMemory_t */

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci; /* nvmlPciInfo_t */

typedef void *nvml_event_set; /* nvmlEventSet_t */
typedef struct {
    nvml_dev device;
    unsigned long long type, data; /* eventType; eventData: the XID code */
    unsigned int gpu_instance, compute_instance;
} nvml_event; /* nvmlEventData_t */
#define NVML_EVENT_XID 0x8ULL /* nvmlEventTypeXidCriticalError */

struct loom_nvml {
    void *lib;
    char driver[80];
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*count)(unsigned int *);
    nvml_ret (*by_index)(unsigned int, nvml_dev *);
    nvml_ret (*by_uuid)(const char *, nvml_dev *);
    nvml_ret (*name)(nvml_dev, char *, unsigned int);
    nvml_ret (*uuid)(nvml_dev, char *, unsigned int);
    nvml_ret (*power)(nvml_dev, unsigned int *);                 /* mW */
    nvml_ret (*energy)(nvml_dev, unsigned long long *);          /* mJ */
    nvml_ret (*util)(nvml_dev, nvml_util *);
    nvml_ret (*memory)(nvml_dev, nvml_memory *);
    nvml_ret (*clock)(nvml_dev, int, unsigned int *);            /* MHz */
    nvml_ret (*temp)(nvml_dev, int, unsigned int *);             /* C */
    nvml_ret (*driver_version)(char *, unsigned int);
    /* MIG entry points: absent from drivers before R450, so optional. */
    nvml_ret (*mig_mode)(nvml_dev, unsigned int *, unsigned int *);
    nvml_ret (*is_mig)(nvml_dev, unsigned int *);
    nvml_ret (*mig_parent)(nvml_dev, nvml_dev *);
    nvml_ret (*gpu_instance_id)(nvml_dev, unsigned int *);
    /* Labels and XID events: optional too (a reading goes on without them). */
    nvml_ret (*index)(nvml_dev, unsigned int *);
    nvml_ret (*pci)(nvml_dev, nvml_pci *);
    nvml_ret (*event_set_create)(nvml_event_set *);
    nvml_ret (*register_events)(nvml_dev, unsigned long long, nvml_event_set);
    nvml_ret (*event_wait)(nvml_event_set, nvml_event *, unsigned int);
    nvml_ret (*event_set_free)(nvml_event_set);
    nvml_event_set xid_set; /* NULL until loom_nvml_watch_xid */
};

static const char *errstr(loom_nvml_t *nv, nvml_ret r) {
    const char *s = nv->error_string ? nv->error_string(r) : NULL;
    return s ? s : "unknown NVML error";
}

static void *sym(loom_nvml_t *nv, const char *name, const char *alt, int *missing) {
    void *p = dlsym(nv->lib, name);
    if (!p && alt) p = dlsym(nv->lib, alt);
    if (!p && missing) *missing = 1;
    return p;
}

/* Resolve the entry points; the name of the first required one missing, or NULL. */
static const char *resolve(loom_nvml_t *nv) {
    int miss = 0;
#define REQ(field, name, alt)                                   \
    do {                                                        \
        *(void **)&nv->field = sym(nv, name, alt, &miss);       \
        if (miss) return name;                                  \
    } while (0)
    REQ(init, "nvmlInit_v2", "nvmlInit");
    REQ(shutdown, "nvmlShutdown", NULL);
    REQ(error_string, "nvmlErrorString", NULL);
    REQ(count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    REQ(by_index, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    REQ(by_uuid, "nvmlDeviceGetHandleByUUID", NULL);
    REQ(name, "nvmlDeviceGetName", NULL);
    REQ(uuid, "nvmlDeviceGetUUID", NULL);
    REQ(power, "nvmlDeviceGetPowerUsage", NULL);
    REQ(memory, "nvmlDeviceGetMemoryInfo", NULL);
#undef REQ
    *(void **)&nv->energy = sym(nv, "nvmlDeviceGetTotalEnergyConsumption", NULL, NULL);
    *(void **)&nv->util = sym(nv, "nvmlDeviceGetUtilizationRates", NULL, NULL);
    *(void **)&nv->clock = sym(nv, "nvmlDeviceGetClockInfo", NULL, NULL);
    *(void **)&nv->temp = sym(nv, "nvmlDeviceGetTemperature", NULL, NULL);
    *(void **)&nv->driver_version = sym(nv, "nvmlSystemGetDriverVersion", NULL, NULL);
    *(void **)&nv->mig_mode = sym(nv, "nvmlDeviceGetMigMode", NULL, NULL);
    *(void **)&nv->is_mig = sym(nv, "nvmlDeviceIsMigDeviceHandle", NULL, NULL);
    *(void **)&nv->mig_parent = sym(nv, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", NULL, NULL);
    *(void **)&nv->gpu_instance_id = sym(nv, "nvmlDeviceGetGpuInstanceId", NULL, NULL);
    *(void **)&nv->index = sym(nv, "nvmlDeviceGetIndex", NULL, NULL);
    *(void **)&nv->pci = sym(nv, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", NULL);
    *(void **)&nv->event_set_create = sym(nv, "nvmlEventSetCreate", NULL, NULL);
    *(void **)&nv->register_events = sym(nv, "nvmlDeviceRegisterEvents", NULL, NULL);
    *(void **)&nv->event_wait = sym(nv, "nvmlEventSetWait_v2", "nvmlEventSetWait", NULL);
    *(void **)&nv->event_set_free = sym(nv, "nvmlEventSetFree", NULL, NULL);
    return NULL;
}

loom_status loom_nvml_open(loom_nvml_t **out) {
    *out = NULL;
    const char *path = getenv("LOOM_NVML_LIB");
    if (!path || !*path) path = "libnvidia-ml.so.1";
    loom_nvml_t *nv = loom_calloc(1, sizeof *nv);
    nv->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!nv->lib) {
        const char *e = dlerror();
        loom_status s = loom_error(LOOM_EUNAVAIL, "cannot load %s (%s): no NVIDIA driver on this machine", path, e ? e : "not found");
        free(nv);
        return s;
    }
    const char *missing = resolve(nv);
    if (missing) {
        loom_status s = loom_error(LOOM_EUNAVAIL, "%s has no %s: not an NVML library, or a driver too old", path, missing);
        dlclose(nv->lib);
        free(nv);
        return s;
    }
    nvml_ret r = nv->init();
    if (r != NVML_SUCCESS) {
        loom_status s = loom_error(LOOM_EUNAVAIL, "nvmlInit: %s", errstr(nv, r));
        dlclose(nv->lib);
        free(nv);
        return s;
    }
    snprintf(nv->driver, sizeof nv->driver, "unknown");
    if (nv->driver_version && nv->driver_version(nv->driver, sizeof nv->driver) != NVML_SUCCESS) snprintf(nv->driver, sizeof nv->driver, "unknown");
    *out = nv;
    return LOOM_OK;
}

void loom_nvml_close(loom_nvml_t *nv) {
    if (!nv) return;
    if (nv->xid_set) nv->event_set_free(nv->xid_set);
    nv->shutdown();
    dlclose(nv->lib);
    free(nv);
}

int loom_nvml_count(loom_nvml_t *nv) {
    unsigned int n = 0;
    return nv && nv->count(&n) == NVML_SUCCESS ? (int)n : 0;
}

const char *loom_nvml_driver(loom_nvml_t *nv) { return nv ? nv->driver : "unknown"; }

static loom_status handle(loom_nvml_t *nv, const char *which, nvml_dev *dev) {
    char *end;
    long i = strtol(which, &end, 10);
    nvml_ret r = *which && !*end ? nv->by_index((unsigned int)i, dev) : nv->by_uuid(which, dev);
    if (r != NVML_SUCCESS) return loom_error(LOOM_EINVAL, "NVML has no device %s: %s", which, errstr(nv, r));
    return LOOM_OK;
}

/* MIG: the parent GPU's handle (for power, clocks, temperature, mode). */
static nvml_dev whole_gpu(loom_nvml_t *nv, nvml_dev dev, int *is_mig) {
    unsigned int m = 0;
    nvml_dev parent = dev;
    *is_mig = nv->is_mig && nv->is_mig(dev, &m) == NVML_SUCCESS && m;
    if (*is_mig && (!nv->mig_parent || nv->mig_parent(dev, &parent) != NVML_SUCCESS)) parent = NULL;
    return parent;
}

/* The labels DCGM exporter gives a device: NVML index of the (parent) GPU,
 * its PCI bus id, and for a MIG instance its GPU instance id and profile. */
static void read_identity(loom_nvml_t *nv, nvml_dev dev, nvml_dev gpu, loom_nvml_reading_t *o) {
    unsigned int v;
    nvml_pci pci;
    o->index = o->gpu_instance_id = -1;
    if (gpu && nv->index && nv->index(gpu, &v) == NVML_SUCCESS) o->index = (int)v;
    if (gpu && nv->pci && nv->pci(gpu, &pci) == NVML_SUCCESS) snprintf(o->pci_bus_id, sizeof o->pci_bus_id, "%.*s", (int)sizeof pci.bus_id, pci.bus_id);
    if (!o->is_mig) return;
    if (nv->gpu_instance_id && nv->gpu_instance_id(dev, &v) == NVML_SUCCESS) o->gpu_instance_id = (int)v;
    const char *mig = strstr(o->name, "MIG ");
    if (mig) snprintf(o->mig_profile, sizeof o->mig_profile, "%s", mig + 4);
}

static void read_power(loom_nvml_t *nv, nvml_dev gpu, loom_nvml_reading_t *o) {
    unsigned int mw;
    unsigned long long mj;
    nvml_ret r;
    if (!gpu) {
        snprintf(o->why_power, sizeof o->why_power, "the MIG instance's parent GPU is not visible to NVML");
        return;
    }
    if ((r = nv->power(gpu, &mw)) == NVML_SUCCESS) o->power_w = mw / 1000.0;
    else snprintf(o->why_power, sizeof o->why_power, "power: %s", errstr(nv, r));
    if (!nv->energy) snprintf(o->why_power, sizeof o->why_power, "energy: this driver has no nvmlDeviceGetTotalEnergyConsumption");
    else if ((r = nv->energy(gpu, &mj)) == NVML_SUCCESS) o->energy_j = mj / 1000.0;
    else snprintf(o->why_power, sizeof o->why_power, "energy: %s", errstr(nv, r));
}

static void read_rest(loom_nvml_t *nv, nvml_dev dev, nvml_dev gpu, loom_nvml_reading_t *o) {
    nvml_memory mem;
    nvml_util u;
    unsigned int v, cur, pend;
    if (nv->memory(dev, &mem) == NVML_SUCCESS) {
        o->mem_used_bytes = (double)mem.used;
        o->mem_total_bytes = (double)mem.total;
    }
    if (o->is_mig) snprintf(o->why_util, sizeof o->why_util, "NVML does not report utilisation for MIG instances");
    else if (!nv->util) snprintf(o->why_util, sizeof o->why_util, "this driver has no nvmlDeviceGetUtilizationRates");
    else if (nv->util(dev, &u) == NVML_SUCCESS) {
        o->gpu_util_pct = u.gpu;
        o->mem_util_pct = u.memory;
    } else snprintf(o->why_util, sizeof o->why_util, "utilisation not supported by this device");
    if (gpu && nv->clock && nv->clock(gpu, NVML_CLOCK_SM, &v) == NVML_SUCCESS) o->sm_clock_mhz = v;
    if (gpu && nv->temp && nv->temp(gpu, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS) o->temp_c = v;
    if (gpu && nv->mig_mode && nv->mig_mode(gpu, &cur, &pend) == NVML_SUCCESS) o->mig_mode = cur ? 1 : 0;
}

loom_status loom_nvml_read(loom_nvml_t *nv, const char *which, loom_nvml_reading_t *o) {
    memset(o, 0, sizeof *o);
    o->power_w = o->energy_j = o->gpu_util_pct = o->mem_util_pct = NAN;
    o->mem_used_bytes = o->mem_total_bytes = o->sm_clock_mhz = o->temp_c = NAN;
    o->mig_mode = -1;
    nvml_dev dev;
    LOOM_TRY(handle(nv, which, &dev));
    if (nv->name(dev, o->name, sizeof o->name) != NVML_SUCCESS) snprintf(o->name, sizeof o->name, "unknown");
    if (nv->uuid(dev, o->uuid, sizeof o->uuid) != NVML_SUCCESS) o->uuid[0] = 0;
    nvml_dev gpu = whole_gpu(nv, dev, &o->is_mig);
    read_identity(nv, dev, gpu, o);
    read_power(nv, gpu, o);
    read_rest(nv, dev, gpu, o);
    return LOOM_OK;
}

double loom_nvml_energy_j(loom_nvml_t *nv, const char *which) {
    nvml_dev dev;
    unsigned long long mj;
    int is_mig;
    if (!nv || !nv->energy || handle(nv, which, &dev) != LOOM_OK) return NAN;
    nvml_dev gpu = whole_gpu(nv, dev, &is_mig);
    return gpu && nv->energy(gpu, &mj) == NVML_SUCCESS ? mj / 1000.0 : NAN;
}

loom_status loom_nvml_watch_xid(loom_nvml_t *nv, const char *which) {
    nvml_dev dev;
    int is_mig;
    if (!nv->event_set_create || !nv->register_events || !nv->event_wait || !nv->event_set_free)
        return loom_error(LOOM_EUNAVAIL, "this NVML has no event API (nvmlEventSetCreate), so no XID errors");
    LOOM_TRY(handle(nv, which, &dev));
    nvml_dev gpu = whole_gpu(nv, dev, &is_mig);
    if (!gpu) return loom_error(LOOM_EUNAVAIL, "the MIG instance's parent GPU is not visible to NVML, so no XID errors");
    nvml_event_set set = NULL;
    nvml_ret r = nv->event_set_create(&set);
    if (r == NVML_SUCCESS && (r = nv->register_events(gpu, NVML_EVENT_XID, set)) != NVML_SUCCESS) nv->event_set_free(set);
    if (r != NVML_SUCCESS) return loom_error(LOOM_EUNAVAIL, "XID events: %s", errstr(nv, r));
    nv->xid_set = set;
    return LOOM_OK;
}

int loom_nvml_poll_xid(loom_nvml_t *nv, unsigned long long *codes, int cap) {
    int n = 0;
    nvml_event ev;
    while (nv && nv->xid_set && n < cap && nv->event_wait(nv->xid_set, &ev, 0) == NVML_SUCCESS)
        if (ev.type & NVML_EVENT_XID) codes[n++] = ev.data;
    return n;
}

void loom_nvml_select_cuda(int ordinal, char *buf, size_t cap) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(buf, cap, "%d", ordinal);
    if (!vis || !*vis) return;
    const char *p = vis;
    for (int i = 0; i < ordinal && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (!p) return;
    size_t n = strcspn(p, ",");
    while (n > 0 && p[n - 1] == ' ') n--;
    while (n > 0 && *p == ' ') p++, n--;
    if (n == 0) return;
    snprintf(buf, cap, "%.*s", (int)n, p);
}
