/* Fuzz targets for loom's file readers (issue 28): safetensors, GGUF,
 * tokenizer.json, config.json, state.json, manifest.json, a token shard's
 * header and a chat template; and the HTTP request parser of `loom serve`
 * (fuzz_request.c, linked in as "request"). Each file target writes the input where the
 * reader expects its file and calls the reader as loom does; any result is
 * fine but a crash, a sanitizer report or a hang.
 *
 * Cost per input (what a profile of the first version showed): the inputs
 * are files, and rewriting a file on ext4 flushes it to the disk when it
 * is closed (ext4's replace-by-truncate heuristic), so a target that wrote
 * its files under /tmp waited on the disk for each input: state.json took
 * 8 ms per input, 0.3 ms on tmpfs. So the files go to /dev/shm (tmpfs)
 * when there is one (LOOM_FUZZ_DIR chooses another folder), a checkpoint
 * folder's constant files are written once per process, not per input,
 * and tokenizer.json goes to the reader as a buffer (loom_tokenizer_parse,
 * what loom_tokenizer_load calls after reading the file). Many inputs run
 * in one process, as with libFuzzer; what is left is the readers' own work
 * under the sanitizers.
 *
 * Two ways to drive them:
 *  - libFuzzer: build with -DLOOM_LIBFUZZER -fsanitize=fuzzer and set
 *    LOOM_FUZZ_READER=name (bench/fuzz-readers.sh --libfuzzer);
 *  - the deterministic mutation driver here (main below): `fuzz_readers
 *    READER COUNT SEED SEED_FILE...` mutates the seed files (bit flips,
 *    byte sets, interesting integers, truncation, duplication, splices) COUNT
 *    times from SEED, so a failure reproduces from its numbers alone. It
 *    runs under gcc's ASan/UBSan (make SANITIZE=address,undefined) with
 *    no extra toolchain; tests/test_fuzz_readers.sh runs a bounded count in
 *    make test, bench/fuzz-readers.sh a long one. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "data/chat_template.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

static char dir[256]; /* a private folder for the inputs */

