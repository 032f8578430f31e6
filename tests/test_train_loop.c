/* The training loop's contract (src/train/train.h): which observer points
 * are called, how often and in what order; a stop asked for by an observer;
 * an observer's error ending the run. Then the pieces issue 9 moved out of
 * train_run and the CLI: the one evaluation rule (against the known answer
 * ln(V) of an all-zero model), the one run-config reader and writer (an
 * older config.json written by hand must still load), the metrics log's
 * trim on resume, the shared flag table's enumerated flags, and the local
 * rank launcher. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt/run.h"
#include "cli/args.h"
#include "data/dataset.h"
#include "obs/metrics_log.h"
#include "parallel/launch.h"
#include "train/eval.h"
#include "train/train.h"

/* ---- a recording observer ---- */

#define MAX_EV 64
typedef struct {
    loom_train_observer_t ob;
    char ev[MAX_EV][24]; /* "start", "before 3", "eval 3", "after 3", "ckpt 2", "ckpt 6 final", "stop", "end", ... */
    int n;
    double after_val[16];  /* val_loss of each after_step record, by step */
    float after_loss[16];
    long long stop_before;  /* ask to stop in before_step of this step (0: never) */
    long long fail_after;   /* fail in after_step of this step (0: never) */
    loom_status stop_status;
    int freed;
} rec_t;

static void add(rec_t *r, const char *fmt, long long x, const char *tail) {
    if (r->n < MAX_EV) snprintf(r->ev[r->n++], sizeof r->ev[0], fmt, x, tail);
}

static loom_status rec_start(void *ctx, loom_train_run_t *run) {
    add(ctx, "start%.0lld%s", 0, "");
    return LOOM_OK;
}
static loom_status rec_before(void *ctx, loom_train_run_t *run, long long step) {
    rec_t *r = ctx;
    add(r, "before %lld%s", step, "");
    if (step == r->stop_before) loom_train_request_stop(run, 0);
    return LOOM_OK;
}
static loom_status rec_eval(void *ctx, loom_train_run_t *run, long long step, double val) {
    add(ctx, "eval %lld%s", step, "");
    return LOOM_OK;
}
static loom_status rec_after(void *ctx, loom_train_run_t *run, const loom_step_record_t *s) {
    rec_t *r = ctx;
    add(r, "after %lld%s", s->step, "");
    if (s->step < 16) {
        r->after_val[s->step] = s->val_loss;
        r->after_loss[s->step] = s->loss;
    }
    if (s->step == r->fail_after) return loom_error(LOOM_EIO, "test observer fails at step %lld", s->step);
    return LOOM_OK;
}
static loom_status rec_ckpt(void *ctx, loom_train_run_t *run, const loom_ckpt_event_t *ev) {
    add(ctx, "ckpt %lld%s", ev->state.step, ev->final ? " final" : "");
    return LOOM_OK;
}
static loom_status rec_stop(void *ctx, loom_train_run_t *run, loom_status s) {
    rec_t *r = ctx;
    r->stop_status = s;
    add(r, "stop%.0lld%s", 0, "");
    return LOOM_OK;
}
static void rec_end(void *ctx, loom_train_run_t *run, loom_status s) { add(ctx, "end%.0lld%s", 0, ""); }
static void rec_free(void *ctx) { ((rec_t *)ctx)->freed++; }

static void rec_init(rec_t *r) {
    memset(r, 0, sizeof *r);
    r->ob = (loom_train_observer_t){.name = "test", .ctx = r, .on_start = rec_start, .before_step = rec_before,
                                    .on_eval = rec_eval, .after_step = rec_after, .on_checkpoint = rec_ckpt,
                                    .on_stop = rec_stop, .on_end = rec_end, .free = rec_free};
}

/* The events as one line, for messages and comparison. */
static const char *joined(const rec_t *r) {
    static char buf[2048];
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < r->n && k < sizeof buf - 32; i++) k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "", r->ev[i]);
    return buf;
}

