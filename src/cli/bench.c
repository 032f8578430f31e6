/* loom bench: training throughput side by side with PyTorch (bench train),
 * where a step's time goes (bench ops); bench dist is in its own file.
 *
 * bench train runs each implementation in its own process (loom in a forked
 * child, PyTorch as bench/torch_train.py under /usr/bin/python3) so that
 * each one's peak resident memory is its own, and alternates them a few
 * steps at a time: on a shared machine absolute times drift, while the
 * ratio of steps measured side by side holds. The parent does no compute
 * (no OpenMP team exists before the fork). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/devices.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/stats.h"
#include "model/gpt.h"
#include "train/step.h"
#include "train/step_graph.h"

#define BENCH_VOCAB 50257 /* GPT-2's */
#define MAX_TIMES 4096

/* ---- child processes spoken to over pipes, one line per message ---- */

typedef struct {
    pid_t pid;
    FILE *to;   /* commands */
    FILE *from; /* replies */
} child_t;

typedef void (*child_fn)(FILE *in, FILE *out, void *arg);

/* Start `fn` in a forked child (argv == NULL) or exec argv. */
static int child_start(child_t *c, child_fn fn, void *arg, char *const argv[]) {
    int down[2], up[2];
    if (pipe(down) != 0) return -1;
    if (pipe(up) != 0) {
        close(down[0]), close(down[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        if (argv) {
            dup2(down[0], 0);
            dup2(up[1], 1);
            close(down[0]);
            close(up[1]);
            execv(argv[0], argv);
            fprintf(stderr, "loom bench: cannot run %s: %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        FILE *in = fdopen(down[0], "r"), *out = fdopen(up[1], "w");
        fn(in, out, arg);
        fflush(out);
        _exit(0);
    }
    close(down[0]);
    close(up[1]);
    c->pid = pid;
    c->to = fdopen(down[1], "w");
    c->from = fdopen(up[0], "r");
    return 0;
}

/* Send a command and read the reply line into buf; -1 if the child died. */
static int child_ask(child_t *c, const char *cmd, char *buf, size_t n) {
    if (cmd) {
        fprintf(c->to, "%s\n", cmd);
        fflush(c->to);
    }
    return fgets(buf, (int)n, c->from) ? 0 : -1;
}

static void child_stop(child_t *c) {
    if (!c->pid) return;
    fprintf(c->to, "quit\n");
    fclose(c->to);
    fclose(c->from);
    int st;
    waitpid(c->pid, &st, 0);
    c->pid = 0;
}

/* ---- the loom side ---- */

typedef struct {
    const char *model, *device, *dtype, *gemm;
    int batch, seq, threads;
    int robust_peak; /* measure the CPU peak at 2048^3 too (bench train's first round) */
} loom_side_t;

static long long maxrss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)ru.ru_maxrss * 1024;
}

static loom_status loom_side_build(const loom_side_t *s, const loom_backend_t **be, loom_gpt_t **m,
                                   int **tok, int **tgt) {
    if (s->gemm && *s->gemm) setenv("LOOM_GEMM", s->gemm, 1);
    int dt = loom_dtype_parse(s->dtype);
    if (dt < 0) return loom_error(LOOM_EINVAL, "--dtype %s: use fp32, tf32, bf16 or fp16", s->dtype);
    LOOM_TRY(loom_backend_open(be, s->device, s->threads, (loom_dtype)dt));
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_gpt_preset(&cfg, s->model));
    cfg.vocab_size = BENCH_VOCAB;
    if (s->seq > cfg.max_seq_len) cfg.max_seq_len = s->seq;
    LOOM_TRY(loom_gpt_init(m, &cfg, *be, 1337));
    size_t n = (size_t)s->batch * s->seq;
    *tok = loom_calloc(n, sizeof(int));
    *tgt = loom_calloc(n, sizeof(int));
    loom_rng_t rng;
    loom_rng_seed(&rng, 42);
    for (size_t i = 0; i < n; i++) {
        (*tok)[i] = (int)(loom_rng_u64(&rng) % BENCH_VOCAB);
        (*tgt)[i] = (int)(loom_rng_u64(&rng) % BENCH_VOCAB);
    }
    return LOOM_OK;
}

static const loom_optim_t bench_opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};

/* The loom child: same protocol as bench/torch_train.py; its "ready" line
 * carries the peak FLOP/s and how it was found. */
