/* setup: everything a run needs before its first step -- the model config
 * (preset, overrides or the resumed checkpoint's), the backend with its
 * precision, the model, data parallelism, the device-resident step, the run
 * folder, the observers -- and the teardown that undoes it. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "core/mem.h"
#include "ckpt/resume.h"
#include "ckpt/hf.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "train/exporter.h"
#include "train/pipeline.h"
#include "train/train_impl.h"

/* --resume auto: resume when the run folder holds a checkpoint, else a
 * fresh start. A resumed run's folder loses the leftovers of interrupted
 * writes before anything is written (rank 0, before any collective). */
static loom_status resolve_resume(loom_train_job_t *j) {
    loom_train_opts_t *o = &j->o;
    if (!o->resume) return LOOM_OK;
    if (o->resume_from && !strcmp(o->resume_from, "auto")) {
        o->resume = loom_ckpt_any(o->out);
        if (!o->resume) {
            loom_info("loom train: --resume auto: %s holds no checkpoint; starting the run", o->out);
            return LOOM_OK;
        }
    }
    if (!loom_path_is_dir(o->out))
        return loom_error(LOOM_EINVAL, "--resume: --out %s does not exist, nothing to resume; --resume auto starts a run there when it has none", o->out);
    if (!j->run.lead) return LOOM_OK;
    LOOM_TRY(loom_run_lock(o->out, &j->lock_fd)); /* one writer, before the clean-up touches anything */
    return loom_ckpt_clean(o->out);
}

/* PATH made absolute (realpath), or as given when it cannot be; "" for NULL. */
static void resolve_path(const char *path, char *out, size_t cap) {
    char buf[PATH_MAX];
    snprintf(out, cap, "%s", !path ? "" : realpath(path, buf) ? buf : path);
}

/* The settings a resume may not change, and the accumulation that keeps
 * the global batch on this world size (ckpt/resume.h). */
static loom_status check_resume(loom_train_job_t *j, int T) {
    loom_train_opts_t *o = &j->o;
    char data[4096], init[4096];
    resolve_path(o->data, data, sizeof data);
    resolve_path(o->init_from_run, init, sizeof init);
    loom_resume_settings_t now = {.batch = o->batch, .seq = T, .grad_accum = o->grad_accum, .world_size = j->run.dp_size,
                                  .zero = o->zero, .steps = o->steps, .seed = o->seed, .warmup = o->warmup, .lr = o->lr,
                                  .min_lr_ratio = o->min_lr_ratio, .weight_decay = o->weight_decay, .clip = o->clip,
                                  .beta1 = o->beta1, .beta2 = o->beta2, .dtype = j->auto_dtype ? NULL : loom_dtype_name(j->dtype),
                                  .grad_dtype = o->grad_dtype == LOOM_DIST_BF16 ? "bf16" : "fp32", .data_resolved = data,
                                  .val_fraction = o->val_fraction, .model = o->model_given ? o->model : NULL, .init_from_run = init};
    return loom_resume_check(o->out, &now, &j->rst, j->run.lead, &o->grad_accum);
}

/* The loss history and the plot keep a few numbers per step: --steps must
 * fit in memory (checked before the run folder is made). */
static loom_status check_steps(const loom_train_opts_t *o) {
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE), per = 64;
    if (mem > 0 && (double)o->steps * per > mem / 4)
        return loom_error(LOOM_EINVAL, "--steps %lld: the per-step loss history would take %.1f GB of this machine's %.1f GB; use at most %.0f steps",
                          o->steps, (double)o->steps * per / 1e9, mem / 1e9, mem / 4 / per);
    return LOOM_OK;
}

/* A resume takes the checkpoint's shape: a shape flag that says otherwise
 * is refused, never ignored. */
