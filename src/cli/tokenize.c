/* loom tokenize: train a byte-level BPE tokenizer on text (or load one) and
 * write the text as train/val token shards, streaming the input so memory
 * stays bounded whatever the corpus size. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/core.h"
#include "data/bpe_pretok.h"
#include "data/shard.h"
#include "data/tokenizer.h"

/* Bytes of text read and processed at a time, and the most a chunk may grow
 * while looking for a place to cut it that changes no word. */
#define CHUNK (8u << 20)
#define CHUNK_MAX (64u << 20)

static int fail(loom_status s) {
    fprintf(stderr, "loom tokenize: %s\n", loom_errmsg());
    return loom_exit_code(s);
}

/* ---- progress ---- */

typedef struct {
    const char *what;
    double start, last;
    int tty, quiet;
    long long merges_done;
} progress_t;

static void progress_begin(progress_t *p, const char *what, int quiet) {
    p->what = what;
    p->start = p->last = loom_now();
    p->tty = isatty(2);
    p->quiet = quiet;
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) snprintf(buf, n, "?");
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

/* Report `done` of `total` units ("MB" of bytes or merges); `extra` is
 * appended. Throttled: 10 per second on a terminal, one per 10 s in a log. */
static void progress_show(progress_t *p, double done, double total, const char *unit, const char *extra, int final) {
    if (p->quiet) return;
    double now = loom_now();
    if (!final && now - p->last < (p->tty ? 0.1 : 10.0)) return;
    p->last = now;
    double el = now - p->start, rate = el > 0 ? done / el : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, rate > 0 ? (total - done) / rate : -1);
    double pct = total > 0 ? 100.0 * done / total : 100.0;
    int bar = (int)(pct / 5);
    char b[21];
    for (int i = 0; i < 20; i++) b[i] = i < bar ? '#' : '.';
    b[20] = 0;
    int prec = strcmp(unit, "MB") ? 0 : 1;
    fprintf(stderr, "%s%-9s [%s] %3.0f%% %.*f/%.*f %s, %.*f %s/s%s, ETA %s%s", p->tty ? "\r" : "", p->what, b, pct, prec, done,
            prec, total, unit, prec, rate, unit, extra ? extra : "", final ? "0:00" : eta, final || !p->tty ? "\n" : "");
    fflush(stderr);
}

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
    qsort(names, n, sizeof *names, by_name);
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

/* Streams a file in chunks that end where cutting changes no pre-token. */
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
    r->f = fopen(path, "rb");
    if (!r->f) return loom_error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    r->cap = 2 * CHUNK;
    r->buf = loom_malloc(r->cap);
    return LOOM_OK;
}

