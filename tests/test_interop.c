/* Interchange formats checked by the other tools' own readers.
 *
 * A small random GPT-2 (vocabulary 300 over a BPE of <= 280 ids, so the
 * GGUF carries [PAD] ids and loom pads to 320) is saved as a loom run
 * checkpoint, then exported from that checkpoint file, as the CLI does:
 *   - GGUF f32 read back by loom: every weight and logit bit-identical;
 *     q8_0 and f16 read back close to the original;
 *   - GGUF read by the `gguf` Python package (llama.cpp's reader,
 *     tests/interop_oracle.py): metadata, names, shapes, f32 values exact,
 *     q8_0 within one quantisation step;
 *   - a q8_0 GGUF's linear weights kept as int8 with block-32 scales: the
 *     bytes of a block-32 quantization of the fp32 weights and of the gguf
 *     reader; --quant's logits on them equal that quantization's;
 *   - the Hugging Face folder loaded by transformers: logits equal to loom's;
 *   - broken files: each a clear error naming the file and the tensor.
 * Needs /usr/bin/python3 with .deps/hf (transformers) and .deps/py (gguf)
 * for the oracle cases; they are skipped with the reason otherwise. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/qblock.h"
#include "check.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/run.h"
#include "model/infer.h"
#include "model/quant.h"

#define PYTHON "/usr/bin/python3"
#define B 2
#define T 16

static char tmp[] = "/tmp/loom-interop-XXXXXX";
static char run[256], ckpt[512], st_path[600];
static loom_gpt_t *model;
static loom_tokenizer_t *tok;
static const loom_backend_t *be;
static int tokens[B * T];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp, name); }

/* Export the checkpoint through the same source the CLI uses. */
static loom_status export_gguf(const char *path, loom_xdtype dt) {
    loom_stview_t *v;
    loom_status s = loom_stview_open(&v, st_path);
    if (s != LOOM_OK) return s;
    loom_gguf_write_opts_t o = {&model->cfg, tok, dt, "interop-test", loom_xsource_safetensors, v, NULL, NULL};
    s = loom_gguf_write(path, &o);
    loom_stview_close(v);
    return s;
}

static loom_status export_hf(const char *dir) {
    loom_stview_t *v;
    loom_status s = loom_stview_open(&v, st_path);
    if (s != LOOM_OK) return s;
    s = loom_hf_write(dir, 1, &model->cfg, tok, LOOM_XDT_F32, loom_xsource_safetensors, v);
    loom_stview_close(v);
    return s;
}

static float *logits_of(loom_gpt_t *m) {
    float *out = loom_malloc((size_t)B * T * m->cfg.padded_vocab_size * sizeof(float));
    if (loom_gpt_forward(m, tokens, NULL, B, T, 0.0f, NULL) != LOOM_OK) return out;
    loom_gpt_logits(m, out, B, T);
    return out;
}

static float *params_of(loom_gpt_t *m) {
    float *h = loom_malloc(m->num_params * sizeof(float));
    m->be->download(h, m->params, m->num_params * sizeof(float));
    return h;
}

