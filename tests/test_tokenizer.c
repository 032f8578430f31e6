/* Tokenizer and shard tests that need no oracle: the byte-level layout,
 * hand-checked pre-tokenization, a hand-made GPT-2 vocab/merges pair with
 * known ids, round trips, training invariants, file errors and shards. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data/bpe_pretok.h"
#include "data/shard.h"
#include "data/tokenizer.h"



static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static int roundtrip(const loom_tokenizer_t *t, const char *s, size_t n) {
    uint32_t *ids;
    size_t k;
    char *back;
    size_t bl;
    if (loom_tokenizer_encode(t, s, n, &ids, &k) != LOOM_OK) return 0;
    int ok = loom_tokenizer_decode(t, ids, k, &back, &bl) == LOOM_OK && bl == n && !memcmp(back, s, n);
    free(ids);
    free(back);
    return ok;
}

/* A small deterministic English-ish corpus for training. */
static char *corpus(size_t *len) {
    const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "don't", "we'll", "It's",
                           "42", "3.14", "hello", "world", "!!", "...", "\n", "  ", "\t", "naïve", "café", "日本語"};
    loom_rng_t r;
    loom_rng_seed(&r, 7);
    size_t cap = 200000, n = 0;
    char *s = malloc(cap + 64);
    while (n < cap) {
        const char *w = words[loom_rng_u64(&r) % (sizeof words / sizeof words[0])];
        n += (size_t)sprintf(s + n, "%s%s", (loom_rng_u64(&r) % 4) ? " " : "", w);
    }
    *len = n;
    return s;
}

static loom_tokenizer_t *train_small(int vocab, int threads) {
    size_t len;
    char *text = corpus(&len);
    const char *sp[] = {"<|endoftext|>"};
    loom_bpe_counter_t *c;
    loom_bpe_counter_new(&c, sp, 1);
    loom_bpe_count_add(c, text, len, threads);
    loom_bpe_train_opts o = {.vocab_size = vocab};
    loom_tokenizer_t *t = NULL;
    loom_status s = loom_bpe_train(&t, c, &o);
    CHECK(s == LOOM_OK, "train: %s", loom_errmsg());
    loom_bpe_counter_free(c);
    free(text);
    return t;
}

static void byte_level_layout(void) {
    loom_tokenizer_t *t;
    CHECK(loom_tokenizer_bytes(&t) == LOOM_OK, "bytes");
    CHECK(loom_tokenizer_vocab_size(t) == 257 && loom_tokenizer_eot(t) == 256, "vocab %d eot %d", loom_tokenizer_vocab_size(t), loom_tokenizer_eot(t));
    int v = 257;
    uint64_t h = loom_fnv1a(&v, sizeof v, loom_fnv1a("bytes", 5, LOOM_FNV_INIT));
    CHECK(loom_tokenizer_hash(t) == h, "the byte-level hash changed: runs recorded with it would be refused");
    uint32_t *ids;
    size_t n;
    const char *s = "Hi <|endoftext|>\xff";
    loom_tokenizer_encode(t, s, strlen(s), &ids, &n);
    uint32_t want[] = {'H', 'i', ' ', 256, 0xff};
    CHECK(n == 5 && !memcmp(ids, want, sizeof want), "byte ids: n=%zu", n);
    free(ids);
    /* saved and loaded, it is the same tokenizer */
    CHECK(loom_tokenizer_save(t, check_tmp_path("bytes.json")) == LOOM_OK, "save: %s", loom_errmsg());
    loom_tokenizer_t *u;
    CHECK(loom_tokenizer_load(&u, check_tmp_path("bytes.json")) == LOOM_OK, "load: %s", loom_errmsg());
    if (u) CHECK(loom_tokenizer_hash(u) == h && loom_tokenizer_merges(u) == 0, "reloaded byte-level differs");
    loom_tokenizer_free(u);
    uint32_t bad[] = {65, 257};
    char *text;
    size_t len;
    CHECK(loom_tokenizer_decode(t, bad, 2, &text, &len) == LOOM_EINVAL && strstr(loom_errmsg(), "position 1"),
          "decode beyond vocabulary: %s", loom_errmsg());
    loom_tokenizer_free(t);
}