/* One training step: the device-resident one when sg is set (the step
 * `loom train` runs on a GPU, CUDA graphs replayed), else the host one. */
static loom_status bench_step(loom_gpt_t *m, loom_step_graph_t *sg, const int *tok, const int *tgt, const loom_side_t *s, int t,
                              float *loss, float *norm) {
    if (!sg) return loom_train_step(m, tok, tgt, s->batch, s->seq, 1, &bench_opt, 3e-4f, t, loss, norm);
    loom_step_result_t r;
    LOOM_TRY(loom_step_graph_run(sg, tok, tgt, s->batch, s->seq, 1, &bench_opt, 3e-4f, t, NULL, &r));
    *loss = r.loss, *norm = r.grad_norm;
    return LOOM_OK;
}

static void loom_child(FILE *in, FILE *out, void *arg) {
    const loom_side_t *s = arg;
    const loom_backend_t *be;
    loom_gpt_t *m;
    int *tok, *tgt;
    if (loom_side_build(s, &be, &m, &tok, &tgt) != LOOM_OK) {
        fprintf(out, "error %s\n", loom_errmsg());
        return;
    }
    int t = 1;
    float loss, norm;
    loom_step_graph_t *sg = NULL;
    if (loom_step_graph_supported(be, NULL, 0) && loom_step_graph_init(&sg, m, 1) != LOOM_OK) {
        fprintf(out, "error %s\n", loom_errmsg());
        return;
    }
    for (int w = 0; w < (sg ? LOOM_STEP_GRAPH_WARMUP + 1 : 1); w++) /* warm-up, and the graphs' capture */
        if (bench_step(m, sg, tok, tgt, s, t++, &loss, &norm) != LOOM_OK) {
            fprintf(out, "error %s\n", loom_errmsg());
            return;
        }
    double peak = be->peak_flops;
    char how[192];
    snprintf(how, sizeof how, "%s", be->peak_source ? be->peak_source : "unknown");
    if (s->robust_peak && !(be->caps & LOOM_CAP_DEVICE_MEMORY)) {
        /* The quick 1024^3 peak of the open can come out low on a busy
         * machine, and the model's larger GEMMs then beat it. */
        char how2[192];
        double p = loom_backend_cpu_measure_peak(2048, 5, how2, sizeof how2);
        if (p > peak) peak = p, snprintf(how, sizeof how, "%s", how2);
    }
    fprintf(out, "ready %.6g %s\n", peak, how);
    fflush(out);
    char line[256];
    while (fgets(line, sizeof line, in)) {
        int k;
        if (sscanf(line, "run %d", &k) == 1) {
            fprintf(out, "times");
            for (int i = 0; i < k; i++) {
                double t0 = loom_now();
                loom_status st = bench_step(m, sg, tok, tgt, s, t++, &loss, &norm);
                if (st != LOOM_OK) {
                    fprintf(out, " error %s\n", loom_errmsg());
                    fflush(out);
                    return;
                }
                fprintf(out, " %.6f", loom_now() - t0);
            }
            fprintf(out, "\n");
        } else if (strncmp(line, "mem", 3) == 0) {
            fprintf(out, "maxrss %lld\n", (be->caps & LOOM_CAP_DEVICE_MEMORY) ? (long long)loom_gpu_peak_bytes() : maxrss_bytes());
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
        fflush(out);
    }
    loom_step_graph_free(sg);
    loom_gpt_free(m);
    free(tok);
    free(tgt);
}

/* ---- bench train ---- */

typedef struct {
    const char *label;
    loom_side_t ls;     /* a loom side's settings */
    char *const *argv;  /* the PyTorch side's command (NULL for a loom side) */
    int dead, round;    /* dead: it failed in round `round` (-1: never started; why says how) */
    char why[400];
    double times[MAX_TIMES];
    int n;
    long long maxrss;   /* the highest of its rounds */
    double peak;        /* FLOP/s its "ready" line reported (loom sides) */
    char peak_source[192];
} side_t;

static double median(const double *v, int n) {
    double tmp[MAX_TIMES];
    memcpy(tmp, v, (size_t)n * sizeof(double));
    return loom_median(tmp, n);
}

static double fastest(const double *v, int n) {
    double b = n ? v[0] : 0;
    for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
    return b;
}

/* Parse "times a b c" into the side's list; 0 on success. */
static int take_times(side_t *s, const char *line) {
    if (strncmp(line, "times", 5) != 0) return -1;
    const char *p = line + 5;
    char *end;
    for (;;) {
        double v = strtod(p, &end);
        if (end == p) break;
        if (s->n < MAX_TIMES) s->times[s->n++] = v;
        p = end;
    }
    return *p == '\n' || *p == 0 ? 0 : -1; /* " error ..." after the times: the step failed */
}

/* The torch script: --torch-script, else bench/ beside the repository root
 * the binary was built in (build/loom), else ./bench. */
static void torch_script_path(char *out, size_t n, const char *given) {
    if (given) {
        snprintf(out, n, "%s", given);
        return;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (slash) *slash = 0;
        }
        snprintf(out, n, "%s/bench/torch_train.py", exe);
        if (access(out, R_OK) == 0) return;
    }
    snprintf(out, n, "bench/torch_train.py");
}

