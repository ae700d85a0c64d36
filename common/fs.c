/* Folders and whole-file replacement (fs.h). Flow of a replacement: temp
 * file beside the target -> bytes -> fsync -> close -> rename over the
 * target -> fsync of the folder. Any failure before the rename removes the
 * temp file; a failed folder fsync is reported (the rename may not be on
 * disk yet) but leaves the new file in place. */
#include "common/fs.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tsr_mkdir_p(const char *path, int mode, char *err, size_t errlen) {
  char tmp[TSR_PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof tmp)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "directory path \"%s\" is empty or too long", path);
  memcpy(tmp, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (tmp[i] != '/' && tmp[i] != '\0') continue;
    char c = tmp[i];
    tmp[i] = '\0';
    if (mkdir(tmp, (mode_t)mode) != 0 && errno != EEXIST) {
      int e = errno;
      return tsr_errf(err, errlen, -e, "cannot create directory %s: %s", tmp,
                      strerror(e));
    }
    tmp[i] = c;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return tsr_errf(err, errlen, TSR_EEXISTS,
                    "%s exists and is not a directory", path);
  return 0;
}

int tsr_fsync_dir(const char *dir, char *err, size_t errlen) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return tsr_errf(err, errlen, -e, "cannot open folder %s: %s", dir,
                    strerror(e));
  }
  int rc = 0;
  if (fsync(fd) != 0) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot fsync folder %s: %s", dir,
                  strerror(e));
  }
  close(fd);
  return rc;
}

static int tmp_name(char *tmp, size_t len, const char *path, char *err,
                    size_t errlen) {
  if (strlen(path) >= TSR_PATH_MAX ||
      snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid()) >= (int)len)
    return tsr_errf(err, errlen, TSR_EINVAL, "path too long: %s", path);
  return 0;
}

/* The temp file is written and closed: rename it over `path`, then make
 * the rename durable. */
static int finish(const char *tmp, const char *path, char *err,
                  size_t errlen) {
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return tsr_errf(err, errlen, -e, "cannot rename %s to %s: %s", tmp, path,
                    strerror(e));
  }
  char dir[TSR_PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == path)
    snprintf(dir, sizeof dir, "/");
  else
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  return tsr_fsync_dir(dir, err, errlen);
}

int tsr_write_atomic(const char *path, const void *data, size_t len,
                     char *err, size_t errlen) {
  char tmp[TSR_PATH_MAX + 32];
  int rc = tmp_name(tmp, sizeof tmp, path, err, errlen);
  if (rc) return rc;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    return tsr_errf(err, errlen, -e, "cannot create %s: %s", tmp,
                    strerror(e));
  }
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int e = errno;
      rc = tsr_errf(err, errlen, -e, "cannot write %s: %s", tmp, strerror(e));
      goto fail_close;
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd) != 0) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot fsync %s: %s", tmp, strerror(e));
    goto fail_close;
  }
  if (close(fd) != 0) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot close %s: %s", tmp, strerror(e));
    goto fail_unlink;
  }
  return finish(tmp, path, err, errlen);
fail_close:
  close(fd);
fail_unlink:
  unlink(tmp);
  return rc;
}

int tsr_atomic_open(tsr_atomic_file *a, const char *path, char *err,
                    size_t errlen) {
  a->f = NULL;
  int rc = tmp_name(a->tmp, sizeof a->tmp, path, err, errlen);
  if (rc) return rc;
  snprintf(a->path, sizeof a->path, "%s", path);
  a->f = fopen(a->tmp, "we");
  if (!a->f) {
    int e = errno;
    return tsr_errf(err, errlen, -e, "cannot create %s: %s", a->tmp,
                    strerror(e));
  }
  return 0;
}

int tsr_atomic_commit(tsr_atomic_file *a, char *err, size_t errlen) {
  FILE *f = a->f;
  a->f = NULL;
  if (!f) return tsr_errf(err, errlen, TSR_EINVAL, "%s: not open", a->path);
  int rc = 0;
  /* fflush first: a buffer that did not fit sets errno (ENOSPC) here */
  if (fflush(f) != 0) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot write %s: %s", a->tmp,
                  strerror(e));
  } else if (ferror(f)) {
    rc = tsr_errf(err, errlen, TSR_EIO, "cannot write %s", a->tmp);
  } else if (fsync(fileno(f)) != 0) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot fsync %s: %s", a->tmp,
                  strerror(e));
  }
  if (fclose(f) != 0 && !rc) {
    int e = errno;
    rc = tsr_errf(err, errlen, -e, "cannot close %s: %s", a->tmp,
                  strerror(e));
  }
  if (rc) {
    unlink(a->tmp);
    return rc;
  }
  return finish(a->tmp, a->path, err, errlen);
}

void tsr_atomic_abort(tsr_atomic_file *a) {
  if (!a->f) return;
  fclose(a->f);
  a->f = NULL;
  unlink(a->tmp);
}

int tsr_commit_written(const char *tmp, const char *path, char *err,
                       size_t errlen) {
  int fd = open(tmp, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    return tsr_errf(err, errlen, -e, "cannot fsync %s: %s", tmp, strerror(e));
  }
  close(fd);
  return finish(tmp, path, err, errlen);
}
