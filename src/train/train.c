/* train: the step loop and the points where it calls its observers (the
 * order is in train.h). Setup and teardown are in setup.c, the built-in
 * observers in observers.c and checkpoint.c. */
#define _GNU_SOURCE
#include "train.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "core/clock.h"
#include "train/eval.h"
#include "parallel/tp.h"
#include "train/pipeline.h"
#include "train/train_impl.h"

double loom_lr_at(long long t, long long steps, int warmup, double lr, double min_lr_ratio) {
    if (warmup > 0 && t <= warmup) return lr * (double)t / warmup;
    if (steps <= warmup) return lr;
    double progress = (double)(t - warmup) / (double)(steps - warmup);
    if (progress > 1) progress = 1;
    double min_lr = lr * min_lr_ratio;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

void loom_train_request_stop(loom_train_run_t *run, int sig) {
    if (!run->stop_signal) run->stop_signal = sig ? sig : SIGTERM;
}

/* ---- the observer points ---- */

#define EMIT(run, hook, ...)                                                                   \
    do {                                                                                       \
        for (int i_ = 0; i_ < (run)->n_obs; i_++) {                                            \
            loom_train_observer_t *ob_ = (run)->obs[i_];                                       \
            if (ob_->hook) LOOM_TRY(ob_->hook(ob_->ctx, (run), __VA_ARGS__));                  \
        }                                                                                      \
    } while (0)

static loom_status emit_start(loom_train_run_t *run) {
    for (int i = 0; i < run->n_obs; i++)
        if (run->obs[i]->on_start) LOOM_TRY(run->obs[i]->on_start(run->obs[i]->ctx, run));
    return LOOM_OK;
}

static loom_status emit_before_step(loom_train_run_t *run, long long step) {
    EMIT(run, before_step, step);
    return LOOM_OK;
}

static loom_status emit_eval(loom_train_run_t *run, long long step, double val) {
    EMIT(run, on_eval, step, val);
    return LOOM_OK;
}

static loom_status emit_after_step(loom_train_run_t *run, const loom_step_record_t *rec) {
    EMIT(run, after_step, rec);
    return LOOM_OK;
}

loom_status loom_train_emit_checkpoint(loom_train_run_t *run, const loom_ckpt_event_t *ev) {
    EMIT(run, on_checkpoint, ev);
    return LOOM_OK;
}

/* Every observer's on_stop, even after one failed; the first error wins. */
static loom_status emit_stop(loom_train_run_t *run, loom_status s) {
    for (int i = 0; i < run->n_obs; i++) {
        loom_train_observer_t *ob = run->obs[i];
        if (!ob->on_stop) continue;
        loom_status r = ob->on_stop(ob->ctx, run, s);
        if (s == LOOM_OK) s = r;
    }
    return s;
}

static void emit_end(loom_train_run_t *run, loom_status s) {
    for (int i = 0; i < run->n_obs; i++)
        if (run->obs[i]->on_end) run->obs[i]->on_end(run->obs[i]->ctx, run, s);
}

/* ---- one step ---- */

/* MFU's peak rises to a step that beat it (below); with several ranks, to
 * the ranks' mean best, agreed on before the next step, so that one job
 * keeps one peak. */
static void raise_peak(loom_train_job_t *j, double achieved, long long step) {
    if (j->peak <= 0 || achieved <= j->peak) return;
    if (!j->peak_raised)
        loom_warn("step %lld ran at %.1f GFLOP/s per rank, above the measured peak of %.1f; "
                  "the peak measurement ran on a busy machine, so MFU now uses the best observed rate",
                  step, achieved / 1e9, j->peak / 1e9);
    j->peak = achieved;
    j->peak_raised = 1;
}

/* A stop asked for on any rank stops every rank at the same step; the
 * same collective carries each rank's best achieved FLOP/s. */
static loom_status agree_on_stop(loom_train_job_t *j, long long step) {
    loom_train_run_t *run = &j->run;
    double v[2] = {run->stop_signal, j->best_achieved};
    if (run->multi) {
        LOOM_TRY(loom_dist_allreduce_f64(run->dist, v, 2));
        raise_peak(j, v[1] / j->o.world_size, step - 1);
    }
    if (v[0] > 0) loom_train_request_stop(run, 0);
    return LOOM_OK;
}

/* This rank's micro-batches: disjoint slices of the global batch. */
static void next_batches(loom_train_job_t *j) {
    loom_train_run_t *run = &j->run;
    size_t BT = (size_t)run->B * run->T, ntrain = loom_dataset_ntokens(j->ds, LOOM_SPLIT_TRAIN);
    for (int k = 0; k < j->o.grad_accum; k++) {
        size_t p = (run->data_pos + ((size_t)k * run->dp_size + run->dp_rank) * BT) % ntrain;
        loom_dataset_batch(j->ds, LOOM_SPLIT_TRAIN, p, run->B, run->T, j->in + k * BT, j->tg + k * BT);
    }
    run->data_pos = (run->data_pos + run->tokens_per_step) % ntrain;
}

/* The optimizer step itself: device-resident where the backend has it. */
static loom_status optimizer_step(loom_train_job_t *j, loom_step_record_t *rec) {
    loom_train_run_t *run = &j->run;
    if (run->pp) {
        double sched;
        LOOM_TRY(loom_pp_step(run->pp, j->in, j->tg, &j->opt, (float)rec->lr, (int)rec->step, &rec->loss, &rec->grad_norm));
        loom_pp_last_times(run->pp, &rec->comm_pp_s, &rec->bubble_s, &sched);
        return LOOM_OK;
    }
    if (run->tp)
        return loom_train_step_tp(run->tp, j->tp_dp, j->in, j->tg, run->B, run->T, j->o.grad_accum, &j->opt, (float)rec->lr,
                                  (int)rec->step, &rec->loss, &rec->grad_norm);
    if (!j->sg)
        return loom_train_step_dp(run->model, run->dp, j->in, j->tg, run->B, run->T, j->o.grad_accum, &j->opt,
                                  (float)rec->lr, (int)rec->step, &rec->loss, &rec->grad_norm);
    loom_step_result_t r = {0};
    LOOM_TRY(loom_step_graph_run(j->sg, j->in, j->tg, run->B, run->T, j->o.grad_accum, &j->opt, (float)rec->lr,
                                 (int)rec->step, run->loss_scaling ? &j->ls : NULL, &r));
    rec->loss = r.loss;
    rec->grad_norm = r.grad_norm;
    rec->skipped = r.skipped;
    if (r.skipped)
        loom_info("%sloom train: step %lld skipped: inf/nan gradients at loss scale %g; scale now %g (%lld skipped so far)",
                  isatty(2) ? "\n" : "", rec->step, rec->loss_scale, j->ls.scale, j->ls.skipped);
    return LOOM_OK;
}

/* Model FLOPs utilization of a step. A peak measured while other work
 * loaded the machine is too low; a step that beats it proves more is
 * possible, so the peak rises to what was achieved (several ranks: at the
 * next step, to the ranks' mean best) and MFU never reads above 100%. */
static double step_mfu(loom_train_job_t *j, const loom_step_record_t *rec) {
    double achieved = j->run.flops_per_token * rec->tokens_per_s / j->o.world_size;
    if (achieved > j->best_achieved) j->best_achieved = achieved;
    if (!j->run.multi) raise_peak(j, achieved, rec->step);
    if (j->peak <= 0) return -1;
    return achieved < j->peak ? achieved / j->peak : 1.0;
}

static loom_status run_step(loom_train_job_t *j, long long step, loom_step_record_t *rec) {
    loom_train_run_t *run = &j->run;
    const loom_train_opts_t *o = &j->o;
    double t_data = loom_now();
    next_batches(j);
    *rec = (loom_step_record_t){.step = step, .val_loss = -1, .loss_scale = run->loss_scaling ? j->ls.scale : 1.0f,
                                .lr = loom_lr_at(step, o->steps, o->warmup, o->lr, o->min_lr_ratio)};
    double t0 = loom_now(), tp0 = loom_tp_wait_seconds(run->tp), dp0 = loom_tp_dp_wait_seconds(run->tp);
    rec->data_s = t0 - t_data;
    LOOM_TRY(optimizer_step(j, rec));
    run->be->sync();
    rec->step_s = loom_now() - t0;
    rec->comm_tp_s = loom_tp_wait_seconds(run->tp) - tp0 + loom_pp_last_tp_wait(run->pp);
    /* comm_wait_s is the data-parallel wait (comm_dp_s); the tp group's and the pipeline's are apart */
    rec->comm_wait_s = loom_dp_last_wait(run->dp) + loom_tp_dp_wait_seconds(run->tp) - dp0 + loom_pp_last_dp_wait(run->pp);
    rec->tokens_per_s = run->tokens_per_step / rec->step_s;
    rec->mfu = step_mfu(j, rec);
    rec->peak_flops = j->peak;
    run->train_time += rec->step_s;
    run->comm_wait += rec->comm_wait_s;
    run->comm_tp += rec->comm_tp_s;
    run->bubble_time += rec->bubble_s;
    run->step = step;
    run->last_loss = rec->loss;
    rec->elapsed_s = loom_now() - run->t_start;
    rec->eta_s = run->train_time / (double)(step - run->first_step + 1) * (double)(o->steps - step);
    return LOOM_OK;
}

/* Validation on the lead rank, then on_eval. Under ZeRO-3 every rank runs
 * the forward (each layer's weights are gathered from all of them) and
 * only the lead reports it. */
static loom_status run_eval(loom_train_job_t *j, long long step, double *val) {
    loom_eval_result_t r;
    if (j->run.pp) LOOM_TRY(loom_pp_eval(j->run.pp, j->ds, j->run.B, j->run.T, j->o.eval_batches, &r));
    else LOOM_TRY(loom_eval_loss(j->run.model, j->ds, j->run.B, j->run.T, j->o.eval_batches, &r));
    j->run.last_val = r.loss;
    j->run.last_val_step = step;
    if (val) *val = r.loss;
    return j->run.lead ? emit_eval(&j->run, step, r.loss) : LOOM_OK;
}

/* Rank 0 evaluates; under ZeRO-3, --tp and --pp every rank (each holds a part). */
static int evaluates(const loom_train_job_t *j) {
    return (j->run.lead || j->o.zero == 3 || j->run.tp || j->run.pp) && j->run.have_val;
}

static int eval_due(const loom_train_job_t *j, long long step) {
    return evaluates(j) && j->o.eval_every > 0 && (step % j->o.eval_every == 0 || step == j->o.steps);
}

/* ---- the loop ---- */

static loom_status train_loop(loom_train_job_t *j) {
    loom_train_run_t *run = &j->run;
    loom_status s = LOOM_OK;
    run->t_start = loom_now();
    for (long long step = run->first_step; step <= j->o.steps; step++) {
        if ((s = emit_before_step(run, step)) != LOOM_OK || (s = agree_on_stop(j, step)) != LOOM_OK) break;
        if (run->stop_signal) break;
        loom_step_record_t rec;
        if ((s = run_step(j, step, &rec)) != LOOM_OK) break;
        loom_clock_tick(); /* a test's simulated time passes with the step's work (core/clock.h) */
        if (eval_due(j, step) && (s = run_eval(j, step, &rec.val_loss)) != LOOM_OK) break;
        if ((s = emit_after_step(run, &rec)) != LOOM_OK) break;
    }
    return s;
}

/* After the loop: a validation loss for the last step if it has none,
 * then on_stop (final checkpoint, plot) and on_end (reports). */
static loom_status train_finish(loom_train_job_t *j, loom_status s) {
    loom_train_run_t *run = &j->run;
    if (s == LOOM_OK && run->step >= run->first_step && evaluates(j) && run->last_val_step != run->step)
        s = run_eval(j, run->step, NULL);
    s = emit_stop(run, s);
    if (s == LOOM_OK) loom_train_report_memory(j);
    emit_end(run, s);
    if (s == LOOM_OK && run->stop_signal && run->step == 0)
        s = loom_error(LOOM_ESTOPPED, "stopped by signal %d before the first step; nothing to save", run->stop_signal);
    else if (s == LOOM_OK && run->stop_signal)
        s = loom_error(LOOM_ESTOPPED, "stopped by signal %d; the checkpoint of step %lld is in %s; the same command with --resume (or --resume auto) continues",
                       run->stop_signal, run->step, j->o.out);
    return s;
}

loom_status loom_train(const loom_train_opts_t *opts) {
    loom_dist_t *d;
    loom_dist_opts_t dopt = {.transport = "auto", .gpu = opts->device && (loom_backend_device_caps(opts->device) & LOOM_CAP_DEVICE_MEMORY),
                             .timeout_s = opts->dist_timeout};
    dopt.device = -1; /* the local rank's GPU */
    loom_train_signals_install();
    loom_status ds = loom_dist_init(&d, &dopt);
    if (ds != LOOM_OK) {
        loom_train_signals_restore();
        return ds;
    }
    loom_train_job_t *j = loom_calloc(1, sizeof *j);
    j->o = *opts;
    j->o.rank = loom_dist_rank(d);
    j->o.world_size = loom_dist_size(d);
    if (j->o.rank != 0) loom_log_quiet(1);
    if (j->o.tp > 1 && j->o.sample_tokens > 0) { /* a sample is one rank's generation: the shard cannot alone */
        loom_info("loom train: --tp %d: text samples are off (generation does not run on a tensor-parallel shard yet)", j->o.tp);
        j->o.sample_tokens = 0;
    }
    loom_status s = loom_train_setup(j, d);
    /* An observer that cannot start (no metrics log) ends the run before
     * its first step, with no final checkpoint or plot. */
    if (s == LOOM_OK) s = emit_start(&j->run);
    if (s == LOOM_OK) s = train_finish(j, train_loop(j));
    loom_ckpt_test_point("train_end"); /* the chaos tests' signal after the loop */
    loom_train_teardown(j);
    int world = j->o.world_size;
    free(j);
    /* On failure the process exits without the last barrier: its peers
     * see the closed connections and stop, naming this rank. A stop that
     * every rank agreed on is no failure: all of them meet there. */
    if (s == LOOM_OK || s == LOOM_ESTOPPED || world == 1) loom_dist_free(d);
    loom_train_signals_restore(); /* after the barrier: a signal before it is no failure */
    return s;
}
