#define _GNU_SOURCE
#include "data/pipeline.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe_pretok.h"
#include "data/shard.h"

/* Bytes of text read and processed at a time, and the most a chunk may grow
 * while looking for a place to cut it that changes no word. */
#define CHUNK (8u << 20)
#define CHUNK_MAX (64u << 20)

/* ---- inputs ---- */

typedef struct {
    char **path;
    size_t *size;
    int n, cap;
    size_t total;
} files_t;

static void files_add(files_t *f, const char *path, size_t size) {
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 16;
        f->path = realloc(f->path, (size_t)f->cap * sizeof *f->path);
        f->size = realloc(f->size, (size_t)f->cap * sizeof *f->size);
        if (!f->path || !f->size) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    f->path[f->n] = loom_strdup(path);
    f->size[f->n++] = size;
    f->total += size;
}

static void files_free(files_t *f) {
    for (int i = 0; i < f->n; i++) free(f->path[i]);
    free(f->path);
    free(f->size);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Add a file, or every regular file under a folder (sorted, hidden skipped). */
static loom_status add_input(files_t *f, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return loom_error(LOOM_EIO, "%s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        files_add(f, path, (size_t)st.st_size);
        return LOOM_OK;
    }
    if (!S_ISDIR(st.st_mode)) return loom_error(LOOM_EIO, "%s: not a file or folder", path);
    DIR *d = opendir(path);
    if (!d) return loom_error(LOOM_EIO, "%s: cannot list: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names) loom_panic(__FILE__, __LINE__, "out of memory");
        }
        names[n++] = loom_strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name); /* qsort(NULL, 0) is undefined */
    loom_status s = LOOM_OK;
    for (size_t i = 0; i < n; i++) {
        if (s == LOOM_OK) {
            char *p = loom_malloc(strlen(path) + strlen(names[i]) + 2);
            sprintf(p, "%s/%s", path, names[i]);
            s = add_input(f, p);
            free(p);
        }
        free(names[i]);
    }
    free(names);
    return s;
}

/* ---- reading: chunks that end where cutting changes no pre-token ---- */

typedef struct {
    FILE *f;
    const char *path;
    char *buf;
    size_t have, cap, cut;
    int eof, warned;
} reader_t;

static loom_status reader_open(reader_t *r, const char *path) {
    memset(r, 0, sizeof *r);
    r->path = path;
    size_t size;
    LOOM_TRY(loom_file_open_regular(path, &r->f, &size));
    r->cap = 2 * CHUNK;
    r->buf = loom_malloc(r->cap);
    return LOOM_OK;
}

