/* Logging: format into a stack buffer, then one write(2) to stderr. A line
 * longer than the buffer is cut and marked with "...". */
#include "common/log.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static tsr_log_level tsr__log_level = TSR_LOG_INFO;
static char tsr__log_task[64] = "";

static const char *const tsr__level_names[] = {"ERROR", "WARN", "INFO",
                                               "DEBUG", "TRACE"};

int tsr_log_parse_level(const char *s, tsr_log_level *out) {
  static const char *const names[] = {"error", "warn", "info", "debug",
                                      "trace"};
  for (int i = 0; i < 5; i++) {
    if (strcasecmp(s, names[i]) == 0) {
      *out = (tsr_log_level)i;
      return 0;
    }
  }
  if (strcasecmp(s, "warning") == 0) {
    *out = TSR_LOG_WARN;
    return 0;
  }
  return TSR_EINVAL;
}

void tsr_log_set_task(const char *task) {
  snprintf(tsr__log_task, sizeof tsr__log_task, "%s", task ? task : "");
}

void tsr_log_init(const char *task) {
  tsr_log_set_task(task);
  const char *env = getenv("TESSERA_LOG");
  if (env && *env) {
    tsr_log_level lvl;
    if (tsr_log_parse_level(env, &lvl) == 0)
      tsr__log_level = lvl;
    else
      tsr_warn("TESSERA_LOG=%s is not a level (error, warn, info, debug, "
               "trace); keeping info", env);
  }
}

void tsr_log_set_level(tsr_log_level level) { tsr__log_level = level; }
tsr_log_level tsr_log_get_level(void) { return tsr__log_level; }

void tsr_vlog(tsr_log_level level, const char *fmt, va_list ap) {
  if (level > tsr__log_level) return;
  char line[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s%s",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                   tsr__level_names[level], tsr__log_task,
                   tsr__log_task[0] ? " " : "");
  if (n < 0) return;
  size_t len = (size_t)n;
  int m = vsnprintf(line + len, sizeof line - len - 1, fmt, ap);
  if (m < 0) return;
  if ((size_t)m >= sizeof line - len - 1) {
    len = sizeof line - 5;
    memcpy(line + len, "...", 3);
    len += 3;
  } else {
    len += (size_t)m;
  }
  line[len++] = '\n';
  ssize_t off = 0;
  while ((size_t)off < len) {
    ssize_t w = write(STDERR_FILENO, line + off, len - (size_t)off);
    if (w <= 0) break;
    off += w;
  }
}

void tsr_log(tsr_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tsr_vlog(level, fmt, ap);
  va_end(ap);
}
