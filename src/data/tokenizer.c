#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* The byte-level tokenizer. BPE (merges) extends this struct. */
struct loom_tokenizer {
    int vocab_size;
    int eot;
};

loom_status loom_tokenizer_bytes(loom_tokenizer_t **out) {
    loom_tokenizer_t *t = loom_calloc(1, sizeof *t);
    t->vocab_size = 257;
    t->eot = 256;
    *out = t;
    return LOOM_OK;
}

void loom_tokenizer_free(loom_tokenizer_t *t) { free(t); }
int loom_tokenizer_vocab_size(const loom_tokenizer_t *t) { return t->vocab_size; }
int loom_tokenizer_eot(const loom_tokenizer_t *t) { return t->eot; }

uint64_t loom_tokenizer_hash(const loom_tokenizer_t *t) {
    uint64_t h = loom_fnv1a("bytes", 5, LOOM_FNV_INIT);
    return loom_fnv1a(&t->vocab_size, sizeof t->vocab_size, h);
}

loom_status loom_tokenizer_encode(const loom_tokenizer_t *t, const char *text, size_t len,
                                  uint32_t **ids, size_t *n) {
    uint32_t *out = loom_malloc((len ? len : 1) * sizeof *out);
    for (size_t i = 0; i < len; i++) out[i] = (unsigned char)text[i];
    *ids = out;
    *n = len;
    return LOOM_OK;
}

loom_status loom_tokenizer_decode(const loom_tokenizer_t *t, const uint32_t *ids, size_t n,
                                  char **text, size_t *len) {
    char *out = loom_malloc(n * 13 + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 256) out[k++] = (char)ids[i];
        else if ((int)ids[i] == t->eot) {
            memcpy(out + k, "<|endoftext|>", 13);
            k += 13;
        } else {
            free(out);
            return loom_error(LOOM_EINVAL, "token %u at position %zu is beyond the vocabulary (%d)", ids[i], i, t->vocab_size);
        }
    }
    out[k] = 0;
    *text = out;
    *len = k;
    return LOOM_OK;
}

/* GPT-2's reversible map from bytes to printable unicode code points. */
static void byte_to_unicode(int cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : 256 + n++;
    }
}

static int utf8_put(char *s, int cp) {
    if (cp < 0x80) { s[0] = (char)cp; return 1; }
    if (cp < 0x800) { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 63)); return 2; }
    s[0] = (char)(0xE0 | (cp >> 12)); s[1] = (char)(0x80 | ((cp >> 6) & 63)); s[2] = (char)(0x80 | (cp & 63));
    return 3;
}

loom_status loom_tokenizer_save(const loom_tokenizer_t *t, const char *path) {
    int cp[256];
    byte_to_unicode(cp);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *eot = cJSON_CreateObject();
    cJSON_AddNumberToObject(eot, "id", t->eot);
    cJSON_AddStringToObject(eot, "content", "<|endoftext|>");
    cJSON_AddBoolToObject(eot, "single_word", 0);
    cJSON_AddBoolToObject(eot, "lstrip", 0);
    cJSON_AddBoolToObject(eot, "rstrip", 0);
    cJSON_AddBoolToObject(eot, "normalized", 0);
    cJSON_AddBoolToObject(eot, "special", 1);
    cJSON_AddItemToArray(added, eot);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON_AddBoolToObject(pre, "trim_offsets", 1);
    cJSON_AddBoolToObject(pre, "use_regex", 0);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char s[4] = {0};
        utf8_put(s, cp[b]);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddNumberToObject(vocab, "<|endoftext|>", t->eot);
    cJSON_AddArrayToObject(model, "merges");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

loom_status loom_tokenizer_load(loom_tokenizer_t **out, const char *path) {
    char *text;
    size_t len;
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return loom_error(LOOM_EFORMAT, "%s: not valid JSON", path);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    cJSON *vocab = model ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
    cJSON *merges = model ? cJSON_GetObjectItemCaseSensitive(model, "merges") : NULL;
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        cJSON_Delete(root);
        return loom_error(LOOM_EFORMAT, "%s: not a BPE tokenizer.json (no model.vocab / model.merges)", path);
    }
    int nvocab = cJSON_GetArraySize(vocab), nmerges = cJSON_GetArraySize(merges);
    cJSON_Delete(root);
    if (nmerges != 0 || nvocab != 257)
        return loom_error(LOOM_EUNAVAIL, "%s: a BPE tokenizer with %d merges; this build reads byte-level tokenizers only", path, nmerges);
    return loom_tokenizer_bytes(out);
}
