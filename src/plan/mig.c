#include "mig.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int slices_mask(const loom_mig_profile_t *p, int start) {
    return ((1 << p->memory_slices) - 1) << start;
}

loom_status loom_mig_layout_check(const loom_gpu_t *g, const loom_mig_layout_t *l) {
    if (!g->nprofiles) return loom_error(LOOM_EINVAL, "%s has no MIG profiles in the GPU table", g->id);
    int used = 0, compute = 0, count[LOOM_MIG_MAX_PROFILES] = {0};
    for (int i = 0; i < l->n; i++) {
        if (l->profile[i] < 0 || l->profile[i] >= g->nprofiles) return loom_error(LOOM_EINVAL, "instance %d: no such profile", i);
        const loom_mig_profile_t *p = &g->profiles[l->profile[i]];
        int s = l->start[i];
        if (s < 0 || s >= LOOM_MIG_SLICES || !(p->starts >> s & 1))
            return loom_error(LOOM_EINVAL, "%s cannot start at memory slice %d on %s", p->name, s, g->id);
        if (s + p->memory_slices > LOOM_MIG_SLICES) return loom_error(LOOM_EINVAL, "%s at %d runs past slice 7", p->name, s);
        int m = slices_mask(p, s);
        if (used & m) return loom_error(LOOM_EINVAL, "%s at memory slice %d overlaps another instance", p->name, s);
        used |= m;
        compute += p->compute_slices;
        if (++count[l->profile[i]] > p->max_instances)
            return loom_error(LOOM_EINVAL, "more than %d instance%s of %s", p->max_instances, p->max_instances == 1 ? "" : "s", p->name);
    }
    if (compute > 7) return loom_error(LOOM_EINVAL, "%d compute slices; a GPU has 7", compute);
    return LOOM_OK;
}

typedef struct {
    const loom_gpu_t *g;
    loom_mig_layout_t cur;
    loom_mig_layout_t *out;
    int cap, found;
} enum_ctx_t;

/* Extend cur with instances starting at memory slice >= from. */
static void enumerate(enum_ctx_t *c, int from, int used) {
    if (c->cur.n > 0) {
        if (c->found < c->cap) c->out[c->found] = c->cur;
        c->found++;
    }
    if (c->cur.n == LOOM_MIG_MAX_INSTANCES) return;
    for (int s = from; s < LOOM_MIG_SLICES; s++) {
        for (int p = 0; p < c->g->nprofiles; p++) {
            const loom_mig_profile_t *q = &c->g->profiles[p];
            if (!(q->starts >> s & 1) || s + q->memory_slices > LOOM_MIG_SLICES || (used & slices_mask(q, s))) continue;
            int k = c->cur.n;
            c->cur.profile[k] = p;
            c->cur.start[k] = s;
            c->cur.owner[k] = -1;
            c->cur.n++;
            if (loom_mig_layout_check(c->g, &c->cur) == LOOM_OK) enumerate(c, s + q->memory_slices, used | slices_mask(q, s));
            c->cur.n--;
        }
    }
}

int loom_mig_layouts(const loom_gpu_t *g, loom_mig_layout_t *out, int cap) {
    enum_ctx_t c = {.g = g, .out = out, .cap = cap};
    enumerate(&c, 0, 0);
    return c.found;
}

/* The layouts of a GPU, enumerated once per call site (a few hundred). */
static loom_mig_layout_t *all_layouts(const loom_gpu_t *g, int *n) {
    int cnt = loom_mig_layouts(g, NULL, 0);
    loom_mig_layout_t *all = loom_calloc((size_t)(cnt ? cnt : 1), sizeof *all);
    *n = loom_mig_layouts(g, all, cnt);
    return all;
}

loom_status loom_mig_place(const loom_gpu_t *g, const char *const *names, int n, loom_mig_layout_t *out) {
    int want[LOOM_MIG_MAX_PROFILES] = {0};
    for (int i = 0; i < n; i++) {
        const loom_mig_profile_t *p = loom_gpu_profile(g, names[i]);
        if (!p) return loom_error(LOOM_EINVAL, "%s has no MIG profile %s", g->id, names[i]);
        want[p - g->profiles]++;
    }
    int cnt;
    loom_mig_layout_t *all = all_layouts(g, &cnt);
    loom_status s = loom_error(LOOM_EINVAL, "no valid placement of these %d instances on %s", n, g->id);
    for (int i = 0; i < cnt && s != LOOM_OK; i++) {
        int have[LOOM_MIG_MAX_PROFILES] = {0}, same = all[i].n == n;
        for (int k = 0; k < all[i].n; k++) have[all[i].profile[k]]++;
        for (int p = 0; p < g->nprofiles && same; p++) same = have[p] == want[p];
        if (same) {
            *out = all[i];
            s = LOOM_OK;
        }
    }
    free(all);
    return s;
}

