/* GPU and CPU telemetry against stand-ins with known values: an NVML
 * library built here from tests/obs_nvml_stub.c (milliwatts, millijoules,
 * bytes, a MIG instance), and a powercap folder with RAPL counters (one of
 * which wraps). Checks the units (mW -> W, mJ -> J, bytes -> MiB for
 * DCGM's names), the energy-per-token arithmetic, and that a missing
 * library or powercap folder gives a reason and no crash. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "obs/metrics.h"
#include "obs/nvml.h"
#include "obs/rapl.h"
#include "obs/telemetry.h"
#include "obs/train_metrics.h"

static char tmp[512], stub[600];
static const char *no_stub = "no C compiler (cc) to build the NVML stand-in";

/* The stand-in library, built once; "" when there is no compiler. */
static void build_stub(void) {
    snprintf(tmp, sizeof tmp, "%s", check_tmpdir("telemetry"));
    if (system("command -v cc > /dev/null 2>&1") != 0) return;
    snprintf(stub, sizeof stub, "%s/libnvidia-ml.so.1", tmp);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -O1 -o %s tests/obs_nvml_stub.c 2>&1", stub);
    if (system(cmd) != 0) no_stub = "cc could not build tests/obs_nvml_stub.c";
}

/* 1 when the stand-in is there; else the case is skipped (no compiler) or failed. */
static int have_stub(void) {
    if (loom_path_exists(stub)) return 1;
    if (!strcmp(no_stub, "cc could not build tests/obs_nvml_stub.c")) check_fail_why("%s", no_stub);
    else check_skip("%s", no_stub);
    return 0;
}

