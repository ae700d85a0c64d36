/* The live status file (status.json in the logdir) and its table.
 *
 * Happy path: the chief fills a chief_run_status from its heartbeats and
 * writes it whole (temp file, rename) every interval; `tessera status`
 * reads it back and prints a table. Failure modes: reading names the file
 * and the key that is missing or mistyped; a file not rewritten for three
 * intervals is printed with a warning that the chief may be gone.
 */
#include "chief/monitor.h"
#include "chief/monitor_int.h"
#include "common/err.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *num(double v) {
  return isfinite(v) ? json_real(v) : json_null();
}

int chief_status_write(const char *path, const chief_run_status *st,
                       char *err, size_t errlen) {
  json_t *o = json_object(), *procs = json_array();
  char *text = NULL;
  int rc = TSR_ENOMEM;
  if (!o || !procs) goto done;
  json_object_set_new(o, "format", json_string("tessera-status"));
  json_object_set_new(o, "run_id", json_string(st->run_id));
  json_object_set_new(o, "phase", json_string(st->phase));
  json_object_set_new(o, "step", json_integer(st->step));
  json_object_set_new(o, "total_steps", json_integer(st->total_steps));
  json_object_set_new(o, "loss", num(st->loss));
  json_object_set_new(o, "examples_per_sec", num(st->examples_per_sec));
  json_object_set_new(o, "elapsed_s", num(st->elapsed_s));
  json_object_set_new(o, "updated_at", num(st->updated_at));
  json_object_set_new(o, "interval_s", num(st->interval_s));
  for (size_t i = 0; i < st->n_procs; i++) {
    const chief_proc_status *p = &st->procs[i];
    json_t *j = json_object();
    if (!j) goto done;
    json_object_set_new(j, "role", json_string(p->role));
    json_object_set_new(j, "index", json_integer(p->index));
    json_object_set_new(j, "addr", json_string(p->addr));
    json_object_set_new(j, "state", json_string(p->state));
    json_object_set_new(j, "steps", json_integer(p->steps));
    json_object_set_new(j, "steps_per_sec", num(p->steps_per_sec));
    json_object_set_new(j, "examples_per_sec", num(p->examples_per_sec));
    json_object_set_new(j, "bytes_per_sec", num(p->bytes_per_sec));
    json_object_set_new(j, "last_seen_s", num(p->last_seen_s));
    json_object_set_new(j, "restarts", json_integer(p->restarts));
    json_array_append_new(procs, j);
  }
  json_object_set(o, "processes", procs);
  text = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  if (!text) goto done;
  rc = chief__write_atomic(path, text, strlen(text), err, errlen);
done:
  if (rc == TSR_ENOMEM) snprintf(err, errlen, "out of memory writing %s", path);
  free(text);
  json_decref(procs);
  json_decref(o);
  return rc;
}

/* Typed getters that name the key on error. */
typedef struct {
  const char *path;
  char *err;
  size_t errlen;
  int rc;
} rd;

static json_t *need(rd *r, json_t *o, const char *key, const char *where,
                    int (*is)(const json_t *), const char *what) {
  json_t *v = json_object_get(o, key);
  if (r->rc) return NULL;
  if (!v || !is(v)) {
    snprintf(r->err, r->errlen, "%s: %s\"%s\" is missing or not %s", r->path,
             where, key, what);
    r->rc = TSR_EFORMAT;
    return NULL;
  }
  return v;
}
static int is_str(const json_t *v) { return json_is_string(v); }
static int is_int(const json_t *v) { return json_is_integer(v); }
static int is_num(const json_t *v) {
  return json_is_number(v) || json_is_null(v);
}

static void get_str(rd *r, json_t *o, const char *k, const char *where,
                    char *dst, size_t len) {
  json_t *v = need(r, o, k, where, is_str, "a string");
  if (v) snprintf(dst, len, "%s", json_string_value(v));
}
static int64_t get_int(rd *r, json_t *o, const char *k, const char *where) {
  json_t *v = need(r, o, k, where, is_int, "an integer");
  return v ? json_integer_value(v) : 0;
}
static double get_num(rd *r, json_t *o, const char *k, const char *where) {
  json_t *v = need(r, o, k, where, is_num, "a number");
  return v && !json_is_null(v) ? json_number_value(v) : NAN;
}

