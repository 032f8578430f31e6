/* The CUDA paged-cache ops (src/backend/cuda/cuda_paged.cu) against the
 * CPU's on random data, and the engine's greedy tokens on the GPU against
 * the CPU engine's. SKIP without a usable GPU; FAIL instead when
 * LOOM_REQUIRE_GPU=1. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
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

static void *dev_copy(const void *h, size_t bytes) {
    void *d = gpu->alloc(bytes);
    gpu->upload(d, h, bytes);
    return d;
}

static void expect(const char *what, const float *d, const float *ref, size_t n) {
    float *got = malloc(n * sizeof(float));
    gpu->download(got, d, n * sizeof(float));
    double e = check_rel_err(got, ref, n);
    CHECK(e < 1e-5, "%s: normalized error %.3g", what, e);
    free(got);
}

/* kv_write then attention over scattered blocks, three sequences. */
static void paged_attention_matches_cpu(void) {
    if (!gpu_ready()) return;
    enum { NH = 4, hs = 32, C = NH * hs, bs = 8, nb = 20, mb = 6, N = 3 };
    int pos[N] = {0, 13, 41}, seq[N] = {0, 1, 2}, tables[3 * mb], slot[N];
    for (int i = 0; i < 3 * mb; i++) tables[i] = (i * 7 + 3) % nb;
    for (int i = 0; i < N; i++) slot[i] = tables[seq[i] * mb + pos[i] / bs] * bs + pos[i] % bs;
    size_t cache = (size_t)nb * 2 * NH * bs * hs;
    float *kc = calloc(cache, 4), *qkv = malloc(sizeof(float) * N * 3 * C), *out = malloc(sizeof(float) * N * C);
    check_fill(kc, cache, 1.0f, 1), check_fill(qkv, (size_t)N * 3 * C, 1.0f, 3);
    loom_tensor_t hk = {.data = kc, .dtype = LOOM_FP32, .rows = nb * 2 * NH, .cols = bs * hs}, dk = hk;
    dk.data = dev_copy(kc, cache * 4);
    int *dpos = dev_copy(pos, sizeof pos), *dseq = dev_copy(seq, sizeof seq), *dslot = dev_copy(slot, sizeof slot);
    int *dtab = dev_copy(tables, sizeof tables);
    float *dqkv = dev_copy(qkv, sizeof(float) * N * 3 * C), *dout = gpu->alloc(sizeof(float) * N * C);
    cpu->kv_write(&hk, qkv, slot, N, NH, bs);
    cpu->paged_attention(out, qkv, &hk, pos, seq, tables, mb, N, NH, bs);
    gpu->kv_write(&dk, dqkv, dslot, N, NH, bs);
    gpu->paged_attention(dout, dqkv, &dk, dpos, dseq, dtab, mb, N, NH, bs);
    expect("kv_write", dk.data, kc, cache);
    expect("paged_attention", dout, out, (size_t)N * C);
    cpu->kv_copy_block(&hk, tables[0], 19, NH);
    gpu->kv_copy_block(&dk, tables[0], 19, NH);
    expect("kv_copy_block", dk.data, kc, cache);
    free(kc), free(qkv), free(out);
}

/* Greedy tokens of four requests on the GPU engine equal the CPU engine's. */
typedef struct {
    int tok[4][12], n[4];
} got_t;
static void on_ev(void *ctx, const loom_engine_event_t *ev) {
    got_t *g = ctx;
    if (ev->token >= 0 && g->n[ev->index] < 12) g->tok[ev->index][g->n[ev->index]++] = ev->token;
}

static void run_engine(const loom_backend_t *be, got_t *g) {
    loom_gpt_config_t c = {.max_seq_len = 64, .vocab_size = 300, .n_layer = 2, .n_head = 4, .channels = 64};
    loom_gpt_config_finish(&c);
    loom_gpt_t *m;
    loom_engine_t *e;
    loom_engine_config_t ec;
    loom_engine_config_default(&ec);
    ec.kv_bytes = 8 << 20, ec.block_size = 8, ec.debug = 1;
    CHECK(loom_gpt_init(&m, &c, be, 9) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_engine_create(&e, m, NULL, &ec) == LOOM_OK, "%s", loom_errmsg());
    loom_request_params_t p;
    loom_request_params_default(&p);
    p.max_tokens = 12, p.n = 4, p.temperature = 0;
    int prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = (i * 37 + 5) % 300;
    loom_engine_submit(e, prompt, 20, &p, on_ev, g, NULL);
    CHECK(loom_engine_run(e) == LOOM_OK, "%s", loom_errmsg());
    loom_engine_free(e);
    loom_gpt_free(m);
}

static void engine_matches_cpu(void) {
    if (!gpu_ready()) return;
    got_t a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    run_engine(cpu, &a);
    run_engine(gpu, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "greedy tokens differ between the CPU and GPU engines");
}

int main(void) {
    loom_backend_cpu_init(&cpu, 2);
    gpu_status = loom_backend_open(&gpu, "cuda:0", 1, LOOM_FP32);
    if (gpu_status != LOOM_OK) snprintf(no_gpu, sizeof no_gpu, "%s", loom_errmsg());
    RUN(paged_attention_matches_cpu);
    RUN(engine_matches_cpu);
    return check_main_end();
}
