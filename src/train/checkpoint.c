/* checkpoint: the checkpoint policy as an observer -- one checkpoint every
 * --ckpt-every steps and when --ckpt-every-minutes have passed, and one
 * when the loop ends (also after a signal), each written in the background
 * by ckpt/writer.h -- and loading a checkpoint back on --resume, on any
 * number of ranks (the AdamW shards are regathered: ckpt/optim.h). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "core/clock.h"
#include "ckpt/optim.h"
#include "ckpt/run.h"
#include "ckpt/safetensors.h"
#include "ckpt/writer.h"
#include "train/pipeline.h"
#include "train/train_impl.h"
#include "train/zero3.h"

loom_status loom_train_load_checkpoint(loom_train_job_t *j) {
    loom_gpt_t *m = j->run.model;
    if (j->run.pp) return loom_pp_load(j->run.pp, j->rck, j->rst.step);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", j->rck);
    loom_zero3_t *z3 = loom_dp_zero3(j->run.dp); /* ZeRO-3: load whole, keep this rank's slice */
    if (z3) LOOM_TRY(loom_zero3_unshard(z3));
    LOOM_TRY(loom_safetensors_load_gpt(m, path));
    if (z3) LOOM_TRY(loom_zero3_adopt(z3));
    size_t lo = 0, hi = m->num_params;
    float *am = m->m, *av = m->v;
    if (j->run.dp) loom_dp_shard(j->run.dp, &lo, &hi, &am, &av);
    float *h = loom_malloc(2 * (hi - lo) * sizeof(float) + 1);
    loom_optim_shard_t saved = {0};
    const loom_ckpt_state_t *st = &j->rst;
    loom_status s = loom_optim_gather(j->rck, m->num_params, (uint64_t)st->step, lo, hi, h, h + (hi - lo), &saved);
    int want_w = st->zero >= 1 ? st->world_size : 1;
    int single = saved.world == 1 && saved.zero == 0; /* the one AdamW file --tp and --pp runs write at any --zero */
    if (s == LOOM_OK && st->world_size > 0 && !single && (saved.world != (uint32_t)want_w || saved.zero != (uint32_t)st->zero))
        s = loom_error(LOOM_EFORMAT, "%s: optimizer shards of %u rank(s) at ZeRO-%u, but its state.json says %d rank(s) at ZeRO-%d; the checkpoint is mixed up",
                       j->rck, saved.world, saved.zero, st->world_size, st->zero);
    if (s == LOOM_OK && hi > lo) {
        m->be->upload(am, h, (hi - lo) * sizeof(float));
        m->be->upload(av, h + (hi - lo), (hi - lo) * sizeof(float));
    }
    free(h);
    int now_w = j->o.zero >= 1 ? j->o.world_size : 1;
    if (s == LOOM_OK && (saved.world != (uint32_t)now_w || saved.zero != (uint32_t)j->o.zero))
        loom_info("loom train: AdamW state regathered from %u shard(s) (ZeRO-%u) for %d rank(s) at ZeRO-%d", saved.world, saved.zero,
                  j->o.world_size, j->o.zero);
    return s;
}

/* ---- the policy ---- */

typedef struct {
    loom_ckpt_writer_t *w;
    double last_t;        /* when the last checkpoint was taken (or the loop started), loom_clock_now */
    long long last_step;  /* its step (the resumed one at start) */
    int time_due;         /* --ckpt-every-minutes have passed (agreed by every rank) */
    int outstanding;      /* several ranks: a checkpoint not yet committed */
    int taken;
    loom_train_observer_t *self;
} ckpt_t;

static loom_ckpt_state_t state_of(const loom_train_run_t *run, long long step, double loss, double val) {
    const loom_train_opts_t *o = run->o;
    loom_ckpt_state_t st = {.step = step, .train_loss = loss, .val_loss = val, .data_pos = run->data_pos,
                            .tokenizer_hash = run->tok ? loom_tokenizer_hash(run->tok) : 0, .world_size = run->dp_size,
                            .zero = o->zero, .batch = run->B, .seq = run->T, .grad_accum = o->grad_accum};
    const loom_loss_scaler_t *ls = run->loss_scaler; /* fp16: --resume continues the scaler */
    if (ls) st.loss_scale = ls->scale, st.loss_scale_good = ls->good, st.loss_scale_skipped = ls->skipped;
    return st;
}

/* The sum over ranks the writer needs, through the run's collective. */
static loom_status agree(double *v, int n, void *vrun) {
    loom_train_run_t *run = vrun;
    return run->multi ? loom_dist_allreduce_f64(run->dist, v, n) : LOOM_OK;
}

/* Snapshot this step's state and hand it to the writer. */
static loom_status take(ckpt_t *c, loom_train_run_t *run, const loom_ckpt_state_t *st, int final) {
    loom_gpt_t *m = run->model;
    size_t lo = 0, hi = m->num_params;
    float *am = m->m, *av = m->v;
    if (run->dp) loom_dp_shard(run->dp, &lo, &hi, &am, &av);
    double t0 = loom_now();
    if (run->pp) { /* the single-model layout: rank 0 writes the whole model and its AdamW state */
        LOOM_TRY(loom_pp_gather(run->pp, &am, &av));
        hi = loom_pp_ckpt_model(run->pp)->num_params;
    }
    if (c->outstanding) { /* the previous one is not committed yet: finish it first */
        LOOM_TRY(loom_ckpt_writer_settle(c->w, agree, run));
        c->outstanding = 0;
    }
    if (run->tp) LOOM_TRY(loom_train_tp_gather(run, &am, &av, &hi)); /* the single-model layout, on rank 0 */
    loom_status s = loom_ckpt_writer_submit(c->w, st, am, av, lo, hi);
    if (run->tp) loom_train_tp_release(run);
    LOOM_TRY(s);
    c->outstanding = run->multi;
    c->last_step = st->step;
    c->last_t = loom_clock_now();
    c->taken++;
    loom_ckpt_event_t ev = {*st, run->o->out, loom_now() - t0, final};
    return loom_train_emit_checkpoint(run, &ev);
}