/* The side failed in `round`: wait for its process and say how it ended
 * (the exit status or the signal: the OOM killer sends SIGKILL), with
 * the message it printed when there is one. */
static void side_died(side_t *s, child_t *c, int round, const char *line, const char *when) {
    s->dead = 1;
    s->round = round;
    char msg[256] = "";
    const char *err = strstr(line, "error ");
    if (err) snprintf(msg, sizeof msg, ": %s", err + 6);
    msg[strcspn(msg, "\n")] = 0;
    fclose(c->to);
    fclose(c->from);
    int st = 0;
    char how[128] = "still running";
    if (waitpid(c->pid, &st, 0) == c->pid) {
        if (WIFSIGNALED(st))
            snprintf(how, sizeof how, "killed by signal %d (%s%s)", WTERMSIG(st), strsignal(WTERMSIG(st)),
                     WTERMSIG(st) == SIGKILL ? "; the OOM killer sends it when memory runs out" : "");
        else
            snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
    }
    c->pid = 0;
    snprintf(s->why, sizeof s->why, "%s in round %d, %s%s", when, round + 1, how, msg);
}

/* The pause before each side's timed steps: OpenBLAS's workers (in
 * PyTorch and in loom with --gemm blas) spin for tens of milliseconds
 * after their last call, here the warm-up step's. */
#define SETTLE_US 300000

/* One round of one side: start its process, wait for "ready" (building
 * and the warm-up step are not timed), time `steps` steps, read its peak
 * memory, stop it. The first round of a loom side also measures the peak
 * robustly. */
static void side_round(side_t *s, int round, int steps) {
    child_t c = {0};
    s->ls.robust_peak = round == 0;
    if (child_start(&c, s->argv ? NULL : loom_child, &s->ls, s->argv) != 0) {
        s->dead = 1;
        s->round = round;
        snprintf(s->why, sizeof s->why, "fork: %s", strerror(errno));
        return;
    }
    char line[65536] = "", cmd[32];
    if (child_ask(&c, NULL, line, sizeof line) != 0 || strncmp(line, "ready", 5) != 0)
    {
        side_died(s, &c, round, line, "failed before it was ready");
        return;
    }
    double peak = 0;
    char src[192] = "";
    if (!s->argv && sscanf(line, "ready %lf %191[^\n]", &peak, src) >= 1 && peak > s->peak) /* the best of its rounds */
        s->peak = peak, snprintf(s->peak_source, sizeof s->peak_source, "%s", src);
    usleep(SETTLE_US);
    snprintf(cmd, sizeof cmd, "run %d", steps);
    line[0] = 0;
    if (child_ask(&c, cmd, line, sizeof line) != 0 || take_times(s, line) != 0)
    {
        side_died(s, &c, round, line, "died during its steps");
        return;
    }
    long long rss = 0;
    if (child_ask(&c, "mem", line, sizeof line) == 0 && sscanf(line, "maxrss %lld", &rss) == 1 && rss > s->maxrss)
        s->maxrss = rss;
    child_stop(&c);
}

typedef struct {
    const char *model;
    int seq, threads;
} bench_cfg_t;

/* The sides of one configuration: one loom side per GEMM (CPU) or one for
 * the device, then PyTorch when asked for; returns how many. */