/* ~8 KB of text: enough tokens for tiny batches and a validation split. */
static const char *text_file(void) {
    const char *path = check_tmp_path("text.txt");
    if (loom_path_exists(path)) return path;
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 180; i++) fprintf(f, "line %d: the quick brown fox jumps over the lazy dog.\n", i * 7 % 101);
    fclose(f);
    return path;
}

static loom_train_opts_t tiny_opts(const char *out, rec_t *r, loom_train_observer_t **list) {
    list[0] = &r->ob;
    return (loom_train_opts_t){
        .data = text_file(), .model = "gpt2-tiny", .out = out, .device = "cpu", .dtype = -1, .cuda_graphs = -1,
        .recompute = LOOM_RECOMPUTE_NONE, .layers = 1, .heads = 2, .channels = 32, .context = 32, .batch = 2, .seq = 16,
        .grad_accum = 1, .steps = 6, .warmup = 2, .lr = 1e-3, .min_lr_ratio = 0.1, .weight_decay = 0.1, .clip = 1,
        .beta1 = 0.9, .beta2 = 0.95, .val_fraction = 0.1, .eval_every = 3, .eval_batches = 2, .ckpt_every = 2,
        .keep_ckpts = 10, .log_every = 1, .threads = 1, .force = 1, .seed = 1, .dist_timeout = 30,
        .grad_dtype = LOOM_DIST_FP32, .observers = list, .n_observers = 1};
}

/* Train the tiny run into check_tmp_path(out) with a recorder that stops
 * before step `stop_before` or fails after step `fail_after` (0: never). */
static loom_status run_tiny(rec_t *r, const char *out, long long stop_before, long long fail_after) {
    rec_init(r);
    r->stop_before = stop_before;
    r->fail_after = fail_after;
    loom_train_observer_t *list[1];
    loom_train_opts_t o = tiny_opts(check_tmp_path(out), r, list);
    return loom_train(&o);
}

static void check_events(const rec_t *r, const char *want) {
    CHECK(!strcmp(joined(r), want), "events:\n    %s\n  wanted:\n    %s", joined(r), want);
}

static void observer_points_in_order(void) {
    rec_t r;
    loom_status s = run_tiny(&r, "run", 0, 0);
    CHECK(s == LOOM_OK, "loom_train: %s", loom_errmsg());
    /* Evaluations at 3 and at the last step (6); periodic checkpoints at 2
     * and 4 (not at the last step), then the final one at 6, written by the
     * checkpoint observer's on_stop, which runs after the caller's. */
    const char *want = "start, before 1, after 1, before 2, after 2, ckpt 2, before 3, eval 3, after 3, before 4, after 4, "
                       "ckpt 4, before 5, after 5, before 6, eval 6, after 6, stop, ckpt 6 final, end";
    check_events(&r, want);
    CHECK(r.freed == 1, "free called %d times", r.freed);
    CHECK(r.after_val[2] < 0 && r.after_val[3] > 0 && r.after_val[6] > 0, "val_loss in records: %g %g %g", r.after_val[2],
          r.after_val[3], r.after_val[6]);
    /* The metrics log holds the same losses the observers saw. */
    char *text;
    size_t len;
    CHECK(loom_file_read(check_tmp_path("run/metrics.jsonl"), &text, &len) == LOOM_OK, "no metrics.jsonl");
    int lines = 0;
    for (char *p = text; (p = strstr(p, "{\"step\":")); p++) {
        long long st = strtoll(p + 8, NULL, 10);
        double loss = strtod(strstr(p, "\"loss\":") + 7, NULL);
        CHECK(st == ++lines && fabs(loss - r.after_loss[st]) < 1e-6, "line %d: step %lld loss %.6f, observer saw %.6f", lines, st,
              loss, r.after_loss[st < 16 ? st : 0]);
    }
    CHECK(lines == 6, "%d metrics lines, wanted 6", lines);
    free(text);
    CHECK(loom_path_exists(check_tmp_path("run/loss.svg")), "no loss.svg");
}

