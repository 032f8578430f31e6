/* setup_tp: `loom train --tp N` (parallel/tp.h). The world splits into
 * groups of N consecutive ranks (tp innermost) and the replicas across
 * them (dp); each rank cuts its shard from the whole model that setup
 * built (initialized from the seed, or loaded), and a resumed checkpoint
 * -- always the single-model layout, whichever layout wrote it -- is
 * sliced the same way. Rank 0 keeps the whole model's parameter block to
 * assemble checkpoints in that layout. */
#include <stdlib.h>

#include "ckpt/optim.h"
#include "ckpt/safetensors.h"
#include "parallel/tp.h"
#include "train/train_impl.h"

static loom_status make_groups(loom_train_job_t *j, loom_dist_t *dist) {
    const loom_train_opts_t *o = &j->o;
    int tp = o->tp, r = o->rank;
    if (o->world_size % tp)
        return loom_error(LOOM_EINVAL, "--tp %d does not divide the %d ranks; launch a multiple of %d ranks (--nproc)", tp, o->world_size, tp);
    LOOM_TRY(loom_dist_split(dist, r / tp, r, &j->tp_group));
    return loom_dist_split(dist, r % tp, r, &j->dp_group);
}

/* The resumed checkpoint's AdamW moments, whole, then this rank's slice
 * (its ZeRO shard of that under --zero). */
static loom_status load_moments(loom_train_job_t *j, const loom_gpt_t *full) {
    loom_tp_t *tp = j->run.tp;
    loom_gpt_t *m = loom_tp_model(tp);
    size_t P = full->num_params, Pl = m->num_params;
    float *h = loom_malloc(2 * P * sizeof(float)), *l = loom_malloc(2 * Pl * sizeof(float));
    loom_optim_shard_t saved = {0};
    loom_status s = loom_optim_gather(j->rck, P, (uint64_t)j->rst.step, 0, P, h, h + P, &saved);
    if (s == LOOM_OK) {
        loom_tp_slice(tp, h, l);
        loom_tp_slice(tp, h + P, l + Pl);
        s = loom_dp_load_block(j->tp_dp, m, NULL, l, l + Pl);
    }
    if (s == LOOM_OK) {
        loom_info("loom train: --tp %d: the checkpoint's weights and AdamW state (%u shard(s), ZeRO-%u) sliced into this layout", j->o.tp,
                  saved.world, saved.zero);
    }
    free(h);
    free(l);
    return s;
}

loom_status loom_train_setup_tp(loom_train_job_t *j, loom_dist_t *dist) {
    loom_train_run_t *run = &j->run;
    loom_gpt_t *full = run->model;
    LOOM_TRY(make_groups(j, dist));
    if (j->o.resume) {
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors", j->rck);
        LOOM_TRY(loom_safetensors_load_gpt(full, path));
    }
    LOOM_TRY(loom_tp_init(&run->tp, full, run->be, j->tp_group, j->dp_group));
    loom_gpt_t *m = loom_tp_model(run->tp);
    /* The replicas reduce through the data-parallel code over the dp group
     * (bucketed, overlapped; ZeRO 1-3 shard the shard's block over it). */
    if (run->dp_size > 1 || j->o.zero > 0) LOOM_TRY(loom_dp_init(&j->tp_dp, m, j->dp_group, &j->dpo));
    if (j->o.resume) LOOM_TRY(load_moments(j, full));
    /* the shard is the run's model from here; the whole one stays on rank 0 for checkpoints */
    run->model = m;
    if (run->lead) run->ckpt_model = full;
    else loom_gpt_free(full);
    loom_gpt_set_recompute(m, (loom_recompute)j->recompute);
    LOOM_TRY(loom_gpt_alloc_acts(m, run->B, run->T));
    const loom_gpt_config_t *f = loom_tp_full_config(run->tp), *c = &m->cfg;
    loom_info("loom train: tensor parallel: %d group(s) of %d consecutive ranks over %s, one per data-parallel replica; a shard holds %d of %d heads, "
              "%d of %d kv heads (%s), %d of %d hidden units, %d vocabulary rows: %.2f MB of parameters of the whole %.2f MB",
              run->dp_size, j->o.tp, loom_dist_name(dist), c->n_head, f->n_head, c->n_kv_heads, f->n_kv_heads,
              f->n_kv_heads % j->o.tp ? "shared" : "split", c->ffn_hidden, f->ffn_hidden, c->vocab_size, m->num_params * 4e-6,
              loom_gpt_num_params(f) * 4e-6);
    if (j->o.zero)
        loom_info("loom train: --tp %d: ZeRO-%d over %d data-parallel replicas of each shard (its %s sharded over the dp group)", j->o.tp, j->o.zero,
                  run->dp_size, j->o.zero == 1 ? "AdamW state" : j->o.zero == 2 ? "AdamW state and gradients" : "weights, gradients and AdamW state");
    return LOOM_OK;
}

