#define _GNU_SOURCE
#include "plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef LOOM_HAVE_CUDA
static void *handle;
static char load_error[1024];

static void *try_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && !load_error[0]) snprintf(load_error, sizeof load_error, "%s", dlerror());
    else if (!h) (void)dlerror();
    return h;
}

static void *open_plugin(void) {
    const char *env = getenv("LOOM_CUDA_PLUGIN");
    if (env && *env) return try_open(env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char path[PATH_MAX + 64];
            static const char *const rel[] = {"/libloom_cuda.so", "/../libloom_cuda.so", "/../lib/loom/libloom_cuda.so"};
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
                snprintf(path, sizeof path, "%s%s", exe, rel[i]);
                if (access(path, F_OK) == 0) return try_open(path);
            }
        }
    }
    void *h = try_open("libloom_cuda.so");
    if (!h) snprintf(load_error, sizeof load_error, "libloom_cuda.so was not found beside %s; rebuild with `make` or set LOOM_CUDA_PLUGIN", n > 0 ? exe : "the executable");
    return h;
}
#endif

void *loom_cuda_symbol(const char *symbol, char *why, size_t why_size) {
#ifdef LOOM_HAVE_CUDA
    if (!handle) handle = open_plugin();
    if (!handle) {
        snprintf(why, why_size, "the CUDA plugin could not be loaded: %s", load_error);
        return NULL;
    }
    void *p = dlsym(handle, symbol);
    if (!p) snprintf(why, why_size, "the CUDA plugin has no %s; rebuild with `make`", symbol);
    return p;
#else
    (void)symbol;
    snprintf(why, why_size, "this loom was built without CUDA (nvcc was not found at build time, or NO_CUDA was set)");
    return NULL;
#endif
}
