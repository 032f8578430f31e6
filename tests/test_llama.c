/* The Llama family against Hugging Face transformers.
 *
 * tests/llama_oracle.py (transformers 4.44 under .deps/hf44) builds four
 * small random models with transformers' own classes and saves them:
 * LlamaForCausalLM with GQA (2 kv heads for 4 query heads), an untied head
 * and Llama 3's rope scaling; LlamaForCausalLM tied with linear scaling;
 * MistralForCausalLM; Qwen2ForCausalLM (q/k/v biases, tied). Vocabulary 331,
 * MLP width 100: multiples of nothing. For each, loom loads the folder and:
 *   - its logits equal transformers' (float64 reference; normalized error
 *     below 1e-5 in fp32);
 *   - the KV-cached inference path (one token at a time, blocks of 4)
 *     equals the full forward at every position;
 *   - greedy generation equals generate() for 50 tokens;
 *   - one training step's loss and every gradient equal PyTorch's (1e-5);
 *   - `loom export --format hf`'s writer makes a folder transformers loads
 *     with equal logits;
 * and bad folders are refused naming the file and the field. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "ckpt/hf.h"
#include "model/generate.h"
#include "model/infer.h"

#define PYTHON "/usr/bin/python3"
#define DEPS ".deps/hf44"
#define B 2
#define T 24
#define GEN 50

static const char *const variants[] = {"llama3", "llama_tied", "mistral", "qwen2"};
#define NV 4
static const loom_backend_t *be;
static char root[512];
static int made = -1; /* 1: the oracle wrote its folders; 0: skipped; -1: not yet run */

/* Run the oracle with `args`; 1 = RESULT ok, 0 = failed, -1 = cannot run. */
static int oracle(const char *args) {
    char cmd[2048], line[1024], last[1024] = "";
    if (access(PYTHON, X_OK) != 0) {
        check_skip("%s not found", PYTHON);
        return -1;
    }
    snprintf(cmd, sizeof cmd, "PYTHONPATH=" DEPS " " PYTHON " tests/llama_oracle.py %s 2>&1", args);
    FILE *p = popen(cmd, "r");
    int result = -2;
    while (p && fgets(line, sizeof line, p)) {
        if (!strncmp(line, "RESULT ", 7)) result = !strncmp(line + 7, "ok", 2);
        else if (!strncmp(line, "ok ", 3)) printf("  %s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    if (p) pclose(p);
    if (result == -2 && strstr(last, "ModuleNotFoundError")) {
        check_skip("transformers is not installed under " DEPS " (scripts/deps.sh): %s", last);
        return -1;
    }
    CHECK(result != -2, "oracle %s did not finish: %s", args, last);
    return result == 1;
}

/* The oracle's folders, made once for every case. */
static int ready(void) {
    if (made < 0) {
        snprintf(root, sizeof root, "%s", check_tmpdir("llama"));
        char args[600];
        snprintf(args, sizeof args, "make %s", root);
        made = oracle(args);
    }
    if (made == 0) check_fail_why("the oracle could not build the models");
    if (made < 0) check_skip("the oracle did not run");
    return made == 1;
}

/* A file of the variant's folder into a new buffer of `n` elements of `size`. */
static void *load(const char *v, const char *file, size_t n, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", root, v, file);
    void *buf = loom_calloc(n ? n : 1, size);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, size, n, f) : 0;
    if (f) fclose(f);
    CHECK(got == n, "%s: %zu of %zu elements", path, got, n);
    return buf;
}

/* Folder root/v through loom's loader: config, model, weights. */
static loom_status load_folder(const char *v, loom_gpt_t **out) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, v);
    loom_gpt_config_t cfg;
    loom_gpt_t *m = NULL;
    loom_status s = loom_hf_read_config(dir, &cfg);
    if (s == LOOM_OK) s = loom_gpt_create(&m, &cfg, be);
    if (s == LOOM_OK) s = loom_hf_load_weights(m, dir);
    if (s != LOOM_OK) loom_gpt_free(m), m = NULL;
    *out = m;
    return s;
}

static loom_gpt_t *open_model(const char *v) {
    loom_gpt_t *m;
    loom_status s = load_folder(v, &m);
    CHECK(s == LOOM_OK, "%s/%s: %s", root, v, loom_errmsg());
    return m;
}

