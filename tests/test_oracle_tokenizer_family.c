/* The Llama-family tokenizers against Hugging Face `tokenizers`
 * (tests/tokenizer_family_oracle.py builds them with `tokenizers` itself):
 * Llama 3's, Qwen2's and SmolLM2's byte-level BPE and three
 * SentencePiece-style BPEs (Llama 2's normalizer with byte fallback;
 * Metaspace "first" without split; Metaspace with split, unknown
 * characters and the Metaspace decoder). On unseen multilingual text
 * (scripts, emoji, digits, whitespace runs, code, added tokens special or
 * not) loom's ids must equal `tokenizers`' with and without the BOS/EOS it
 * adds; decoding their ids must give `tokenizers`' text; the file loom
 * writes must give `tokenizers` the same ids again; and the
 * pre-tokenization must split every sampled code point as Llama 3's regex
 * does in `tokenizers`, and NFC (Qwen2) must normalize every code point in
 * context as `tokenizers` does. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/bpe_nfc.h"
#include "data/bpe_pretok.h"
#include "data/tokenizer.h"

static char python[256], train_path[512], text_path[512];
static int have_oracle;

static int oracle(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int oracle(const char *fmt, ...) {
    char args[2048], cmd[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s tests/tokenizer_family_oracle.py %s", python, args);
    int rc = system(cmd);
    if (rc != 0) printf("  oracle failed (%d): %s\n", rc, cmd);
    return rc == 0;
}

static uint32_t *read_u32(const char *p, size_t *n) {
    char *data = NULL;
    size_t len = 0;
    if (loom_file_read(p, &data, &len) != LOOM_OK) {
        CHECK(0, "the oracle wrote no %s", p);
        return NULL;
    }
    *n = len / 4;
    return (uint32_t *)data;
}

static void same_ids(const char *what, const uint32_t *a, size_t na, const uint32_t *b, size_t nb, const char *text, const loom_tokenizer_t *t) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    if (na == nb && i == na) return;
    char ctx[200] = "";
    size_t k = 0;
    for (size_t j = i > 3 ? i - 3 : 0; j < i + 4 && j < nb && k + 40 < sizeof ctx; j++) { /* the oracle's tokens around it */
        char *nm = loom_tokenizer_token_name(t, b[j]);
        k += (size_t)snprintf(ctx + k, sizeof ctx - k, "%s[%s]", j == i ? ">" : "", nm);
        free(nm);
    }
    (void)text;
    CHECK(0, "%s: loom %zu ids, tokenizers %zu; first difference at %zu (loom %u, tokenizers %u) near %s", what, na, nb, i,
          i < na ? a[i] : 0, i < nb ? b[i] : 0, ctx);
}

/* A cut inside an added token with a space (the test's "my added phrase")
 * moves to its start: the pipeline's cuts know only the pre-tokenizer. */
static size_t before_added(const loom_tokenizer_t *t, const char *text, size_t len, size_t cut) {
    for (int k = 0; k < loom_tokenizer_nspecial(t); k++) {
        const char *s = loom_tokenizer_special(t, k, NULL);
        size_t n = strlen(s), from = cut >= n ? cut - n + 1 : 0;
        const char *p = memmem(text + from, (cut + n - 1 < len ? cut + n - 1 : len) - from, s, n);
        if (p && (size_t)(p - text) < cut) return (size_t)(p - text);
    }
    return cut;
}

/* Encode the test text in pieces cut where loom_pretok_safe_cut says, as
 * `loom tokenize` does: the same ids as in one piece. */
static void pieces_match(const loom_tokenizer_t *t, const char *text, size_t len, const uint32_t *whole, size_t n) {
    loom_encoder_t *e = loom_encoder_new(t);
    loom_ids_t out = {0};
    size_t at = 0;
    while (at < len) {
        size_t want = at + 997 < len ? at + 997 : len;
        size_t cut = want < len ? loom_pretok_safe_cut((const unsigned char *)text, len, want) : len;
        if (cut <= at) cut = loom_pretok_safe_cut_after((const unsigned char *)text, len, want);
        if (cut <= at) cut = len;
        cut = before_added(t, text, len, cut);
        loom_encoder_encode(e, text + at, cut - at, at == 0, &out);
        at = cut;
    }
    same_ids("encoded in pieces vs in one", out.v, out.n, whole, n, text, t);
    loom_ids_free(&out);
    loom_encoder_free(e);
}

