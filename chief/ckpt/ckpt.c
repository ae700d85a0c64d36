/* Checkpoint folders, manifests and pruning; see ckpt.h. */
#include "chief/ckpt/ckpt.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/grow.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_PREFIX "ckpt-"
#define CK_PATH 4096

/* a/b into buf; TSR_ERANGE when it does not fit. */
static int ck_join(char *buf, size_t len, const char *a, const char *b) {
  int n = snprintf(buf, len, "%s/%s", a, b);
  return n < 0 || (size_t)n >= len ? TSR_ERANGE : 0;
}

int chief_ckpt_name(int64_t step, char *buf, size_t len) {
  int n = snprintf(buf, len, CK_PREFIX "%012" PRId64, step);
  return n < 0 || (size_t)n >= len ? TSR_ERANGE : 0;
}

int chief_ckpt_dir(const char *root, int64_t step, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s/" CK_PREFIX "%012" PRId64, root, step);
  return n < 0 || (size_t)n >= len ? TSR_ERANGE : 0;
}

void chief_ckpt_root_of(const char *folder, char *buf, size_t len) {
  snprintf(buf, len, "%s", folder);
  char *slash = strrchr(buf, '/');
  if (slash && slash != buf)
    *slash = 0;
  else
    snprintf(buf, len, "%s", slash ? "/" : ".");
}

static int ck_is_step_dir(const char *name, int64_t *step) {
  size_t pl = strlen(CK_PREFIX);
  if (strncmp(name, CK_PREFIX, pl) != 0) return 0;
  const char *d = name + pl;
  if (strlen(d) != 12) return 0;
  for (const char *p = d; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  *step = strtoll(d, NULL, 10);
  return 1;
}

static int ck_has_manifest(const char *dir) {
  char p[CK_PATH];
  return ck_join(p, sizeof p, dir, CHIEF_CKPT_MANIFEST) == 0 &&
         access(p, R_OK) == 0;
}

static int ck_rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[CK_PATH];
    if (ck_join(p, sizeof p, dir, e->d_name)) continue;
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
      int r = ck_rm_tree(p);
      if (r) rc = r;
    } else if (unlink(p) != 0) {
      rc = -errno;
    }
  }
  closedir(d);
  if (rmdir(dir) != 0 && !rc) rc = -errno;
  return rc;
}

int chief_ckpt_check_writable(const char *root, char *err, size_t errlen) {
  int rc = tsr_mkdir_p(root, 0777, err, errlen);
  if (rc) return rc;
  char probe[CK_PATH], name[64];
  snprintf(name, sizeof name, ".write-probe.%d", (int)getpid());
  if (ck_join(probe, sizeof probe, root, name)) return TSR_ERANGE;
  int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "checkpoint folder %s is not writable: %s", root,
             strerror(e));
    return -e;
  }
  ssize_t w = write(fd, "ok", 2);
  int e = errno;
  close(fd);
  unlink(probe);
  if (w != 2) {
    snprintf(err, errlen, "checkpoint folder %s: write failed: %s", root,
             strerror(e));
    return -e;
  }
  return 0;
}

/* chief_ckpt_dir into a CK_PATH buffer, naming the root when it is too
 * long. */
static int ck_step_dir(const char *root, int64_t step, char *dir, char *err,
                       size_t errlen) {
  if (chief_ckpt_dir(root, step, dir, CK_PATH))
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "checkpoint path too long under %s", root);
  return 0;
}

int chief_ckpt_prepare(const char *root, int64_t step, char *err,
                       size_t errlen) {
  char dir[CK_PATH];
  if (ck_step_dir(root, step, dir, err, errlen)) return TSR_ERANGE;
  /* an unfinished folder, or a committed one being taken again (after a
   * resume from an older checkpoint): its files give way to the new ones */
  struct stat st;
  if (stat(dir, &st) == 0) ck_rm_tree(dir);
  return tsr_mkdir_p(dir, 0777, err, errlen);
}