static void observer_stop_request(void) {
    rec_t r;
    loom_status s = run_tiny(&r, "stopped", 3, 0);
    CHECK(s == LOOM_ESTOPPED && strstr(loom_errmsg(), "stopped by signal 15"), "status %d: %s", s, loom_errmsg());
    /* Step 3 does not run; the last completed step is evaluated, and not
     * checkpointed again: step 2's checkpoint is the one `latest` names
     * (issue 17: a stop on a checkpoint step never rewrites it). */
    check_events(&r, "start, before 1, after 1, before 2, after 2, ckpt 2, before 3, eval 2, stop, end");
    char *latest;
    size_t len;
    CHECK(loom_file_read(check_tmp_path("stopped/latest"), &latest, &len) == LOOM_OK && !strncmp(latest, "step_00000002", 13),
          "latest checkpoint is not step 2");
    if (loom_path_exists(check_tmp_path("stopped/latest"))) free(latest);
}

static void observer_error_ends_run(void) {
    rec_t r;
    loom_status s = run_tiny(&r, "failed", 0, 2);
    CHECK(s == LOOM_EIO && strstr(loom_errmsg(), "fails at step 2"), "status %d: %s", s, loom_errmsg());
    /* The caller's observers run before the checkpoint policy: no
     * checkpoint at 2, and none at the end of a failed run. */
    check_events(&r, "start, before 1, after 1, before 2, after 2, stop, end");
    CHECK(r.stop_status == LOOM_EIO, "on_stop saw status %d", r.stop_status);
    CHECK(!loom_path_exists(check_tmp_path("failed/latest")), "a failed run left a checkpoint");
}

/* ---- one evaluation rule ---- */

static void eval_rule_known_answer(void) {
    const loom_backend_t *be;
    loom_backend_cpu_init(&be, 1);
    loom_dataset_t *ds;
    CHECK(loom_dataset_open(&ds, text_file(), 0.1) == LOOM_OK, "%s", loom_errmsg());
    size_t nval = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL);
    loom_gpt_config_t c = {.max_seq_len = 16, .vocab_size = loom_dataset_vocab_size(ds), .n_layer = 1, .n_head = 2, .channels = 16};
    loom_gpt_t *m;
    CHECK(loom_gpt_config_finish(&c) == LOOM_OK && loom_gpt_create(&m, &c, be) == LOOM_OK, "%s", loom_errmsg());
    /* All-zero weights: every logit is 0, so every position's loss is ln(V). */
    double lnV = log((double)c.vocab_size);
    loom_eval_result_t r;
    CHECK(loom_eval_loss(m, ds, 2, 8, 0, &r) == LOOM_OK, "%s", loom_errmsg());
    CHECK(fabs(r.loss - lnV) < 1e-5, "loss %.7f, ln(%d) = %.7f", r.loss, c.vocab_size, lnV);
    CHECK(r.batches == (int)((nval - 1) / 16) && r.B == 2 && r.T == 8, "%d batches of %d x %d from %zu tokens", r.batches, r.B, r.T, nval);
    CHECK(loom_eval_loss(m, ds, 2, 8, 3, &r) == LOOM_OK && r.batches == 3, "capped: %d batches", r.batches);
    /* No target wraps past the split's end: single tokens score nval - 1. */
    CHECK(loom_eval_loss(m, ds, 1, 1, 0, &r) == LOOM_OK && r.batches == (int)nval - 1, "1 x 1: %d batches of %zu tokens", r.batches, nval);
    /* A split shorter than one batch: one sequence of what it holds. */
    int B = (int)nval, T = 16;
    CHECK(loom_eval_loss(m, ds, B, T, 0, &r) == LOOM_OK && r.B == 1 && r.T == 16 && r.batches == (int)((nval - 1) / 16),
          "short split: %d batches of %d x %d", r.batches, r.B, r.T);
    loom_gpt_free(m);
    loom_dataset_free(ds);
}

