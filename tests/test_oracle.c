/* The whole model against an independent oracle (tests/oracle.py, GPT-2
 * written again in PyTorch). For each small random configuration loom
 * writes its initial weights as safetensors plus tokens and a config into a
 * temporary folder, computes logits, loss, every parameter's gradient and
 * five AdamW steps with clipping, runs the oracle on the same folder, and
 * compares each quantity by normalized error ||loom - ref|| / ||ref||.
 *
 * The reference is torch in float64; the line for each quantity also shows
 * torch's own float32 error against it: what float32 allows.
 * Needs Debian's /usr/bin/python3 with torch (scripts/deps.sh installs
 * python3-torch); without it every case is skipped with the reason. The
 * folders are removed unless a case failed or LOOM_ORACLE_KEEP is set. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/safetensors.h"
#include "model/gpt.h"
#include "train/step.h"

#define PYTHON "/usr/bin/python3"
#define STEPS 5
#define LR 1e-3f

/* Bounds on the normalized error against torch float64.
 * Forward and gradients: float32 arithmetic over these sizes lands near
 * 1e-7..1e-6 (torch's own float32 does the same), so 1e-5 leaves a margin
 * of ten while a wrong formula shows up far above: erf instead of tanh
 * GELU at 1e-4..5e-4 (with the trained-like weights; 1e-5 at GPT-2's init,
 * hence those weights), an ignored LayerNorm bias at 1e-1, an untransposed
 * matrix at 1. */
#define FWD_BOUND 1e-5
#define GRAD_BOUND 1e-5
/* Step losses and pre-clip gradient norms: scalars, same reasoning. */
#define STEP_BOUND 1e-5
/* Parameters after five AdamW steps: 5e-5, looser, because Adam divides
 * each gradient by its own running magnitude: an element with a small
 * gradient turns the gradient's rounding into rounding of its update, and
 * the five updates (~5e-3) are summed into weights stored to float32
 * precision. Measured: loom and torch-float32 both land at 5e-8..5e-6
 * (fcw and fcprojw of cfg3 the worst, in both). The smallest AdamW
 * mistakes still sit ten times above the bound: weight decay given to or
 * withheld from the wrong group moves those tensors by 5 * lr * wd = 5e-4
 * relative, skipped clipping by 4e-4..1e-3, a missing bias correction by
 * 1e-1.
 *
 * One slice is left out of that comparison: the key bias. It cannot change
 * any softmax (it adds q.b_k to every score of a row), so its true gradient
 * is 0 (torch float64: 1e-17..1e-20) while float32's, loom's and torch's
 * alike, is rounding noise of 1e-11..1e-8. Adam divides that noise by its
 * own magnitude plus eps = 1e-8 and turns it into steps of up to ~lr with
 * arbitrary signs, so after five steps the key bias is noise of 1e-6..2e-3
 * in every float32 implementation and no bound on it separates right from
 * wrong. Its gradient is checked instead, under GRAD_BOUND within dqkvb,
 * where a real key-bias gradient would stand out at once. */
#define PARAM_BOUND 5e-5

typedef struct {
    const char *name;
    int L, C, NH, maxT, V, B, T;
    unsigned long long seed;
    int trained_like; /* replace GPT-2's init by wider weights (see widen_params) */
    float clip;       /* chosen so that some steps clip and some do not */
} oracle_cfg_t;

static const oracle_cfg_t cfgs[] = {
    {"cfg1", 2, 32, 4, 16, 97, 2, 16, 1234, 1, 4.9f},
    /* C and T not powers of two, V padded from 65 to 128. */
    {"cfg2", 1, 48, 3, 13, 65, 3, 13, 5678, 1, 6.4f},
    /* T below max_seq_len: the last wpe rows get no gradient. */
    {"cfg3", 3, 64, 2, 32, 256, 2, 24, 91011, 1, 10.0f},
    /* loom_gpt_init's weights as they are, as at the start of training. */
    {"cfg4", 2, 32, 4, 16, 97, 2, 16, 4242, 0, 1.9f},
};
#define NCFG ((int)(sizeof cfgs / sizeof cfgs[0]))

