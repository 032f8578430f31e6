#define _GNU_SOURCE
#include "parallel/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "parallel/dist.h"

static volatile sig_atomic_t launcher_signal;
static void launcher_on_signal(int sig) { launcher_signal = sig; }

typedef struct {
    const loom_launch_t *l;
    pid_t *pids;
    int left, first_bad, code, passed;
    double fail_at;
    struct sigaction old_int, old_term;
    pid_t launcher;
} launch_state_t;

/* LOOM_TEST_HOLD_BEFORE_START=DIR: each rank, before it starts the job (so
 * before it has a signal handler), creates DIR/rank<N> and waits for a
 * signal: a test then signals the launcher and reads what it exits with for
 * a rank that dies of the signal passed on, without racing the start-up */
static void test_hold_before_start(int rank) {
    const char *dir = getenv("LOOM_TEST_HOLD_BEFORE_START");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    for (;;) pause();
}

/* The forked child: the rank's environment, then the job. Never returns. */
static void start_rank(const launch_state_t *st, int rank, int port) {
    const loom_launch_t *l = st->l;
    int nodes = l->nnodes > 1 ? l->nnodes : 1;
    char v[16];
    snprintf(v, sizeof v, "%d", (nodes > 1 ? l->node_rank : 0) * l->nproc + rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", nodes * l->nproc);
    setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", l->nproc);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    if (nodes == 1) { /* several machines: node 0's address and port, as given */
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
    }
    sigaction(SIGINT, &st->old_int, NULL);
    sigaction(SIGTERM, &st->old_term, NULL);
    /* A launcher killed outright (SIGKILL, OOM) must not leave ranks that
     * train on and write checkpoints: each rank gets SIGTERM when it goes
     * (the kernel keeps this across execv) and stops as on any SIGTERM. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != st->launcher) _exit(128 + SIGTERM); /* it went before the prctl */
    test_hold_before_start(rank);
    if (!l->argv) _exit(l->run(rank, l->ctx));
    execv("/proc/self/exe", l->argv);
    fprintf(stderr, "%s: rank %d: cannot start /proc/self/exe: %s\n", l->what, rank, strerror(errno));
    _exit(127);
}

/* One rank ended: account for it, report a failure. */
static void rank_ended(launch_state_t *st, pid_t p, int status) {
    int r = 0;
    while (r < st->l->nproc && st->pids[r] != p) r++;
    if (r == st->l->nproc) return;
    st->pids[r] = 0;
    st->left--;
    /* a rank killed by a signal (SIGKILL, the OOM killer) is a dead peer:
     * exit 3 as documented (docs/fault-tolerance.md), not the shell's 128+N;
     * but one ended by the signal this launcher passed on (a SIGTERM that
     * came before the rank had its handler) ends the job as that signal
     * would: 128+N, what the user's SIGTERM asked for */
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    if (WIFSIGNALED(status) && st->passed && WTERMSIG(status) == launcher_signal) code = 128 + WTERMSIG(status);
    if (code == 0) return;
    if (st->first_bad < 0) {
        st->first_bad = r;
        st->code = code;
        st->fail_at = loom_now();
    }
    if (WIFSIGNALED(status)) fprintf(stderr, "%s: rank %d was killed by signal %d\n", st->l->what, r, WTERMSIG(status));
    else fprintf(stderr, "%s: rank %d exited with status %d\n", st->l->what, r, code);
}

static void signal_ranks(const launch_state_t *st, int sig) {
    for (int r = 0; r < st->l->nproc; r++)
        if (st->pids[r] > 0) kill(st->pids[r], sig);
}

/* Wait for every rank; pass signals on; kill stragglers after a failure. */
static void wait_ranks(launch_state_t *st) {
    while (st->left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            rank_ended(st, p, status);
            continue;
        }
        if (launcher_signal && !st->passed) {
            signal_ranks(st, launcher_signal);
            st->passed = 1;
        }
        if (st->first_bad >= 0 && loom_now() - st->fail_at > st->l->kill_after_s) signal_ranks(st, SIGKILL);
        usleep(20 * 1000);
    }
}

loom_status loom_launch_local(const loom_launch_t *l, int *exit_code) {
    *exit_code = 0;
    if (getenv("RANK") && getenv("WORLD_SIZE"))
        return loom_error(LOOM_EINVAL, "--nproc inside a launched job (RANK and WORLD_SIZE are set); drop --nproc or the launcher");
    if (l->nnodes > 1 && (!getenv("MASTER_ADDR") || !getenv("MASTER_PORT")))
        return loom_error(LOOM_EINVAL, "--nnodes %d: set MASTER_ADDR and MASTER_PORT to node 0's address and a free port on it, the same on every node",
                          l->nnodes);
    if (l->nnodes > 1 && (l->node_rank < 0 || l->node_rank >= l->nnodes))
        return loom_error(LOOM_EINVAL, "--node-rank %d: must be 0 .. %d for --nnodes %d", l->node_rank, l->nnodes - 1, l->nnodes);
    launch_state_t st = {.l = l, .pids = loom_calloc((size_t)l->nproc, sizeof(pid_t)), .first_bad = -1, .launcher = getpid()};
    int port = l->nnodes > 1 ? 0 : loom_dist_free_port(29500);
    struct sigaction sa = {.sa_handler = launcher_on_signal};
    launcher_signal = 0;
    sigaction(SIGINT, &sa, &st.old_int);
    sigaction(SIGTERM, &sa, &st.old_term);
    loom_status s = LOOM_OK;
    for (int r = 0; r < l->nproc; r++) {
        pid_t p = fork();
        if (p == 0) start_rank(&st, r, port);
        if (p < 0) {
            s = loom_error(LOOM_EIO, "%s: cannot start rank %d: %s", l->what, r, strerror(errno));
            signal_ranks(&st, SIGTERM);
            break;
        }
        st.pids[r] = p;
        st.left++;
    }
    wait_ranks(&st);
    sigaction(SIGINT, &st.old_int, NULL);
    sigaction(SIGTERM, &st.old_term, NULL);
    free(st.pids);
    *exit_code = st.code;
    return s;
}