static loom_status check_resume_shape(const loom_train_opts_t *o, const loom_gpt_config_t *r) {
    const struct { const char *flag; int now, run; } f[] = {
        {"--layers", o->layers, r->n_layer}, {"--heads", o->heads, r->n_head},
        {"--channels", o->channels, r->channels}, {"--context", o->context, r->max_seq_len}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].now && f[i].now != f[i].run)
            return loom_error(LOOM_EINVAL, "--resume: %s %d differs from the run's %d (%s): drop %s (a resume takes the checkpoint's shape), or start a new run",
                              f[i].flag, f[i].now, f[i].run, o->out, f[i].flag);
    return LOOM_OK;
}

/* The model's shape and the batch shape: preset and overrides, or the
 * checkpoint's on --resume. The data must be open. */
static loom_status resolve_model(loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    LOOM_TRY(check_steps(o));
    LOOM_TRY(resolve_resume(j));
    loom_gpt_config_t *cfg = &j->cfg;
    if (o->init_from_run) { /* the architecture of the run's newest checkpoint */
        char ck[4096];
        loom_ckpt_state_t st;
        LOOM_TRY(loom_run_latest(o->init_from_run, ck, sizeof ck, cfg, &st));
    } else {
        LOOM_TRY(o->init_from ? loom_hf_read_config(o->init_from, cfg) : loom_gpt_preset(cfg, o->model));
    }
    if (o->layers) cfg->n_layer = o->layers;
    if (o->heads) cfg->n_head = o->heads;
    if (o->channels) cfg->channels = o->channels;
    if (o->context) cfg->max_seq_len = o->context;
    if (o->untied_head) cfg->untied_head = 1;
    cfg->vocab_size = loom_dataset_vocab_size(j->ds);
    if (o->init_from && !o->resume) LOOM_TRY(loom_hf_check_data(o->init_from, o->data, loom_dataset_tokenizer(j->ds), cfg->vocab_size, cfg));
    if (o->resume) { /* the model's shape comes from the checkpoint, not the preset */
        loom_gpt_config_t rcfg;
        const char *which = o->resume_from && strcmp(o->resume_from, "auto") ? o->resume_from : NULL;
        LOOM_TRY(loom_run_find(o->out, which, j->rck, sizeof j->rck, &rcfg, &j->rst));
        if (which && strcmp(which, "latest") && j->run.lead) LOOM_TRY(loom_ckpt_supersede(o->out, j->rst.step));
        const loom_tokenizer_t *dtok = loom_dataset_tokenizer(j->ds);
        if (rcfg.vocab_size != cfg->vocab_size || (j->rst.tokenizer_hash && dtok && loom_tokenizer_hash(dtok) != j->rst.tokenizer_hash))
            return loom_error(LOOM_EINVAL, "--resume: %s was not made with the tokenizer run %s trained with; resume on the same --data", o->data, o->out);
        if (j->rst.data_pos >= loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN))
            return loom_error(LOOM_EFORMAT, "%s/state.json: data position %llu is past the %zu training tokens of %s; the checkpoint is not of this data",
                              j->rck, j->rst.data_pos, loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN), o->data);
        if (j->rst.step >= o->steps && o->resume_from && !strcmp(o->resume_from, "auto"))
            loom_info("loom train: %s is complete (step %lld of --steps %lld); nothing to train", o->out, j->rst.step, o->steps);
        else if (j->rst.step >= o->steps)
            return loom_error(LOOM_EINVAL, "--resume: %s is already at step %lld of --steps %lld; raise --steps to train further", o->out, j->rst.step, o->steps);
        LOOM_TRY(check_resume_shape(o, &rcfg));
        *cfg = rcfg;
    }
    int T = o->seq ? o->seq : cfg->max_seq_len;
    if (T > cfg->max_seq_len)
        return loom_error(LOOM_EINVAL, "--seq %d is above the %s context of %d; lower --seq%s", T, o->resume ? "run's" : "model's",
                          cfg->max_seq_len, o->resume ? "" : " or raise --context");
    if (o->resume) LOOM_TRY(check_resume(j, T));
    j->run.B = o->batch;
    j->run.T = T;
    size_t need = (size_t)o->batch * T * o->grad_accum * j->run.dp_size + 1;
    if (loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN) < need)
        return loom_error(LOOM_EINVAL, "%s: %zu training tokens, fewer than one step needs (%zu = batch %d x seq %d x accum %d); give more text or lower --batch/--seq",
                          o->data, loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN), need, o->batch, T, o->grad_accum);
    return LOOM_OK;
}