static void reader_close(reader_t *r) {
    if (r->f) fclose(r->f);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* Read up to CHUNK more bytes after what the buffer holds. */
static loom_status reader_fill(reader_t *r) {
    if (r->have + CHUNK > r->cap) {
        r->cap = r->have + CHUNK;
        r->buf = realloc(r->buf, r->cap);
        if (!r->buf) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    size_t n = fread(r->buf + r->have, 1, CHUNK, r->f);
    if (ferror(r->f)) return loom_error(LOOM_EIO, "%s: read failed at byte %ld: %s", r->path, ftell(r->f), strerror(errno));
    if (n == 0) r->eof = 1;
    r->have += n;
    return LOOM_OK;
}

/* No clean cut in CHUNK_MAX bytes (binary data?): cut anyway, before the
 * last whole UTF-8 character. */
static size_t forced_cut(reader_t *r) {
    if (!r->warned) loom_warn("%s: no word boundary in %u MB; cutting there (byte-exact, ids may differ from one-shot encoding)", r->path, CHUNK_MAX >> 20);
    r->warned = 1;
    size_t c = r->have;
    while (c > 1 && ((unsigned char)r->buf[c - 1] & 0xC0) == 0x80) c--;
    return c > 1 ? c - 1 : r->have;
}

/* The next chunk: *text, *len (0 at the end of the file). */
static loom_status reader_next(reader_t *r, const char **text, size_t *len) {
    if (r->cut) { /* drop the previous chunk */
        memmove(r->buf, r->buf + r->cut, r->have - r->cut);
        r->have -= r->cut;
        r->cut = 0;
    }
    if (!r->eof && r->have < CHUNK) LOOM_TRY(reader_fill(r));
    for (;;) {
        if (r->eof || r->have == 0) {
            r->cut = r->have;
            break;
        }
        size_t c = loom_pretok_safe_cut((unsigned char *)r->buf, r->have, r->have - 1);
        if (c > 0 || r->have >= CHUNK_MAX) {
            r->cut = c > 0 ? c : forced_cut(r);
            break;
        }
        LOOM_TRY(reader_fill(r));
    }
    *text = r->buf;
    *len = r->cut;
    return LOOM_OK;
}

/* Call fn(ctx, text, len, file_start) for every chunk of every input file
 * in order; file_start = 1 for a file's first chunk. */
static loom_status each_chunk(const files_t *in, loom_status (*fn)(void *ctx, const char *text, size_t len, int file_start),
                              void *ctx) {
    loom_status s = LOOM_OK;
    for (int i = 0; i < in->n && s == LOOM_OK; i++) {
        reader_t r;
        LOOM_TRY(reader_open(&r, in->path[i]));
        for (int start = 1; s == LOOM_OK; start = 0) {
            const char *text;
            size_t len;
            if ((s = reader_next(&r, &text, &len)) != LOOM_OK || len == 0) break;
            s = fn(ctx, text, len, start);
        }
        reader_close(&r);
    }
    return s;
}

static void report(const loom_pipeline_opts_t *o, const char *stage, double done, double total, const char *unit,
                   const char *extra, int final) {
    if (o->progress) o->progress(o->progress_ctx, stage, done, total, unit, extra, final);
}

/* ---- training ---- */

typedef struct {
    const loom_pipeline_opts_t *o;
    loom_bpe_counter_t *c;
    size_t done, total;
    long long merges_done;
} count_t;

static loom_status count_chunk(void *ctx, const char *text, size_t len, int file_start) {
    count_t *k = ctx;
    loom_bpe_count_add(k->c, text, len, k->o->threads);
    k->done += len;
    char extra[64];
    snprintf(extra, sizeof extra, ", %zu words", loom_bpe_counter_words(k->c));
    report(k->o, "counting", k->done / 1e6, k->total / 1e6, "MB", extra, 0);
    return LOOM_OK;
}

/* The trainer's last call reports the end (it may stop short of the target). */
static void merge_progress(void *ctx, long long done, long long total) {
    count_t *k = ctx;
    k->merges_done = done;
    report(k->o, "merging", (double)done, (double)total, "merges", "", 0);
}

static loom_status train(loom_tokenizer_t **out, const files_t *in, const loom_pipeline_opts_t *o) {
    count_t k = {.o = o, .total = in->total};
    LOOM_TRY(loom_bpe_counter_new(&k.c, o->specials, o->nspecial));
    report(o, "counting", 0, in->total / 1e6, "MB", "", 0); /* starts the stage's clock */
    loom_status s = each_chunk(in, count_chunk, &k);
    if (s == LOOM_OK) {
        char extra[96];
        snprintf(extra, sizeof extra, ", %zu distinct words in %.0f MB", loom_bpe_counter_words(k.c), loom_bpe_counter_bytes(k.c) / 1e6);
        report(o, "counting", k.done / 1e6, in->total / 1e6, "MB", extra, 1);
        report(o, "merging", 0, (double)o->vocab, "merges", "", 0);
        loom_bpe_train_opts bo = {.vocab_size = o->vocab, .min_frequency = o->min_frequency, .progress = merge_progress, .progress_ctx = &k};
        s = loom_bpe_train(out, k.c, &bo);
        if (s == LOOM_OK) report(o, "merging", (double)k.merges_done, (double)k.merges_done, "merges", "", 1);
    }
    loom_bpe_counter_free(k.c);
    if (s == LOOM_OK && loom_tokenizer_vocab_size(*out) < o->vocab)
        loom_warn("the text has no more pairs to merge: vocabulary %d instead of %lld", loom_tokenizer_vocab_size(*out), o->vocab);
    return s;
}

/* ---- encoding into shards ---- */

typedef struct {
    const char *dir, *name; /* OUT, "train" or "val" */
    int vocab;
    uint64_t tok_hash; /* recorded in every shard's header */
    size_t shard_tokens;
    int index;
    loom_shard_writer_t *w;
    size_t tokens;
} split_t;

static loom_status split_append(split_t *sp, const uint32_t *ids, size_t n) {
    while (n > 0) {
        if (!sp->w) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s_%06d.bin", sp->dir, sp->name, sp->index);
            LOOM_TRY(loom_shard_writer_open(&sp->w, path, sp->vocab));
            loom_shard_writer_set_tokenizer(sp->w, sp->tok_hash);
        }
        size_t room = sp->shard_tokens - loom_shard_writer_count(sp->w), k = n < room ? n : room;
        loom_status s = loom_shard_writer_append(sp->w, ids, k);
        if (s != LOOM_OK) {
            sp->w = NULL;
            return s;
        }
        sp->tokens += k;
        ids += k;
        n -= k;
        if (loom_shard_writer_count(sp->w) >= sp->shard_tokens) {
            s = loom_shard_writer_close(sp->w);
            sp->w = NULL;
            sp->index++;
            LOOM_TRY(s);
        }
    }
    return LOOM_OK;
}

static loom_status split_close(split_t *sp) {
    if (!sp->w) return LOOM_OK;
    loom_shard_writer_t *w = sp->w;
    sp->w = NULL;
    sp->index++;
    return loom_shard_writer_close(w);
}

typedef struct {
    const loom_tokenizer_t *tok;
    int threads;
    loom_encoder_t **enc; /* one per thread */
    loom_ids_t *ids;      /* one per thread */
} encoders_t;

/* Encode text with the threads (pieces cut where no word changes) and hand
 * the ids to the split in order. */
static loom_status encode_into(encoders_t *E, const char *text, size_t len, int at_start, split_t *sp) {
    int T = E->threads;
    size_t cut[65];
    cut[0] = 0;
    for (int k = 1; k < T; k++) {
        size_t want = len / (size_t)T * (size_t)k, p = want > cut[k - 1] ? loom_pretok_safe_cut((const unsigned char *)text, len, want) : 0;
        cut[k] = p > cut[k - 1] ? p : cut[k - 1];
    }
    cut[T] = len;
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int k = 0; k < T; k++) {
        E->ids[k].n = 0;
        loom_encoder_encode(E->enc[k], text + cut[k], cut[k + 1] - cut[k], at_start && k == 0, &E->ids[k]);
    }
    for (int k = 0; k < T; k++) LOOM_TRY(split_append(sp, E->ids[k].v, E->ids[k].n));
    return LOOM_OK;
}