static const loom_optim_t OPT = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .weight_decay = 0.1f, .clip = 0};

typedef enum { RUN_NOT_YET, RUN_OK, RUN_SKIP, RUN_ERROR } run_state;

/* loom's side of one configuration, kept for the three cases. */
typedef struct {
    run_state state;
    char msg[2048];
    char dir[64];
    int have_dir;
    loom_gpt_config_t cfg; /* finished (padded vocabulary) */
    loom_tensor_info_t ptable[LOOM_NPARAMS];
    size_t num_params;
    float *logits;  /* (B, T, V), padding columns dropped */
    float loss;     /* batch 0 */
    float loss_grad_pass; /* the same loss from the forward with dloss != 0 */
    float *grads;   /* (num_params) on batch 0 */
    float *init;    /* (num_params) before the steps */
    float *final;   /* (num_params) after STEPS */
    float losses[STEPS], norms[STEPS];
} oracle_run_t;

static oracle_run_t runs[NCFG];

/* --- the Python side ----------------------------------------------------- */

static char python_missing[1024];
static int python_probed;

/* "" when /usr/bin/python3 can import torch and numpy, else why not. */
static const char *python_problem(void) {
    if (python_probed) return python_missing;
    python_probed = 1;
    if (access(PYTHON, X_OK) != 0) {
        snprintf(python_missing, sizeof python_missing,
                 "%s not found; scripts/deps.sh installs python3-torch", PYTHON);
        return python_missing;
    }
    FILE *p = popen(PYTHON " -c 'import torch, numpy' 2>&1", "r");
    char line[512] = "", last[512] = "";
    while (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0]) snprintf(last, sizeof last, "%s", line);
    }
    int rc = p ? pclose(p) : -1;
    if (rc != 0)
        snprintf(python_missing, sizeof python_missing,
                 "%s cannot import torch and numpy (%s); scripts/deps.sh installs python3-torch and python3-numpy",
                 PYTHON, last[0] ? last : "no output");
    return python_missing;
}

/* tests/oracle.py from the repository root (how run.sh runs tests), or
 * next to the binary's build folder. */
static int find_oracle(char *out, size_t n) {
    if (access("tests/oracle.py", R_OK) == 0) {
        snprintf(out, n, "tests/oracle.py");
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return -1;
    exe[k] = 0; /* .../build/tests/test_oracle */
    snprintf(out, n, "%s/../tests/oracle.py", dirname(dirname(exe)));
    return access(out, R_OK) == 0 ? 0 : -1;
}

/* --- files --------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const void *data, size_t bytes) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, bytes, f) == bytes;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* The oracle's float64 array `<prec>_<name>.bin` of exactly n values, or
 * NULL with the reason in err. */
static double *read_ref(const oracle_run_t *r, const char *prec, const char *name, size_t n,
                        char *err, size_t errn) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s_%s.bin", r->dir, prec, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errn, "%s: missing (the oracle did not write it)", path);
        return NULL;
    }
    double *x = malloc((n + 1) * sizeof(double));
    size_t got = fread(x, sizeof(double), n + 1, f);
    fclose(f);
    if (got != n) {
        snprintf(err, errn, "%s: %zu%s values, expected %zu", path, got, got > n ? "+" : "", n);
        free(x);
        return NULL;
    }
    return x;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

/* --- loom's side --------------------------------------------------------- */

