/* Error codes.
 *
 * Every function returns 0 on success or a negative code. libuv's codes
 * (UV_E*, which are negated errno values) pass through unchanged; the
 * project's own codes live in a range below -4000 that neither errno nor
 * libuv uses, so tsr_strerror() can tell them apart. The list below is the
 * one place a code is declared: the enum, the names and the messages are all
 * generated from it.
 */
#ifndef TSR_ERR_H
#define TSR_ERR_H

#include <stdarg.h>
#include <stddef.h>

#define TSR_ERR_BASE (-5000)

/* X(name, message) */
#define TSR_ERRNO_MAP(X)                                                     \
  X(INVAL,       "invalid argument")                                         \
  X(NOMEM,       "out of memory")                                            \
  X(CONFIG,      "invalid configuration")                                    \
  X(JSON,        "malformed JSON")                                           \
  X(NOTFOUND,    "not found")                                                \
  X(EXISTS,      "already exists with a different definition")              \
  X(RANGE,       "value out of range")                                       \
  X(PROTO,       "protocol error")                                           \
  X(VERSION,     "protocol version mismatch")                                \
  X(AUTH,        "authentication failed")                                    \
  X(TOOBIG,      "message over the size limit")                              \
  X(TIMEOUT,     "deadline exceeded")                                        \
  X(CLOSED,      "connection closed")                                        \
  X(UNAVAIL,     "peer unavailable")                                         \
  X(BUSY,        "queue full")                                               \
  X(NOMETHOD,    "unknown method")                                           \
  X(DUPID,       "request id already in flight")                             \
  X(REMOTE,      "remote error")                                             \
  X(SHAPE,       "shape mismatch")                                           \
  X(DTYPE,       "dtype mismatch")                                           \
  X(NONFINITE,   "non-finite value")                                         \
  X(MEMLIMIT,    "memory limit exceeded")                                    \
  X(CORRUPT,     "data corrupt")                                             \
  X(FORMAT,      "bad file format")                                          \
  X(IO,          "input/output error")                                       \
  X(UNSUPPORTED, "not supported")                                            \
  X(NODEVICE,    "no GPU device available")                                  \
  X(CANCELED,    "canceled")                                                 \
  X(SHUTDOWN,    "shutting down")                                            \
  X(STALE,       "stale state")                                              \
  X(EOF,         "end of data")                                              \
  X(DATA,        "bad training or evaluation data")

enum tsr_errno {
  TSR__ERR_FIRST = TSR_ERR_BASE,
#define TSR__X(name, msg) TSR_E##name,
  TSR_ERRNO_MAP(TSR__X)
#undef TSR__X
  TSR__ERR_LAST
};

/* Exit status of a process whose job stops on its data (a file missing,
 * a value that is not a number, a label out of range): the chief and
 * `tessera-worker --standalone` alike. */
#define TSR_EXIT_DATA 3

/* Message for any code: the project's own, libuv's, or errno's (negated).
 * Never NULL; the string is static. */
const char *tsr_strerror(int code);

/* Symbolic name ("TSR_ETIMEOUT", "ECONNREFUSED"); never NULL, static. */
const char *tsr_err_name(int code);

/* Non-zero when the code belongs to the project's own range. */
int tsr_err_is_own(int code);

/* The one error formatter: writes the message into the caller's buffer
 * and returns `code`, so a failure reads
 *     return tsr_errf(err, errlen, TSR_ECONFIG, "%s: unknown key", key);
 * `err` may be NULL or `errlen` 0 (nothing is written); a longer message
 * is cut to errlen - 1 bytes. Never allocates; any thread. */
int tsr_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same with a va_list, for formatters of a context's own buffer. */
int tsr_verrf(char *err, size_t errlen, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif /* TSR_ERR_H */
