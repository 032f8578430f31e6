/* The llama.cpp peer rows of `loom bench generate` (bench_llama.h). */
#include "cli/bench_llama.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/quant.h"

/* Everything a shell command prints on stdout (malloc'd), or NULL. */
static char *capture(const char *cmd) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t n = 0, cap = 4096;
    char *buf = loom_malloc(cap);
    for (size_t got; (got = fread(buf + n, 1, cap - 1 - n, f)) > 0;) {
        n += got;
        if (cap - 1 - n < 1024) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    if (pclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The GGUF llama.cpp reads: --gguf, else --run when it is a .gguf file,
 * else --run's newest checkpoint exported now (Q8_0 under --quant, else
 * f32) to `tmp`, which the caller removes. 0, or -1 after a SKIP line. */
static int pick_gguf(const loom_bench_llama_t *p, char *out, size_t cap, const char *tmp) {
    const char *dt = p->quant != LOOM_QUANT_NONE ? "q8_0" : "f32";
    if (p->gguf && *p->gguf) {
        snprintf(out, cap, "%s", p->gguf);
        return 0;
    }
    if (!p->run || !*p->run) {
        printf("SKIP llama.cpp: random weights have no tokenizer for a GGUF; pass --run (a run folder or a GGUF) or --gguf\n");
        return -1;
    }
    if (!loom_path_is_dir(p->run)) {
        snprintf(out, cap, "%s", p->run);
        return 0;
    }
    char self[4096], cmd[12800];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    snprintf(cmd, sizeof cmd, "'%s' export --run '%s' --format gguf --dtype %s --out '%s' --force >/dev/null", self, p->run, dt, tmp);
    if (n <= 0 || system(cmd) != 0) {
        printf("SKIP llama.cpp: could not export %s as a %s GGUF (%s)\n", p->run, dt, cmd);
        return -1;
    }
    snprintf(out, cap, "%s", tmp);
    return 0;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* llama-bench -o json: one stream, prompt processing and generation. */
static void one_stream(const loom_bench_llama_t *p, const char *dir, const char *gguf) {
    char cmd[12800];
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH='%s' '%s' -m '%s' -t %d -p %d -n %d -r %d -o json 2>/dev/null", dir, p->bin, gguf,
             p->threads, p->plen, p->gen, p->repeat);
    printf("llama.cpp, one stream: %s\n", cmd);
    fflush(stdout);
    char *text = capture(cmd);
    cJSON *j = text ? cJSON_Parse(text) : NULL, *t;
    free(text);
    if (!cJSON_IsArray(j)) printf("llama.cpp: llama-bench failed or printed no JSON (run the command above to see why)\n");
    cJSON_ArrayForEach(t, j) {
        double np = num(t, "n_prompt"), ng = num(t, "n_gen"), ts = num(t, "avg_ts"), sd = num(t, "stddev_ts");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "model_type");
        if (np > 0)
            printf("%-28s %12.1f  (+-%.1f)  prompt processing, %.0f tokens (%s)\n", "llama.cpp llama-bench", ts, sd, np,
                   cJSON_IsString(type) ? type->valuestring : "?");
        else if (p->loom_one > 0)
            printf("%-28s %12.1f  (+-%.1f)  generation, %.0f tokens: %s decode, one request at a time, %.1f = %.2fx llama.cpp\n",
                   "llama.cpp llama-bench", ts, sd, ng, p->label, p->loom_one, p->loom_one / ts);
        else
            printf("%-28s %12.1f  (+-%.1f)  generation, %.0f tokens (no loom one-at-a-time level to compare)\n",
                   "llama.cpp llama-bench", ts, sd, ng);
    }
    cJSON_Delete(j);
}

/* llama-batched-bench --output-format jsonl at loom's concurrency: output
 * tokens over the whole run (prefill included), loom's measure. */
static void many_streams(const loom_bench_llama_t *p, const char *dir, const char *gguf) {
    char cmd[12800];
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH='%s' timeout 900 '%s/llama-batched-bench' -m '%s' -t %d -c %d -b 2048 -ub 512 -npp %d -ntg %d -npl %d --output-format jsonl 2>/dev/null",
             dir, dir, gguf, p->threads, p->clients * (p->plen + p->gen) + 64, p->plen, p->gen, p->clients);
    printf("llama.cpp, %d parallel sequences: %s\n", p->clients, cmd);
    fflush(stdout);
    char *text = capture(cmd);
    int shown = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *o = line[0] == '{' ? cJSON_Parse(line) : NULL;
        double pl = num(o, "pl"), tg = num(o, "tg"), t = num(o, "t"), stg = num(o, "speed_tg");
        if (pl == p->clients && t > 0) {
            double tps = pl * tg / t;
            printf("%-28s %12.1f  output tokens/s over the run (%.1f in decode alone): %s at %d clients %.1f = %.2fx llama.cpp\n",
                   "llama.cpp batched-bench", tps, stg, p->label, p->clients, p->loom_many, p->loom_many / tps);
            shown = 1;
        }
        cJSON_Delete(o);
    }
    if (!shown) printf("llama.cpp: llama-batched-bench failed, timed out (15 minutes) or is not built\n");
    free(text);
}

void loom_bench_llama_peer(const loom_bench_llama_t *p) {
    if (!loom_path_exists(p->bin)) {
        printf("SKIP llama.cpp: %s is not built (bench/llama-build.sh builds it; --llama-bench names another)\n", p->bin);
        return;
    }
    char gguf[4096], tmp[64], dir[4096];
    snprintf(tmp, sizeof tmp, "/tmp/loom-bench-%d.gguf", (int)getpid());
    if (pick_gguf(p, gguf, sizeof gguf, tmp) != 0) return;
    snprintf(dir, sizeof dir, "%s", p->bin);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    printf("llama.cpp on the same weights: %s (%s)\n", gguf, p->quant != LOOM_QUANT_NONE ? "Q8_0 expected: loom's int8 rows beside llama.cpp's Q8_0" : "f32");
    one_stream(p, dir, gguf);
    if (p->clients > 1) many_streams(p, dir, gguf);
    unlink(tmp);
}
