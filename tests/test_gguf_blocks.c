/* llama.cpp's block formats, checked against the gguf Python package.
 *
 * tests/gguf_blocks.py writes blocks.gguf (one tensor per format, q4_0 ..
 * q6_K, q8_0, f32/f16/bf16) and ref.gguf (the same values as
 * gguf.quants.dequantize reads them, in f32). Cases:
 *   - loom's dequantization (loom_gguf_values, loom_tensor_dequantize)
 *     equals gguf's bit for bit;
 *   - the CPU matmul_forward_kq on each block tensor is within the bound
 *     derived from the formats (below) of the fp64 product with gguf's
 *     dequantized weights, and every instruction set gives the same bits;
 *   - broken files (cut inside a tensor, an unknown type, a type that
 *     does not match the bytes, overlapping tensors, two tensors at one
 *     offset, a row of partial blocks) are refused naming the tensor;
 *   - a GPT-2 file whose linear weights mix block formats loads with those
 *     weights as stored, and the inference forward on them (the kernel)
 *     gives the logits of the fp32 forward on the dequantized weights up
 *     to the activations' 8-bit rounding;
 *   - a Llama file laid out as llama.cpp's converter writes it (q and k
 *     rows in its rotary order, q/k/v and gate/up apart) reads into loom's
 *     config and fused parameters as numpy computes them, the block
 *     weights kept as stored with their rows in loom's order; written
 *     back by loom as an f32 llama GGUF, the gguf reader finds the same
 *     llama.* keys and every tensor's values (rows in rotary order again);
 *   - that file loaded whole: its logits equal transformers'
 *     LlamaForCausalLM's (float64, .deps/hf44) on the same weights in
 *     Hugging Face's layout (so the rotary rows are put back right), and
 *     on the file's blocks they stay within the activations' rounding.
 *
 * The bound. Output o of row n is sum_i w_i x_i. The kernel computes, per
 * block b of the activation row (32 or 256 values), xd_b (d_b I_b - m_b M_b)
 * with xq = rint(x * 127 / max|x|), xd = max|x| / 127, and exact integers
 * I, M (qblock.h's form, w_i = d sc u_i - dmin mn in real arithmetic):
 *   1. activation rounding: |x_i - xd q_i| <= xd (1/2 + 3 * 127 u) (the
 *      scale, its inverse and the product each round once, u = 2^-24),
 *      so sum_b xd_b (1/2 + 2^-14) sum_{i in b} |w_i| covers it;
 *   2. float work: the weights as gguf rounds them differ from the exact
 *      form by at most 3u of |d sc u_i| + |dmin mn| each; the kernel's
 *      int-to-float conversions, 3 products, 1 difference per block and
 *      the sum over nb blocks (8 partial sums and a tree) add at most
 *      (nb + 6) u relative to
 *      sum_i (|d sc u_i| + |dmin mn|)(|x_i| + xd_b); (nb + 12) u times that
 *      sum covers both, plus u |bias| for the bias add. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_kquant.h"
#include "backend/qblock.h"
#include "check.h"
#include "ckpt/gguf.h"
#include "ckpt/gguf_file.h"
#include "ckpt/gguf_map.h"
#include "model/infer.h"
#include "model/quant.h"
#include "model/sparse24.h"

#define PYTHON "/usr/bin/python3"

static char dir[256];
static int made = -1; /* 1 written, 0 failed, -1 not tried */

/* Run tests/gguf_blocks.py with `args` into dir; 1 when it printed "ok". */
static int run_script(const char *args) {
    char cmd[1024], line[512], last[512] = "";
    snprintf(cmd, sizeof cmd, "PYTHONPATH=.deps/py:.deps/hf44 " PYTHON " tests/gguf_blocks.py %s %s 2>&1", dir, args);
    FILE *p = popen(cmd, "r");
    int ok = 0;
    while (p && fgets(line, sizeof line, p)) {
        snprintf(last, sizeof last, "%s", line);
        if (!strncmp(line, "ok ", 3)) ok = 1;
    }
    if (p) pclose(p);
    if (!ok && strstr(last, "ModuleNotFoundError")) {
        check_skip("a Python package is missing (.deps/py: gguf, .deps/hf44: transformers): %s", last);
        return -1;
    }
    CHECK(ok, "tests/gguf_blocks.py %s failed: %s", args, last);
    return ok;
}

/* Write the oracle files once; 0 (case skipped or failed) when they are not there. */
static int oracle_files(void) {
    if (made < 0) {
        if (access(PYTHON, X_OK) != 0) {
            check_skip("%s not found", PYTHON);
            return 0;
        }
        snprintf(dir, sizeof dir, "%s", check_tmpdir("gguf-blocks"));
        made = run_script("");
    }
    return made == 1;
}

static loom_gguf_t *open_file(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    loom_gguf_t *g = NULL;
    CHECK(loom_gguf_open(&g, p) == LOOM_OK, "%s", loom_errmsg());
    return g;
}