static const char *GGUF_MODEL(const char *kind) { return !strncmp(kind, "spm", 3) ? "llama" : "gpt2"; }
static const char *GGUF_PRE(const char *kind) {
    return !strcmp(kind, "llama3") ? "llama-bpe" : !strcmp(kind, "qwen2") ? "qwen2" : !strcmp(kind, "smollm") ? "smollm" : NULL;
}
static void check_from_vocab(const loom_tokenizer_t *t, const char *model, const char *pre, int scores,
                             const char *text, size_t len, const uint32_t *want, size_t nwant);

static void check_kind(const char *kind, int cut_safe) {
    if (!have_oracle) {
        check_skip("Hugging Face tokenizers not importable by %s (scripts/deps.sh installs it)", python);
        return;
    }
    char dir[600], tj[700], cfg[700];
    snprintf(dir, sizeof dir, "%s", check_tmp_path(kind));
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (!oracle("build %s %s %s", kind, train_path, dir)) return check_fail_why("tokenizers could not build the %s tokenizer", kind);
    loom_tokenizer_t *t = NULL;
    char *tmpl = NULL;
    CHECK(loom_tokenizer_load(&t, tj) == LOOM_OK, "load: %s", loom_errmsg());
    if (!t) return;
    CHECK(loom_tokenizer_apply_config(t, cfg, &tmpl) == LOOM_OK && tmpl && strstr(tmpl, "messages"), "tokenizer_config.json: %s", loom_errmsg());
    char *text;
    size_t len, n[2], m[2], dl;
    loom_file_read(text_path, &text, &len);
    uint32_t *mine[2], *theirs[2];
    for (int sp = 0; sp < 2; sp++) {
        char ids[700];
        snprintf(ids, sizeof ids, "%s/ids%d.bin", dir, sp);
        theirs[sp] = oracle("encode %s %s %s %d", tj, text_path, ids, sp) ? read_u32(ids, &m[sp]) : NULL;
        if (sp) loom_tokenizer_encode_special(t, text, len, &mine[sp], &n[sp]);
        else loom_tokenizer_encode(t, text, len, &mine[sp], &n[sp]);
        if (theirs[sp]) same_ids(sp ? "with BOS/EOS" : "ids", mine[sp], n[sp], theirs[sp], m[sp], text, t);
    }
    /* decode: loom's text for the oracle's ids is the oracle's */
    char *back = NULL, *want = NULL;
    size_t wl = 0;
    char dp[700];
    snprintf(dp, sizeof dp, "%s/decoded.txt", dir);
    if (theirs[0] && oracle("decode %s %s/ids0.bin %s", tj, dir, dp)) loom_file_read(dp, &want, &wl);
    CHECK(theirs[0] && loom_tokenizer_decode(t, theirs[0], m[0], &back, &dl) == LOOM_OK && want && dl == wl && !memcmp(back, want, wl),
          "decode differs from tokenizers' (%zu vs %zu bytes)", dl, wl);
    if (cut_safe) pieces_match(t, text, len, mine[0], n[0]);
    if ((GGUF_PRE(kind) || !strcmp(kind, "spm-legacy") || !strcmp(kind, "spm-scores")) && theirs[0])
        check_from_vocab(t, GGUF_MODEL(kind), GGUF_PRE(kind), !strcmp(kind, "spm-scores"), text, len, theirs[0], m[0]);
    /* the tokenizer.json loom writes gives tokenizers the same ids */
    char saved[700], ids[700];
    snprintf(saved, sizeof saved, "%s/saved.json", dir);
    snprintf(ids, sizeof ids, "%s/saved.bin", dir);
    CHECK(loom_tokenizer_save(t, saved) == LOOM_OK, "save: %s", loom_errmsg());
    size_t k = 0;
    uint32_t *again = oracle("encode %s %s %s 1", saved, text_path, ids) ? read_u32(ids, &k) : NULL;
    if (again) same_ids("tokenizers on the file loom wrote", again, k, mine[1], n[1], text, t);
    loom_tokenizer_t *t2 = NULL;
    CHECK(loom_tokenizer_load(&t2, saved) == LOOM_OK && loom_tokenizer_hash(t2) == loom_tokenizer_hash(t), "reload: %s", loom_errmsg());
    loom_tokenizer_free(t2);
    for (int sp = 0; sp < 2; sp++) free(mine[sp]), free(theirs[sp]);
    free(again), free(back), free(want), free(text), free(tmpl);
    loom_tokenizer_free(t);
}