static int fail_run(oracle_run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_run(oracle_run_t *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->state = RUN_ERROR;
    return -1;
}

#define LOOM_OR_FAIL(call)                                                                   \
    do {                                                                                     \
        loom_status s_ = (call);                                                             \
        if (s_ != LOOM_OK)                                                                   \
            return fail_run(r, "%s: %s: %s", #call, loom_status_name(s_), loom_errmsg());   \
    } while (0)

/* Elements of loom's tensor i that the oracle sees: wte without its
 * padding rows. */
static size_t real_numel(const loom_gpt_config_t *cfg, const loom_tensor_info_t *ptable, int i) {
    return i == LOOM_WTE ? (size_t)cfg->vocab_size * cfg->channels : ptable[i].numel;
}

/* GPT-2's init (std 0.02, zero biases, unit LayerNorm weights) keeps every
 * GELU input near 0, where tanh and erf GELU agree to 1e-5, and makes a
 * bias or LayerNorm weight that forward ignores or misplaces invisible.
 * These weights put the activations at O(1), as in a trained model:
 * matrices with unit-variance outputs, embeddings at 0.3, biases at 0.1,
 * LayerNorm weights 1 +- 0.2. wte's padding rows stay zero. */
static void widen_params(loom_gpt_t *m, unsigned long long seed) {
    float *host = malloc(m->num_params * sizeof(float));
    m->be->download(host, m->params, m->num_params * sizeof(float));
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        const loom_tensor_info_t *t = &m->ptable[i];
        float mean = 0, std;
        switch (i) {
        case LOOM_WTE: case LOOM_WPE: std = 0.3f; break;
        case LOOM_QKVW: case LOOM_ATTPROJW: case LOOM_FCW: case LOOM_FCPROJW:
            std = 1.0f / sqrtf((float)t->shape[t->ndim - 1]);
            break;
        case LOOM_LN1W: case LOOM_LN2W: case LOOM_LNFW: mean = 1.0f; std = 0.2f; break;
        default: std = 0.1f; break; /* biases */
        }
        float *p = host + t->offset;
        for (size_t k = 0; k < real_numel(&m->cfg, m->ptable, i); k++) p[k] = mean + std * loom_rng_normal(&rng);
    }
    m->be->upload(m->params, host, m->num_params * sizeof(float));
    free(host);
}

/* Everything loom computes for configuration k, then the oracle. */
static int loom_side(const oracle_cfg_t *c, oracle_run_t *r, loom_gpt_t *m, const loom_backend_t *be,
                     const int *tokens, const int *targets) {
    int B = c->B, T = c->T, V = c->V, Vp = r->cfg.padded_vocab_size;
    size_t BT = (size_t)B * T, bytes = r->num_params * sizeof(float);

    /* Logits come out of a forward with dloss == 0 (the gradient pass
     * overwrites them); only the first V of Vp columns are real. */
    LOOM_OR_FAIL(loom_gpt_forward(m, tokens, targets, B, T, 0.0f, &r->loss));
    float *padded = malloc(BT * Vp * sizeof(float));
    loom_gpt_logits(m, padded, B, T);
    r->logits = malloc(BT * V * sizeof(float));
    for (size_t i = 0; i < BT; i++) memcpy(r->logits + i * V, padded + i * Vp, V * sizeof(float));
    free(padded);

    LOOM_OR_FAIL(loom_gpt_alloc_train(m));
    loom_gpt_zero_grad(m);
    LOOM_OR_FAIL(loom_gpt_forward(m, tokens, targets, B, T, 1.0f / (float)BT, &r->loss_grad_pass));
    loom_gpt_backward(m, B, T);
    r->grads = malloc(bytes);
    be->download(r->grads, m->grads, bytes);

    r->init = malloc(bytes);
    be->download(r->init, m->params, bytes);
    loom_optim_t opt = OPT;
    opt.clip = c->clip;
    for (int s = 0; s < STEPS; s++)
        LOOM_OR_FAIL(loom_train_step(m, tokens + s * BT, targets + s * BT, B, T, 1, &opt, LR, s + 1,
                                     &r->losses[s], &r->norms[s]));
    r->final = malloc(bytes);
    be->download(r->final, m->params, bytes);
    return 0;
}

static int prepare(int k) {
    const oracle_cfg_t *c = &cfgs[k];
    oracle_run_t *r = &runs[k];
    r->state = RUN_ERROR;
    const char *why = python_problem();
    if (why[0]) {
        snprintf(r->msg, sizeof r->msg, "%s", why);
        r->state = RUN_SKIP;
        return -1;
    }
    char script[PATH_MAX + 64];
    if (find_oracle(script, sizeof script) != 0) {
        char cwd[PATH_MAX] = "?";
        return fail_run(r, "tests/oracle.py not found from %s or next to the binary; run from the repository root",
                        getcwd(cwd, sizeof cwd) ? cwd : "?");
    }

    r->cfg = (loom_gpt_config_t){.max_seq_len = c->maxT, .vocab_size = c->V, .n_layer = c->L,
                                 .n_head = c->NH, .channels = c->C};
    LOOM_OR_FAIL(loom_gpt_config_finish(&r->cfg));
    loom_gpt_param_table(&r->cfg, r->ptable, &r->num_params);

    snprintf(r->dir, sizeof r->dir, "/tmp/loom_oracle_%s_XXXXXX", c->name);
    if (!mkdtemp(r->dir)) return fail_run(r, "mkdtemp %s: %s", r->dir, strerror(errno));
    r->have_dir = 1;

    const loom_backend_t *be;
    LOOM_OR_FAIL(loom_backend_cpu_init(&be, 1));
    loom_gpt_t *m;
    LOOM_OR_FAIL(loom_gpt_init(&m, &r->cfg, be, c->seed));
    if (c->trained_like) widen_params(m, c->seed + 1);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", r->dir);
    loom_status s = loom_safetensors_save_gpt(m, path);
    if (s != LOOM_OK) {
        loom_gpt_free(m);
        return fail_run(r, "loom_safetensors_save_gpt: %s", loom_errmsg());
    }

    /* Tokens and targets for STEPS batches; batch 0 is also the one of the
     * gradient check. Force the last real vocabulary row (next to the
     * padding) and a repeated token (two scatters into one wte row). */
    size_t n = (size_t)STEPS * c->B * c->T;
    int *tokens = malloc(n * sizeof(int)), *targets = malloc(n * sizeof(int));
    loom_rng_t rng;
    loom_rng_seed(&rng, c->seed ^ 0x5eed);
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int)(loom_rng_u64(&rng) % (uint64_t)c->V);
        targets[i] = (int)(loom_rng_u64(&rng) % (uint64_t)c->V);
    }
    tokens[0] = c->V - 1;
    targets[1] = c->V - 1;
    tokens[3] = tokens[2];

    char json[1024];
    int jn = snprintf(json, sizeof json,
                      "{\"n_layer\": %d, \"n_head\": %d, \"channels\": %d, \"max_seq_len\": %d, "
                      "\"vocab_size\": %d, \"B\": %d, \"T\": %d, \"steps\": %d, \"lr\": %.9g, "
                      "\"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, "
                      "\"clip\": %.9g}\n",
                      c->L, c->NH, c->C, c->maxT, c->V, c->B, c->T, STEPS, LR, OPT.beta1,
                      OPT.beta2, OPT.eps, OPT.weight_decay, c->clip);
    int rc = 0;
    if (write_file(r->dir, "config.json", json, (size_t)jn) || write_file(r->dir, "tokens.bin", tokens, n * sizeof(int)) ||
        write_file(r->dir, "targets.bin", targets, n * sizeof(int)))
        rc = fail_run(r, "%s: cannot write the oracle's inputs: %s", r->dir, strerror(errno));
    if (rc == 0) rc = loom_side(c, r, m, be, tokens, targets);
    loom_gpt_free(m);
    free(tokens);
    free(targets);
    if (rc) return rc;

    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof cmd, PYTHON " '%s' '%s' > '%s/oracle.log' 2>&1", script, r->dir, r->dir);
    int st = system(cmd);
    if (st != 0) {
        char *log = NULL, logpath[256];
        size_t size = 0;
        snprintf(logpath, sizeof logpath, "%s/oracle.log", r->dir);
        loom_file_read(logpath, &log, &size);
        const char *tail = log ? log + (size > 1500 ? size - 1500 : 0) : "(no log)";
        if (st != -1 && WIFEXITED(st))
            fail_run(r, "`%s` exited with status %d:\n%s", cmd, WEXITSTATUS(st), tail);
        else
            fail_run(r, "`%s` did not finish (wait status %d):\n%s", cmd, st, tail);
        free(log);
        return -1;
    }
    r->state = RUN_OK;
    return 0;
}

