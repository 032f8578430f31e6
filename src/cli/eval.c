/* loom eval */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generate.h"
#include "model/sparse24.h"
#include "data/dataset.h"
#include "train/eval.h"

/* The data must be made with the run's tokenizer and fit the model. */
static loom_status check_data(const loom_dataset_t *ds, const char *data, const loom_tokenizer_t *tok, const loom_gpt_t *m, int T) {
    /* the run's own tokenizer may have fewer tokens than the model's rows (Qwen2's 151665 of 151936) */
    const loom_tokenizer_t *dt = loom_dataset_tokenizer(ds);
    int same_tok = tok && dt && loom_tokenizer_hash(dt) == loom_tokenizer_hash(tok);
    if (same_tok ? loom_dataset_vocab_size(ds) > m->cfg.vocab_size : loom_dataset_vocab_size(ds) != m->cfg.vocab_size)
        return loom_error(LOOM_EINVAL, "%s: vocabulary %d, but the run's model has %d; evaluate on data made with the run's tokenizer",
                          data, loom_dataset_vocab_size(ds), m->cfg.vocab_size);
    if (tok && dt && !same_tok)
        return loom_error(LOOM_EINVAL, "%s: tokenized with a different tokenizer than the run's; evaluate on data made with the run's tokenizer", data);
    if (T > m->cfg.max_seq_len) return loom_error(LOOM_EINVAL, "--seq %d is above the model's context of %d", T, m->cfg.max_seq_len);
    return LOOM_OK;
}

/* Without --data: the run's own data and held-out share, from its config. */
static loom_status run_data(const char *run, loom_source_kind kind, loom_run_config_t *rc, const char **data, double *val_fraction) {
    if (*data) return LOOM_OK;
    if (kind != LOOM_SOURCE_RUN) return loom_error(LOOM_EINVAL, "%s is a %s, which names no data; pass --data", run, loom_source_name(kind));
    LOOM_TRY(loom_run_config_read(run, rc));
    if (!rc->data[0]) return loom_error(LOOM_EINVAL, "%s/config.json names no data; pass --data", run);
    /* as given when it still names the data from here, else as resolved at the start (eval run from another folder) */
    *data = loom_path_exists(rc->data) || !rc->data_resolved[0] ? rc->data : rc->data_resolved;
    if (!loom_args_given("val-fraction")) *val_fraction = rc->val_fraction;
    return LOOM_OK;
}

int cmd_eval(int argc, char **argv) {
    const char *run, *data;
    int batch, seq, batches, threads, quant, kv_dtype;
    double val_fraction;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_RUN, &run),
        {"data", ARG_STR, &data, "", 0, 0,
         "text file (encoded with the model's own tokenizer), or folder of token shards from `loom tokenize`; none: the run's own data"},
        loom_flag(LOOM_FLAG_BATCH, &batch),
        loom_flag(LOOM_FLAG_SEQ, &seq),
        {"batches", ARG_INT, &batches, "0", 0, 1 << 30, "batches to score (0 = the whole split)"},
        loom_flag(LOOM_FLAG_VAL_FRACTION, &val_fraction),
        loom_flag(LOOM_FLAG_THREADS, &threads),
        loom_flag(LOOM_FLAG_QUANT, &quant),
        loom_flag(LOOM_FLAG_KV_DTYPE, &kv_dtype),
    };
    LOOM_ARGS_PARSE_OR_RETURN("eval", "loom eval --run runs/NAME [--data FILE_OR_DIR (default: the run's)] [flags]",
                              args, argc, argv);
    loom_opened_t R;
    loom_run_config_t rc;
    loom_dataset_t *ds = NULL;
    loom_eval_result_t ev;
    /* the inference forward scores without 2:4 copies (loom_eval_loss_infer takes int8 ones only) */
    loom_open_opts_t oo = loom_cli_open_opts("cpu", threads, quant, kv_dtype, LOOM_SPARSE_OFF);
    loom_status s = loom_open(run, &oo, &R);
    if (s == LOOM_OK) s = run_data(run, R.kind, &rc, &data, &val_fraction);
    /* a text file in the model's own tokens (a GGUF's or Hugging Face folder's tokenizer; a
     * run trained on a text file has the byte-level one, as training read it) */
    if (s == LOOM_OK) s = loom_dataset_open_tok(&ds, data, val_fraction, R.tok);
    int T = seq ? seq : (R.model ? R.model->cfg.max_seq_len : 0);
    if (s == LOOM_OK) s = check_data(ds, data, R.tok, R.model, T);
    /* --quant, --kv-dtype given (even none, fp32): scored through the inference forward */
    /* a GGUF's stored blocks too: they are what the model computes with (its fp32 copy is given back) */
    if (s == LOOM_OK && (R.weights.quant || R.model->file_q || kv_dtype || loom_args_given("quant") || loom_args_given("kv-dtype")))
        s = loom_eval_loss_infer(R.model, R.weights.quant, R.kv_dtype, ds, batch, T, batches, &ev);
    else if (s == LOOM_OK) s = loom_eval_loss(R.model, ds, batch, T, batches, &ev);
    if (s == LOOM_OK)
        printf("val_loss %.6f (perplexity %.4f, step %lld, %d batches of %d x %d tokens)\n", ev.loss, exp(ev.loss), R.state.step,
               ev.batches, ev.B, ev.T);
    loom_dataset_free(ds);
    loom_open_close(&R);
    return loom_exit_report("eval", s);
}
