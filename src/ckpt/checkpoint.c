#define _GNU_SOURCE
#include "ckpt/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/hash.h"

#define MANIFEST "manifest.json"
#define MANIFEST_FORMAT "loom-checkpoint-1"

/* 1 when the environment variable `env` names `point` ("point" or
 * "point:K") and this is the K-th time (K = 1 by default) it is reached. */
static int test_point_due(const char *env, const char *point, int *seen) {
    const char *want = getenv(env);
    if (!want) return 0;
    size_t n = strlen(point);
    if (strncmp(want, point, n) != 0 || (want[n] && want[n] != ':')) return 0;
    int nth = want[n] == ':' ? atoi(want + n + 1) : 1;
    return ++*seen == nth;
}

void loom_ckpt_test_point(const char *point) {
    static int seen_kill, seen_term;
    if (test_point_due("LOOM_TEST_KILL_AT", point, &seen_kill)) {
        fprintf(stderr, "loom: LOOM_TEST_KILL_AT=%s: killing this process\n", getenv("LOOM_TEST_KILL_AT"));
        kill(getpid(), SIGKILL);
    }
    if (test_point_due("LOOM_TEST_TERM_AT", point, &seen_term)) kill(getpid(), SIGTERM); /* as a launcher or a scheduler would */
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int loom_ckpt_remove_tree(const char *path) {
    if (!loom_path_exists(path)) return 0;
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}
#define rm_rf loom_ckpt_remove_tree

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Entries of `dir` starting with `prefix`, sorted by name (step names are
 * zero-padded, so name order is step order). */
static int list_prefixed(const char *dir, const char *prefix, char ***out) {
    DIR *d = opendir(dir);
    *out = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    char **names = NULL;
    struct dirent *e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, pl) != 0) continue;
        if (n == cap) names = realloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = loom_strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_names);
    *out = names;
    return n;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* A folder name step_N with N a positive decimal step. */
static long long step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    char *end;
    long long s = strtoll(name + 5, &end, 10);
    return *end || s < 0 ? -1 : s;
}

loom_status loom_ckpt_clean(const char *run) {
    char ck[4096], p[4400];
    snprintf(ck, sizeof ck, "%s/checkpoints", run);
    static const char *const prefixes[] = {".tmp-", ".del-"};
    for (int k = 0; k < 2; k++) {
        char **names;
        int n = list_prefixed(ck, prefixes[k], &names);
        for (int i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/%s", ck, names[i]);
            loom_info("loom: removing %s, left by an interrupted %s", p, k ? "prune" : "checkpoint write");
            if (rm_rf(p) != 0) {
                loom_status s = loom_error(LOOM_EIO, "%s: cannot remove: %s", p, strerror(errno));
                free_names(names, n);
                return s;
            }
        }
        free_names(names, n);
    }
    return LOOM_OK;
}

loom_status loom_ckpt_begin(const char *run, long long step, char *tmp, size_t cap) {
    if (step < 0) return loom_error(LOOM_EINTERNAL, "checkpoint of step %lld", step);
    snprintf(tmp, cap, "%s/checkpoints/.tmp-step_%08lld", run, step);
    return loom_mkdir_p(tmp);
}

/* The name `latest` holds ("" when absent or unreadable). */
static void read_latest(const char *run, char *name, size_t cap) {
    char path[4096], *text;
    size_t len;
    name[0] = 0;
    snprintf(path, sizeof path, "%s/latest", run);
    if (loom_file_read(path, &text, &len) != LOOM_OK) return;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r')) text[--len] = 0;
    if (!strchr(text, '/')) snprintf(name, cap, "%s", text);
    free(text);
}

