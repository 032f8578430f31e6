/* mig: MIG layouts of one GPU from its profile table and placement rules.
 *
 * A MIG GPU has 8 memory slices and 7 compute slices. A GPU instance of a
 * profile takes `memory_slices` consecutive memory slices starting at one
 * of the profile's allowed starts (nvidia-smi mig -lgipp), at most
 * `max_instances` of a profile exist at once, instances never overlap,
 * and their compute slices add up to at most 7. A layout is valid when it
 * keeps all four rules. */
#ifndef LOOM_PLAN_MIG_H
#define LOOM_PLAN_MIG_H

#include "plan/gpus.h"

#define LOOM_MIG_MAX_INSTANCES 8

typedef struct {
    int n;
    int profile[LOOM_MIG_MAX_INSTANCES]; /* index into gpu->profiles */
    int start[LOOM_MIG_MAX_INSTANCES];   /* first memory slice */
    int owner[LOOM_MIG_MAX_INSTANCES];   /* index of the request it serves (loom_mig_plan), else -1 */
} loom_mig_layout_t;

/* LOOM_OK when `l` keeps the placement rules, else LOOM_EINVAL with the
 * broken rule in loom_errmsg(). */
loom_status loom_mig_layout_check(const loom_gpu_t *g, const loom_mig_layout_t *l);

/* Every valid layout (instances ordered by start), up to `cap`; returns
 * the count (which may exceed cap: then only cap were written). */
int loom_mig_layouts(const loom_gpu_t *g, loom_mig_layout_t *out, int cap);

/* Place instances of the profiles named in `names` (n of them, any order)
 * on one GPU: LOOM_OK and a valid layout in *out when some placement
 * exists, LOOM_EINVAL saying why not otherwise. */
loom_status loom_mig_place(const loom_gpu_t *g, const char *const *names, int n, loom_mig_layout_t *out);

/* One service's request: `count` instances of at least `memory_gb` each
 * (or of the named profile when `profile` is non-empty). */
typedef struct {
    char service[64];
    int count;
    double memory_gb;
    char profile[32];
} loom_mig_request_t;

/* Parse "kjv:2x10gb,chat:1x20gb,batch:40gb,x:3g.40gb" into reqs (cap
 * entries); LOOM_EINVAL with the bad part named. */
loom_status loom_mig_parse_need(const char *need, loom_mig_request_t *reqs, int cap, int *n);

/* The layout that hosts every requested instance with the fewest unused
 * memory slices (then fewest unused compute slices); owner[] says which
 * request each instance serves. LOOM_EINVAL when none fits on one GPU. */
loom_status loom_mig_plan(const loom_gpu_t *g, const loom_mig_request_t *reqs, int nreq, loom_mig_layout_t *out);

#endif
