/* setup_tp: `loom train --tp N` (parallel/tp.h). The world splits into
 * groups of N consecutive ranks (tp innermost) and the replicas across
 * them (dp); each rank cuts its shard from the whole model that setup
 * built (initialized from the seed, or loaded), and a resumed checkpoint
 * -- always the single-model layout, whichever layout wrote it -- is
 * sliced the same way. No rank keeps the whole model: checkpoints are
 * written unit by unit (train/ckpt_stream.h). */
#include <stdlib.h>

#include "ckpt/safetensors.h"
#include "parallel/tp.h"
#include "train/ckpt_stream.h"
#include "train/train_impl.h"

static loom_status make_groups(loom_train_job_t *j, loom_dist_t *dist) {
    const loom_train_opts_t *o = &j->o;
    int tp = o->tp, r = o->rank;
    if (o->world_size % tp)
        return loom_error(LOOM_EINVAL, "--tp %d does not divide the %d ranks; launch a multiple of %d ranks (--nproc)", tp, o->world_size, tp);
    LOOM_TRY(loom_dist_split(dist, r / tp, r, &j->tp_group));
    return loom_dist_split(dist, r % tp, r, &j->dp_group);
}

/* The resumed checkpoint's AdamW moments, unit by unit, each cut into
 * this rank's slice (train/ckpt_stream.h: no rank reads them whole):
 * straight into the shard's moments, or under ZeRO into part-sized
 * buffers first, of which this replica keeps its share. */
typedef struct {
    loom_tp_t *tp;
    float *dst[3]; /* the shard's block: -, m, v (backend memory) */
} moments_t;

static loom_status put_moment(void *vc, int which, int i, int l, const float *x) {
    moments_t *c = vc;
    loom_tensor_info_t tab[LOOM_NPARAMS];
    size_t P, off, n;
    loom_gpt_param_table(loom_tp_full_config(c->tp), tab, &P);
    n = loom_ckpt_unit_floats(tab, i, l, &off);
    loom_tp_slice_range(c->tp, off, off + n, x, c->dst[which]);
    return LOOM_OK;
}

static loom_status load_moments(loom_train_job_t *j) {
    loom_tp_t *tp = j->run.tp;
    loom_gpt_t *m = loom_tp_model(tp);
    moments_t c = {tp, {NULL, m->m, m->v}};
    int staged = loom_dp_sharded(j->tp_dp);
    if (staged) LOOM_TRY(loom_dp_stage_alloc(m, 1 << LOOM_UNIT_M | 1 << LOOM_UNIT_V, c.dst));
    loom_optim_shard_t saved = {0};
    loom_status s = loom_ckpt_stream_read(loom_tp_full_config(tp), j->rck, j->rst.step, 1 << LOOM_UNIT_M | 1 << LOOM_UNIT_V, NULL, put_moment, &c, &saved);
    if (staged) s = loom_dp_stage_finish(j->tp_dp, m, c.dst, s);
    LOOM_TRY(s);
    loom_info("loom train: --tp %d: the checkpoint's weights and AdamW state (%u shard(s), ZeRO-%u) sliced into this layout", j->o.tp, saved.world,
              saved.zero);
    return LOOM_OK;
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
    if (j->o.resume) LOOM_TRY(load_moments(j));
    /* the shard is the run's model from here; no rank keeps the whole one
     * (checkpoints are written unit by unit: train/ckpt_stream.h) */
    run->model = m;
    loom_gpt_free(full);
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
    loom_dp_free(j->tp_dp); /* before the shard it reduces */
    j->tp_dp = NULL;
    if (run->tp) {
        loom_tp_free(run->tp); /* the shard with it */
        run->tp = NULL;
        run->model = NULL;
    }
    loom_dist_free(j->tp_group);
    loom_dist_free(j->dp_group);
    j->tp_group = j->dp_group = NULL;
}
