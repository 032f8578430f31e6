/* cuda_backend: opening the CUDA backend (device checks, stream, cuBLASLt,
 * peak FLOP/s), its memory entries, scratch buffers and CUDA graphs. The ops
 * themselves live in cuda_kernels.cu, cuda_matmul.cu and cuda_attention.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_paged.h"
#include "cuda_int8.h"
#include "cuda_sparse24.h"

extern "C" {
#include "cuda_devices.h"
#include "cuda_peak.h"
}

loom_cuda_state g_cuda;

static char g_name[32];

/* cuBLASLt's workspace: NVIDIA recommends 32 MiB on Hopper (4 MiB suffices
 * on Ampere); fixed at init so capture never allocates. */
#define LOOM_CUDA_WORKSPACE (32u << 20)

/* ---- device memory accounting (loom bench train reports the peak) ---- */

#define MEM_TRACKED 4096
static struct {
    void *p;
    size_t bytes;
} g_mem[MEM_TRACKED];
static size_t g_mem_now, g_mem_peak;

/* cudaMalloc, counted; NULL when the device is out of memory. */
static void *dev_malloc(size_t bytes) {
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear it, so the next launch check does not report it */
        return nullptr;
    }
    for (int i = 0; i < MEM_TRACKED; i++)
        if (!g_mem[i].p) {
            g_mem[i].p = p, g_mem[i].bytes = bytes;
            break;
        }
    g_mem_now += bytes;
    if (g_mem_now > g_mem_peak) g_mem_peak = g_mem_now;
    return p;
}

static void dev_free(void *p) {
    for (int i = 0; p && i < MEM_TRACKED; i++)
        if (g_mem[i].p == p) {
            cuda_sparse24_forget(p, g_mem[i].bytes); /* cuda_sparse24.cu: 2:4 weights prepared from it */
            g_mem_now -= g_mem[i].bytes;
            g_mem[i].p = nullptr;
            break;
        }
    CUDA_CHECK(cudaFree(p));
}

/* Bytes loom has allocated on the device now and at most so far (model,
 * activations, optimizer state, scratch, cuBLAS workspace). */
extern "C" void loom_cuda_mem_stats(size_t *now, size_t *peak) {
    *now = g_mem_now;
    *peak = g_mem_peak;
}

/* ---- scratch ---- */

static struct {
    void *p;
    size_t bytes;
} g_scratch[SCRATCH_COUNT];

int cuda_capturing(void) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(g_cuda.stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

void *cuda_scratch(int slot, size_t bytes) {
    if (bytes <= g_scratch[slot].bytes) return g_scratch[slot].p;
    if (cuda_capturing())
        loom_panic(__FILE__, __LINE__,
                   "CUDA graph capture needs %zu bytes of scratch (slot %d) but %zu were "
                   "allocated: run one plain step with the same shapes before capturing",
                   bytes, slot, g_scratch[slot].bytes);
    /* Ops already queued may still read the old buffer. */
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    /* Captured graphs point at the old buffer: drop them, so that their
     * replay fails (graph_replay returns LOOM_EINVAL) instead of reading
     * freed memory; the trainer captures again. */
    if (g_scratch[slot].p) cuda_graph_reset();
    if (g_scratch[slot].p) dev_free(g_scratch[slot].p);
    size_t grow = bytes + bytes / 4; /* room for slightly larger shapes later */
    g_scratch[slot].p = dev_malloc(grow);
    if (!g_scratch[slot].p)
        loom_panic(__FILE__, __LINE__, "the GPU has no room for %zu bytes of scratch (slot %d)", grow, slot);
    g_scratch[slot].bytes = grow;
    return g_scratch[slot].p;
}

/* ---- memory ---- */

void *cuda_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = dev_malloc(bytes);
    if (!p) return nullptr;
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    return p;
}

void cuda_free(void *p) {
    if (p) dev_free(p);
}

/* The synchronous entries cannot be part of a graph; say so instead of
 * letting the capture fail later with a vaguer message. */
