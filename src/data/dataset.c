#include "dataset.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "data/shard.h"

typedef struct {
    uint32_t *mem;        /* in-memory tokens (text input), or NULL */
    loom_shard_t *shards; /* mmap'd shards otherwise */
    size_t *start;        /* first token index of each shard in the split */
    int nshards;
    size_t ntokens;
} split_t;

struct loom_dataset {
    split_t split[2];
    loom_tokenizer_t *tok;        /* owned */
    const loom_tokenizer_t *text; /* a text file's, when the caller's (not owned) */
    int vocab_size;
    char desc[512];
};

static uint32_t token_at(const split_t *s, size_t i) {
    if (s->mem) return s->mem[i];
    int lo = 0, hi = s->nshards - 1; /* last shard whose start <= i */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return loom_shard_get(&s->shards[lo], i - s->start[lo]);
}

void loom_dataset_batch(const loom_dataset_t *ds, int split, size_t pos, int B, int T,
                        int *inputs, int *targets) {
    const split_t *s = &ds->split[split];
    size_t n = (size_t)B * T;
    for (size_t i = 0; i < n; i++) {
        inputs[i] = (int)token_at(s, (pos + i) % s->ntokens);
        targets[i] = (int)token_at(s, (pos + i + 1) % s->ntokens);
    }
}

size_t loom_dataset_ntokens(const loom_dataset_t *ds, int split) { return ds->split[split].ntokens; }
const loom_tokenizer_t *loom_dataset_tokenizer(const loom_dataset_t *ds) { return ds->text ? ds->text : ds->tok; }
int loom_dataset_vocab_size(const loom_dataset_t *ds) { return ds->vocab_size; }
const char *loom_dataset_describe(const loom_dataset_t *ds) { return ds->desc; }

void loom_dataset_free(loom_dataset_t *ds) {
    if (!ds) return;
    for (int k = 0; k < 2; k++) {
        free(ds->split[k].mem);
        for (int i = 0; i < ds->split[k].nshards; i++) loom_shard_close(&ds->split[k].shards[i]);
        free(ds->split[k].shards);
        free(ds->split[k].start);
    }
    if (ds->tok) loom_tokenizer_free(ds->tok);
    free(ds);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Open every DIR/PREFIX*.bin in name order into `s`. */
static loom_status open_shards(split_t *s, const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return loom_error(LOOM_EIO, "%s: cannot open folder", dir);
    char **names = NULL;
    int n = 0;
    struct dirent *ent;
    size_t plen = strlen(prefix);
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (strncmp(ent->d_name, prefix, plen) != 0 || len < 4 || strcmp(ent->d_name + len - 4, ".bin") != 0) continue;
        names = realloc(names, (size_t)(n + 1) * sizeof *names);
        names[n++] = loom_strdup(ent->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    s->shards = loom_calloc((size_t)(n ? n : 1), sizeof *s->shards);
    s->start = loom_calloc((size_t)(n ? n : 1), sizeof *s->start);
    loom_status st = LOOM_OK;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (st == LOOM_OK && (st = loom_shard_open(&s->shards[s->nshards], path)) == LOOM_OK) {
            s->start[s->nshards] = s->ntokens;
            s->ntokens += s->shards[s->nshards].ntokens;
            s->nshards++;
        }
        free(names[i]);
    }
    free(names);
    return st;
}

/* Every shard that records its tokenizer's hash was made by `tok` (the
 * folder's tokenizer.json); shards of an older loom record none: a note. */
static loom_status check_shard_tokenizer(const loom_dataset_t *ds, const char *dir) {
    uint64_t want = loom_tokenizer_hash(ds->tok);
    int unrecorded = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < ds->split[k].nshards; i++) {
            uint64_t h = ds->split[k].shards[i].tokenizer_hash;
            unrecorded += h == 0;
            if (h && h != want)
                return loom_error(LOOM_EFORMAT, "%s: %s shard %d was made by another tokenizer (hash %016llx) than %s/tokenizer.json (%016llx); "
                                  "restore the tokenizer.json that made the shards, or re-run `loom tokenize` with this one",
                                  dir, k ? "val" : "train", i, (unsigned long long)h, dir, (unsigned long long)want);
        }
    if (unrecorded)
        loom_info("%s: %d shard(s) do not record their tokenizer (made by an older loom); tokenizer.json is trusted to be theirs", dir, unrecorded);
    return LOOM_OK;
}

