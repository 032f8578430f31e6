/* loom devices: what CUDA sees (name, SMs, memory, compute capability, MIG
 * or not, peak rate used for MFU), or plainly why there is nothing to see;
 * then the telemetry loom can read: NVML for each GPU and MIG instance
 * (power, energy, memory, clocks, temperature, MIG profile) and RAPL for
 * the CPU, or the reason it cannot. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/devices.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/core.h"
#include "obs/nvml.h"
#include "obs/rapl.h"

static void json_text(const char *s) {
    putchar('"');
    for (; *s; s++) printf(*s == '"' || *s == '\\' ? "\\%c" : (unsigned char)*s < 0x20 ? "\\u%04x" : "%c", *s);
    putchar('"');
}

static void json_num(const char *key, double v) {
    if (isfinite(v)) printf(", \"%s\": %.15g", key, v);
    else printf(", \"%s\": null", key);
}

/* One NVML device (an index or a MIG-/GPU- UUID): a line of text or a JSON object. */
static void print_reading(loom_nvml_t *nv, const char *which, int json, int *first) {
    loom_nvml_reading_t r;
    if (loom_nvml_read(nv, which, &r) != LOOM_OK) {
        if (!json) printf("  nvml:%s  unreadable: %s\n", which, loom_errmsg());
        return;
    }
    if (json) {
        printf("%s{\"which\": ", *first ? "" : ", ");
        json_text(which);
        printf(", \"name\": ");
        json_text(r.name);
        printf(", \"uuid\": ");
        json_text(r.uuid);
        printf(", \"mig\": %s, \"mig_profile\": ", r.is_mig ? "true" : "false");
        json_text(r.mig_profile);
        printf(", \"mig_mode\": %d", r.mig_mode);
        json_num("power_w", r.power_w);
        json_num("energy_j", r.energy_j);
        json_num("memory_used_bytes", r.mem_used_bytes);
        json_num("memory_total_bytes", r.mem_total_bytes);
        json_num("gpu_util_pct", r.gpu_util_pct);
        json_num("mem_util_pct", r.mem_util_pct);
        json_num("sm_clock_mhz", r.sm_clock_mhz);
        json_num("temperature_c", r.temp_c);
        printf(", \"utilisation_note\": ");
        json_text(r.why_util);
        printf("}");
        *first = 0;
        return;
    }
    printf("  nvml:%s  %s  %s\n", which, r.name, r.uuid);
    if (isfinite(r.power_w)) printf("          power %.1f W", r.power_w);
    else printf("          power n/a (%s)", r.why_power);
    if (isfinite(r.energy_j)) printf(", energy %.1f kJ since the driver loaded", r.energy_j / 1e3);
    printf("%s\n", r.is_mig ? " (the whole GPU's)" : "");
    printf("          memory %.0f / %.0f MiB used", r.mem_used_bytes / 1048576.0, r.mem_total_bytes / 1048576.0);
    if (isfinite(r.sm_clock_mhz)) printf(", SM clock %.0f MHz", r.sm_clock_mhz);
    if (isfinite(r.temp_c)) printf(", %.0f C", r.temp_c);
    printf("\n");
    if (isfinite(r.gpu_util_pct)) printf("          utilisation %.0f%% (memory %.0f%%)\n", r.gpu_util_pct, r.mem_util_pct);
    else printf("          utilisation n/a: %s\n", r.why_util);
    if (r.is_mig) printf("          MIG instance, profile %s\n", r.mig_profile);
    else printf("          MIG mode %s\n", r.mig_mode == 1 ? "on" : r.mig_mode == 0 ? "off" : "not reported");
}

/* NVML for every GPU (and the MIG instances in `extra`, UUIDs), then RAPL. */
static void print_telemetry(int json, const char *const *extra, int nextra) {
    loom_nvml_t *nv = NULL;
    char why[600] = "";
    if (loom_nvml_open(&nv) != LOOM_OK) snprintf(why, sizeof why, "%s", loom_errmsg());
    if (json) {
        printf(", \"telemetry\": {\"nvml\": ");
        json_text(nv ? "ok" : why);
        printf(", \"gpus\": [");
    } else if (nv) {
        printf("GPU telemetry (NVML, driver %s):\n", loom_nvml_driver(nv));
    } else {
        printf("GPU telemetry unavailable: %s\n", why);
    }
    int first = 1;
    char idx[16];
    for (int i = 0; nv && i < loom_nvml_count(nv); i++) {
        snprintf(idx, sizeof idx, "%d", i);
        print_reading(nv, idx, json, &first);
    }
    for (int i = 0; nv && i < nextra; i++) print_reading(nv, extra[i], json, &first);
    loom_nvml_close(nv);
    loom_rapl_t *rapl = NULL;
    if (loom_rapl_open(&rapl) != LOOM_OK) snprintf(why, sizeof why, "%s", loom_errmsg());
    else snprintf(why, sizeof why, "CPU energy (RAPL): %d package%s, readable", loom_rapl_domains(rapl), loom_rapl_domains(rapl) == 1 ? "" : "s");
    loom_rapl_close(rapl);
    if (json) {
        printf("], \"cpu_energy\": ");
        json_text(why);
        printf("}");
    } else {
        printf("%s\n", why);
    }
}