static void refuse_in_capture(const char *what) {
    if (cuda_capturing())
        loom_panic(__FILE__, __LINE__,
                   "%s was called while a CUDA graph was being captured; it synchronizes "
                   "with the host, so call it before graph_begin or after graph_end",
                   what);
}

void cuda_upload(void *dst, const void *src, size_t bytes) {
    refuse_in_capture("upload");
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream)); /* src may be reused at once */
}

void cuda_download(void *dst, const void *src, size_t bytes) {
    refuse_in_capture("download");
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
}

void cuda_zero(void *p, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_cuda.stream));
}

void cuda_sync(void) {
    refuse_in_capture("sync");
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
}

/* ---- CUDA graphs ---- */

#define LOOM_CUDA_GRAPHS 16
static struct {
    int used, key;
    cudaGraphExec_t exec;
} g_graphs[LOOM_CUDA_GRAPHS];
static int g_capture_key = -1;
static char g_capture_error[512]; /* the first failed call during the open capture */

void cuda_check_failed(const char *file, int line, const char *call, const char *msg) {
    if (g_capture_key < 0) loom_panic(file, line, "%s: %s", call, msg);
    if (!g_capture_error[0])
        snprintf(g_capture_error, sizeof g_capture_error, "%s:%d: %s: %s", file, line, call, msg);
    cudaGetLastError(); /* the capture is broken; graph_end reports it */
}

loom_status cuda_graph_begin(int key) {
    if (g_capture_key >= 0)
        return loom_error(LOOM_EINVAL, "graph_begin(%d): graph %d is still being captured",
                          key, g_capture_key);
    /* Thread-local mode: an unsafe call (cudaMalloc, a sync) from this
     * thread during capture fails instead of silently breaking the graph. */
    cudaError_t e = cudaStreamBeginCapture(g_cuda.stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
        return loom_error(LOOM_EINTERNAL, "graph_begin(%d): %s", key, cudaGetErrorString(e));
    g_capture_key = key;
    g_capture_error[0] = 0;
    return LOOM_OK;
}

static void graph_drop(int i) {
    if (g_graphs[i].used) CUDA_CHECK(cudaGraphExecDestroy(g_graphs[i].exec));
    g_graphs[i].used = 0;
}

loom_status cuda_graph_end(int key) {
    if (g_capture_key != key)
        return loom_error(LOOM_EINVAL, "graph_end(%d): no capture of graph %d is open", key,
                          key);
    g_capture_key = -1;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(g_cuda.stream, &graph);
    if (g_capture_error[0]) {
        cudaGetLastError();
        if (e == cudaSuccess && graph) CUDA_CHECK(cudaGraphDestroy(graph));
        return loom_error(LOOM_EINTERNAL, "graph_end(%d): a call failed during capture: %s", key,
                          g_capture_error);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return loom_error(LOOM_EINTERNAL,
                          "graph_end(%d): capture failed: %s (an op that synchronizes, "
                          "allocates or uses host memory ran during capture)",
                          key, cudaGetErrorString(e));
    }
    int slot = -1;
    for (int i = 0; i < LOOM_CUDA_GRAPHS; i++)
        if (g_graphs[i].used && g_graphs[i].key == key) slot = i;
    for (int i = 0; slot < 0 && i < LOOM_CUDA_GRAPHS; i++)
        if (!g_graphs[i].used) slot = i;
    if (slot < 0) {
        CUDA_CHECK(cudaGraphDestroy(graph));
        return loom_error(LOOM_EINVAL, "graph_end(%d): all %d graph slots are in use; call "
                          "graph_reset first", key, LOOM_CUDA_GRAPHS);
    }
    graph_drop(slot);
    cudaGraphExec_t exec;
    e = cudaGraphInstantiate(&exec, graph, 0);
    CUDA_CHECK(cudaGraphDestroy(graph));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return loom_error(LOOM_EINTERNAL, "graph_end(%d): instantiate: %s", key,
                          cudaGetErrorString(e));
    }
    g_graphs[slot].used = 1;
    g_graphs[slot].key = key;
    g_graphs[slot].exec = exec;
    return LOOM_OK;
}

