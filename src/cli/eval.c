/* loom eval */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/runload.h"
#include "data/dataset.h"
#include "train/eval.h"

/* The data must be made with the run's tokenizer and fit the model. */
static loom_status check_data(const loom_dataset_t *ds, const char *data, const loom_tokenizer_t *tok, const loom_gpt_t *m, int T) {
    if (loom_dataset_vocab_size(ds) != m->cfg.vocab_size)
        return loom_error(LOOM_EINVAL, "%s: vocabulary %d, but the run's model has %d; evaluate on data made with the run's tokenizer",
                          data, loom_dataset_vocab_size(ds), m->cfg.vocab_size);
    if (tok && loom_dataset_tokenizer(ds) && loom_tokenizer_hash(loom_dataset_tokenizer(ds)) != loom_tokenizer_hash(tok))
        return loom_error(LOOM_EINVAL, "%s: tokenized with a different tokenizer than the run's; evaluate on data made with the run's tokenizer", data);
    if (T > m->cfg.max_seq_len) return loom_error(LOOM_EINVAL, "--seq %d is above the model's context of %d", T, m->cfg.max_seq_len);
    return LOOM_OK;
}

/* Without --data: the run's own data and held-out share, from its config. */
static loom_status run_data(const char *run, loom_run_config_t *rc, const char **data, double *val_fraction) {
    if (*data) return LOOM_OK;
    LOOM_TRY(loom_run_config_read(run, rc));
    if (!rc->data[0]) return loom_error(LOOM_EINVAL, "%s/config.json names no data; pass --data", run);
    *data = rc->data;
    if (!loom_args_given("val-fraction")) *val_fraction = rc->val_fraction;
    return LOOM_OK;
}

int cmd_eval(int argc, char **argv) {
    const char *run, *data;
    int batch, seq, batches, threads;
    double val_fraction;
    const loom_arg_t args[] = {
        {"run", ARG_STR, &run, NULL, 0, 0, "run folder written by `loom train --out`"},
        {"data", ARG_STR, &data, NULL, 0, 0, "text file or shard folder; its validation split is scored (default: the run's own --data)"},
        {"batch", ARG_INT, &batch, "8", 1, 1 << 20, "sequences per batch"},
        {"seq", ARG_INT, &seq, "0", 0, 1 << 20, "tokens per sequence (0 = the model's context)"},
        {"batches", ARG_INT, &batches, "0", 0, 1 << 30, "batches to score (0 = the whole split)"},
        {"val-fraction", ARG_FLOAT, &val_fraction, "0.1", 0, 0.5, "share of a text file held out (as in training)"},
        {"threads", ARG_INT, &threads, "0", 0, 4096, "CPU threads (0 = all cores)"},
    };
    int r = loom_args_parse("eval", "loom eval --run runs/NAME --data FILE_OR_DIR [flags]", args,
                            (int)(sizeof args / sizeof args[0]), argc, argv);
    if (r == 1) return 0;
    if (r) return 2;
    if (!run) {
        fprintf(stderr, "loom eval: no --run; pass the folder of a `loom train --out`\n");
        return 2;
    }
    loom_gpt_t *m;
    loom_tokenizer_t *tok;
    loom_ckpt_state_t st;
    loom_run_config_t rc;
    loom_status s = loom_run_open(run, threads, &m, &tok, &st);
    if (s == LOOM_OK && (s = run_data(run, &rc, &data, &val_fraction)) != LOOM_OK) {
        if (tok) loom_tokenizer_free(tok);
        loom_gpt_free(m);
    }
    if (s != LOOM_OK) {
        fprintf(stderr, "loom eval: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    loom_dataset_t *ds = NULL;
    s = loom_dataset_open(&ds, data, val_fraction);
    int T = seq ? seq : m->cfg.max_seq_len;
    if (s == LOOM_OK) s = check_data(ds, data, tok, m, T);
    loom_eval_result_t ev;
    if (s == LOOM_OK) s = loom_eval_loss(m, ds, batch, T, batches, &ev);
    if (s == LOOM_OK) printf("val_loss %.4f (step %lld, %d batches of %d x %d tokens)\n", ev.loss, st.step, ev.batches, ev.B, ev.T);
    loom_dataset_free(ds);
    if (tok) loom_tokenizer_free(tok);
    loom_gpt_free(m);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom eval: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return 0;
}