static int ck_list(const char *root, int64_t **steps, size_t *n, char *err,
                   size_t errlen, int committed_only);

int chief_ckpt_commit(const char *root, int64_t step, json_t *manifest,
                      char *err, size_t errlen) {
  char dir[CK_PATH], path[CK_PATH];
  if (chief_ckpt_dir(root, step, dir, sizeof dir) ||
      ck_join(path, sizeof path, dir, CHIEF_CKPT_MANIFEST))
    return TSR_ERANGE;
  json_object_set_new(manifest, "format", json_string(CHIEF_CKPT_FORMAT));
  json_object_set_new(manifest, "version", json_integer(CHIEF_CKPT_VERSION));
  json_object_set_new(manifest, "step", json_integer(step));
  char *text = json_dumps(manifest, JSON_INDENT(1) | JSON_SORT_KEYS);
  if (!text) {
    snprintf(err, errlen, "out of memory writing the manifest");
    return TSR_ENOMEM;
  }
  int rc = tsr_write_atomic(path, text, strlen(text), err, errlen);
  free(text);
  if (rc) return rc;
  if ((rc = tsr_fsync_dir(dir, err, errlen))) return rc;
  /* committed: the hint is for people (the manifests decide), so failing
   * to write it (a full disk) does not undo the commit */
  char hint[256], herr[256];
  int n = snprintf(hint, sizeof hint, "latest: " CK_PREFIX "%012" PRId64 "\n",
                   step);
  if (ck_join(path, sizeof path, root, "checkpoint") == 0)
    tsr_write_atomic(path, hint, (size_t)n, herr, sizeof herr);
  return 0;
}

int chief_ckpt_remove(const char *root, int64_t step, char *err,
                      size_t errlen) {
  char dir[CK_PATH];
  if (ck_step_dir(root, step, dir, err, errlen)) return TSR_ERANGE;
  int rc = ck_rm_tree(dir);
  if (rc) snprintf(err, errlen, "%s: %s", dir, tsr_strerror(rc));
  return rc;
}

static int ck_load_manifest(const char *dir, json_t **out, char *err,
                            size_t errlen);

/* Step folders without a manifest: a save that never finished, or a
 * manifest lost since. Nothing can resume from them; a starting chief (no
 * save of its own is running) says so and removes them, or they would
 * stay for good when no later checkpoint passes them. */
static void ck_remove_unfinished(const char *root) {
  int64_t *all;
  size_t n;
  char err[512];
  if (ck_list(root, &all, &n, err, sizeof err, 0)) return;
  for (size_t i = 0; i < n; i++) {
    char dir[CK_PATH];
    if (chief_ckpt_dir(root, all[i], dir, sizeof dir) || ck_has_manifest(dir))
      continue;
    int rc = ck_rm_tree(dir);
    if (rc)
      tsr_warn("%s has no manifest (a save that did not finish, or a "
               "manifest lost): not a checkpoint; removing it failed: %s",
               dir, tsr_strerror(rc));
    else
      tsr_warn("%s has no manifest (a save that did not finish, or a "
               "manifest lost): not a checkpoint; removed", dir);
  }
  free(all);
}