static loom_status parse_one(char *part, loom_mig_request_t *r) {
    memset(r, 0, sizeof *r);
    char *colon = strchr(part, ':');
    if (!colon || colon == part || !colon[1])
        return loom_error(LOOM_EINVAL, "--need: \"%s\": write SERVICE:COUNTxMEMORY, e.g. chat:2x10gb or chat:3g.40gb", part);
    *colon = 0;
    snprintf(r->service, sizeof r->service, "%s", part);
    char *spec = colon + 1, *end;
    r->count = 1;
    char *x = strchr(spec, 'x');
    if (x && x > spec && isdigit((unsigned char)spec[0])) {
        long c = strtol(spec, &end, 10);
        if (end != x || c < 1 || c > LOOM_MIG_MAX_INSTANCES)
            return loom_error(LOOM_EINVAL, "--need: %s: instance count \"%.*s\" must be 1 to 7", r->service, (int)(x - spec), spec);
        r->count = (int)c;
        spec = x + 1;
    }
    if (strchr(spec, '.')) { /* a profile name: 3g.40gb */
        snprintf(r->profile, sizeof r->profile, "%s", spec);
        return LOOM_OK;
    }
    r->memory_gb = strtod(spec, &end);
    if (end == spec || r->memory_gb <= 0 || (strcasecmp(end, "gb") && strcasecmp(end, "g") && *end))
        return loom_error(LOOM_EINVAL, "--need: %s: \"%s\" is not a memory size like 10gb or a profile like 3g.40gb", r->service, spec);
    return LOOM_OK;
}

loom_status loom_mig_parse_need(const char *need, loom_mig_request_t *reqs, int cap, int *n) {
    char *copy = loom_strdup(need), *save = NULL;
    *n = 0;
    loom_status s = LOOM_OK;
    for (char *part = strtok_r(copy, ",", &save); part && s == LOOM_OK; part = strtok_r(NULL, ",", &save)) {
        if (*n == cap) s = loom_error(LOOM_EINVAL, "--need: more than %d services", cap);
        else s = parse_one(part, &reqs[(*n)++]);
    }
    free(copy);
    if (s == LOOM_OK && *n == 0) s = loom_error(LOOM_EINVAL, "--need is empty; e.g. --need \"chat:2x10gb,batch:40gb\"");
    return s;
}

/* Does profile p satisfy request r? */
static int serves(const loom_gpu_t *g, int p, const loom_mig_request_t *r) {
    const loom_mig_profile_t *q = &g->profiles[p];
    if (r->profile[0]) return !strcasecmp(q->name, r->profile);
    return q->memory_gb + 1e-9 >= r->memory_gb;
}

/* Assign the flattened requested instances (inst[k] = request index) to
 * the layout's instances, one each: backtracking over a handful. */
static int assign(const loom_gpu_t *g, const loom_mig_request_t *reqs, const int *inst, int k, int n,
                  loom_mig_layout_t *l) {
    if (k == n) return 1;
    for (int i = 0; i < l->n; i++) {
        if (l->owner[i] >= 0 || !serves(g, l->profile[i], &reqs[inst[k]])) continue;
        l->owner[i] = inst[k];
        if (assign(g, reqs, inst, k + 1, n, l)) return 1;
        l->owner[i] = -1;
    }
    return 0;
}

loom_status loom_mig_plan(const loom_gpu_t *g, const loom_mig_request_t *reqs, int nreq, loom_mig_layout_t *out) {
    int inst[LOOM_MIG_MAX_INSTANCES], n = 0;
    for (int r = 0; r < nreq; r++) {
        if (reqs[r].profile[0] && !loom_gpu_profile(g, reqs[r].profile))
            return loom_error(LOOM_EINVAL, "--need: %s: %s has no MIG profile %s", reqs[r].service, g->id, reqs[r].profile);
        for (int c = 0; c < reqs[r].count; c++) {
            if (n == 7) return loom_error(LOOM_EINVAL, "--need asks for more than 7 instances; a MIG GPU has at most 7");
            inst[n++] = r;
        }
    }
    int cnt, best = -1, best_mem = 99, best_cmp = 99;
    loom_mig_layout_t *all = all_layouts(g, &cnt);
    for (int i = 0; i < cnt; i++) {
        if (all[i].n != n) continue;
        int mem = LOOM_MIG_SLICES, cmp = 7;
        for (int k = 0; k < all[i].n; k++) {
            mem -= g->profiles[all[i].profile[k]].memory_slices;
            cmp -= g->profiles[all[i].profile[k]].compute_slices;
        }
        if (mem > best_mem || (mem == best_mem && cmp >= best_cmp)) continue;
        if (!assign(g, reqs, inst, 0, n, &all[i])) continue;
        best = i, best_mem = mem, best_cmp = cmp;
        *out = all[i];
    }
    free(all);
    if (best < 0) return loom_error(LOOM_EINVAL, "the requested instances do not fit on one %s", g->id);
    return LOOM_OK;
}