typedef struct {
    const loom_pipeline_opts_t *o;
    encoders_t E;
    split_t train, val;
    size_t done, total, val_bytes;
    int eot;
} encode_t;

/* One chunk: its share of the validation bytes into val, the rest into train. */
static loom_status encode_chunk(void *ctx, const char *text, size_t len, int file_start) {
    encode_t *e = ctx;
    int in_val = e->done < e->val_bytes;
    /* Each document starts with the end-of-text token, as in GPT-2's data. */
    if (file_start && e->eot >= 0) {
        uint32_t eot = (uint32_t)e->eot;
        LOOM_TRY(split_append(in_val ? &e->val : &e->train, &eot, 1));
    }
    size_t head = 0;
    if (in_val) { /* the first val_fraction of the bytes is the validation split */
        const unsigned char *u = (const unsigned char *)text;
        size_t want = e->val_bytes - e->done;
        head = want >= len ? len : loom_pretok_safe_cut(u, len, want);
        if (head == 0) head = loom_pretok_safe_cut_after(u, len, want);
        if (head == 0) head = len;
        LOOM_TRY(encode_into(&e->E, text, head, file_start, &e->val));
        file_start = 0;
    }
    if (head < len) LOOM_TRY(encode_into(&e->E, text + head, len - head, file_start, &e->train));
    e->done += len;
    char extra[64];
    snprintf(extra, sizeof extra, ", %.2fM tokens", (e->train.tokens + e->val.tokens) / 1e6);
    report(e->o, "encoding", e->done / 1e6, e->total / 1e6, "MB", extra, 0);
    return LOOM_OK;
}

static void encoders_init(encoders_t *E, const loom_tokenizer_t *tok, int threads) {
    *E = (encoders_t){.tok = tok, .threads = threads};
    E->enc = loom_calloc((size_t)threads, sizeof *E->enc);
    E->ids = loom_calloc((size_t)threads, sizeof *E->ids);
    for (int k = 0; k < threads; k++) E->enc[k] = loom_encoder_new(tok);
}

static void encoders_free(encoders_t *E) {
    for (int k = 0; k < E->threads; k++) {
        loom_encoder_free(E->enc[k]);
        loom_ids_free(&E->ids[k]);
    }
    free(E->enc);
    free(E->ids);
}

