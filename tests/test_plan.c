/* The MIG planner against the placement rules written down here from
 * NVIDIA's MIG User Guide (nvidia-smi mig -lgipp on A100/H100: 1g at
 * {0..6}:1, the two-slice 1g at {0,2,4,6}:2, 2g at {0,2,4}:2, 3g at
 * {0,4}:4, 4g at {0}:4, 7g at {0}:8), not read from the GPU table: every
 * layout it enumerates is valid, known-valid layouts are found, known-
 * invalid ones rejected; and the planner's memory functions against the
 * model's own allocation counters (src/core/mem.h) in this process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_peak.h"
#include "check.h"
#include "core/mem.h"
#include "plan/mig.h"
#include "plan/plan.h"

static loom_gpu_table_t table;

/* The guide's rule for a profile: memory slices and allowed starts. */
static int oracle_rule(const char *name, int *mem, int *starts) {
    static const struct { int g, mem, starts; } rules[] = {
        {1, 1, 0x7f}, {2, 2, 0x15}, {3, 4, 0x11}, {4, 4, 0x01}, {7, 8, 0x01}};
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rules[i].g == name[0] - '0') {
            *mem = rules[i].mem;
            *starts = rules[i].starts;
            return 0;
        }
    return -1;
}

/* Independent validity: overlap, starts and 7 compute slices. */
static int oracle_valid(const loom_gpu_t *g, const loom_mig_layout_t *l) {
    int used = 0, compute = 0;
    double small = 1e9;
    for (int p = 0; p < g->nprofiles; p++)
        if (g->profiles[p].memory_gb < small) small = g->profiles[p].memory_gb;
    for (int i = 0; i < l->n; i++) {
        const loom_mig_profile_t *p = &g->profiles[l->profile[i]];
        int mem, starts;
        if (oracle_rule(p->name, &mem, &starts)) return 0;
        /* The two-slice 1g: twice the smallest profile's memory. */
        if (p->name[0] == '1' && p->memory_gb > 1.5 * small) mem = 2, starts = 0x55;
        if (!(starts >> l->start[i] & 1)) return 0;
        int m = ((1 << mem) - 1) << l->start[i];
        if (m & ~0xff || used & m) return 0;
        used |= m;
        compute += p->name[0] - '0';
    }
    return compute <= 7;
}

static void mig_every_layout_valid(void) {
    for (int k = 0; k < table.n; k++) {
        const loom_gpu_t *g = &table.gpus[k];
        int n = loom_mig_layouts(g, NULL, 0);
        loom_mig_layout_t *all = calloc((size_t)n, sizeof *all);
        loom_mig_layouts(g, all, n);
        int bad = 0, seven = 0;
        for (int i = 0; i < n; i++) {
            bad += !oracle_valid(g, &all[i]);
            seven += all[i].n == 7;
        }
        CHECK(n > 50, "%s: only %d layouts", g->id, n);
        CHECK(bad == 0, "%s: %d of %d layouts break the placement rules", g->id, bad, n);
        CHECK(seven >= 1, "%s: no 7-instance layout", g->id);
        free(all);
    }
}

static int place(const char *gpu, const char *const *names, int n) {
    loom_mig_layout_t l;
    const loom_gpu_t *g = loom_gpu_find(&table, gpu);
    return g && loom_mig_place(g, names, n, &l) == LOOM_OK && oracle_valid(g, &l);
}