static void setup(void) {
    LOOM_ASSERT(mkdtemp(tmp));
    LOOM_ASSERT(loom_backend_cpu_init(&be, 2) == LOOM_OK);
    loom_gpt_config_t cfg = {.max_seq_len = 32, .vocab_size = 300, .n_layer = 2, .n_head = 4, .channels = 64};
    LOOM_ASSERT(loom_gpt_config_finish(&cfg) == LOOM_OK);
    LOOM_ASSERT(loom_gpt_init(&model, &cfg, be, 7) == LOOM_OK);
    /* Wider than GPT-2's init so that logits are far from uniform. */
    float *h = params_of(model);
    for (size_t i = 0; i < model->ptable[LOOM_FIRST_NODECAY].offset; i++) h[i] *= 5.0f;
    for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < (size_t)cfg.padded_vocab_size * cfg.channels; i++) h[i] = 0;
    be->upload(model->params, h, model->num_params * sizeof(float));
    free(h);
    /* A small BPE (bytes, <|endoftext|>, merges up to 280 ids) learnt here. */
    static const char text[] = "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
                               "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.";
    const char *specials[] = {"<|endoftext|>"};
    loom_bpe_counter_t *cnt;
    LOOM_ASSERT(loom_bpe_counter_new(&cnt, specials, 1) == LOOM_OK);
    for (int i = 0; i < 4; i++) loom_bpe_count_add(cnt, text, sizeof text - 1, 1);
    loom_bpe_train_opts opts = {.vocab_size = 280};
    LOOM_ASSERT(loom_bpe_train(&tok, cnt, &opts) == LOOM_OK);
    loom_bpe_counter_free(cnt);
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 37 + 11) % loom_tokenizer_vocab_size(tok);
    path_of(run, sizeof run, "run");
    LOOM_ASSERT(loom_run_prepare(run, 0) == LOOM_OK);
    char p[600];
    snprintf(p, sizeof p, "%s/tokenizer.json", run);
    LOOM_ASSERT(loom_tokenizer_save(tok, p) == LOOM_OK);
    loom_ckpt_state_t st = {.step = 1, .val_loss = -1, .tokenizer_hash = loom_tokenizer_hash(tok)};
    LOOM_ASSERT(loom_run_save_checkpoint(run, model, &st, 1) == LOOM_OK);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step_00000001", run);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", ckpt);
}

/* Export the checkpoint as `file` in tmp and load it back; NULL (a failed
 * check) when either fails. */
static loom_gpt_t *export_and_load(const char *file, loom_xdtype dt, loom_tokenizer_t **t2) {
    char p[600];
    path_of(p, sizeof p, file);
    CHECK(export_gguf(p, dt) == LOOM_OK, "%s", loom_errmsg());
    loom_gpt_t *m2;
    loom_status s = loom_gguf_load(p, be, &m2, t2);
    CHECK(s == LOOM_OK, "%s", loom_errmsg());
    return s == LOOM_OK ? m2 : NULL;
}

static void test_gguf_f32_roundtrip(void) {
    loom_tokenizer_t *t2;
    loom_gpt_t *m2 = export_and_load("m.gguf", LOOM_XDT_F32, &t2);
    if (!m2) return;
    CHECK(m2->num_params == model->num_params, "%zu vs %zu floats", m2->num_params, model->num_params);
    float *a = params_of(model), *b = params_of(m2);
    CHECK(!memcmp(a, b, model->num_params * sizeof(float)), "weights differ after a GGUF f32 round trip");
    float *la = logits_of(model), *lb = logits_of(m2);
    CHECK(!memcmp(la, lb, (size_t)B * T * model->cfg.padded_vocab_size * sizeof(float)), "logits differ");
    CHECK(t2 && loom_tokenizer_hash(t2) == loom_tokenizer_hash(tok), "embedded tokenizer: another vocabulary or merges");
    CHECK(t2 && loom_tokenizer_eot(t2) == 256, "eot %d", t2 ? loom_tokenizer_eot(t2) : -2);
    free(a), free(b), free(la), free(lb);
    loom_gpt_free(m2);
    loom_tokenizer_free(t2);
}

