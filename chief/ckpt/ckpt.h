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
 * or a checkpoint whose files are damaged (that checkpoint is skipped with
 * a warning naming it and why; the newest intact one is restored).
 */
#ifndef TSR_CHIEF_CKPT_H
#define TSR_CHIEF_CKPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHIEF_CKPT_MANIFEST "manifest.json"
#define CHIEF_CKPT_FORMAT "tessera-checkpoint"
#define CHIEF_CKPT_VERSION 1

/* ROOT/ckpt-<step, 12 digits>. */
int chief_ckpt_dir(const char *root, int64_t step, char *buf, size_t len);

/* Creates ROOT (and parents) and proves it writable with a probe file. */
int chief_ckpt_check_writable(const char *root, char *err, size_t errlen);

/* Creates the step's folder (one already there, unfinished or taken
 * again after a resume from an older checkpoint, is emptied first). */
int chief_ckpt_prepare(const char *root, int64_t step, char *err,
                       size_t errlen);

/* Writes manifest.json into the step's folder (the commit point), then the
 * ROOT/checkpoint hint. `manifest` gets "format", "version" and "step" set
 * here. */
int chief_ckpt_commit(const char *root, int64_t step, json_t *manifest,
                      char *err, size_t errlen);

/* The newest committed checkpoint: its step and manifest (caller decrefs).
 * TSR_ENOTFOUND when there is none. Files are not checked (see
 * chief_ckpt_latest_intact). */
int chief_ckpt_latest(const char *root, int64_t *step, json_t **manifest,
                      char *err, size_t errlen);

/* ---- verified checkpoints (verify.c) ----------------------------------
 *
 * Every PS tags its files with the checkpoint's id and step and reports
 * each file's size and CRC32C; the manifest lists them all ("files":
 * [{name, bytes, crc32c, ps}], "checkpoint_id", "storage"). With storage
 * "shared" the chief reads every listed file before it commits; with
 * "per_ps" each PS has read its own back. Restore and the CLI check the
 * same list: a checkpoint with a file missing, of another size, with
 * another CRC, with a part that fails its own checks, of another
 * checkpoint, or with a shard file nobody listed is not intact. */

#define CHIEF_CKPT_ID_MAX 64

typedef struct {
  char name[800];       /* file name inside the checkpoint folder */
  uint64_t bytes;
  uint32_t crc32c;      /* of the whole file */
  int ps;               /* the PS that wrote it; -1: the chief (dense
                           "allreduce": the workers' dense variables) */
} chief_ckpt_file;

/* The files of the checkpoint being written. Zero-initialise; free with
 * chief_ckpt_files_free. */
typedef struct {
  char id[CHIEF_CKPT_ID_MAX + 1];
  int64_t step;
  chief_ckpt_file *files;
  size_t n, cap;
  int reports;          /* PS answers added */
} chief_ckpt_files;

/* Starts the checkpoint of `step`: a fresh id (random, with the step in
 * it), no files yet. */
void chief_ckpt_files_start(chief_ckpt_files *f, int64_t step);
void chief_ckpt_files_free(chief_ckpt_files *f);
/* Adds the files one PS's save answer lists (`save_response`: the
 * ps_result's save field, a Tessera__Ps__SaveResponse). TSR_EPROTO when the
 * answer is of another checkpoint or names a file outside the folder. */
int chief_ckpt_files_add(chief_ckpt_files *f, int ps,
                         const void *save_response, char *err, size_t errlen);
/* Adds a file the chief wrote itself into the folder (ps -1 in the
 * list); TSR_EINVAL for a name that is no shard file's. */
int chief_ckpt_files_add_own(chief_ckpt_files *f, const char *name,
                             uint64_t bytes, uint32_t crc32c, char *err,
                             size_t errlen);

/* The commit point, verified: every one of the `n_ps` PS reported its
 * files; with per_ps false the chief reads each listed file whole (size
 * and CRC32C of every byte, then the part's own checks) and finds no
 * other shard file; the manifest then gets "files", "checkpoint_id" and
 * "storage", and is committed (chief_ckpt_commit). Nothing is committed
 * on any failure (err names the file and the problem, e.g. a file the
 * chief cannot see: no shared folder). */