static int make_sides(side_t *sides, const bench_cfg_t *bc, int batch, const char *device, const char *dtype,
                      const char **gemms, int ngemm, char *const *torch_argv, const char *torch_why) {
    static char labels[3][48];
    int ns = 0, cpu = strcmp(device, "cpu") == 0;
    memset(sides, 0, 4 * sizeof *sides);
    for (int g = 0; g < ngemm && g < 3; g++) {
        side_t *s = &sides[ns++];
        s->ls = (loom_side_t){bc->model, device, dtype, cpu ? gemms[g] : NULL, batch, bc->seq, bc->threads, 0};
        snprintf(labels[g], sizeof labels[g], cpu ? "loom (gemm %s)" : "loom %s", cpu ? gemms[g] : device);
        s->label = labels[g];
    }
    if (torch_argv || torch_why) {
        side_t *s = &sides[ns++];
        s->label = "pytorch";
        s->argv = torch_argv;
        if (torch_why) s->dead = 1, s->round = -1, snprintf(s->why, sizeof s->why, "%s", torch_why);
    }
    return ns;
}

/* The peak for MFU: the highest a loom side reported; when a step of any
 * side ran faster than that (the peak was measured on a busy machine),
 * the fastest step's rate, said in *note. MFU is then never above 100%. */
static double mfu_peak(const side_t *sides, int ns, double flops_per_step, const char **src, char *note, size_t n) {
    double peak = 0;
    *src = "unknown";
    note[0] = 0;
    for (int i = 0; i < ns; i++)
        if (sides[i].peak > peak) peak = sides[i].peak, *src = sides[i].peak_source;
    const side_t *best = NULL;
    for (int i = 0; i < ns; i++)
        if (sides[i].n && (!best || fastest(sides[i].times, sides[i].n) < fastest(best->times, best->n))) best = &sides[i];
    double achieved = best ? flops_per_step / fastest(best->times, best->n) : 0;
    if (peak > 0 && achieved > peak) {
        snprintf(note, n, "a step of %s ran at %.1f GFLOP/s, above the measured peak of %.1f: the peak was measured "
                 "while the machine was busy, so MFU uses the fastest step's rate", best->label, achieved / 1e9, peak / 1e9);
        peak = achieved;
    }
    return peak;
}

/* The results table of one configuration. */
static void print_sides(const side_t *sides, int ns, double tokens, double fpt, double peak) {
    const side_t *torch = ns && sides[ns - 1].argv ? &sides[ns - 1] : NULL;
    double torch_tps = torch && torch->n ? tokens / median(torch->times, torch->n) : 0;
    long long torch_mem = torch ? torch->maxrss : 0;
    printf("  %-16s %10s %10s %9s %7s %10s %12s %10s\n", "", "step ms", "tokens/s", "GFLOP/s", "MFU", "peak MB",
           "vs pytorch", "mem ratio");
    for (int i = 0; i < ns; i++) {
        const side_t *s = &sides[i];
        if (s->n == 0) {
            printf("  %-16s %s: %s\n", s->label, s->round < 0 ? "unavailable" : "failed", s->why[0] ? s->why : "no steps ran");
            continue;
        }
        double med = median(s->times, s->n), tps = tokens / med, gf = tps * fpt / 1e9;
        char ratio[32] = "-", mratio[32] = "-", mfu[16] = "-";
        if (s != torch && torch_tps > 0) snprintf(ratio, sizeof ratio, "%.2fx", tps / torch_tps);
        if (s != torch && torch_mem > 0) snprintf(mratio, sizeof mratio, "%.2f", (double)s->maxrss / torch_mem);
        if (peak > 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * gf * 1e9 / peak);
        printf("  %-16s %10.1f %10.0f %9.1f %7s %10.0f %12s %10s\n", s->label, med * 1e3, tps, gf, mfu, s->maxrss / 1048576.0,
               ratio, mratio);
        if (s->dead) printf("  %-16s (then %s; the row holds the steps before)\n", "", s->why);
    }
}

/* The PyTorch side's argv in `a` (strings in `num`), or NULL with the
 * reason in why when it cannot run. */
