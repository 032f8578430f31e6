/* loom tokenize: flags, then the data pipeline (data/pipeline.h): train a
 * byte-level BPE tokenizer on text (or load one) and write train/val token
 * shards. --encode and --decode try a tokenizer on a few words. */
#define _GNU_SOURCE
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/core.h"
#include "data/pipeline.h"
#include "data/tokenizer.h"

static int fail(loom_status s) { return loom_exit_report("tokenize", s); }

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

static char *read_stdin(void) {
    size_t cap = 1 << 16, n = 0;
    char *buf = loom_malloc(cap);
    for (size_t k; (k = fread(buf + n, 1, cap - n - 1, stdin)) > 0;)
        if ((n += k) + 1 == cap) buf = realloc(buf, cap *= 2);
    buf[n] = 0;
    return buf;
}

/* --encode / --decode with the given tokenizer, the one in --out, or bytes. */
static int quick(loom_tokenizer_t *tok, const char *out, const char *encode, const char *decode, int quiet) {
    loom_status s;
    if (!tok && out) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        if (loom_path_exists(path) && (s = loom_tokenizer_load(&tok, path)) != LOOM_OK) return fail(s);
    }
    if (!tok) {
        if (!quiet) fprintf(stderr, "loom tokenize: no --tokenizer; using the byte-level tokenizer\n");
        loom_tokenizer_bytes(&tok);
    }
    int rc = encode ? quick_encode(tok, encode) : 0;
    if (rc == 0 && decode && !strcmp(decode, "-")) {
        char *buf = read_stdin();
        rc = quick_decode(tok, buf);
        free(buf);
    } else if (rc == 0 && decode) {
        rc = quick_decode(tok, decode);
    }
    loom_tokenizer_free(tok);
    return rc;
}

/* The --special list: the default is its first entry, flags given replace
 * it; "none" adds nothing. Returns the count, or -1 after an error. */
static int parse_specials(const loom_arg_list_t *special, int given, const char **specials) {
    int n = 0;
    for (int i = given ? 1 : 0; i < special->n; i++) {
        if (!strcmp(special->v[i], "none")) continue;
        if (n == 64) {
            fprintf(stderr, "loom tokenize: at most 64 special tokens\n");
            return -1;
        }
        for (const char *c = special->v[i]; *c; c++)
            if (*c == ' ' || (*c >= '\t' && *c <= '\r')) {
                fprintf(stderr, "loom tokenize: --special \"%s\": special tokens may not hold whitespace\n", special->v[i]);
                return -1;
            }
        specials[n++] = special->v[i];
    }
    return n;
}

static void print_result(const char *out, const loom_pipeline_result_t *r, int threads) {
    printf("%s: vocabulary %d (%d merges, %d special), %zu train tokens in %d shard(s), %zu val tokens in %d shard(s)\n", out,
           r->vocab, r->merges, r->nspecial, r->train_tokens, r->train_shards, r->val_tokens, r->val_shards);
    printf("timing: threads %d, train %.3f s, encode %.1f MB in %.3f s (%.1f MB/s, shards included)\n", threads, r->train_s,
           r->bytes / 1e6, r->encode_s, r->encode_s > 0 ? r->bytes / 1e6 / r->encode_s : 0);
}

typedef struct {
    loom_arg_list_t input, special;
    long long vocab, shard_tokens;
    double val_fraction;
    int threads, quiet, min_freq;
    const char *out, *tokenizer, *merges, *encode, *decode;
} tokenize_flags_t;