/* Pieces of the GPT-2 regex, worked out by hand ("|" between pieces). */
static void pretokenize_cases(void) {
    const char *cases[][2] = {
        {"Hello world", "Hello| world"},
        {"don't we'll I'M", "don|'t| we|'ll| I|'|M"},
        {"it's 're 've 'm 'd 'll 'x", "it|'s| '|re| '|ve| '|m| '|d| '|ll| '|x"},
        {"abc123def", "abc|123|def"},
        {" 42 3.14", " 42| 3|.|14"},
        {"a  b", "a| | b"},
        {"a   b", "a|  | b"},
        {"a\n\nb", "a|\n|\n|b"},
        {"a \n b", "a| \n| b"},
        {"a\tb", "a|\t|b"},
        {"end   ", "end|   "},
        {"?!? ...hi", "?!?| ...|hi"},
        {"naïve café", "naïve| café"},
        {"日本語 テキスト", "日本語| テキスト"},
        {"x\xe2\x80\x83y", "x|\xe2\x80\x83|y"},    /* EM SPACE is \s */
        {"\xd9\xa3\xd9\xa4x", "\xd9\xa3\xd9\xa4|x"},  /* Arabic-Indic digits are \p{N} */
        {"\xe2\x85\xab!", "\xe2\x85\xab|!"},          /* Roman numeral twelve, Nl */
        {"a\xff\xfe b", "a|\xff\xfe| b"},             /* invalid UTF-8: "other" */
        {"x\xcc\x81y", "x|\xcc\x81|y"},               /* a combining mark is not a letter */
        {" ", " "},
        {"'", "'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const unsigned char *s = (const unsigned char *)cases[c][0];
        size_t len = strlen(cases[c][0]);
        char got[256] = {0};
        size_t k = 0;
        for (size_t i = 0; i < len;) {
            size_t j = loom_pretok_next(s, len, i);
            if (i) got[k++] = '|';
            memcpy(got + k, s + i, j - i);
            k += j - i;
            i = j;
        }
        CHECK(!strcmp(got, cases[c][1]), "\"%s\": got \"%s\", want \"%s\"", cases[c][0], got, cases[c][1]);
    }
}

/* GPT-2's byte -> character map, written out independently of loom's. */
static void gpt2_char(int b, char out[3]) {
    int cp = b, n = 0;
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (!printable) {
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    memset(out, 0, 3);
    if (cp < 0x80) out[0] = (char)cp;
    else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 63));
    }
}

/* GPT-2's id order: printable bytes first, then the rest. */
static void write_gpt2_vocab(const char *path, const char *extra) {
    FILE *f = fopen(path, "w");
    fprintf(f, "{");
    int id = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            if (printable != (pass == 0)) continue;
            char c[3];
            gpt2_char(b, c);
            if (c[0] == '"' || c[0] == '\\') fprintf(f, "\"\\%s\": %d, ", c, id++);
            else fprintf(f, "\"%s\": %d, ", c, id++);
        }
    fprintf(f, "%s}", extra);
    fclose(f);
}

