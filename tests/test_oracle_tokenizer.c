/* loom's tokenizer against Hugging Face `tokenizers` (tests/tokenizer_oracle.py)
 * on a few MB of mixed text: a tokenizer loom trained (through the
 * tokenize pipeline, data/pipeline.h, shards included) and one `tokenizers` trained, loaded both as
 * tokenizer.json and as vocab.json + merges.txt, must give the same ids in
 * both; the pre-tokenizer must split every sampled code point the same way. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data/bpe_pretok.h"
#include "data/pipeline.h"
#include "data/shard.h"
#include "data/tokenizer.h"

static char python[256], text_path[512];
static int have_oracle;   /* `tokenizers` imports: the oracle is installed */
static char oracle_broken[256]; /* set when it is installed but produced no text */

static int oracle(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s tests/tokenizer_oracle.py %s", python, args);
    int rc = system(cmd);
    if (rc != 0) printf("  oracle failed (%d): %s\n", rc, cmd);
    return rc == 0;
}

/* The ids the oracle wrote to p, or NULL after failing the case when it
 * wrote none: an oracle that produced nothing must not let a comparison
 * of two empty lists pass. */
static uint32_t *read_u32(const char *p, size_t *n) {
    char *data = NULL;
    size_t len = 0;
    loom_status st = loom_file_read(p, &data, &len);
    if (st != LOOM_OK || len < 4) {
        CHECK(0, "the oracle produced no ids in %s", p);
        if (st == LOOM_OK) free(data);
        return NULL;
    }
    *n = len / 4;
    return (uint32_t *)data;
}

/* 1 when the case can compare against the oracle; else skipped (not
 * installed) or failed (installed, but it produced no text). */
static int oracle_ready(void) {
    if (oracle_broken[0]) {
        check_fail_why("%s", oracle_broken);
        return 0;
    }
    if (!have_oracle) check_skip("Hugging Face tokenizers not importable by %s (scripts/deps.sh installs it)", python);
    return have_oracle;
}

/* Compare two id arrays; report the first difference with some context. */
static void same_ids(const char *what, const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    CHECK(na == nb && i == na, "%s: loom %zu ids, tokenizers %zu; first difference at %zu (loom %u, tokenizers %u)", what, na, nb, i,
          i < na ? a[i] : 0, i < nb ? b[i] : 0);
}

static uint32_t *loom_encode_file(const loom_tokenizer_t *t, const char *p, size_t *n) {
    char *text;
    size_t len;
    if (loom_file_read(p, &text, &len) != LOOM_OK) return NULL;
    uint32_t *ids;
    loom_tokenizer_encode(t, text, len, &ids, n);
    free(text);
    return ids;
}

static void loom_trained(void) {
    if (!oracle_ready()) return;
    const char *out = check_tmp_path("loom");
    const char *inputs[] = {text_path}, *specials[] = {"<|endoftext|>"};
    loom_pipeline_opts_t po = {.inputs = inputs, .ninputs = 1, .out = out, .vocab = 3000, .specials = specials, .nspecial = 1,
                               .val_fraction = 0.05, .shard_tokens = 300000, .threads = 2};
    loom_pipeline_result_t res;
    loom_status rc = loom_pipeline_run(&po, &res);
    CHECK(rc == LOOM_OK, "the tokenize pipeline failed: %s", loom_errmsg());
    if (rc) return;
    CHECK(res.vocab == 3000 && res.val_shards >= 1 && res.train_shards >= 2, "pipeline result: vocabulary %d, %d val and %d train shards",
          res.vocab, res.val_shards, res.train_shards);
    loom_tokenizer_t *t = NULL;
    CHECK(loom_tokenizer_load(&t, check_tmp_path("loom/tokenizer.json")) == LOOM_OK, "%s", loom_errmsg());
    if (!t) return;
    CHECK(loom_tokenizer_vocab_size(t) == 3000, "vocab %d", loom_tokenizer_vocab_size(t));
    size_t n = 0, m = 0;
    uint32_t *mine = loom_encode_file(t, text_path, &n);
    char args[1024];
    snprintf(args, sizeof args, "encode %s %s %s", check_tmp_path("loom/tokenizer.json"), text_path, check_tmp_path("hf_ids.bin"));
    uint32_t *theirs = oracle(args) ? read_u32(check_tmp_path("hf_ids.bin"), &m) : NULL;
    CHECK(theirs != NULL, "no ids from the oracle");
    if (theirs) same_ids("loom-trained tokenizer.json", mine, n, theirs, m);

    /* The shards hold the same ids: eot, then val, then train shards in order. */
    loom_ids_t all = {0};
    int shards = 0;
    for (int split = 0; split < 2; split++)
        for (int i = 0;; i++) {
            char name[64];
            snprintf(name, sizeof name, "loom/%s_%06d.bin", split ? "train" : "val", i);
            if (!loom_path_exists(check_tmp_path(name))) break;
            loom_shard_t s;
            CHECK(loom_shard_open(&s, check_tmp_path(name)) == LOOM_OK && loom_shard_validate(&s, check_tmp_path(name), 0) == LOOM_OK, "%s", loom_errmsg());
            for (size_t k = 0; k < s.ntokens; k++) loom_ids_push(&all, loom_shard_get(&s, k));
            loom_shard_close(&s);
            shards++;
        }
    CHECK(shards >= 3, "expected a val shard and several train shards, found %d", shards);
    CHECK(all.n == n + 1 && all.v[0] == (uint32_t)loom_tokenizer_eot(t), "shards hold %zu ids, the text %zu + eot", all.n, n);
    if (all.n == n + 1) same_ids("shards (streamed, 2 threads) vs one-shot encode", all.v + 1, n, mine, n);

    /* decode(encode(x)) == x on the whole corpus */
    char *text, *back;
    size_t len, bl;
    loom_file_read(text_path, &text, &len);
    CHECK(loom_tokenizer_decode(t, mine, n, &back, &bl) == LOOM_OK && bl == len && !memcmp(back, text, len), "round trip of the corpus");
    free(text);
    free(back);
    loom_ids_free(&all);
    free(mine);
    free(theirs);
    loom_tokenizer_free(t);
}

