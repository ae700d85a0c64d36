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

const char *tsr_strerror(int code) {
  if (code == 0) return "success";
  if (tsr_err_is_own(code)) return tsr__err_msgs[code - TSR__ERR_FIRST - 1];
  if (code > 0) return "unknown positive code";
  /* uv_strerror() leaks a string for codes it does not know; the _r form
   * writes into a per-thread buffer instead. */
  static _Thread_local char buf[80];
  return uv_strerror_r(code, buf, sizeof buf);
}

const char *tsr_err_name(int code) {
  if (code == 0) return "OK";
  if (tsr_err_is_own(code)) return tsr__err_names[code - TSR__ERR_FIRST - 1];
  if (code > 0) return "UNKNOWN";
  static _Thread_local char buf[48];
  return uv_err_name_r(code, buf, sizeof buf);
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
