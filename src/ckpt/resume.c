#include "ckpt/resume.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int same(double a, double b) { return a == b || fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b)); }

/* One fixed setting: the run's value (from config.json) against now's. */
typedef struct {
    const char *key, *flag;
    double now;
} fixed_t;

static loom_status check_fixed(const cJSON *cfg, const char *path, const loom_resume_settings_t *n) {
    const fixed_t f[] = {
        {"lr", "--lr", n->lr}, {"min_lr_ratio", "--min-lr-ratio", n->min_lr_ratio}, {"warmup", "--warmup", n->warmup},
        {"weight_decay", "--weight-decay", n->weight_decay}, {"clip", "--clip", n->clip}, {"beta1", "--beta1", n->beta1},
        {"beta2", "--beta2", n->beta2}, {"seed", "--seed", (double)n->seed}, {"val_fraction", "--val-fraction", n->val_fraction},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, f[i].key);
        if (cJSON_IsNumber(v) && !same(v->valuedouble, f[i].now))
            return loom_error(LOOM_EINVAL, "--resume: %s %.10g differs from the run's %.10g (%s); a resumed run must take the steps the "
                              "interrupted one would have: pass %s %.10g, or start a new run", f[i].flag, f[i].now, v->valuedouble, path,
                              f[i].flag, v->valuedouble);
    }
    static const char *const strs[][2] = {{"dtype", "--dtype"}, {"grad_dtype", "--grad-dtype"}, {"data_resolved", "--data"},
                                          {"model", "--model"}, {"init_from_run", "--init-from-run"}};
    const char *now_s[] = {n->dtype, n->grad_dtype, n->data_resolved, n->model, n->init_from_run};
    for (int i = 0; i < 5; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, strs[i][0]);
        if (cJSON_IsString(v) && now_s[i] && strcmp(v->valuestring, now_s[i]))
            return loom_error(LOOM_EINVAL, "--resume: %s %s differs from the run's %s (%s): pass %s %s, or start a new run", strs[i][1],
                              now_s[i], v->valuestring, path, strs[i][1], v->valuestring);
    }
    return LOOM_OK;
}

/* A number from the checkpoint's state if recorded, else the run config's. */
static int saved_int(const cJSON *cfg, const char *key, int from_state) {
    if (from_state > 0) return from_state;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsNumber(v) ? v->valueint : 0;
}

/* "--nproc 1 --grad-accum 3 or --nproc 3 --grad-accum 1": the world sizes
 * (up to 1024, the first few) that split `global` micro-batches evenly. */
static void worlds_dividing(long long global, char *out, size_t cap) {
    size_t used = 0;
    int shown = 0;
    for (long long r = 1; r <= global && r <= 1024 && shown < 6 && used < cap; r++)
        if (global % r == 0)
            used += (size_t)snprintf(out + used, cap - used, "%s--nproc %lld --grad-accum %lld", shown++ ? " or " : "", r, global / r);
}

/* The global batch: keep it, adjusting accumulation to the world size. */
static loom_status check_batch(const cJSON *cfg, const loom_resume_settings_t *n, const loom_ckpt_state_t *st,
                               int *accum, char *changes, size_t cap) {
    int b = saved_int(cfg, "batch", st->batch), t = saved_int(cfg, "seq", st->seq);
    int a = saved_int(cfg, "grad_accum", st->grad_accum), w = saved_int(cfg, "world_size", st->world_size);
    int z = st->world_size > 0 ? st->zero : saved_int(cfg, "zero", 0);
    size_t used = strlen(changes);
    *accum = n->grad_accum;
    if (b && b != n->batch)
        return loom_error(LOOM_EINVAL, "--resume: --batch %d differs from the run's %d: pass --batch %d (the global batch must stay %lld sequences)",
                          n->batch, b, b, (long long)b * (a ? a : 1) * (w ? w : 1));
    if (t && t != n->seq)
        return loom_error(LOOM_EINVAL, "--resume: --seq %d differs from the run's %d: pass --seq %d", n->seq, t, t);
    if (!a || !w) return LOOM_OK; /* an older run: nothing recorded */
    long long global = (long long)a * w, now = (long long)n->grad_accum * n->world_size;
    if (now != global) {
        if (global % n->world_size) {
            char ways[256] = "";
            worlds_dividing(global, ways, sizeof ways);
            return loom_error(LOOM_EINVAL, "--resume: the run's %lld micro-batches per step (%d rank(s) x --grad-accum %d) do not split over %d ranks; "
                              "resume with %s", global, w, a, n->world_size, ways);
        }
        if (n->grad_accum != a)
            return loom_error(LOOM_EINVAL, "--resume: %d rank(s) x --grad-accum %d make %lld micro-batches per step; the run used %d x %d = %lld. "
                              "Pass --grad-accum %lld", n->world_size, n->grad_accum, now, w, a, global, global / n->world_size);
        *accum = (int)(global / n->world_size);
    }
    if (w != n->world_size)
        used += (size_t)snprintf(changes + used, cap - used, ",\"world_size\":[%d,%d],\"grad_accum\":[%d,%d]", w, n->world_size, a, *accum);
    if (z != n->zero && used < cap) used += (size_t)snprintf(changes + used, cap - used, ",\"zero\":[%d,%d]", z, n->zero);
    return LOOM_OK;
}

loom_status loom_resume_check(const char *run, const loom_resume_settings_t *now, const loom_ckpt_state_t *st,
                              int lead, int *grad_accum) {
    char path[4200], *text, changes[512] = "";
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", run);
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (!cfg) return loom_error(LOOM_EFORMAT, "%s: not valid JSON", path);
    loom_status s = check_fixed(cfg, path, now);
    if (s == LOOM_OK) s = check_batch(cfg, now, st, grad_accum, changes, sizeof changes);
    cJSON *steps = cJSON_GetObjectItemCaseSensitive(cfg, "steps");
    if (s == LOOM_OK && cJSON_IsNumber(steps) && steps->valuedouble != (double)now->steps) {
        size_t u = strlen(changes);
        snprintf(changes + u, sizeof changes - u, ",\"steps\":[%.0f,%lld]", steps->valuedouble, now->steps);
    }
    cJSON_Delete(cfg);
    if (s != LOOM_OK || !lead) return s;
    if (changes[0]) loom_info("loom train: resuming with changes (old, new): %s", changes + 1);
    char line[1024];
    int n = snprintf(line, sizeof line, "{\"event\":\"resume\",\"step\":%lld,\"time\":%lld%s}\n", st->step, (long long)time(NULL), changes);
    snprintf(path, sizeof path, "%s/events.jsonl", run);
    FILE *f = fopen(path, "a");
    if (!f || fwrite(line, 1, (size_t)n, f) != (size_t)n || fclose(f) != 0)
        return loom_error(LOOM_EIO, "%s: cannot append the resume record", path);
    return LOOM_OK;
}