/* manifest.json of folder `dir`: size and XXH64 of every regular file in it. */
static loom_status write_manifest(const char *dir, long long step) {
    char **names;
    int n = list_prefixed(dir, "", &names);
    cJSON *j = cJSON_CreateObject(), *files = NULL;
    cJSON_AddStringToObject(j, "format", MANIFEST_FORMAT);
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddStringToObject(j, "hash", "xxh64");
    files = cJSON_AddArrayToObject(j, "files");
    loom_status s = LOOM_OK;
    char path[4400];
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if (names[i][0] == '.' || !strcmp(names[i], MANIFEST)) continue;
        size_t l = strlen(names[i]);
        if (l > 4 && !strcmp(names[i] + l - 4, ".tmp")) continue; /* a writer's own leftover */
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint64_t h, bytes;
        if ((s = loom_hash64_file(path, &h, &bytes)) != LOOM_OK) break;
        char hex[32];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", names[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)bytes);
        cJSON_AddStringToObject(f, "xxh64", hex);
        cJSON_AddItemToArray(files, f);
    }
    free_names(names, n);
    if (s == LOOM_OK) {
        char *text = cJSON_Print(j);
        snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
        s = loom_file_write_atomic(path, text, strlen(text));
        free(text);
    }
    cJSON_Delete(j);
    return s;
}

/* Remove checkpoint folder `name` so that an interruption leaves either
 * the whole folder or a .del- leftover, never a half-deleted step_K. */
static loom_status remove_ckpt(const char *ckdir, const char *name) {
    char from[4400], to[4400];
    snprintf(from, sizeof from, "%s/%s", ckdir, name);
    snprintf(to, sizeof to, "%s/.del-%s", ckdir, name);
    rm_rf(to);
    if (rename(from, to) != 0) return loom_error(LOOM_EWRITE, "%s: cannot move aside for removal: %s", from, strerror(errno));
    loom_fsync_dir(ckdir);
    loom_ckpt_test_point("ckpt_prune");
    if (rm_rf(to) != 0) return loom_error(LOOM_EIO, "%s: cannot remove: %s", to, strerror(errno));
    return LOOM_OK;
}

static loom_status prune(const char *run, const char *ckdir, int keep) {
    char latest[256], **names;
    read_latest(run, latest, sizeof latest);
    int n = list_prefixed(ckdir, "step_", &names);
    loom_status s = LOOM_OK;
    for (int i = 0; i < n - keep && s == LOOM_OK; i++)
        if (step_of(names[i]) >= 0 && strcmp(names[i], latest) != 0) s = remove_ckpt(ckdir, names[i]);
    free_names(names, n);
    return s;
}

loom_status loom_ckpt_commit(const char *run, long long step, int keep) {
    char name[64], tmp[4096], final[4096], ckdir[4096], latest[256];
    snprintf(name, sizeof name, "step_%08lld", step);
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", run);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", ckdir, name);
    snprintf(final, sizeof final, "%s/%s", ckdir, name);
    loom_ckpt_test_point("ckpt_files");
    LOOM_TRY(write_manifest(tmp, step));
    loom_fsync_dir(tmp);
    loom_ckpt_test_point("ckpt_manifest");
    read_latest(run, latest, sizeof latest);
    if (loom_path_exists(final)) {
        if (!strcmp(latest, name)) { /* already committed: keep it, drop the copy */
            rm_rf(tmp);
            return LOOM_OK;
        }
        LOOM_TRY(remove_ckpt(ckdir, name));
    }
    if (rename(tmp, final) != 0) return loom_error(LOOM_EWRITE, "%s: rename failed: %s", final, strerror(errno));
    loom_fsync_dir(ckdir);
    loom_ckpt_test_point("ckpt_renamed");
    char path[4400], line[80];
    snprintf(path, sizeof path, "%s/latest", run);
    int len = snprintf(line, sizeof line, "%s\n", name);
    LOOM_TRY(loom_file_write_atomic(path, line, (size_t)len));
    loom_ckpt_test_point("ckpt_latest");
    return prune(run, ckdir, keep < 1 ? 1 : keep);
}

static int allow_unverified;

void loom_ckpt_allow_unverified(void) {
    allow_unverified = 1;
    setenv("LOOM_NO_VERIFY", "1", 1);
}

/* A file every loader reads: the manifest must list it when it is there. */
static int loader_reads(const char *name) {
    return !strcmp(name, "config.json") || !strcmp(name, "model.safetensors") || !strcmp(name, "state.json") ||
           !strncmp(name, "optim-", 6);
}

/* Every file of `dir` that a loader reads is among the manifest's `files`. */
static loom_status manifest_covers(const char *dir, const cJSON *files, const char *mpath) {
    char **names;
    int n = list_prefixed(dir, "", &names);
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if (!loader_reads(names[i])) continue;
        int listed = 0;
        const cJSON *f;
        cJSON_ArrayForEach(f, files) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
            listed |= cJSON_IsString(nm) && !strcmp(nm->valuestring, names[i]);
        }
        if (!listed)
            s = loom_error(LOOM_EFORMAT, "%s: does not list %s, which the loader reads; the manifest was edited or the file added later: "
                           "restore the checkpoint or use an earlier one", mpath, names[i]);
    }
    free_names(names, n);
    return s;
}

