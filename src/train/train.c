#define _GNU_SOURCE
#include "train.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ckpt/optim.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "parallel/dist.h"
#include "data/dataset.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "obs/plot.h"
#include "train/step.h"
#include "train/step_graph.h"

double loom_lr_at(long long t, long long steps, int warmup, double lr, double min_lr_ratio) {
    if (warmup > 0 && t <= warmup) return lr * (double)t / warmup;
    if (steps <= warmup) return lr;
    double progress = (double)(t - warmup) / (double)(steps - warmup);
    if (progress > 1) progress = 1;
    double min_lr = lr * min_lr_ratio;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

/* Validation loss: mean over up to `nb` batches from the start of the split. */
static loom_status eval_loss(loom_gpt_t *m, const loom_dataset_t *ds, int B, int T, int nb,
                             int *in, int *tg, double *out) {
    size_t ntok = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL);
    size_t per = (size_t)B * T;
    int n = (int)(ntok / per);
    if (n > nb) n = nb;
    if (n < 1) n = 1;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        loom_dataset_batch(ds, LOOM_SPLIT_VAL, (size_t)i * per, B, T, in, tg);
        float l;
        LOOM_TRY(loom_gpt_forward(m, in, tg, B, T, 0.0f, &l));
        sum += l;
    }
    *out = sum / n;
    return LOOM_OK;
}

static void print_sample(loom_gpt_t *m, const loom_tokenizer_t *tok, int ntok, unsigned long long seed) {
    if (!tok || ntok <= 0) return;
    int eot = loom_tokenizer_eot(tok);
    uint32_t start = eot >= 0 ? (uint32_t)eot : (uint32_t)'\n';
    loom_sampling_t s = {.temperature = 1.0f, .top_k = 40, .top_p = 1.0f};
    loom_rng_t rng;
    loom_rng_seed(&rng, seed);
    loom_text_sink_t sink = {tok, stderr};
    fprintf(stderr, "---- sample ----\n");
    loom_gpt_generate(m, &start, 1, ntok, &s, &rng, loom_text_sink_emit, &sink);
    fprintf(stderr, "\n----------------\n");
}

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* How the step runs, for config.json and the log. */
typedef struct {
    const char *dtype_source; /* "--dtype" or "default" */
    int graphs;               /* CUDA graphs in use */
    int loss_scaling;         /* dynamic fp16 loss scaling */
    int device_step;          /* the device-resident step (step_graph.h) */
} step_mode_t;

