/* The engine on the GPU: greedy tokens of n = 4 samples (shared prompt
 * blocks, copy-on-write) equal the CPU engine's. The ops one by one are in
 * tests/test_cuda_ops.c. SKIP without a usable GPU; FAIL instead when
 * LOOM_REQUIRE_GPU=1. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/quant.h"
#include "model/sparse24.h"
#include "serve/engine.h"

static const loom_backend_t *cpu, *gpu;
static loom_status gpu_status;
static char no_gpu[512];

/* check_available on the status of opening cuda:0 (its message kept). */
static int gpu_ready(void) {
    if (gpu_status == LOOM_OK) return 1;
    loom_error(gpu_status, "%s", no_gpu);
    return check_available(gpu_status, 1);
}

/* Greedy tokens of four requests on the GPU engine equal the CPU engine's. */
typedef struct {
    int tok[4][12], n[4];
} got_t;
static void on_ev(void *ctx, const loom_engine_event_t *ev) {
    got_t *g = ctx;
    if (ev->token >= 0 && g->n[ev->index] < 12) g->tok[ev->index][g->n[ev->index]++] = ev->token;
}

/* quant: loom_quant_mode of the weights; kv: the cache's element type. */
static void run_engine(const loom_backend_t *be, got_t *g, int quant, loom_dtype kv) {
    loom_gpt_config_t c = {.max_seq_len = 64, .vocab_size = 300, .n_layer = 2, .n_head = 4, .channels = 64};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m;
    loom_engine_t *e;
    loom_engine_config_t ec;
    loom_engine_config_default(&ec);
    ec.kv_bytes = 8 << 20, ec.block_size = 8, ec.debug = 1, ec.kv_dtype = kv;
    CHECK(loom_gpt_init(&m, &c, be, 9) == LOOM_OK, "%s", loom_errmsg());
    loom_infer_weights_opts_t wo = {.quant = quant, .sparse = LOOM_SPARSE_OFF};
    CHECK(loom_infer_weights_create(&ec.weights, m, &wo) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_engine_create(&e, m, NULL, &ec) == LOOM_OK, "%s", loom_errmsg());
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 12, p.n = 4, p.temperature = 0;
    int prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = (i * 37 + 5) % 300;
    loom_engine_submit(e, prompt, 20, &p, on_ev, g, NULL);
    CHECK(loom_engine_run(e) == LOOM_OK, "%s", loom_errmsg());
    loom_engine_free(e);
    loom_infer_weights_free(&ec.weights);
    loom_gpt_free(m);
}

/* Greedy tokens of the GPU engine equal the CPU engine's with these weights
 * and cache. */
static void compare_engines(int quant, loom_dtype kv, const char *what) {
    if (!gpu_ready()) return;
    got_t a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    run_engine(cpu, &a, quant, kv);
    run_engine(gpu, &b, quant, kv);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "greedy tokens differ between the CPU and GPU engines (%s)", what);
}

static void engine_matches_cpu(void) { compare_engines(LOOM_QUANT_NONE, LOOM_FP32, "fp32"); }

/* W8A8 weights and an int8 KV cache (src/backend/cuda/cuda_int8.cu), whose
 * kernels repeat the CPU's rounding step for step: the tokens agree as the
 * fp32 ones do. */
static void engine_int8_matches_cpu(void) { compare_engines(LOOM_QUANT_W8A8, LOOM_INT8, "W8A8, int8 KV"); }

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {{"engine_matches_cpu", engine_matches_cpu}, {"engine_int8_matches_cpu", engine_int8_matches_cpu}};
static const char *case_name(int i) { return cases[i].name; }
static void run_case(int i) { check_run(cases[i].name, cases[i].fn); }

/* In each child of check_run_isolated: a CUDA context does not survive
 * fork, so nothing opens in the parent. */
static void open_backends(void) {
    loom_backend_cpu_init(&cpu, 2);
    gpu_status = loom_backend_open(&gpu, "cuda:0", 1, LOOM_FP32);
    if (gpu_status != LOOM_OK) snprintf(no_gpu, sizeof no_gpu, "%s", loom_errmsg());
}

int main(void) {
    /* isolated: a case that panics or faults the GPU fails alone */
    check_run_isolated(2, case_name, open_backends, run_case);
    return check_main_end();
}