/* ZeRO-3: the checkpoint's weights are gathered layer by layer. */
static loom_status gather_params(void *z3, float *host) { return loom_zero3_gather_host(z3, host); }

static loom_status ckpt_start(void *ctx, loom_train_run_t *run) {
    ckpt_t *c = ctx;
    const loom_train_opts_t *o = run->o;
    loom_zero3_t *z3 = loom_dp_zero3(run->dp);
    loom_gpt_t *whole = run->pp ? loom_pp_ckpt_model(run->pp) : run->ckpt_model ? run->ckpt_model : run->model;
    int single = run->tp || run->pp; /* they write the single-model layout: rank 0 the whole AdamW state */
    loom_ckpt_writer_opts_t wo = {.run = o->out, .m = whole, .rank = o->rank, .world = o->world_size, .zero = single ? 0 : o->zero,
                                  .keep = o->keep_ckpts, .async = !o->ckpt_sync, .gather_params = z3 ? gather_params : NULL,
                                  .gather_ctx = z3};
    LOOM_TRY(loom_ckpt_writer_open(&c->w, &wo));
    c->last_t = loom_clock_now();
    c->last_step = run->resumed_step;
    return LOOM_OK;
}

/* Several ranks: one collective answers "is every rank's part of the
 * pending checkpoint written?" and "is a timed checkpoint due?" (rank 0's
 * clock), then rank 0 commits. Only when there is something to ask. */
static loom_status ckpt_before_step(void *ctx, loom_train_run_t *run, long long step) {
    ckpt_t *c = ctx;
    double minutes = run->o->ckpt_every_minutes;
    int due = minutes > 0 && loom_clock_now() - c->last_t >= 60 * minutes;
    if (!run->multi) {
        c->time_due = due;
        return LOOM_OK;
    }
    if (!c->outstanding && minutes <= 0) return LOOM_OK;
    double v[3];
    loom_ckpt_writer_poll(c->w, v);
    v[2] = run->lead && due;
    LOOM_TRY(loom_dist_allreduce_f64(run->dist, v, 3));
    c->time_due = v[2] > 0;
    if (c->outstanding && v[0] == 0) {
        c->outstanding = 0;
        LOOM_TRY(loom_ckpt_writer_agreed(c->w, v));
    }
    return LOOM_OK;
}

static loom_status ckpt_after_step(void *ctx, loom_train_run_t *run, const loom_step_record_t *r) {
    ckpt_t *c = ctx;
    const loom_train_opts_t *o = run->o;
    if (c->outstanding && loom_train_test_hold_step(run) == r->step) { /* every rank: the same condition */
        LOOM_TRY(loom_ckpt_writer_settle(c->w, agree, run));
        c->outstanding = 0;
    }
    int due = (o->ckpt_every > 0 && r->step % o->ckpt_every == 0) || c->time_due;
    if (!due || r->step == o->steps) return LOOM_OK; /* the last step's is written by on_stop */
    loom_ckpt_state_t st = state_of(run, r->step, r->loss, r->val_loss);
    return take(c, run, &st, 0);
}

/* The last completed step (unless it was just checkpointed), then wait
 * until every rank's part is written and rank 0 has committed it, so no
 * rank exits while another is still writing. After a failure only this
 * rank's own write is waited for. */
static loom_status ckpt_stop(void *ctx, loom_train_run_t *run, loom_status s) {
    ckpt_t *c = ctx;
    if (s != LOOM_OK) {
        loom_ckpt_writer_wait(c->w);
        return LOOM_OK;
    }
    if (run->step >= run->first_step && run->step != c->last_step) {
        loom_ckpt_state_t st = state_of(run, run->step, run->last_loss, run->last_val_step == run->step ? run->last_val : -1);
        LOOM_TRY(take(c, run, &st, 1));
    }
    LOOM_TRY(loom_ckpt_writer_settle(c->w, agree, run));
    c->outstanding = 0;
    double blocked, written;
    loom_ckpt_writer_times(c->w, &blocked, &written);
    if (c->taken)
        loom_info("loom train: %d checkpoint(s): %.2fs of the loop's time (snapshots%s), %.2fs writing%s", c->taken, blocked,
                  run->o->ckpt_sync ? " and writes" : ", waits", written, run->o->ckpt_sync ? "" : " in the background");
    return LOOM_OK;
}

static void ckpt_free(void *ctx) {
    ckpt_t *c = ctx;
    loom_ckpt_writer_free(c->w);
    free(c->self);
    free(c);
}

loom_train_observer_t *loom_train_observer_checkpoint(const loom_train_opts_t *o) {
    ckpt_t *c = loom_calloc(1, sizeof *c);
    loom_train_observer_t *ob = c->self = loom_calloc(1, sizeof *ob);
    ob->name = "checkpoint";
    ob->ctx = c;
    ob->on_start = ckpt_start;
    ob->before_step = ckpt_before_step;
    ob->after_step = ckpt_after_step;
    ob->on_stop = ckpt_stop;
    ob->free = ckpt_free;
    return ob;
}
