/* The structured-output matcher (serve/json_schema.h) on its own: known
 * documents accepted and refused byte by byte, random walks through what
 * it allows (every walk ends in a document cJSON parses and that meets
 * its schema, checked here by hand), and the constructs it refuses named. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "serve/http_api.h"
#include "serve/json_schema.h"

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\",7,null]},\"minItems\":1,\"maxItems\":3},"
    "\"nick\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":4},{\"type\":\"null\"}]},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"home\":{\"$ref\":\"#/$defs/place\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"home\"],\"additionalProperties\":false,"
    "\"$defs\":{\"place\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":5},"
    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/place\"},{\"type\":\"null\"}]}},\"required\":[\"city\",\"next\"]}}}";

static int accepts(const loom_json_schema_t *s, const char *doc) {
    loom_json_match_t m;
    loom_json_match_init(&m, s);
    return loom_json_match_bytes(&m, (const unsigned char *)doc, strlen(doc)) && loom_json_match_done(&m);
}

static void test_known_documents(void) {
    loom_json_schema_t *s = NULL;
    CHECK(loom_json_schema_compile(PERSON, &s) == LOOM_OK, "%s", loom_errmsg());
    if (!s) return;
    const char *good[] = {
        "{\"name\":\"x\",\"age\":-12,\"tags\":[\"a\",7],\"home\":{\"city\":\"rome\",\"next\":null}}",
        "{\"name\":\"\\u00e9\\n\",\"age\":0,\"score\":1.5e-3,\"tags\":[null],\"nick\":null,\"ok\":true,"
        "\"home\":{\"city\":\"\",\"next\":{\"city\":\"b\",\"next\":null}}}",
        "{\"name\":\"caf\xc3\xa9\",\"age\":3,\"tags\":[\"bc\",\"bc\",\"a\"],\"nick\":\"abcd\",\"home\":{\"city\":\"a\",\"next\":null}}",
    };
    const char *bad[] = {
        "{\"age\":1,\"name\":\"x\",\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}", /* order */
        "{\"name\":\"\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",  /* minLength */
        "{\"name\":\"123456789\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",
        "{\"name\":\"x\",\"age\":1.5,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}", /* integer */
        "{\"name\":\"x\",\"age\":01,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[],\"home\":{\"city\":\"a\",\"next\":null}}",       /* minItems */
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"a\",\"a\",\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"b\"],\"home\":{\"city\":\"a\",\"next\":null}}",     /* enum */
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\"]}",                                            /* required */
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null},\"zz\":1}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}} ",     /* after the end */
        "{\"name\":\"a\x01\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",  /* control byte */
        "{\"name\":\"\xff\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}",   /* not UTF-8 */
        "{\"name\":\"\xe0\x80\x80\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}", /* overlong */
        "{\"name\":\"\xed\xa0\x80\",\"age\":1,\"tags\":[\"a\"],\"home\":{\"city\":\"a\",\"next\":null}}", /* surrogate */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK(accepts(s, good[i]), "refused %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!accepts(s, bad[i]), "accepted %s", bad[i]);
    loom_json_schema_free(s);
    CHECK(loom_json_schema_compile(NULL, &s) == LOOM_OK, "%s", loom_errmsg());
    CHECK(accepts(s, "{\"a\":[1,{\"b\":null},\"x\",true,-0.5E+2],\"c\":{}}"), "json_object refused a document");
    CHECK(!accepts(s, "[1]") && !accepts(s, "{\"a\":tru}") && !accepts(s, "{\"a\":1,}"), "json_object accepted a bad one");
    loom_json_schema_free(s);
}

/* A walk choosing among the bytes the matcher allows; structural bytes
 * are favoured so that walks end. Returns the document (malloc'd) or NULL. */
static char *walk(const loom_json_schema_t *s, unsigned *rng) {
    loom_json_match_t m;
    loom_json_match_init(&m, s);
    char *out = malloc(4096);
    int n = 0;
    while (!loom_json_match_done(&m) && n < 4000) {
        unsigned char ok[256];
        int k = 0, structural = 0;
        for (int b = 1; b < 256; b++) {
            loom_json_match_t t = m;
            if (!loom_json_match_byte(&t, (unsigned char)b)) continue;
            ok[k++] = (unsigned char)b;
            structural += strchr("\"]},:", b) != NULL;
        }
        CHECK(k > 0, "a dead end: no byte may follow %.*s", n, out);
        if (k == 0) break;
        *rng = *rng * 1103515245u + 12345u;
        unsigned char c = ok[(*rng >> 8) % (unsigned)k];
        if (structural && (*rng >> 4) % 3 == 0)
            for (int i = 0; i < k; i++)
                if (strchr("\"]},", ok[i])) c = ok[i];
        CHECK(loom_json_match_byte(&m, c), "an allowed byte %d was refused", c);
        out[n++] = (char)c;
    }
    out[n] = 0;
    if (!loom_json_match_done(&m)) {
        free(out);
        return NULL;
    }
    return out;
}

