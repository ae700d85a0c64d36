/* Error code tables, generated from TSR_ERRNO_MAP in err.h. Codes outside
 * the project's range are handed to libuv, which knows errno and its own. */
#include "common/err.h"

#include <stdio.h>
#include <uv.h>

static const char *const tsr__err_msgs[] = {
#define TSR__X(name, msg) msg,
  TSR_ERRNO_MAP(TSR__X)
#undef TSR__X
};

static const char *const tsr__err_names[] = {
#define TSR__X(name, msg) "TSR_E" #name,
  TSR_ERRNO_MAP(TSR__X)
#undef TSR__X
};

int tsr_err_is_own(int code) {
  return code > TSR__ERR_FIRST && code < TSR__ERR_LAST;
}

/* A code's text from one of the tables above: `ok` for 0, `unknown` for
 * a positive code not ours, libuv's text (uv_text, into buf) for the
 * rest. uv_strerror() and uv_err_name() leak a string for codes they do
 * not know; their _r forms write into the caller's buffer instead. */
static const char *err_text(int code, const char *const *table,
                            const char *ok, const char *unknown,
                            char *(*uv_text)(int, char *, size_t), char *buf,
                            size_t len) {
  if (code == 0) return ok;
  if (tsr_err_is_own(code)) return table[code - TSR__ERR_FIRST - 1];
  if (code > 0) return unknown;
  return uv_text(code, buf, len);
}

/* Each with a per-thread buffer of its own: a caller may hold both. */
const char *tsr_strerror(int code) {
  static _Thread_local char buf[80];
  return err_text(code, tsr__err_msgs, "success", "unknown positive code",
                  uv_strerror_r, buf, sizeof buf);
}

const char *tsr_err_name(int code) {
  static _Thread_local char buf[48];
  return err_text(code, tsr__err_names, "OK", "UNKNOWN", uv_err_name_r, buf,
                  sizeof buf);
}

int tsr_verrf(char *err, size_t errlen, int code, const char *fmt,
              va_list ap) {
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  return code;
}

int tsr_errf(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tsr_verrf(err, errlen, code, fmt, ap);
  va_end(ap);
  return code;
}
