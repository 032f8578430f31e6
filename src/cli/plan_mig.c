/* loom plan mig: the MIG layout that hosts the requested services with the
 * fewest unused slices, printed as a table, a mig-parted config
 * (version: v1, mig-configs, mig-devices) or Kubernetes resource requests
 * for the device plugin's mixed strategy (nvidia.com/mig-3g.40gb). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/plan_report.h"
#include "plan/mig.h"

#define MAX_REQ 16

typedef struct {
    const char *gpu, *need, *format, *table;
    int json;
} mig_flags_t;

/* Profiles of the layout with their counts, in profile-table order. */
static void print_mig_parted(const loom_gpu_t *g, const loom_mig_layout_t *l) {
    printf("# loom plan mig: %s; apply with nvidia-mig-parted apply -f FILE -c loom-plan\n"
           "version: v1\nmig-configs:\n  loom-plan:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n", g->label);
    for (int p = 0; p < g->nprofiles; p++) {
        int n = 0;
        for (int i = 0; i < l->n; i++) n += l->profile[i] == p;
        if (n) printf("        \"%s\": %d\n", g->profiles[p].name, n);
    }
}

/* The device plugin's resource name for a profile: it advertises
 * "1g.10gb+me" as mig-1g.10gb.me ('+' is not allowed in a resource name). */
static void k8s_resource(const char *profile, char *out, size_t cap) {
    snprintf(out, cap, "%s", profile);
    for (char *c = out; *c; c++)
        if (*c == '+') *c = '.';
}

/* Instance i belongs to the service named like request r's (a name may
 * come in several requests). */
static int same_service(const loom_mig_layout_t *l, const loom_mig_request_t *req, int i, int r) {
    return !strcmp(req[l->owner[i]].service, req[r].service);
}

/* Instances of request r's service on profile p. */
static int service_count(const loom_mig_layout_t *l, const loom_mig_request_t *req, int r, int p) {
    int n = 0;
    for (int i = 0; i < l->n; i++) n += same_service(l, req, i, r) && l->profile[i] == p;
    return n;
}

/* One entry per (service, profile): a pod asks for one slice, so a service
 * on two profiles is two workloads, named service-profile; each name once. */
static void print_k8s(const loom_gpu_t *g, const loom_mig_layout_t *l, const loom_mig_request_t *req, int nreq) {
    printf("# loom plan mig: Kubernetes resource requests on %s, NVIDIA device plugin MIG strategy \"mixed\"\nservices:\n", g->label);
    for (int r = 0; r < nreq; r++) {
        int seen = 0, profiles = 0;
        for (int q = 0; q < r; q++) seen |= !strcmp(req[q].service, req[r].service);
        if (seen) continue;
        for (int p = 0; p < g->nprofiles; p++) profiles += service_count(l, req, r, p) > 0;
        for (int p = 0; p < g->nprofiles; p++) {
            int n = service_count(l, req, r, p);
            if (!n) continue;
            char res[64], name[160];
            k8s_resource(g->profiles[p].name, res, sizeof res);
            snprintf(name, sizeof name, profiles > 1 ? "%s-%s" : "%s", req[r].service, res);
            printf("  - name: %s\n    replicas: %d\n    resources:\n      limits:\n        nvidia.com/mig-%s: 1\n", name, n, res);
        }
    }
}

static void print_table(const loom_gpu_t *g, const loom_mig_layout_t *l, const loom_mig_request_t *req, int json) {
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "instances");
    cJSON_AddStringToObject(j, "gpu", g->id);
    int mem = 0, cmp = 0;
    if (!json) printf("MIG layout on %s\n  %-12s %-12s %-14s %-8s %s\n", g->label, "service", "profile", "memory slices", "SMs", "memory");
    for (int i = 0; i < l->n; i++) {
        const loom_mig_profile_t *p = &g->profiles[l->profile[i]];
        mem += p->memory_slices, cmp += p->compute_slices;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "service", req[l->owner[i]].service);
        cJSON_AddStringToObject(o, "profile", p->name);
        cJSON_AddNumberToObject(o, "start", l->start[i]);
        cJSON_AddNumberToObject(o, "memory_slices", p->memory_slices);
        cJSON_AddNumberToObject(o, "compute_slices", p->compute_slices);
        cJSON_AddItemToArray(a, o);
        char range[16];
        snprintf(range, sizeof range, "%d-%d", l->start[i], l->start[i] + p->memory_slices - 1);
        if (!json) printf("  %-12s %-12s %-14s %-8d %.0f GB\n", req[l->owner[i]].service, p->name, range, p->sms, p->memory_gb);
    }
    cJSON_AddNumberToObject(j, "unused_memory_slices", LOOM_MIG_SLICES - mem);
    cJSON_AddNumberToObject(j, "unused_compute_slices", 7 - cmp);
    if (json) {
        char *s = cJSON_Print(j);
        printf("%s\n", s);
        free(s);
    } else {
        printf("  unused: %d of 8 memory slices, %d of 7 compute slices\n"
               "  rules: %s\n", LOOM_MIG_SLICES - mem, 7 - cmp, loom_gpu_source(g, "mig"));
    }
    cJSON_Delete(j);
}