static void test_dequantize_equals_gguf(void) {
    if (!oracle_files()) return;
    loom_gguf_t *g = open_file("blocks.gguf"), *r = open_file("ref.gguf");
    if (!g || !r) return;
    CHECK(loom_gguf_ntensors(g) == loom_gguf_ntensors(r) && loom_gguf_ntensors(g) >= 13, "%d tensors", loom_gguf_ntensors(g));
    for (int i = 0; i < loom_gguf_ntensors(r); i++) {
        const loom_gguf_tensor_t *want = loom_gguf_tensor_at(r, i), *t = loom_gguf_find(g, want->name);
        CHECK(t && t->numel == want->numel && want->type == LOOM_GT_F32, "%s", want->name);
        if (!t) continue;
        float *a = loom_malloc(t->numel * sizeof(float)), *b = loom_malloc(t->numel * sizeof(float));
        loom_gguf_values(t, a);
        CHECK(!memcmp(a, want->data, t->numel * sizeof(float)), "%s (%s): loom's values differ from gguf.quants.dequantize",
              t->name, loom_gguf_type_name(t->type));
        int d = loom_qblock_of_ggml(t->type);
        if (d >= 0) { /* the typed tensor's reference meaning is the same */
            loom_tensor_t w = {.data = (void *)t->data, .dtype = (loom_dtype)d, .rows = (long long)t->ne[1], .cols = (long long)t->ne[0]};
            CHECK(loom_tensor_check(&w, t->name) == LOOM_OK, "%s", loom_errmsg());
            loom_tensor_dequantize(&w, b);
            CHECK(!memcmp(b, want->data, t->numel * sizeof(float)), "%s: loom_tensor_dequantize differs", t->name);
        }
        free(a), free(b);
    }
    loom_gguf_close(g);
    loom_gguf_close(r);
}

/* The bound above for output o of input row x (C values). */
static double kq_bound(const loom_tensor_t *w, int o, const float *x, const float *wf, float bias) {
    const loom_qblock_info_t *qi = loom_qblock_info(w->dtype);
    int C = (int)w->cols, nb = C / qi->block;
    const double u = ldexp(1.0, -24);
    double act = 0, mag = 0;
    uint8_t vals[256];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = (const uint8_t *)w->data + ((size_t)o * nb + b) * qi->bytes;
        loom_qblock_scales_t s;
        loom_qblock_scales(w->dtype, blk, &s);
        loom_qblock_values(w->dtype, blk, vals);
        double mx = 0, sw = 0;
        for (int i = 0; i < qi->block; i++) mx = fmax(mx, fabs(x[b * qi->block + i]));
        double xd = mx / 127;
        for (int i = 0; i < qi->block; i++) {
            int g = i / 16;
            sw += fabs(wf[(size_t)o * C + b * qi->block + i]);
            mag += (fabs((double)s.d * s.sc[g] * vals[i]) + fabs((double)s.dmin * s.mn[g])) * (fabs(x[b * qi->block + i]) + xd);
        }
        act += xd * (0.5 + ldexp(1.0, -14)) * sw;
    }
    return act + (nb + 12) * u * mag + u * fabs(bias) + 1e-30;
}

/* One block tensor: every ISA, N rows, against the fp64 product. */
static void check_kq(const loom_gguf_tensor_t *t, const loom_gguf_tensor_t *ref, int N) {
    loom_tensor_t w = {.data = (void *)t->data, .dtype = (loom_dtype)loom_qblock_of_ggml(t->type), .rows = (long long)t->ne[1],
                       .cols = (long long)t->ne[0]};
    int C = (int)w.cols, OC = (int)w.rows;
    const float *wf = ref->data;
    float *x = check_rand((size_t)N * C, 1.0f, 7), *bias = check_rand((size_t)OC, 0.5f, 8);
    for (int n = 0; n < N; n++) x[(size_t)n * C + (n * 37) % C] *= 20.0f; /* an outlier per row */
    float *first = loom_malloc((size_t)N * OC * sizeof(float)), *out = loom_malloc((size_t)N * OC * sizeof(float));
    static const char *const isas[] = {"portable", "avx2", "avx512", "avx512vnni"};
    int ran = 0;
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        if (!loom_cpu_kq_use(isas[k])) continue;
        loom_cpu_matmul_forward_kq(ran ? out : first, x, &w, bias, N, C, OC, 0);
        if (ran) CHECK(!memcmp(out, first, (size_t)N * OC * sizeof(float)), "%s: %s differs from portable", t->name, isas[k]);
        ran++;
    }
    loom_cpu_kq_use(NULL);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double want = bias[o];
            for (int i = 0; i < C; i++) want += (double)wf[(size_t)o * C + i] * x[(size_t)n * C + i];
            double err = fabs(first[(size_t)n * OC + o] - want), lim = kq_bound(&w, o, x + (size_t)n * C, wf, bias[o]);
            CHECK(err <= lim, "%s row %d out %d: %.9g vs %.9g, error %.3g over the bound %.3g", t->name, n, o,
                  first[(size_t)n * OC + o], want, err, lim);
            worst = fmax(worst, err / lim);
        }
    printf("  %s: %d instruction sets agree bitwise, N %d, worst error %.2f of the bound\n", t->name, ran, N, worst);
    free(x), free(bias), free(first), free(out);
}