/* loom's logits of the oracle's batch against the float64 reference. */
static double logits_error(loom_gpt_t *m, const char *v, const char *ref_file) {
    int V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    int *tok = load(v, "tokens.i32", B * T, sizeof(int));
    double *ref = load(v, ref_file, (size_t)B * T * V, sizeof(double));
    float *lg = loom_malloc((size_t)B * T * Vp * sizeof(float)), *packed = loom_malloc((size_t)B * T * V * sizeof(float));
    CHECK(loom_gpt_forward(m, tok, NULL, B, T, 0.0f, NULL) == LOOM_OK, "forward: %s", loom_errmsg());
    loom_gpt_logits(m, lg, B, T);
    for (int r = 0; r < B * T; r++) memcpy(packed + (size_t)r * V, lg + (size_t)r * Vp, (size_t)V * sizeof(float));
    double e = check_rel_err_d(packed, ref, (size_t)B * T * V);
    free(tok), free(ref), free(lg), free(packed);
    return e;
}

static void logits_equal_transformers(void) {
    if (!ready()) return;
    for (int k = 0; k < NV; k++) {
        loom_gpt_t *m = open_model(variants[k]);
        if (!m) continue;
        double e = logits_error(m, variants[k], "logits.f64");
        printf("  %-10s logits normalized error %.2e (kv heads %d of %d, %s head)\n", variants[k], e, m->cfg.n_kv_heads,
               m->cfg.n_head, m->cfg.untied_head ? "untied" : "tied");
        CHECK(e < 1e-5, "%s: logits normalized error %.3g", variants[k], e);
        loom_gpt_free(m);
    }
}

/* Sequence 0 fed one token at a time through the paged cache (blocks of 4
 * tokens, in reverse order so that table lookups matter) against the full
 * forward's row of each position. */
static void kv_cache_equals_full_forward(void) {
    if (!ready()) return;
    for (int k = 0; k < NV; k++) {
        loom_gpt_t *m = open_model(variants[k]);
        if (!m) continue;
        int Vp = m->cfg.padded_vocab_size, bs = 4, nb = T / bs, table[T / 4];
        for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;
        int *tok = load(variants[k], "tokens.i32", B * T, sizeof(int));
        float *full = loom_malloc((size_t)T * Vp * sizeof(float)), *row = loom_malloc((size_t)Vp * sizeof(float));
        CHECK(loom_gpt_forward(m, tok, NULL, 1, T, 0.0f, NULL) == LOOM_OK, "forward: %s", loom_errmsg());
        loom_gpt_logits(m, full, 1, T);
        loom_infer_t *inf;
        CHECK(loom_infer_create(&inf, m, nb, bs, LOOM_FP32, 4, 1, 1) == LOOM_OK, "%s", loom_errmsg());
        double worst = 0;
        for (int p = 0; p < T; p++) {
            int seq = 0, r = 0;
            loom_infer_batch_t b = {.n_tokens = 1, .tokens = tok + p, .pos = &p, .seq = &seq, .n_seqs = 1,
                                    .block_tables = table, .n_logits = 1, .logit_rows = &r};
            CHECK(loom_infer_forward(inf, &b, row) == LOOM_OK, "%s", loom_errmsg());
            double e = check_rel_err(row, full + (size_t)p * Vp, (size_t)m->cfg.vocab_size);
            worst = e > worst ? e : worst;
            CHECK(e < 1e-5, "%s position %d: cached vs full normalized error %.3g", variants[k], p, e);
        }
        printf("  %-10s cached decode vs full forward, worst of %d positions: %.2e\n", variants[k], T, worst);
        loom_infer_free(inf);
        free(tok), free(full), free(row);
        loom_gpt_free(m);
    }
}

static int collect(int token, void *ctx) {
    int *v = ctx;
    v[1 + v[0]++] = token;
    return 0;
}

static void greedy_equals_generate(void) {
    if (!ready()) return;
    for (int k = 0; k < NV; k++) {
        loom_gpt_t *m = open_model(variants[k]);
        if (!m) continue;
        int *pr = load(variants[k], "prompt.i32", 6, sizeof(int)), *ref = load(variants[k], "gen.i32", GEN, sizeof(int));
        uint32_t prompt[6];
        for (int i = 0; i < 6; i++) prompt[i] = (uint32_t)pr[i];
        int got[1 + GEN] = {0};
        loom_sampling_t greedy = {.temperature = 0, .top_k = 0, .top_p = 1};
        loom_rng_t rng;
        loom_rng_seed(&rng, 1);
        CHECK(loom_gpt_generate(m, prompt, 6, GEN, &greedy, &rng, collect, got) == LOOM_OK, "%s", loom_errmsg());
        int same = 0;
        while (same < GEN && got[1 + same] == ref[same]) same++;
        printf("  %-10s greedy: %d of %d tokens equal generate()'s\n", variants[k], same, GEN);
        CHECK(got[0] == GEN && same == GEN, "%s: first difference at token %d: loom %d, transformers %d", variants[k], same,
              got[1 + (same < GEN ? same : 0)], ref[same < GEN ? same : 0]);
        free(pr), free(ref);
        loom_gpt_free(m);
    }
}

