/* checkpoint: the checkpoint policy as an observer -- one checkpoint every
 * --ckpt-every steps and one when the loop ends (also after a signal) --
 * and the two halves of the format the loop needs: writing every rank's
 * part into one atomic checkpoint, and loading it back on --resume. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "ckpt/optim.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "train/train_impl.h"

/* Every rank's AdamW state into the checkpoint being written. Rank 0
 * calls this from inside loom_run_save_checkpoint_with with the temporary
 * folder; the others call it with NULL at the same point of the loop and
 * learn the folder by broadcast. */
static loom_status write_optim_shards(const char *tmp_dir, void *vrun) {
    loom_train_run_t *run = vrun;
    loom_gpt_t *m = run->model;
    int rank = loom_dist_rank(run->dist), world = loom_dist_size(run->dist), zero = run->o->zero;
    char dir[4096] = "", path[4200];
    if (tmp_dir) snprintf(dir, sizeof dir, "%s", tmp_dir);
    LOOM_TRY(loom_dist_broadcast(run->dist, dir, sizeof dir, 0));
    loom_status s = LOOM_OK;
    if (zero >= 1 || rank == 0) {
        size_t lo = 0, hi = m->num_params;
        float *am = m->m, *av = m->v;
        if (run->dp) loom_dp_shard(run->dp, &lo, &hi, &am, &av);
        int w = zero >= 1 ? world : 1;
        loom_optim_shard_path(path, sizeof path, dir, rank, w);
        loom_optim_shard_t h = {(uint32_t)rank, (uint32_t)w, (uint32_t)zero, m->num_params, lo, hi, (uint64_t)run->step};
        s = loom_optim_shard_save(path, &h, m->be, am, av);
    }
    double failed = s != LOOM_OK;
    LOOM_TRY(loom_dist_allreduce_f64(run->dist, &failed, 1));
    if (s == LOOM_OK && failed > 0) s = loom_error(LOOM_EIO, "%.0f rank(s) could not write their optimizer shard into %s", failed, dir);
    return s;
}

loom_status loom_train_write_checkpoint(loom_train_run_t *run, const loom_ckpt_state_t *st, int final) {
    double t0 = loom_now();
    if (run->lead) LOOM_TRY(loom_run_save_checkpoint_with(run->o->out, run->model, st, run->o->keep_ckpts, write_optim_shards, run));
    else LOOM_TRY(write_optim_shards(NULL, run));
    loom_ckpt_event_t ev = {*st, run->o->out, loom_now() - t0, final};
    return loom_train_emit_checkpoint(run, &ev);
}

loom_status loom_train_load_checkpoint(loom_train_job_t *j) {
    loom_gpt_t *m = j->run.model;
    int zero = j->o.zero;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", j->rck);
    LOOM_TRY(loom_safetensors_load_gpt(m, path));
    size_t lo = 0, hi = m->num_params;
    float *am = m->m, *av = m->v;
    if (j->run.dp) loom_dp_shard(j->run.dp, &lo, &hi, &am, &av);
    int w = zero >= 1 ? j->o.world_size : 1, r = zero >= 1 ? j->o.rank : 0;
    loom_optim_shard_path(path, sizeof path, j->rck, r, w);
    if (!loom_path_exists(path))
        return loom_error(LOOM_EINVAL, "%s: no optimizer state for rank %d of %d (ZeRO-%d); resume with the --nproc and --zero the run was saved with",
                          path, r, w, zero);
    loom_optim_shard_t want = {(uint32_t)r, (uint32_t)w, (uint32_t)zero, m->num_params, lo, hi, 0}, got;
    return loom_optim_shard_load(path, &want, m->be, am, av, &got);
}

/* ---- the policy ---- */

static uint64_t tok_hash(const loom_train_run_t *run) { return run->tok ? loom_tokenizer_hash(run->tok) : 0; }

/* fp16: the loss scaler's state goes into the checkpoint, for --resume. */
static void add_loss_scaler(loom_ckpt_state_t *st, const loom_train_run_t *run) {
    const loom_loss_scaler_t *ls = run->loss_scaler;
    if (ls) st->loss_scale = ls->scale, st->loss_scale_good = ls->good, st->loss_scale_skipped = ls->skipped;
}

static loom_status ckpt_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    const loom_train_opts_t *o = run->o;
    if (o->ckpt_every <= 0 || r->step % o->ckpt_every != 0 || r->step == o->steps) return LOOM_OK;
    loom_ckpt_state_t st = {r->step, r->loss, r->val_loss, run->data_pos, tok_hash(run), 0, 0, 0};
    add_loss_scaler(&st, run);
    return loom_train_write_checkpoint(run, &st, 0);
}

/* The last completed step, unless the loop failed or ran no step. */
static loom_status ckpt_stop(void *ctx, loom_train_run_t *run, loom_status s) {
    if (s != LOOM_OK || run->step < run->first_step) return LOOM_OK;
    loom_ckpt_state_t st = {run->step, run->last_loss, run->last_val, run->data_pos, tok_hash(run), 0, 0, 0};
    add_loss_scaler(&st, run);
    return loom_train_write_checkpoint(run, &st, 1);
}

loom_train_observer_t *loom_train_observer_checkpoint(const loom_train_opts_t *o) {
    loom_train_observer_t *ob = loom_calloc(1, sizeof *ob);
    *ob = (loom_train_observer_t){.name = "checkpoint", .ctx = ob, .after_step = ckpt_after_step, .on_stop = ckpt_stop, .free = free};
    return ob;
}