int chief_ckpt_commit_verified(const char *root, int64_t step,
                               json_t *manifest, const chief_ckpt_files *f,
                               int n_ps, bool per_ps, char *err,
                               size_t errlen);

/* Checks a committed checkpoint folder against its manifest: every listed
 * file present with its size and CRC32C and passing the part's own checks
 * (PS layout, ids, CRCs), tagged with the manifest's id and step, every
 * variable's parts all there, no shard file unlisted. Files of a "per_ps"
 * checkpoint that the chief cannot see are skipped (the PS check their
 * own on restore). 0, or a negative code with `why` saying what is
 * damaged. */
int chief_ckpt_verify(const char *folder, const json_t *manifest, char *why,
                      size_t whylen);

/* The newest committed checkpoint of a step <= max_step (INT64_MAX: any)
 * that chief_ckpt_verify finds intact: its step and manifest (caller
 * decrefs). Each newer one passed over is logged (warn) with its step and
 * why. TSR_ENOTFOUND when none is intact. */
int chief_ckpt_latest_intact(const char *root, int64_t max_step,
                             int64_t *step, json_t **manifest, char *err,
                             size_t errlen);

/* ---- incremental checkpoints (chain.c) ---------------------------------
 *
 * An increment (checkpoint.full_every > 1) holds the rows of row-sparse
 * tables changed since the checkpoint before it (and every dense variable
 * whole); its manifest says "kind": "increment", "previous": {"step",
 * "checkpoint_id"}, "base_step" (the whole checkpoint the chain starts
 * at) and "links" (the chain's length). A restore, a verification and an
 * export take every link, the whole one first. */

#define CHIEF_CKPT_CHAIN_MAX 64

typedef struct {
  int64_t step;
  char id[CHIEF_CKPT_ID_MAX + 1];
} chief_ckpt_link;

bool chief_ckpt_is_increment(const json_t *manifest);
/* The step of the whole checkpoint the chain starts at (`step` itself for
 * a whole one). */
int64_t chief_ckpt_base_step(const json_t *manifest, int64_t step);
/* The chain of the checkpoint of `step` with `manifest`: links[0] the
 * whole one, links[*n - 1] this one (at most CHIEF_CKPT_CHAIN_MAX). Each
 * link's manifest must be there and hold the checkpoint named; err names
 * the link that is not. Reads manifests only. */
int chief_ckpt_chain(const char *root, int64_t step, const json_t *manifest,
                     chief_ckpt_link *links, size_t *n, char *err,
                     size_t errlen);
/* chief_ckpt_chain, and every earlier link's files intact
 * (chief_ckpt_verify); 0 for a whole checkpoint. */
int chief_ckpt_verify_chain(const char *root, int64_t step,
                            const json_t *manifest, char *why, size_t whylen);

/* "ckpt-<step, 12 digits>": a checkpoint folder's name under the root. */
int chief_ckpt_name(int64_t step, char *buf, size_t len);

/* The root a checkpoint folder is in (its parent: "/" for "/ckpt-...",
 * "." for a bare name) into buf, cut to len; an increment's links are
 * beside it there. */
void chief_ckpt_root_of(const char *folder, char *buf, size_t len);

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

/* The same, only those chief_ckpt_verify finds intact: each one passed
 * over is logged (warn) with its step and why. What a restarted chief
 * resumes from, newest first. Step folders without a manifest (a save that
 * never finished, a manifest lost) are logged and removed first: call it
 * only where no save is running (a starting chief). */
int chief_ckpt_list_intact(const char *root, int64_t **steps, size_t *n,
                           char *err, size_t errlen);

/* Keeps the newest `keep` committed checkpoints and every checkpoint
 * their chains build on (an increment's links back to its whole one);
 * deletes older ones and every unfinished folder older than the newest
 * committed one. Returns the number of folders removed or a negative
 * code. */
int chief_ckpt_prune(const char *root, int keep, char *err, size_t errlen);

#endif