/* One training step's loss and gradients, every tensor by its HF name. */
static void training_step_equals_pytorch(void) {
    if (!ready()) return;
    for (int k = 0; k < NV; k++) {
        const char *v = variants[k];
        loom_gpt_t *m = open_model(v);
        if (!m) continue;
        int *tok = load(v, "tokens.i32", B * T, sizeof(int)), *tg = load(v, "targets.i32", B * T, sizeof(int));
        double *ref_loss = load(v, "loss.f64", 1, sizeof(double));
        float loss = 0;
        CHECK(loom_gpt_alloc_train(m) == LOOM_OK, "%s", loom_errmsg());
        loom_gpt_zero_grad(m);
        CHECK(loom_gpt_forward(m, tok, tg, B, T, 1.0f / (B * T), &loss) == LOOM_OK, "%s", loom_errmsg());
        loom_gpt_backward(m, B, T);
        double le = fabs(loss - *ref_loss) / fabs(*ref_loss), worst = 0;
        CHECK(le < 1e-5, "%s: loss %.8g vs %.8g", v, loss, *ref_loss);
        float *g = loom_malloc(m->num_params * sizeof(float));
        be->download(g, m->grads, m->num_params * sizeof(float));
        loom_xtensor_t *x;
        int n = loom_xtensors(&m->cfg, &x);
        for (int i = 0; i < n; i++) {
            char file[128];
            snprintf(file, sizeof file, "grad/%s.f64", x[i].hf);
            double *ref = load(v, file, x[i].numel, sizeof(double));
            double e = check_rel_err_d(loom_xtensor_view(m, g, &x[i]), ref, x[i].numel);
            worst = e > worst ? e : worst;
            CHECK(e < 1e-5, "%s: gradient of %s: normalized error %.3g", v, x[i].hf, e);
            free(ref);
        }
        printf("  %-10s loss %.6f (error %.1e), %d gradients, worst normalized error %.2e\n", v, loss, le, n, worst);
        free(x), free(g), free(tok), free(tg), free(ref_loss);
        loom_gpt_free(m);
    }
}

typedef struct {
    const loom_gpt_t *m;
    float *host;
} host_src_t;

static loom_status from_host(void *ctx, const loom_xtensor_t *x, float *out) {
    host_src_t *h = ctx;
    memcpy(out, loom_xtensor_view(h->m, h->host, x), x->numel * sizeof(float));
    return LOOM_OK;
}

/* The export's folders, loaded by transformers itself (one oracle run for
 * all), give logits equal to the reference. */
static void export_loads_in_transformers(void) {
    if (!ready()) return;
    loom_tokenizer_t *tok;
    LOOM_ASSERT(loom_tokenizer_bytes(&tok) == LOOM_OK);
    char args[8192] = "logits";
    for (int k = 0; k < NV; k++) {
        const char *v = variants[k];
        loom_gpt_t *m = open_model(v);
        if (!m) continue;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s/export", root, v);
        host_src_t h = {m, loom_malloc(m->num_params * sizeof(float))};
        be->download(h.host, m->params, m->num_params * sizeof(float));
        CHECK(loom_hf_write(dir, 1, &m->cfg, tok, LOOM_XDT_F32, from_host, &h) == LOOM_OK, "%s: %s", dir, loom_errmsg());
        size_t len = strlen(args);
        snprintf(args + len, sizeof args - len, " %s %s/%s/export_logits.f64", dir, root, v);
        free(h.host);
        loom_gpt_free(m);
    }
    loom_tokenizer_free(tok);
    if (oracle(args) != 1) return;
    for (int k = 0; k < NV; k++) {
        loom_gpt_t *m = open_model(variants[k]);
        if (!m) continue;
        double e = logits_error(m, variants[k], "export_logits.f64");
        printf("  %-10s exported folder in transformers: logits normalized error %.2e\n", variants[k], e);
        CHECK(e < 1e-5, "%s: exported folder's logits in transformers differ: %.3g", variants[k], e);
        loom_gpt_free(m);
    }
}

/* Sharded fp16 and single-file bf16 folders against the float64 logits of
 * their own rounded weights. */
static void encodings_and_shards(void) {
    if (!ready()) return;
    static const char *const copies[] = {"llama3_f16", "qwen2_bf16"};
    for (int k = 0; k < 2; k++) {
        loom_gpt_t *m = open_model(copies[k]);
        if (!m) continue;
        double e = logits_error(m, copies[k], "logits.f64");
        printf("  %-10s logits normalized error %.2e\n", copies[k], e);
        CHECK(e < 1e-5, "%s: logits normalized error %.3g", copies[k], e);
        loom_gpt_free(m);
    }
}