static void reader_close(reader_t *r) {
    if (r->f) fclose(r->f);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* The next chunk: *text, *len (0 at the end of the file). */
static loom_status reader_next(reader_t *r, const char **text, size_t *len) {
    if (r->cut) { /* drop the previous chunk */
        memmove(r->buf, r->buf + r->cut, r->have - r->cut);
        r->have -= r->cut;
        r->cut = 0;
    }
    for (;;) {
        if (!r->eof && r->have < CHUNK) {
            if (r->have + CHUNK > r->cap) {
                r->cap = r->have + CHUNK;
                r->buf = realloc(r->buf, r->cap);
                if (!r->buf) loom_panic(__FILE__, __LINE__, "out of memory");
            }
            size_t n = fread(r->buf + r->have, 1, CHUNK, r->f);
            if (ferror(r->f)) return loom_error(LOOM_EIO, "%s: read failed at byte %ld: %s", r->path, ftell(r->f), strerror(errno));
            if (n == 0) r->eof = 1;
            r->have += n;
        }
        if (r->eof || r->have == 0) {
            r->cut = r->have;
            break;
        }
        size_t c = loom_pretok_safe_cut((unsigned char *)r->buf, r->have, r->have - 1);
        if (c > 0) {
            r->cut = c;
            break;
        }
        if (r->have >= CHUNK_MAX) { /* no clean cut in 64 MB (binary data?): cut anyway */
            if (!r->warned) loom_warn("%s: no word boundary in %u MB; cutting there (byte-exact, ids may differ from one-shot encoding)", r->path, CHUNK_MAX >> 20);
            r->warned = 1;
            size_t c2 = r->have;
            while (c2 > 1 && ((unsigned char)r->buf[c2 - 1] & 0xC0) == 0x80) c2--;
            r->cut = c2 > 1 ? c2 - 1 : r->have;
            break;
        }
        if (r->have + CHUNK > r->cap) {
            r->cap = r->have + CHUNK;
            r->buf = realloc(r->buf, r->cap);
            if (!r->buf) loom_panic(__FILE__, __LINE__, "out of memory");
        }
        size_t n = fread(r->buf + r->have, 1, CHUNK, r->f);
        if (ferror(r->f)) return loom_error(LOOM_EIO, "%s: read failed: %s", r->path, strerror(errno));
        if (n == 0) r->eof = 1;
        r->have += n;
    }
    *text = r->buf;
    *len = r->cut;
    return LOOM_OK;
}

/* ---- training ---- */

/* The trainer's last call reports the end (it may stop short of the target). */
static void train_progress(void *ctx, long long done, long long total) {
    progress_t *p = ctx;
    p->merges_done = done;
    progress_show(p, (double)done, (double)total, "merges", "", 0);
}

static loom_status train(loom_tokenizer_t **out, const files_t *in, long long vocab, const char *const *specials, int nspecial,
                         int min_freq, int threads, int quiet, double *seconds) {
    double t0 = loom_now();
    loom_bpe_counter_t *c;
    LOOM_TRY(loom_bpe_counter_new(&c, specials, nspecial));
    progress_t p;
    progress_begin(&p, "counting", quiet);
    size_t done = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < in->n && s == LOOM_OK; i++) {
        reader_t r;
        if ((s = reader_open(&r, in->path[i])) != LOOM_OK) break;
        for (;;) {
            const char *text;
            size_t len;
            if ((s = reader_next(&r, &text, &len)) != LOOM_OK || len == 0) break;
            loom_bpe_count_add(c, text, len, threads);
            done += len;
            char extra[64];
            snprintf(extra, sizeof extra, ", %zu words", loom_bpe_counter_words(c));
            progress_show(&p, done / 1e6, in->total / 1e6, "MB", extra, 0);
        }
        reader_close(&r);
    }
    if (s == LOOM_OK) {
        char extra[96];
        snprintf(extra, sizeof extra, ", %zu distinct words in %.0f MB", loom_bpe_counter_words(c), loom_bpe_counter_bytes(c) / 1e6);
        progress_show(&p, done / 1e6, in->total / 1e6, "MB", extra, 1);
        progress_begin(&p, "merging", quiet);
        loom_bpe_train_opts o = {.vocab_size = vocab, .min_frequency = min_freq, .progress = train_progress, .progress_ctx = &p};
        s = loom_bpe_train(out, c, &o);
        if (s == LOOM_OK) progress_show(&p, (double)p.merges_done, (double)p.merges_done, "merges", "", 1);
    }
    loom_bpe_counter_free(c);
    *seconds = loom_now() - t0;
    if (s == LOOM_OK && loom_tokenizer_vocab_size(*out) < vocab)
        loom_warn("the text has no more pairs to merge: vocabulary %d instead of %lld", loom_tokenizer_vocab_size(*out), vocab);
    return s;
}

/* ---- encoding into shards ---- */

typedef struct {
    const char *dir, *name; /* OUT, "train" or "val" */
    int vocab;
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
    size_t bytes;
    double seconds;
} enc_stats_t;