/* How the step runs, from the options (the CLI's flag table checked them). */
static void step_modes(loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    j->auto_dtype = o->dtype < 0;
    j->dtype = j->auto_dtype ? (int)loom_backend_default_dtype(o->device) : o->dtype;
    j->recompute = o->recompute;
    /* on (the default) or off; whether the backend can capture graphs is
     * known once it is open (build_model) */
    j->want_graphs = o->cuda_graphs != 0;
    j->dpo = (loom_dp_opts_t){.zero = o->zero, .overlap = !o->no_overlap, .grad_dtype = (loom_dist_dtype)o->grad_dtype,
                              .bucket_floats = o->bucket_mb > 0 ? (size_t)(o->bucket_mb * 1e6 / 4) : 0};
}

/* The backend at the asked precision; an automatic bf16 that the device
 * lacks falls back to fp32. */
static loom_status open_backend(loom_train_job_t *j, loom_dist_t *dist) {
    const loom_train_opts_t *o = &j->o;
    char devname[64];
    loom_backend_rank_device(devname, sizeof devname, o->device, o->world_size > 1 ? loom_dist_local_rank(dist) : -1);
    loom_status s = loom_backend_open(&j->run.be, devname, o->threads, (loom_dtype)j->dtype);
    if (s == LOOM_EUNAVAIL && j->auto_dtype && j->dtype == LOOM_BF16) {
        /* No bf16 tensor cores (compute capability < 8), or no GPU at all:
         * fp32 either opens or fails again with the reason. */
        char why[512];
        snprintf(why, sizeof why, "%s", loom_errmsg());
        if ((s = loom_backend_open(&j->run.be, devname, o->threads, LOOM_FP32)) == LOOM_OK)
            loom_info("loom train: default precision fp32 (%s)", why);
    }
    return s;
}

/* --init-from (a Hugging Face folder) or --init-from-run (a loom run's
 * newest checkpoint) into `m`, a whole model holding the seed's weights:
 * the weights a fine-tune starts from. */
static loom_status load_init(void *vj, loom_gpt_t *m) {
    loom_train_job_t *j = vj;
    const loom_train_opts_t *o = &j->o;
    if (o->init_from) return loom_hf_load_weights(m, o->init_from); /* fine-tune a Hugging Face model */
    char ck[4096], path[4200];
    loom_gpt_config_t rc;
    loom_ckpt_state_t st;
    LOOM_TRY(loom_run_latest(o->init_from_run, ck, sizeof ck, &rc, &st));
    if (rc.vocab_size != j->cfg.vocab_size)
        return loom_error(LOOM_EINVAL, "--init-from-run %s: its vocabulary (%d) is not the data's (%d); train on data tokenized with its tokenizer",
                          o->init_from_run, rc.vocab_size, j->cfg.vocab_size);
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    LOOM_TRY(loom_safetensors_load_gpt(m, path));
    /* continue the data where that run stopped: from 0 a fine-tune repeats
     * the batches the model saw first (docs/quantization.md, 2:4) */
    j->rst.data_pos = st.data_pos % loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN);
    return LOOM_OK;
}

/* --pp: this rank's stage (train/pipeline.h) instead of the whole model.
 * Text samples need the whole model on one rank: off for now. */