/* The same vocabulary handed over as GGUF holds it (names, token types,
 * merges or scores): loom_tokenizer_from_vocab must give the same ids. */
static void check_from_vocab(const loom_tokenizer_t *t, const char *model, const char *pre, int scores,
                             const char *text, size_t len, const uint32_t *want, size_t nwant) {
    int V = loom_tokenizer_vocab_size(t), nm = scores ? 0 : loom_tokenizer_merges(t);
    char **names = loom_calloc((size_t)V, sizeof *names), **merges = loom_calloc((size_t)nm + 1, sizeof *merges);
    int32_t *types = loom_calloc((size_t)V, sizeof *types);
    float *sc = loom_calloc((size_t)V, sizeof *sc);
    for (int i = 0; i < V; i++) {
        names[i] = loom_tokenizer_token_name(t, (uint32_t)i);
        size_t n;
        loom_tokenizer_token(t, (uint32_t)i, &n);
        int byte = !strncmp(names[i], "<0x", 3) && strlen(names[i]) == 6 && !strcmp(model, "llama");
        types[i] = loom_tokenizer_is_control(t, (uint32_t)i) ? 3 : byte ? 6 : 1;
        sc[i] = -(float)i;
    }
    for (int k = 0; k < loom_tokenizer_nspecial(t); k++) { /* added tokens that are text: user defined */
        uint32_t id;
        loom_tokenizer_special(t, k, &id);
        if (!loom_tokenizer_is_control(t, id)) types[id] = 4;
    }
    for (int i = 0; i < nm; i++) {
        uint32_t a, b;
        loom_tokenizer_merge(t, (size_t)i, &a, &b);
        merges[i] = loom_malloc(strlen(names[a]) + strlen(names[b]) + 2);
        sprintf(merges[i], "%s %s", names[a], names[b]);
    }
    loom_tokenizer_vocab_t v = {.model = model, .pre = pre, .n = V, .tokens = (const char *const *)names, .types = types,
                                .merges = (const char *const *)merges, .nmerges = (size_t)nm, .scores = scores ? sc : NULL,
                                .bos = loom_tokenizer_bos(t), .eos = loom_tokenizer_eos(t), .unk = scores ? 0 : -1,
                                .add_space_prefix = 1, .origin = "vocab"};
    loom_tokenizer_t *g = NULL;
    CHECK(loom_tokenizer_from_vocab(&g, &v) == LOOM_OK, "from_vocab: %s", loom_errmsg());
    if (g) {
        uint32_t *ids;
        size_t n;
        loom_tokenizer_encode(g, text, len, &ids, &n);
        same_ids(scores ? "from GGUF-style vocab and scores" : "from GGUF-style vocab and merges", ids, n, want, nwant, text, t);
        free(ids);
    }
    loom_tokenizer_free(g);
    for (int i = 0; i < V; i++) free(names[i]);
    for (int i = 0; i < nm; i++) free(merges[i]);
    free(names), free(merges), free(types), free(sc);
}