/* The run for configuration k, prepared on first use. Returns NULL after
 * marking the case skipped or failed. */
static oracle_run_t *get_run(int k) {
    if (runs[k].state == RUN_NOT_YET) prepare(k);
    oracle_run_t *r = &runs[k];
    if (r->state == RUN_SKIP) check_skip("%s", r->msg);
    int prepared = r->state != RUN_ERROR;
    CHECK(prepared, "%s: %s", cfgs[k].name, r->msg);
    return r->state == RUN_OK ? r : NULL;
}

/* --- comparisons --------------------------------------------------------- */

/* Whether element i of a (L, 3C) qkv bias is a key bias. */
static int is_key_bias(size_t i, int C) { return (i / (size_t)C) % 3 == 1; }

/* Check loom's `a` (n floats) against the float64 reference `name`; print
 * loom's error and torch-float32's beside it. When key_bias_C > 0 the
 * tensor is a qkv bias with that many channels and its key slices are left
 * out (see PARAM_BOUND). */
static void compare_part(const oracle_run_t *r, const char *cfg, const char *what, const char *name,
                         const float *a, size_t n, double bound, int key_bias_C) {
    char err[512];
    double *ref = read_ref(r, "f64", name, n, err, sizeof err);
    double *r32 = ref ? read_ref(r, "f32", name, n, err, sizeof err) : NULL;
    int have_ref = ref && r32;
    if (!have_ref) {
        CHECK(have_ref, "%s %s: %s", cfg, what, err);
        free(ref);
        return;
    }
    float *mine = malloc(n * sizeof(float)), *t32 = malloc(n * sizeof(float));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (key_bias_C > 0 && is_key_bias(i, key_bias_C)) continue;
        mine[k] = a[i];
        t32[k] = (float)r32[i];
        ref[k++] = ref[i];
    }
    double e = check_rel_err_d(mine, ref, k), e32 = check_rel_err_d(t32, ref, k);
    printf("  %s %-16s loom %.2e  torch-f32 %.2e  (vs torch f64, bound %.0e)\n", cfg, what, e, e32, bound);
    CHECK(e < bound, "%s %s: normalized error %.3e against torch float64 is above %.0e (torch float32: %.3e)",
          cfg, what, e, bound, e32);
    free(mine);
    free(t32);
    free(ref);
    free(r32);
}

