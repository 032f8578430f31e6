#include "ckpt/writer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "ckpt/optim.h"
#include "ckpt/safetensors.h"

/* What the writer is doing: W_FILES and W_COMMIT are jobs for the thread
 * (or the caller, when synchronous); W_FILES_DONE waits for the other
 * ranks; W_QUIT ends the thread. */
typedef enum { W_IDLE, W_FILES, W_FILES_DONE, W_COMMIT, W_QUIT } wstate_t;

struct loom_ckpt_writer {
    loom_ckpt_writer_opts_t o;
    char *run;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
    wstate_t state;
    loom_status status; /* of the last background job; its message below */
    char msg[2048];
    loom_ckpt_state_t st;
    float *params;      /* rank 0: host copy of the parameter block (P floats) */
    float *mv;          /* this rank's AdamW shard: m then v, 2 (hi-lo) floats */
    size_t lo, hi;
    int has_shard;
    long long last_step;
    double blocked_s, write_s;
};

/* This rank's files of the checkpoint in w->st, into .tmp-step_N. */
static loom_status write_files(loom_ckpt_writer_t *w) {
    char tmp[4096], path[4300];
    LOOM_TRY(loom_ckpt_begin(w->run, w->st.step, tmp, sizeof tmp));
    if (w->o.rank == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if (!w->o.write_stream) LOOM_TRY(loom_safetensors_save_gpt_host(w->o.m, w->params, path));
        LOOM_TRY(loom_run_write_ckpt_meta(tmp, w->o.m ? &w->o.m->cfg : w->o.cfg, &w->st));
    }
    if (!w->has_shard) return LOOM_OK;
    int sw = w->o.zero >= 1 ? w->o.world : 1;
    loom_optim_shard_path(path, sizeof path, tmp, w->o.rank, sw);
    loom_optim_shard_t h = {(uint32_t)w->o.rank, (uint32_t)sw, (uint32_t)w->o.zero, w->o.m->num_params, w->lo, w->hi, (uint64_t)w->st.step};
    size_t n = w->hi - w->lo;
    return loom_optim_shard_save_host(path, &h, w->mv, w->mv + n);
}

/* Run one job outside the lock; record its status and message. */
static void run_job(loom_ckpt_writer_t *w, wstate_t job) {
    pthread_mutex_unlock(&w->mu);
    double t0 = loom_now();
    loom_status s = job == W_FILES ? write_files(w) : loom_ckpt_commit(w->run, w->st.step, w->o.keep);
    double dt = loom_now() - t0;
    pthread_mutex_lock(&w->mu);
    w->write_s += dt;
    if (s != LOOM_OK && w->status == LOOM_OK) {
        w->status = s;
        snprintf(w->msg, sizeof w->msg, "checkpoint of step %lld: %s", w->st.step, loom_errmsg());
    }
    if (job == W_FILES && s == LOOM_OK && w->o.world == 1) w->state = W_COMMIT;
    else w->state = job == W_FILES && w->o.world > 1 ? W_FILES_DONE : W_IDLE;
    pthread_cond_broadcast(&w->cv);
}