/* The activations' quantization: every instruction set's bytes and scales
 * equal the portable loop's, with values that round half to even (k + 0.5
 * times the scale) and an all-zero block. */
static void test_kq_quantize_isas(void) {
    enum { C = 1024 };
    float *x = check_rand(C, 1.0f, 11), xd[2][C / 32];
    int8_t xq[2][C];
    int16_t xs[2][C / 16];
    for (int i = 0; i < 64; i++) x[i] = (float)(i % 7 - 3) + 0.5f; /* max 3.5: x * 127 / 3.5 lands on halves */
    x[64] = 127.0f / 2;
    memset(x + 96, 0, 32 * sizeof(float));
    static const char *const isas[] = {"portable", "avx2", "avx512", "avx512vnni"};
    for (int blk = 32; blk <= 256; blk *= 8)
        for (int k = 0; k < 4; k++) {
            if (!loom_cpu_kq_use(isas[k])) continue;
            loom_cpu_kq_quantize_act(x, C, blk, xd[k > 0], xq[k > 0], xs[k > 0]);
            if (k > 0)
                CHECK(!memcmp(xd[0], xd[1], sizeof(float) * (C / blk)) && !memcmp(xq[0], xq[1], C) && !memcmp(xs[0], xs[1], sizeof xs[0]),
                      "block %d: %s quantizes the activations differently from portable", blk, isas[k]);
        }
    loom_cpu_kq_use(NULL);
    free(x);
}

static void test_kq_matmul_bound(void) {
    if (!oracle_files()) return;
    loom_gguf_t *g = open_file("blocks.gguf"), *r = open_file("ref.gguf");
    if (!g || !r) return;
    int checked = 0;
    for (int i = 0; i < loom_gguf_ntensors(g); i++) {
        const loom_gguf_tensor_t *t = loom_gguf_tensor_at(g, i);
        if (loom_qblock_of_ggml(t->type) < 0) continue;
        check_kq(t, loom_gguf_find(r, t->name), 1); /* decode: the one-row paths */
        check_kq(t, loom_gguf_find(r, t->name), strstr(t->name, "q4_k.512") ? 20 : 3); /* 20: many rows, below the GEMM's threshold */
        checked++;
    }
    CHECK(checked == 13, "%d block tensors", checked);
    printf("  kernels: %s\n", loom_cpu_kq_isa());
    loom_gguf_close(g);
    loom_gguf_close(r);
}

/* ---- broken files ---- */

static unsigned char *orig;
static size_t orig_n;

/* The tensor info of `name` in buf: the byte after its name. */
static size_t info_at(const unsigned char *buf, size_t n, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 8; i + len < n; i++) {
        uint64_t l;
        memcpy(&l, buf + i - 8, 8);
        if (l == len && !memcmp(buf + i, name, len)) return i + len;
    }
    return 0;
}

typedef struct {
    const char *what, *tensor;
    int field;      /* 0 ne[0], 1 type, 2 offset, -1 truncate */
    long long val;  /* new value; for offset, -1: the offset of `other` */
    const char *other, *expect;
} breakage_t;

