/* The end-of-run summary: a few lines for people, and the same facts as
 * JSON (--summary-json PATH) for scripts and CI. The JSON is written to a
 * temp file and renamed, so a reader sees the whole object or none; a
 * non-finite number (a diverged loss) is written as null. Checkpoints that
 * failed (a full disk) are named with the last good one, in both. */
#include "artifacts/monitor/monitor.h"
#include "artifacts/monitor/monitor_int.h"
#include "common/err.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Examples per second of this process's training: a resumed run's rate
 * counts only the examples it trained itself (the restored ones took no
 * time of its); NaN where there is nothing to divide (no time, or a run
 * that found its job finished and trained nothing). */
static double rate(const chief_summary *s) {
  int64_t ex = s->resumed_from_step >= 0 ? s->examples_run : s->examples;
  return s->seconds > 0 && ex > 0 ? (double)ex / s->seconds : NAN;
}

void chief_summary_print(FILE *out, const chief_summary *s) {
  char d[32];
  chief_format_duration(s->seconds, d, sizeof d);
  fprintf(out, "training done: %lld steps, %lld examples in %s",
          (long long)s->steps, (long long)s->examples, d);
  if (s->seconds >= 60) fprintf(out, " (%.1f s)", s->seconds);
  if (!isnan(rate(s))) fprintf(out, ", %.1f examples/s", rate(s));
  fputc('\n', out);
  if (s->has_loss) fprintf(out, "  final loss      %.6g\n", s->final_loss);
  for (size_t i = 0; i < s->n_eval; i++)
    fprintf(out, "  eval %-10s %.6g\n", s->eval[i].name, s->eval[i].value);
  if (s->restarts_worker || s->restarts_ps || s->restarts_chief)
    fprintf(out,
            "  restarts        %d worker, %d ps (recovered from checkpoints), "
            "%d chief\n",
            s->restarts_worker, s->restarts_ps, s->restarts_chief);
  if (s->skipped_records > 0)
    fprintf(out, "  skipped         %lld corrupt input record(s) "
            "(skip_corrupt)\n", (long long)s->skipped_records);
  if (s->resumed_from_step >= 0)
    fprintf(out, "  resumed from    step %lld\n",
            (long long)s->resumed_from_step);
  if (s->checkpoint_dir) {
    fprintf(out, "  checkpoints     %s\n", s->checkpoint_dir);
    if (s->last_ckpt_step >= 0)
      fprintf(out, "  last good       step %lld\n",
              (long long)s->last_ckpt_step);
    else
      fprintf(out, "  last good       none\n");
  }
  if (s->n_failed_ckpts) {
    fprintf(out, "  FAILED          %zu checkpoint(s): step", s->n_failed_ckpts);
    for (size_t i = 0; i < s->n_failed_ckpts && i < 8; i++)
      fprintf(out, "%s %lld", i ? "," : "", (long long)s->failed_ckpt_steps[i]);
    if (s->n_failed_ckpts > 8) fprintf(out, ", ...");
    fprintf(out, " (%s)\n", s->failed_ckpt_reasons[s->n_failed_ckpts - 1]);
  }
  if (s->logdir)
    fprintf(out, "  TensorBoard     tensorboard --logdir %s\n"
                 "  report          %s/%s\n",
            s->logdir, s->logdir, CHIEF_REPORT_HTML);
  fflush(out);
}

static json_t *num(double v) {
  return isfinite(v) ? json_real(v) : json_null();
}

int chief_summary_write_json(const char *path, const chief_summary *s,
                             char *err, size_t errlen) {
  json_t *o = json_object();
  json_t *ev = json_object();
  json_t *rs = json_object();
  int rc = TSR_ENOMEM;
  char *text = NULL;
  if (!o || !ev || !rs) goto done;
  json_object_set_new(o, "steps", json_integer(s->steps));
  if (s->steps_run >= 0)
    json_object_set_new(o, "steps_run", json_integer(s->steps_run));
  json_object_set_new(o, "examples", json_integer(s->examples));
  json_object_set_new(o, "seconds", num(s->seconds));
  if (s->resumed_from_step >= 0)
    json_object_set_new(o, "examples_run", json_integer(s->examples_run));
  json_object_set_new(o, "examples_per_sec", num(rate(s)));
  json_object_set_new(o, "final_loss",
                      s->has_loss ? num(s->final_loss) : json_null());
  for (size_t i = 0; i < s->n_eval; i++)
    json_object_set_new(ev, s->eval[i].name, num(s->eval[i].value));
  json_object_set(o, "eval", ev);
  json_object_set_new(rs, "worker", json_integer(s->restarts_worker));
  json_object_set_new(rs, "ps", json_integer(s->restarts_ps));
  json_object_set_new(rs, "chief", json_integer(s->restarts_chief));
  json_object_set(o, "restarts", rs);
  json_object_set_new(o, "skipped_records", json_integer(s->skipped_records));
  json_object_set_new(o, "resumed_from_step",
                      s->resumed_from_step >= 0
                          ? json_integer(s->resumed_from_step)
                          : json_null());
  json_object_set_new(o, "logdir",
                      s->logdir ? json_string(s->logdir) : json_null());
  json_object_set_new(o, "checkpoint_dir", s->checkpoint_dir
                                               ? json_string(s->checkpoint_dir)
                                               : json_null());
  json_t *ck = json_object();
  json_t *failed = json_array();
  if (ck && failed) {
    json_object_set_new(ck, "last_good", s->last_ckpt_step >= 0
                                             ? json_integer(s->last_ckpt_step)
                                             : json_null());
    for (size_t i = 0; i < s->n_failed_ckpts; i++) {
      json_t *f = json_object();
      json_object_set_new(f, "step", json_integer(s->failed_ckpt_steps[i]));
      json_object_set_new(f, "error", json_string(s->failed_ckpt_reasons[i]));
      json_array_append_new(failed, f);
    }
    json_object_set(ck, "failed", failed);
    json_object_set(o, "checkpoints", ck);
  }
  json_decref(ck);
  json_decref(failed);
  json_object_set_new(o, "exit_status", json_integer(s->exit_status));
  json_object_set_new(o, "error",
                      s->error && s->error[0] ? json_string(s->error)
                                              : json_null());
  text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (!text) goto done;
  size_t n = strlen(text);
  text[n] = '\n'; /* json_dumps leaves room only for the NUL: rewrite it */
  rc = tsr_write_atomic(path, text, n + 1, err, errlen);
done:
  if (rc == TSR_ENOMEM) snprintf(err, errlen, "out of memory");
  json_decref(o);
  json_decref(ev);
  json_decref(rs);
  free(text);
  return rc;
}