#ifdef LOOM_HAVE_CUDA
static void print_version(const char *what, int v) {
    if (v > 0) printf("%s %d.%d", what, v / 1000, (v % 1000) / 10);
    else printf("%s none", what);
}

/* Device i: a JSON object (after ", " unless the first) or its table rows. */
static void print_device(int i, const loom_gpu_t *d, int json) {
    double gib = (double)d->memory_bytes / (1024.0 * 1024.0 * 1024.0);
    if (json) {
        printf("%s{\"index\": %d, \"name\": \"%s\", \"compute_capability\": \"%d.%d\", "
               "\"sms\": %d, \"memory_bytes\": %zu, \"clock_khz\": %d, \"mig\": %s, "
               "\"uuid\": \"%s\", \"pci\": \"%04x:%02x:%02x.0\", \"peak_dtype\": \"%s\", "
               "\"peak_flops\": %.6g}",
               i ? ", " : "", i, d->name, d->cc_major, d->cc_minor, d->sms,
               d->memory_bytes, d->clock_khz, d->is_mig ? "true" : "false", d->uuid,
               d->pci_domain, d->pci_bus, d->pci_device, loom_dtype_name(d->peak_dtype), d->peak_flops);
        return;
    }
    printf("  cuda:%d  %s\n", i, d->name);
    printf("          compute capability %d.%d (sm_%d%d), %d SMs at %.2f GHz, "
           "%.1f GiB, %s\n",
           d->cc_major, d->cc_minor, d->cc_major, d->cc_minor, d->sms,
           d->clock_khz / 1e6, gib, d->is_mig ? "MIG instance" : "whole GPU (not MIG)");
    printf("          PCI %04x:%02x:%02x.0, %s\n", d->pci_domain, d->pci_bus, d->pci_device, d->uuid);
    printf("          peak %s %.1f TFLOP/s (%s)\n", loom_dtype_name(d->peak_dtype), d->peak_flops / 1e12, d->peak_source);
    if (d->cc_major < 8)
        printf("          note: loom's kernels are built for sm_80 and sm_90; this "
               "GPU needs a rebuild with its own CUDA_ARCHS\n");
}

static int list_devices(int json) {
    int driver = 0, runtime = 0;
    char why[1200] = "";
    loom_gpu_versions(&driver, &runtime);
    int n = loom_gpu_count(why, sizeof why);
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
            printf("\"");
        } else {
            printf("no usable GPU: %s\n", why);
            printf("(loom runs on the CPU here: --device cpu)\n");
        }
        print_telemetry(json, NULL, 0);
        if (json) printf("}\n");
        return 2;
    }
    int bad = 0, nmig = 0;
    char migs[16][48];
    const char *mig_ptrs[16];
    for (int i = 0; i < n; i++) {
        loom_gpu_t d;
        if (loom_gpu_get(i, &d, why, sizeof why) != 0) {
            if (!json) printf("  cuda:%d  unreadable: %s\n", i, why);
            bad++;
            continue;
        }
        if (d.is_mig && nmig < 16) { /* NVML lists whole GPUs; their MIG instances by UUID */
            snprintf(migs[nmig], sizeof migs[nmig], "%s", d.uuid);
            mig_ptrs[nmig] = migs[nmig];
            nmig++;
        }
        print_device(i, &d, json);
    }
    if (json) printf("]");
    else printf("%d device%s; use --device cuda:N\n", n, n == 1 ? "" : "s");
    print_telemetry(json, mig_ptrs, nmig);
    if (json) printf("}\n");
    return bad ? 1 : 0;
}
#endif

int cmd_devices(int argc, char **argv) {
    int json = 0;
    const loom_arg_t args[] = {
        {"json", ARG_BOOL, &json, "0", 0, 0, "print one JSON object instead of text"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("devices", "loom devices [--json]", args, argc, argv);
#ifdef LOOM_HAVE_CUDA
    return list_devices(json);
#else
    if (json)
        printf("{\"cuda_build\": false, \"devices\": [], \"error\": \"built without CUDA\"");
    else
        printf("no GPUs: this loom was built without CUDA (nvcc was not found at build time, or "
               "NO_CUDA was set);\nrebuild with the CUDA toolkit installed to use --device cuda. "
               "The CPU works: --device cpu\n");
    print_telemetry(json, NULL, 0);
    if (json) printf("}\n");
    return 2;
#endif
}