static void *thread_main(void *arg) {
    loom_ckpt_writer_t *w = arg;
    pthread_mutex_lock(&w->mu);
    while (w->state != W_QUIT) {
        if (w->state == W_FILES || w->state == W_COMMIT) run_job(w, w->state);
        else pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

loom_status loom_ckpt_writer_open(loom_ckpt_writer_t **out, const loom_ckpt_writer_opts_t *o) {
    loom_ckpt_writer_t *w = loom_calloc(1, sizeof *w);
    w->o = *o;
    w->run = loom_strdup(o->run);
    w->o.run = w->run;
    if (w->o.keep < 1) w->o.keep = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (o->async) {
        if (pthread_create(&w->thread, NULL, thread_main, w) != 0) {
            loom_warn("loom: cannot start the checkpoint thread; checkpoints are written synchronously");
            w->o.async = 0;
        } else {
            w->started = 1;
        }
    }
    *out = w;
    return LOOM_OK;
}

/* Wait (lock held) until the thread has nothing of this rank's to do. */
static void wait_idle(loom_ckpt_writer_t *w) {
    while (w->state == W_FILES || w->state == W_COMMIT) pthread_cond_wait(&w->cv, &w->mu);
}

/* The recorded background error, re-raised on this thread (lock held). */
static loom_status take_status(loom_ckpt_writer_t *w) {
    loom_status s = w->status;
    if (s != LOOM_OK) loom_error(s, "%s", w->msg);
    w->status = LOOM_OK;
    return s;
}

/* Start job `job` (lock held): the thread takes it, or it runs here. */
static void start_job(loom_ckpt_writer_t *w, wstate_t job) {
    w->state = job;
    if (w->started) {
        pthread_cond_broadcast(&w->cv);
        return;
    }
    while (w->state == W_FILES || w->state == W_COMMIT) run_job(w, w->state);
}

/* Host copies of what the checkpoint of this step holds (lock held). */
static void snapshot(loom_ckpt_writer_t *w, const float *m, const float *v, size_t lo, size_t hi) {
    const loom_gpt_t *mod = w->o.m;
    if (w->o.write_stream) { /* written at submit */
        w->has_shard = 0;
        return;
    }
    if (w->o.rank == 0 && !w->o.gather_params) mod->be->download(w->params, mod->params, mod->num_params * sizeof(float));
    w->has_shard = w->o.rank == 0 || w->o.zero >= 1;
    if (!w->has_shard) return;
    if (!w->mv || hi - lo != w->hi - w->lo) {
        free(w->mv);
        w->mv = loom_malloc(2 * (hi - lo) * sizeof(float) + 1);
    }
    w->lo = lo;
    w->hi = hi;
    if (hi > lo) {
        mod->be->download(w->mv, m, (hi - lo) * sizeof(float));
        mod->be->download(w->mv + (hi - lo), v, (hi - lo) * sizeof(float));
    }
}

loom_status loom_ckpt_writer_submit(loom_ckpt_writer_t *w, const loom_ckpt_state_t *st,
                                    const float *m, const float *v, size_t lo, size_t hi) {
    double t0 = loom_now();
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    loom_status s = take_status(w);
    if (s == LOOM_OK && w->state == W_FILES_DONE)
        s = loom_error(LOOM_EINTERNAL, "checkpoint of step %lld submitted before step %lld's was committed", st->step, w->st.step);
    if (w->o.rank == 0 && !w->params && !w->o.write_stream) w->params = loom_malloc(w->o.m->num_params * sizeof(float));
    if (w->o.write_stream) { /* a collective too: every rank takes part */
        char tmp[4096];
        loom_status b = w->o.rank == 0 ? loom_ckpt_begin(w->run, st->step, tmp, sizeof tmp) : LOOM_OK;
        loom_status g = w->o.write_stream(w->o.stream_ctx, w->o.rank == 0 && b == LOOM_OK ? tmp : NULL, st->step);
        if (s == LOOM_OK) s = b != LOOM_OK ? b : g;
    } else if (w->o.gather_params) { /* a collective: every rank takes part, whatever its own state */
        loom_status g = w->o.gather_params(w->o.gather_ctx, w->o.rank == 0 ? w->params : NULL);
        if (s == LOOM_OK) s = g;
    }
    if (s == LOOM_OK) {
        snapshot(w, m, v, lo, hi);
        w->st = *st;
        w->last_step = st->step;
        start_job(w, W_FILES);
        if (!w->started) s = take_status(w);
    }
    w->blocked_s += loom_now() - t0;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void loom_ckpt_writer_poll(loom_ckpt_writer_t *w, double busy[2]) {
    pthread_mutex_lock(&w->mu);
    busy[0] = w->state == W_FILES;
    busy[1] = w->state == W_FILES_DONE && w->status != LOOM_OK;
    pthread_mutex_unlock(&w->mu);
}

loom_status loom_ckpt_writer_agreed(loom_ckpt_writer_t *w, const double sums[2]) {
    pthread_mutex_lock(&w->mu);
    loom_status s = LOOM_OK;
    if (w->state == W_FILES_DONE && sums[0] == 0) {
        if (sums[1] > 0) {
            w->state = W_IDLE;
            s = w->status != LOOM_OK ? take_status(w)
                                     : loom_error(LOOM_EWRITE, "checkpoint of step %lld: %.0f rank(s) could not write their part; it is not committed",
                                                  w->st.step, sums[1]);
        } else if (w->o.rank == 0) {
            start_job(w, W_COMMIT);
            if (!w->started) s = take_status(w);
        } else {
            w->state = W_IDLE;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return s;
}

loom_status loom_ckpt_writer_settle(loom_ckpt_writer_t *w, loom_ckpt_agree_fn agree, void *ctx) {
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    if (w->o.world == 1 || !agree) {
        loom_status s = take_status(w);
        pthread_mutex_unlock(&w->mu);
        return s;
    }
    double v[2];
    pthread_mutex_unlock(&w->mu);
    loom_ckpt_writer_poll(w, v);
    LOOM_TRY(agree(v, 2, ctx));
    loom_status s = loom_ckpt_writer_agreed(w, v);
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    if (s == LOOM_OK) s = take_status(w);
    pthread_mutex_unlock(&w->mu);
    /* Nobody leaves before rank 0's commit is on disk. */
    double failed = s != LOOM_OK;
    LOOM_TRY(agree(&failed, 1, ctx));
    if (s == LOOM_OK && failed > 0) s = loom_error(LOOM_EIO, "another rank could not finish the checkpoint of step %lld", w->st.step);
    return s;
}

loom_status loom_ckpt_writer_wait(loom_ckpt_writer_t *w) {
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    loom_status s = take_status(w);
    pthread_mutex_unlock(&w->mu);
    return s;
}

void loom_ckpt_writer_times(const loom_ckpt_writer_t *w, double *blocked_s, double *write_s) {
    *blocked_s = w->blocked_s;
    *write_s = w->write_s;
}

void loom_ckpt_writer_free(loom_ckpt_writer_t *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    wait_idle(w); /* a write in flight is finished, not cut */
    start_job(w, W_QUIT);
    pthread_mutex_unlock(&w->mu);
    if (w->started) pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->params);
    free(w->mv);
    free(w->run);
    free(w);
}