void loom_train_teardown_tp(loom_train_job_t *j) {
    loom_train_run_t *run = &j->run;
    loom_train_tp_release(run);
    loom_dp_free(j->tp_dp); /* before the shard it reduces */
    j->tp_dp = NULL;
    if (run->tp) {
        loom_tp_free(run->tp); /* the shard with it */
        run->tp = NULL;
        run->model = NULL;
    }
    loom_gpt_free(run->ckpt_model);
    run->ckpt_model = NULL;
    loom_dist_free(j->tp_group);
    loom_dist_free(j->dp_group);
    j->tp_group = j->dp_group = NULL;
}

/* run is the first member of its job (train_impl.h). */
static loom_train_job_t *job_of(loom_train_run_t *run) { return (loom_train_job_t *)run; }

/* The first replica: its tp group's local blocks (params, m, v) assembled
 * into the whole model on rank 0. */
static loom_status gather_whole(loom_train_run_t *run, float *const src[3]) {
    loom_train_job_t *j = job_of(run);
    loom_gpt_t *full = run->ckpt_model;
    size_t P = full ? full->num_params : 0;
    float *host = full ? loom_malloc(P * sizeof(float)) : NULL;
    loom_status s = loom_tp_gather(run->tp, src[0], host);
    if (s == LOOM_OK && full) full->be->upload(full->params, host, P * sizeof(float));
    float **dst[2] = {&j->tp_m, &j->tp_v};
    for (int k = 0; k < 2 && s == LOOM_OK; k++) {
        s = loom_tp_gather(run->tp, src[k + 1], host);
        if (s != LOOM_OK || !full) continue;
        *dst[k] = full->be->alloc(P * sizeof(float));
        if (!*dst[k]) s = loom_error(LOOM_ENOMEM, "checkpoint: cannot allocate %.1f MB for the whole AdamW state", P * 4e-6);
        else full->be->upload(*dst[k], host, P * sizeof(float));
    }
    free(host);
    return s;
}

loom_status loom_train_tp_gather(loom_train_run_t *run, float **m, float **v, size_t *hi) {
    loom_train_job_t *j = job_of(run);
    loom_gpt_t *shard = run->model, *full = run->ckpt_model;
    *m = *v = NULL;
    *hi = 0;
    float *src[3] = {shard->params, shard->m, shard->v}, *own[3] = {NULL, NULL, NULL};
    loom_status s = LOOM_OK;
    if (loom_dp_sharded(j->tp_dp)) { /* ZeRO: first each replica's shards, over the dp group */
        s = loom_dp_gather_state(j->tp_dp, shard, own);
        for (int k = 0; k < 3; k++) src[k] = own[k];
    }
    if (s == LOOM_OK && run->dp_rank == 0) s = gather_whole(run, src); /* every replica holds the same: the first gives */
    for (int k = 0; k < 3; k++)
        if (own[k]) shard->be->free(own[k]);
    *m = j->tp_m;
    *v = j->tp_v;
    *hi = full ? full->num_params : 0;
    return s;
}

void loom_train_tp_release(loom_train_run_t *run) {
    loom_train_job_t *j = job_of(run);
    if (j->tp_m) run->be->free(j->tp_m);
    if (j->tp_v) run->be->free(j->tp_v);
    j->tp_m = j->tp_v = NULL;
}
