/* Evaluation in one process (train.h): the standalone trainer's final
 * evaluation (wk__eval_split) and evaluation alone (wk_eval_standalone).
 *
 * Happy path of evaluation alone: open the split, build the model against
 * its schema, check every example of it, open a trainer, let the caller
 * put the weights in (on_start), run every batch forward in inference
 * mode into the metrics and the caller's output hook, print one line.
 * Failure modes: the split's errors (file, line: TSR_EDATA), the model's,
 * the weights' (whatever on_start says), a failing output hook; all come
 * back in `err` and nothing has been changed or written by this file.
 */
#include "worker/train.h"
#include "worker/loop_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *split_name(wk_split s) {
  return s == WK_SPLIT_EVAL ? "evaluation data" : "training data";
}

wk_input_opts wk__input_once(const tsr_job *job) {
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = job->batch_size, .epochs = 1,
                      .seed = job->seed};
  return io;
}

void wk__result_names(wk_train_result *r, const wk_trainer *t,
                      const tsr_model *m) {
  r->replicas = wk_trainer_replicas(t);
  snprintf(r->backend, sizeof r->backend, "%s", wk_trainer_backend(t));
  r->n_metrics = tsr_model_num_metrics(m);
  for (int k = 0; k < r->n_metrics && k < 8; k++)
    snprintf(r->metric_names[k], sizeof r->metric_names[k], "%s",
             tsr_model_metric_name(m, k));
}

int wk__line_metrics(char *line, size_t cap, int k, const wk_train_result *r) {
  for (int i = 0; i < r->n_metrics && k < (int)cap; i++)
    k += snprintf(line + k, cap - (size_t)k, ", %s %.4f", r->metric_names[i],
                  r->metrics[i]);
  return k;
}

void wk__line_print(char *line, size_t cap, int k, const wk_train_result *r,
                    const char *more) {
  if (k < (int)cap)
    snprintf(line + k, cap - (size_t)k, ", %.0f examples/s, %.2f s, %s x%d%s",
             r->examples_per_sec, r->seconds, r->backend, r->replicas, more);
  printf("%s\n", line);
  fflush(stdout);
}

int wk__eval_split(const tsr_job *job, wk_trainer *t, const tsr_model *m,
                   wk_split split, wk_output_fn on_out, void *out_data,
                   wk_train_result *r, char *err, size_t errlen) {
  wk_input_opts io = wk__input_once(job);
  wk_input *in = NULL;
  char ierr[512];
  int rc = wk_input_open(job, split, &io, &in, ierr, sizeof ierr);
  if (rc) return tsr_errf(err, errlen, wk__data_code(rc), "%s: %s",
                          split_name(split), ierr);
  wk_metrics *mt = NULL;
  if ((rc = wk_metrics_open(m, &mt))) goto out;
  const wk_batch *b;
  while ((rc = wk_input_next(in, &b)) == 0)
    if ((rc = wk_trainer_predict(t, b, mt, on_out, out_data, err, errlen)))
      goto out;
  if (rc != TSR_EEOF) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "%s: %s",
                  split_name(split), wk_input_error(in));
    goto out;
  }
  rc = 0;
  r->has_eval = true;
  r->eval_examples = wk_metrics_count(mt);
  wk_metrics_result(mt, &r->eval_loss, r->metrics);
out:
  wk_metrics_close(mt);
  wk_input_close(in);
  return rc;
}

/* job->data with the split read once, in file order, every example: the
 * pipeline keys that would shuffle, repeat or drop examples set so they
 * do not (a copy; the job is the caller's). */
static json_t *read_once(const json_t *data, wk_split split) {
  json_t *d = json_deep_copy(data);
  json_t *s = d ? json_object_get(d, split == WK_SPLIT_EVAL ? "eval"
                                                            : "train")
                : NULL;
  if (json_is_object(s)) {
    json_object_del(s, "epochs");
    json_object_del(s, "repeat");
    if (json_object_set_new(s, "shuffle_buffer", json_integer(0)) ||
        json_object_set_new(s, "drop_remainder", json_false())) {
      json_decref(d);
      return NULL;
    }
  }
  return d;
}

int wk_eval_standalone(const tsr_job *job, const wk_train_opts *o,
                       const wk_eval_opts *e, wk_train_result *r, char *err,
                       size_t errlen) {
  memset(r, 0, sizeof *r);
  if (!o->on_start)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "evaluation alone needs weights to evaluate");
  wk_split split = e ? e->split : WK_SPLIT_EVAL;
  if (split == WK_SPLIT_EVAL &&
      !(job->data && json_object_get(job->data, "eval")))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: the job has no data.eval to evaluate on (--data "
                    "train evaluates on the training data)",
                    job->path ? job->path : "job");
  tsr_job j = *job; /* the caller's, but for the data read once */
  if (!(j.data = read_once(job->data, split)))
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  wk_input_opts io = wk__input_once(job);
  wk_input *in = NULL;
  tsr_model *m = NULL;
  wk_trainer *t = NULL;
  char ierr[512];
  /* the split's schema places a Functional model's inputs by name, as in
   * training; every example is checked before the weights are read */
  int rc = wk_input_open(&j, split, &io, &in, ierr, sizeof ierr);
  if (rc) {
    rc = tsr_errf(err, errlen, rc == TSR_ECONFIG ? rc : wk__data_code(rc),
                  "%s: %s", split_name(split), ierr);
    goto out;
  }
  if ((rc = tsr_model_from_job(&j, wk_input_get_schema(in), &m, err, errlen)))
    goto out;
  if ((rc = wk_input_validate(in, tsr_model_num_classes(m), ierr,
                              sizeof ierr))) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "%s: %s",
                  split_name(split), ierr);
    goto out;
  }
  wk_input_close(in);
  in = NULL;
  if ((rc = wk_trainer_open(m, &job->optimizer, job->seed, job->precision, o,
                            job->batch_size, &t, err, errlen)))
    goto out;
  if ((rc = o->on_start(o->hook_data, t, m, err, errlen))) goto out;
  double t0 = tsr_now_s();
  if ((rc = wk__eval_split(&j, t, m, split, e ? e->on_output : NULL,
                           e ? e->output_data : NULL, r, err, errlen)))
    goto out;
  r->seconds = tsr_now_s() - t0;
  r->examples = r->eval_examples;
  r->examples_per_sec = r->seconds > 0 ? (double)r->examples / r->seconds
                                       : 0;
  wk__result_names(r, t, m);
  r->best_auc = NAN;
  if (!o->quiet) {
    char line[1024];
    int k = snprintf(line, sizeof line, "evaluated: loss %.6g on %lld "
                     "examples (%s)", r->eval_loss,
                     (long long)r->eval_examples,
                     split == WK_SPLIT_EVAL ? "data.eval" : "data.train");
    k = wk__line_metrics(line, sizeof line, k, r);
    wk__line_print(line, sizeof line, k, r, "");
  }
out:
  wk_trainer_close(t);
  tsr_model_free(m);
  wk_input_close(in);
  json_decref(j.data);
  return rc;
}