/* ---- one run-config writer and reader ---- */

static void run_config_round_trip(void) {
    const char *dir = check_tmp_path("cfg");
    loom_mkdir_p(dir);
    loom_run_config_t a, b;
    loom_run_config_defaults(&a);
    snprintf(a.format, sizeof a.format, "%s", LOOM_RUN_FORMAT);
    snprintf(a.data, sizeof a.data, "corpus.txt");
    snprintf(a.model, sizeof a.model, "gpt2-tiny");
    snprintf(a.grad_dtype, sizeof a.grad_dtype, "bf16");
    a.model_cfg = (loom_gpt_config_t){.max_seq_len = 64, .vocab_size = 300, .n_layer = 3, .n_head = 4, .channels = 32};
    loom_gpt_config_finish(&a.model_cfg);
    a.val_fraction = 0.25;
    a.steps = 1234567890123LL;
    a.lr = 3e-4;
    a.cuda_graphs = 1;
    a.tokenizer_hash = 0xfedcba9876543210ULL;
    CHECK(loom_run_config_write(dir, &a) == LOOM_OK, "%s", loom_errmsg());
    CHECK(loom_run_config_read(dir, &b) == LOOM_OK, "%s", loom_errmsg());
    CHECK(!strcmp(b.data, "corpus.txt") && !strcmp(b.model, "gpt2-tiny") && !strcmp(b.grad_dtype, "bf16") &&
              b.model_cfg.n_layer == 3 && b.model_cfg.padded_vocab_size == a.model_cfg.padded_vocab_size && b.val_fraction == 0.25 &&
              b.steps == a.steps && b.lr == 3e-4 && b.cuda_graphs == 1 && b.tokenizer_hash == a.tokenizer_hash,
          "read back differs");
}

/* What `loom train` wrote before the reader existed (no val_fraction). */
static void run_config_old_format(void) {
    const char *dir = check_tmp_path("oldcfg");
    loom_mkdir_p(dir);
    const char *old = "{\"format\": \"loom-run-1\", \"data\": \"/tmp/kjv.txt\", \"model\": \"gpt2-tiny\",\n"
                      " \"model_config\": {\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 256, \"n_positions\": 256,\n"
                      "   \"vocab_size\": 257, \"padded_vocab_size\": 320, \"parameters\": 3290880},\n"
                      " \"device\": \"cpu\", \"cuda_graphs\": false, \"batch\": 4, \"seq\": 64, \"steps\": 30, \"seed\": 1,\n"
                      " \"tokenizer_hash\": \"888f0a580d366e0a\"}\n";
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    loom_file_write_atomic(path, old, strlen(old));
    loom_run_config_t c;
    CHECK(loom_run_config_read(dir, &c) == LOOM_OK, "%s", loom_errmsg());
    CHECK(c.val_fraction == 0.1 && c.model_cfg.channels == 256 && c.model_cfg.padded_vocab_size == 320 && c.batch == 4 &&
              c.tokenizer_hash == 0x888f0a580d366e0aULL && !strcmp(c.data, "/tmp/kjv.txt"),
          "old config read as val_fraction %g, channels %d, padded %d", c.val_fraction, c.model_cfg.channels,
          c.model_cfg.padded_vocab_size);
    const char *foreign = "{\"format\": \"other-9\"}";
    loom_file_write_atomic(path, foreign, strlen(foreign));
    CHECK(loom_run_config_read(dir, &c) == LOOM_EFORMAT && strstr(loom_errmsg(), "other-9"), "foreign format: %s", loom_errmsg());
}

/* ---- the metrics log ---- */