/* q8_0 and f16 files load with weights within their rounding. */
static void test_gguf_q8_0_f16_load(void) {
    static const struct { loom_xdtype dt; const char *file; double wbound, lbound; } cases[] = {
        {LOOM_XDT_Q8_0, "q.gguf", 1.0 / 127, 2e-2}, /* half a step = amax/254 per block */
        {LOOM_XDT_F16, "h.gguf", 1.0 / 1024, 2e-3},
    };
    float *a = params_of(model), *la = logits_of(model);
    for (int c = 0; c < 2; c++) {
        char p[600];
        path_of(p, sizeof p, cases[c].file);
        CHECK(export_gguf(p, cases[c].dt) == LOOM_OK, "%s", loom_errmsg());
        loom_gpt_t *m2;
        loom_tokenizer_t *t2;
        if (loom_gguf_load(p, be, &m2, &t2) != LOOM_OK) {
            CHECK(0, "%s", loom_errmsg());
            continue;
        }
        float *b = params_of(m2), *lb = logits_of(m2);
        double werr = check_rel_err(b, a, model->num_params), lerr = check_rel_err(lb, la, (size_t)B * T * model->cfg.padded_vocab_size);
        CHECK(werr < cases[c].wbound, "%s weights: normalized error %.3g", cases[c].file, werr);
        CHECK(lerr < cases[c].lbound && lerr > 0, "%s logits: normalized error %.3g", cases[c].file, lerr);
        printf("  %s: weights %.3g, logits %.3g normalized error\n", cases[c].file, werr, lerr);
        free(b), free(lb);
        loom_gpt_free(m2);
        loom_tokenizer_free(t2);
    }
    free(a), free(la);
}

static int oracle(const char *deps, const char *args);

/* llama.cpp's quantize_row_q8_0_ref written again for the check: d =
 * amax / 127, q = round(x / d), the scale stored as fp16 (_Float16's
 * rounding, not loom's converter). */
static void ref_q8_0(const float *x, size_t n, signed char *q, float *d) {
    for (size_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        float dd = amax / 127.0f, id = dd != 0 ? 1.0f / dd : 0.0f;
        for (int i = 0; i < 32; i++) q[32 * b + i] = (signed char)roundf(x[32 * b + i] * id);
        d[b] = (float)(_Float16)dd;
    }
}

/* Logits (B*T, Vp) of every row through the inference forward (the path
 * sample, generate and serve run), with int8 weights q (NULL: fp32). */
static float *infer_logits(loom_gpt_t *m, const loom_quant_t *q) {
    int Vp = m->cfg.padded_vocab_size, bs = 16, per = T / bs, pos[B * T], seq[B * T], rows[B * T];
    float *out = loom_calloc((size_t)B * T * Vp, sizeof(float));
    loom_infer_t *inf;
    if (loom_infer_create(&inf, m, B * per, bs, LOOM_FP32, B * T, B, B * T) != LOOM_OK) return out;
    loom_infer_set_quant(inf, q);
    int mb = loom_infer_max_blocks(inf), *tables = loom_calloc((size_t)B * mb, sizeof(int));
    for (int i = 0; i < B * T; i++) pos[i] = i % T, seq[i] = i / T, rows[i] = i;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < per; k++) tables[b * mb + k] = b * per + k;
    loom_infer_batch_t batch = {B * T, tokens, pos, seq, B, tables, B * T, rows, NULL};
    CHECK(loom_infer_forward(inf, &batch, out) == LOOM_OK, "%s", loom_errmsg());
    loom_infer_free(inf);
    free(tables);
    return out;
}

static float *quant_logits(loom_gpt_t *m, loom_quant_mode mode) {
    loom_quant_t *q = NULL;
    CHECK(loom_quant_create(&q, m, mode) == LOOM_OK, "%s", loom_errmsg());
    float *l = infer_logits(m, q);
    loom_quant_free(q);
    return l;
}

/* The reference: the fp32 checkpoint with every matrix quantized by
 * ref_q8_0 (what a Q8_0 GGUF of it holds), its linear weights also as
 * int8 blocks (gpt.h file_q, as loom_quant_file_int8 finds them); compared with the GGUF loaded by loom. */