loom_status cuda_graph_replay(int key) {
    for (int i = 0; i < LOOM_CUDA_GRAPHS; i++)
        if (g_graphs[i].used && g_graphs[i].key == key) {
            cudaError_t e = cudaGraphLaunch(g_graphs[i].exec, g_cuda.stream);
            if (e != cudaSuccess)
                return loom_error(LOOM_EINTERNAL, "graph_replay(%d): %s", key,
                                  cudaGetErrorString(e));
            return LOOM_OK;
        }
    return loom_error(LOOM_EINVAL, "graph_replay(%d): no graph was captured under key %d", key,
                      key);
}

void cuda_graph_reset(void) {
    for (int i = 0; i < LOOM_CUDA_GRAPHS; i++) graph_drop(i);
}

/* ---- init ---- */

/* First-time setup of the per-process state on device `index`. */
static loom_status state_init(int index, const cudaDeviceProp *prop) {
    CUDA_CHECK(cudaSetDevice(index));
    g_cuda.device = index;
    g_cuda.num_sms = prop->multiProcessorCount;
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_cuda.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&g_cuda.lt));
    CUBLAS_CHECK(cublasCreate(&g_cuda.blas));
    CUBLAS_CHECK(cublasSetStream(g_cuda.blas, g_cuda.stream));
    g_cuda.workspace_bytes = LOOM_CUDA_WORKSPACE;
    g_cuda.workspace = dev_malloc(g_cuda.workspace_bytes);
    g_cuda.reduce = (double *)dev_malloc(1025 * sizeof(double));
    if (!g_cuda.workspace || !g_cuda.reduce) {
        return loom_error(LOOM_ENOMEM, "cuda:%d: cannot allocate %u MiB of cuBLAS workspace",
                          index, LOOM_CUDA_WORKSPACE >> 20);
    }
    CUBLAS_CHECK(cublasSetWorkspace(g_cuda.blas, g_cuda.workspace, g_cuda.workspace_bytes));
    cuda_attention_init();
    g_cuda.ready = 1;
    return LOOM_OK;
}

/* The op table: every entry of ops.h whose kernel cuda_<name> exists
 * (cuda_internal.h declares them from the list; all of them today), and
 * the capability flags. */
static void fill_table(loom_backend_t *b, loom_dtype dtype, double peak, const char *peak_source) {
    memset(b, 0, sizeof *b);
    b->name = g_name;
    b->dtype = dtype;
    b->peak_flops = peak;
    b->peak_source = peak_source;
    b->caps = LOOM_CAP_DEVICE_MEMORY | LOOM_CAP_DEVICE_STEP | LOOM_CAP_GRAPHS |
              (dtype == LOOM_FP16 ? (unsigned)LOOM_CAP_LOSS_SCALING : 0u);
    b->act_dtype = g_cuda.act;
    /* int8: int8 weights and the int8 KV cache (cuda_int8.cu) */
    b->dtypes = LOOM_DTYPE_BIT(LOOM_FP32) | LOOM_DTYPE_BIT(LOOM_INT32) | LOOM_DTYPE_BIT(g_cuda.act) |
                LOOM_DTYPE_BIT(LOOM_INT8);
#define CUDA_SLOT_(name, ret, kind, fallback, flops, n, args) b->name = cuda_##name;
    LOOM_OPS(CUDA_SLOT_)
#undef CUDA_SLOT_
}

/* One table per (dtype, activation type), filled at its first open and
 * never rewritten, so a caller holding the table of an earlier open keeps
 * what it was given. The kernels follow the process's current dtype
 * (g_cuda), which each open sets: one dtype at a time per process (the
 * GPU tests open fp32, bf16 and fp16 in turn). */
static loom_backend_t g_tables[LOOM_DTYPE_COUNT][2];
static char g_peak_sources[LOOM_DTYPE_COUNT][2][320];

