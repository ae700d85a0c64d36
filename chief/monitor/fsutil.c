/* File helpers for the monitoring writers: mkdir -p, whole-file writes that
 * readers never see half done (temp file, fsync, rename), and a text
 * buffer. Failures return the errno as a negative code and name the path. */
#include "chief/monitor/monitor_int.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int chief__mkdir_p(const char *path, char *err, size_t errlen) {
  char tmp[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof tmp) {
    snprintf(err, errlen, "directory path \"%s\" is empty or too long", path);
    return TSR_EINVAL;
  }
  memcpy(tmp, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (tmp[i] != '/' && tmp[i] != '\0') continue;
    char c = tmp[i];
    tmp[i] = '\0';
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) {
      int e = errno;
      snprintf(err, errlen, "cannot create directory %s: %s", tmp,
               strerror(e));
      return -e;
    }
    tmp[i] = c;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a directory", path);
    return TSR_EEXISTS;
  }
  return 0;
}

int chief__write_atomic(const char *path, const void *data, size_t len,
                        char *err, size_t errlen) {
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >=
      (int)sizeof tmp) {
    snprintf(err, errlen, "path too long: %s", path);
    return TSR_EINVAL;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(e));
    return -e;
  }
  const char *p = data;
  size_t left = len;
  int rc = 0;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      rc = -errno;
      snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
      goto fail_close;
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd) != 0) {
    rc = -errno;
    snprintf(err, errlen, "cannot fsync %s: %s", tmp, strerror(errno));
    goto fail_close;
  }
  if (close(fd) != 0) {
    rc = -errno;
    snprintf(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
    goto fail_unlink;
  }
  if (rename(tmp, path) != 0) {
    rc = -errno;
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path,
             strerror(errno));
    goto fail_unlink;
  }
  return 0;
fail_close:
  close(fd);
fail_unlink:
  unlink(tmp);
  return rc;
}

static int buf_reserve(chief__buf *b, size_t extra) {
  if (b->oom) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void chief__buf_put(chief__buf *b, const void *data, size_t len) {
  if (buf_reserve(b, len)) return;
  memcpy(b->p + b->len, data, len);
  b->len += len;
  b->p[b->len] = '\0';
}

void chief__buf_printf(chief__buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    chief__buf_put(b, small, (size_t)n);
    return;
  }
  if (buf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void chief__buf_html(chief__buf *b, const char *s) {
  for (; *s; s++) {
    switch (*s) {
      case '&': chief__buf_put(b, "&amp;", 5); break;
      case '<': chief__buf_put(b, "&lt;", 4); break;
      case '>': chief__buf_put(b, "&gt;", 4); break;
      case '"': chief__buf_put(b, "&quot;", 6); break;
      case '\'': chief__buf_put(b, "&#39;", 5); break;
      default: chief__buf_put(b, s, 1);
    }
  }
}

void chief__buf_free(chief__buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
  b->oom = 0;
}