static loom_status build_pipeline(loom_train_job_t *j, loom_dist_t *dist) {
    loom_train_run_t *run = &j->run;
    loom_train_opts_t *o = &j->o;
    loom_pp_opts_t po = {.stages = o->pp, .tp = o->tp, .B = run->B, .T = run->T, .micro = o->grad_accum,
                         .recompute = (loom_recompute)j->recompute, .seed = (unsigned long long)o->seed, .dpo = j->dpo};
    LOOM_TRY(loom_pp_init(&run->pp, dist, &j->cfg, run->be, &po, &run->model));
    if (o->resume) LOOM_TRY(loom_pp_load(run->pp, j->rck, j->rst.step));
    else if (o->init_from || o->init_from_run) LOOM_TRY(loom_pp_load_weights(run->pp, load_init, j));
    if (o->sample_tokens)
        loom_info("loom train: --pp: no text samples during training yet (they need the whole model on one rank); `loom sample --run %s` reads its checkpoint", o->out);
    o->sample_tokens = 0;
    return LOOM_OK;
}

/* The model, its training state, data parallelism and the step to run. */
static loom_status build_model(loom_train_job_t *j, loom_dist_t *dist) {
    loom_train_run_t *run = &j->run;
    const loom_train_opts_t *o = &j->o;
    if (o->pp > 1) return build_pipeline(j, dist);
    /* Every rank draws the same initial weights from the same seed. */
    LOOM_TRY(loom_gpt_init(&run->model, &j->cfg, run->be, (unsigned long long)o->seed));
    if ((o->init_from || o->init_from_run) && !o->resume) LOOM_TRY(load_init(j, run->model));
    if (o->tp > 1) return loom_train_setup_tp(j, dist); /* the shard replaces the whole model */
    loom_gpt_set_recompute(run->model, (loom_recompute)j->recompute);
    if (o->zero == 0) LOOM_TRY(loom_gpt_alloc_train(run->model)); /* ZeRO >= 1: loom_dp_init, shard only */
    LOOM_TRY(loom_gpt_alloc_acts(run->model, run->B, run->T));
    /* A single process at ZeRO 0 keeps the plain step, bit for bit. */
    if (o->world_size > 1 || o->zero > 0) LOOM_TRY(loom_dp_init(&run->dp, run->model, dist, &j->dpo));
    if (o->resume) LOOM_TRY(loom_train_load_checkpoint(j));
    /* The device-resident step (CUDA graphs, fp16 loss scaling) where the
     * backend has it; data parallelism reduces from the host during
     * backward, so it keeps the host step. */
    int is_cuda = (run->be->caps & LOOM_CAP_GRAPHS) != 0; /* capability flags, not the backend's name */
    if (!is_cuda && o->cuda_graphs >= 0)
        loom_info("loom train: --cuda-graphs %s is ignored on %s (CUDA graphs are for CUDA devices)", o->cuda_graphs ? "on" : "off",
                  run->be->name);
    if (!run->dp && loom_step_graph_supported(run->be, NULL, 0)) {
        LOOM_TRY(loom_step_graph_init(&j->sg, run->model, j->want_graphs));
        j->device_step = 1;
        j->graphs = loom_step_graph_uses_graphs(j->sg);
        run->loss_scaling = run->be->dtype == LOOM_FP16;
    } else if (run->dp && is_cuda) {
        loom_info("loom train: data parallelism or ZeRO: the step runs from the host with plain launches (no CUDA graphs%s)",
                  run->be->dtype == LOOM_FP16 ? ", and fp16 without loss scaling" : "");
    }
    if (run->loss_scaling) loom_loss_scaler_init(&j->ls, 65536.0f, 2000);
    if (run->loss_scaling && j->rst.loss_scale > 0) { /* --resume: the saved scaler continues */
        j->ls.scale = j->rst.loss_scale, j->ls.good = j->rst.loss_scale_good, j->ls.skipped = j->rst.loss_scale_skipped;
    }
    run->loss_scaler = run->loss_scaling ? &j->ls : NULL;
    return LOOM_OK;
}