static void try_broken(const breakage_t *b) {
    unsigned char *buf = loom_malloc(orig_n);
    memcpy(buf, orig, orig_n);
    size_t n = orig_n, at = info_at(buf, n, b->tensor);
    CHECK(at, "%s: tensor info not found", b->tensor);
    uint32_t ndim;
    memcpy(&ndim, buf + at, 4);
    size_t ne0 = at + 4, type = ne0 + 8 * ndim, off = type + 4;
    if (b->field == 0) memcpy(buf + ne0, &b->val, 8);
    if (b->field == 1) memcpy(buf + type, &(uint32_t){(uint32_t)b->val}, 4);
    if (b->field == 2) {
        size_t oat = info_at(buf, n, b->other);
        uint32_t od;
        memcpy(&od, buf + oat, 4);
        uint64_t v;
        memcpy(&v, buf + oat + 4 + 8 * od + 4, 8);
        v += (uint64_t)b->val;
        memcpy(buf + off, &v, 8);
    }
    if (b->field == -1) n -= (size_t)b->val;
    char p[512];
    snprintf(p, sizeof p, "%s/broken.gguf", dir);
    FILE *f = fopen(p, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    loom_gguf_t *g = NULL;
    loom_status s = loom_gguf_open(&g, p);
    const char *msg = loom_errmsg();
    CHECK(s != LOOM_OK && strstr(msg, b->tensor) && strstr(msg, b->expect) && strstr(msg, p), "%s: status %d, message: %s", b->what,
          (int)s, s != LOOM_OK ? msg : "(opened)");
    if (s != LOOM_OK) printf("  %s: %s\n", b->what, msg);
    loom_gguf_close(g);
    free(buf);
}

static void test_broken_files(void) {
    if (!oracle_files()) return;
    char p[512];
    snprintf(p, sizeof p, "%s/blocks.gguf", dir);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    orig_n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    orig = loom_malloc(orig_n);
    CHECK(fread(orig, 1, orig_n, f) == orig_n, "read %s", p);
    fclose(f);
    static const breakage_t cases[] = {
        {"cut inside a tensor", "q6_k.512", -1, 1000, NULL, "ends inside tensor"},
        {"unknown type", "q4_k.512", 1, 99, NULL, "llama-quantize"},
        {"type not matching the bytes", "q5_k.512", 1, 12, NULL, "does not match the data"},
        {"type larger than its bytes", "q4_k.512", 1, 13, NULL, "overlap"},
        {"two tensors at one offset", "q5_k.512", 2, 0, "q4_k.512", "both start at offset"},
        {"overlapping tensors", "q5_k.512", 2, 320, "q4_k.512", "overlap"},
        {"rows of partial blocks", "q4_k.512", 0, 500, NULL, "blocks of 256"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) try_broken(&cases[i]);
    free(orig);
}

/* Logits (T, Vp) of tokens 0..T-1 of one sequence through the inference forward. */
static float *infer_logits(loom_gpt_t *m, int T) {
    int Vp = m->cfg.padded_vocab_size, tokens[64], pos[64], seq[64], rows[64];
    float *out = loom_calloc((size_t)T * Vp, sizeof(float));
    loom_infer_t *inf;
    CHECK(loom_infer_create(&inf, m, 4, 16, LOOM_FP32, T, 1, T) == LOOM_OK, "%s", loom_errmsg());
    int *tables = loom_calloc((size_t)loom_infer_max_blocks(inf), sizeof(int)); /* one sequence in blocks 0..3 */
    for (int k = 0; k < 4; k++) tables[k] = k;
    for (int i = 0; i < T; i++) tokens[i] = (i * 37 + 5) % m->cfg.vocab_size, pos[i] = i, seq[i] = 0, rows[i] = i;
    loom_infer_batch_t b = {T, tokens, pos, seq, 1, tables, T, rows, NULL};
    CHECK(loom_infer_forward(inf, &b, out) == LOOM_OK, "%s", loom_errmsg());
    loom_infer_free(inf);
    free(tables);
    return out;
}

/* Logits on the file's blocks against fp32 on their dequantized values:
 * the normalized error, which the activations' 8-bit rounding bounds. */
static double blocks_vs_fp32(loom_gpt_t *m, int T) {
    size_t n = (size_t)T * m->cfg.padded_vocab_size;
    float *kq = infer_logits(m, T);
    loom_tensor_t *fq = m->file_q;
    m->file_q = NULL;
    float *f32 = infer_logits(m, T);
    m->file_q = fq;
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(kq[i]) && isfinite(f32[i]);
    double e = finite ? check_rel_err(kq, f32, n) : INFINITY;
    free(kq), free(f32);
    return e;
}

/* Load tests/gguf_blocks.py's `name` on the CPU; NULL (failed) on an error. */
static loom_gpt_t *load_cpu(const char *name) {
    const loom_backend_t *be;
    CHECK(loom_backend_open(&be, "cpu", 0, LOOM_FP32) == LOOM_OK, "%s", loom_errmsg());
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    loom_gpt_t *m;
    loom_tokenizer_t *tok;
    if (loom_gguf_load(p, be, &m, &tok) != LOOM_OK) {
        CHECK(0, "%s", loom_errmsg());
        return NULL;
    }
    CHECK(!tok, "%s has no tokenizer", name);
    return m;
}

static void test_gpt2_block_weights(void) {
    if (!oracle_files() || run_script("gpt2") != 1) return;
    loom_gpt_t *m = load_cpu("gpt2.gguf");
    loom_tokenizer_t *tok = NULL;
    if (!m) return;
    static const loom_dtype want[2][LOOM_QLIN_COUNT] = {{LOOM_Q4_K, LOOM_Q6_K, LOOM_Q5_K, LOOM_Q4_K},
                                                        {LOOM_Q5_0, LOOM_INT8, LOOM_Q4_1, LOOM_Q5_1}};
    CHECK(m->file_q && !loom_quant_file_int8(m) && !tok, "block weights %p, all int8 %p", (void *)m->file_q, (void *)loom_quant_file_int8(m));
    for (int i = 0; i < 2 * LOOM_QLIN_COUNT && m->file_q; i++)
        CHECK(m->file_q[i].data && m->file_q[i].dtype == want[i / 4][i % 4], "layer %d weight %d: %s", i / 4, i % 4,
              loom_dtype_name(m->file_q[i].dtype));
    double e = blocks_vs_fp32(m, 40);
    CHECK(e > 0 && e < 2e-2, "logits on the file's blocks vs fp32 on their dequantized values: normalized error %.3g", e);
    printf("  gpt2 with 7 block formats: logits on the blocks vs fp32 on the dequantized weights, normalized error %.3g\n", e);
    loom_gpt_free(m);
}

/* The config, the parameters and the block weights of tests/gguf_blocks.py's llama file. */
static void test_llama_map(void) {
    if (!oracle_files() || run_script("llama") != 1) return;
    char p[512];
    snprintf(p, sizeof p, "%s/llama.gguf", dir);
    loom_gguf_t *g = NULL, *e = open_file("llama_expect.gguf");
    CHECK(loom_gguf_open(&g, p) == LOOM_OK, "%s", loom_errmsg());
    loom_gpt_config_t c;
    if (!g || !e || loom_gguf_config(g, &c) != LOOM_OK) {
        CHECK(0, "%s", loom_errmsg());
        return;
    }
    CHECK(c.n_layer == 2 && c.channels == 256 && c.n_head == 4 && c.n_kv_heads == 2 && c.ffn_hidden == 512 && c.vocab_size == 300 &&
              c.norm == LOOM_NORM_RMSNORM && c.pos == LOOM_POS_ROPE && c.mlp == LOOM_MLP_SWIGLU && c.bias == LOOM_BIAS_NONE &&
              c.untied_head && c.rope_theta == 500000.0f && c.norm_eps == 1e-6f,
          "config: L %d C %d NH %d KV %d H %d V %d untied %d theta %g eps %g", c.n_layer, c.channels, c.n_head, c.n_kv_heads,
          c.ffn_hidden, c.vocab_size, c.untied_head, c.rope_theta, c.norm_eps);
    loom_tensor_info_t pt[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(&c, pt, &total);
    float *host = loom_calloc(total, sizeof(float));
    CHECK(loom_gguf_read_params(g, &c, pt, host) == LOOM_OK, "%s", loom_errmsg());
    int same = 0, n = loom_gguf_ntensors(e);
    for (int i = 0; i < n; i++) { /* "qkvw.1" -> parameter qkvw, layer 1 */
        const loom_gguf_tensor_t *t = loom_gguf_tensor_at(e, i);
        char name[96];
        snprintf(name, sizeof name, "%s", t->name);
        char *dot = strchr(name, '.');
        int layer = dot ? atoi(dot + 1) : 0, k = 0;
        if (dot) *dot = 0;
        while (k < LOOM_NPARAMS && strcmp(pt[k].name, name)) k++;
        if (k == LOOM_NPARAMS) continue;
        size_t per = dot ? pt[k].numel / (size_t)c.n_layer : 0, len = t->numel;
        const float *got = host + pt[k].offset + (size_t)layer * per;
        int eq = !memcmp(got, t->data, (k == LOOM_WTE || k == LOOM_LMHEAD ? (size_t)c.vocab_size * c.channels : len) * sizeof(float));
        CHECK(eq, "%s: loom's parameter differs from numpy's", t->name);
        same += eq;
    }
    CHECK(same == n && n == 3 + 2 * 6, "%d of %d parameters equal", same, n);
    int mixed = 0;
    loom_tensor_t *fq = NULL;
    CHECK(loom_gguf_file_weights(g, &c, &fq, &mixed) == LOOM_OK, "%s", loom_errmsg());
    CHECK(fq && mixed == 0, "block weights %p, %d mixed left to fp32", (void *)fq, mixed);
    static const loom_dtype want[LOOM_QLIN_COUNT] = {LOOM_Q4_K, LOOM_Q6_K, LOOM_DTYPE_COUNT, LOOM_INT8};
    for (int q = 0; q < LOOM_QLIN_COUNT && fq; q++) {
        const loom_tensor_t *w = &fq[LOOM_QLIN_COUNT + q];
        CHECK(!fq[q].data, "layer 0 (f32) has no block weights");
        if (want[q] == LOOM_DTYPE_COUNT) { /* gate q5_K, up q4_K: each part on its own blocks, in the part slots */
            const loom_tensor_t *pp = &fq[c.n_layer * LOOM_QLIN_COUNT + 2 + (LOOM_QLIN_COUNT + q) * LOOM_FILE_Q_PARTS];
            CHECK(!w->data && pp[0].data && pp[0].dtype == LOOM_Q5_K && pp[1].data && pp[1].dtype == LOOM_Q4_K && !pp[2].data &&
                      pp[0].rows == c.ffn_hidden && pp[1].rows == c.ffn_hidden,
                  "the mixed gate/up: slot %p, parts %s %s", w->data, pp[0].data ? loom_dtype_name(pp[0].dtype) : "-",
                  pp[1].data ? loom_dtype_name(pp[1].dtype) : "-");
            float *d = loom_malloc((size_t)2 * c.ffn_hidden * c.channels * sizeof(float));
            for (int k = 0; k < 2 && pp[k].data; k++) loom_tensor_dequantize(&pp[k], d + (size_t)k * c.ffn_hidden * c.channels);
            CHECK(!memcmp(d, host + pt[LOOM_FCW].offset + pt[LOOM_FCW].numel / 2, (size_t)2 * c.ffn_hidden * c.channels * sizeof(float)),
                  "layer 1 gate/up: the parts' blocks do not dequantize to the parameters");
            free(d);
            continue;
        }
        CHECK(w->data && w->dtype == want[q], "layer 1 weight %d: %s", q, loom_dtype_name(w->dtype));
        if (!w->data) continue;
        int pk = q == LOOM_QLIN_QKV ? LOOM_QKVW : q == LOOM_QLIN_ATTPROJ ? LOOM_ATTPROJW : LOOM_FCPROJW;
        float *d = loom_malloc((size_t)w->rows * w->cols * sizeof(float));
        loom_tensor_dequantize(w, d);
        CHECK(!memcmp(d, host + pt[pk].offset + pt[pk].numel / 2, (size_t)w->rows * w->cols * sizeof(float)),
              "layer 1 weight %d: the kept blocks (rows in loom's order) do not dequantize to the parameters", q);
        free(d);
    }
    free(fq);
    /* written back as an f32 llama GGUF: the gguf reader finds the original's keys and values */
    snprintf(p, sizeof p, "%s/llama_loom.gguf", dir);
    loom_gguf_write_opts_t o = {.cfg = &c, .dtype = LOOM_XDT_F32, .name = "map-test", .params = host};
    CHECK(loom_gguf_write(p, &o) == LOOM_OK, "%s", loom_errmsg());
    char args[600];
    snprintf(args, sizeof args, "compare %s", p);
    CHECK(run_script(args) == 1, "loom's llama export differs from the file it read");
    free(host);
    loom_gguf_close(g);
    loom_gguf_close(e);
}

/* Llama 3's RoPE scaling written as llama.cpp's converter writes it
 * (rope_freqs.weight, checked by the gguf package against the converter's
 * formula) and read back as the same scaling: Llama 3.1's factors, and
 * others the divisors fit. */
static void test_llama3_rope_freqs(void) {
    if (!oracle_files() || run_script("llama") != 1) return;
    loom_gguf_t *g = open_file("llama.gguf");
    loom_gpt_config_t c;
    if (!g || loom_gguf_config(g, &c) != LOOM_OK) return check_fail_why("%s", loom_errmsg());
    loom_tensor_info_t pt[LOOM_NPARAMS];
    size_t total;
    loom_gpt_param_table(&c, pt, &total);
    float *host = loom_calloc(total, sizeof(float));
    CHECK(loom_gguf_read_params(g, &c, pt, host) == LOOM_OK, "%s", loom_errmsg());
    static const float cases[][3] = {{8, 1, 4}, {32, 2, 16}};
    for (int k = 0; k < 2; k++) {
        c.rope_scaling.kind = LOOM_ROPE_SCALING_LLAMA3, c.rope_scaling.factor = cases[k][0];
        c.rope_scaling.low_freq_factor = cases[k][1], c.rope_scaling.high_freq_factor = cases[k][2], c.rope_scaling.original_max_pos = 8192;
        char p[512], args[700];
        snprintf(p, sizeof p, "%s/llama3_rope%d.gguf", dir, k);
        loom_gguf_write_opts_t o = {.cfg = &c, .dtype = LOOM_XDT_F32, .name = "rope-test", .params = host};
        CHECK(loom_gguf_write(p, &o) == LOOM_OK, "%s", loom_errmsg());
        snprintf(args, sizeof args, "rope %s %g %g %g 8192", p, cases[k][0], cases[k][1], cases[k][2]);
        CHECK(run_script(args) == 1, "rope_freqs.weight differs from llama.cpp's converter's");
        loom_gguf_t *r = NULL;
        loom_gpt_config_t back;
        CHECK(loom_gguf_open(&r, p) == LOOM_OK && loom_gguf_config(r, &back) == LOOM_OK, "%s", loom_errmsg());
        if (r) loom_gguf_close(r);
        CHECK(back.rope_scaling.kind == LOOM_ROPE_SCALING_LLAMA3 && back.rope_scaling.factor == cases[k][0] &&
                  fabsf(back.rope_scaling.low_freq_factor - cases[k][1]) < 1e-3f * cases[k][1] &&
                  fabsf(back.rope_scaling.high_freq_factor - cases[k][2]) < 1e-3f * cases[k][2] && back.rope_scaling.original_max_pos == 8192,
              "read back: kind %d factor %g low %g high %g original %d", (int)back.rope_scaling.kind, back.rope_scaling.factor,
              back.rope_scaling.low_freq_factor, back.rope_scaling.high_freq_factor, back.rope_scaling.original_max_pos);
    }
    free(host);
    loom_gguf_close(g);
}

/* The embedding (q6_K) and the head (q8_0) on the file's rows: logits
 * within the activations' rounding of fp32 on the dequantized weights;
 * then the fp32 weights the blocks replace given back, and the logits the
 * same bits as before (nothing on the inference path read them). */
static void test_llama_ends_on_blocks(void) {
    if (!oracle_files() || run_script("llama_ends") != 1) return;
    loom_gpt_t *m = load_cpu("llama_ends.gguf");
    if (!m) return;
    const loom_tensor_t *ends = m->file_q ? &m->file_q[(size_t)m->cfg.n_layer * LOOM_QLIN_COUNT] : NULL;
    CHECK(ends && ends[0].data && ends[0].dtype == LOOM_Q6_K && ends[1].data && ends[1].dtype == LOOM_INT8 && ends[1].block == 32,
          "the embedding and head as stored: %s, %s", ends && ends[0].data ? loom_dtype_name(ends[0].dtype) : "none",
          ends && ends[1].data ? loom_dtype_name(ends[1].dtype) : "none");
    int T = 40;
    double e = blocks_vs_fp32(m, T);
    CHECK(e > 0 && e < 2e-2, "logits on the file's embedding, head and blocks vs fp32: normalized error %.3g", e);
    float *before = infer_logits(m, T);
    size_t given = loom_infer_weights_release_fp32(m, NULL), n = (size_t)T * m->cfg.padded_vocab_size;
    float *after = infer_logits(m, T);
    size_t want = (m->ptable[LOOM_WTE].numel + m->ptable[LOOM_LMHEAD].numel) * sizeof(float); /* the mixed layer-0 weights stay */
    CHECK(given >= want / 2, "%zu bytes given back, the embedding and head alone are %zu", given, want);
    CHECK(!memcmp(before, after, n * sizeof(float)), "the logits changed when the fp32 copy was given back");
    printf("  llama, q6_K embedding and q8_0 head on the file's rows: vs fp32 %.3g normalized; %.2f MB of fp32 given back\n", e,
           given / 1e6);
    free(before), free(after);
    loom_gpt_free(m);
}

/* The llama file's logits against transformers' on the same weights. */
static void test_llama_hf_logits(void) {
    if (!oracle_files() || run_script("llama") != 1) return;
    char ref[512], args[600];
    snprintf(ref, sizeof ref, "%s/hf_logits.f64", dir);
    snprintf(args, sizeof args, "llama_logits %s", ref);
    if (run_script(args) != 1) return;
    loom_gpt_t *m = load_cpu("llama.gguf");
    if (!m) return;
    int T = 40, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    double *want = loom_malloc((size_t)T * V * sizeof(double));
    FILE *f = fopen(ref, "rb");
    CHECK(f && fread(want, sizeof(double), (size_t)T * V, f) == (size_t)T * V, "%s", ref);
    if (f) fclose(f);
    loom_tensor_t *fq = m->file_q;
    m->file_q = NULL; /* fp32 on the dequantized weights: transformers' arithmetic */
    float *got = infer_logits(m, T), *row = loom_malloc((size_t)T * V * sizeof(float));
    m->file_q = fq;
    for (int t = 0; t < T; t++) memcpy(row + (size_t)t * V, got + (size_t)t * Vp, (size_t)V * sizeof(float));
    double e = check_rel_err_d(row, want, (size_t)T * V), eq = blocks_vs_fp32(m, T);
    CHECK(e < 1e-5, "loom's llama logits vs transformers': normalized error %.3g", e);
    CHECK(eq > 0 && eq < 2e-2, "llama logits on the file's blocks vs fp32: normalized error %.3g", eq);
    printf("  llama GGUF: fp32 logits vs transformers' %.3g; on the file's blocks (layer 1) vs fp32 %.3g (normalized errors)\n", e, eq);
    free(want), free(got), free(row);
    loom_gpt_free(m);
}

/* /proc/self/status field `key` (VmRSS, VmHWM) in bytes; 0 if absent. */
static size_t status_bytes(const char *key) {
    char line[256];
    size_t kb = 0, n = strlen(key);
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = strtoull(line + n + 1, NULL, 10);
    if (f) fclose(f);
    return kb * 1024;
}

static long lazy_file_bytes(const char *p) {
    FILE *f = fopen(p, "rb");
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
    if (f) fclose(f);
    return n;
}

/* A Llama whose every matrix is in blocks, loaded as loom_open loads it
 * (fp32 only where the blocks do not serve): the load's peak resident
 * memory (VmHWM, reset before it through /proc/self/clear_refs) stays
 * under a third of the fp32 weights' bytes; the blocks kept are the
 * file's bytes, the fp32 made afterwards (loom_gguf_fp32) is the whole
 * load's bit for bit, and the logits on the blocks are the same bits
 * either way. Memory, not time: what the regression would change. */
static void test_llama_load_memory(void) {
    if (!oracle_files() || run_script("llama_q4k") != 1) return;
    const loom_backend_t *be;
    CHECK(loom_backend_open(&be, "cpu", 0, LOOM_FP32) == LOOM_OK, "%s", loom_errmsg());
    char p[512];
    snprintf(p, sizeof p, "%s/llama_q4k.gguf", dir);
    loom_gpt_t *lazy = NULL, *whole = NULL;
    loom_tokenizer_t *tok;
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    int reset = cr && fputs("5", cr) >= 0 && fclose(cr) == 0; /* 5: reset the peak resident size to the current one */
    if (!reset && cr) fclose(cr);
    size_t rss0 = status_bytes("VmRSS");
    CHECK(loom_gguf_load_opts(p, be, 0, &lazy, &tok) == LOOM_OK, "%s", loom_errmsg());
    size_t peak = status_bytes("VmHWM") - rss0;
    CHECK(loom_gguf_load(p, be, &whole, &tok) == LOOM_OK, "%s", loom_errmsg());
    if (!lazy || !whole) return;
    size_t fp32 = lazy->num_params * sizeof(float), nq = (size_t)lazy->cfg.n_layer * LOOM_QLIN_COUNT;
    if (reset)
        CHECK(peak < fp32 / 3, "loading peaked %.1f MB above the start, the fp32 weights are %.1f MB", peak / 1e6, fp32 / 1e6);
    else
        check_skip("/proc/self/clear_refs cannot reset the peak: the load's peak memory is not measured");
    int same = 1;
    for (size_t i = 0; i < nq + 2; i++)
        same &= lazy->file_q[i].data && whole->file_q[i].data &&
                !memcmp(lazy->file_q[i].data, whole->file_q[i].data, loom_qblock_tensor_bytes(&lazy->file_q[i]));
    CHECK(same, "the stored weights differ between the two loads");
    int T = 24;
    float *a = infer_logits(lazy, T), *b = infer_logits(whole, T);
    CHECK(!memcmp(a, b, (size_t)T * lazy->cfg.padded_vocab_size * sizeof(float)), "logits on the blocks differ between the two loads");
    /* the lazy load's fp32 linear weights are zeros nothing reads: no 2:4 copy of them (it cost a 1B model 2 GB) */
    loom_infer_weights_t iw;
    loom_infer_weights_opts_t wo = {.quant = LOOM_QUANT_NONE, .sparse = LOOM_SPARSE_AUTO};
    CHECK(loom_infer_weights_create(&iw, lazy, &wo) == LOOM_OK && !iw.s24, "the file's blocks run the linear layers, yet a 2:4 copy of their unused fp32 was made");
    loom_infer_weights_free(&iw);
    loom_gguf_fp32(lazy, 0);
    CHECK(!memcmp(lazy->params, whole->params, fp32), "the fp32 made from the blocks differs from the whole load's");
    printf("  llama, every matrix in blocks (%.1f MB file): load peak +%.1f MB; fp32 weights %.1f MB\n", (double)lazy_file_bytes(p) / 1e6,
           peak / 1e6, fp32 / 1e6);
    free(a), free(b);
    loom_gpt_free(lazy), loom_gpt_free(whole);
    static const char *const bad[][2] = {{"llama_nan.gguf", "blk.1.ffn_down.weight holds a NaN or infinite scale in block 5 "},
                                         {"llama_inf.gguf", "blk.2.ffn_up.weight holds a NaN or infinite scale in block 9 "}};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", dir, bad[k][0]);
        loom_gpt_t *m = NULL;
        loom_status s = loom_gguf_load_opts(p, be, 0, &m, &tok);
        CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), bad[k][1]) && strstr(loom_errmsg(), p) && !m, "%s: status %d: %s", bad[k][0], (int)s,
              s ? loom_errmsg() : "(loaded)");
        if (s != LOOM_OK) printf("  %s\n", loom_errmsg());
    }
}

int main(void) {
    RUN(test_dequantize_equals_gguf);
    RUN(test_kq_quantize_isas);
    RUN(test_kq_matmul_bound);
    RUN(test_broken_files);
    RUN(test_gpt2_block_weights);
    RUN(test_llama_map);
    RUN(test_llama_hf_logits);
    RUN(test_llama3_rope_freqs);
    RUN(test_llama_ends_on_blocks);
    RUN(test_llama_load_memory);
    return check_main_end();
}
