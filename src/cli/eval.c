/* loom eval */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/runload.h"
#include "data/dataset.h"

int cmd_eval(int argc, char **argv) {
    const char *run, *data;
    int batch, seq, batches, threads;
    double val_fraction;
    const loom_arg_t args[] = {
        {"run", ARG_STR, &run, NULL, 0, 0, "run folder written by `loom train --out`"},
        {"data", ARG_STR, &data, NULL, 0, 0, "text file or shard folder; its validation split is scored"},
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
    if (!run || !data) {
        fprintf(stderr, "loom eval: pass both --run (a `loom train --out` folder) and --data\n");
        return 2;
    }
    loom_gpt_t *m;
    loom_tokenizer_t *tok;
    loom_ckpt_state_t st;
    loom_status s = loom_run_open(run, threads, &m, &tok, &st);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom eval: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    loom_dataset_t *ds = NULL;
    s = loom_dataset_open(&ds, data, val_fraction);
    int T = seq ? seq : m->cfg.max_seq_len;
    if (s == LOOM_OK && loom_dataset_vocab_size(ds) != m->cfg.vocab_size)
        s = loom_error(LOOM_EINVAL, "%s: vocabulary %d, but the run's model has %d; evaluate on data made with the run's tokenizer",
                       data, loom_dataset_vocab_size(ds), m->cfg.vocab_size);
    else if (s == LOOM_OK && tok && loom_dataset_tokenizer(ds) && loom_tokenizer_hash(loom_dataset_tokenizer(ds)) != loom_tokenizer_hash(tok))
        s = loom_error(LOOM_EINVAL, "%s: tokenized with a different tokenizer than the run's; evaluate on data made with the run's tokenizer", data);
    else if (s == LOOM_OK && T > m->cfg.max_seq_len)
        s = loom_error(LOOM_EINVAL, "--seq %d is above the model's context of %d", T, m->cfg.max_seq_len);
    else if (s == LOOM_OK && loom_dataset_ntokens(ds, LOOM_SPLIT_VAL) < 2)
        s = loom_error(LOOM_EINVAL, "%s: no validation tokens to score", data);
    if (s == LOOM_OK) {
        size_t nval = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL), per = (size_t)batch * T;
        if (nval - 1 < per) { /* shrink to what the split holds */
            batch = 1;
            if ((size_t)T > nval - 1) T = (int)(nval - 1);
            per = (size_t)T;
        }
        int nb = (int)((nval - 1) / per);
        if (batches > 0 && batches < nb) nb = batches;
        int *in = malloc(per * sizeof(int)), *tg = malloc(per * sizeof(int));
        double sum = 0;
        for (int i = 0; i < nb && s == LOOM_OK; i++) {
            float l;
            loom_dataset_batch(ds, LOOM_SPLIT_VAL, (size_t)i * per, batch, T, in, tg);
            s = loom_gpt_forward(m, in, tg, batch, T, 0.0f, &l);
            sum += l;
        }
        free(in);
        free(tg);
        if (s == LOOM_OK)
            printf("val_loss %.4f (step %lld, %d batches of %d x %d tokens)\n", sum / nb, st.step, nb, batch, T);
    }
    loom_dataset_free(ds);
    if (tok) loom_tokenizer_free(tok);
    loom_gpt_free(m);
    if (s != LOOM_OK) {
        fprintf(stderr, "loom eval: %s\n", loom_errmsg());
        return loom_exit_code(s);
    }
    return 0;
}