loom_status loom_ckpt_verify(const char *ckpt_dir, int *verified) {
    char path[4400], *text;
    size_t len;
    *verified = 0;
    snprintf(path, sizeof path, "%s/%s", ckpt_dir, MANIFEST);
    if (!loom_path_exists(path)) {
        const char *env = getenv("LOOM_NO_VERIFY");
        if (allow_unverified || (env && !strcmp(env, "1"))) return LOOM_OK;
        return loom_error(LOOM_EFORMAT, "%s: no %s, so its files cannot be verified (written by a loom before manifests, or the manifest was "
                          "deleted); pass --no-verify to load it unverified", ckpt_dir, MANIFEST);
    }
    LOOM_TRY(loom_file_read(path, &text, &len));
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *fmt = j ? cJSON_GetObjectItemCaseSensitive(j, "format") : NULL;
    cJSON *files = j ? cJSON_GetObjectItemCaseSensitive(j, "files") : NULL;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, MANIFEST_FORMAT) || !cJSON_IsArray(files) || !cJSON_GetArraySize(files)) {
        cJSON_Delete(j);
        return loom_error(LOOM_EFORMAT, "%s: not a %s manifest (or it lists no files)", path, MANIFEST_FORMAT);
    }
    loom_status s = LOOM_OK;
    cJSON *f;
    cJSON_ArrayForEach(f, files) {
        cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *by = cJSON_GetObjectItemCaseSensitive(f, "bytes"),
              *hx = cJSON_GetObjectItemCaseSensitive(f, "xxh64");
        if (!cJSON_IsString(nm) || strchr(nm->valuestring, '/') || !cJSON_IsNumber(by) || !cJSON_IsString(hx)) {
            s = loom_error(LOOM_EFORMAT, "%s: a file entry lacks name, bytes or xxh64", path);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", ckpt_dir, nm->valuestring);
        uint64_t h = 0, bytes = 0;
        if (!loom_path_exists(path)) {
            s = loom_error(LOOM_EFORMAT, "%s: missing (the manifest lists it)", path);
            break;
        }
        if ((s = loom_hash64_file(path, &h, &bytes)) != LOOM_OK) break;
        if ((double)bytes != by->valuedouble) {
            s = loom_error(LOOM_EFORMAT, "%s: %llu bytes, the manifest says %.0f: the file is truncated or corrupt", path,
                           (unsigned long long)bytes, by->valuedouble);
            break;
        }
        if (h != strtoull(hx->valuestring, NULL, 16)) {
            s = loom_error(LOOM_EFORMAT, "%s: checksum %016llx, the manifest says %s: the file is corrupt", path,
                           (unsigned long long)h, hx->valuestring);
            break;
        }
    }
    snprintf(path, sizeof path, "%s/%s", ckpt_dir, MANIFEST);
    if (s == LOOM_OK) s = manifest_covers(ckpt_dir, files, path);
    cJSON_Delete(j);
    if (s == LOOM_OK) *verified = 1;
    return s;
}

/* A folder counts as complete when it has a manifest, or (written by an
 * older loom, before manifests) when `latest` names it. */
static int complete(const char *ckdir, const char *name, const char *latest) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s/%s", ckdir, name, MANIFEST);
    return step_of(name) >= 0 && (loom_path_exists(p) || !strcmp(name, latest));
}

int loom_ckpt_any(const char *run) {
    char ck[4096], latest[256], **names;
    snprintf(ck, sizeof ck, "%s/checkpoints", run);
    read_latest(run, latest, sizeof latest);
    int n = list_prefixed(ck, "step_", &names), any = 0;
    for (int i = 0; i < n && !any; i++) any = complete(ck, names[i], latest);
    free_names(names, n);
    return any;
}

/* The newest complete checkpoint older than index `below` that verifies
 * ("" if none), for the message when a newer one fails. */
