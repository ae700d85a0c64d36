/* Logging.
 *
 * One line per message on stderr: an ISO-8601 UTC timestamp with
 * milliseconds, the level, the task ("worker:1", set once at start), and
 * the text. The level comes from TESSERA_LOG (error, warn, info, debug,
 * trace; default info) or tsr_log_set_level(). Lines are written with a
 * single write() so lines of several threads or processes sharing a
 * terminal never interleave mid-line. The level and the task are the only
 * mutable globals of the project.
 */
#ifndef TSR_LOG_H
#define TSR_LOG_H

#include <stdarg.h>

typedef enum {
  TSR_LOG_ERROR = 0,
  TSR_LOG_WARN = 1,
  TSR_LOG_INFO = 2,
  TSR_LOG_DEBUG = 3,
  TSR_LOG_TRACE = 4
} tsr_log_level;

/* Reads TESSERA_LOG; an unknown value is reported once and ignored.
 * `task` (may be NULL) is copied and shown in every line. */
void tsr_log_init(const char *task);
void tsr_log_set_task(const char *task);
void tsr_log_set_level(tsr_log_level level);
tsr_log_level tsr_log_get_level(void);
/* Parses "error".."trace"; returns 0 or TSR_EINVAL. */
int tsr_log_parse_level(const char *s, tsr_log_level *out);

void tsr_log(tsr_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tsr_vlog(tsr_log_level level, const char *fmt, va_list ap);

#define TSR_LOG_ENABLED(lvl) ((lvl) <= tsr_log_get_level())
#define tsr_error(...) tsr_log(TSR_LOG_ERROR, __VA_ARGS__)
#define tsr_warn(...) tsr_log(TSR_LOG_WARN, __VA_ARGS__)
#define tsr_info(...) tsr_log(TSR_LOG_INFO, __VA_ARGS__)
#define tsr_debug(...) \
  do { if (TSR_LOG_ENABLED(TSR_LOG_DEBUG)) tsr_log(TSR_LOG_DEBUG, __VA_ARGS__); } while (0)
#define tsr_trace(...) \
  do { if (TSR_LOG_ENABLED(TSR_LOG_TRACE)) tsr_log(TSR_LOG_TRACE, __VA_ARGS__); } while (0)

#endif /* TSR_LOG_H */
