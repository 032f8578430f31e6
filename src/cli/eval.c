/* loom eval */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "cli/runload.h"
#include "model/quant.h"
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
    int batch, seq, batches, threads, quant;
    double val_fraction;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_RUN, &run),
        loom_flag(LOOM_FLAG_DATA, &data), /* default: the run's own */
        loom_flag(LOOM_FLAG_BATCH, &batch),
        loom_flag(LOOM_FLAG_SEQ, &seq),
        {"batches", ARG_INT, &batches, "0", 0, 1 << 30, "batches to score (0 = the whole split)"},
        loom_flag(LOOM_FLAG_VAL_FRACTION, &val_fraction),
        loom_flag(LOOM_FLAG_THREADS, &threads),
        loom_flag(LOOM_FLAG_QUANT, &quant),
    };
    LOOM_ARGS_PARSE_OR_RETURN("eval", "loom eval --run runs/NAME [--data FILE_OR_DIR (default: the run's)] [flags]",
                              args, argc, argv);
    loom_opened_run_t R;
    loom_run_config_t rc;
    loom_dataset_t *ds = NULL;
    loom_eval_result_t ev;
    loom_status s = loom_run_open(run, threads, &R);
    if (s == LOOM_OK) s = run_data(run, &rc, &data, &val_fraction);
    if (s == LOOM_OK) s = loom_dataset_open(&ds, data, val_fraction);
    int T = seq ? seq : (R.model ? R.model->cfg.max_seq_len : 0);
    if (s == LOOM_OK) s = check_data(ds, data, R.tok, R.model, T);
    int qm = loom_cli_quant_mode(quant);
    if (s == LOOM_OK && qm == LOOM_QUANT_W8A8)
        s = loom_error(LOOM_EINVAL, "--quant w8a8: eval runs the training forward, which has no int8-activation path; use --quant int8 (w8a32) here, or loom generate / loom bench generate for w8a8");
    if (s == LOOM_OK && qm != LOOM_QUANT_NONE) loom_quant_fake(R.model);
    if (s == LOOM_OK) s = loom_eval_loss(R.model, ds, batch, T, batches, &ev);
    if (s == LOOM_OK) printf("val_loss %.4f (step %lld, %d batches of %d x %d tokens)\n", ev.loss, R.state.step, ev.batches, ev.B, ev.T);
    loom_dataset_free(ds);
    loom_run_close(&R);
    return loom_exit_report("eval", s);
}