static loom_status encode_corpus(const loom_tokenizer_t *tok, const files_t *in, const loom_pipeline_opts_t *o, encode_t *e) {
    int V = loom_tokenizer_vocab_size(tok);
    /* each document starts with <|endoftext|>, or with the BOS of a tokenizer without it (Llama's) */
    int sep = loom_tokenizer_eot(tok) >= 0 ? loom_tokenizer_eot(tok) : loom_tokenizer_bos(tok);
    *e = (encode_t){.o = o, .total = in->total, .eot = sep,
                    .train = {.dir = o->out, .name = "train", .vocab = V, .tok_hash = loom_tokenizer_hash(tok), .shard_tokens = o->shard_tokens},
                    .val = {.dir = o->out, .name = "val", .vocab = V, .tok_hash = loom_tokenizer_hash(tok), .shard_tokens = o->shard_tokens}};
    encoders_init(&e->E, tok, o->threads);
    e->val_bytes = o->val_fraction > 0 ? (size_t)(o->val_fraction * (double)in->total) : 0;
    if (o->val_fraction > 0 && e->val_bytes == 0) e->val_bytes = 1;
    report(o, "encoding", 0, in->total / 1e6, "MB", "", 0);
    loom_status s = each_chunk(in, encode_chunk, e);
    if (s == LOOM_OK && e->train.tokens == 0)
        loom_warn("all %zu bytes went to the validation split: no train shard; use a larger input or a smaller --val-fraction", e->done);
    if (s == LOOM_OK) s = split_close(&e->train);
    if (s == LOOM_OK) s = split_close(&e->val);
    if (s != LOOM_OK) {
        if (e->train.w) loom_shard_writer_abort(e->train.w);
        if (e->val.w) loom_shard_writer_abort(e->val.w);
    } else {
        char extra[64];
        snprintf(extra, sizeof extra, ", %.2fM tokens", (e->train.tokens + e->val.tokens) / 1e6);
        report(o, "encoding", e->done / 1e6, in->total / 1e6, "MB", extra, 1);
    }
    encoders_free(&e->E);
    return s;
}

/* ---- the pipeline ---- */

/* Shards beyond the new ones, left by an earlier run into the same folder,
 * would be read as data by `loom train`: remove them. */
static void remove_stale(const char *out, const char *name, int from) {
    for (int i = from;; i++) {
        char stale[4200];
        snprintf(stale, sizeof stale, "%s/%s_%06d.bin", out, name, i);
        if (unlink(stale) != 0) break;
    }
}

static loom_status check_opts(const loom_pipeline_opts_t *o, const files_t *in) {
    if (o->ninputs == 0 || !o->out)
        return loom_error(LOOM_EINVAL, "needs --input and --out, e.g.\n  loom tokenize --input corpus.txt --vocab 8192 --out data/corpus");
    if (in->total == 0) return loom_error(LOOM_EINVAL, "no text in %s%s: the input is empty", o->inputs[0], o->ninputs > 1 ? " ..." : "");
    char run_cfg[4200], run_ck[4200];
    snprintf(run_cfg, sizeof run_cfg, "%s/config.json", o->out);
    snprintf(run_ck, sizeof run_ck, "%s/checkpoints", o->out);
    if (loom_path_exists(run_cfg) || loom_path_exists(run_ck))
        return loom_error(LOOM_EINVAL, "--out %s is a training run's folder (it has config.json or checkpoints/); tokenize into a data folder of its own",
                          o->out);
    if (!o->tokenizer && (o->vocab < 256 + o->nspecial || o->vocab > 2147483647LL))
        return loom_error(LOOM_EINVAL, "--vocab %lld: must be between %d (256 bytes + %d special) and 2147483647", o->vocab,
                          256 + o->nspecial, o->nspecial);
    return LOOM_OK;
}

static loom_status run(const loom_pipeline_opts_t *o, files_t *in, loom_tokenizer_t **trained, loom_pipeline_result_t *r) {
    for (int i = 0; i < o->ninputs; i++) LOOM_TRY(add_input(in, o->inputs[i]));
    LOOM_TRY(check_opts(o, in));
    LOOM_TRY(loom_mkdir_p(o->out));
    const loom_tokenizer_t *tok = o->tokenizer;
    if (!tok) {
        double t0 = loom_now();
        LOOM_TRY(train(trained, in, o));
        r->train_s = loom_now() - t0;
        tok = *trained;
    }
    double t0 = loom_now();
    encode_t e;
    LOOM_TRY(encode_corpus(tok, in, o, &e));
    remove_stale(o->out, "train", e.train.index);
    remove_stale(o->out, "val", e.val.index);
    /* Last, so a failed encode leaves no new tokenizer beside old shards. */
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->out);
    LOOM_TRY(loom_tokenizer_save(tok, path));
    r->encode_s = loom_now() - t0;
    r->bytes = e.done;
    r->vocab = loom_tokenizer_vocab_size(tok);
    r->merges = loom_tokenizer_merges(tok);
    r->nspecial = loom_tokenizer_nspecial(tok);
    r->train_tokens = e.train.tokens;
    r->val_tokens = e.val.tokens;
    r->train_shards = e.train.index;
    r->val_shards = e.val.index;
    return LOOM_OK;
}

loom_status loom_pipeline_run(const loom_pipeline_opts_t *o, loom_pipeline_result_t *r) {
    files_t in = {0};
    loom_tokenizer_t *trained = NULL;
    *r = (loom_pipeline_result_t){0};
    loom_status s = run(o, &in, &trained, r);
    loom_tokenizer_free(trained);
    files_free(&in);
    return s;
}