static void test_nvml_missing(void) {
    setenv("LOOM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    loom_nvml_t *nv;
    CHECK(loom_nvml_open(&nv) == LOOM_EUNAVAIL, "opened a missing library");
    CHECK(strstr(loom_errmsg(), "cannot load /nonexistent/libnvidia-ml.so.1") != NULL, "message: %s", loom_errmsg());
    loom_metrics_t *r = loom_metrics_new();
    loom_telemetry_t *t = loom_telemetry_open(r, 0, 0);
    CHECK(!loom_telemetry_has_gpu(t), "GPU telemetry without a library");
    CHECK(!strncmp(loom_telemetry_status(t), "no GPU telemetry: cannot load", 29), "status: %s", loom_telemetry_status(t));
    CHECK(isnan(loom_telemetry_energy_j(t)), "energy without a counter");
    char *text = loom_metrics_render(r, NULL);
    CHECK(!strstr(text, "DCGM_") && strstr(text, "process_resident_memory_bytes{rank=\"0\"}"), "exposition:\n%s", text);
    free(text);
    loom_telemetry_close(t);
    loom_metrics_free(r);
}

static void test_nvml_stub_units(void) {
    if (!have_stub()) return;
    setenv("LOOM_NVML_LIB", stub, 1);
    setenv("NVML_STUB_ENERGY_MJ", "2500000", 1);
    loom_nvml_t *nv;
    CHECK(loom_nvml_open(&nv) == LOOM_OK, "%s", loom_errmsg());
    if (!nv) return;
    CHECK(loom_nvml_count(nv) == 1 && !strcmp(loom_nvml_driver(nv), "999.99-stub"), "count/driver");
    loom_nvml_reading_t rd;
    CHECK(loom_nvml_read(nv, "0", &rd) == LOOM_OK, "%s", loom_errmsg());
    CHECK(rd.power_w == 123.456, "power %.17g W, want 123.456 (123456 mW)", rd.power_w);
    CHECK(rd.energy_j == 2500.0, "energy %.17g J, want 2500 (2500000 mJ)", rd.energy_j);
    CHECK(rd.mem_used_bytes == 1610612736.0 && rd.mem_total_bytes == 42949672960.0, "memory %g / %g", rd.mem_used_bytes, rd.mem_total_bytes);
    CHECK(rd.gpu_util_pct == 87 && rd.mem_util_pct == 33 && rd.sm_clock_mhz == 1410 && rd.temp_c == 45, "util/clock/temp");
    CHECK(!rd.is_mig && rd.mig_mode == 0 && rd.mig_profile[0] == 0 && !strcmp(rd.uuid, "GPU-stub-0"), "MIG fields of a whole GPU");
    CHECK(loom_nvml_read(nv, "7", &rd) == LOOM_EINVAL && strstr(loom_errmsg(), "no device 7"), "device 7: %s", loom_errmsg());
    /* A MIG instance: profile from the name, utilisation absent with the
     * reason, power and energy from the parent GPU. */
    CHECK(loom_nvml_read(nv, "MIG-stub-0", &rd) == LOOM_OK, "%s", loom_errmsg());
    CHECK(rd.is_mig && !strcmp(rd.mig_profile, "1g.5gb"), "MIG profile '%s'", rd.mig_profile);
    CHECK(isnan(rd.gpu_util_pct) && strstr(rd.why_util, "MIG"), "MIG utilisation %g (%s)", rd.gpu_util_pct, rd.why_util);
    CHECK(rd.power_w == 123.456 && rd.mem_total_bytes == 5368709120.0, "MIG power %g memory %g", rd.power_w, rd.mem_total_bytes);
    loom_nvml_close(nv);
    setenv("NVML_STUB_INIT_FAIL", "1", 1);
    CHECK(loom_nvml_open(&nv) == LOOM_EUNAVAIL && strstr(loom_errmsg(), "Driver Not Loaded"), "init failure: %s", loom_errmsg());
    unsetenv("NVML_STUB_INIT_FAIL");
}

static void test_cuda_visible_devices(void) {
    char b[64];
    unsetenv("CUDA_VISIBLE_DEVICES");
    loom_nvml_select_cuda(1, b, sizeof b);
    CHECK(!strcmp(b, "1"), "unset: %s", b);
    setenv("CUDA_VISIBLE_DEVICES", "3, MIG-abc", 1);
    loom_nvml_select_cuda(0, b, sizeof b);
    CHECK(!strcmp(b, "3"), "first: %s", b);
    loom_nvml_select_cuda(1, b, sizeof b);
    CHECK(!strcmp(b, "MIG-abc"), "second: %s", b);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

/* Through the exporter: DCGM names in DCGM's units, and J/token =
 * (2,000,000 - 1,500,000 mJ) / 1000 / (4000 global tokens / 2 ranks) = 0.25.
 * CUDA device 0 is the stand-in's GPU at NVML index 2 (through
 * CUDA_VISIBLE_DEVICES), so the gpu label is 2: NVML's index, as DCGM's. */
static void test_dcgm_names_and_energy_per_token(void) {
    if (!have_stub()) return;
    setenv("LOOM_NVML_LIB", stub, 1);
    setenv("NVML_STUB_ENERGY_MJ", "1500000", 1);
    setenv("NVML_STUB_INDEX", "2", 1);
    setenv("NVML_STUB_XID", "79", 1);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-stub-0", 1);
    loom_train_metrics_opts_t o = {.port = -1, .rank = 0, .world_size = 2, .device = "cuda:0", .gpu = 0, .model = "gpt2-tiny", .steps = 10};
    loom_train_metrics_t *tm;
    CHECK(loom_train_metrics_start(&tm, &o) == LOOM_OK, "%s", loom_errmsg());
    CHECK(isnan(loom_train_metrics_joules_per_token(tm)), "J/token before any token");
    setenv("NVML_STUB_ENERGY_MJ", "2000000", 1);
    loom_train_metrics_step_t st = {.step = 1, .loss = 5.5, .grad_norm = 1, .lr = 1e-3, .tokens = 4000, .tokens_per_s = 8000,
                                    .flops_per_s = 1e12, .mfu = 0.25, .step_s = 0.5, .comm_wait_s = 0.1, .data_s = 0.01};
    loom_train_metrics_step(tm, &st);
    double jpt = loom_train_metrics_joules_per_token(tm);
    CHECK(fabs(jpt - 0.25) < 1e-12, "J/token %.17g, want 0.25", jpt);
    char *text = loom_metrics_render(loom_train_metrics_registry(tm), NULL);
    char host[256] = "", labels[512];
    gethostname(host, sizeof host - 1);
    snprintf(labels, sizeof labels,
             "{gpu=\"2\",UUID=\"GPU-stub-0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia2\",gpu_model=\"NVIDIA A100-SXM4-40GB\","
             "Hostname=\"%s\",GPU_I_PROFILE=\"\",GPU_I_ID=\"\",rank=\"0\"}", host);
    const char *want[] = {
        "DCGM_FI_DEV_POWER_USAGE%s 123.456\n", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION%s 2000000\n", "DCGM_FI_DEV_FB_USED%s 1536\n",
        "DCGM_FI_DEV_FB_TOTAL%s 40960\n", "DCGM_FI_DEV_GPU_UTIL%s 87\n", "DCGM_FI_DEV_SM_CLOCK%s 1410\n", "DCGM_FI_DEV_GPU_TEMP%s 45\n",
        "DCGM_FI_DEV_MIG_MODE%s 0\n", "DCGM_FI_DEV_XID_ERRORS%s 79\n", "loom_gpu_xid_errors_total%s 1\n",
        "loom_energy_joules_total{rank=\"0\",source=\"nvml\"} 500\n",
        "loom_train_energy_joules_per_token{rank=\"0\"} 0.25\n",
        "loom_train_compute_seconds{rank=\"0\"} 0.4\n",
        "loom_train_tokens_total{rank=\"0\"} 2000\n",
        "loom_train_mfu_ratio{rank=\"0\"} 0.25\n",
        "process_cpu_seconds_total{rank=\"0\"} ", "process_start_time_seconds{rank=\"0\"} ", "process_open_fds{rank=\"0\"} ",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[1024];
        snprintf(line, sizeof line, want[i], labels);
        CHECK(strstr(text, line) != NULL, "no %s in:\n%s", line, text);
    }
    free(text);
    loom_train_metrics_stop(tm);
    unsetenv("NVML_STUB_INDEX"), unsetenv("NVML_STUB_XID"), unsetenv("CUDA_VISIBLE_DEVICES");
}

/* On a MIG instance the utilisation series is absent and says why. */
static void test_mig_utilisation_absent(void) {
    if (!have_stub()) return;
    setenv("LOOM_NVML_LIB", stub, 1);
    setenv("CUDA_VISIBLE_DEVICES", "MIG-stub-0", 1);
    loom_metrics_t *r = loom_metrics_new();
    loom_telemetry_t *t = loom_telemetry_open(r, 0, 3);
    CHECK(loom_telemetry_has_gpu(t) && strstr(loom_telemetry_status(t), "MIG instance"), "status: %s", loom_telemetry_status(t));
    char *text = loom_metrics_render(r, NULL);
    CHECK(!strstr(text, "DCGM_FI_DEV_GPU_UTIL{"), "utilisation exposed for MIG:\n%s", text);
    CHECK(strstr(text, "loom_gpu_telemetry_unsupported{gpu=\"0\",field=\"DCGM_FI_DEV_GPU_UTIL\",reason=\"NVML does not report utilisation for MIG instances\",rank=\"3\"} 1"),
          "no reason:\n%s", text);
    CHECK(strstr(text, "GPU_I_PROFILE=\"1g.5gb\""), "no MIG profile label:\n%s", text);
    CHECK(strstr(text, "DCGM_FI_DEV_FB_TOTAL{gpu=\"0\",UUID=\"MIG-stub-0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\","
                       "gpu_model=\"NVIDIA A100-SXM4-40GB MIG 1g.5gb\",Hostname="),
          "MIG labels:\n%s", text);
    CHECK(strstr(text, ",GPU_I_PROFILE=\"1g.5gb\",GPU_I_ID=\"7\",rank=\"3\"} 5120\n"), "MIG memory:\n%s", text);
    free(text);
    loom_telemetry_close(t);
    loom_metrics_free(r);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

static void put(const char *dir, const char *file, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

/* Two packages and a sub-domain (not counted). Package 1 wraps at 10 J:
 * (3.5 - 1.0) + (10 - 5 + 1) = 8.5 J. With 2 local ranks of 50 tokens each:
 * 8.5 / 100 = 0.085 J/token. */
static void test_rapl(void) {
    char root[600], d0[700], d1[700], sub[700];
    snprintf(root, sizeof root, "%s/powercap", tmp);
    setenv("LOOM_POWERCAP_ROOT", root, 1);
    loom_rapl_t *r;
    CHECK(loom_rapl_open(&r) == LOOM_EUNAVAIL && strstr(loom_errmsg(), "unavailable"), "missing folder: %s", loom_errmsg());
    snprintf(d0, sizeof d0, "%s/intel-rapl:0", root);
    snprintf(d1, sizeof d1, "%s/intel-rapl:1", root);
    snprintf(sub, sizeof sub, "%s/intel-rapl:0:0", root);
    mkdir(root, 0755);
    CHECK(loom_rapl_open(&r) == LOOM_EUNAVAIL && strstr(loom_errmsg(), "no intel-rapl package"), "empty folder: %s", loom_errmsg());
    mkdir(d0, 0755);
    mkdir(d1, 0755);
    mkdir(sub, 0755);
    put(d0, "energy_uj", "1000000\n");
    put(d0, "max_energy_range_uj", "262143328850\n");
    put(d1, "energy_uj", "5000000\n");
    put(d1, "max_energy_range_uj", "10000000\n");
    put(sub, "energy_uj", "777\n");
    loom_train_metrics_opts_t o = {.port = -1, .rank = 1, .local_rank = 1, .world_size = 2, .local_world = 2, .device = "cpu", .gpu = -1};
    loom_train_metrics_t *tm;
    CHECK(loom_train_metrics_start(&tm, &o) == LOOM_OK, "%s", loom_errmsg());
    loom_telemetry_t *t = loom_train_metrics_telemetry(tm);
    CHECK(strstr(loom_telemetry_status(t), "no GPU telemetry") && strstr(loom_telemetry_status(t), "RAPL (2 packages)"), "status %s",
          loom_telemetry_status(t));
    put(d0, "energy_uj", "3500000\n");
    put(d1, "energy_uj", "1000000\n");
    put(sub, "energy_uj", "999999999\n");
    loom_train_metrics_step_t st = {.step = 1, .loss = 5, .tokens = 100, .tokens_per_s = 100, .step_s = 1};
    loom_train_metrics_step(tm, &st);
    CHECK(fabs(loom_train_metrics_energy_j(tm) - 8.5) < 1e-9, "energy %.17g J, want 8.5", loom_train_metrics_energy_j(tm));
    CHECK(fabs(loom_train_metrics_joules_per_token(tm) - 0.085) < 1e-12, "J/token %.17g, want 0.085", loom_train_metrics_joules_per_token(tm));
    char *text = loom_metrics_render(loom_train_metrics_registry(tm), NULL);
    CHECK(strstr(text, "loom_energy_joules_total{rank=\"1\",source=\"rapl\"} 8.5\n") && !strstr(text, "DCGM_"), "exposition:\n%s", text);
    free(text);
    loom_train_metrics_stop(tm);
    unsetenv("LOOM_POWERCAP_ROOT");
}

int main(void) {
    build_stub();
    RUN(test_nvml_missing);
    RUN(test_nvml_stub_units);
    RUN(test_cuda_visible_devices);
    RUN(test_dcgm_names_and_energy_per_token);
    RUN(test_mig_utilisation_absent);
    RUN(test_rapl);
    return check_main_end();
}