static void hf_trained(void) {
    if (!oracle_ready()) return;
    char args[1024];
    snprintf(args, sizeof args, "train %s 4000 %s", text_path, check_tmp_path("hf"));
    if (!oracle(args)) {
        CHECK(0, "training with tokenizers failed");
        return;
    }
    size_t m = 0, n = 0;
    uint32_t *theirs = read_u32(check_tmp_path("hf/ids.bin"), &m);
    loom_tokenizer_t *t = NULL;
    CHECK(loom_tokenizer_load(&t, check_tmp_path("hf/tokenizer.json")) == LOOM_OK, "%s", loom_errmsg());
    if (t && theirs) {
        uint32_t *mine = loom_encode_file(t, text_path, &n);
        same_ids("tokenizers-trained tokenizer.json", mine, n, theirs, m);
        free(mine);
    }
    loom_tokenizer_free(t);
    t = NULL;
    CHECK(loom_tokenizer_load_gpt2(&t, check_tmp_path("hf/vocab.json"), check_tmp_path("hf/merges.txt")) == LOOM_OK, "%s", loom_errmsg());
    snprintf(args, sizeof args, "encode-gpt2 %s %s %s %s", check_tmp_path("hf/vocab.json"), check_tmp_path("hf/merges.txt"), text_path, check_tmp_path("gpt2_ids.bin"));
    uint32_t *pair = oracle(args) ? read_u32(check_tmp_path("gpt2_ids.bin"), &m) : NULL;
    if (t && pair) {
        uint32_t *mine = loom_encode_file(t, text_path, &n);
        same_ids("vocab.json + merges.txt", mine, n, pair, m);
        free(mine);
    }
    free(pair);
    free(theirs);
    loom_tokenizer_free(t);
}

static void pretokenize_code_points(void) {
    if (!oracle_ready()) return;
    char args[1024];
    snprintf(args, sizeof args, "pretok-text %s 13 && %s tests/tokenizer_oracle.py pretok %s %s", check_tmp_path("cps.txt"), python,
             check_tmp_path("cps.txt"), check_tmp_path("cps_lens.bin"));
    size_t m = 0;
    uint32_t *theirs = oracle(args) ? read_u32(check_tmp_path("cps_lens.bin"), &m) : NULL;
    char *text;
    size_t len;
    if (!theirs || loom_file_read(check_tmp_path("cps.txt"), &text, &len) != LOOM_OK) {
        CHECK(0, "oracle gave no pre-tokens");
        free(theirs);
        return;
    }
    loom_ids_t mine = {0};
    for (size_t i = 0; i < len;) {
        size_t j = loom_pretok_next((const unsigned char *)text, len, i);
        loom_ids_push(&mine, (uint32_t)(j - i));
        i = j;
    }
    size_t k = 0, at = 0;
    while (k < mine.n && k < m && mine.v[k] == theirs[k]) at += mine.v[k++];
    char ctx[64] = {0};
    if (k < mine.n || k < m) snprintf(ctx, sizeof ctx, "%.*s", (int)(len - at < 24 ? len - at : 24), text + at);
    CHECK(mine.n == m && k == m, "%zu pieces vs %zu; first difference at piece %zu, byte %zu: \"%s\"", mine.n, m, k, at, ctx);
    loom_ids_free(&mine);
    free(theirs);
    free(text);
}

int main(void) {
    check_tmpdir("oracle-tokenizer");
    loom_log_quiet(1);
    snprintf(python, sizeof python, "%s", getenv("LOOM_PYTHON") ? getenv("LOOM_PYTHON") : "/usr/bin/python3");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s -c 'import tokenizers' 2>/dev/null", python);
    have_oracle = system(cmd) == 0;
    snprintf(text_path, sizeof text_path, "%s", check_tmp_path("mixed.txt"));
    if (have_oracle) {
        char args[700];
        snprintf(args, sizeof args, "gen %s 3 1234", text_path);
        size_t len = 0;
        char *text = NULL;
        if (!oracle(args) || loom_file_read(text_path, &text, &len) != LOOM_OK || len < 100000)
            snprintf(oracle_broken, sizeof oracle_broken, "the oracle produced %zu bytes of test text (want a few MB): %s tests/tokenizer_oracle.py gen", len, python);
        free(text);
    }
    RUN(loom_trained);
    RUN(hf_trained);
    RUN(pretokenize_code_points);
    return check_main_end();
}