static void put(const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

/* The targets' CPU backend, made once. Making it measures the peak FLOP
 * rate with eight 1024^3 SGEMMs: 1-2 s with loom's own GEMM under gcc's
 * sanitizers, minutes in the libFuzzer build (-O1, coverage on every
 * loop). No target multiplies matrices, so OpenBLAS's GEMM is taken when
 * loom has it (LOOM_GEMM=blas; a fraction of a second). */
static const loom_backend_t *cpu(void) {
    static const loom_backend_t *be;
    if (be) return be;
    setenv("LOOM_GEMM", "blas", 0);
    if (loom_backend_cpu_init(&be, 1) == LOOM_OK) return be;
    unsetenv("LOOM_GEMM"); /* built with NO_BLAS */
    if (loom_backend_cpu_init(&be, 1) != LOOM_OK) abort();
    return be;
}

static loom_gpt_t *m; /* the safetensors target's model, made once */

static void fuzz_safetensors(const uint8_t *p, size_t n) {
    if (!m) { /* GPT-2 with 1 layer, 8 channels: the reader checks names and shapes against it */
        loom_gpt_config_t c = {.max_seq_len = 4, .vocab_size = 10, .n_layer = 1, .n_head = 2, .channels = 8};
        if (loom_gpt_create(&m, &c, cpu()) != LOOM_OK) abort();
    }
    put("model.safetensors", p, n);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loom_safetensors_load_gpt(m, path);
}

static void fuzz_gguf(const uint8_t *p, size_t n) {
    put("m.gguf", p, n);
    char path[512];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    loom_gpt_t *m = NULL;
    loom_tokenizer_t *tok = NULL;
    if (loom_gguf_load_opts(path, cpu(), 0, &m, &tok) == LOOM_OK) { /* as loom_open loads: the blocks, then fp32 made from them */
        loom_gguf_fp32(m, 0);
        loom_gpt_free(m);
        loom_tokenizer_free(tok);
    }
}

static void fuzz_tokenizer(const uint8_t *p, size_t n) {
    loom_tokenizer_t *t;
    if (loom_tokenizer_parse(&t, "fuzz/tokenizer.json", (const char *)p, n) != LOOM_OK) return;
    static const char text[] = "In the beginning <|endoftext|> caf\xc3\xa9 \xff!";
    uint32_t *ids;
    size_t k;
    if (loom_tokenizer_encode_special(t, text, sizeof text - 1, &ids, &k) == LOOM_OK) {
        char *back;
        size_t len;
        if (loom_tokenizer_decode(t, ids, k, &back, &len) == LOOM_OK) free(back);
        free(ids);
    }
    loom_tokenizer_free(t);
}

static void fuzz_config(const uint8_t *p, size_t n) {
    put("config.json", p, n);
    loom_gpt_config_t c;
    if (loom_hf_read_config(dir, &c) == LOOM_OK && (c.channels < 1 || c.channels > LOOM_GPT_MAX_CHANNELS)) abort();
}

/* A checkpoint folder whose config.json is valid (written once); `name` gets the input. */
static void checkpoint_folder(const char *name, const uint8_t *p, size_t n) {
    static int made;
    if (made) {
        put(name, p, n);
        return;
    }
    made = 1;
    static const char cfg[] = "{\"architectures\":[\"GPT2LMHeadModel\"],\"model_type\":\"gpt2\",\"n_layer\":1,\"n_head\":2,"
                              "\"n_embd\":8,\"n_positions\":4,\"vocab_size\":10}";
    static const char state[] = "{\"step\":3,\"tokenizer_hash\":\"0123456789abcdef\",\"train_loss\":1.5,\"val_loss\":null}";
    put("config.json", (const uint8_t *)cfg, sizeof cfg - 1);
    put("state.json", (const uint8_t *)state, sizeof state - 1);
    put(name, p, n);
}

static void fuzz_state(const uint8_t *p, size_t n) {
    checkpoint_folder("state.json", p, n);
    loom_gpt_config_t c;
    loom_ckpt_state_t st;
    loom_run_read_checkpoint(dir, &c, &st);
}

static void fuzz_manifest(const uint8_t *p, size_t n) {
    checkpoint_folder("manifest.json", p, n);
    int verified;
    loom_ckpt_verify(dir, &verified);
}

static void fuzz_shard(const uint8_t *p, size_t n) {
    put("train_000000.bin", p, n);
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    loom_shard_t s;
    if (loom_shard_open(&s, path) != LOOM_OK) return;
    loom_shard_validate(&s, path, 1000);
    if (s.ntokens) loom_shard_get(&s, s.ntokens - 1);
    loom_shard_close(&s);
}

static void fuzz_chat_template(const uint8_t *p, size_t n) {
    char *text = malloc(n + 1);
    memcpy(text, p, n);
    text[n] = 0;
    loom_chat_template_t *t;
    loom_status s = loom_chat_template_parse(&t, "fuzz", text);
    free(text);
    if (s != LOOM_OK) return;
    cJSON *msgs = cJSON_Parse("[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\"},"
                                  "{\"role\":\"assistant\",\"content\":\"yo\"},{\"role\":\"user\",\"content\":\"\xc3\xa9\"}]");
    loom_chat_vars_t v = {.messages = msgs, .bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = 1};
    char *out;
    if (loom_chat_template_render(t, &v, &out) == LOOM_OK) free(out);
    cJSON_Delete(msgs);
    loom_chat_template_free(t);
}

void loom_fuzz_request(const uint8_t *p, size_t n); /* fuzz_request.c */

static const struct {
    const char *name;
    void (*fn)(const uint8_t *, size_t);
} readers[] = {
    {"safetensors", fuzz_safetensors}, {"gguf", fuzz_gguf},       {"tokenizer", fuzz_tokenizer}, {"config", fuzz_config},
    {"state", fuzz_state},             {"manifest", fuzz_manifest}, {"shard", fuzz_shard},       {"chat_template", fuzz_chat_template},
    {"request", loom_fuzz_request},
};
#define NREADERS (int)(sizeof readers / sizeof readers[0])

static int find_reader(const char *name) {
    for (int i = 0; name && i < NREADERS; i++)
        if (!strcmp(readers[i].name, name)) return i;
    return -1;
}

/* At exit (libFuzzer ends with exit() too): the inputs' folder and its files. */
static void remove_dir(void) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) snprintf(path, sizeof path, "%s/%s", dir, e->d_name), unlink(path);
    if (d) closedir(d);
    rmdir(dir);
}

/* The inputs' folder: LOOM_FUZZ_DIR, else tmpfs (/dev/shm), else TMPDIR or /tmp. */
static void make_dir(void) {
    if (dir[0]) return;
    const char *base = getenv("LOOM_FUZZ_DIR");
    struct stat st;
    if (!base || !*base) base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
    if (!base) base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/loom-fuzz-%d", base, (int)getpid());
    if (mkdir(dir, 0700) != 0) fprintf(stderr, "fuzz_readers: cannot make %s\n", dir), exit(2);
    atexit(remove_dir);
    loom_ckpt_allow_unverified(); /* state.json's target reads a folder without a manifest */
}