static char *const *torch_argv(char *a[22], char num[8][24], const loom_gpt_config_t *cfg, int batch, const bench_cfg_t *bc,
                               const char *script, char *why, size_t why_size) {
    const int v[8] = {cfg->n_layer, cfg->channels, cfg->n_head, cfg->vocab_size, cfg->max_seq_len, batch, bc->seq, bc->threads};
    static const char *const flag[8] = {"--layers", "--channels", "--heads", "--vocab", "--maxT", "--batch", "--seq", "--threads"};
    if (access("/usr/bin/python3", X_OK) != 0) return snprintf(why, why_size, "/usr/bin/python3 not found"), NULL;
    if (access(script, R_OK) != 0) return snprintf(why, why_size, "%s not found (pass --torch-script)", script), NULL;
    a[0] = "/usr/bin/python3";
    a[1] = (char *)script;
    for (int i = 0; i < 8; i++) {
        snprintf(num[i], 24, "%d", v[i]);
        a[2 + 2 * i] = (char *)flag[i];
        a[3 + 2 * i] = num[i];
    }
    a[18] = NULL;
    if (strcmp(loom_gpt_family(cfg), "gpt2")) { /* the script's Llama: KV heads, MLP width, RoPE base, eps, tied */
        static char llama[96];
        snprintf(llama, sizeof llama, "%d,%d,%g,%g,%d", cfg->n_kv_heads, cfg->ffn_hidden, cfg->rope_theta ? cfg->rope_theta : 10000.0f,
                 cfg->norm_eps ? cfg->norm_eps : 1e-5f, !cfg->untied_head);
        a[18] = "--llama", a[19] = llama, a[20] = NULL;
    }
    return a;
}

static int run_train_config(const bench_cfg_t *bc, int batch, int rounds, int steps, const char *device,
                            const char *dtype, const char **gemms, int ngemm, int torch_on, const char *script) {
    loom_gpt_config_t cfg;
    if (loom_gpt_preset(&cfg, bc->model) != LOOM_OK) return fprintf(stderr, "loom bench train: %s\n", loom_errmsg()), 2;
    cfg.vocab_size = BENCH_VOCAB;
    if (bc->seq > cfg.max_seq_len) cfg.max_seq_len = bc->seq;
    if (loom_gpt_config_finish(&cfg) != LOOM_OK) return fprintf(stderr, "loom bench train: %s\n", loom_errmsg()), 2;
    double fpt = loom_gpt_flops_per_token(&cfg, bc->seq), tokens = (double)batch * bc->seq;
    char *a[22], num[8][24], why[320] = "";
    char *const *targv = torch_on ? torch_argv(a, num, &cfg, batch, bc, script, why, sizeof why) : NULL;
    side_t sides[4];
    int ns = make_sides(sides, bc, batch, device, dtype, gemms, ngemm, targv, why[0] ? why : NULL);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < ns; i++)
            if (!sides[i].dead) side_round(&sides[i], r, steps);
    const char *src;
    char note[400];
    double peak = mfu_peak(sides, ns, tokens * fpt, &src, note, sizeof note);
    printf("\n%s  B=%d T=%d  threads=%d  device=%s  (%.1f MFLOP/token; %d rounds x %d steps each, alternating, one process at a time)\n",
           bc->model, batch, bc->seq, bc->threads, device, fpt / 1e6, rounds, steps);
    printf("  peak: %s\n", src);
    if (note[0]) printf("  peak raised: %s\n", note);
    if (strcmp(device, "cpu")) printf("  peak MB: loom's is the peak it allocated on the GPU; PyTorch's its host peak resident\n");
    print_sides(sides, ns, tokens, fpt, peak);
    fflush(stdout);
    for (int i = 0; i < ns; i++)
        if (!sides[i].argv && sides[i].n > 0) return 0;
    return 1; /* no loom side ran: the reason is printed above */
}

static int split_list(char *s, const char **out, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) out[n++] = tok;
    return n;
}