static loom_status encode_corpus(const loom_tokenizer_t *tok, const files_t *in, const char *out, double val_fraction,
                                 size_t shard_tokens, int threads, int quiet, split_t *train, split_t *val, enc_stats_t *st) {
    double t0 = loom_now();
    int V = loom_tokenizer_vocab_size(tok), eot = loom_tokenizer_eot(tok);
    *train = (split_t){.dir = out, .name = "train", .vocab = V, .shard_tokens = shard_tokens};
    *val = (split_t){.dir = out, .name = "val", .vocab = V, .shard_tokens = shard_tokens};
    encoders_t E = {.tok = tok, .threads = threads};
    E.enc = loom_calloc((size_t)threads, sizeof *E.enc);
    E.ids = loom_calloc((size_t)threads, sizeof *E.ids);
    for (int k = 0; k < threads; k++) E.enc[k] = loom_encoder_new(tok);
    size_t val_bytes = val_fraction > 0 ? (size_t)(val_fraction * (double)in->total) : 0;
    if (val_fraction > 0 && val_bytes == 0) val_bytes = 1;
    progress_t p;
    progress_begin(&p, "encoding", quiet);
    size_t done = 0;
    loom_status s = LOOM_OK;
    for (int i = 0; i < in->n && s == LOOM_OK; i++) {
        reader_t r;
        if ((s = reader_open(&r, in->path[i])) != LOOM_OK) break;
        int at_start = 1;
        for (;;) {
            const char *text;
            size_t len;
            if ((s = reader_next(&r, &text, &len)) != LOOM_OK || len == 0) break;
            /* Each document starts with the end-of-text token, as in GPT-2's data. */
            if (at_start && eot >= 0) {
                uint32_t e = (uint32_t)eot;
                s = split_append(done < val_bytes ? val : train, &e, 1);
                if (s != LOOM_OK) break;
            }
            size_t head = 0;
            if (done < val_bytes) { /* the first val_fraction of the bytes is the validation split */
                const unsigned char *u = (const unsigned char *)text;
                head = val_bytes - done >= len ? len : loom_pretok_safe_cut(u, len, val_bytes - done);
                if (head == 0) head = loom_pretok_safe_cut_after(u, len, val_bytes - done);
                if (head == 0) head = len;
                if ((s = encode_into(&E, text, head, at_start, val)) != LOOM_OK) break;
                at_start = 0;
            }
            if (head < len && (s = encode_into(&E, text + head, len - head, at_start, train)) != LOOM_OK) break;
            at_start = 0;
            done += len;
            char extra[64];
            snprintf(extra, sizeof extra, ", %.2fM tokens", (train->tokens + val->tokens) / 1e6);
            progress_show(&p, done / 1e6, in->total / 1e6, "MB", extra, 0);
        }
        reader_close(&r);
    }
    if (s == LOOM_OK && train->tokens == 0)
        loom_warn("all %zu bytes went to the validation split: no train shard; use a larger input or a smaller --val-fraction", done);
    if (s == LOOM_OK) s = split_close(train);
    if (s == LOOM_OK) s = split_close(val);
    if (s != LOOM_OK) {
        if (train->w) loom_shard_writer_abort(train->w);
        if (val->w) loom_shard_writer_abort(val->w);
    } else {
        char extra[64];
        snprintf(extra, sizeof extra, ", %.2fM tokens", (train->tokens + val->tokens) / 1e6);
        progress_show(&p, done / 1e6, in->total / 1e6, "MB", extra, 1);
    }
    for (int k = 0; k < threads; k++) {
        loom_encoder_free(E.enc[k]);
        loom_ids_free(&E.ids[k]);
    }
    free(E.enc);
    free(E.ids);
    st->bytes = done;
    st->seconds = loom_now() - t0;
    return s;
}

/* ---- --encode / --decode ---- */