int chief_status_read(const char *path, chief_run_status *out, char *err,
                      size_t errlen) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  if (!o) {
    snprintf(err, errlen, "%s: %s", path, je.text);
    return je.line < 0 || strstr(je.text, "unable to open") ? TSR_ENOTFOUND
                                                            : TSR_EJSON;
  }
  rd r = {path, err, errlen, 0};
  get_str(&r, o, "run_id", "", out->run_id, sizeof out->run_id);
  get_str(&r, o, "phase", "", out->phase, sizeof out->phase);
  out->step = get_int(&r, o, "step", "");
  out->total_steps = get_int(&r, o, "total_steps", "");
  out->loss = get_num(&r, o, "loss", "");
  out->examples_per_sec = get_num(&r, o, "examples_per_sec", "");
  out->elapsed_s = get_num(&r, o, "elapsed_s", "");
  out->updated_at = get_num(&r, o, "updated_at", "");
  out->interval_s = get_num(&r, o, "interval_s", "");
  json_t *procs = json_object_get(o, "processes");
  if (!r.rc && !json_is_array(procs)) {
    snprintf(err, errlen, "%s: \"processes\" is missing or not an array",
             path);
    r.rc = TSR_EFORMAT;
  }
  size_t n = r.rc ? 0 : json_array_size(procs);
  if (n) {
    out->procs = calloc(n, sizeof *out->procs);
    if (!out->procs) r.rc = TSR_ENOMEM;
  }
  for (size_t i = 0; !r.rc && i < n; i++) {
    json_t *j = json_array_get(procs, i);
    chief_proc_status *p = &out->procs[i];
    char where[48];
    snprintf(where, sizeof where, "processes[%zu].", i);
    if (!json_is_object(j)) {
      snprintf(err, errlen, "%s: processes[%zu] is not an object", path, i);
      r.rc = TSR_EFORMAT;
      break;
    }
    get_str(&r, j, "role", where, p->role, sizeof p->role);
    p->index = (int)get_int(&r, j, "index", where);
    get_str(&r, j, "addr", where, p->addr, sizeof p->addr);
    get_str(&r, j, "state", where, p->state, sizeof p->state);
    p->steps = get_int(&r, j, "steps", where);
    p->steps_per_sec = get_num(&r, j, "steps_per_sec", where);
    p->examples_per_sec = get_num(&r, j, "examples_per_sec", where);
    p->bytes_per_sec = get_num(&r, j, "bytes_per_sec", where);
    p->last_seen_s = get_num(&r, j, "last_seen_s", where);
    p->restarts = (int)get_int(&r, j, "restarts", where);
    out->n_procs = i + 1;
  }
  json_decref(o);
  if (r.rc) chief_status_free(out);
  return r.rc;
}

void chief_status_free(chief_run_status *st) {
  free(st->procs);
  st->procs = NULL;
  st->n_procs = 0;
}

static void rate(double v, const char *unit, char *buf, size_t len) {
  if (!isfinite(v) || v <= 0)
    snprintf(buf, len, "-");
  else if (v >= 1e9)
    snprintf(buf, len, "%.1fG%s", v / 1e9, unit);
  else if (v >= 1e6)
    snprintf(buf, len, "%.1fM%s", v / 1e6, unit);
  else if (v >= 1e4)
    snprintf(buf, len, "%.1fk%s", v / 1e3, unit);
  else
    snprintf(buf, len, "%.4g%s", v, unit);
}

void chief_status_print(FILE *out, const chief_run_status *st,
                        double now_wall) {
  double age = now_wall - st->updated_at;
  double stale = isfinite(st->interval_s) && st->interval_s > 0
                     ? 3 * st->interval_s
                     : 10;
  if (stale < 10) stale = 10;
  char el[32], agebuf[32], ex[32];
  chief_format_duration(st->elapsed_s, el, sizeof el);
  chief_format_duration(age, agebuf, sizeof agebuf);
  rate(st->examples_per_sec, "", ex, sizeof ex);
  fprintf(out, "run %s: %s, step %lld", st->run_id, st->phase,
          (long long)st->step);
  if (st->total_steps > 0) fprintf(out, "/%lld", (long long)st->total_steps);
  if (isfinite(st->loss)) fprintf(out, ", loss %.4g", st->loss);
  fprintf(out, ", %s examples/s, running %s (updated %s ago)\n", ex, el,
          agebuf);
  if (!(age <= stale))
    fprintf(out,
            "warning: the status has not been updated for %s (expected "
            "every %.0f s): the chief may have stopped\n",
            agebuf, isfinite(st->interval_s) ? st->interval_s : 0);
  fprintf(out, "%-12s %-22s %-12s %10s %10s %10s %10s %9s %8s\n", "TASK",
          "ADDRESS", "STATE", "STEPS", "STEPS/S", "EX/S", "BYTES/S",
          "LAST SEEN", "RESTARTS");
  for (size_t i = 0; i < st->n_procs; i++) {
    const chief_proc_status *p = &st->procs[i];
    char task[40], sps[32], eps[32], bps[32], seen[32];
    snprintf(task, sizeof task, "%s:%d", p->role, p->index);
    rate(p->steps_per_sec, "", sps, sizeof sps);
    rate(p->examples_per_sec, "", eps, sizeof eps);
    rate(p->bytes_per_sec, "B", bps, sizeof bps);
    if (isfinite(p->last_seen_s) && p->last_seen_s >= 0) {
      char d[24];
      chief_format_duration(p->last_seen_s, d, sizeof d);
      snprintf(seen, sizeof seen, "%s ago", d);
    } else {
      snprintf(seen, sizeof seen, "-");
    }
    fprintf(out, "%-12s %-22s %-12s %10lld %10s %10s %10s %9s %8d\n", task,
            p->addr, p->state, (long long)p->steps, sps, eps, bps, seen,
            p->restarts);
  }
}
