/* loom bench serve: placeholder until the load generator lands. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_bench_serve(int argc, char **argv) {
    fprintf(stderr, "loom bench serve: not built yet\n");
    return 1;
}
