/* generate: what `loom generate` shares with `loom bench generate`. */
#ifndef LOOM_CLI_GENERATE_H
#define LOOM_CLI_GENERATE_H

#include "serve/engine.h"

/* An engine config from the command line's --kv-memory, --block-size,
 * --max-batch-tokens and --max-seqs. */
/* The loom_quant_mode of a --quant choice index (args.c's order). */
int loom_cli_quant_mode(int choice);
loom_status loom_cli_engine_config(const char *kv_memory, int block_size, int max_batch_tokens,
                                   int max_seqs, loom_engine_config_t *c);

/* Move a model loaded on the CPU to `device` ("cpu" leaves it): the same
 * weights in a new model on that backend (fp32); the CPU copy is freed. */
loom_status loom_cli_model_to_device(loom_gpt_t **m, const char *device);

#endif
