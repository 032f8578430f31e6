#include "obs/metrics_log.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct loom_metrics_log {
    FILE *f;
    char path[4096];
};

/* A number after `"key":` within the line [line, end), or NAN (absent, null). */
static double field(const char *line, const char *end, const char *key) {
    const char *p = strstr(line, key);
    if (!p || p >= end) return NAN;
    char *e;
    double v = strtod(p + strlen(key), &e);
    return e == p + strlen(key) ? NAN : v;
}

/* One line [line, end) as a row: a number the line lacks is NAN and its
 * has_ flag 0. */
static void parse_row(const char *line, const char *end, loom_metrics_row_t *r) {
    static const struct {
        const char *key;
        size_t off;
        int has; /* offset of the has_ flag + 1; 0: none */
    } nums[] = {
        {"\"loss\":", offsetof(loom_metrics_row_t, loss), 0},
        {"\"val_loss\":", offsetof(loom_metrics_row_t, val_loss), 0},
        {"\"comm_wait_s\":", offsetof(loom_metrics_row_t, comm_wait_s), offsetof(loom_metrics_row_t, has_comm_wait) + 1},
        {"\"comm_tp_s\":", offsetof(loom_metrics_row_t, comm_tp_s), offsetof(loom_metrics_row_t, has_comm_tp) + 1},
        {"\"loss_scale\":", offsetof(loom_metrics_row_t, loss_scale), offsetof(loom_metrics_row_t, has_loss_scale) + 1},
        {"\"lr\":", offsetof(loom_metrics_row_t, lr), 0},
        {"\"grad_norm\":", offsetof(loom_metrics_row_t, grad_norm), 0},
        {"\"tokens_per_s\":", offsetof(loom_metrics_row_t, tokens_per_s), 0},
        {"\"mfu\":", offsetof(loom_metrics_row_t, mfu), 0},
        {"\"step_s\":", offsetof(loom_metrics_row_t, step_s), 0},
        {"\"elapsed_s\":", offsetof(loom_metrics_row_t, elapsed_s), 0},
        {"\"energy_j_per_token\":", offsetof(loom_metrics_row_t, energy_j_per_token), offsetof(loom_metrics_row_t, has_energy) + 1},
        {"\"bubble_s\":", offsetof(loom_metrics_row_t, bubble_s), offsetof(loom_metrics_row_t, has_pp) + 1},
        {"\"comm_pp_s\":", offsetof(loom_metrics_row_t, comm_pp_s), 0},
    };
    memset(r, 0, sizeof *r);
    r->step = (long long)field(line, end, "\"step\":");
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        double v = field(line, end, nums[i].key);
        *(double *)((char *)r + nums[i].off) = v;
        if (nums[i].has) *(int *)((char *)r + nums[i].has - 1) = !isnan(v);
    }
    const char *sk = strstr(line, "\"skipped\":true");
    r->skipped = sk && sk < end;
}

loom_status loom_metrics_log_scan(const char *path, void (*row)(void *ctx, const loom_metrics_row_t *r), void *ctx) {
    char *text;
    size_t len;
    if (!loom_path_exists(path) || loom_file_read(path, &text, &len) != LOOM_OK) return LOOM_OK;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (!end) break; /* a torn last line */
        loom_metrics_row_t r;
        if (field(line, end, "\"step\":") >= 1) {
            parse_row(line, end, &r);
            row(ctx, &r);
        }
        line = end + 1;
    }
    free(text);
    return LOOM_OK;
}

/* Keep the complete lines of steps 1..upto; rewrite atomically. */
static loom_status trim(const char *path, long long upto) {
    char *text;
    size_t len;
    if (!loom_path_exists(path) || loom_file_read(path, &text, &len) != LOOM_OK) return LOOM_OK;
    char *kept = loom_malloc(len + 1);
    size_t k = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (!end) break;
        size_t n = (size_t)(end - line + 1);
        double step = field(line, end, "\"step\":");
        if (step >= 1 && step <= (double)upto) {
            memcpy(kept + k, line, n);
            k += n;
        }
        line = end + 1;
    }
    loom_status s = loom_file_write_atomic(path, kept, k);
    free(kept);
    free(text);
    return s;
}

loom_status loom_metrics_log_open(loom_metrics_log_t **out, const char *path, long long keep_upto) {
    if (keep_upto >= 0) LOOM_TRY(trim(path, keep_upto));
    FILE *f = fopen(path, keep_upto >= 0 ? "a" : "w");
    if (!f) return loom_error(LOOM_EWRITE, "%s: cannot create the metrics log", path);
    loom_metrics_log_t *l = loom_malloc(sizeof *l);
    l->f = f;
    snprintf(l->path, sizeof l->path, "%s", path);
    *out = l;
    return LOOM_OK;
}

loom_status loom_metrics_log_write(loom_metrics_log_t *l, const loom_metrics_row_t *r) {
    FILE *f = l->f;
    fprintf(f, "{\"step\":%lld,\"loss\":%.6f,", r->step, r->loss);
    if (r->val_loss >= 0) fprintf(f, "\"val_loss\":%.6f,", r->val_loss);
    if (r->has_comm_wait) fprintf(f, "\"comm_wait_s\":%.4f,\"comm_dp_s\":%.4f,", r->comm_wait_s, r->comm_wait_s);
    if (r->peak_rss_mb > 0) fprintf(f, "\"peak_rss_mb\":%.1f,", r->peak_rss_mb);
    if (r->has_comm_tp) fprintf(f, "\"comm_tp_s\":%.4f,", r->comm_tp_s);
    if (r->has_pp) fprintf(f, "\"bubble_s\":%.4f,\"comm_pp_s\":%.4f,", r->bubble_s, r->comm_pp_s);
    if (r->has_loss_scale) fprintf(f, "\"loss_scale\":%g,\"skipped\":%s,", r->loss_scale, r->skipped ? "true" : "false");
    fprintf(f, "\"lr\":%.6e,", r->lr);
    if (isfinite(r->grad_norm)) fprintf(f, "\"grad_norm\":%.6f,", r->grad_norm);
    else fprintf(f, "\"grad_norm\":null,");
    if (r->has_energy) fprintf(f, "\"energy_j_per_token\":%.6g,", r->energy_j_per_token);
    fprintf(f, "\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"step_s\":%.4f,\"elapsed_s\":%.2f}\n", r->tokens_per_s, r->mfu,
            r->step_s, r->elapsed_s);
    if (fflush(f) != 0 || ferror(f)) return loom_error(LOOM_EWRITE, "%s: cannot write the metrics log", l->path);
    return LOOM_OK;
}

void loom_metrics_log_close(loom_metrics_log_t *l) {
    if (!l) return;
    fclose(l->f);
    free(l);
}