static int bench_train(int argc, char **argv) {
    const char *model = NULL, *device = "cpu", *dtype = "fp32", *torch = "on", *gemm = "own,blas", *script = NULL;
    int batch = 4, seq = 0, threads = 0, steps = 2, rounds = 3;
    const loom_arg_t args[] = {
        {"model", ARG_STR, &model, "", 0, 0, "preset (empty: gpt2-tiny T=256, gpt2-small T=256 and T=1024, on 2 threads then 1)"},
        loom_flag_default(LOOM_FLAG_BATCH, &batch, "4"),
        {"seq", ARG_INT, &seq, "0", 0, 1 << 20, "tokens per sequence (0 = the defaults' list, or the preset's context with --model)"},
        {"threads", ARG_INT, &threads, "0", 0, 4096, "CPU threads for both loom and PyTorch (0 = the defaults' list: 2 then 1)"},
        {"steps", ARG_INT, &steps, "2", 1, 1000, "steps per side per round"},
        {"rounds", ARG_INT, &rounds, "3", 1, 1000, "rounds of alternation (after one untimed warm-up step each)"},
        {"device", ARG_STR, &device, "cpu", 0, 0, "cpu, cuda or cuda:N (loom's side; PyTorch runs on the CPU build Debian ships)"},
        {"dtype", ARG_STR, &dtype, "fp32", 0, 0, "loom's matrix precision"},
        {"gemm", ARG_STR, &gemm, "own,blas", 0, 0, "CPU GEMMs to run loom with, comma-separated: own (AVX-512/AVX2 kernels), blas (OpenBLAS)"},
        {"torch", ARG_STR, &torch, "on", 0, 0, "on or off: run the PyTorch reference"},
        {"torch-script", ARG_STR, &script, "", 0, 0, "path of bench/torch_train.py (empty: found beside the build)"},
    };
    const char *usage = "loom bench train [--model gpt2-small --seq 1024 --threads 2] [flags]";
    LOOM_ARGS_PARSE_OR_RETURN("bench train", usage, args, argc, argv);
    if (strcmp(torch, "on") != 0 && strcmp(torch, "off") != 0) {
        fprintf(stderr, "loom bench train: --torch %s: use on or off\n", torch);
        return 2;
    }
    if (MAX_TIMES < rounds * steps) {
        fprintf(stderr, "loom bench train: --rounds x --steps must be at most %d\n", MAX_TIMES);
        return 2;
    }
    char gemm_buf[64];
    snprintf(gemm_buf, sizeof gemm_buf, "%s", gemm);
    const char *gemms[3];
    int ngemm = split_list(gemm_buf, gemms, 3);
    for (int i = 0; i < ngemm; i++)
        if (strcmp(gemms[i], "own") != 0 && strcmp(gemms[i], "blas") != 0) {
            fprintf(stderr, "loom bench train: --gemm %s: use own, blas or own,blas\n", gemms[i]);
            return 2;
        }
    if (strcmp(device, "cpu") != 0) ngemm = 1;
    if (model && !*model) model = NULL;
    if (script && !*script) script = NULL;
    char path[PATH_MAX];
    torch_script_path(path, sizeof path, script);

    bench_cfg_t list[8];
    int n = 0;
    if (!model && !seq && !threads) {
        const int ths[2] = {2, 1};
        for (int t = 0; t < 2; t++) {
            list[n++] = (bench_cfg_t){"gpt2-tiny", 256, ths[t]};
            list[n++] = (bench_cfg_t){"gpt2-small", 256, ths[t]};
            list[n++] = (bench_cfg_t){"gpt2-small", 1024, ths[t]};
        }
    } else {
        loom_gpt_config_t cfg;
        if (!model) model = "gpt2-tiny";
        if (loom_gpt_preset(&cfg, model) != LOOM_OK) {
            fprintf(stderr, "loom bench train: %s\n", loom_errmsg());
            return 2;
        }
        list[n++] = (bench_cfg_t){model, seq ? seq : cfg.max_seq_len, threads ? threads : 2};
    }
    signal(SIGPIPE, SIG_IGN); /* a side that died: its pipe says so (EPIPE), it must not kill the bench */
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("loom bench train: loom vs PyTorch (%s), float32, AdamW, clip 1.0, vocab %d; OPENBLAS_CORETYPE=%s\n",
           strcmp(torch, "on") == 0 ? path : "off", BENCH_VOCAB, ct ? ct : "(unset)");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = run_train_config(&list[i], batch, rounds, steps, device, dtype, gemms, ngemm,
                              strcmp(torch, "on") == 0, path);
    return rc;
}

/* ---- bench ops: the backend table wrapped with timers ---- */

/* One row per op of ops.h; matmul_forward and matmul_backward get one row
 * per role in the model (the shapes tell them apart). */
enum { ROLE_ANY, ROLE_QKV, ROLE_ATTPROJ, ROLE_FC, ROLE_FCPROJ, ROLE_HEAD, ROLE_COUNT };
static const char *const role_names[ROLE_COUNT] = {"", " qkv", " attproj", " fc", " fcproj", " head"};

static const loom_backend_t *ops_inner;
static loom_backend_t ops_table;
static loom_gpt_config_t ops_cfg;
static double op_time[LOOM_OP_COUNT][ROLE_COUNT], op_flops[LOOM_OP_COUNT][ROLE_COUNT];
static long op_calls[LOOM_OP_COUNT][ROLE_COUNT];
static int op_role; /* set by the matmul wrappers around the timed call */

typedef struct {
    int op;
    double flops, t0;
} op_timer_t;

