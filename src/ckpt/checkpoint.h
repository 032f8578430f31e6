/* checkpoint: the folders under runs/NAME/checkpoints/ and the protocol
 * that writes them, so that a kill at any instant leaves a run that
 * resumes from a complete, verified checkpoint.
 *
 *   checkpoints/step_NNNNNNNN/   a complete checkpoint (files + manifest.json)
 *   checkpoints/.tmp-step_N/     one being written (removed at the next start)
 *   checkpoints/.del-step_N/     one being removed (removed at the next start)
 *   latest                       the name of the newest committed checkpoint
 *
 * Write protocol (loom_ckpt_begin, the caller's files, loom_ckpt_commit):
 *  1. every file goes into .tmp-step_N and is fsynced by its writer;
 *  2. manifest.json (size and XXH64 of every other file) is written and
 *     fsynced last, then the folder itself is fsynced;
 *  3. .tmp-step_N is renamed to step_N and checkpoints/ is fsynced: from
 *     here the checkpoint is durable and is found even before `latest`
 *     names it;
 *  4. `latest` is replaced atomically (write, fsync, rename, fsync);
 *  5. only then are checkpoints beyond the newest `keep` removed, each by
 *     a rename to .del-step_K first, and never the one `latest` names.
 * A checkpoint that `latest` names is never deleted or rewritten. */
#ifndef LOOM_CKPT_CHECKPOINT_H
#define LOOM_CKPT_CHECKPOINT_H

#include <stddef.h>

#include "core/core.h"

/* Remove leftovers of interrupted writes and prunes (.tmp-*, .del-*) in
 * `run`/checkpoints; call once at start, before any rank writes. */
loom_status loom_ckpt_clean(const char *run);
/* Create (or reuse) checkpoints/.tmp-step_N of `run` and put its path in
 * `tmp`. Every rank may call it; files go straight into `tmp`. */
loom_status loom_ckpt_begin(const char *run, long long step, char *tmp, size_t cap);
/* Steps 2-5 above for the folder made by loom_ckpt_begin; `keep` >= 1
 * checkpoints stay. When step_N already exists and `latest` names it, the
 * existing copy is kept and the new one dropped. */
loom_status loom_ckpt_commit(const char *run, long long step, int keep);
/* Check every file of a checkpoint folder against its manifest (size and
 * XXH64); the manifest must list every file a loader reads (config.json,
 * model.safetensors, state.json, optim-*). A folder without a manifest
 * (written by an older loom, or the manifest was deleted) is refused
 * unless loading unverified was asked for (loom --no-verify), when it
 * passes with *verified = 0. */
loom_status loom_ckpt_verify(const char *ckpt_dir, int *verified);
/* Asked for by `--no-verify` on any command line (cli/main.c), which also
 * sets LOOM_NO_VERIFY=1 so a launcher's ranks inherit it. */
void loom_ckpt_allow_unverified(void);
/* The checkpoint to resume `run` from. `which` NULL, "" or "latest": the
 * newest complete one (a committed folder that `latest` does not name yet
 * counts); "step_N" or "N": that one. A checkpoint failing verification is
 * an error that names the newest good older one. *step gets the step
 * encoded in the folder name; LOOM_EINVAL with no checkpoint at all. */
loom_status loom_ckpt_find(const char *run, const char *which, char *ckpt_dir, size_t cap, long long *step);
/* Resuming from an older checkpoint than the newest (--resume step_N):
 * the newer ones are moved aside to .superseded-step_K (kept, never read
 * again, never removed by loom) and `latest` names step_N, so the run's
 * new checkpoints of those steps do not meet the old ones. */
loom_status loom_ckpt_supersede(const char *run, long long step);
/* 1 when `run`/checkpoints holds at least one complete checkpoint. */
int loom_ckpt_any(const char *run);
/* Remove a file or a folder with everything in it (0, or -1 with errno). */
int loom_ckpt_remove_tree(const char *path);
/* Fault injection for the chaos test: when the environment variable
 * LOOM_TEST_KILL_AT equals `point` (or `point:K`, the K-th time), the
 * process SIGKILLs itself here (points: ckpt_files, ckpt_manifest,
 * ckpt_renamed, ckpt_latest, ckpt_prune; run_prepare in ckpt/run.c;
 * train_end in train/train.c); LOOM_TEST_TERM_AT sends it a SIGTERM. */
void loom_ckpt_test_point(const char *point);

#endif