/* A copy of folder `from` as `to`, config.json edited by `edit` (NULL: as is). */
static void copy_folder(const char *from, const char *to, void (*edit)(cJSON *)) {
    char cmd[3000], path[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/%s' '%s/%s'", root, to, root, from, root, to);
    CHECK(system(cmd) == 0, "%s", cmd);
    if (!edit) return;
    snprintf(path, sizeof path, "%s/%s/config.json", root, to);
    char *text;
    size_t len;
    LOOM_ASSERT(loom_file_read(path, &text, &len) == LOOM_OK);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    edit(j);
    char *out = cJSON_Print(j);
    LOOM_ASSERT(loom_file_write_atomic(path, out, strlen(out)) == LOOM_OK);
    free(out);
    cJSON_Delete(j);
}

static void set_arch(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "architectures", cJSON_CreateStringArray((const char *[]){"FalconForCausalLM"}, 1));
}
static void set_kv3(cJSON *j) { cJSON_ReplaceItemInObject(j, "num_key_value_heads", cJSON_CreateNumber(3)); }
static void set_mlp101(cJSON *j) { cJSON_ReplaceItemInObject(j, "intermediate_size", cJSON_CreateNumber(101)); }
static void set_yarn(cJSON *j) {
    cJSON *rs = cJSON_GetObjectItem(j, "rope_scaling");
    cJSON_ReplaceItemInObject(rs, "rope_type", cJSON_CreateString("yarn"));
}

/* What loading `dir` says: the status, and the message in msg. */
static loom_status try_load(const char *dir, char *msg, size_t cap) {
    loom_gpt_t *m;
    loom_status s = load_folder(dir, &m);
    snprintf(msg, cap, "%s", s == LOOM_OK ? "" : loom_errmsg());
    loom_gpt_free(m);
    return s;
}

/* Each refusal names the file and the field (or tensor, or shard). */
static void bad_folders_are_refused(void) {
    if (!ready()) return;
    char msg[1024];
    copy_folder("llama3", "bad_arch", set_arch);
    CHECK(try_load("bad_arch", msg, sizeof msg) == LOOM_EUNAVAIL && strstr(msg, "bad_arch/config.json") &&
              strstr(msg, "architectures FalconForCausalLM"), "unknown architecture: %s", msg);
    printf("  %s\n", msg);
    copy_folder("llama3", "bad_kv", set_kv3);
    CHECK(try_load("bad_kv", msg, sizeof msg) != LOOM_OK && strstr(msg, "bad_kv/config.json") &&
              strstr(msg, "num_key_value_heads 3 does not divide num_attention_heads 4"), "kv heads: %s", msg);
    printf("  %s\n", msg);
    copy_folder("llama3", "bad_rope", set_yarn);
    CHECK(try_load("bad_rope", msg, sizeof msg) == LOOM_EUNAVAIL && strstr(msg, "bad_rope/config.json") &&
              strstr(msg, "rope_scaling.rope_type \"yarn\""), "yarn: %s", msg);
    printf("  %s\n", msg);
    copy_folder("llama3", "bad_shape", set_mlp101);
    CHECK(try_load("bad_shape", msg, sizeof msg) == LOOM_EFORMAT && strstr(msg, "bad_shape/model.safetensors") &&
              strstr(msg, "model.layers.0.mlp.gate_proj.weight has shape [100,64]"), "wrong shape: %s", msg);
    printf("  %s\n", msg);
    copy_folder("llama3_f16", "bad_shard", NULL);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm '%s/bad_shard/model-00002-of-'*.safetensors", root);
    CHECK(system(cmd) == 0, "%s", cmd);
    CHECK(try_load("bad_shard", msg, sizeof msg) == LOOM_EINVAL && strstr(msg, "bad_shard/model.safetensors.index.json") &&
              strstr(msg, "shard model-00002-of-") && strstr(msg, "is missing"), "missing shard: %s", msg);
    printf("  %s\n", msg);
}

int main(void) {
    LOOM_ASSERT(loom_backend_cpu_init(&be, 2) == LOOM_OK);
    RUN(logits_equal_transformers);
    RUN(kv_cache_equals_full_forward);
    RUN(greedy_equals_generate);
    RUN(training_step_equals_pytorch);
    RUN(export_loads_in_transformers);
    RUN(encodings_and_shards);
    RUN(bad_folders_are_refused);
    return check_main_end();
}