int chief_ckpt_list_intact(const char *root, int64_t **steps, size_t *n,
                           char *err, size_t errlen) {
  ck_remove_unfinished(root);
  int rc = chief_ckpt_list(root, steps, n, err, errlen);
  if (rc) return rc;
  /* each folder read once; an increment is intact when every link of its
   * chain is (the links are older: this list is newest first) */
  size_t k = 0;
  bool *ok = calloc(*n ? *n : 1, sizeof *ok);
  json_t **ms = calloc(*n ? *n : 1, sizeof *ms);
  if (!ok || !ms) {
    free(ok);
    free(ms);
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < *n; i++) {
    char dir[CK_PATH], why[1024] = "path too long";
    ok[i] = !(chief_ckpt_dir(root, (*steps)[i], dir, sizeof dir) ||
              ck_load_manifest(dir, &ms[i], why, sizeof why) ||
              chief_ckpt_verify(dir, ms[i], why, sizeof why));
    if (!ok[i])
      tsr_warn("checkpoint of step %" PRId64 " skipped (%s): %s", (*steps)[i],
               dir, why);
  }
  for (size_t i = *n; i-- > 0;) { /* oldest first: links before increments */
    if (!ok[i] || !chief_ckpt_is_increment(ms[i])) continue;
    chief_ckpt_link links[CHIEF_CKPT_CHAIN_MAX];
    size_t nl;
    char why[1024];
    if (chief_ckpt_chain(root, (*steps)[i], ms[i], links, &nl, why,
                         sizeof why)) {
      ok[i] = false;
    } else {
      for (size_t l = 0; l + 1 < nl && ok[i]; l++) {
        bool found = false;
        for (size_t j = i + 1; j < *n && !found; j++)
          found = (*steps)[j] == links[l].step && ok[j];
        if (!found) {
          ok[i] = false;
          snprintf(why, sizeof why, "it builds on the checkpoint of step %"
                   PRId64 ", which is not intact", links[l].step);
        }
      }
    }
    if (!ok[i])
      tsr_warn("checkpoint of step %" PRId64 " skipped: %s", (*steps)[i], why);
  }
  for (size_t i = 0; i < *n; i++) {
    if (ok[i]) (*steps)[k++] = (*steps)[i];
    json_decref(ms[i]);
  }
  free(ok);
  free(ms);
  *n = k;
  return 0;
}

int chief_ckpt_list(const char *root, int64_t **steps, size_t *n, char *err,
                    size_t errlen) {
  int rc = ck_list(root, steps, n, err, errlen, 1);
  if (rc == TSR_ENOTFOUND) {
    *steps = NULL;
    *n = 0;
    return 0;
  }
  return rc;
}

/* Committed step folders, newest first. */
static int ck_list(const char *root, int64_t **steps, size_t *n, char *err,
                   size_t errlen, int committed_only) {
  *steps = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) {
    int e = errno;
    snprintf(err, errlen, "checkpoint folder %s: %s", root, strerror(e));
    return e == ENOENT ? TSR_ENOTFOUND : -e;
  }
  size_t cap = 0;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    int64_t st;
    if (!ck_is_step_dir(e->d_name, &st)) continue;
    char p[CK_PATH];
    if (ck_join(p, sizeof p, root, e->d_name)) continue;
    if (committed_only && !ck_has_manifest(p)) continue;
    if ((rc = tsr_grow(steps, &cap, *n, sizeof **steps, 16))) break;
    (*steps)[(*n)++] = st;
  }
  closedir(d);
  if (rc) {
    free(*steps);
    *steps = NULL;
    *n = 0;
    return rc;
  }
  /* newest first */
  for (size_t i = 1; i < *n; i++)
    for (size_t j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
      int64_t t = (*steps)[j];
      (*steps)[j] = (*steps)[j - 1];
      (*steps)[j - 1] = t;
    }
  return 0;
}

static int ck_load_manifest(const char *dir, json_t **out, char *err,
                            size_t errlen) {
  char p[CK_PATH];
  if (ck_join(p, sizeof p, dir, CHIEF_CKPT_MANIFEST)) return TSR_ERANGE;
  json_error_t je;
  json_t *m = json_load_file(p, 0, &je);
  if (!m) {
    snprintf(err, errlen, "%s: %s (line %d)", p, je.text, je.line);
    return TSR_ECORRUPT;
  }
  json_t *f = json_object_get(m, "format");
  if (!json_is_string(f) || strcmp(json_string_value(f), CHIEF_CKPT_FORMAT)) {
    snprintf(err, errlen, "%s: not a %s manifest", p, CHIEF_CKPT_FORMAT);
    json_decref(m);
    return TSR_EFORMAT;
  }
  *out = m;
  return 0;
}

/* The newest committed checkpoint at or below max_step whose manifest
 * loads and, when `intact`, whose files pass chief_ckpt_verify; the ones
 * passed over are logged with the reason. */