static void count_row(void *ctx, const loom_metrics_row_t *r) {
    int *n = ctx;
    if (r->step == *n + 1 && r->loss == r->step * 0.5 && (r->step == 2 ? r->val_loss == 1.25 : isnan(r->val_loss))) (*n)++;
}

static void metrics_log_trim_on_resume(void) {
    const char *path = check_tmp_path("metrics.jsonl");
    loom_metrics_log_t *l;
    CHECK(loom_metrics_log_open(&l, path, -1) == LOOM_OK, "%s", loom_errmsg());
    for (int s = 1; s <= 4; s++) {
        loom_metrics_row_t row = {.step = s, .loss = s * 0.5, .val_loss = s == 2 ? 1.25 : -1, .grad_norm = s == 3 ? INFINITY : 1};
        CHECK(loom_metrics_log_write(l, &row) == LOOM_OK, "%s", loom_errmsg());
    }
    loom_metrics_log_close(l);
    char *text;
    size_t len;
    loom_file_read(path, &text, &len);
    CHECK(strstr(text, "\"grad_norm\":null") != NULL, "an inf norm is not written as null");
    free(text);
    /* A resume from the checkpoint of step 2 keeps steps 1 and 2 only. */
    CHECK(loom_metrics_log_open(&l, path, 2) == LOOM_OK, "%s", loom_errmsg());
    loom_metrics_log_close(l);
    int n = 0;
    CHECK(loom_metrics_log_scan(path, count_row, &n) == LOOM_OK && n == 2, "%d rows after the trim, wanted 2", n);
}

static void keep_row(void *ctx, const loom_metrics_row_t *r) { *(loom_metrics_row_t *)ctx = *r; }

/* Every number the writer writes comes back from the one reader (loom
 * plan reads step_s and mfu through it); what a line lacks is NAN. */
static void metrics_log_reads_back(void) {
    const char *path = check_tmp_path("metrics_all.jsonl");
    loom_metrics_log_t *l;
    loom_metrics_row_t w = {.step = 7, .loss = 3.5, .val_loss = 3.25, .has_comm_wait = 1, .comm_wait_s = 0.125,
                            .has_loss_scale = 1, .loss_scale = 65536, .skipped = 1, .lr = 6e-5, .grad_norm = INFINITY,
                            .tokens_per_s = 1234.5, .mfu = 0.25, .step_s = 0.5, .elapsed_s = 12.25, .has_energy = 1,
                            .energy_j_per_token = 0.75},
                       r = {0};
    CHECK(loom_metrics_log_open(&l, path, -1) == LOOM_OK && loom_metrics_log_write(l, &w) == LOOM_OK, "%s", loom_errmsg());
    loom_metrics_log_close(l);
    CHECK(loom_metrics_log_scan(path, keep_row, &r) == LOOM_OK, "%s", loom_errmsg());
    CHECK(r.step == 7 && r.loss == 3.5 && r.val_loss == 3.25 && r.has_comm_wait && r.comm_wait_s == 0.125 && r.has_loss_scale &&
              r.loss_scale == 65536 && r.skipped && fabs(r.lr - 6e-5) < 1e-12 && isnan(r.grad_norm) && r.tokens_per_s == 1234.5 &&
              r.mfu == 0.25 && r.step_s == 0.5 && r.elapsed_s == 12.25 && r.has_energy && r.energy_j_per_token == 0.75,
          "read back step %lld loss %g val %g wait %g scale %g skipped %d lr %g norm %g tok/s %g mfu %g step_s %g elapsed %g energy %g",
          r.step, r.loss, r.val_loss, r.comm_wait_s, r.loss_scale, r.skipped, r.lr, r.grad_norm, r.tokens_per_s, r.mfu, r.step_s,
          r.elapsed_s, r.energy_j_per_token);
    const char *old = "{\"step\":1,\"loss\":2.0,\"lr\":1e-3,\"tokens_per_s\":5.0,\"step_s\":0.25}\n";
    loom_file_write_atomic(path, old, strlen(old));
    CHECK(loom_metrics_log_scan(path, keep_row, &r) == LOOM_OK && r.step == 1 && r.step_s == 0.25 && isnan(r.mfu) &&
              isnan(r.val_loss) && !r.has_comm_wait && !r.has_loss_scale && !r.skipped && !r.has_energy,
          "an older line: mfu %g val %g", r.mfu, r.val_loss);
}

