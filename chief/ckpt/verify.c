/* Verified checkpoints: the files every PS reports, the check of each
 * file before the commit and before a restore (see ckpt.h).
 *
 * Happy path: the chief starts a checkpoint with a fresh id; each PS's
 * save answer adds its files (name, size, CRC32C of all bytes); once every
 * PS answered, chief_ckpt_commit_verified reads each file once, checks
 * its size, CRC and the part's own checks (tsr_shardfile_check),
 * finds no shard file nobody reported, writes the list into the manifest and
 * commits. chief_ckpt_verify runs the same checks on a committed folder.
 * Failure modes: a PS that did not report, a file missing or unreadable
 * (no shared folder: the message says so), of another size or CRC, a part
 * that fails its checks or is tagged with another checkpoint, a part of a
 * variable missing, an unlisted shard file: each named with its file.
 */
#include "chief/ckpt/ckpt.h"
#include "common/ckpt/shardfile.h"
#include "common/err.h"
#include "common/grow.h"
#include "common/log.h"
#include "ps.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

void chief_ckpt_files_start(chief_ckpt_files *f, int64_t step) {
  uint8_t r[8];
  randombytes_buf(r, sizeof r);
  snprintf(f->id, sizeof f->id, "%02x%02x%02x%02x%02x%02x%02x%02x-%" PRId64,
           r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], step);
  f->step = step;
  f->n = 0;
  f->reports = 0;
}

void chief_ckpt_files_free(chief_ckpt_files *f) {
  free(f->files);
  memset(f, 0, sizeof *f);
}

/* A plain file name: no folder part, a shard file. */
static bool vf_name_ok(const char *n) {
  size_t L = strlen(n);
  return L > 7 && L < sizeof(((chief_ckpt_file *)0)->name) &&
         !strchr(n, '/') && n[0] != '.' && !strcmp(n + L - 7, ".tshard");
}

int chief_ckpt_files_add_own(chief_ckpt_files *f, const char *name,
                             uint64_t bytes, uint32_t crc32c, char *err,
                             size_t errlen) {
  if (!vf_name_ok(name))
    return tsr_errf(err, errlen, TSR_EINVAL, "a file named \"%.100s\"", name);
  if (tsr_grow(&f->files, &f->cap, f->n, sizeof *f->files, 64))
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  chief_ckpt_file *o = &f->files[f->n++];
  snprintf(o->name, sizeof o->name, "%s", name);
  o->bytes = bytes;
  o->crc32c = crc32c;
  o->ps = -1;
  return 0;
}

int chief_ckpt_files_add(chief_ckpt_files *f, int ps,
                         const void *save_response, char *err,
                         size_t errlen) {
  const Tessera__Ps__SaveResponse *m = save_response;
  if (!m)
    return tsr_errf(err, errlen, TSR_EPROTO, "ps:%d answered the save without "
                    "a file list", ps);
  if (!m->checkpoint_id || strcmp(m->checkpoint_id, f->id))
    return tsr_errf(err, errlen, TSR_EPROTO, "ps:%d saved checkpoint \"%s\", "
                    "asked for \"%s\"", ps,
                    m->checkpoint_id ? m->checkpoint_id : "", f->id);
  for (size_t i = 0; i < m->n_files; i++) {
    const Tessera__Ps__SavedFile *sf = m->files[i];
    if (!sf->name || !vf_name_ok(sf->name))
      return tsr_errf(err, errlen, TSR_EPROTO, "ps:%d reported a file named "
                      "\"%.100s\"", ps, sf->name ? sf->name : "");
    if (tsr_grow(&f->files, &f->cap, f->n, sizeof *f->files, 64))
      return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    chief_ckpt_file *o = &f->files[f->n++];
    snprintf(o->name, sizeof o->name, "%s", sf->name);
    o->bytes = sf->bytes;
    o->crc32c = sf->crc32c;
    o->ps = ps;
  }
  f->reports++;
  return 0;
}

/* One variable's parts, as found. */
typedef struct {
  char name[256];
  int32_t num_shards;
  unsigned char *seen;   /* num_shards flags */
} vf_var;

typedef struct {
  vf_var *v;
  size_t n, cap;
} vf_vars;

static void vf_vars_free(vf_vars *vs) {
  for (size_t i = 0; i < vs->n; i++) free(vs->v[i].seen);
  free(vs->v);
}

/* Notes part `info` of its variable; refuses mixed shardings and a part
 * seen twice. */
static int vf_note(vf_vars *vs, const tsr_shardfile_hdr *info,
                   const char *file, char *why, size_t whylen) {
  vf_var *v = NULL;
  for (size_t i = 0; i < vs->n; i++)
    if (!strcmp(vs->v[i].name, info->name)) v = &vs->v[i];
  if (!v) {
    if (tsr_grow(&vs->v, &vs->cap, vs->n, sizeof *vs->v, 16))
      return tsr_errf(why, whylen, TSR_ENOMEM, "out of memory");
    v = &vs->v[vs->n];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", info->name);
    v->num_shards = info->num_shards;
    if (!(v->seen = calloc((size_t)info->num_shards, 1)))
      return tsr_errf(why, whylen, TSR_ENOMEM, "out of memory");
    vs->n++;
  }
  if (info->num_shards != v->num_shards)
    return tsr_errf(why, whylen, TSR_ECORRUPT, "%s: part of %s saved under %d "
                    "shards, other parts under %d", file, info->name,
                    info->num_shards, v->num_shards);
  if (v->seen[info->shard])
    return tsr_errf(why, whylen, TSR_ECORRUPT, "%s: part %d of %s twice", file,
                    info->shard, info->name);
  v->seen[info->shard] = 1;
  return 0;
}