static loom_gpt_t *ref_q8_model(void) {
    loom_gpt_t *r;
    LOOM_ASSERT(loom_gpt_create(&r, &model->cfg, be) == LOOM_OK);
    float *h = params_of(model);
    loom_xtensor_t *x;
    int n = loom_xtensors(&model->cfg, &x), L = model->cfg.n_layer;
    size_t head = ((size_t)L * LOOM_QLIN_COUNT * (1 + LOOM_FILE_Q_PARTS) + 2) * sizeof(loom_tensor_t), bytes = 0; /* gpt.h file_q */
    for (int i = 0; i < n; i++) bytes += x[i].numel * 2;
    char *mem = loom_calloc(1, head + bytes), *at = mem + head;
    for (int i = 0; i < n; i++) {
        if (!x[i].cols) continue;
        float *w = loom_xtensor_view(model, h, &x[i]), *d = (float *)at;
        signed char *q = (signed char *)(d + x[i].numel / 32);
        ref_q8_0(w, x[i].numel, q, d);
        for (size_t j = 0; j < x[i].numel; j++) w[j] = d[j / 32] * (float)q[j];
        int k = x[i].param == LOOM_QKVW ? 0 : x[i].param == LOOM_ATTPROJW ? 1 : x[i].param == LOOM_FCW ? 2 : x[i].param == LOOM_FCPROJW ? 3 : -1;
        if (k >= 0)
            ((loom_tensor_t *)mem)[x[i].layer * LOOM_QLIN_COUNT + k] = (loom_tensor_t){
                q, LOOM_INT8, (long long)x[i].rows, (long long)x[i].cols, d, 32, LOOM_LAYOUT_DENSE, NULL};
        at += x[i].numel + x[i].numel / 8;
    }
    be->upload(r->params, h, model->num_params * sizeof(float));
    r->file_q = (loom_tensor_t *)mem;
    free(h), free(x);
    return r;
}

/* A Q8_0 GGUF's linear weights load as int8 with block-32 scales, the
 * bytes of a block-32 quantization of the fp32 run; --quant runs them:
 * logits equal that quantization's, and the fp32 forward's on the
 * dequantized weights within fp32 rounding. */
/* Int8 tensor t's values and block scales in row order, whatever its
 * layout (a GGUF's are 8 rows interleaved for the CPU: backend/qblock.h). */
static void int8_dense(const loom_tensor_t *t, int8_t *q, float *s) {
    size_t n = (size_t)t->rows * t->cols;
    if (t->layout == LOOM_LAYOUT_ROWS8) loom_tensor_rows8_dense(t, q, s);
    else memcpy(q, t->data, n), memcpy(s, t->scales, n / 32 * sizeof(float));
}