static void gpt2_pair_known_ids(void) {
    const char *vocab = check_tmp_path("vocab.json"), *merges = check_tmp_path("merges.txt");
    write_gpt2_vocab(vocab, "\"\xc4\xa0t\": 256, \"he\": 257, \"\xc4\xa0the\": 258, \"in\": 259, \"<|endoftext|>\": 260");
    write_file(merges, "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\ni n\n");
    loom_tokenizer_t *t = NULL;
    loom_status s = loom_tokenizer_load_gpt2(&t, vocab, merges);
    CHECK(s == LOOM_OK, "load: %s", loom_errmsg());
    if (!t) return;
    CHECK(loom_tokenizer_vocab_size(t) == 261 && loom_tokenizer_eot(t) == 260 && loom_tokenizer_merges(t) == 4, "vocab %d eot %d",
          loom_tokenizer_vocab_size(t), loom_tokenizer_eot(t));
    const char *text = " the in<|endoftext|>hein!";
    uint32_t *ids;
    size_t n;
    loom_tokenizer_encode(t, text, strlen(text), &ids, &n);
    /* " the" -> "Ġthe"; " in" -> "Ġ" (220 in GPT-2's order) + "in"; the
     * special; "hein" -> "he" "in"; "!" is id 0 */
    uint32_t want[] = {258, 220, 259, 260, 257, 259, 0};
    CHECK(n == 7 && !memcmp(ids, want, sizeof want), "ids: n=%zu [%u %u %u %u %u %u %u]", n, ids[0], n > 1 ? ids[1] : 0,
          n > 2 ? ids[2] : 0, n > 3 ? ids[3] : 0, n > 4 ? ids[4] : 0, n > 5 ? ids[5] : 0, n > 6 ? ids[6] : 0);
    CHECK(roundtrip(t, text, strlen(text)), "round trip");
    free(ids);
    loom_tokenizer_free(t);

    /* Bad merges files: the error names the file and the line. */
    struct {
        const char *merges, *expect;
    } bad[] = {
        {"#version: 0.2\n\xc4\xa0 t\nh e x\n", "merges.txt: line 3"},
        {"#version: 0.2\n\xc4\xa0 t\nhe\n", "merges.txt: line 3"},
        {"#version: 0.2\n\xc4\xa0 t\nq z\n", "merges.txt: line 3"},         /* "qz" is not in the vocabulary */
        {"#version: 0.2\nh e\n\xc4\xa0 t\nh e\n", "merges.txt: line 4"},    /* duplicate merge */
        {"#version: 0.2\nh e\n\xc4\xa0 t\nx \xe2\x82\xac\n", "merges.txt: line 4"}, /* unknown token */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(merges, bad[i].merges);
        t = NULL;
        s = loom_tokenizer_load_gpt2(&t, vocab, merges);
        CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), bad[i].expect), "case %zu: status %d, message \"%s\"", i, s, loom_errmsg());
        loom_tokenizer_free(t);
    }
    /* A vocabulary without every byte is not byte-level. */
    write_file(vocab, "{\"a\": 0, \"b\": 1}");
    write_file(merges, "a b\n");
    s = loom_tokenizer_load_gpt2(&t, vocab, merges);
    CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), "byte-level") && strstr(loom_errmsg(), "vocab.json"), "%s", loom_errmsg());
    write_gpt2_vocab(vocab, "\"ab\": 256");
    char *v;
    size_t vl;
    loom_file_read(vocab, &v, &vl);
    char *z = strstr(v, "\"z\": ");
    if (z) z[1] = 'Z'; /* "Z" twice now: no token for "z" */
    write_file(vocab, v);
    free(v);
    s = loom_tokenizer_load_gpt2(&t, vocab, merges);
    CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), "vocab.json"), "%s", loom_errmsg());
}