/* config.json as the one run-config writer (ckpt/run.h) lays it out. */
static void fill_run_config(const loom_train_job_t *j, loom_run_config_t *c) {
    const loom_train_opts_t *o = &j->o;
    const loom_backend_t *be = j->run.be;
    *c = (loom_run_config_t){.model_cfg = j->run.pp ? *loom_pp_config(j->run.pp) : j->run.model->cfg, .cuda_graphs = j->graphs,
                             .threads = be->threads, .batch = o->batch, .seq = o->seq, .grad_accum = o->grad_accum,
                             .world_size = j->run.dp_size,
                             .zero = o->zero, .warmup = o->warmup, .steps = o->steps, .seed = o->seed, .lr = o->lr,
                             .min_lr_ratio = o->min_lr_ratio, .weight_decay = o->weight_decay, .clip = o->clip,
                             .beta1 = o->beta1, .beta2 = o->beta2, .val_fraction = o->val_fraction};
    snprintf(c->format, sizeof c->format, "%s", LOOM_RUN_FORMAT);
    snprintf(c->data, sizeof c->data, "%s", o->data);
    resolve_path(o->data, c->data_resolved, sizeof c->data_resolved);
    resolve_path(o->init_from_run, c->init_from_run, sizeof c->init_from_run);
    snprintf(c->data_description, sizeof c->data_description, "%s", loom_dataset_describe(j->ds));
    snprintf(c->model, sizeof c->model, "%s", o->model);
    snprintf(c->device, sizeof c->device, "%s", be->name);
    snprintf(c->dtype, sizeof c->dtype, "%s", loom_dtype_name(be->dtype));
    snprintf(c->dtype_source, sizeof c->dtype_source, "%s", j->auto_dtype ? "default" : "--dtype");
    snprintf(c->loss_scaling, sizeof c->loss_scaling, "%s", j->run.loss_scaling ? "dynamic" : "none");
    snprintf(c->recompute, sizeof c->recompute, "%s", loom_recompute_name(j->run.model->recompute));
    snprintf(c->step, sizeof c->step, "%s", j->device_step ? "device" : "host");
    snprintf(c->grad_dtype, sizeof c->grad_dtype, "%s", o->grad_dtype == LOOM_DIST_BF16 ? "bf16" : "fp32");
    snprintf(c->peak_flops_source, sizeof c->peak_flops_source, "%s", be->peak_source ? be->peak_source : "unknown");
    c->tokenizer_hash = j->run.tok ? loom_tokenizer_hash(j->run.tok) : 0;
}

/* A new run's folder: emptied (--force), config.json, tokenizer.json. */
static loom_status write_run_folder(loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    if (!j->run.lead || o->resume) return LOOM_OK;
    LOOM_TRY(loom_run_check_new(o->out, o->force)); /* a refusal touches nothing, not even the lock file */
    LOOM_TRY(loom_run_lock(o->out, &j->lock_fd));   /* one writer, before --force removes anything */
    LOOM_TRY(loom_run_prepare(o->out, o->force));
    loom_run_config_t c;
    fill_run_config(j, &c);
    LOOM_TRY(loom_run_config_write(o->out, &c));
    if (!j->run.tok) return LOOM_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->out);
    return loom_tokenizer_save(j->run.tok, path);
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

