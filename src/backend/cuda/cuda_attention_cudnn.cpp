/* cuda_attention_cudnn: causal attention on the tensor cores through cuDNN's
 * fused SDPA (flash attention), built with NVIDIA's header-only
 * cudnn-frontend graph API. Used at bf16 and fp16 for head sizes that are
 * multiples of 8 up to 128 (GPT-2: 64); fp32 accumulation and softmax inside
 * cuDNN. docs/cuda.md says why cuDNN rather than an own mma.sync kernel.
 *
 * With 16-bit activations (the default at bf16/fp16) cuDNN reads q, k, v
 * straight out of the (B, T, 3C) activation through strides and writes
 * out and dqkv in place; with fp32 activations (LOOM_CUDA_ACTIVATIONS=fp32)
 * each call converts its inputs to the 16-bit type in scratch and the
 * outputs back. The log-sum-exp that cuDNN saves (its "stats", fp32, (B, NH, T)) is
 * backend.h's lse. A graph is built once per (B, T, NH, hs, dtype,
 * direction) and cached; a shape cuDNN refuses is remembered and served by
 * the own kernels (with one warning). Without the cudnn-frontend headers at
 * build time this file compiles to a stub that always declines.
 *
 * Host code only, compiled by the C++ compiler rather than nvcc: the
 * frontend's headers are large, and nvcc would parse them once per GPU
 * architecture. The fp32 <-> 16-bit kernels live in cuda_kernels.cu. */
#include "cuda_internal.h"

#ifdef LOOM_HAVE_CUDNN_FE
#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

namespace fe = cudnn_frontend;
typedef std::shared_ptr<fe::graph::Graph> graph_ptr;
enum { UID_Q = 1, UID_K, UID_V, UID_SCALE, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

static cudnnHandle_t g_cudnn;
static int g_cudnn_state; /* 0 untried, 1 ready, -1 unavailable */
typedef std::tuple<int, int, int, int, int, int> graph_key; /* B, T, NH, hs, dtype, backward */
static std::map<graph_key, graph_ptr> g_graphs;          /* nullptr: cuDNN refused the shape */

static bool cudnn_ready(void) {
    if (g_cudnn_state == 0) {
        cudnnStatus_t st = cudnnCreate(&g_cudnn);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(g_cudnn, g_cuda.stream);
        g_cudnn_state = st == CUDNN_STATUS_SUCCESS ? 1 : -1;
        if (g_cudnn_state < 0)
            loom_warn("cuDNN cannot be used (%s, cuDNN %zu); attention runs on the own kernels",
                      cudnnGetErrorString(st), cudnnGetVersion());
    }
    return g_cudnn_state > 0;
}

/* Tensor (B, NH, T, hs) inside a row-major (B, T, ld) buffer, head h at h*hs. */
static std::shared_ptr<fe::graph::Tensor_attributes> bhtd(graph_ptr &g, const char *name, int uid, int B,
                                                           int NH, int T, int hs, int64_t ld) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({B, NH, T, hs})
                         .set_stride({(int64_t)T * ld, hs, ld, 1}));
}

/* Builds (or finds) the graph; nullptr when cuDNN does not support it. */
static fe::graph::Graph *get_graph(int B, int T, int NH, int hs, bool backward) {
    graph_key key(B, T, NH, hs, (int)g_cuda.dtype, backward);
    auto it = g_graphs.find(key);
    if (it != g_graphs.end()) return it->second.get();
    fe::DataType_t io = g_cuda.dtype == LOOM_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    int64_t C = (int64_t)NH * hs;
    auto Q = bhtd(g, "Q", UID_Q, B, NH, T, hs, 3 * C);
    auto K = bhtd(g, "K", UID_K, B, NH, T, hs, 3 * C);
    auto V = bhtd(g, "V", UID_V, B, NH, T, hs, 3 * C);
    auto scale = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("attn_scale")
                               .set_uid(UID_SCALE)
                               .set_dim({1, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_is_pass_by_value(true)
                               .set_data_type(fe::DataType_t::FLOAT));
    std::vector<int64_t> sdim = {B, NH, T, 1}, sstride = {(int64_t)NH * T, T, 1, 1};
    if (!backward) {
        auto opt = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true)
                       .set_attn_scale(scale).set_causal_mask(true);
        auto [O, stats] = g->sdpa(Q, K, V, opt);
        O->set_output(true).set_uid(UID_O).set_dim({B, NH, T, hs}).set_stride({(int64_t)T * C, hs, C, 1});
        stats->set_output(true).set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT).set_dim(sdim).set_stride(sstride);
    } else {
        auto O = bhtd(g, "O", UID_O, B, NH, T, hs, C);
        auto dO = bhtd(g, "dO", UID_DO, B, NH, T, hs, C);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(UID_STATS)
                                   .set_dim(sdim)
                                   .set_stride(sstride)
                                   .set_data_type(fe::DataType_t::FLOAT));
        /* deterministic: the same dQ bits on every run (docs/cuda.md, "What
         * must be bitwise"); the default accumulates dQ with atomics */
        auto opt = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward")
                       .set_attn_scale(scale).set_causal_mask(true).set_deterministic_algorithm(true);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opt);
        std::vector<int64_t> d = {B, NH, T, hs}, s = {(int64_t)T * 3 * C, hs, 3 * C, 1};
        dQ->set_output(true).set_uid(UID_DQ).set_dim(d).set_stride(s);
        dK->set_output(true).set_uid(UID_DK).set_dim(d).set_stride(s);
        dV->set_output(true).set_uid(UID_DV).set_dim(d).set_stride(s);
    }
    std::string why;
    for (int stage = 0; stage < 5 && why.empty(); stage++) {
        fe::error_t r = stage == 0   ? g->validate()
                        : stage == 1 ? g->build_operation_graph(g_cudnn)
                        : stage == 2 ? g->create_execution_plans({fe::HeurMode_t::A})
                        : stage == 3 ? g->check_support(g_cudnn)
                                     : g->build_plans(g_cudnn);
        if (r.is_bad()) why = r.get_message();
    }
    if (!why.empty()) {
        loom_warn("cuDNN SDPA %s refused B=%d T=%d NH=%d hs=%d %s (%s); that shape runs on the own kernels",
                  backward ? "backward" : "forward", B, T, NH, hs, loom_dtype_name(g_cuda.dtype), why.c_str());
        g_graphs[key] = nullptr;
        return nullptr;
    }
    g_graphs[key] = g;
    return g.get();
}

