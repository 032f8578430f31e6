/* generate: what `loom generate` shares with `loom bench generate`. */
#ifndef LOOM_CLI_GENERATE_H
#define LOOM_CLI_GENERATE_H

#include "serve/engine.h"

/* An engine config from the command line's --kv-memory, --block-size,
 * --max-batch-tokens and --max-seqs. */
loom_status loom_cli_engine_config(const char *kv_memory, int block_size, int max_batch_tokens,
                                   int max_seqs, loom_engine_config_t *c);

#endif