static loom_status write_run_config(const loom_train_opts_t *o, const loom_gpt_t *m,
                                    const loom_backend_t *be, const loom_dataset_t *ds,
                                    const step_mode_t *sm) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "loom-run-1");
    cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddStringToObject(j, "data_description", loom_dataset_describe(ds));
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON *mc = cJSON_AddObjectToObject(j, "model_config");
    cJSON_AddNumberToObject(mc, "n_layer", m->cfg.n_layer);
    cJSON_AddNumberToObject(mc, "n_head", m->cfg.n_head);
    cJSON_AddNumberToObject(mc, "n_embd", m->cfg.channels);
    cJSON_AddNumberToObject(mc, "n_positions", m->cfg.max_seq_len);
    cJSON_AddNumberToObject(mc, "vocab_size", m->cfg.vocab_size);
    cJSON_AddNumberToObject(mc, "padded_vocab_size", m->cfg.padded_vocab_size);
    cJSON_AddNumberToObject(mc, "parameters", (double)loom_gpt_num_params(&m->cfg));
    cJSON_AddStringToObject(j, "device", be->name);
    cJSON_AddStringToObject(j, "dtype", loom_dtype_name(be->dtype));
    cJSON_AddStringToObject(j, "dtype_source", sm->dtype_source);
    cJSON_AddStringToObject(j, "loss_scaling", sm->loss_scaling ? "dynamic" : "none");
    cJSON_AddStringToObject(j, "recompute", loom_recompute_name(m->recompute));
    cJSON_AddBoolToObject(j, "cuda_graphs", sm->graphs);
    cJSON_AddStringToObject(j, "step", sm->device_step ? "device" : "host");
    cJSON_AddNumberToObject(j, "threads", loom_backend_cpu_threads());
    cJSON_AddNumberToObject(j, "batch", o->batch);
    cJSON_AddNumberToObject(j, "seq", o->seq);
    cJSON_AddNumberToObject(j, "grad_accum", o->grad_accum);
    cJSON_AddNumberToObject(j, "world_size", o->world_size);
    cJSON_AddNumberToObject(j, "zero", o->zero);
    cJSON_AddStringToObject(j, "grad_dtype", o->grad_dtype ? o->grad_dtype : "fp32");
    cJSON_AddNumberToObject(j, "steps", (double)o->steps);
    cJSON_AddNumberToObject(j, "lr", o->lr);
    cJSON_AddNumberToObject(j, "min_lr_ratio", o->min_lr_ratio);
    cJSON_AddNumberToObject(j, "warmup", o->warmup);
    cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
    cJSON_AddNumberToObject(j, "clip", o->clip);
    cJSON_AddNumberToObject(j, "beta1", o->beta1);
    cJSON_AddNumberToObject(j, "beta2", o->beta2);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    char hash[32];
    const loom_tokenizer_t *tok = loom_dataset_tokenizer(ds);
    snprintf(hash, sizeof hash, "%016llx", tok ? (unsigned long long)loom_tokenizer_hash(tok) : 0ULL);
    cJSON_AddStringToObject(j, "tokenizer_hash", hash);
    cJSON_AddStringToObject(j, "peak_flops_source", be->peak_source ? be->peak_source : "unknown");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->out);
    loom_status s = loom_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* Every rank's AdamW state into the checkpoint being written. Rank 0
 * calls this from inside loom_run_save_checkpoint_with with the temporary
 * folder; the others call it with NULL at the same point of the loop and
 * learn the folder by broadcast. */
typedef struct {
    loom_dist_t *d;
    loom_dp_t *dp;
    loom_gpt_t *m;
    int zero;
    long long step;
} shard_ctx_t;

static loom_status write_optim_shards(const char *tmp_dir, void *vctx) {
    shard_ctx_t *c = vctx;
    int rank = loom_dist_rank(c->d), world = loom_dist_size(c->d);
    char dir[4096] = "", path[4200];
    if (tmp_dir) snprintf(dir, sizeof dir, "%s", tmp_dir);
    LOOM_TRY(loom_dist_broadcast(c->d, dir, sizeof dir, 0));
    loom_status s = LOOM_OK;
    if (c->zero >= 1 || rank == 0) {
        size_t lo, hi;
        float *am, *av;
        if (c->dp) {
            loom_dp_shard(c->dp, &lo, &hi, &am, &av);
        } else {
            lo = 0;
            hi = c->m->num_params;
            am = c->m->m;
            av = c->m->v;
        }
        int w = c->zero >= 1 ? world : 1;
        loom_optim_shard_path(path, sizeof path, dir, rank, w);
        loom_optim_shard_t h = {(uint32_t)rank, (uint32_t)w, (uint32_t)c->zero, c->m->num_params, lo, hi, (uint64_t)c->step};
        s = loom_optim_shard_save(path, &h, c->m->be, am, av);
    }
    double failed = s != LOOM_OK;
    LOOM_TRY(loom_dist_allreduce_f64(c->d, &failed, 1));
    if (s == LOOM_OK && failed > 0) s = loom_error(LOOM_EIO, "%.0f rank(s) could not write their optimizer shard into %s", failed, dir);
    return s;
}

static loom_status save_checkpoint(const loom_train_opts_t *o, shard_ctx_t *c, const loom_ckpt_state_t *st) {
    c->step = st->step;
    if (o->rank == 0) return loom_run_save_checkpoint_with(o->out, c->m, st, o->keep_ckpts, write_optim_shards, c);
    return write_optim_shards(NULL, c);
}

/* Resume: keep the metrics lines of steps up to `upto` (a crash may have
 * logged steps past the checkpoint), rewrite the log atomically, and read
 * the kept losses back into the plot's history. */