static int ck_newest(const char *root, int64_t max_step, bool intact,
                     int64_t *step, json_t **manifest, char *err,
                     size_t errlen) {
  int64_t *steps;
  size_t n;
  int rc = ck_list(root, &steps, &n, err, errlen, 1);
  if (rc) return rc;
  rc = TSR_ENOTFOUND;
  snprintf(err, errlen, "no %scommitted checkpoint in %s",
           intact ? "intact " : "", root);
  for (size_t i = 0; i < n; i++) {
    if (steps[i] > max_step) continue;
    char dir[CK_PATH], why[1024];
    if (chief_ckpt_dir(root, steps[i], dir, sizeof dir)) continue;
    json_t *m;
    if (ck_load_manifest(dir, &m, why, sizeof why) == 0) {
      if (!intact || (chief_ckpt_verify(dir, m, why, sizeof why) == 0 &&
                      chief_ckpt_verify_chain(root, steps[i], m, why,
                                              sizeof why) == 0)) {
        *step = steps[i];
        if (manifest)
          *manifest = m;
        else
          json_decref(m);
        rc = 0;
        break;
      }
      json_decref(m);
    }
    if (intact)
      tsr_warn("checkpoint of step %" PRId64 " skipped (%s): %s", steps[i],
               dir, why);
    else
      tsr_warn("checkpoint %s skipped: %s", dir, why);
  }
  free(steps);
  return rc;
}

int chief_ckpt_latest(const char *root, int64_t *step, json_t **manifest,
                      char *err, size_t errlen) {
  return ck_newest(root, INT64_MAX, false, step, manifest, err, errlen);
}

int chief_ckpt_latest_intact(const char *root, int64_t max_step,
                             int64_t *step, json_t **manifest, char *err,
                             size_t errlen) {
  return ck_newest(root, max_step, true, step, manifest, err, errlen);
}

int chief_ckpt_read(const char *path, int64_t *step, json_t **manifest,
                    char *folder_out, size_t folder_len, char *err,
                    size_t errlen) {
  if (ck_has_manifest(path)) {
    json_t *m;
    int rc = ck_load_manifest(path, &m, err, errlen);
    if (rc) return rc;
    *step = json_integer_value(json_object_get(m, "step"));
    if (folder_out) snprintf(folder_out, folder_len, "%s", path);
    *manifest = m;
    return 0;
  }
  int rc = chief_ckpt_latest(path, step, manifest, err, errlen);
  if (rc == 0 && folder_out) chief_ckpt_dir(path, *step, folder_out,
                                            folder_len);
  return rc;
}

int chief_ckpt_prune(const char *root, int keep, char *err, size_t errlen) {
  int64_t *all;
  size_t n;
  int rc = ck_list(root, &all, &n, err, errlen, 0);
  if (rc) return rc == TSR_ENOTFOUND ? 0 : rc;
  int kept = 0, removed = 0;
  int64_t newest_committed = -1;
  int64_t need = INT64_MAX; /* the oldest whole checkpoint a kept one's
                               chain starts at: kept too */
  for (size_t i = 0; i < n; i++) {
    char dir[CK_PATH];
    if (chief_ckpt_dir(root, all[i], dir, sizeof dir)) continue;
    int committed = ck_has_manifest(dir);
    if (committed && newest_committed < 0) newest_committed = all[i];
    int drop;
    if (committed)
      drop = kept >= keep && all[i] < need;
    else
      drop = newest_committed >= 0; /* unfinished and older than a commit */
    if (committed && !drop) {
      kept++;
      json_t *m = NULL;
      char why[256];
      if (ck_load_manifest(dir, &m, why, sizeof why) == 0) {
        int64_t b = chief_ckpt_base_step(m, all[i]);
        if (b < need) need = b;
      }
      json_decref(m);
    }
    if (drop && ck_rm_tree(dir) == 0) removed++;
  }
  free(all);
  return removed;
}
