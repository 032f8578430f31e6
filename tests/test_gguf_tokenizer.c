/* A Llama-family GGUF's own tokenizer against Hugging Face `tokenizers`:
 * tests/gguf_chat.py builds a tokenizer with `tokenizers` (Llama 3-style
 * byte-level BPE, and SentencePiece-style BPE with byte fallback whose
 * GGUF form is scores, not merges) and writes it with the `gguf` package
 * as llama.cpp's converter does (tokenizer.ggml.*) beside a tiny Llama.
 * Loading the file must give a tokenizer whose ids on unseen multilingual
 * text (added tokens, special or not, among it) equal `tokenizers'`, with
 * and without the BOS it adds, and whose decoding of them equals
 * `tokenizers'`. loom's GGUF writer (`loom export`) writes the same
 * tokenizer metadata back (read by the `gguf` package's GGUFReader), and
 * that file tokenizes the same again. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "ckpt/gguf.h"

static char python[256], train_path[512], text_path[512];
static int have_oracle;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) printf("  failed (%d): %s\n", rc, cmd);
    return rc == 0;
}

static uint32_t *read_u32(const char *p, size_t *n) {
    char *data = NULL;
    size_t len = 0;
    if (loom_file_read(p, &data, &len) != LOOM_OK) return NULL;
    *n = len / 4;
    return (uint32_t *)data;
}

static void same_ids(const char *kind, const char *what, const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    CHECK(na == nb && i == na, "%s %s: loom %zu ids, tokenizers %zu; first difference at %zu (loom %u, tokenizers %u)", kind, what, na,
          nb, i, i < na ? a[i] : 0, i < nb ? b[i] : 0);
}

/* The ids of tokenizer t (loaded from a GGUF) on the text against
 * `tokenizers'` (tokenizer.json in dir), with and without BOS; decoding. */
static void same_as_oracle(const char *kind, const char *dir, const char *tj, const loom_tokenizer_t *t) {
    char *text = NULL;
    size_t len = 0;
    loom_file_read(text_path, &text, &len);
    for (int sp = 0; sp < 2; sp++) {
        char ids[700];
        size_t n = 0, k = 0;
        uint32_t *mine = NULL, *theirs;
        snprintf(ids, sizeof ids, "%s/ids%d.bin", dir, sp);
        theirs = sh("%s tests/tokenizer_family_oracle.py encode %s %s %s %d", python, tj, text_path, ids, sp) ? read_u32(ids, &k) : NULL;
        CHECK(theirs, "the oracle gave no ids");
        (sp ? loom_tokenizer_encode_special : loom_tokenizer_encode)(t, text, len, &mine, &n);
        if (theirs) same_ids(kind, sp ? "with BOS" : "ids", mine, n, theirs, k);
        if (theirs && !sp) { /* decoding the oracle's ids gives the oracle's text */
            char dp[700], *want = NULL, *back = NULL;
            size_t wl = 0, dl = 0;
            snprintf(dp, sizeof dp, "%s/decoded.txt", dir);
            if (sh("%s tests/tokenizer_family_oracle.py decode %s %s %s", python, tj, ids, dp)) loom_file_read(dp, &want, &wl);
            CHECK(want && loom_tokenizer_decode(t, theirs, k, &back, &dl) == LOOM_OK && dl == wl && !memcmp(back, want, wl),
                  "%s decode differs from tokenizers' (%zu vs %zu bytes)", kind, dl, wl);
            free(want), free(back);
        }
        free(mine), free(theirs);
    }
    free(text);
}

/* `loom export`'s writer on the loaded model and tokenizer (and the
 * file's chat template): GGUFReader finds the original's tokenizer
 * metadata (tests/gguf_chat.py meta), and loom reads the export back to
 * the same ids. */
static void export_again(const char *kind, const char *dir, const char *model, const char *tj, const loom_gpt_t *m,
                         const loom_tokenizer_t *t) {
    char out[700], *tmpl = NULL;
    snprintf(out, sizeof out, "%s/export.gguf", dir);
    CHECK(loom_gguf_read_str(model, "tokenizer.chat_template", &tmpl) == LOOM_OK && tmpl, "no chat template in %s", model);
    loom_gguf_write_opts_t o = {.cfg = &m->cfg, .tok = t, .dtype = LOOM_XDT_F32, .name = kind, .params = m->params, .chat_template = tmpl};
    CHECK(loom_gguf_write(out, &o) == LOOM_OK, "export %s: %s", out, loom_errmsg());
    free(tmpl);
    CHECK(sh("PYTHONPATH=.deps/py %s tests/gguf_chat.py meta %s %s", python, model, out), "%s: the exported tokenizer metadata differs", kind);
    const loom_backend_t *be;
    loom_gpt_t *m2 = NULL;
    loom_tokenizer_t *t2 = NULL;
    CHECK(loom_backend_cpu_init(&be, 1) == LOOM_OK, "cpu");
    CHECK(loom_gguf_load(out, be, &m2, &t2) == LOOM_OK && t2, "load %s: %s", out, loom_errmsg());
    if (t2) same_as_oracle(kind, dir, tj, t2);
    if (t2) loom_tokenizer_free(t2);
    if (m2) loom_gpt_free(m2);
}

static void check_kind(const char *kind) {
    if (!have_oracle) return check_skip("tokenizers, gguf or numpy not importable by %s (scripts/deps.sh installs them)", python);
    char dir[600], model[700], tj[700];
    snprintf(dir, sizeof dir, "%s", check_tmp_path(kind));
    snprintf(model, sizeof model, "%s/model.gguf", dir);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    if (!sh("PYTHONPATH=.deps/py %s tests/gguf_chat.py build %s %s %s", python, kind, train_path, dir))
        return check_fail_why("the oracle could not write the %s file", kind);
    const loom_backend_t *be;
    loom_gpt_t *m = NULL;
    loom_tokenizer_t *t = NULL;
    CHECK(loom_backend_cpu_init(&be, 1) == LOOM_OK, "cpu");
    CHECK(loom_gguf_load(model, be, &m, &t) == LOOM_OK && t, "load %s: %s", model, loom_errmsg());
    if (!t) return;
    same_as_oracle(kind, dir, tj, t);
    export_again(kind, dir, model, tj, m, t);
    loom_tokenizer_free(t);
    loom_gpt_free(m);
}

static void llama3_byte_level(void) { check_kind("llama3"); }
static void sentencepiece_scores(void) { check_kind("spm-scores"); }

int main(void) {
    check_tmpdir("gguf-tok");
    loom_log_quiet(1);
    snprintf(python, sizeof python, "%s", getenv("LOOM_PYTHON") ? getenv("LOOM_PYTHON") : "/usr/bin/python3");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "PYTHONPATH=.deps/py %s -c 'import tokenizers, gguf, numpy' 2>/dev/null", python);
    have_oracle = system(cmd) == 0;
    snprintf(train_path, sizeof train_path, "%s", check_tmp_path("train.txt"));
    snprintf(text_path, sizeof text_path, "%s", check_tmp_path("text.txt"));
    if (have_oracle && !(sh("%s tests/tokenizer_family_oracle.py text %s 1", python, train_path) &&
                         sh("%s tests/tokenizer_family_oracle.py text %s 2", python, text_path)))
        have_oracle = 0;
    RUN(llama3_byte_level);
    RUN(sentencepiece_scores);
    return check_main_end();
}
