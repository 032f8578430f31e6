/* bench_llama: llama.cpp beside `loom bench generate`, on the same weights.
 * llama-bench (one stream: prompt processing and token generation) and
 * llama-batched-bench (parallel sequences in one batch, as loom's engine)
 * on a GGUF of the model loom measured: with --quant, a Q8_0 file (loom's
 * int8 rows against llama.cpp's Q8_0, the same format), else f32. Their
 * figures are parsed and printed beside loom's with ratios. */
#ifndef LOOM_CLI_BENCH_LLAMA_H
#define LOOM_CLI_BENCH_LLAMA_H

typedef struct {
    const char *bin;   /* llama-bench; its folder holds llama-batched-bench */
    const char *gguf;  /* --gguf: the weights as GGUF ("" or NULL: made from run) */
    const char *run;   /* --run: a run folder (exported here) or a .gguf file ("" or NULL: none) */
    int quant;         /* loom_quant_mode of loom's rows: NONE wants f32, else Q8_0 */
    const char *label; /* loom's rows, e.g. "loom w8a8" */
    int plen, gen, threads, repeat;
    double loom_one;   /* loom's one-request-at-a-time decode tokens/s, median (0: that level was not run) */
    int clients;       /* the concurrency of loom_many (0: none measured) */
    double loom_many;  /* loom's output tokens/s at `clients` requests in flight */
} loom_bench_llama_t;

/* Run the llama.cpp peer rows and print them, or a SKIP line saying why
 * they cannot run (no build, no weights). Never fails loom's bench. */
void loom_bench_llama_peer(const loom_bench_llama_t *p);

#endif