static void previous_good(const char *ck, char **names, int below, const char *latest, char *out, size_t cap) {
    out[0] = 0;
    for (int i = below - 1; i >= 0; i--) {
        char p[4400];
        int v;
        snprintf(p, sizeof p, "%s/%s", ck, names[i]);
        if (complete(ck, names[i], latest) && loom_ckpt_verify(p, &v) == LOOM_OK) {
            snprintf(out, cap, "%s", names[i]);
            return;
        }
    }
}

static loom_status verify_or_offer(const char *ck, char **names, int i, const char *latest, const char *dir) {
    int v;
    if (loom_ckpt_verify(dir, &v) == LOOM_OK) {
        if (!v) loom_info("loom: %s has no manifest: loading it unverified (--no-verify)", dir);
        return LOOM_OK;
    }
    char why[1024], prev[256];
    snprintf(why, sizeof why, "%s", loom_errmsg());
    previous_good(ck, names, i, latest, prev, sizeof prev);
    if (prev[0])
        return loom_error(LOOM_EFORMAT, "checkpoint %s fails verification: %s; the previous good checkpoint is %s: "
                          "continue from it with --resume %s (or restore %s)", names[i], why, prev, prev, names[i]);
    return loom_error(LOOM_EFORMAT, "checkpoint %s fails verification: %s; no older checkpoint verifies", names[i], why);
}

loom_status loom_ckpt_find(const char *run, const char *which, char *ckpt_dir, size_t cap, long long *step) {
    char ck[4096], latest[256], want[64] = "", **names;
    snprintf(ck, sizeof ck, "%s/checkpoints", run);
    read_latest(run, latest, sizeof latest);
    if (which && *which && strcmp(which, "latest") && strcmp(which, "auto")) {
        const char *num = strncmp(which, "step_", 5) ? which : which + 5;
        char *end;
        long long s = strtoll(num, &end, 10);
        if (!*num || *end || s < 0)
            return loom_error(LOOM_EINVAL, "--resume %s: name a checkpoint as step_N or N, or use latest or auto", which);
        snprintf(want, sizeof want, "step_%08lld", s);
    }
    int n = list_prefixed(ck, "step_", &names), pick = -1;
    for (int i = n - 1; i >= 0 && pick < 0; i--)
        if (want[0] ? !strcmp(names[i], want) : complete(ck, names[i], latest)) pick = i;
    loom_status s = LOOM_OK;
    if (pick < 0 && want[0]) {
        s = loom_error(LOOM_EINVAL, "--resume %s: %s/%s does not exist", which, ck, want);
    } else if (pick < 0) {
        s = loom_error(LOOM_EINVAL, "%s: the run has no checkpoint yet; wait for the first checkpoint or train longer", run);
    } else {
        snprintf(ckpt_dir, cap, "%s/%s", ck, names[pick]);
        s = verify_or_offer(ck, names, pick, latest, ckpt_dir);
        if (s == LOOM_OK && !want[0] && strcmp(latest, names[pick]))
            loom_info("loom: %s is complete and newer than what `latest` names (%s): the run stopped before updating it; using %s",
                      names[pick], latest[0] ? latest : "nothing", names[pick]);
        *step = step_of(names[pick]);
    }
    free_names(names, n);
    return s;
}

loom_status loom_ckpt_supersede(const char *run, long long step) {
    char ck[4096], **names, from[4400], to[4400], name[64];
    snprintf(ck, sizeof ck, "%s/checkpoints", run);
    int n = list_prefixed(ck, "step_", &names);
    loom_status s = LOOM_OK;
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        if (step_of(names[i]) <= step) continue;
        snprintf(from, sizeof from, "%s/%s", ck, names[i]);
        snprintf(to, sizeof to, "%s/.superseded-%s", ck, names[i]);
        if (loom_path_exists(to)) rm_rf(to);
        if (rename(from, to) != 0) s = loom_error(LOOM_EWRITE, "%s: cannot move aside: %s", from, strerror(errno));
        else loom_info("loom: resuming from an older checkpoint: %s moved aside to %s", from, to);
    }
    free_names(names, n);
    if (s != LOOM_OK) return s;
    loom_fsync_dir(ck);
    char path[4400];
    snprintf(path, sizeof path, "%s/latest", run);
    int len = snprintf(name, sizeof name, "step_%08lld\n", step);
    return loom_file_write_atomic(path, name, (size_t)len);
}