static void roundtrip_random(void) {
    loom_tokenizer_t *t = train_small(600, 1);
    if (!t) return;
    loom_rng_t r;
    loom_rng_seed(&r, 11);
    char *buf = malloc(1 << 16);
    for (int it = 0; it < 200; it++) { /* random bytes, so mostly invalid UTF-8 */
        size_t n = loom_rng_u64(&r) % 4096;
        for (size_t i = 0; i < n; i++) buf[i] = (char)loom_rng_u64(&r);
        CHECK(roundtrip(t, buf, n), "random bytes, case %d", it);
    }
    for (int it = 0; it < 200; it++) { /* random code points, valid UTF-8 */
        size_t n = 0, chars = loom_rng_u64(&r) % 1000;
        for (size_t k = 0; k < chars; k++) {
            unsigned cp = (unsigned)(loom_rng_u64(&r) % 4 == 0 ? loom_rng_u64(&r) % 128 : loom_rng_u64(&r) % 0x110000);
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
            if (cp < 0x80) buf[n++] = (char)cp;
            else if (cp < 0x800) { buf[n++] = (char)(0xC0 | cp >> 6); buf[n++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) { buf[n++] = (char)(0xE0 | cp >> 12); buf[n++] = (char)(0x80 | ((cp >> 6) & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
            else { buf[n++] = (char)(0xF0 | cp >> 18); buf[n++] = (char)(0x80 | ((cp >> 12) & 63)); buf[n++] = (char)(0x80 | ((cp >> 6) & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
        }
        CHECK(roundtrip(t, buf, n), "random unicode, case %d", it);
    }
    /* long runs take the heap path; a run of one byte and a long mixed word */
    memset(buf, 'a', 5000);
    CHECK(roundtrip(t, buf, 5000), "5000 x 'a'");
    memset(buf, 0, 70000 > (1 << 16) ? (1 << 16) : 70000);
    CHECK(roundtrip(t, buf, 1 << 16), "64 KiB of zeros");
    free(buf);
    loom_tokenizer_free(t);
}

/* Cutting text where loom_pretok_safe_cut says changes no id. */
static void pieces_match_whole(void) {
    loom_tokenizer_t *t = train_small(800, 1);
    if (!t) return;
    size_t len;
    char *text = corpus(&len);
    uint32_t *whole;
    size_t n;
    loom_tokenizer_encode(t, text, len, &whole, &n);
    loom_encoder_t *e = loom_encoder_new(t);
    loom_ids_t ids = {0};
    size_t at = 0, pieces = 0;
    while (at < len) {
        size_t c = loom_pretok_safe_cut((const unsigned char *)text + at, len - at, 997);
        if (c == 0 || len - at <= 997) c = len - at;
        loom_encoder_encode(e, text + at, c, at == 0, &ids);
        at += c;
        pieces++;
    }
    CHECK(pieces > 100, "only %zu pieces", pieces);
    CHECK(ids.n == n && !memcmp(ids.v, whole, n * sizeof *whole), "pieces give %zu ids, whole text %zu", ids.n, n);
    loom_ids_free(&ids);
    loom_encoder_free(e);
    free(whole);
    free(text);
    loom_tokenizer_free(t);
}

static void training_invariants(void) {
    loom_tokenizer_t *a = train_small(700, 1), *b = train_small(700, 2);
    if (!a || !b) return;
    CHECK(loom_tokenizer_vocab_size(a) == 700 && loom_tokenizer_merges(a) == 700 - 257, "vocab %d merges %d",
          loom_tokenizer_vocab_size(a), loom_tokenizer_merges(a));
    CHECK(loom_tokenizer_hash(a) == loom_tokenizer_hash(b), "1 and 2 counting threads trained different tokenizers");
    CHECK(loom_tokenizer_eot(a) == 256, "eot %d", loom_tokenizer_eot(a));
    size_t n;
    const unsigned char *p = loom_tokenizer_token(a, 65, &n);
    CHECK(p && n == 1 && p[0] == 65, "byte 65 is not id 65");
    /* the most frequent pair in the corpus is merged first: " t" + "he"... */
    p = loom_tokenizer_token(a, 257, &n);
    CHECK(p && n == 2, "first merge has %zu bytes", n);
    /* save / load keeps ids and hash */
    CHECK(loom_tokenizer_save(a, check_tmp_path("t.json")) == LOOM_OK, "save: %s", loom_errmsg());
    loom_tokenizer_t *c = NULL;
    CHECK(loom_tokenizer_load(&c, check_tmp_path("t.json")) == LOOM_OK, "load: %s", loom_errmsg());
    if (c) CHECK(loom_tokenizer_hash(c) == loom_tokenizer_hash(a), "hash changed through tokenizer.json");
    loom_tokenizer_free(c);
    loom_tokenizer_free(a);
    loom_tokenizer_free(b);

    /* too small a vocabulary; nothing counted: bytes and specials only */
    loom_bpe_counter_t *k;
    const char *sp[] = {"<|endoftext|>", "<|pad|>"};
    loom_bpe_counter_new(&k, sp, 2);
    loom_bpe_train_opts o = {.vocab_size = 257};
    loom_tokenizer_t *t = NULL;
    CHECK(loom_bpe_train(&t, k, &o) == LOOM_EINVAL && strstr(loom_errmsg(), "smaller"), "%s", loom_errmsg());
    o.vocab_size = 1000;
    CHECK(loom_bpe_train(&t, k, &o) == LOOM_OK && loom_tokenizer_vocab_size(t) == 258, "empty corpus: %s", loom_errmsg());
    loom_tokenizer_free(t);
    loom_bpe_counter_free(k);
    const char *dup[] = {"<a>", "<a>"};
    CHECK(loom_bpe_counter_new(&k, dup, 2) == LOOM_EINVAL, "duplicate special accepted");
}

static void bad_tokenizer_json(void) {
    struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0,, }}}", "bad.json:2:"},
        {"[1, 2]", "not a BPE tokenizer.json"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}, \"merges\": []}}", "not a BPE"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}}", "merge 0"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "not a non-negative integer"},
        {"{\"normalizer\": {\"type\": \"NFKC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "normalizer NFKC"},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "pre_tokenizer Whitespace"},
        /* each component loom does not implement is refused by name */
        {"{\"normalizer\": {\"type\": \"NFKD\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "normalizer NFKD"},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, "
         "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "Split with pattern \\w+"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "decoder WordPiece"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": \"RobertaProcessing\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "post_processor RobertaProcessing"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": 0, \"content\": \"<x>\", \"lstrip\": true}], \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "sets lstrip"},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}, \"decoder\": {\"type\": \"Fuse\"}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "turns \"\u2581\" into spaces"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\"}, \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\"}, "
         "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}", "no ByteFallback"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}", "ByteLevel pre-tokenizer with SentencePiece"},
    };
    const char *path = check_tmp_path("bad.json");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, cases[i].json);
        loom_tokenizer_t *t = NULL;
        loom_status s = loom_tokenizer_load(&t, path);
        CHECK(s != LOOM_OK && strstr(loom_errmsg(), cases[i].expect) && strstr(loom_errmsg(), "bad.json"), "case %zu: \"%s\"", i, loom_errmsg());
        loom_tokenizer_free(t);
    }
    /* A trained tokenizer with one merge removed: its merged token's merge
     * is missing from later merges' view, and duplicates are caught. */
    loom_tokenizer_t *t = train_small(400, 1);
    if (!t) return;
    loom_tokenizer_save(t, path);
    loom_tokenizer_free(t);
    char *text;
    size_t len;
    loom_file_read(path, &text, &len);
    char *m = strstr(text, "\"merges\"");
    m = m ? strchr(m, '[') : NULL;
    CHECK(m != NULL, "no merges array in saved file");
    if (m) {
        char *first = strchr(m, '"'), *end = first ? strchr(first + 1, '"') : NULL;
        if (first && end) { /* duplicate the first merge at the front */
            size_t n = (size_t)(end - first + 1);
            char *out = malloc(len + n + 8);
            size_t pre = (size_t)(first - text);
            memcpy(out, text, pre);
            memcpy(out + pre, first, n);
            memcpy(out + pre + n, ", ", 2);
            memcpy(out + pre + n + 2, first, len - pre);
            out[len + n + 2] = 0;
            write_file(path, out);
            free(out);
            loom_status s = loom_tokenizer_load(&t, path);
            CHECK(s == LOOM_EFORMAT && strstr(loom_errmsg(), "appears twice") && strstr(loom_errmsg(), "merge 1"), "%s", loom_errmsg());
        }
    }
    free(text);
}

