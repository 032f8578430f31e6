/* loom prune: 2:4 structured sparsity of a run's linear weights into a new
 * run; and the --keep-sparsity observer of `loom train`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prune.h"
#include "ckpt/open.h"
#include "model/quant.h"
#include "model/sparse24.h"

/* Copy dir/name from src to dst when src has it. */
static loom_status copy_file(const char *src, const char *dst, const char *name) {
    char a[4200], b[4200], *data;
    size_t n;
    snprintf(a, sizeof a, "%s/%s", src, name);
    snprintf(b, sizeof b, "%s/%s", dst, name);
    if (!loom_path_exists(a)) return LOOM_OK;
    LOOM_TRY(loom_file_read(a, &data, &n));
    loom_status s = loom_file_write_atomic(b, data, n);
    free(data);
    return s;
}

static loom_status prune_run(const char *run, const char *out, int force, int threads) {
    loom_opened_t R;
    loom_source_kind kind;
    LOOM_TRY(loom_open_detect(run, &kind));
    if (kind != LOOM_SOURCE_RUN) /* the new run copies the old one's config.json and tokenizer */
        return loom_error(LOOM_EINVAL, "%s is a %s; loom prune makes a new run from a run folder (`loom train --out`)", run, loom_source_name(kind));
    loom_open_opts_t oo = loom_open_opts_default();
    oo.threads = threads, oo.weights.sparse = LOOM_SPARSE_OFF; /* the dense weights are what gets pruned */
    LOOM_TRY(loom_open(run, &oo, &R));
    loom_status s = loom_prune24_model(R.model);
    if (s == LOOM_OK) s = loom_run_prepare(out, force);
    if (s == LOOM_OK) s = copy_file(run, out, "config.json");
    if (s == LOOM_OK) s = copy_file(run, out, "tokenizer.json");
    if (s == LOOM_OK) s = loom_run_save_checkpoint(out, R.model, &R.state, 1);
    if (s == LOOM_OK) {
        loom_sparsity_mask_t *k = loom_sparsity_mask_take(R.model);
        printf("pruned %s to 2:4 in %s: %.1f%% of the linear weights are zero (step %lld)\n", run, out,
               100 * loom_sparsity_mask_share(k), R.state.step);
        loom_sparsity_mask_free(k);
    }
    loom_open_close(&R);
    return s;
}

int cmd_prune(int argc, char **argv) {
    const char *run, *out, *sparsity;
    int threads, force;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_RUN, &run),
        {"sparsity", ARG_STR, &sparsity, "2:4", 0, 0, "pattern: 2:4 (two of every four weights along the input dimension are zeroed, the smallest in magnitude)"},
        {"out", ARG_STR, &out, NULL, 0, 0, "folder of the pruned run (fine-tune it with loom train --init-from-run OUT --keep-sparsity)"},
        {"force", ARG_BOOL, &force, "0", 0, 0, "replace loom's files in an existing --out"},
        loom_flag(LOOM_FLAG_THREADS, &threads),
    };
    int r = loom_args_parse("prune", "loom prune --run runs/NAME --sparsity 2:4 --out runs/NAME-24", args,
                            (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r) return 2;
    if (!run || !out) {
        fprintf(stderr, "loom prune: --run and --out are both needed (loom prune --help)\n");
        return 2;
    }
    if (strcmp(sparsity, "2:4") != 0) {
        fprintf(stderr, "loom prune: --sparsity %s: only 2:4 exists (what sparse tensor cores run)\n", sparsity);
        return 2;
    }
    loom_status s = prune_run(run, out, force, threads);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom prune: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return 0;
}

/* ---- --keep-sparsity ---- */

/* The observer first, so one allocation holds both (ctx points at it). */
typedef struct {
    loom_train_observer_t ob;
    loom_sparsity_mask_t *k;
} keep_t;

static loom_status keep_start(void *ctx, loom_train_run_t *run) {
    keep_t *k = ctx;
    k->k = loom_sparsity_mask_take(run->model);
    double share = loom_sparsity_mask_share(k->k);
    if (share < 0.25)
        return loom_error(LOOM_EINVAL, "--keep-sparsity: only %.1f%% of the linear weights are zero; start from a pruned run (loom prune, then --init-from-run)",
                          100 * share);
    return LOOM_OK;
}

/* After the step's AdamW update: pruned weights back to zero. */
static loom_status keep_after(void *ctx, loom_train_run_t *run, const loom_step_record_t *rec) {
    loom_sparsity_mask_apply(((keep_t *)ctx)->k, run->model);
    return LOOM_OK;
}

static void keep_free(void *ctx) {
    loom_sparsity_mask_free(((keep_t *)ctx)->k);
    free(ctx);
}

loom_train_observer_t *loom_keep_sparsity_observer(void) {
    keep_t *k = loom_calloc(1, sizeof *k);
    k->ob = (loom_train_observer_t){.name = "keep-sparsity", .ctx = k, .on_start = keep_start,
                                    .after_step = keep_after, .free = keep_free};
    return &k->ob;
}