/* The PERSON schema checked by hand on a parsed document. */
static int person_ok(const cJSON *d) {
    const cJSON *name = cJSON_GetObjectItem(d, "name"), *age = cJSON_GetObjectItem(d, "age"), *tags = cJSON_GetObjectItem(d, "tags");
    const cJSON *home = cJSON_GetObjectItem(d, "home");
    if (!cJSON_IsString(name) || !cJSON_IsNumber(age) || age->valuedouble != (double)(long long)age->valuedouble) return 0;
    if (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) < 1 || cJSON_GetArraySize(tags) > 3 || !cJSON_IsObject(home)) return 0;
    for (const cJSON *t = tags->child; t; t = t->next)
        if (!(cJSON_IsNull(t) || (cJSON_IsNumber(t) && t->valuedouble == 7) ||
              (cJSON_IsString(t) && (!strcmp(t->valuestring, "a") || !strcmp(t->valuestring, "bc")))))
            return 0;
    for (const cJSON *p = home; p && !cJSON_IsNull(p); p = cJSON_GetObjectItem(p, "next"))
        if (!cJSON_IsObject(p) || !cJSON_IsString(cJSON_GetObjectItem(p, "city"))) return 0;
    return 1;
}

static void test_random_walks(void) {
    loom_json_schema_t *s = NULL, *any = NULL;
    CHECK(loom_json_schema_compile(PERSON, &s) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_json_schema_compile(NULL, &any) == LOOM_OK, "%s", loom_errmsg());
    if (!s || !any) return;
    unsigned rng = 7;
    int ended = 0, valid = 0;
    for (int i = 0; i < 300; i++) {
        const loom_json_schema_t *which = i % 2 ? s : any;
        char *doc = walk(which, &rng);
        if (!doc) continue;
        ended++;
        cJSON *d = cJSON_Parse(doc);
        int ok = d && cJSON_IsObject(d) && (which == any || person_ok(d)) && loom_api_utf8_valid(doc, strlen(doc));
        valid += ok;
        if (!ok) printf("  invalid output: %s\n", doc);
        cJSON_Delete(d);
        free(doc);
    }
    CHECK(valid == ended && ended >= 250, "%d of %d walks ended, %d valid", ended, 300, valid);
    loom_json_schema_free(s);
    loom_json_schema_free(any);
}

static void test_refusals(void) {
    const char *cases[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^x$\"}}}", "'pattern' is not supported by this server's constrained decoding (it would be ignored, so it is refused) at a"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\"}}}", "'format'"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}}}", "'minimum' is not supported by this server's constrained decoding (it would be ignored, so it is refused) at n"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}}}", "start alike"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"type\":[\"integer\",\"number\"]}}}", "start alike"},
        {"{\"type\":\"object\",\"properties\":{\"r\":{\"$ref\":\"#/$defs/none\"}}}", "$ref"},
        {"{\"type\":\"object\",\"properties\":{\"e\":{\"enum\":[1,12]}}}", "prefix"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "additionalProperties"},
        {"{\"type\":\"array\"}", "top level must be an object"},
        {"{\"type\":\"object\",\"allOf\":[]}", "'allOf'"},
        {"{\"type\":\"object\",\"required\":[\"q\"]}", "'q'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        loom_json_schema_t *s = NULL;
        loom_status st = loom_json_schema_compile(cases[i][0], &s);
        CHECK(st == LOOM_EINVAL && strstr(loom_errmsg(), cases[i][1]), "%s: status %d, '%s'", cases[i][0], st, loom_errmsg());
        loom_json_schema_free(s);
    }
}