extern "C" loom_status loom_backend_cuda_init(const loom_backend_t **out, int index,
                                              loom_dtype dtype) {
    char why[256];
    int count = loom_cuda_device_count(why, sizeof why);
    if (count < 0)
        return loom_error(LOOM_EUNAVAIL,
                          "--device cuda:%d: CUDA cannot be used on this machine: %s; use "
                          "--device cpu",
                          index, why);
    if (count == 0)
        return loom_error(LOOM_EUNAVAIL, "--device cuda:%d: CUDA sees no GPU on this machine",
                          index);
    if (index < 0 || index >= count)
        return loom_error(LOOM_EINVAL,
                          "--device cuda:%d: only %d CUDA device(s) are visible (cuda:0 to "
                          "cuda:%d); `loom devices` lists them",
                          index, count, count - 1);
    if (g_cuda.ready && g_cuda.device != index)
        return loom_error(LOOM_EINVAL,
                          "--device cuda:%d: this process already uses cuda:%d; one CUDA "
                          "device per process (start one process per GPU)",
                          index, g_cuda.device);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    if ((dtype == LOOM_BF16 || dtype == LOOM_TF32) && prop.major < 8)
        return loom_error(LOOM_EUNAVAIL,
                          "--dtype %s: %s (compute capability %d.%d) has no %s tensor cores; "
                          "use --dtype fp16 or fp32",
                          loom_dtype_name(dtype), prop.name, prop.major, prop.minor,
                          loom_dtype_name(dtype));
    if (!g_cuda.ready) {
        CUDA_CHECK(cudaSetDevice(index));
        cudaError_t e = cuda_kernels_probe();
        if (e != cudaSuccess) {
            cudaGetLastError();
            return loom_error(LOOM_EUNAVAIL,
                              "--device cuda:%d: %s is compute capability %d.%d and this loom "
                              "has no kernels for it (%s); rebuild with "
                              "CUDA_ARCHS=\"-gencode arch=compute_%d%d,code=sm_%d%d\"",
                              index, prop.name, prop.major, prop.minor, cudaGetErrorString(e),
                              prop.major, prop.minor, prop.major, prop.minor);
        }
        LOOM_TRY(state_init(index, &prop));
    }
    g_cuda.dtype = dtype;
    /* Activations in 16 bits at bf16/fp16 (docs/cuda.md); LOOM_CUDA_ACTIVATIONS=fp32
     * keeps them fp32 with the tensor cores still rounding inside the GEMMs. */
    const char *acts = getenv("LOOM_CUDA_ACTIVATIONS");
    bool act16 = (dtype == LOOM_BF16 || dtype == LOOM_FP16) && !(acts && strcmp(acts, "fp32") == 0);
    g_cuda.act = act16 ? dtype : LOOM_FP32;
    const char *att = getenv("LOOM_CUDA_ATTENTION");
    g_cuda.attention_unfused = att && strcmp(att, "unfused") == 0;
    g_cuda.attention_own = att && strcmp(att, "own") == 0;
    cuda_matmul_reset(); /* the cached algorithms depend on the compute type */

    snprintf(g_name, sizeof g_name, "cuda:%d", index);
    loom_backend_t *b = &g_tables[dtype][g_cuda.act != LOOM_FP32];
    if (!b->name) {
        int clock_khz = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index));
        loom_cuda_gpu_t gpu;
        memset(&gpu, 0, sizeof gpu);
        snprintf(gpu.name, sizeof gpu.name, "%s", prop.name);
        gpu.cc_major = prop.major;
        gpu.cc_minor = prop.minor;
        gpu.sms = prop.multiProcessorCount;
        gpu.clock_khz = clock_khz;
        char *source = g_peak_sources[dtype][g_cuda.act != LOOM_FP32];
        double peak = loom_cuda_peak_flops(&gpu, dtype, source, sizeof g_peak_sources[0][0]);
        fill_table(b, dtype, peak, source);
    }
    *out = b;
    return LOOM_OK;
}
