/* generate: what `loom generate` shares with `loom serve` and the benches
 * (the engine flags and config, the loom_open options of the flags). */
#ifndef LOOM_CLI_GENERATE_H
#define LOOM_CLI_GENERATE_H

#include "ckpt/open.h"
#include "cli/args.h"
#include "serve/engine.h"

/* The loom_open options (ckpt/open.h) that --device, --threads, --quant,
 * --kv-dtype and --sparse ask for (choice indexes in args.c's order). */
loom_open_opts_t loom_cli_open_opts(const char *device, int threads, int quant, int kv_dtype, int sparse);
/* An engine config from the command line's --kv-memory, --block-size,
 * --max-batch-tokens and --max-seqs. */
loom_status loom_cli_engine_config(const char *kv_memory, int block_size, int max_batch_tokens,
                                   int max_seqs, loom_engine_config_t *c);

/* The engine settings that loom serve and loom generate both take. */
typedef struct {
    const char *device, *kv_memory;
    int block_size, max_batch_tokens, max_seqs, quant, kv_dtype, sparse;
    int no_prefix_cache; /* --no-prefix-cache (where a command has it) */
    int speculate;       /* --speculate N: draft tokens by prompt lookup (where a command has it) */
    double prefill_ratio; /* --prefill-ratio X (serve/step_budget.h) */
} loom_cli_engine_flags_t;

/* The engine's batch and cache-block flags (--block-size,
 * --max-batch-tokens, --max-seqs, --prefill-ratio, in this order) bound to
 * `ef`, a loom_cli_engine_flags_t: rows for a command's flag table. */
#define LOOM_CLI_ENGINE_SIZE_FLAGS(ef)                                                                    \
    loom_flag(LOOM_FLAG_BLOCK_SIZE, &(ef).block_size), loom_flag(LOOM_FLAG_MAX_BATCH_TOKENS, &(ef).max_batch_tokens), \
        loom_flag(LOOM_FLAG_MAX_SEQS, &(ef).max_seqs), loom_flag(LOOM_FLAG_PREFILL_RATIO, &(ef).prefill_ratio)

/* The loom_open options those flags ask for (device, --quant, --kv-dtype, --sparse). */
loom_open_opts_t loom_cli_engine_flags_open(const loom_cli_engine_flags_t *ef, int threads);
/* The engine config those flags ask for: the KV cache's size and blocks,
 * the batch limits. */
loom_status loom_cli_engine_flags_config(const loom_cli_engine_flags_t *ef, loom_engine_config_t *c);
/* Engine config `c` for model `m` as loom_open made it: its int8 or 2:4
 * weights and the KV cache's element type. */
void loom_cli_engine_config_model(loom_engine_config_t *c, const loom_opened_t *m);
/* The chat template of a run (cli/serve.c; loom export writes it into a
 * GGUF): FILE `flag` when non-NULL, else DIR/chat_template.txt, else the
 * chat_template of DIR/tokenizer_config.json (a Hugging Face folder; it
 * also sets tok's BOS/EOS) or a GGUF file's tokenizer.chat_template; *out
 * malloc'd, NULL when there is none (the fixed "{role}: {content}" form). */
loom_status loom_cli_chat_template(const char *dir, const char *flag, loom_tokenizer_t *tok, char **out);

#endif