/* A byte-level vocabulary (GPT-2's byte-to-unicode names) and some longer tokens, as files. */
static loom_tokenizer_t *small_tokenizer(void) {
    const char *longer[] = {"{\"", "\":", "ab", "a\"", "\"}", "\",\"", "12", "1.", "e+", "true", "nul", "abcdefghij", "]}", "[\"", "\\u00"};
    char vocab[96], merges[96];
    snprintf(vocab, sizeof vocab, "/tmp/loom_test_json_schema_%d_vocab.json", (int)getpid());
    snprintf(merges, sizeof merges, "/tmp/loom_test_json_schema_%d_merges.txt", (int)getpid());
    FILE *f = fopen(vocab, "w");
    if (!f) return NULL;
    fputc('{', f);
    int id = 0;
    for (int b = 0; b < 256; b++) { /* GPT-2's map: printable bytes name themselves, the rest 256 + k */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        static int k = 0;
        int cp = printable ? b : 256 + k++;
        cJSON *str = NULL;
        char u[8] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
        str = cJSON_CreateString(u);
        char *t = cJSON_PrintUnformatted(str);
        fprintf(f, "%s%s:%d", id ? "," : "", t, id);
        id++;
        free(t), cJSON_Delete(str);
    }
    for (size_t i = 0; i < sizeof longer / sizeof *longer; i++) {
        cJSON *str = cJSON_CreateString(longer[i]);
        char *t = cJSON_PrintUnformatted(str);
        fprintf(f, ",%s:%d", t, id++);
        free(t), cJSON_Delete(str);
    }
    fputc('}', f);
    fclose(f);
    f = fopen(merges, "w");
    if (!f) return NULL;
    fputs("#version: 0.2\n", f);
    fclose(f);
    loom_tokenizer_t *tok = NULL;
    loom_status st = loom_tokenizer_load_gpt2(&tok, vocab, merges);
    remove(vocab), remove(merges);
    CHECK(st == LOOM_OK, "%s", loom_errmsg());
    return st == LOOM_OK ? tok : NULL;
}

/* The filter's mask (first-byte groups, the plain-string shortcut) equals
 * feeding each token's bytes to a copy of the matcher, along walks. */
static void test_filter_mask(void) {
    loom_tokenizer_t *tok = small_tokenizer();
    loom_json_schema_t *s = NULL;
    CHECK(loom_json_schema_compile(PERSON, &s) == LOOM_OK, "%s", loom_errmsg());
    if (!tok || !s) return;
    int V = 256 + 15 + 4; /* padded past the vocabulary: those ids are never allowed */
    loom_token_filter_t *f = NULL;
    CHECK(loom_json_filter_new(s, tok, V, &f) == LOOM_OK, "%s", loom_errmsg());
    float *row = malloc((size_t)V * sizeof *row);
    unsigned rng = 11;
    int differ = 0, steps = 0;
    for (int w = 0; w < 20; w++) {
        void *st = f->begin(f);
        loom_json_match_t m;
        loom_json_match_init(&m, s);
        for (int n = 0; n < 300 && !loom_json_match_done(&m); n++, steps++) {
            for (int t = 0; t < V; t++) row[t] = 0;
            int left = f->mask(st, row, V), count = 0, ok[300], k = 0;
            for (int t = 0; t < V; t++) {
                size_t len = 0;
                const unsigned char *b = t < 256 + 15 ? loom_tokenizer_token(tok, (uint32_t)t, &len) : NULL;
                loom_json_match_t c = m;
                int want = b && len && loom_json_match_bytes(&c, b, len);
                differ += want != (row[t] > -INFINITY) || want != f->allowed(st, t);
                count += want;
                if (want) ok[k++] = t;
            }
            differ += count != left;
            if (k == 0) break;
            rng = rng * 1103515245u + 12345u;
            int t = ok[(rng >> 8) % (unsigned)k];
            size_t len = 0;
            const unsigned char *b = loom_tokenizer_token(tok, (uint32_t)t, &len);
            loom_json_match_bytes(&m, b, len);
            CHECK(f->accept(st, t) == loom_json_match_done(&m), "accept and the matcher disagree on the end");
        }
        f->end(st);
    }
    CHECK(differ == 0 && steps > 100, "%d disagreements in %d steps", differ, steps);
    free(row);
    loom_json_filter_free(f);
    loom_json_schema_free(s);
    loom_tokenizer_free(tok);
}

int main(void) {
    RUN(test_known_documents);
    RUN(test_filter_mask);
    RUN(test_random_walks);
    RUN(test_refusals);
    return check_main_end();
}
