/* generate: what `loom generate` shares with `loom serve` and the benches
 * (the engine flags and config, --quant, moving a model to a device). */
#ifndef LOOM_CLI_GENERATE_H
#define LOOM_CLI_GENERATE_H

#include "cli/args.h"
#include "serve/engine.h"

/* The loom_quant_mode of a --quant choice index (args.c's order). */
int loom_cli_quant_mode(int choice);
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
} loom_cli_engine_flags_t;

/* The engine's batch and cache-block flags (--block-size,
 * --max-batch-tokens, --max-seqs, in this order) bound to `ef`, a
 * loom_cli_engine_flags_t: rows for a command's flag table. */
#define LOOM_CLI_ENGINE_SIZE_FLAGS(ef)                                                                    \
    loom_flag(LOOM_FLAG_BLOCK_SIZE, &(ef).block_size), loom_flag(LOOM_FLAG_MAX_BATCH_TOKENS, &(ef).max_batch_tokens), \
        loom_flag(LOOM_FLAG_MAX_SEQS, &(ef).max_seqs)

/* The engine config those flags ask for: the KV cache's size and blocks,
 * the batch limits, --quant, --kv-dtype and --sparse. */
loom_status loom_cli_engine_flags_config(const loom_cli_engine_flags_t *ef, loom_engine_config_t *c);

/* Move a model loaded on the CPU to `device` ("cpu" leaves it): the same
 * weights in a new model on that backend (fp32); the CPU copy is freed. */
loom_status loom_cli_model_to_device(loom_gpt_t **m, const char *device);

#endif