/* Parse; returns 0, 1 (--help printed) or 2. */
static int parse_flags(tokenize_flags_t *f, int argc, char **argv, int *given_special, int *given_vocab) {
    const loom_arg_t args[] = {
        {"input", ARG_LIST, &f->input, "", 0, 0, "text files or folders (every file in them, sorted) to tokenize"},
        {"out", ARG_STR, &f->out, "", 0, 0, "data folder to write: train_*.bin, val_*.bin, tokenizer.json"},
        {"vocab", ARG_LONG, &f->vocab, "8192", 0, 0, "vocabulary size to train, bytes and specials included"},
        loom_flag_default(LOOM_FLAG_VAL_FRACTION, &f->val_fraction, "0.01"), /* the leading share of the text */
        {"special", ARG_LIST, &f->special, "<|endoftext|>", 0, 0, "special tokens, cut out of the text (none: no specials)"},
        loom_flag(LOOM_FLAG_THREADS, &f->threads), /* at most 64 are used */
        {"tokenizer", ARG_STR, &f->tokenizer, "", 0, 0, "use this tokenizer.json (or GPT-2 vocab.json with --merges) instead of training"},
        {"merges", ARG_STR, &f->merges, "", 0, 0, "GPT-2 merges.txt, with --tokenizer vocab.json"},
        {"shard-tokens", ARG_LONG, &f->shard_tokens, "100000000", 1, 1e12, "tokens per shard file"},
        {"min-frequency", ARG_INT, &f->min_freq, "0", 0, 1000000000, "stop merging when the best pair is rarer"},
        {"encode", ARG_STR, &f->encode, "", 0, 0, "print the ids of this text and exit"},
        {"decode", ARG_STR, &f->decode, "", 0, 0, "print the text of these ids (\"15496 11 995\"; - reads them from stdin) and exit"},
        {"quiet", ARG_BOOL, &f->quiet, NULL, 0, 0, "no progress output"},
    };
    const char *usage =
        "loom tokenize --input FILE_OR_DIR... --vocab 8192 --out data/NAME [--val-fraction 0.01] [--special S...] [--threads N]\n"
        "       loom tokenize --tokenizer tokenizer.json|vocab.json [--merges merges.txt] --input ... --out data/NAME\n"
        "       loom tokenize [--tokenizer T | --out data/NAME] --encode \"text\" | --decode \"ids\"";
    int r = loom_args_parse("tokenize", usage, args, LOOM_ARGS_COUNT(args), argc, argv);
    *given_special = loom_args_given("special");
    *given_vocab = loom_args_given("vocab");
    return r;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_flags_t f = {0};
    int given_special, given_vocab, rc = parse_flags(&f, argc, argv, &given_special, &given_vocab);
    const char *specials[64];
    int nspecial = rc ? -1 : parse_specials(&f.special, given_special, specials);
    loom_tokenizer_t *tok = NULL;
    loom_status s = LOOM_OK;
    if (!rc && nspecial < 0) rc = 2;
    if (rc) goto done;
    if (f.merges && !f.tokenizer) {
        fprintf(stderr, "loom tokenize: --merges needs --tokenizer vocab.json\n");
        rc = 2;
        goto done;
    }
    if (f.threads <= 0) f.threads = omp_get_num_procs() < 64 ? omp_get_num_procs() : 64;
    if (f.quiet) loom_log_quiet(1);
    if (f.tokenizer && (s = f.merges ? loom_tokenizer_load_gpt2(&tok, f.tokenizer, f.merges) : loom_tokenizer_load(&tok, f.tokenizer)) != LOOM_OK) {
        rc = fail(s);
        goto done;
    }
    if (f.encode || f.decode) {
        rc = quick(tok, f.out, f.encode, f.decode, f.quiet);
        tok = NULL; /* quick freed it */
        goto done;
    }
    if (tok && given_vocab) loom_warn("--vocab is ignored with --tokenizer (its vocabulary is %d)", loom_tokenizer_vocab_size(tok));
    loom_progress_bar_t bar;
    loom_progress_bar_init(&bar, f.quiet);
    loom_pipeline_opts_t po = {.inputs = f.input.v, .ninputs = f.input.n, .out = f.out, .tokenizer = tok, .vocab = f.vocab,
                               .specials = specials, .nspecial = nspecial, .min_frequency = f.min_freq,
                               .val_fraction = f.val_fraction, .shard_tokens = (size_t)f.shard_tokens, .threads = f.threads,
                               .progress = loom_progress_bar_show, .progress_ctx = &bar};
    loom_pipeline_result_t res;
    if ((s = loom_pipeline_run(&po, &res)) != LOOM_OK) rc = fail(s);
    else print_result(f.out, &res, f.threads);
done:
    loom_tokenizer_free(tok);
    free(f.input.v);
    free(f.special.v);
    return rc == 1 ? 0 : rc;
}
