/* The option parser (opt.h): find the entry an argument names, take its
 * value, read it by the entry's kind. Every error goes through bad(), so
 * that each says the program, the option and the value the same way. */
#include "common/arg.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const tsr_arg help_opt = {.name = "help"};

__attribute__((format(printf, 2, 3))) static int bad(const tsr_arg_cmd *cmd,
                                                     const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (cmd->log)
    tsr_error("%s", line);
  else
    fprintf(stderr, "%s: %s\n", cmd->name, line);
  return TSR_EINVAL;
}

static void usage(const tsr_arg_cmd *cmd, FILE *f) {
  if (cmd->usage) cmd->usage(f, cmd->data);
}

static void store_int(void *out, size_t size, long long v) {
  switch (size) {
    case 1: { int8_t x = (int8_t)v; memcpy(out, &x, 1); break; }
    case 2: { int16_t x = (int16_t)v; memcpy(out, &x, 2); break; }
    case 4: { int32_t x = (int32_t)v; memcpy(out, &x, 4); break; }
    default: { int64_t x = (int64_t)v; memcpy(out, &x, 8); break; }
  }
}

/* The entry `name` (len bytes of it) stands for: its own, else the one
 * it begins (unless cmd->pass); NULL with *ambiguous set when it begins
 * more than one. */
static const tsr_arg *find(const tsr_arg_cmd *cmd, const tsr_arg *opts,
                           const char *name, size_t len, bool *ambiguous) {
  const tsr_arg *hit = NULL;
  int n = 0;
  *ambiguous = false;
  for (const tsr_arg *o = opts;; o++) {
    const tsr_arg *e = o->name ? o : &help_opt;
    if (strlen(e->name) == len && !strncmp(e->name, name, len)) return e;
    if (!cmd->pass && len && !strncmp(e->name, name, len) && n++ == 0)
      hit = e;
    if (!o->name) break;
  }
  if (n > 1) *ambiguous = true;
  return n == 1 ? hit : NULL;
}

/* " from 1 to 256", " of at least 0", "" for a range without bounds. */
static void int_range(const tsr_arg *o, char *buf, size_t len) {
  if (o->min == LLONG_MIN && o->max == LLONG_MAX)
    buf[0] = 0;
  else if (o->max == LLONG_MAX)
    snprintf(buf, len, " of at least %lld", o->min);
  else if (o->min == LLONG_MIN)
    snprintf(buf, len, " of at most %lld", o->max);
  else
    snprintf(buf, len, " from %lld to %lld", o->min, o->max);
}

static void num_range(const tsr_arg *o, char *buf, size_t len) {
  bool has_lo = o->lo > -INFINITY, has_hi = o->hi < INFINITY;
  if (has_lo && has_hi)
    snprintf(buf, len, o->above ? " above %g and at most %g" : " from %g to %g",
             o->lo, o->hi);
  else if (has_lo)
    snprintf(buf, len, o->above ? " above %g" : " of at least %g", o->lo);
  else if (has_hi)
    snprintf(buf, len, " of at most %g", o->hi);
  else
    buf[0] = 0;
}

static int take(const tsr_arg_cmd *cmd, const tsr_arg *o, const char *flag,
                const char *v) {
  char range[128], *end;
  switch (o->kind) {
    case TSR_ARG__STR:
      *(const char **)o->out = v;
      return 0;
    case TSR_ARG__INT: {
      errno = 0;
      long long x = strtoll(v, &end, 10);
      if (errno || end == v || *end || x < o->min || x > o->max) {
        int_range(o, range, sizeof range);
        return bad(cmd, "%s %s: must be a whole number%s", flag, v, range);
      }
      store_int(o->out, o->size, x);
      return 0;
    }
    case TSR_ARG__NUM: {
      double x = strtod(v, &end);
      bool in = o->above ? x > o->lo : x >= o->lo;
      if (end == v || *end || !in || !(x <= o->hi)) {
        num_range(o, range, sizeof range);
        return bad(cmd, "%s %s: must be a number%s", flag, v, range);
      }
      *(double *)o->out = x;
      return 0;
    }
    case TSR_ARG__CHOICE: {
      int n = 0;
      for (; o->choices[n]; n++)
        if (!strcmp(o->choices[n], v)) {
          store_int(o->out, o->size, n);
          return 0;
        }
      char list[256];
      size_t at = 0;
      list[0] = 0;
      for (int i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s",
                               i == 0 ? "" : i == n - 1 ? " or " : ", ",
                               o->choices[i]);
      return bad(cmd, "%s %s: must be %s", flag, v, list);
    }
    case TSR_ARG__CALL: {
      char err[1024] = "";
      if (o->fn(o->out, flag, v, err, sizeof err))
        return bad(cmd, "%s", err[0] ? err : flag);
      return 0;
    }
    default:
      return bad(cmd, "%s: an option of no known kind", flag);
  }
}

int tsr_arg_parse(const tsr_arg_cmd *cmd, const tsr_arg *opts, int argc,
                  char **argv, int *n_args) {
  int n = 0;
  for (int i = 1; i < argc; i++) {
    char *a = argv[i];
    bool dashes = a[0] == '-' && a[1] == '-';
    if (dashes && !a[2]) { /* "--": the rest are arguments */
      if (!n_args && i + 1 < argc)
        return bad(cmd, "unexpected argument \"%s\"", argv[i + 1]);
      while (++i < argc) argv[1 + n++] = argv[i];
      break;
    }
    if (a[0] != '-' || !a[1] || (!dashes && strcmp(a, "-h") && cmd->pass)) {
      if (!n_args) return bad(cmd, "unexpected argument \"%s\"", a);
      argv[1 + n++] = a;
      continue;
    }
    const char *name = dashes ? a + 2 : "help";
    if (!dashes && strcmp(a, "-h")) {
      bad(cmd, "unknown option \"%s\"", a);
      usage(cmd, stderr);
      return TSR_EINVAL;
    }
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    bool ambiguous;
    const tsr_arg *o = find(cmd, opts, name, len, &ambiguous);
    if (!o && cmd->pass && n_args) {
      argv[1 + n++] = a;
      continue;
    }
    if (!o) {
      bad(cmd, "%s option \"%.*s\"", ambiguous ? "ambiguous" : "unknown",
          (int)len + 2, a);
      usage(cmd, stderr);
      return TSR_EINVAL;
    }
    char flag[128];
    snprintf(flag, sizeof flag, "--%s", o->name);
    if (o == &help_opt || o->kind == TSR_ARG__FLAG) {
      if (eq) return bad(cmd, "%s takes no value", flag);
      if (o == &help_opt) {
        usage(cmd, stdout);
        return TSR_ARG_HELP;
      }
      store_int(o->out, o->size, 1);
      continue;
    }
    const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
    if (!v) {
      bad(cmd, "%s needs a value", flag);
      usage(cmd, stderr);
      return TSR_EINVAL;
    }
    int rc = take(cmd, o, flag, v);
    if (rc) return rc;
    if (o->seen) *o->seen = true;
  }
  if (n_args) *n_args = n;
  return 0;
}
