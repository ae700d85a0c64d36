/* Where Save and Restore may read and write, and Create may read initial
 * values from: only under the PS's checkpoint root.
 *
 * The root is given at start (--checkpoint-root, ps_server_opts) or, when
 * it was not, by the first configure (the job's checkpoint folder, as the
 * chief names it); after that it never moves: a later configure naming
 * another root is refused (the root given at start stays, the chief's path
 * for the same folder may differ on its host). "/" is never a root.
 * A request names a folder or file relative to the root
 * ("ckpt-000000001200") or an absolute path inside it. Happy path: the
 * name is checked lexically (no "..", no "." and no empty component, not
 * the root itself), joined to the root, and the deepest part of it that
 * exists already must still lie under the root once symbolic links are
 * resolved.
 * Failure modes, each refused with a message naming the path as given: no
 * root yet, a path outside the root, a component that climbs out, a link
 * that leads outside, a path too long. A refusal never says whether
 * anything outside the root exists, nor where a link leads.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Absolute, without a trailing slash or repeated slashes ("/" stays "/"). */
static int cr_normalize(const char *in, char *out, size_t len) {
  char tmp[PS_PATH_MAX];
  if (in[0] != '/') {
    char cwd[PS_PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return -errno;
    int n = snprintf(tmp, sizeof tmp, "%s/%s", cwd, in);
    if (n < 0 || (size_t)n >= sizeof tmp) return TSR_ERANGE;
  } else if (strlen(in) >= sizeof tmp) {
    return TSR_ERANGE;
  } else {
    snprintf(tmp, sizeof tmp, "%s", in);
  }
  size_t o = 0;
  for (const char *p = tmp; *p; p++) {
    if (*p == '/' && o > 0 && out[o - 1] == '/') continue;
    if (o + 1 >= len) return TSR_ERANGE;
    out[o++] = *p;
  }
  while (o > 1 && out[o - 1] == '/') o--;
  out[o] = 0;
  return 0;
}

int ps__root_set(ps_server *s, const char *root, bool fixed) {
  char norm[PS_PATH_MAX];
  if (!root || !root[0]) return TSR_EINVAL;
  int rc = cr_normalize(root, norm, sizeof norm);
  if (rc) return rc;
  if (strcmp(norm, "/") == 0) return TSR_EINVAL;
  if (s->ckpt_root[0]) {
    if (!strcmp(norm, s->ckpt_root)) return 0;
    if (s->root_fixed && !fixed) {
      tsr_info("checkpoint root stays %s (given at start); the chief's is %s",
               s->ckpt_root, norm);
      return 0;
    }
    return TSR_EEXISTS;
  }
  tsr_info("checkpoint root: %s (%s)", norm,
           fixed ? "--checkpoint-root" : "from the first configure");
  snprintf(s->ckpt_root, sizeof s->ckpt_root, "%s", norm);
  s->root_fixed = fixed;
  return 0;
}

/* Whether `path` is `root` or lies below it (both normalized). */
static bool cr_under(const char *root, const char *path) {
  size_t n = strlen(root);
  if (strcmp(root, "/") == 0) return path[0] == '/';
  return strncmp(path, root, n) == 0 && (path[n] == '/' || path[n] == 0);
}

int ps__root_resolve(const ps_server *s, const char *what, const char *dir,
                     char *out, size_t len, char *err, size_t errlen) {
  if (!s->ckpt_root[0])
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s: no checkpoint root: start "
                    "tessera-ps with --checkpoint-root or let the chief "
                    "configure one", what);
  if (!dir || !dir[0])
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: no folder given", what);
  size_t dl = strnlen(dir, PS_PATH_MAX);
  if (dl >= PS_PATH_MAX - 1)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s: folder name of %zu bytes "
                    "is too long", what, dl);
  /* the part under the root, component by component */
  const char *rel = dir;
  char abs[PS_PATH_MAX], rroot[PATH_MAX];
  if (dir[0] == '/') {
    /* inside the root as named, or inside its real path (the chief may
     * name files by their real path) */
    const char *base = s->ckpt_root;
    if (cr_normalize(dir, abs, sizeof abs))
      base = NULL;
    else if (!cr_under(base, abs) || !strcmp(abs, base))
      base = realpath(s->ckpt_root, rroot) && cr_under(rroot, abs) &&
                     strcmp(abs, rroot)
                 ? rroot
                 : NULL;
    if (!base)
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: %.300s is not inside the "
                      "checkpoint root %.300s", what, dir, s->ckpt_root);
    rel = abs + strlen(base) + (strcmp(base, "/") ? 1 : 0);
  }
  for (const char *c = rel; *c;) {
    const char *e = strchr(c, '/');
    size_t n = e ? (size_t)(e - c) : strlen(c);
    if (n == 0 || (n == 1 && c[0] == '.') ||
        (n == 2 && c[0] == '.' && c[1] == '.'))
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: %.300s has a \"%.*s\" "
                      "component: folders are named inside the checkpoint "
                      "root %.300s", what, dir, (int)n, c, s->ckpt_root);
    c = e ? e + 1 : c + n;
  }
  int n = snprintf(out, len, "%s/%s", strcmp(s->ckpt_root, "/") ? s->ckpt_root
                                                                 : "",
                   rel);
  if (n < 0 || (size_t)n >= len)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s: path under %.300s is too "
                    "long", what, s->ckpt_root);
  /* links: the deepest existing prefix must resolve under the root */
  char real_root[PATH_MAX], probe[PS_PATH_MAX], real[PATH_MAX];
  if (!realpath(s->ckpt_root, real_root))
    return 0; /* no root on disk yet: nothing under it can lead out */
  snprintf(probe, sizeof probe, "%s", out);
  for (;;) {
    if (realpath(probe, real)) {
      if (!cr_under(real_root, real))
        return tsr_errf(err, errlen, TSR_EINVAL, "%s: %.300s leads outside "
                        "the checkpoint root %.300s through a symbolic link",
                        what, dir, s->ckpt_root);
      return 0;
    }
    char *slash = strrchr(probe, '/');
    if (!slash || slash == probe) return 0;
    *slash = 0;
  }
}

int ps__root_file(const ps_server *s, const char *what, char *path,
                  size_t len, char *err, size_t errlen) {
  char joined[PS_PATH_MAX], real[PATH_MAX];
  int rc = ps__root_resolve(s, what, path, joined, sizeof joined, err,
                            errlen);
  if (rc) return rc;
  /* inside the root now: what is wrong with the file may be said */
  struct stat st;
  if (!realpath(joined, real) || stat(real, &st))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: %.300s: %s", what, path,
                    strerror(errno));
  if (!S_ISREG(st.st_mode))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: %.300s is not a regular "
                    "file", what, path);
  if (strlen(real) >= len)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s: %.300s: path too long",
                    what, path);
  snprintf(path, len, "%s", real);
  return 0;
}