static void to_lp16(void *dst, const float *src, size_t n) { cuda_to_lp16(dst, src, n, g_cuda.dtype == LOOM_BF16); }
static void from_lp16(float *dst, const void *src, size_t n) { cuda_from_lp16(dst, src, n, g_cuda.dtype == LOOM_BF16); }

static void *workspace(fe::graph::Graph *g) {
    int64_t ws = 0;
    if (g->get_workspace_size(ws).is_bad() || ws <= 0) return nullptr;
    return cuda_scratch(SCRATCH_CUDNN_WS, (size_t)ws);
}

static void execute(fe::graph::Graph *g, std::unordered_map<int64_t, void *> &pack) {
    fe::error_t e = g->execute(g_cudnn, pack, workspace(g));
    if (e.is_bad()) cuda_check_failed(__FILE__, __LINE__, "cuDNN SDPA execute", e.get_message().c_str());
}

bool cuda_attention_cudnn_takes(int C, int NH) {
    int hs = C / NH;
    return (g_cuda.dtype == LOOM_BF16 || g_cuda.dtype == LOOM_FP16) && hs % 8 == 0 && hs <= 128 &&
           C % NH == 0 && cudnn_ready();
}

bool cuda_attention_cudnn_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    fe::graph::Graph *g = get_graph(B, T, NH, C / NH, false);
    if (!g) return false;
    size_t BT = (size_t)B * T;
    bool direct = cuda_act16(); /* activations already 16-bit: no copies */
    char *lp = direct ? nullptr : (char *)cuda_scratch(SCRATCH_ATTN_LP, BT * 4 * C * 2); /* qkv (3C), out (C) */
    void *qkv16 = direct ? (void *)qkv : lp, *out16 = direct ? (void *)out : lp + BT * 3 * C * 2;
    if (!direct) to_lp16(qkv16, qkv, BT * 3 * C);
    float scale = 1.f / sqrtf((float)(C / NH));
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, qkv16}, {UID_K, (char *)qkv16 + C * 2}, {UID_V, (char *)qkv16 + 2 * C * 2},
        {UID_SCALE, &scale}, {UID_O, out16}, {UID_STATS, lse}};
    execute(g, pack);
    if (!direct) from_lp16(out, out16, BT * C);
    return true;
}

/* The backward graph on 16-bit tensors (q, k, v inside qkv; out, dout; dq,
 * dk, dv written inside dqkv). */
static bool cudnn_backward_run(fe::graph::Graph *g, void *dqkv16, const void *dout16, const void *qkv16,
                               const void *out16, const float *lse, int C, int NH) {
    float scale = 1.f / sqrtf((float)(C / NH));
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, (void *)qkv16}, {UID_K, (char *)qkv16 + C * 2}, {UID_V, (char *)qkv16 + 2 * C * 2},
        {UID_SCALE, &scale}, {UID_O, (void *)out16}, {UID_DO, (void *)dout16}, {UID_STATS, (void *)lse},
        {UID_DQ, dqkv16}, {UID_DK, (char *)dqkv16 + C * 2}, {UID_DV, (char *)dqkv16 + 2 * C * 2}};
    execute(g, pack);
    return true;
}

bool cuda_attention_cudnn_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C, int NH) {
    fe::graph::Graph *g = get_graph(B, T, NH, C / NH, true);
    if (!g) return false;
    size_t BT = (size_t)B * T;
    if (cuda_act16()) return cudnn_backward_run(g, dqkv, dout, qkv, out, lse, C, NH);
    char *lp = (char *)cuda_scratch(SCRATCH_ATTN_LP, BT * 8 * C * 2); /* qkv, out, dout, dqkv */
    void *qkv16 = lp, *out16 = lp + BT * 3 * C * 2, *dout16 = lp + BT * 4 * C * 2,
         *dqkv16 = lp + BT * 5 * C * 2;
    to_lp16(qkv16, qkv, BT * 3 * C);
    to_lp16(out16, out, BT * C);
    to_lp16(dout16, dout, BT * C);
    cudnn_backward_run(g, dqkv16, dout16, qkv16, out16, lse, C, NH);
    from_lp16(dqkv, dqkv16, BT * 3 * C);
    return true;
}

#else /* no cudnn-frontend headers at build time: the own kernels serve every call */

bool cuda_attention_cudnn_takes(int, int) { return false; }
bool cuda_attention_cudnn_forward(float *, float *, const float *, int, int, int, int) { return false; }
bool cuda_attention_cudnn_backward(float *, const float *, const float *, const float *, const float *, int,
                                   int, int, int) {
    return false;
}

#endif