static void test_gguf_q8_0_int8_weights(void) {
    char p[600];
    path_of(p, sizeof p, "q.gguf");
    loom_tokenizer_t *t2;
    loom_gpt_t *m2 = export_and_load("q.gguf", LOOM_XDT_Q8_0, &t2);
    if (!m2) return;
    loom_gpt_t *ref = ref_q8_model();
    int L = m2->cfg.n_layer, nq = L * LOOM_QLIN_COUNT, same = 0;
    const loom_tensor_t *f8 = loom_quant_file_int8(m2);
    CHECK(f8, "no int8 weights kept from the q8_0 file");
    for (int i = 0; i < nq && f8; i++) {
        const loom_tensor_t *a = &f8[i], *b = &ref->file_q[i];
        size_t n = (size_t)b->rows * b->cols;
        int ok = a->data && a->block == 32 && a->rows == b->rows && a->cols == b->cols;
        int8_t *q = ok ? loom_malloc(n) : NULL;
        float *sc = ok ? loom_malloc(n / 32 * sizeof(float)) : NULL;
        if (ok) int8_dense(a, q, sc);
        same += ok && !memcmp(q, b->data, n) && !memcmp(sc, b->scales, n / 32 * sizeof(float));
        free(q), free(sc);
    }
    CHECK(same == nq, "%d of %d int8 matrices equal a block-32 quantization of the fp32 weights", same, nq);
    float *pa = params_of(m2), *pb = params_of(ref);
    CHECK(!memcmp(pa, pb, m2->num_params * sizeof(float)), "the dequantized weights are not d * q");
    size_t nl = (size_t)B * T * m2->cfg.padded_vocab_size;
    float *l8 = quant_logits(m2, LOOM_QUANT_W8A32), *lr = quant_logits(ref, LOOM_QUANT_W8A32), *la = quant_logits(m2, LOOM_QUANT_W8A8);
    loom_tensor_t *fq = m2->file_q;
    m2->file_q = NULL; /* fp32 on the dequantized weights (by default the file's blocks run, as --quant w8a8) */
    float *lf = infer_logits(m2, NULL);
    m2->file_q = fq;
    float *lb = infer_logits(m2, NULL);
    CHECK(fq && !memcmp(lb, la, nl * sizeof(float)), "the file's blocks by default differ from --quant w8a8 on them");
    free(lb);
    double e32 = check_rel_err(l8, lf, nl), e8 = check_rel_err(la, lf, nl);
    CHECK(!memcmp(l8, lr, nl * sizeof(float)), "w8a32 logits differ from the reference quantization's");
    CHECK(e32 < 1e-5, "w8a32 on the file's int8 vs fp32 on its dequantized weights: normalized error %.3g", e32);
    CHECK(e8 > 0 && e8 < 3e-2, "w8a8 on the file's int8 vs fp32: normalized error %.3g", e8);
    printf("  q8_0 file: %d int8 matrices as stored; logits w8a32 vs fp32 %.3g, w8a8 vs fp32 %.3g normalized error\n", same, e32, e8);
    char dump[600];
    path_of(dump, sizeof dump, "q8raw.bin");
    FILE *f = fopen(dump, "wb");
    for (int i = 0; i < nq && f && f8; i++) {
        const loom_tensor_t *a = &f8[i];
        size_t n = (size_t)a->rows * a->cols;
        int8_t *q = loom_malloc(n);
        float *sc = loom_malloc(n / 32 * sizeof(float));
        int8_dense(a, q, sc);
        fwrite(sc, sizeof(float), n / 32, f);
        fwrite(q, 1, n, f);
        free(q), free(sc);
    }
    if (f) fclose(f);
    char args[1400];
    snprintf(args, sizeof args, "q8raw %s %s %d", p, dump, L);
    int r = oracle(".deps/py", args);
    if (r >= 0) CHECK(r == 1, "the gguf reader disagrees with loom's int8 view of the q8_0 file");
    free(pa), free(pb), free(l8), free(lr), free(lf), free(la);
    loom_gpt_free(ref);
    loom_gpt_free(m2);
    loom_tokenizer_free(t2);
}