/* None fits: name the GPUs of the table where it does, and how many of this one. */
static loom_status what_fits(const loom_gpu_table_t *t, const loom_gpu_t *g, loom_mig_request_t *req, int nreq) {
    char other[512] = "";
    size_t k = 0;
    loom_mig_layout_t l;
    for (int i = 0; i < t->n; i++)
        if (&t->gpus[i] != g && t->gpus[i].nprofiles && loom_mig_plan(&t->gpus[i], req, nreq, &l) == LOOM_OK)
            k += (size_t)snprintf(other + k, sizeof other - k, "%s%s", k ? ", " : "", t->gpus[i].id);
    /* Split the services over cards, first fit in the order given. */
    int cards = 0, left = nreq, used[MAX_REQ] = {0};
    while (left > 0 && cards < 64) {
        loom_mig_request_t card[MAX_REQ];
        int n = 0;
        for (int r = 0; r < nreq; r++) {
            if (used[r]) continue;
            card[n++] = req[r];
            if (loom_mig_plan(g, card, n, &l) != LOOM_OK) n--;
            else used[r] = 1, left--;
        }
        if (!n) break; /* one service alone does not fit a card */
        cards++;
    }
    char split[96] = "";
    if (!left) snprintf(split, sizeof split, "; split over %d %s cards by service", cards, g->id);
    return loom_error(LOOM_EINVAL, "--need does not fit on one %s%s%s%s", g->id, k ? "; it fits on one " : "", other, split);
}

/* loom plan mig's layout; `flags` is a mig_flags_t (plan_command's callback). */
static loom_status plan_mig(void *flags) {
    const mig_flags_t *f = flags;
    loom_gpu_table_t t;
    const loom_gpu_t *g;
    loom_mig_request_t req[MAX_REQ];
    int nreq;
    LOOM_TRY(loom_gpu_table_load(&t, f->table));
    loom_status s = plan_gpu_lookup(&t, f->gpu, 0, &g);
    if (s == LOOM_OK && !g->nprofiles) s = loom_error(LOOM_EINVAL, "--gpu %s has no MIG profiles in %s", g->id, t.path);
    if (s == LOOM_OK && strcmp(f->format, "table") && strcmp(f->format, "mig-parted") && strcmp(f->format, "k8s"))
        s = loom_error(LOOM_EINVAL, "--format %s: use table, mig-parted or k8s", f->format);
    if (s == LOOM_OK && !f->need) s = loom_error(LOOM_EINVAL, "no --need; e.g. --need \"kjv:2x10gb,chat:1x20gb,batch:40gb\"");
    if (s == LOOM_OK) s = loom_mig_parse_need(f->need, req, MAX_REQ, &nreq);
    loom_mig_layout_t l;
    if (s == LOOM_OK && loom_mig_plan(g, req, nreq, &l) != LOOM_OK) s = what_fits(&t, g, req, nreq);
    if (s == LOOM_OK) {
        if (!strcmp(f->format, "mig-parted")) print_mig_parted(g, &l);
        else if (!strcmp(f->format, "k8s")) print_k8s(g, &l, req, nreq);
        else print_table(g, &l, req, f->json);
    }
    loom_gpu_table_free(&t);
    return s;
}

int cmd_plan_mig(int argc, char **argv) {
    mig_flags_t f = {0};
    const loom_arg_t args[] = {
        {"need", ARG_STR, &f.need, "", 0, 0, "services: NAME:COUNTxMEMORY or NAME:PROFILE, comma-separated, e.g. kjv:2x10gb,chat:1x20gb,batch:40gb"},
        {"format", ARG_STR, &f.format, "table", 0, 0, "table, mig-parted (nvidia-mig-parted config) or k8s (resource requests)"},
        PLAN_GPU_ARGS(f.gpu, f.table, f.json),
    };
    return plan_command("plan mig", "loom plan mig --gpu a100-80gb --need \"kjv:2x10gb,chat:1x20gb,batch:40gb\" [--format table|mig-parted|k8s]",
                        args, LOOM_ARGS_COUNT(args), argc, argv, plan_mig, &f);
}
