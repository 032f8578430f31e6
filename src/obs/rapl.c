/* rapl: package energy counters from /sys/class/powercap (see rapl.h). */
#define _GNU_SOURCE
#include "obs/rapl.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DOMAINS 16

struct loom_rapl {
    pthread_mutex_t lock;
    int n;
    char path[MAX_DOMAINS][512];     /* .../energy_uj */
    unsigned long long range[MAX_DOMAINS], last[MAX_DOMAINS]; /* uJ */
    double total_uj;
};

static int read_ull(const char *path, unsigned long long *v, int *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        *err = errno;
        return -1;
    }
    int ok = fscanf(f, "%llu", v) == 1;
    fclose(f);
    if (!ok) *err = EINVAL;
    return ok ? 0 : -1;
}

/* "intel-rapl:0" is a package; "intel-rapl:0:1" is a sub-domain of it. */
static int is_package(const char *name) {
    const char *c = strchr(name, ':');
    return !strncmp(name, "intel-rapl:", 11) && c && !strchr(c + 1, ':');
}

loom_status loom_rapl_open(loom_rapl_t **out) {
    *out = NULL;
    const char *root = getenv("LOOM_POWERCAP_ROOT");
    if (!root || !*root) root = "/sys/class/powercap";
    DIR *d = opendir(root);
    if (!d) return loom_error(LOOM_EUNAVAIL, "CPU energy (RAPL) unavailable: %s: %s", root, strerror(errno));
    loom_rapl_t *r = loom_calloc(1, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    int err = 0, found = 0;
    struct dirent *e;
    while ((e = readdir(d)) && r->n < MAX_DOMAINS) {
        if (!is_package(e->d_name)) continue;
        found++;
        char p[600];
        snprintf(r->path[r->n], sizeof r->path[r->n], "%s/%s/energy_uj", root, e->d_name);
        snprintf(p, sizeof p, "%s/%s/max_energy_range_uj", root, e->d_name);
        unsigned long long range = 0;
        int e2 = 0;
        if (read_ull(p, &range, &e2) != 0) range = 0;
        if (read_ull(r->path[r->n], &r->last[r->n], &err) != 0) continue;
        r->range[r->n++] = range;
    }
    closedir(d);
    if (r->n == 0) {
        loom_status s = !found ? loom_error(LOOM_EUNAVAIL, "CPU energy (RAPL) unavailable: no intel-rapl package domain in %s", root)
                               : loom_error(LOOM_EUNAVAIL, "CPU energy (RAPL) unavailable: %s/intel-rapl:*/energy_uj: %s%s", root, strerror(err),
                                            err == EACCES ? " (readable by root only on this kernel)" : "");
        pthread_mutex_destroy(&r->lock);
        free(r);
        return s;
    }
    *out = r;
    return LOOM_OK;
}

double loom_rapl_energy_j(loom_rapl_t *r) {
    if (!r) return 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n; i++) {
        unsigned long long v;
        int err;
        if (read_ull(r->path[i], &v, &err) != 0) continue;
        if (v >= r->last[i]) r->total_uj += (double)(v - r->last[i]);
        else if (r->range[i] > r->last[i]) r->total_uj += (double)(r->range[i] - r->last[i] + v); /* wrapped */
        r->last[i] = v;
    }
    double j = r->total_uj / 1e6;
    pthread_mutex_unlock(&r->lock);
    return j;
}

int loom_rapl_domains(const loom_rapl_t *r) { return r ? r->n : 0; }

void loom_rapl_close(loom_rapl_t *r) {
    if (!r) return;
    pthread_mutex_destroy(&r->lock);
    free(r);
}