/* Run the oracle; 1 = RESULT ok, 0 = a check failed, -1 = cannot run (skip). */
static int oracle(const char *deps, const char *args) {
    char cmd[4096], line[1024];
    if (access(PYTHON, X_OK) != 0) {
        check_skip("%s not found", PYTHON);
        return -1;
    }
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s " PYTHON " tests/interop_oracle.py %s 2>&1", deps, args);
    FILE *p = popen(cmd, "r");
    int result = -2;
    char last[1024] = "";
    while (p && fgets(line, sizeof line, p)) {
        if (!strncmp(line, "RESULT ", 7)) result = !strncmp(line + 7, "ok", 2);
        else if (!strncmp(line, "ok ", 3) || !strncmp(line, "bad ", 4)) printf("  %s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    if (p) pclose(p);
    if (result == -2) {
        if (strstr(last, "ModuleNotFoundError")) {
            check_skip("the oracle's Python packages are missing (%s): %s", deps, last);
            return -1;
        }
        CHECK(0, "oracle %s did not finish: %s", args, last);
        return 0;
    }
    return result;
}

static void test_gguf_python_reader(void) {
    char args[1400], p[600];
    path_of(p, sizeof p, "m.gguf");
    snprintf(args, sizeof args, "gguf %s %s f32", p, ckpt);
    int r = oracle(".deps/py", args);
    if (r < 0) return;
    CHECK(r == 1, "gguf reader disagrees on the f32 file");
    path_of(p, sizeof p, "q.gguf");
    snprintf(args, sizeof args, "gguf %s %s q8_0", p, ckpt);
    CHECK(oracle(".deps/py", args) == 1, "gguf reader disagrees on the q8_0 file");
}

static void test_hf_transformers_logits(void) {
    char dir[600], tp[600], lp[600], args[2000];
    path_of(dir, sizeof dir, "hf");
    path_of(tp, sizeof tp, "tokens.bin");
    path_of(lp, sizeof lp, "logits.bin");
    CHECK(export_hf(dir) == LOOM_OK, "%s", loom_errmsg());
    float *l = logits_of(model);
    CHECK(loom_file_write_atomic(tp, tokens, sizeof tokens) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_file_write_atomic(lp, l, (size_t)B * T * model->cfg.padded_vocab_size * sizeof(float)) == LOOM_OK, "%s", loom_errmsg());
    free(l);
    snprintf(args, sizeof args, "hf %s %s %s %d %d", dir, tp, lp, B, T);
    int r = oracle(".deps/hf", args);
    if (r >= 0) CHECK(r == 1, "transformers disagrees with loom on the exported folder");
}

/* Copy `src` to `dst` with `n` bytes at `at` replaced (n = 0: truncate to at). */
static void corrupt(const char *src, const char *dst, size_t at, const void *bytes, size_t n) {
    char *d;
    size_t len;
    LOOM_ASSERT(loom_file_read(src, &d, &len) == LOOM_OK);
    if (n) memcpy(d + at, bytes, n);
    LOOM_ASSERT(loom_file_write_atomic(dst, d, n ? len : at) == LOOM_OK);
    free(d);
}

static size_t find(const char *path, const char *needle) {
    char *d;
    size_t len;
    LOOM_ASSERT(loom_file_read(path, &d, &len) == LOOM_OK);
    char *at = memmem(d, len, needle, strlen(needle));
    size_t off = at ? (size_t)(at - d) : 0;
    free(d);
    return off;
}

/* `s` failed and the message names every one of `want`. */
static void expect_error(loom_status s, const char *what, const char *const *want, int n) {
    CHECK(s != LOOM_OK, "%s: accepted", what);
    for (int i = 0; i < n && s != LOOM_OK; i++) CHECK(strstr(loom_errmsg(), want[i]), "%s: message lacks '%s': %s", what, want[i], loom_errmsg());
    if (s != LOOM_OK) printf("  %s -> %s\n", what, loom_errmsg());
}

static void test_gguf_bad_inputs(void) {
    char good[600], bad[600];
    path_of(good, sizeof good, "m.gguf");
    path_of(bad, sizeof bad, "bad.gguf");
    uint32_t v99 = 99;
    size_t arch = find(good, "gpt2");
    struct { const char *what; size_t at; const void *bytes; size_t n; const char *want[2]; } cases[] = {
        {"wrong magic", 0, "GGUX", 4, {"not a GGUF file", "magic"}},
        {"version 99", 4, &v99, 4, {"version 99", "not supported"}},
        {"unknown architecture", arch, "gptx", 4, {"architecture gptx", "gpt2"}},
        {"truncated tensor", 0, NULL, 0, {"tensor blk.1.", "truncated"}},
    };
    char *d;
    size_t len;
    LOOM_ASSERT(loom_file_read(good, &d, &len) == LOOM_OK);
    free(d);
    cases[3].at = len - 300 * 1024 / 10; /* inside the last layer's weights */
    /* Cut anywhere in the header and metadata: an error, never a crash. */
    for (size_t cut = 1; cut < 12000; cut = cut * 3 / 2 + 1) {
        corrupt(good, bad, cut, NULL, 0);
        loom_gpt_t *m2;
        loom_tokenizer_t *t2;
        CHECK(loom_gguf_load(bad, be, &m2, &t2) != LOOM_OK, "a file cut at byte %zu loaded", cut);
    }
    for (int i = 0; i < 4; i++) {
        corrupt(good, bad, cases[i].at, cases[i].bytes, cases[i].n);
        loom_gpt_t *m2;
        loom_tokenizer_t *t2;
        const char *want[3] = {bad, cases[i].want[0], cases[i].want[1]};
        expect_error(loom_gguf_load(bad, be, &m2, &t2), cases[i].what, want, 3);
    }
}

/* Load an HF folder as `loom train --init-from` does. */
static loom_status load_hf_dir(const char *dir) {
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_hf_read_config(dir, &cfg));
    loom_gpt_t *m2;
    LOOM_TRY(loom_gpt_create(&m2, &cfg, be));
    loom_status s = loom_hf_load_weights(m2, dir);
    loom_gpt_free(m2);
    return s;
}

static void set_config(const char *dir, const char *key, cJSON *value) {
    char p[700], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/config.json", dir);
    LOOM_ASSERT(loom_file_read(p, &text, &len) == LOOM_OK);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON_ReplaceItemInObject(j, key, value);
    text = cJSON_Print(j);
    LOOM_ASSERT(loom_file_write_atomic(p, text, strlen(text)) == LOOM_OK);
    free(text);
    cJSON_Delete(j);
}

static void test_hf_bad_inputs(void) {
    char dir[600], st[700], pt[700];
    path_of(dir, sizeof dir, "hfbad");
    CHECK(export_hf(dir) == LOOM_OK, "%s", loom_errmsg());
    CHECK(load_hf_dir(dir) == LOOM_OK, "the good folder: %s", loom_errmsg());
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    const char *w1[] = {st, "h.1.ln_2.bias", "missing"};
    corrupt(st, st, find(st, "\"h.1.ln_2.bias\""), "\"h.1.ln_2.xxxx\"", 15);
    expect_error(load_hf_dir(dir), "missing tensor", w1, 3);
    CHECK(export_hf(dir) == LOOM_OK, "%s", loom_errmsg());
    set_config(dir, "n_positions", cJSON_CreateNumber(16));
    const char *w2[] = {st, "wpe.weight", "shape [32,64]"};
    expect_error(load_hf_dir(dir), "shape against config", w2, 3);
    set_config(dir, "model_type", cJSON_CreateString("llama"));
    const char *w3[] = {dir, "model_type llama", "gpt2"};
    expect_error(load_hf_dir(dir), "not GPT-2", w3, 3);
    set_config(dir, "model_type", cJSON_CreateString("gpt2"));
    set_config(dir, "n_positions", cJSON_CreateNumber(32));
    snprintf(pt, sizeof pt, "%s/pytorch_model.bin", dir);
    LOOM_ASSERT(rename(st, pt) == 0);
    const char *w4[] = {pt, "out of scope", "safetensors"};
    expect_error(load_hf_dir(dir), "pytorch_model.bin only", w4, 3);
}

static int rm_cb(const char *p, const struct stat *sb, int f, struct FTW *w) {
    (void)sb, (void)f, (void)w;
    return remove(p);
}

int main(void) {
    setup();
    RUN(test_gguf_f32_roundtrip);
    RUN(test_gguf_q8_0_f16_load);
    RUN(test_gguf_python_reader);
    RUN(test_gguf_q8_0_int8_weights);
    RUN(test_hf_transformers_logits);
    RUN(test_gguf_bad_inputs);
    RUN(test_hf_bad_inputs);
    loom_gpt_free(model);
    loom_tokenizer_free(tok);
    int rc = check_main_end();
    if (rc == 0 && !getenv("LOOM_INTEROP_KEEP")) nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    else printf("  files kept in %s\n", tmp);
    return rc;
}