static void shard_formats(void) {
    uint32_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint32_t)(i * 37 % 1000);
    const char *p16 = check_tmp_path("s16.bin"), *p32 = check_tmp_path("s32.bin");
    CHECK(loom_shard_write(p16, tok, 1000, 1000) == LOOM_OK, "%s", loom_errmsg());
    loom_shard_t s;
    CHECK(loom_shard_open(&s, p16) == LOOM_OK, "%s", loom_errmsg());
    CHECK(s.ntokens == 1000 && s.token_bytes == 2 && s.vocab_size == 1000, "header: %zu %d %d", s.ntokens, s.token_bytes, s.vocab_size);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= loom_shard_get(&s, (size_t)i) == tok[i];
    CHECK(same, "uint16 tokens differ");
    const int32_t *h = s.map;
    CHECK(h[0] == LOOM_SHARD_MAGIC && h[1] == LOOM_SHARD_VERSION && h[2] == 1024 && h[3] == 1000 && h[4] == 1000 && h[5] == 0 && h[6] == 2, "header fields");
    CHECK(loom_shard_validate(&s, p16, 0) == LOOM_OK, "%s", loom_errmsg());
    loom_shard_close(&s);

    for (int i = 0; i < 1000; i++) tok[i] = 70000u + (uint32_t)i;
    CHECK(loom_shard_write(p32, tok, 1000, 100000) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_shard_open(&s, p32) == LOOM_OK && s.token_bytes == 4 && loom_shard_get(&s, 999) == 70999, "uint32 shard");
    loom_shard_close(&s);

    /* the streaming writer, across its buffer, gives the same file as one write */
    loom_shard_writer_t *w;
    CHECK(loom_shard_writer_open(&w, check_tmp_path("big.bin"), 50257) == LOOM_OK, "%s", loom_errmsg());
    uint32_t *big = malloc(3000000 * sizeof *big);
    for (int i = 0; i < 3000000; i++) big[i] = (uint32_t)i % 50257;
    for (int i = 0; i < 3; i++) loom_shard_writer_append(w, big + i * 1000000, 1000000);
    CHECK(!loom_path_exists(check_tmp_path("big.bin")), "the shard is under its final name before close");
    CHECK(loom_shard_writer_close(w) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_shard_open(&s, check_tmp_path("big.bin")) == LOOM_OK && s.ntokens == 3000000 && loom_shard_get(&s, 2999999) == 2999999u % 50257,
          "streamed shard");
    loom_shard_close(&s);
    free(big);

    /* llm.c's format: magic 20240520, version 1, count in header[2], uint16 */
    unsigned char buf[1024 + 20] = {0};
    int32_t lh[3] = {LLMC_SHARD_MAGIC, 1, 10};
    memcpy(buf, lh, sizeof lh);
    for (int i = 0; i < 10; i++) {
        uint16_t v = (uint16_t)(50256 - i);
        memcpy(buf + 1024 + 2 * i, &v, 2);
    }
    loom_file_write_atomic(check_tmp_path("llmc.bin"), buf, sizeof buf);
    CHECK(loom_shard_open(&s, check_tmp_path("llmc.bin")) == LOOM_OK && s.ntokens == 10 && s.vocab_size == 0 && loom_shard_get(&s, 3) == 50253,
          "llm.c shard: %s", loom_errmsg());
    CHECK(loom_shard_validate(&s, "llmc.bin", 50000) == LOOM_EFORMAT && strstr(loom_errmsg(), "position 0"), "validate: %s", loom_errmsg());
    loom_shard_close(&s);

    /* truncated, wrong magic, wrong version */
    char *data;
    size_t len;
    loom_file_read(p16, &data, &len);
    loom_file_write_atomic(check_tmp_path("trunc.bin"), data, len - 3);
    CHECK(loom_shard_open(&s, check_tmp_path("trunc.bin")) == LOOM_EFORMAT && strstr(loom_errmsg(), "truncated") && strstr(loom_errmsg(), "trunc.bin"),
          "%s", loom_errmsg());
    int32_t v = 12345;
    memcpy(data, &v, 4);
    loom_file_write_atomic(check_tmp_path("magic.bin"), data, len);
    CHECK(loom_shard_open(&s, check_tmp_path("magic.bin")) == LOOM_EFORMAT && strstr(loom_errmsg(), "magic 12345"), "%s", loom_errmsg());
    v = LOOM_SHARD_MAGIC;
    memcpy(data, &v, 4);
    v = 9;
    memcpy(data + 4, &v, 4);
    loom_file_write_atomic(check_tmp_path("version.bin"), data, len);
    CHECK(loom_shard_open(&s, check_tmp_path("version.bin")) == LOOM_EFORMAT && strstr(loom_errmsg(), "version 9"), "%s", loom_errmsg());
    v = 1;
    memcpy(data + 4, &v, 4);
    uint16_t big_tok = 5000;
    memcpy(data + 1024 + 2 * 7, &big_tok, 2);
    loom_file_write_atomic(check_tmp_path("range.bin"), data, len);
    CHECK(loom_shard_open(&s, check_tmp_path("range.bin")) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_shard_validate(&s, "range.bin", 0) == LOOM_EFORMAT && strstr(loom_errmsg(), "token 5000 at position 7"), "%s", loom_errmsg());
    loom_shard_close(&s);
    free(data);

    /* a token beyond the vocabulary: error with its position, nothing on disk */
    tok[5] = 1000;
    for (int i = 0; i < 5; i++) tok[i] = 1;
    const char *bad = check_tmp_path("bad.bin");
    CHECK(loom_shard_write(bad, tok, 10, 1000) == LOOM_EINVAL && strstr(loom_errmsg(), "position 5"), "%s", loom_errmsg());
    CHECK(!loom_path_exists(bad) && !loom_path_exists(check_tmp_path("bad.bin.tmp")), "a failed shard left a file behind");
    CHECK(loom_shard_writer_open(&w, bad, 1000) == LOOM_OK, "open");
    loom_shard_writer_append(w, tok, 3);
    loom_shard_writer_abort(w);
    CHECK(!loom_path_exists(bad) && !loom_path_exists(check_tmp_path("bad.bin.tmp")), "an aborted shard left a file behind");
}

int main(void) {
    check_tmpdir("tokenizer");
    loom_log_quiet(1);
    RUN(byte_level_layout);
    RUN(pretokenize_cases);
    RUN(gpt2_pair_known_ids);
    RUN(roundtrip_random);
    RUN(pieces_match_whole);
    RUN(training_invariants);
    RUN(bad_tokenizer_json);
    RUN(shard_formats);
    return check_main_end();
}