/* ---- shared flags ---- */

static void flag_table_choices(void) {
    int dtype = 99, recompute = 99, graphs = 99, grad = 99, batch = 0;
    loom_arg_t args[] = {loom_flag(LOOM_FLAG_DTYPE, &dtype), loom_flag(LOOM_FLAG_RECOMPUTE, &recompute),
                         loom_flag(LOOM_FLAG_CUDA_GRAPHS, &graphs), loom_flag(LOOM_FLAG_GRAD_DTYPE, &grad),
                         loom_flag_default(LOOM_FLAG_BATCH, &batch, "3")};
    int n = (int)(sizeof args / sizeof args[0]);
    char *none[] = {NULL};
    CHECK(loom_args_parse("t", "t", args, n, 0, none) == 0, "defaults");
    CHECK(dtype == -1 && recompute == LOOM_RECOMPUTE_NONE && graphs == -1 && grad == LOOM_DIST_FP32 && batch == 3,
          "defaults: dtype %d recompute %d graphs %d grad %d batch %d", dtype, recompute, graphs, grad, batch);
    char *set[] = {"--dtype", "bf16", "--recompute=all", "--cuda-graphs", "off", "--grad-dtype", "bf16", "--batch", "5"};
    CHECK(loom_args_parse("t", "t", args, n, 9, set) == 0, "parse");
    CHECK(dtype == LOOM_BF16 && recompute == LOOM_RECOMPUTE_ALL && graphs == 0 && grad == LOOM_DIST_BF16 && batch == 5,
          "set: dtype %d recompute %d graphs %d grad %d batch %d", dtype, recompute, graphs, grad, batch);
    char *bad[] = {"--recompute", "some"};
    CHECK(loom_args_parse("t", "t", args, n, 2, bad) == 2, "--recompute some accepted");
    char *bad2[] = {"--batch", "0"};
    CHECK(loom_args_parse("t", "t", args, n, 2, bad2) == 2, "--batch 0 accepted");
}

/* ---- the launcher ---- */

static int rank_job(int rank, void *ctx) {
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE"), *p = getenv("MASTER_PORT");
    if (!r || !w || !p || atoi(r) != rank || atoi(w) != 3 || atoi(p) <= 0) return 99;
    return rank == *(int *)ctx ? 7 : 0;
}

static void launcher_ranks_and_status(void) {
    int failing = -1, code = -1;
    loom_launch_t l = {.what = "test", .nproc = 3, .kill_after_s = 30, .run = rank_job, .ctx = &failing};
    CHECK(loom_launch_local(&l, &code) == LOOM_OK && code == 0, "all ranks: exit %d (%s)", code, loom_errmsg());
    failing = 1;
    CHECK(loom_launch_local(&l, &code) == LOOM_OK && code == 7, "rank 1 fails with 7: exit %d", code);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    CHECK(loom_launch_local(&l, &code) == LOOM_EINVAL, "launching inside a launched job was not refused");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
}

int main(void) {
    loom_log_quiet(1);
    check_tmpdir("train-loop");
    RUN(observer_points_in_order);
    RUN(observer_stop_request);
    RUN(observer_error_ends_run);
    RUN(eval_rule_known_answer);
    RUN(run_config_round_trip);
    RUN(run_config_old_format);
    RUN(metrics_log_trim_on_resume);
    RUN(metrics_log_reads_back);
    RUN(flag_table_choices);
    RUN(launcher_ranks_and_status);
    return check_main_end();
}