void loom_train_report_memory(loom_train_job_t *j) {
    int W = j->o.world_size;
    double *v = loom_calloc((size_t)W, sizeof *v);
    v[j->o.rank] = loom_mem_peak_rss();
    if (!j->run.multi || loom_dist_allreduce_f64(j->run.dist, v, (size_t)W) == LOOM_OK) {
        char line[1024] = "";
        size_t n = 0;
        for (int r = 0; r < W && n < sizeof line - 40; r++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%srank %d %.1f MB", r ? ", " : "", r, v[r] / 1e6);
        if (W > 1) loom_info("loom train: peak resident memory (VmHWM) per rank: %s", line);
        else loom_info("loom train: peak resident memory (VmHWM): %.1f MB", v[0] / 1e6);
    }
    free(v);
}

/* The ranks, and the memory each holds for model state. */
static void report_ranks(const loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    const loom_train_run_t *run = &j->run;
    loom_dp_memory_t mem = {0};
    /* under --tp and --pp the data-parallel code runs over this rank's part of the model */
    const loom_dp_t *dp = run->dp ? run->dp : j->tp_dp ? j->tp_dp : loom_pp_dp(run->pp);
    if (dp) loom_dp_memory(dp, &mem);
    loom_info("loom train: %d ranks over %s, global batch %zu tokens/step (batch %d x seq %d x accum %d x %d data-parallel ranks); ZeRO-%d, gradients reduced in %s%s",
              o->world_size, loom_dist_name(run->dist), run->tokens_per_step, run->B, run->T, o->grad_accum, run->dp_size, o->zero,
              j->dpo.grad_dtype == LOOM_DIST_BF16 ? "bf16" : "fp32", j->dpo.overlap ? ", overlapped with backward" : ", after backward");
    if (dp)
        loom_info("loom train: memory per rank (P = %zu floats%s, N = %d): params %.2f MB + grads %.2f MB + AdamW %.2f MB = %.2f MB; ZeRO-%d formula %s = %.2f MB%s; peak resident %.1f MB",
                  run->model->num_params, run->tp ? " of the tp shard" : run->pp ? " of the stage" : "", run->dp_size, mem.params / 1e6, mem.grads / 1e6, mem.optim / 1e6, mem.total / 1e6, o->zero,
                  mem.formula_text, mem.formula / 1e6,
                  o->zero == 2   ? " (loom's backward writes one whole-model working gradient buffer; the accumulated gradient is the shard)"
                  : o->zero == 3 ? " plus the gather buffers: two blocks' weights and gradients, the non-layer tensors' twice"
                                 : "",
                  peak_rss_mb());
}

/* What is about to run, before the first step. */
static void report_setup(const loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    const loom_train_run_t *run = &j->run;
    const loom_gpt_config_t *c = run->pp ? loom_pp_config(run->pp) : &run->model->cfg;
    const loom_backend_t *be = run->be;
    char threads[32] = ""; /* the host threads, where ops run on the host */
    if (be->threads > 0) snprintf(threads, sizeof threads, ", %d thread%s", be->threads, be->threads == 1 ? "" : "s");
    size_t per_rank = (size_t)run->B * run->T * o->grad_accum;
    loom_info("loom train: %s", loom_dataset_describe(j->ds));
    loom_info("loom train: model %s: %d layers, %d heads, %d channels, context %d, vocabulary %d (padded %d), %.2fM parameters",
              o->model, c->n_layer, c->n_head, c->channels, c->max_seq_len, c->vocab_size, c->padded_vocab_size, loom_gpt_num_params(c) / 1e6);
    loom_info("loom train: %s (%s)%s; batch %d x seq %d x accum %d = %zu tokens/step, %lld steps; peak %s",
              be->name, loom_dtype_name(be->dtype), threads, run->B, run->T, o->grad_accum, per_rank, o->steps,
              be->peak_source ? be->peak_source : "unknown");
    if (j->sg || j->recompute != LOOM_RECOMPUTE_NONE)
        loom_info("loom train: %s step%s%s; recompute %s (%.1f MB of activations)", j->device_step ? "device-resident" : "host",
                  j->device_step ? (j->graphs ? ", CUDA graphs after the warm-up steps" : ", CUDA graphs off") : "",
                  run->loss_scaling ? ", dynamic fp16 loss scaling from 65536" : "", loom_recompute_name(run->model->recompute),
                  run->model->act_bytes / 1e6);
    if (run->multi || run->dp) report_ranks(j);
    if (o->resume)
        loom_info("loom train: resuming %s from step %lld (%s), data position %llu", o->out, j->rst.step, j->rck, j->rst.data_pos);
}

/* The observers in call order (see train.h): recorders, the caller's,
 * actors. */
static void add_observers(loom_train_job_t *j) {
    const loom_train_opts_t *o = &j->o;
    loom_train_observer_t *list[LOOM_TRAIN_MAX_OBS];
    int n = 0;
    list[n++] = loom_train_observer_signals();
    list[n++] = loom_train_observer_exporter(o); /* before the log: it reads energy_j_per_token */
    list[n++] = loom_train_observer_metrics_log(o);
    for (int i = 0; i < o->n_observers && n < LOOM_TRAIN_MAX_OBS - 3; i++) list[n++] = o->observers[i];
    list[n++] = loom_train_observer_sampler(o);
    list[n++] = loom_train_observer_checkpoint(o);
    list[n++] = loom_train_observer_plot(o);
    for (int i = 0; i < n; i++)
        if (list[i]) j->obs[j->run.n_obs++] = list[i];
    j->run.obs = j->obs;
}

loom_status loom_train_setup(loom_train_job_t *j, loom_dist_t *dist) {
    const loom_train_opts_t *o = &j->o;
    loom_train_run_t *run = &j->run;
    j->lock_fd = -1;
    *run = (loom_train_run_t){.o = o, .dist = dist, .lead = o->rank == 0, .multi = o->world_size > 1,
                              .last_loss = NAN, .last_val = -1, .energy_j_per_token = NAN};
    add_observers(j); /* first: teardown frees them, the caller's included, whatever fails below */
    /* rank = (dp x pp + stage) x tp + tp index (parallel/dist.h): a replica is tp x pp consecutive ranks */
    int per_replica = (o->tp > 1 ? o->tp : 1) * (o->pp > 1 ? o->pp : 1);
    run->dp_size = o->world_size / per_replica;
    run->dp_rank = o->rank / per_replica;
    if (!o->out || !*o->out) return loom_error(LOOM_EINVAL, "no --out folder: name where the run goes, e.g. --out runs/first");
    /* One writer per run folder, before anything in it is touched. */
    step_modes(j);
    LOOM_TRY(loom_dataset_open(&j->ds, o->data, o->val_fraction));
    run->data = j->ds;
    run->tok = loom_dataset_tokenizer(j->ds);
    run->have_val = loom_dataset_ntokens(j->ds, LOOM_SPLIT_VAL) > 1;
    LOOM_TRY(resolve_model(j));
    run->tokens_per_step = (size_t)run->B * run->T * o->grad_accum * run->dp_size;
    LOOM_TRY(open_backend(j, dist));
    LOOM_TRY(build_model(j, dist));
    LOOM_TRY(write_run_folder(j));
    run->flops_per_token = loom_gpt_flops_per_token(&run->model->cfg, run->T);
    run->resumed_from = o->resume ? j->rck : NULL;
    run->resumed_step = j->rst.step;
    run->first_step = j->rst.step + 1;
    run->step = j->rst.step;
    run->data_pos = j->rst.data_pos;
    j->peak = run->be->peak_flops;
    /* Ranks measure their peak on a shared machine at different moments
     * and get different figures; MFU is one job's number, so rank 0's
     * measure is every rank's. */
    if (run->multi) LOOM_TRY(loom_dist_broadcast(dist, &j->peak, sizeof j->peak, 0));
    j->opt = (loom_optim_t){.beta1 = (float)o->beta1, .beta2 = (float)o->beta2, .eps = 1e-8f,
                            .weight_decay = (float)o->weight_decay, .clip = (float)o->clip};
    size_t per_rank = (size_t)run->B * run->T * o->grad_accum;
    j->in = loom_malloc(per_rank * sizeof(int));
    j->tg = loom_malloc(per_rank * sizeof(int));
    report_setup(j);
    return LOOM_OK;
}

void loom_train_teardown(loom_train_job_t *j) {
    for (int i = 0; i < j->run.n_obs; i++)
        if (j->obs[i]->free) j->obs[i]->free(j->obs[i]->ctx);
    free(j->in);
    free(j->tg);
    loom_step_graph_free(j->sg);
    loom_dp_free(j->run.dp);
    loom_train_teardown_tp(j); /* the shard is the tp's: run.model is NULL after */
    if (j->run.pp) loom_pp_free(j->run.pp); /* frees its stage model */
    else loom_gpt_free(j->run.model);
    loom_dataset_free(j->ds);
    if (j->lock_fd >= 0) close(j->lock_fd);
    j->lock_fd = -1;
}
