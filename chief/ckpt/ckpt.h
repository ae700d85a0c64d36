/* Checkpoints as the chief sees them: a folder per step under the
 * checkpoint root, holding every PS's shard files and, written last by the
 * chief, manifest.json, the commit point. A folder without a manifest is an
 * unfinished checkpoint and is never restored from.
 *
 *   ROOT/ckpt-000000001200/            one checkpoint (step 1200)
 *       <var>.part-<k>-of-<n>.tshard    shard files (ps/ckpt.c format)
 *       manifest.json                   written last: commits it
 *   ROOT/checkpoint                     "latest: ckpt-000000001200", a hint
 *                                       for people; the manifests decide
 *
 * The manifest (JSON) carries: format "tessera-checkpoint", version, step,
 * wall_time, run_id, examples, model (the Keras JSON or builtin spec),
 * model_digest, variables [{name, shape, kind, num_shards, optimizer}],
 * num_ps, and whatever the chief adds. Writes go to a temp file that is
 * fsynced and renamed, then the folder is fsynced.
 *
 * Failure modes: a root that cannot be created or written (found before
 * training by chief_ckpt_check_writable), a manifest that does not parse
 * (that checkpoint is skipped with a warning naming it).
 */
#ifndef TSR_CHIEF_CKPT_H
#define TSR_CHIEF_CKPT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define CHIEF_CKPT_MANIFEST "manifest.json"
#define CHIEF_CKPT_FORMAT "tessera-checkpoint"
#define CHIEF_CKPT_VERSION 1

/* ROOT/ckpt-<step, 12 digits>. */
int chief_ckpt_dir(const char *root, int64_t step, char *buf, size_t len);

/* Creates ROOT (and parents) and proves it writable with a probe file. */
int chief_ckpt_check_writable(const char *root, char *err, size_t errlen);

/* Creates the step's folder (an old unfinished one is emptied first). */
int chief_ckpt_prepare(const char *root, int64_t step, char *err,
                       size_t errlen);

/* Writes manifest.json into the step's folder (the commit point), then the
 * ROOT/checkpoint hint. `manifest` gets "format", "version" and "step" set
 * here. */
int chief_ckpt_commit(const char *root, int64_t step, json_t *manifest,
                      char *err, size_t errlen);

/* The newest committed checkpoint: its step and manifest (caller decrefs).
 * TSR_ENOTFOUND when there is none. */
int chief_ckpt_latest(const char *root, int64_t *step, json_t **manifest,
                      char *err, size_t errlen);

/* Reads one checkpoint folder's manifest (`path` is the folder or ROOT: the
 * newest then). */
int chief_ckpt_read(const char *path, int64_t *step, json_t **manifest,
                    char *folder_out, size_t folder_len, char *err,
                    size_t errlen);

/* Removes the step's folder, committed or not (a pruned checkpoint, or one
 * that failed half-written). A folder that is not there is fine. */
int chief_ckpt_remove(const char *root, int64_t step, char *err,
                      size_t errlen);

/* The steps of every committed checkpoint under ROOT, newest first
 * (*steps malloc'ed, NULL when there is none; a missing ROOT has none). */
int chief_ckpt_list(const char *root, int64_t **steps, size_t *n, char *err,
                    size_t errlen);

/* Keeps the newest `keep` committed checkpoints; deletes older ones and
 * every unfinished folder older than the newest committed one. Returns the
 * number of folders removed or a negative code. */
int chief_ckpt_prune(const char *root, int keep, char *err, size_t errlen);

#endif