static int quick_encode(const loom_tokenizer_t *t, const char *text) {
    uint32_t *ids;
    size_t n;
    loom_status s = loom_tokenizer_encode(t, text, strlen(text), &ids, &n);
    if (s != LOOM_OK) return fail(s);
    for (size_t i = 0; i < n; i++) printf("%s%u", i ? " " : "", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int quick_decode(const loom_tokenizer_t *t, const char *list) {
    size_t cap = 64, n = 0;
    uint32_t *ids = loom_malloc(cap * sizeof *ids);
    const char *p = list;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v > UINT32_MAX || *p == '-') {
            fprintf(stderr, "loom tokenize: --decode: \"%.20s\" at character %zu is not a token id\n", p, (size_t)(p - list));
            free(ids);
            return 2;
        }
        if (n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[n++] = (uint32_t)v;
        p = end;
    }
    char *text;
    size_t len;
    loom_status s = loom_tokenizer_decode(t, ids, n, &text, &len);
    free(ids);
    if (s != LOOM_OK) return fail(s);
    fwrite(text, 1, len, stdout); /* byte-exact; a newline only for a person */
    if (isatty(1)) printf("\n");
    free(text);
    return 0;
}

/* ---- the command ---- */

int cmd_tokenize(int argc, char **argv) {
    loom_arg_list_t input = {0}, special = {0};
    long long vocab = 8192, shard_tokens = 100000000;
    double val_fraction = 0.01;
    int threads = 0, quiet = 0, min_freq = 0;
    const char *out = NULL, *tokenizer = NULL, *merges = NULL, *encode = NULL, *decode = NULL;
    const loom_arg_t args[] = {
        {"input", ARG_LIST, &input, "", 0, 0, "text files or folders (every file in them, sorted) to tokenize"},
        {"out", ARG_STR, &out, "", 0, 0, "data folder to write: train_*.bin, val_*.bin, tokenizer.json"},
        {"vocab", ARG_LONG, &vocab, "8192", 0, 0, "vocabulary size to train, bytes and specials included"},
        {"val-fraction", ARG_FLOAT, &val_fraction, "0.01", 0, 0.5, "first fraction of the text that becomes val shards"},
        {"special", ARG_LIST, &special, "<|endoftext|>", 0, 0, "special tokens, cut out of the text (none: no specials)"},
        {"threads", ARG_INT, &threads, "0", 0, 64, "threads (0: one per core)"},
        {"tokenizer", ARG_STR, &tokenizer, "", 0, 0, "use this tokenizer.json (or GPT-2 vocab.json with --merges) instead of training"},
        {"merges", ARG_STR, &merges, "", 0, 0, "GPT-2 merges.txt, with --tokenizer vocab.json"},
        {"shard-tokens", ARG_LONG, &shard_tokens, "100000000", 1, 1e12, "tokens per shard file"},
        {"min-frequency", ARG_INT, &min_freq, "0", 0, 1000000000, "stop merging when the best pair is rarer"},
        {"encode", ARG_STR, &encode, "", 0, 0, "print the ids of this text and exit"},
        {"decode", ARG_STR, &decode, "", 0, 0, "print the text of these ids (\"15496 11 995\"; - reads them from stdin) and exit"},
        {"quiet", ARG_BOOL, &quiet, NULL, 0, 0, "no progress output"},
    };
    const char *usage =
        "loom tokenize --input FILE_OR_DIR... --vocab 8192 --out data/NAME [--val-fraction 0.01] [--special S...] [--threads N]\n"
        "       loom tokenize --tokenizer tokenizer.json|vocab.json [--merges merges.txt] --input ... --out data/NAME\n"
        "       loom tokenize [--tokenizer T | --out data/NAME] --encode \"text\" | --decode \"ids\"";
    int r = loom_args_parse("tokenize", usage, args, (int)(sizeof args / sizeof args[0]), argc, argv);
    int given_special = loom_args_given("special"), given_vocab = loom_args_given("vocab");
    if (r) {
        free(input.v);
        free(special.v);
        return r == 1 ? 0 : 2;
    }
    int rc = 2;
    loom_tokenizer_t *tok = NULL;
    files_t in = {0};
    if (threads <= 0) threads = omp_get_num_procs();
    if (threads > 64) threads = 64;
    if (quiet) loom_log_quiet(1);
    const char *specials[64];
    int nspecial = 0;
    /* The default is the list's first entry; flags given replace it. */
    for (int i = given_special ? 1 : 0; i < special.n; i++) {
        if (!strcmp(special.v[i], "none")) continue;
        if (nspecial == 64) {
            fprintf(stderr, "loom tokenize: at most 64 special tokens\n");
            goto done;
        }
        for (const char *c = special.v[i]; *c; c++)
            if (*c == ' ' || (*c >= '\t' && *c <= '\r')) {
                fprintf(stderr, "loom tokenize: --special \"%s\": special tokens may not hold whitespace\n", special.v[i]);
                goto done;
            }
        specials[nspecial++] = special.v[i];
    }

    /* The tokenizer: given, found in --out for --encode/--decode, or trained. */
    loom_status s = LOOM_OK;
    if (merges && !tokenizer) {
        fprintf(stderr, "loom tokenize: --merges needs --tokenizer vocab.json\n");
        goto done;
    }
    if (tokenizer) s = merges ? loom_tokenizer_load_gpt2(&tok, tokenizer, merges) : loom_tokenizer_load(&tok, tokenizer);
    if (s != LOOM_OK) {
        rc = fail(s);
        goto done;
    }
    if (encode || decode) {
        if (!tok && out) {
            char path[4096];
            snprintf(path, sizeof path, "%s/tokenizer.json", out);
            if (loom_path_exists(path) && (s = loom_tokenizer_load(&tok, path)) != LOOM_OK) {
                rc = fail(s);
                goto done;
            }
        }
        if (!tok) {
            if (!quiet) fprintf(stderr, "loom tokenize: no --tokenizer; using the byte-level tokenizer\n");
            loom_tokenizer_bytes(&tok);
        }
        rc = encode ? quick_encode(tok, encode) : 0;
        if (rc == 0 && decode && !strcmp(decode, "-")) {
            size_t cap = 1 << 16, n = 0;
            char *buf = loom_malloc(cap);
            for (size_t k; (k = fread(buf + n, 1, cap - n - 1, stdin)) > 0;)
                if ((n += k) + 1 == cap) buf = realloc(buf, cap *= 2);
            buf[n] = 0;
            rc = quick_decode(tok, buf);
            free(buf);
        } else if (rc == 0 && decode) {
            rc = quick_decode(tok, decode);
        }
        goto done;
    }

    if (input.n == 0 || !out) {
        fprintf(stderr, "loom tokenize: needs --input and --out, e.g.\n  loom tokenize --input corpus.txt --vocab 8192 --out data/corpus\n");
        goto done;
    }
    for (int i = 0; i < input.n; i++)
        if ((s = add_input(&in, input.v[i])) != LOOM_OK) {
            rc = fail(s);
            goto done;
        }
    if (in.total == 0) {
        fprintf(stderr, "loom tokenize: no text in %s%s: the input is empty\n", input.v[0], input.n > 1 ? " ..." : "");
        goto done;
    }
    if (!tok && (vocab < 256 + nspecial || vocab > 2147483647LL)) {
        fprintf(stderr, "loom tokenize: --vocab %lld: must be between %d (256 bytes + %d special) and 2147483647\n", vocab, 256 + nspecial, nspecial);
        goto done;
    }
    if ((s = loom_mkdir_p(out)) != LOOM_OK) {
        rc = fail(s);
        goto done;
    }
    double train_s = 0;
    if (!tok) {
        if ((s = train(&tok, &in, vocab, specials, nspecial, min_freq, threads, quiet, &train_s)) != LOOM_OK) {
            rc = fail(s);
            goto done;
        }
    } else if (given_vocab) {
        loom_warn("--vocab is ignored with --tokenizer (its vocabulary is %d)", loom_tokenizer_vocab_size(tok));
    }
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", out);
    if ((s = loom_tokenizer_save(tok, tpath)) != LOOM_OK) {
        rc = fail(s);
        goto done;
    }
    split_t tr, va;
    enc_stats_t es;
    s = encode_corpus(tok, &in, out, val_fraction, (size_t)shard_tokens, threads, quiet, &tr, &va, &es);
    if (s != LOOM_OK) {
        rc = fail(s);
        goto done;
    }
    /* Shards beyond these, left by an earlier run into the same folder,
     * would be read as data by `loom train`: remove them. */
    for (int k = 0; k < 2; k++)
        for (int i = k ? va.index : tr.index;; i++) {
            char stale[4200];
            snprintf(stale, sizeof stale, "%s/%s_%06d.bin", out, k ? "val" : "train", i);
            if (unlink(stale) != 0) break;
        }
    printf("%s: vocabulary %d (%d merges, %d special), %zu train tokens in %d shard(s), %zu val tokens in %d shard(s)\n", out,
           loom_tokenizer_vocab_size(tok), loom_tokenizer_merges(tok), loom_tokenizer_nspecial(tok), tr.tokens, tr.index,
           va.tokens, va.index);
    printf("timing: threads %d, train %.3f s, encode %.1f MB in %.3f s (%.1f MB/s, shards included)\n", threads, train_s,
           es.bytes / 1e6, es.seconds, es.seconds > 0 ? es.bytes / 1e6 / es.seconds : 0);
    rc = 0;
done:
    loom_tokenizer_free(tok);
    files_free(&in);
    free(input.v);
    free(special.v);
    return rc;
}
