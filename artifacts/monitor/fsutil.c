/* A growable text buffer for the monitoring writers (report.html, the
 * metrics lines). Out of memory sticks in `oom`; the writer checks it
 * once at the end. */
#include "artifacts/monitor/monitor_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