static op_timer_t op_begin(int op, double flops) {
    ops_inner->sync();
    return (op_timer_t){op, flops, loom_now()};
}
/* Runs when a wrapper's timer leaves scope, after the op's return value
 * was taken (__attribute__((cleanup)) below). */
static void op_end(op_timer_t *t) {
    ops_inner->sync();
    op_time[t->op][op_role] += loom_now() - t->t0;
    op_flops[t->op][op_role] += t->flops;
    op_calls[t->op][op_role]++;
}

/* A timed wrapper for every op the model launches (kinds OP, HOST, FUSED,
 * VARIANT), made from ops.h; flops is the list's FLOP expression. The
 * memory entries pass through; graph and DEV entries are dropped so that
 * the model launches the ops one by one. */
#define WRAP_TIMED_(name, ret, kind, fallback, flops, n, args)                                  \
    static ret w_##name LOOM_OP_PARAMS(n, args) {                                             \
        op_timer_t t_ __attribute__((cleanup(op_end))) = op_begin(LOOM_OP_##name, (flops));  \
        return ops_inner->name LOOM_OP_ARGS(n, args);                                       \
    }
#define WRAP_OP_ WRAP_TIMED_
#define WRAP_HOST_ WRAP_TIMED_
#define WRAP_FUSED_ WRAP_TIMED_
#define WRAP_VARIANT_ WRAP_TIMED_
#define WRAP_MEM_(...)
#define WRAP_DEV_(...)
#define WRAP_GRAPH_(...)
#define WRAP_(name, ret, kind, fallback, flops, n, args) WRAP_##kind##_(name, ret, kind, fallback, flops, n, args)
LOOM_OPS(WRAP_)

#define SET_TIMED_(name) ops_table.name = be->name ? w_##name : NULL;
#define SET_OP_ SET_TIMED_
#define SET_HOST_ SET_TIMED_
#define SET_FUSED_ SET_TIMED_
#define SET_VARIANT_ SET_TIMED_
#define SET_MEM_(name)
#define SET_DEV_(name) ops_table.name = NULL;
#define SET_GRAPH_(name) ops_table.name = NULL;
#define SET_(name, ret, kind, fallback, flops, n, args) SET_##kind##_(name)

static int mm_role(int C, int OC) {
    int c = ops_cfg.channels;
    if (OC == 3 * c) return ROLE_QKV;
    if (C == 4 * c) return ROLE_FCPROJ;
    if (OC == 4 * c) return ROLE_FC;
    if (OC == c) return ROLE_ATTPROJ;
    return ROLE_HEAD;
}
static void w_mm_forward_role(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    op_role = mm_role(C, OC);
    w_matmul_forward(out, inp, w, bias, N, C, OC);
    op_role = ROLE_ANY;
}
static void w_mm_backward_role(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                               int N, int C, int OC) {
    op_role = mm_role(C, OC);
    w_matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    op_role = ROLE_ANY;
}

/* A copy of the table whose ops time themselves. */
static const loom_backend_t *ops_wrap(const loom_backend_t *be) {
    ops_inner = be;
    ops_table = *be;
    ops_table.caps &= ~(unsigned)(LOOM_CAP_DEVICE_STEP | LOOM_CAP_GRAPHS);
    LOOM_OPS(SET_)
    ops_table.matmul_forward = w_mm_forward_role;
    ops_table.matmul_backward = w_mm_backward_role;
    return &ops_table;
}

/* The table of where a step's time went, one line per op (and role). */
static void ops_print(int steps, double total) {
    printf("  %-30s %7s %10s %7s %9s\n", "op", "calls", "ms/step", "share", "GFLOP/s");
    double sum = 0;
    for (int i = 0; i < LOOM_OP_COUNT; i++)
        for (int r = 0; r < ROLE_COUNT; r++) {
            if (!op_calls[i][r]) continue;
            double ms = op_time[i][r] / steps * 1e3;
            sum += op_time[i][r];
            char gf[16] = "", name[64];
            if (op_flops[i][r] > 0) snprintf(gf, sizeof gf, "%.1f", op_flops[i][r] / op_time[i][r] / 1e9);
            snprintf(name, sizeof name, "%s%s", loom_op_info((loom_op_id)i)->name, role_names[r]);
            printf("  %-30s %7ld %10.2f %6.1f%% %9s\n", name, op_calls[i][r] / steps, ms, 100 * op_time[i][r] / total, gf);
        }
    printf("  %-30s %7s %10.2f %6.1f%%\n", "(outside ops)", "", (total - sum) / steps * 1e3, 100 * (total - sum) / total);
}

