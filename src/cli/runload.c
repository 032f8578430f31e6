#include "cli/runload.h"

#include <stdio.h>

#include "backend/backend.h"
#include "ckpt/gguf.h"
#include "ckpt/safetensors.h"

void loom_run_close(loom_opened_run_t *r) {
    if (r->tok) loom_tokenizer_free(r->tok);
    loom_gpt_free(r->model);
    *r = (loom_opened_run_t){0};
}

static loom_status open_run(const char *run, int threads, loom_gpt_t **model, loom_tokenizer_t **tok, loom_ckpt_state_t *st) {
    char ck[4096], path[4096];
    loom_gpt_config_t cfg;
    if (!run) return loom_error(LOOM_EINVAL, "no --run; pass the folder of a `loom train --out`");
    LOOM_TRY(loom_run_latest(run, ck, sizeof ck, &cfg, st));
    snprintf(path, sizeof path, "%s/tokenizer.json", run);
    *tok = NULL;
    if (loom_path_exists(path)) {
        LOOM_TRY(loom_tokenizer_load(tok, path));
        uint64_t have = loom_tokenizer_hash(*tok); /* read before the free: the message needs it */
        if (st->tokenizer_hash && have != st->tokenizer_hash) {
            loom_tokenizer_free(*tok);
            *tok = NULL;
            return loom_error(LOOM_EFORMAT, "%s: this tokenizer (hash %016llx) is not the one the run trained with (%016llx); restore the run's tokenizer.json",
                              path, (unsigned long long)have, (unsigned long long)st->tokenizer_hash);
        }
    }
    const loom_backend_t *be;
    loom_status s = loom_backend_cpu_init(&be, threads);
    if (s == LOOM_OK) s = loom_gpt_create(model, &cfg, be);
    if (s == LOOM_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", ck);
        s = loom_safetensors_load_gpt(*model, path);
        if (s != LOOM_OK) {
            loom_gpt_free(*model);
            *model = NULL; /* the caller's loom_run_close must not free it again */
        }
    }
    if (s != LOOM_OK && *tok) {
        loom_tokenizer_free(*tok);
        *tok = NULL;
    }
    return s;
}

loom_status loom_run_open(const char *run, int threads, loom_opened_run_t *out) {
    *out = (loom_opened_run_t){0};
    if (run && !loom_path_is_dir(run) && loom_path_exists(run)) { /* --run FILE.gguf */
        const loom_backend_t *be;
        LOOM_TRY(loom_backend_cpu_init(&be, threads));
        return loom_gguf_load(run, be, &out->model, &out->tok);
    }
    return open_run(run, threads, &out->model, &out->tok, &out->state);
}