static void mig_known_layouts(void) {
    const char *a[] = {"4g.20gb", "2g.10gb", "1g.5gb"}, *b[] = {"3g.20gb", "3g.20gb"};
    const char *c[] = {"1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"};
    const char *d[] = {"2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"}, *e[] = {"4g.20gb", "3g.20gb"};
    const char *f[] = {"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}, *h[] = {"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"};
    CHECK(place("a100-40gb", a, 3), "4g+2g+1g not found");
    CHECK(place("a100-40gb", b, 2), "3g+3g not found");
    CHECK(place("a100-40gb", c, 7), "7 x 1g not found");
    CHECK(place("a100-40gb", d, 4), "2g+2g+2g+1g not found");
    CHECK(place("a100-40gb", e, 2), "4g+3g not found");
    CHECK(place("a100-40gb", f, 4), "4 x 1g.10gb not found");
    CHECK(place("a100-80gb", h, 4), "3g+2g+1g+1g on 80GB not found");
    CHECK(place("h100-80gb", h, 4), "3g+2g+1g+1g on H100 not found");
    const char *x[] = {"4g.20gb", "4g.20gb"}, *y[] = {"4g.20gb", "3g.20gb", "1g.5gb"};
    const char *z[] = {"1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"};
    const char *w[] = {"1g.5gb+me", "1g.5gb+me"}, *v[] = {"7g.40gb", "1g.5gb"}, *u[] = {"3g.20gb", "3g.20gb", "1g.5gb"};
    CHECK(!place("a100-40gb", x, 2), "4g+4g accepted");
    CHECK(!place("a100-40gb", y, 3), "4g+3g+1g accepted");
    CHECK(!place("a100-40gb", z, 8), "8 x 1g accepted");
    CHECK(!place("a100-40gb", w, 2), "two +me instances accepted");
    CHECK(!place("a100-40gb", v, 2), "7g+1g accepted");
    CHECK(!place("a100-40gb", u, 3), "3g+3g+1g accepted");
}

static void mig_plan_fewest_unused(void) {
    const loom_gpu_t *g = loom_gpu_find(&table, "a100-80gb");
    loom_mig_request_t r[8];
    int n;
    loom_mig_layout_t l;
    CHECK(loom_mig_parse_need("kjv:2x10gb,chat:1x20gb,batch:40gb", r, 8, &n) == LOOM_OK && n == 3, "parse");
    CHECK(loom_mig_plan(g, r, n, &l) == LOOM_OK && oracle_valid(g, &l) && l.n == 4, "no layout for the issue's example");
    int mem = 0;
    for (int i = 0; i < l.n; i++) mem += g->profiles[l.profile[i]].memory_slices;
    CHECK(mem == 8, "%d memory slices used; all 8 can be", mem);
    CHECK(loom_mig_parse_need("a:50gb", r, 8, &n) == LOOM_OK && loom_mig_plan(g, r, n, &l) == LOOM_OK &&
              !strcmp(g->profiles[l.profile[0]].name, "7g.80gb"), "50gb should take the 7g");
    CHECK(loom_mig_parse_need("a:8x10gb", r, 8, &n) != LOOM_OK || loom_mig_plan(g, r, n, &l) != LOOM_OK, "8 instances planned");
    CHECK(loom_mig_parse_need("a:2x", r, 8, &n) != LOOM_OK, "bad --need accepted");
}

/* The planner's bytes equal what the model and optimizer allocate. */
static void memory_matches_allocations(void) {
    const loom_backend_t *be;
    CHECK(loom_backend_open(&be, "cpu", 1, LOOM_FP32) == LOOM_OK, "cpu backend");
    loom_gpt_config_t cfg = {.max_seq_len = 32, .vocab_size = 100, .n_layer = 3, .n_head = 2, .channels = 48};
    CHECK(loom_gpt_config_finish(&cfg) == LOOM_OK, "config");
    for (int rc = 0; rc < 3; rc++) {
        size_t before[LOOM_MEM_KINDS];
        for (int k = 0; k < LOOM_MEM_KINDS; k++) before[k] = loom_mem_current((loom_mem_kind)k);
        loom_gpt_t *m;
        CHECK(loom_gpt_init(&m, &cfg, be, 1) == LOOM_OK, "init");
        loom_gpt_set_recompute(m, (loom_recompute)rc);
        CHECK(loom_gpt_alloc_train(m) == LOOM_OK && loom_gpt_alloc_acts(m, 3, 32) == LOOM_OK, "alloc");
        loom_plan_mem_t p;
        loom_plan_train_memory(&cfg, (loom_recompute)rc, 0, 1, 3, 32, 1, 4, 0, &p);
        double got[LOOM_MEM_KINDS], want[LOOM_MEM_KINDS] = {p.params, p.grads, p.optim, p.acts, p.batch};
        for (int k = 0; k < LOOM_MEM_KINDS; k++) {
            got[k] = (double)(loom_mem_current((loom_mem_kind)k) - before[k]);
            CHECK(got[k] == want[k], "recompute %d: %s allocated %.0f, planned %.0f", rc, loom_mem_name((loom_mem_kind)k), got[k], want[k]);
        }
        loom_gpt_free(m);
    }
}

/* The table's peak rates are the trainer's (src/backend/cuda/cuda_peak.c),
 * so a plan's MFU means what `loom train` reports. */
static void peaks_match_trainer_table(void) {
    for (int k = 0; k < table.n; k++) {
        const loom_gpu_t *g = &table.gpus[k];
        loom_cuda_gpu_t dev = {.cc_major = 9, .sms = 132, .clock_khz = 1980000};
        snprintf(dev.name, sizeof dev.name, "%s", g->cuda_name);
        for (int d = LOOM_FP32; d <= LOOM_FP16; d++) {
            char src[320];
            double want = loom_cuda_peak_flops(&dev, (loom_dtype)d, src, sizeof src);
            CHECK(fabs(g->peak_tflops[d] * 1e12 - want) <= 1e-9 * want, "%s %s: table %.1f TFLOP/s, trainer %.1f (%s)", g->id,
                  loom_dtype_name((loom_dtype)d), g->peak_tflops[d], want / 1e12, src);
        }
    }
}

int main(void) {
    if (loom_gpu_table_load(&table, "src/plan/gpus.json") != LOOM_OK) {
        printf("FAIL plan_table: %s\n", loom_errmsg());
        return 1;
    }
    RUN(mig_every_layout_valid);
    RUN(mig_known_layouts);
    RUN(mig_plan_fewest_unused);
    RUN(memory_matches_allocations);
    RUN(peaks_match_trainer_table);
    loom_gpu_table_free(&table);
    return check_main_end();
}