static void llama3(void) { check_kind("llama3", 1); }
static void qwen2(void) { check_kind("qwen2", 1); }
static void smollm(void) { check_kind("smollm", 1); }
static void spm_legacy(void) { check_kind("spm-legacy", 1); }
static void spm_first(void) { check_kind("spm-first", 0); }
static void spm_split(void) { check_kind("spm-split", 1); }
static void spm_scores(void) { check_kind("spm-scores", 1); }

/* Every code point below U+3000 and every 31st above, in contexts, split as
 * the Split pre-tokenizer with Llama 3's regex splits it. */
static void pretokenize_code_points(void) {
    if (!have_oracle) return check_skip("Hugging Face tokenizers not importable by %s", python);
    const char *kinds[1] = {"llama3"}; /* Qwen2 differs only in digits, which the ids cases cover */
    loom_pretok_kind k[1] = {LOOM_PRETOK_LLAMA3};
    for (int v = 0; v < 1; v++) {
        const char *tp = check_tmp_path("cps.txt"), *lp = check_tmp_path("lens.bin");
        size_t m = 0, len = 0;
        char *text = NULL;
        uint32_t *theirs = oracle("pretok %s 31 %s %s", kinds[v], tp, lp) ? read_u32(lp, &m) : NULL;
        if (!theirs || loom_file_read(tp, &text, &len) != LOOM_OK) {
            free(theirs);
            return check_fail_why("the oracle gave no pieces");
        }
        size_t i = 0, j = 0, at = 0;
        while (i < len && j < m) {
            size_t e = loom_pretok_next_kind(k[v], (const unsigned char *)text, len, i);
            if (e - i != theirs[j]) break;
            at = i = e;
            j++;
        }
        CHECK(i == len && j == m, "%s: piece %zu at byte %zu differs: \"%.*s\"", kinds[v], j, at, (int)(len - at < 24 ? len - at : 24), text + at);
        free(theirs);
        free(text);
    }
}

/* NFC (Qwen2's normalizer) of the code points where it does something
 * (marks, decomposable ones, Hangul) and every 29th other, in three
 * contexts, and of Hangul jamo runs, as tokenizers'. */
static void nfc_code_points(void) {
    if (!have_oracle) return check_skip("Hugging Face tokenizers not importable by %s", python);
    const char *tp = check_tmp_path("nfc_in.txt"), *op = check_tmp_path("nfc_out.txt");
    char *in = NULL, *want = NULL;
    size_t n = 0, wn = 0, cap = 0;
    if (!oracle("nfc %s %s", tp, op) || loom_file_read(tp, &in, &n) != LOOM_OK || loom_file_read(op, &want, &wn) != LOOM_OK) {
        free(in);
        return check_fail_why("the oracle gave no NFC text");
    }
    unsigned char *got = NULL;
    size_t gn = loom_nfc((const unsigned char *)in, n, &got, &cap), i = 0;
    while (i < gn && i < wn && got[i] == (unsigned char)want[i]) i++;
    size_t from = i > 12 ? i - 12 : 0;
    CHECK(gn == wn && i == wn, "%zu bytes vs %zu; first difference at byte %zu, after \"%.*s\"", gn, wn, i, (int)(i - from), want + from);
    free(in), free(want), free(got);
}

int main(void) {
    check_tmpdir("oracle-tokfam");
    loom_log_quiet(1);
    snprintf(python, sizeof python, "%s", getenv("LOOM_PYTHON") ? getenv("LOOM_PYTHON") : "/usr/bin/python3");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s -c 'import tokenizers' 2>/dev/null", python);
    have_oracle = system(cmd) == 0;
    snprintf(train_path, sizeof train_path, "%s", check_tmp_path("train.txt"));
    snprintf(text_path, sizeof text_path, "%s", check_tmp_path("text.txt"));
    if (have_oracle && !(oracle("text %s 1", train_path) && oracle("text %s 2", text_path))) have_oracle = 0;
    RUN(llama3);
    RUN(qwen2);
    RUN(smollm);
    RUN(spm_legacy);
    RUN(spm_first);
    RUN(spm_split);
    RUN(spm_scores);
    RUN(pretokenize_code_points);
    RUN(nfc_code_points);
    return check_main_end();
}
