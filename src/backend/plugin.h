/* plugin: the CUDA parts live in build/libloom_cuda.so, loaded with dlopen
 * the first time something asks for them. A CPU run of a CUDA build then
 * never maps cuBLAS, cuDNN or NCCL (about 200 MB of resident pages and a
 * slower start), and a machine without a driver never notices them.
 *
 * The plugin is looked for at $LOOM_CUDA_PLUGIN, then beside the running
 * executable and one folder up (build/loom and build/tests/ both find
 * build/libloom_cuda.so), then on the library path. */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include <stddef.h>

/* Address of `symbol` in the CUDA plugin, or NULL with the reason (no CUDA
 * in this build, plugin not found, a library it needs missing) in `why`. */
void *loom_cuda_symbol(const char *symbol, char *why, size_t why_size);

#endif
