/* Private helpers shared by the monitoring files. */
#ifndef TSR_CHIEF_MONITOR_INT_H
#define TSR_CHIEF_MONITOR_INT_H

#include "common/fs.h"

#include <stddef.h>

/* A growable byte buffer for building text; `oom` sticks once set. */
typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} chief__buf;

void chief__buf_printf(chief__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void chief__buf_put(chief__buf *b, const void *data, size_t len);
/* Appends `s` with &, <, >, " and ' escaped for HTML text and attributes. */
void chief__buf_html(chief__buf *b, const char *s);
void chief__buf_free(chief__buf *b);

#endif