static void compare(const oracle_run_t *r, const char *cfg, const char *what, const char *name,
                    const float *a, size_t n, double bound) {
    compare_part(r, cfg, what, name, a, n, bound, 0);
}

/* The padding rows of wte in block x are exactly zero. */
static void check_padding_zero(const oracle_run_t *r, const char *cfg, const char *what, const float *x) {
    const loom_tensor_info_t *t = &r->ptable[LOOM_WTE];
    size_t real = real_numel(&r->cfg, r->ptable, LOOM_WTE), bad = 0;
    for (size_t i = real; i < t->numel; i++) bad += x[t->offset + i] != 0.0f;
    CHECK(bad == 0, "%s %s: %zu of %zu values in wte's padding rows (%d..%d) are not zero", cfg, what, bad,
          t->numel - real, r->cfg.vocab_size, r->cfg.padded_vocab_size - 1);
}

static void case_forward(int k) {
    oracle_run_t *r = get_run(k);
    if (!r) return;
    const oracle_cfg_t *c = &cfgs[k];
    compare(r, c->name, "logits", "logits", r->logits, (size_t)c->B * c->T * c->V, FWD_BOUND);
    compare(r, c->name, "loss", "loss", &r->loss, 1, FWD_BOUND);
    CHECK(r->loss == r->loss_grad_pass, "%s: loss %.9g with dloss=0 but %.9g with dloss=1/(B*T)", c->name,
          r->loss, r->loss_grad_pass);
}