static loom_status resume_metrics(const char *path, long long upto, double *hist, long long nsteps,
                                  double *vhist, int *nv) {
    char *text;
    size_t len;
    if (loom_file_read(path, &text, &len) != LOOM_OK) return LOOM_OK; /* no log: start one */
    char *kept = loom_malloc(len + 1);
    size_t k = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        const char *st = strstr(line, "\"step\":"), *lo = strstr(line, "\"loss\":"), *vl = strstr(line, "\"val_loss\":");
        long long step = st && st < line + n ? strtoll(st + 7, NULL, 10) : 0;
        if (step >= 1 && step <= upto && step <= nsteps && end) {
            memcpy(kept + k, line, n);
            k += n;
            hist[step - 1] = (double)step;
            hist[nsteps + step - 1] = lo && lo < line + n ? strtod(lo + 7, NULL) : NAN;
            if (vl && vl < line + n) {
                vhist[*nv] = (double)step;
                vhist[nsteps + 2 + *nv] = strtod(vl + 11, NULL);
                (*nv)++;
            }
        }
        line += n;
    }
    loom_status s = loom_file_write_atomic(path, kept, k);
    free(kept);
    free(text);
    return s;
}

/* Resume: the newest checkpoint's weights, and this rank's AdamW state. */
static loom_status resume_state(const char *ckpt, loom_gpt_t *m, loom_dp_t *dp, int zero, int rank, int world) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    LOOM_TRY(loom_safetensors_load_gpt(m, path));
    size_t lo = 0, hi = m->num_params;
    float *am = m->m, *av = m->v;
    if (dp) loom_dp_shard(dp, &lo, &hi, &am, &av);
    int w = zero >= 1 ? world : 1, r = zero >= 1 ? rank : 0;
    loom_optim_shard_path(path, sizeof path, ckpt, r, w);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: no optimizer state for rank %d of %d (ZeRO-%d); resume with the --nproc and --zero the run was saved with",
                          path, r, w, zero);
    loom_optim_shard_t want = {(uint32_t)r, (uint32_t)w, (uint32_t)zero, m->num_params, lo, hi, 0}, got;
    return loom_optim_shard_load(path, &want, m->be, am, av, &got);
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static loom_status train_run(const loom_train_opts_t *o, loom_dist_t *dist) {
    if (!o->out || !*o->out) return loom_error(LOOM_EINVAL, "no --out folder: name where the run goes, e.g. --out runs/first");
    loom_gpt_config_t cfg;
    LOOM_TRY(loom_gpt_preset(&cfg, o->model));
    if (o->layers) cfg.n_layer = o->layers;
    if (o->heads) cfg.n_head = o->heads;
    if (o->channels) cfg.channels = o->channels;
    if (o->context) cfg.max_seq_len = o->context;
    int T = o->seq ? o->seq : cfg.max_seq_len, B = o->batch;
    if (T > cfg.max_seq_len)
        return loom_error(LOOM_EINVAL, "--seq %d is above the model's context of %d; lower --seq or raise --context", T, cfg.max_seq_len);
    int auto_dtype = !o->dtype || !strcmp(o->dtype, "auto");
    int dt = auto_dtype ? (int)loom_backend_default_dtype(o->device) : loom_dtype_parse(o->dtype);
    if (dt < 0) return loom_error(LOOM_EINVAL, "--dtype %s: unknown; use fp32, tf32, bf16 or fp16", o->dtype);
    int rc = o->recompute ? loom_recompute_parse(o->recompute) : LOOM_RECOMPUTE_NONE;
    if (rc < 0) return loom_error(LOOM_EINVAL, "--recompute %s: unknown; use none, gelu or all", o->recompute);
    if (o->cuda_graphs && strcmp(o->cuda_graphs, "on") && strcmp(o->cuda_graphs, "off"))
        return loom_error(LOOM_EINVAL, "--cuda-graphs %s: use on or off", o->cuda_graphs);
    step_mode_t sm = {.dtype_source = auto_dtype ? "default" : "--dtype"};
    loom_step_graph_t *sg = NULL;
    loom_loss_scaler_t ls = {0};

    loom_dataset_t *ds;
    LOOM_TRY(loom_dataset_open(&ds, o->data, o->val_fraction));
    loom_status s = LOOM_OK;
    const loom_backend_t *be;
    loom_gpt_t *m = NULL;
    loom_dp_t *dp = NULL;
    int *in = NULL, *tg = NULL;
    FILE *log = NULL;
    double *hist = NULL, *vhist = NULL;
    cfg.vocab_size = loom_dataset_vocab_size(ds);
    loom_ckpt_state_t rst = {0};
    char rck[4096] = "";
    if (o->resume) {
        /* The model's shape comes from the checkpoint, not the preset. */
        loom_gpt_config_t rcfg;
        if ((s = loom_run_latest(o->out, rck, sizeof rck, &rcfg, &rst)) != LOOM_OK) goto done;
        const loom_tokenizer_t *dtok = loom_dataset_tokenizer(ds);
        if (rcfg.vocab_size != cfg.vocab_size || (rst.tokenizer_hash && dtok && loom_tokenizer_hash(dtok) != rst.tokenizer_hash)) {
            s = loom_error(LOOM_EINVAL, "--resume: %s was not made with the tokenizer run %s trained with; resume on the same --data", o->data, o->out);
            goto done;
        }
        if (rst.step >= o->steps) {
            s = loom_error(LOOM_EINVAL, "--resume: %s is already at step %lld of --steps %lld; raise --steps to train further", o->out, rst.step, o->steps);
            goto done;
        }
        cfg = rcfg;
        if (!o->seq) T = cfg.max_seq_len;
        if (T > cfg.max_seq_len) {
            s = loom_error(LOOM_EINVAL, "--seq %d is above the run's context of %d", T, cfg.max_seq_len);
            goto done;
        }
    }
    size_t need = (size_t)B * T * o->grad_accum * o->world_size + 1;
    if (loom_dataset_ntokens(ds, LOOM_SPLIT_TRAIN) < need) {
        s = loom_error(LOOM_EINVAL, "%s: %zu training tokens, fewer than one step needs (%zu = batch %d x seq %d x accum %d); give more text or lower --batch/--seq",
                       o->data, loom_dataset_ntokens(ds, LOOM_SPLIT_TRAIN), need, B, T, o->grad_accum);
        goto done;
    }
    int lead = o->rank == 0, multi = o->world_size > 1;
    char devname[64];
    snprintf(devname, sizeof devname, "%s", o->device);
    if (multi && !strcmp(o->device, "cuda")) snprintf(devname, sizeof devname, "cuda:%d", loom_dist_local_rank(dist));
    s = loom_backend_open(&be, devname, o->threads, (loom_dtype)dt);
    if (s == LOOM_EUNAVAIL && auto_dtype && dt == LOOM_BF16) {
        /* No bf16 tensor cores (compute capability < 8), or no GPU at all:
         * fp32 either opens or fails again with the reason. */
        char why[512];
        snprintf(why, sizeof why, "%s", loom_errmsg());
        if ((s = loom_backend_open(&be, devname, o->threads, LOOM_FP32)) == LOOM_OK)
            loom_info("loom train: default precision fp32 (%s)", why);
    }
    if (s != LOOM_OK) goto done;
    if (lead && !o->resume && (s = loom_run_prepare(o->out, o->force)) != LOOM_OK) goto done;
    /* Every rank draws the same initial weights from the same seed. */
    if ((s = loom_gpt_init(&m, &cfg, be, (unsigned long long)o->seed)) != LOOM_OK) goto done;
    loom_gpt_set_recompute(m, (loom_recompute)rc);
    if ((s = loom_gpt_alloc_train(m)) != LOOM_OK) goto done;
    if ((s = loom_gpt_alloc_acts(m, B, T)) != LOOM_OK) goto done;
    loom_dp_opts_t dpo = {.zero = o->zero, .overlap = !o->no_overlap,
                          .grad_dtype = o->grad_dtype && !strcmp(o->grad_dtype, "bf16") ? LOOM_DIST_BF16 : LOOM_DIST_FP32,
                          .bucket_floats = o->bucket_mb > 0 ? (size_t)(o->bucket_mb * 1e6 / 4) : 0};
    if (o->grad_dtype && strcmp(o->grad_dtype, "fp32") && strcmp(o->grad_dtype, "bf16")) {
        s = loom_error(LOOM_EINVAL, "--grad-dtype %s: unknown; use fp32 or bf16", o->grad_dtype);
        goto done;
    }
    /* A single process at ZeRO 0 keeps the plain step, bit for bit. */
    if ((multi || o->zero > 0) && (s = loom_dp_init(&dp, m, dist, &dpo)) != LOOM_OK) goto done;
    if (o->resume && (s = resume_state(rck, m, dp, o->zero, o->rank, o->world_size)) != LOOM_OK) goto done;
    /* The device-resident step (CUDA graphs, fp16 loss scaling) where the
     * backend has it; data parallelism reduces from the host during
     * backward, so it keeps the host step. */
    int is_cuda = (be->caps & LOOM_CAP_GRAPHS) != 0; /* capability flags, not the backend's name */
    int want_graphs = is_cuda && (!o->cuda_graphs || !strcmp(o->cuda_graphs, "on"));
    if (!is_cuda && o->cuda_graphs)
        loom_info("loom train: --cuda-graphs %s is ignored on %s (CUDA graphs are for CUDA devices)", o->cuda_graphs, be->name);
    if (!dp && loom_step_graph_supported(be, NULL, 0)) {
        if ((s = loom_step_graph_init(&sg, m, want_graphs)) != LOOM_OK) goto done;
        sm.device_step = 1;
        sm.graphs = loom_step_graph_uses_graphs(sg);
        sm.loss_scaling = be->dtype == LOOM_FP16;
    } else if (dp && is_cuda) {
        loom_info("loom train: data parallelism or ZeRO: the step runs from the host with plain launches (no CUDA graphs%s)",
                  be->dtype == LOOM_FP16 ? ", and fp16 without loss scaling" : "");
    }
    if (sm.loss_scaling) loom_loss_scaler_init(&ls, 65536.0f, 2000);
    if (lead && !o->resume && (s = write_run_config(o, m, be, ds, &sm)) != LOOM_OK) goto done;
    const loom_tokenizer_t *tok = loom_dataset_tokenizer(ds);
    char path[4096];
    if (lead && tok && !o->resume) {
        snprintf(path, sizeof path, "%s/tokenizer.json", o->out);
        if ((s = loom_tokenizer_save(tok, path)) != LOOM_OK) goto done;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out);
    hist = loom_malloc(2 * (size_t)o->steps * sizeof(double));
    vhist = loom_malloc(2 * ((size_t)o->steps + 2) * sizeof(double));
    int nv = 0;
    for (long long i = 0; i < o->steps; i++) { /* steps with no logged loss are not drawn */
        hist[i] = (double)(i + 1);
        hist[o->steps + i] = NAN;
    }
    if (lead && o->resume && (s = resume_metrics(path, rst.step, hist, o->steps, vhist, &nv)) != LOOM_OK) goto done;
    log = lead ? fopen(path, o->resume ? "a" : "w") : fopen("/dev/null", "w");
    if (!log) {
        s = loom_error(LOOM_EIO, "%s: cannot create the metrics log", path);
        goto done;
    }

    size_t per_step = (size_t)B * T * o->grad_accum;
    double flops_tok = loom_gpt_flops_per_token(&m->cfg, T);
    loom_info("loom train: %s", loom_dataset_describe(ds));
    loom_info("loom train: model %s: %d layers, %d heads, %d channels, context %d, vocabulary %d (padded %d), %.2fM parameters",
              o->model, cfg.n_layer, cfg.n_head, cfg.channels, cfg.max_seq_len, m->cfg.vocab_size, m->cfg.padded_vocab_size,
              loom_gpt_num_params(&m->cfg) / 1e6);
    loom_info("loom train: %s (%s), %d thread%s; batch %d x seq %d x accum %d = %zu tokens/step, %lld steps; peak %s",
              be->name, loom_dtype_name(be->dtype), loom_backend_cpu_threads(), loom_backend_cpu_threads() == 1 ? "" : "s",
              B, T, o->grad_accum, per_step, o->steps, be->peak_source ? be->peak_source : "unknown");
    if (sg || rc != LOOM_RECOMPUTE_NONE)
        loom_info("loom train: %s step%s%s; recompute %s (%.1f MB of activations)", sm.device_step ? "device-resident" : "host",
                  sm.device_step ? (sm.graphs ? ", CUDA graphs after the warm-up steps" : ", CUDA graphs off") : "",
                  sm.loss_scaling ? ", dynamic fp16 loss scaling from 65536" : "", loom_recompute_name(m->recompute), m->num_acts * 4.0 / 1e6);
    if (multi || dp) {
        loom_dp_memory_t mem = {0};
        if (dp) loom_dp_memory(dp, &mem);
        loom_info("loom train: %d ranks over %s, global batch %zu tokens/step (batch %d x seq %d x accum %d x %d ranks); ZeRO-%d, gradients reduced in %s%s",
                  o->world_size, loom_dist_name(dist), per_step * o->world_size, B, T, o->grad_accum, o->world_size, o->zero,
                  dpo.grad_dtype == LOOM_DIST_BF16 ? "bf16" : "fp32", dpo.overlap ? ", overlapped with backward" : ", after backward");
        if (dp)
            loom_info("loom train: memory per rank (P = %zu floats, N = %d): params %.2f MB + grads %.2f MB + AdamW %.2f MB = %.2f MB; ZeRO-%d formula %s = %.2f MB%s; peak resident %.1f MB",
                      m->num_params, o->world_size, mem.params / 1e6, mem.grads / 1e6, mem.optim / 1e6, mem.total / 1e6, o->zero,
                      mem.formula_text, mem.formula / 1e6,
                      o->zero == 2 ? " (loom's backward writes one whole-model working gradient buffer; the accumulated gradient is the shard)" : "",
                      peak_rss_mb());
    }

    in = loom_malloc(per_step * sizeof(int));
    tg = loom_malloc(per_step * sizeof(int));
    int *vin = loom_malloc((size_t)B * T * sizeof(int)), *vtg = loom_malloc((size_t)B * T * sizeof(int));
    int tty = isatty(2);
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    stop_requested = 0;

    loom_optim_t opt = {.beta1 = (float)o->beta1, .beta2 = (float)o->beta2, .eps = 1e-8f,
                        .weight_decay = (float)o->weight_decay, .clip = (float)o->clip};
    size_t ntrain = loom_dataset_ntokens(ds, LOOM_SPLIT_TRAIN);
    int have_val = loom_dataset_ntokens(ds, LOOM_SPLIT_VAL) > 1;
    unsigned long long pos = rst.data_pos;
    long long first = rst.step + 1;
    if (o->resume) loom_info("loom train: resuming %s from step %lld (%s), data position %llu", o->out, rst.step, rck, pos);
    shard_ctx_t shards = {dist, dp, m, o->zero, 0};
    double comm_wait = 0;
    double peak = be->peak_flops;
    int peak_raised = 0;
    double t_start = loom_now(), train_time = 0, last_loss = NAN, last_val = -1;
    long long step;
    for (step = first; step <= o->steps; step++) {
        double stop = stop_requested; /* every rank stops at the same step */
        if (multi && (s = loom_dist_allreduce_f64(dist, &stop, 1)) != LOOM_OK) break;
        if (stop > 0) {
            if (!stop_requested) stop_requested = SIGTERM;
            break;
        }
        /* This rank's micro-batches: disjoint slices of the global batch. */
        for (int k = 0; k < o->grad_accum; k++) {
            size_t p = (pos + ((size_t)k * o->world_size + o->rank) * B * T) % ntrain;
            loom_dataset_batch(ds, LOOM_SPLIT_TRAIN, p, B, T, in + (size_t)k * B * T, tg + (size_t)k * B * T);
        }
        pos = (pos + per_step * o->world_size) % ntrain;
        double lr = loom_lr_at(step, o->steps, o->warmup, o->lr, o->min_lr_ratio);
        float loss, gnorm, scale_used = sm.loss_scaling ? ls.scale : 1.0f;
        loom_step_result_t r = {0};
        double t0 = loom_now();
        if (sg) {
            if ((s = loom_step_graph_run(sg, in, tg, B, T, o->grad_accum, &opt, (float)lr, (int)step, sm.loss_scaling ? &ls : NULL, &r)) != LOOM_OK) break;
            loss = r.loss;
            gnorm = r.grad_norm;
            if (r.skipped)
                loom_info("%sloom train: step %lld skipped: inf/nan gradients at loss scale %g; scale now %g (%lld skipped so far)",
                          tty ? "\n" : "", step, scale_used, ls.scale, ls.skipped);
        } else if ((s = loom_train_step_dp(m, dp, in, tg, B, T, o->grad_accum, &opt, (float)lr, (int)step, &loss, &gnorm)) != LOOM_OK) {
            break;
        }
        be->sync();
        double dt = loom_now() - t0, wait = loom_dp_last_wait(dp);
        train_time += dt;
        comm_wait += wait;
        last_loss = loss;
        hist[step - 1] = (double)step;
        hist[o->steps + step - 1] = loss;
        double tok_s = per_step * o->world_size / dt;
        /* A peak measured while other work loaded the machine is too low;
         * a step that beats it proves more is possible, so the peak rises
         * to what was achieved and MFU never reads above 100%. */
        double achieved = flops_tok * tok_s / o->world_size;
        if (peak > 0 && achieved > peak) {
            if (!peak_raised)
                loom_warn("step %lld ran at %.1f GFLOP/s per rank, above the measured peak of %.1f; "
                          "the peak measurement ran on a busy machine, so MFU now uses the best observed rate",
                          step, achieved / 1e9, peak / 1e9);
            peak = achieved;
            peak_raised = 1;
        }
        double mfu = peak > 0 ? achieved / peak : -1;

        int do_eval = lead && have_val && o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps);
        double vloss = -1;
        if (do_eval) {
            if ((s = eval_loss(m, ds, B, T, o->eval_batches, vin, vtg, &vloss)) != LOOM_OK) break;
            last_val = vloss;
            vhist[nv] = (double)step;
            vhist[o->steps + 2 + nv] = vloss;
            nv++;
        }
        double elapsed = loom_now() - t_start;
        fprintf(log, "{\"step\":%lld,\"loss\":%.6f,", step, loss);
        if (do_eval) fprintf(log, "\"val_loss\":%.6f,", vloss);
        if (multi) fprintf(log, "\"comm_wait_s\":%.4f,", wait);
        if (sm.loss_scaling) fprintf(log, "\"loss_scale\":%g,\"skipped\":%s,", scale_used, r.skipped ? "true" : "false");
        fprintf(log, "\"lr\":%.6e,", lr);
        if (isfinite(gnorm)) fprintf(log, "\"grad_norm\":%.6f,", gnorm);
        else fprintf(log, "\"grad_norm\":null,"); /* a skipped fp16 step; JSON has no inf */
        fprintf(log, "\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"step_s\":%.4f,\"elapsed_s\":%.2f}\n",
                tok_s, mfu, dt, elapsed);
        fflush(log);

        char eta[32];
        fmt_eta(train_time / (double)(step - first + 1) * (o->steps - step), eta, sizeof eta);
        int print = tty || step % o->log_every == 0 || step == first || step == o->steps || do_eval;
        if (print && o->rank == 0) {
            char mfus[32] = "n/a";
            if (mfu >= 0) snprintf(mfus, sizeof mfus, "%.1f%%", 100 * mfu);
            fprintf(stderr, "%sstep %lld/%lld | loss %.4f", tty ? "\r\033[K" : "", step, o->steps, loss);
            if (do_eval) fprintf(stderr, " | val %.4f", vloss);
            fprintf(stderr, " | lr %.2e | norm %.2f | %.0f tok/s | MFU %s | ETA %s", lr, gnorm, tok_s, mfus, eta);
            if (!tty || do_eval || step == o->steps) fputc('\n', stderr);
        }
        if (lead && o->sample_every > 0 && step % o->sample_every == 0 && step != o->steps)
            print_sample(m, tok, o->sample_tokens, (unsigned long long)o->seed + (unsigned long long)step);
        if (o->ckpt_every > 0 && step % o->ckpt_every == 0 && step != o->steps) {
            loom_ckpt_state_t st = {step, loss, do_eval ? vloss : -1, pos, tok ? loom_tokenizer_hash(tok) : 0, o->world_size, o->zero, B, T, o->grad_accum};
            if ((s = save_checkpoint(o, &shards, &st)) != LOOM_OK) break;
        }
    }
    step--; /* the last completed step */
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (s == LOOM_OK && step >= first) {
        if (stop_requested) loom_info("\nloom train: stopped by signal %d after step %lld; writing a checkpoint", (int)stop_requested, step);
        if (lead && have_val && (nv == 0 || vhist[nv - 1] != (double)step)) {
            if ((s = eval_loss(m, ds, B, T, o->eval_batches, vin, vtg, &last_val)) == LOOM_OK) {
                vhist[nv] = (double)step;
                vhist[o->steps + 2 + nv] = last_val;
                nv++;
            }
        }
        loom_ckpt_state_t st = {step, last_loss, last_val, pos, tok ? loom_tokenizer_hash(tok) : 0, o->world_size, o->zero, B, T, o->grad_accum};
        if (s == LOOM_OK) s = save_checkpoint(o, &shards, &st);
    }
    if (lead && step > 0) {
        snprintf(path, sizeof path, "%s/loss.svg", o->out);
        char title[256];
        snprintf(title, sizeof title, "%s: %s on %s", o->out, o->model, o->data);
        loom_status ps = loom_plot_loss_svg(path, title, hist, hist + o->steps, (int)step, vhist, vhist + o->steps + 2, nv);
        if (s == LOOM_OK) s = ps;
    }
    if (s == LOOM_OK && step >= first) {
        double wall = loom_now() - t_start;
        loom_info("loom train: done: %lld steps in %.1fs, %.0f tokens/s; final train loss %.4f, val loss %s%.4f; checkpoint in %s/checkpoints",
                  step - first + 1, wall, (double)per_step * o->world_size * (double)(step - first + 1) / train_time, last_loss, last_val < 0 ? "n/a " : "",
                  last_val, o->out);
        if (multi)
            loom_info("loom train: %d ranks: %.1f%% of step time waiting for communication (%.2fs of %.2fs)", o->world_size,
                      100 * comm_wait / train_time, comm_wait, train_time);
        if (lead) print_sample(m, tok, o->sample_tokens, (unsigned long long)o->seed);
    }
    free(vin);
    free(vtg);
    if (s == LOOM_OK && stop_requested) s = loom_error(LOOM_EINTERNAL, "stopped by signal %d; the checkpoint of step %lld is in %s", (int)stop_requested, step, o->out);
done:
    if (log) fclose(log);
    free(hist);
    free(vhist);
    free(in);
    free(tg);
    loom_step_graph_free(sg);
    loom_dp_free(dp);
    loom_gpt_free(m);
    loom_dataset_free(ds);
    return s;
}

loom_status loom_train(const loom_train_opts_t *opts) {
    loom_dist_t *d;
    loom_dist_opts_t dopt = {.transport = "auto", .gpu = opts->device && (loom_backend_device_caps(opts->device) & LOOM_CAP_DEVICE_MEMORY),
                             .timeout_s = opts->dist_timeout};
    dopt.device = -1; /* the local rank's GPU */
    LOOM_TRY(loom_dist_init(&d, &dopt));
    loom_train_opts_t o = *opts;
    o.rank = loom_dist_rank(d);
    o.world_size = loom_dist_size(d);
    if (o.rank != 0) loom_log_quiet(1);
    loom_status s = train_run(&o, d);
    /* On failure the process exits without the last barrier: its peers
     * see the closed connections and stop, naming this rank. */
    if (s == LOOM_OK || o.world_size == 1) loom_dist_free(d);
    return s;
}