#ifdef LOOM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *p, size_t n) {
    static int r = -2;
    if (r == -2) {
        r = find_reader(getenv("LOOM_FUZZ_READER"));
        if (r < 0) fprintf(stderr, "set LOOM_FUZZ_READER to a reader\n"), abort();
        make_dir();
    }
    readers[r].fn(p, n);
    return 0;
}
#else
/* xorshift64*: the driver's only source of randomness */
static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

/* One mutation of buf (len bytes, room for cap) from a seed and a splice donor. */
static size_t mutate(uint8_t *buf, size_t len, size_t cap, const uint8_t *donor, size_t dlen) {
    static const int64_t interesting[] = {0, 1, -1, 2, 7, 8, 16, 32, 64, 127, 128, 255, 256, 1024, 4096, 65535, 65536,
                                          INT32_MAX, INT32_MIN, (int64_t)1 << 32, INT64_MAX, INT64_MIN};
    int rounds = 1 + (int)(next() % 4);
    for (int r = 0; r < rounds; r++) {
        size_t at = len ? next() % len : 0;
        switch (next() % 8) {
        case 0: if (len) buf[at] ^= (uint8_t)(1u << (next() % 8)); break;
        case 1: if (len) buf[at] = (uint8_t)next(); break;
        case 2: { /* an interesting integer, 1, 2, 4 or 8 bytes */
            int64_t v = interesting[next() % (sizeof interesting / sizeof interesting[0])];
            size_t w = (size_t)1 << (next() % 4);
            if (at + w <= len) memcpy(buf + at, &v, w);
            break;
        }
        case 3: len = len ? next() % len : 0; break; /* truncate */
        case 4: { /* duplicate a span */
            size_t span = len ? 1 + next() % (len < 64 ? len : 64) : 0, from = len > span ? next() % (len - span) : 0;
            if (len + span <= cap) {
                memmove(buf + at + span, buf + at, len - at);
                memmove(buf + at, buf + from + (from >= at ? span : 0), span);
                len += span;
            }
            break;
        }
        case 5: { /* delete a span */
            size_t span = len - at ? 1 + next() % (len - at < 64 ? len - at : 64) : 0;
            memmove(buf + at, buf + at + span, len - at - span);
            len -= span;
            break;
        }
        case 6: { /* an ASCII digit run: JSON numbers */
            if (len) buf[at] = (uint8_t)("0123456789-.eE\"{}[],:"[next() % 21]);
            break;
        }
        default: { /* splice from another seed */
            if (!dlen) break;
            size_t from = next() % dlen, span = 1 + next() % (dlen - from < 256 ? dlen - from : 256);
            if (at + span <= cap) {
                memcpy(buf + at, donor + from, span);
                if (at + span > len) len = at + span;
            }
        }
        }
    }
    return len;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    *n = sz > 0 ? fread(p, 1, (size_t)sz, f) : 0;
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    int r = argc > 1 ? find_reader(argv[1]) : -1;
    if (r < 0 || argc < 5) {
        fprintf(stderr, "usage: fuzz_readers READER COUNT SEED SEED_FILE...   READER: ");
        for (int i = 0; i < NREADERS; i++) fprintf(stderr, "%s%s", i ? ", " : "", readers[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    long long count = atoll(argv[2]);
    rng = (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ULL + 1;
    int nseeds = argc - 4;
    uint8_t **seed = calloc((size_t)nseeds, sizeof *seed);
    size_t *slen = calloc((size_t)nseeds, sizeof *slen), maxlen = 0;
    for (int i = 0; i < nseeds; i++) {
        if (!(seed[i] = slurp(argv[4 + i], &slen[i]))) return fprintf(stderr, "fuzz_readers: cannot read %s\n", argv[4 + i]), 2;
        if (slen[i] > maxlen) maxlen = slen[i];
    }
    make_dir();
    size_t cap = 2 * maxlen + 4096;
    uint8_t *buf = malloc(cap);
    for (int i = 0; i < nseeds; i++) readers[r].fn(seed[i], slen[i]); /* the seeds themselves first */
    for (long long k = 0; k < count; k++) {
        int s = (int)(next() % (uint64_t)nseeds), d = (int)(next() % (uint64_t)nseeds);
        memcpy(buf, seed[s], slen[s]);
        size_t len = mutate(buf, slen[s], cap, seed[d], slen[d]);
        readers[r].fn(buf, len);
    }
    for (int i = 0; i < nseeds; i++) free(seed[i]);
    free(seed);
    free(slen);
    free(buf);
    loom_gpt_free(m);
    printf("fuzz_readers %s: %lld inputs from seed %s, %d seed file(s): no crash\n", argv[1], count, argv[3], nseeds);
    return 0;
}
#endif