static loom_status open_folder(loom_dataset_t *ds, const char *dir) {
    LOOM_TRY(open_shards(&ds->split[0], dir, "train"));
    LOOM_TRY(open_shards(&ds->split[1], dir, "val"));
    if (ds->split[0].nshards == 0)
        return loom_error(LOOM_EINVAL, "%s: no train_*.bin shards in this folder; make them with `loom tokenize --input FILE --out %s`, or pass a text file to --data", dir, dir);
    if (ds->split[1].nshards == 0)
        return loom_error(LOOM_EINVAL, "%s: no val_*.bin shards in this folder; `loom tokenize` writes both splits", dir);
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    int shard_vocab = ds->split[0].shards[0].vocab_size;
    if (loom_path_exists(tpath)) {
        LOOM_TRY(loom_tokenizer_load(&ds->tok, tpath));
        ds->vocab_size = loom_tokenizer_vocab_size(ds->tok);
        if (shard_vocab && shard_vocab != ds->vocab_size)
            return loom_error(LOOM_EFORMAT, "%s: shards were written for a vocabulary of %d but tokenizer.json has %d; re-run `loom tokenize`", dir, shard_vocab, ds->vocab_size);
        LOOM_TRY(check_shard_tokenizer(ds, dir));
    } else {
        /* llm.c's shards say nothing of their vocabulary: theirs is GPT-2's. */
        ds->vocab_size = shard_vocab ? shard_vocab : 50257;
        loom_warn("%s: no tokenizer.json; training on ids with vocabulary %d, text cannot be decoded", dir, ds->vocab_size);
    }
    snprintf(ds->desc, sizeof ds->desc, "%s: %zu train + %zu val tokens in %d+%d shards, vocabulary %d", dir,
             ds->split[0].ntokens, ds->split[1].ntokens, ds->split[0].nshards, ds->split[1].nshards, ds->vocab_size);
    return LOOM_OK;
}

static loom_status open_text(loom_dataset_t *ds, const char *path, double val_fraction, const loom_tokenizer_t *tok) {
    char *text;
    size_t len;
    LOOM_TRY(loom_file_read(path, &text, &len));
    if (len == 0) {
        free(text);
        return loom_error(LOOM_EINVAL, "%s: the file is empty; give a text file to train on", path);
    }
    if (tok) ds->text = tok;
    else LOOM_TRY(loom_tokenizer_bytes(&ds->tok));
    uint32_t *ids;
    size_t n;
    loom_status s = loom_tokenizer_encode(loom_dataset_tokenizer(ds), text, len, &ids, &n);
    free(text);
    LOOM_TRY(s);
    size_t nval = (size_t)((double)n * val_fraction);
    if (val_fraction > 0 && nval < 2) nval = n >= 4 ? 2 : 0;
    split_t *tr = &ds->split[0], *va = &ds->split[1];
    tr->ntokens = n - nval;
    tr->mem = ids;
    va->ntokens = nval;
    va->mem = loom_malloc((nval ? nval : 1) * sizeof(uint32_t));
    memcpy(va->mem, ids + tr->ntokens, nval * sizeof(uint32_t));
    ds->vocab_size = loom_tokenizer_vocab_size(loom_dataset_tokenizer(ds));
    snprintf(ds->desc, sizeof ds->desc, "%s: %zu train + %zu val tokens, %s", path, tr->ntokens, va->ntokens,
             tok ? "the model's tokenizer" : "byte-level");
    return LOOM_OK;
}

loom_status loom_dataset_open(loom_dataset_t **out, const char *path, double val_fraction) {
    return loom_dataset_open_tok(out, path, val_fraction, NULL);
}

loom_status loom_dataset_open_tok(loom_dataset_t **out, const char *path, double val_fraction, const loom_tokenizer_t *tok) {
    if (!path || !*path) return loom_error(LOOM_EINVAL, "no data: pass --data with a text file or a folder made by `loom tokenize`");
    if (!loom_path_exists(path)) return loom_error(LOOM_EINVAL, "%s: no such file or folder; pass --data with a text file or a folder made by `loom tokenize`", path);
    loom_dataset_t *ds = loom_calloc(1, sizeof *ds);
    loom_status s = loom_path_is_dir(path) ? open_folder(ds, path) : open_text(ds, path, val_fraction, tok);
    if (s != LOOM_OK) {
        loom_dataset_free(ds);
        return s;
    }
    *out = ds;
    return LOOM_OK;
}