/* The checks of one listed file: size, CRC of every byte, the part's own
 * checks, the checkpoint it is tagged with. */
static int vf_check_file(const char *folder, const char *name, uint64_t bytes,
                         uint32_t crc, const char *id, int64_t step,
                         vf_vars *vs, char *why, size_t whylen) {
  char path[4096];
  int n = snprintf(path, sizeof path, "%s/%s", folder, name);
  if (n < 0 || (size_t)n >= sizeof path)
    return tsr_errf(why, whylen, TSR_ERANGE, "%s/%s: path too long", folder,
                    name);
  /* read only when it is a regular file (a link or a FIFO is damage),
   * once, without mapping it: the files were just written, direct, so
   * the page cache holds none of them, and a map's page faults cost more
   * CPU than the CRC (on a VM, 1.5 s per GB against 0.1 s) */
  tsr_shardfile_hdr hb;
  const tsr_shardfile_hdr *h = &hb;
  int rc = tsr_shardfile_check(path, bytes, crc, &hb, why, whylen);
  if (rc == -ENOENT)
    return tsr_errf(why, whylen, TSR_ENOTFOUND, "%s is missing (a PS on "
                    "another host without a folder shared with the chief? "
                    "share it, or set checkpoint.storage to \"per_ps\")",
                    path);
  if (rc) return rc;
  char canon[TSR_SHARDFILE_NAME_MAX] = "";
  if (!rc && (tsr_shardfile_name(h->name, h->shard, h->num_shards, canon,
                                 sizeof canon) || strcmp(canon, name)))
    rc = tsr_errf(why, whylen, TSR_EFORMAT, "%s holds part %d of %d of %s, "
                  "whose file is named %s", path, h->shard, h->num_shards,
                  h->name, canon);
  if (!rc && (strcmp(h->ckpt_id, id) || h->ckpt_step != step))
    rc = tsr_errf(why, whylen, TSR_ESTALE, "%s: belongs to checkpoint \"%s\" "
                  "of step %" PRId64 ", the manifest's is \"%s\" of step %"
                  PRId64, path, h->ckpt_id, h->ckpt_step, id, step);
  if (!rc) rc = vf_note(vs, h, path, why, whylen);
  return rc;
}

/* Shard files in the folder that are not in `names`. */
static int vf_unlisted(const char *folder, const char *const *names,
                       size_t n, char *why, size_t whylen) {
  DIR *d = opendir(folder);
  if (!d)
    return tsr_errf(why, whylen, -errno, "%s: %s", folder, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    size_t L = strlen(e->d_name);
    if (L < 7 || strcmp(e->d_name + L - 7, ".tshard")) continue;
    bool listed = false;
    for (size_t i = 0; i < n && !listed; i++)
      listed = !strcmp(names[i], e->d_name);
    if (!listed)
      rc = tsr_errf(why, whylen, TSR_ECORRUPT, "%s/%s is a shard file no PS "
                    "reported", folder, e->d_name);
  }
  closedir(d);
  return rc;
}

static int vf_all_parts(const vf_vars *vs, const char *folder, char *why,
                        size_t whylen) {
  for (size_t i = 0; i < vs->n; i++)
    for (int32_t k = 0; k < vs->v[i].num_shards; k++)
      if (!vs->v[i].seen[k])
        return tsr_errf(why, whylen, TSR_ENOTFOUND, "%s: part %d of %d of %s "
                        "is missing", folder, k, vs->v[i].num_shards,
                        vs->v[i].name);
  return 0;
}