static int bench_ops(int argc, char **argv) {
    loom_side_t s = {"gpt2-tiny", "cpu", "fp32", NULL, 4, 0, 2, 0};
    int steps = 3;
    const loom_arg_t args[] = {
        loom_flag(LOOM_FLAG_MODEL, &s.model),
        loom_flag_default(LOOM_FLAG_BATCH, &s.batch, "4"),
        loom_flag(LOOM_FLAG_SEQ, &s.seq),
        loom_flag_default(LOOM_FLAG_THREADS, &s.threads, "2"),
        {"steps", ARG_INT, &steps, "3", 1, 1000, "timed steps (after one warm-up step)"},
        loom_flag(LOOM_FLAG_DEVICE, &s.device),
        {"dtype", ARG_STR, &s.dtype, "fp32", 0, 0, "matrix precision"},
        {"gemm", ARG_STR, &s.gemm, "", 0, 0, "CPU GEMM: own or blas (empty: LOOM_GEMM, else own)"},
    };
    LOOM_ARGS_PARSE_OR_RETURN("bench ops", "loom bench ops [--model gpt2-small --seq 1024 --threads 2] [flags]",
                              args, argc, argv);
    loom_gpt_config_t cfg;
    if (loom_gpt_preset(&cfg, s.model) != LOOM_OK) {
        fprintf(stderr, "loom bench ops: %s\n", loom_errmsg());
        return 2;
    }
    if (!s.seq) s.seq = cfg.max_seq_len;
    const loom_backend_t *be;
    loom_gpt_t *m;
    int *tok, *tgt;
    loom_status st = loom_side_build(&s, &be, &m, &tok, &tgt);
    if (st != LOOM_OK) return loom_exit_report("bench ops", st);
    ops_cfg = m->cfg;
    m->be = ops_wrap(be);
    float loss, norm;
    int t = 1;
    double total = 0;
    for (int i = 0; i <= steps; i++) {
        if (i == 1) {
            memset(op_time, 0, sizeof op_time);
            memset(op_flops, 0, sizeof op_flops);
            memset(op_calls, 0, sizeof op_calls);
        }
        double t0 = loom_now();
        st = loom_train_step(m, tok, tgt, s.batch, s.seq, 1, &bench_opt, 3e-4f, t++, &loss, &norm);
        if (st != LOOM_OK) {
            fprintf(stderr, "loom bench ops: %s\n", loom_errmsg());
            return 1;
        }
        if (i > 0) total += loom_now() - t0;
    }
    double step = total / steps, fpt = loom_gpt_flops_per_token(&m->cfg, s.seq);
    printf("loom bench ops: %s B=%d T=%d threads=%d device=%s gemm=%s (%d steps after a warm-up)\n", s.model,
           s.batch, s.seq, s.threads, be->name, getenv("LOOM_GEMM") ? getenv("LOOM_GEMM") : "own", steps);
    printf("step %.1f ms, %.0f tokens/s, %.1f model GFLOP/s; peak: %s\n", step * 1e3, s.batch * s.seq / step,
           s.batch * s.seq * fpt / step / 1e9, be->peak_source ? be->peak_source : "unknown");
    ops_print(steps, total);
    loom_gpt_free(m);
    free(tok);
    free(tgt);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    const char *help = "usage: loom bench train|ops|dist [flags]   (loom bench train --help lists the flags)\n"
                       "  train  loom's training step side by side with PyTorch: tokens/s, GFLOP/s, MFU, peak memory\n"
                       "  ops    where one training step's time goes, op by op, forward and backward\n"
                       "  dist   scaling over ranks\n"
                       "  generate  inference engine: one request at a time vs continuous batching, tokens/s and TTFT\n";
    if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        fputs(help, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "train") == 0) return bench_train(argc - 1, argv + 1);
    if (strcmp(argv[0], "ops") == 0) return bench_ops(argc - 1, argv + 1);
    if (strcmp(argv[0], "dist") == 0) return cmd_bench_dist(argc - 1, argv + 1);
    if (strcmp(argv[0], "generate") == 0) return cmd_bench_generate(argc - 1, argv + 1);
    if (strcmp(argv[0], "serve") == 0) return cmd_bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "loom bench: unknown benchmark '%s'\n%s", argv[0], help);
    return 2;
}