static void case_grads(int k) {
    oracle_run_t *r = get_run(k);
    if (!r) return;
    char what[64], name[64];
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        if (!r->ptable[i].numel) continue; /* not in GPT-2 */
        snprintf(what, sizeof what, "d%s", r->ptable[i].name);
        snprintf(name, sizeof name, "grad_%s", r->ptable[i].name);
        compare(r, cfgs[k].name, what, name, r->grads + r->ptable[i].offset, real_numel(&r->cfg, r->ptable, i), GRAD_BOUND);
    }
    check_padding_zero(r, cfgs[k].name, "dwte", r->grads);
}

static void case_adamw(int k) {
    oracle_run_t *r = get_run(k);
    if (!r) return;
    const oracle_cfg_t *c = &cfgs[k];
    compare(r, c->name, "step losses", "losses", r->losses, STEPS, STEP_BOUND);
    compare(r, c->name, "step grad norms", "norms", r->norms, STEPS, STEP_BOUND);
    /* Both branches of clipping must run, or the test proves nothing about
     * the one that did not. */
    int clipped = 0;
    for (int s = 0; s < STEPS; s++) clipped += r->norms[s] > c->clip;
    printf("  %s clipping at %.2f: %d of %d steps clipped (norms", c->name, c->clip, clipped, STEPS);
    for (int s = 0; s < STEPS; s++) printf(" %.3f", r->norms[s]);
    printf(")\n");
    CHECK(clipped > 0 && clipped < STEPS,
          "%s: %d of %d steps clipped at %.2f; choose a clip between the step norms so both cases run",
          c->name, clipped, STEPS, c->clip);

    char what[64], name[64];
    for (int i = 0; i < LOOM_NPARAMS; i++) {
        if (!r->ptable[i].numel) continue; /* not in GPT-2 */
        int qkvb = i == LOOM_QKVB;
        snprintf(what, sizeof what, "%s%s", r->ptable[i].name, qkvb ? " (q, v)" : "");
        snprintf(name, sizeof name, "param_%s", r->ptable[i].name);
        compare_part(r, c->name, what, name, r->final + r->ptable[i].offset, real_numel(&r->cfg, r->ptable, i), PARAM_BOUND,
                     qkvb ? c->C : 0);
    }
    const float *b1 = r->final + r->ptable[LOOM_QKVB].offset, *b0 = r->init + r->ptable[LOOM_QKVB].offset;
    double kmax = 0;
    for (size_t i = 0; i < r->ptable[LOOM_QKVB].numel; i++)
        if (is_key_bias(i, c->C)) kmax = fmax(kmax, fabs((double)b1[i] - b0[i]));
    printf("  %s %-16s max |b_k - b_k(0)| %.2e  (true 0; rounding noise through Adam, not checked)\n",
           c->name, "qkvb (k)", kmax);
    check_padding_zero(r, c->name, "wte after AdamW", r->final);
}

#define CASES(k, tag)                                             \
    static void oracle_##tag##_forward(void) { case_forward(k); } \
    static void oracle_##tag##_grads(void) { case_grads(k); }     \
    static void oracle_##tag##_adamw(void) { case_adamw(k); }
CASES(0, cfg1)
CASES(1, cfg2)
CASES(2, cfg3)
CASES(3, cfg4)

int main(void) {
    loom_log_quiet(1);
    RUN(oracle_cfg1_forward);
    RUN(oracle_cfg1_grads);
    RUN(oracle_cfg1_adamw);
    RUN(oracle_cfg2_forward);
    RUN(oracle_cfg2_grads);
    RUN(oracle_cfg2_adamw);
    RUN(oracle_cfg3_forward);
    RUN(oracle_cfg3_grads);
    RUN(oracle_cfg3_adamw);
    RUN(oracle_cfg4_forward);
    RUN(oracle_cfg4_grads);
    RUN(oracle_cfg4_adamw);

    int failed = check_main_end();
    int keep = failed || getenv("LOOM_ORACLE_KEEP");
    for (int k = 0; k < NCFG; k++) {
        oracle_run_t *r = &runs[k];
        if (r->have_dir) {
            if (keep) printf("  %s: oracle inputs and outputs kept in %s\n", cfgs[k].name, r->dir);
            else nftw(r->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        }
        free(r->logits);
        free(r->grads);
        free(r->init);
        free(r->final);
    }
    return failed;
}