int chief_ckpt_commit_verified(const char *root, int64_t step,
                               json_t *manifest, const chief_ckpt_files *f,
                               int n_ps, bool per_ps, char *err,
                               size_t errlen) {
  if (f->reports != n_ps)
    return tsr_errf(err, errlen, TSR_ENOTFOUND, "%d of %d parameter servers "
                    "reported their files", f->reports, n_ps);
  if (f->step != step)
    return tsr_errf(err, errlen, TSR_EINVAL, "files of step %" PRId64 " for "
                    "the checkpoint of step %" PRId64, f->step, step);
  char folder[4096];
  if (chief_ckpt_dir(root, step, folder, sizeof folder))
    return tsr_errf(err, errlen, TSR_ERANGE, "checkpoint path too long under "
                    "%s", root);
  int rc = 0;
  if (!per_ps) {
    struct timespec w0, c0, w1, c1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    uint64_t total = 0;
    for (size_t i = 0; i < f->n; i++) total += f->files[i].bytes;
    vf_vars vs = {0};
    const char **names = calloc(f->n ? f->n : 1, sizeof *names);
    if (!names) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < f->n && !rc; i++) {
      names[i] = f->files[i].name;
      for (size_t j = 0; j < i && !rc; j++)
        if (!strcmp(names[j], names[i]))
          rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s reported by ps:%d and "
                        "ps:%d", names[i], f->files[j].ps, f->files[i].ps);
      if (!rc)
        rc = vf_check_file(folder, f->files[i].name, f->files[i].bytes,
                           f->files[i].crc32c, f->id, step, &vs, err, errlen);
    }
    if (!rc) rc = vf_unlisted(folder, names, f->n, err, errlen);
    if (!rc) rc = vf_all_parts(&vs, folder, err, errlen);
    free(names);
    vf_vars_free(&vs);
    if (rc) return rc;
    clock_gettime(CLOCK_MONOTONIC, &w1);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    /* what the check costs, beside the training it shares the CPU with */
    tsr_info("checkpoint of step %" PRId64 ": %zu file(s), %.1f MB checked "
             "in %.2f s, %.2f s of CPU", step, f->n, (double)total / 1e6,
             (double)(w1.tv_sec - w0.tv_sec) +
                 (double)(w1.tv_nsec - w0.tv_nsec) * 1e-9,
             (double)(c1.tv_sec - c0.tv_sec) +
                 (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9);
  }
  json_t *files = json_array();
  for (size_t i = 0; i < f->n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(f->files[i].name));
    json_object_set_new(o, "bytes", json_integer((json_int_t)f->files[i].bytes));
    json_object_set_new(o, "crc32c", json_integer(f->files[i].crc32c));
    json_object_set_new(o, "ps", json_integer(f->files[i].ps));
    json_array_append_new(files, o);
  }
  json_object_set_new(manifest, "files", files);
  json_object_set_new(manifest, "checkpoint_id", json_string(f->id));
  json_object_set_new(manifest, "storage",
                      json_string(per_ps ? "per_ps" : "shared"));
  return chief_ckpt_commit(root, step, manifest, err, errlen);
}

int chief_ckpt_verify(const char *folder, const json_t *manifest, char *why,
                      size_t whylen) {
  const json_t *files = json_object_get(manifest, "files");
  const json_t *jid = json_object_get(manifest, "checkpoint_id");
  const json_t *jstep = json_object_get(manifest, "step");
  if (!json_is_array(files) || !json_is_string(jid) || !json_is_integer(jstep))
    return tsr_errf(why, whylen, TSR_EFORMAT, "%s: the manifest has no file "
                    "list or checkpoint id (written by an older version)",
                    folder);
  const char *st = json_string_value(json_object_get(manifest, "storage"));
  bool per_ps = st && !strcmp(st, "per_ps");
  size_t n = json_array_size(files);
  const char **names = calloc(n ? n : 1, sizeof *names);
  if (!names) return tsr_errf(why, whylen, TSR_ENOMEM, "out of memory");
  vf_vars vs = {0};
  int rc = 0, seen = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    const json_t *o = json_array_get(files, i);
    const json_t *jn = json_object_get(o, "name"),
                 *jb = json_object_get(o, "bytes"),
                 *jc = json_object_get(o, "crc32c");
    if (!json_is_string(jn) || !vf_name_ok(json_string_value(jn)) ||
        !json_is_integer(jb) || json_integer_value(jb) < 0 ||
        !json_is_integer(jc) || json_integer_value(jc) < 0 ||
        json_integer_value(jc) > UINT32_MAX) {
      rc = tsr_errf(why, whylen, TSR_EFORMAT, "%s: manifest files[%zu] is not "
                    "{name, bytes, crc32c}", folder, i);
      break;
    }
    names[i] = json_string_value(jn);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, names[i]);
    struct stat sb;
    if (per_ps && stat(path, &sb) != 0) continue; /* on its PS's host */
    seen++;
    rc = vf_check_file(folder, names[i], (uint64_t)json_integer_value(jb),
                       (uint32_t)json_integer_value(jc),
                       json_string_value(jid), json_integer_value(jstep), &vs,
                       why, whylen);
  }
  if (!rc) rc = vf_unlisted(folder, names, n, why, whylen);
  /* every part of every variable (when the chief sees them all) */
  if (!rc && (!per_ps || (size_t)seen == n)) {
    rc = vf_all_parts(&vs, folder, why, whylen);
    const json_t *vars = json_object_get(manifest, "variables");
    for (size_t i = 0; !rc && i < json_array_size(vars); i++) {
      const char *vn =
          json_string_value(json_object_get(json_array_get(vars, i), "name"));
      bool found = false;
      for (size_t k = 0; vn && k < vs.n && !found; k++)
        found = !strcmp(vs.v[k].name, vn);
      if (vn && !found)
        rc = tsr_errf(why, whylen, TSR_ENOTFOUND, "%s: no saved part of "
                      "variable %s", folder, vn);
    }
  }
  free(names);
  vf_vars_free(&vs);
  return rc;
}
