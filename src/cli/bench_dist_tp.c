/* bench_dist_tp: one rank of `loom bench dist --layout tpN` (bench_dist.c):
 * the world is one tensor-parallel group (or a single rank with every
 * thread: the baseline), every rank steps the same global batch, timing
 * the steps, the wait on the tp group, and the memory the rank holds. */
#include <stdlib.h>

#include "backend/backend.h"
#include "cli/bench_dist.h"
#include "core/mem.h"
#include "parallel/dist.h"
#include "parallel/tp.h"
#include "train/step.h"

/* The seeded global batch every layout sees. */
static int *global_batch(int vocab, int B, int T) {
    size_t n = (size_t)B * T + 1;
    int *all = loom_malloc(n * sizeof(int));
    loom_rng_t rng;
    loom_rng_seed(&rng, 11);
    for (size_t i = 0; i < n; i++) all[i] = (int)(loom_rng_u64(&rng) % (uint64_t)vocab);
    return all;
}

bench_result_t loom_bench_dist_tp_rank(const bench_cfg_t *c, int threads) {
    bench_result_t res = {0};
    int seq = c->seq, vocab = c->vocab, batch = c->batch, steps = c->steps, warmup = c->warmup;
    loom_log_quiet(1);
    loom_dist_t *d = NULL, *g = NULL, *dpg = NULL;
    const loom_backend_t *be;
    loom_gpt_t *full = NULL, *m = NULL;
    loom_tp_t *tp = NULL;
    loom_dp_t *dp = NULL; /* the replicas' reduction over dpg (train/step.h: bucketed, overlapped) */
    loom_dp_opts_t dpo = {.zero = 0, .overlap = 1};
    loom_dist_opts_t dopt = {.transport = "auto", .timeout_s = 120};
    loom_gpt_config_t cfg = {.max_seq_len = seq, .vocab_size = vocab, .n_layer = c->layers, .n_head = c->heads, .channels = c->channels};
    loom_optim_t opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};
    int *all = global_batch(vocab, batch, seq), *in = all;
    loom_status s = loom_dist_init(&d, &dopt);
    if (s == LOOM_OK) s = loom_backend_cpu_init(&be, threads);
    if (s == LOOM_OK) s = loom_gpt_config_finish(&cfg);
    if (s == LOOM_OK) s = loom_gpt_init(&full, &cfg, be, 7);
    int r = loom_dist_rank(d), n = c->dp > 1 ? loom_dist_size(d) / c->dp : loom_dist_size(d); /* the tp group's size */
    if (s == LOOM_OK && loom_dist_size(d) > 1) s = loom_dist_split(d, r / n, r, &g);
    if (s == LOOM_OK && c->dp > 1 && loom_dist_size(d) > 1) s = loom_dist_split(d, r % n, r, &dpg);
    if (s == LOOM_OK && g) s = loom_tp_init(&tp, full, be, g, dpg);
    if (dpg) { /* a replica steps its share of the global batch */
        batch /= c->dp;
        in += (size_t)(r / n) * batch * seq;
    }
    m = tp ? loom_tp_model(tp) : full;
    if (s == LOOM_OK) s = loom_gpt_alloc_train(m);
    if (s == LOOM_OK) s = loom_gpt_alloc_acts(m, batch, seq);
    if (s == LOOM_OK && tp && dpg) s = loom_dp_init(&dp, m, dpg, &dpo);
    if (s == LOOM_OK && tp) { /* a tp rank holds its shard only */
        loom_gpt_free(full);
        full = NULL;
    }
    double tsum = 0, wsum = 0;
    float loss = 0, norm;
    for (int k = 0; s == LOOM_OK && k < warmup + steps; k++) {
        double t0 = loom_now(), w0 = loom_tp_wait_seconds(tp) + loom_tp_dp_wait_seconds(tp);
        s = tp ? loom_train_step_tp(tp, dp, in, in + 1, batch, seq, 1, &opt, 1e-4f, k + 1, &loss, &norm)
               : loom_train_step(m, in, in + 1, batch, seq, 1, &opt, 1e-4f, k + 1, &loss, &norm);
        if (k < warmup) continue;
        tsum += loom_now() - t0;
        wsum += loom_tp_wait_seconds(tp) + loom_tp_dp_wait_seconds(tp) - w0;
    }
    if (s == LOOM_OK) res = (bench_result_t){tsum / steps, wsum / steps, loss, loom_mem_peak_rss(), 16.0 * m->num_params / 1e6, 1};
    else fprintf(stderr, "loom bench dist: tp rank %d: %s\n", loom_dist_rank(d), loom_errmsg());
    free(all);
    loom_dp_free(dp);
    loom_tp_free(tp);
    loom_gpt_free(full);
    loom_dist_free(g);
    loom_dist_free(dpg);
    if (res.ok) loom_dist_free(d);
    return res;
}
