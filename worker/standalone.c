/* wk_train_standalone: a whole job in one process (train.h).
 *
 * Happy path: open the training split (worker 0 of 1), build the model
 * against its schema, check every input (train and eval) before the first
 * step, train for `steps` or `epochs` with a progress line every few
 * steps, then evaluate data.eval (when the job has one) and print one
 * summary line. Failure modes: the input's errors (file, line, column:
 * TSR_EDATA, as a worker reports them to the chief), the model's (layer,
 * shape, batch), the device's; all come back in `err`.
 */
#include "worker/train.h"
#include "worker/loop_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

int wk_train_standalone(const tsr_job *job, const wk_train_opts *o,
                        wk_train_result *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = job->batch_size,
                      .epochs = job->steps > 0 ? -1 : job->epochs,
                      .seed = job->seed};
  wk_input *in = NULL;
  tsr_model *m = NULL;
  wk_trainer *t = NULL;
  kern_ctx *pin = NULL;
  char ierr[512];
  if (o->device != KERN_DEVICE_CPU) {
    /* a GPU context for pinned batch buffers, so reading overlaps the
     * copies to the device (kept until the input is closed) */
    kern_opts ko = {.device = o->device, .cpu_threads = 1};
    if (kern_open(&ko, &pin, ierr, sizeof ierr) == 0 && kern_is_host(pin)) {
      kern_close(pin);
      pin = NULL;
    }
    if (pin) {
      io.pinned = true;
      io.host_alloc_ctx = wk__pin_alloc;
      io.host_free_ctx = wk__pin_free;
      io.host_ctx = pin;
    }
  }
  int rc = wk_input_open(job, WK_SPLIT_TRAIN, &io, &in, ierr, sizeof ierr);
  if (rc) {
    if (pin) kern_close(pin);
    return tsr_errf(err, errlen, wk__data_code(rc), "training data: %s", ierr);
  }
  if ((rc = tsr_model_from_job(job, wk_input_get_schema(in), &m, err, errlen)))
    goto out;
  /* every input checked before the first step: a bad eval file must not
   * cost a whole training */
  if ((rc = wk_input_validate(in, tsr_model_num_classes(m), ierr,
                              sizeof ierr))) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "training data: %s", ierr);
    goto out;
  }
  if (job->data && json_object_get(job->data, "eval")) {
    wk_input_opts eo = wk__input_once(job);
    wk_input *ein = NULL;
    rc = wk_input_open(job, WK_SPLIT_EVAL, &eo, &ein, ierr, sizeof ierr);
    if (!rc)
      rc = wk_input_validate(ein, tsr_model_num_classes(m), ierr, sizeof ierr);
    wk_input_close(ein);
    if (rc) {
      rc = tsr_errf(err, errlen, wk__data_code(rc),
                    "evaluation data: %s", ierr);
      goto out;
    }
  }
  if ((rc = wk_trainer_open(m, &job->optimizer, job->seed, job->precision, o,
                            job->batch_size, &t, err, errlen)))
    goto out;
  if (o->on_start && (rc = o->on_start(o->hook_data, t, m, err, errlen)))
    goto out;
  char summ[2048];
  tsr_model_summary(m, summ, sizeof summ);
  if (!o->quiet)
    tsr_info("standalone: %s on %s x%d, %d thread%s (convolutions: %s), "
             "%s, batch %lld, %s\n%s",
             job->path ? job->path : "job", wk_trainer_backend(t),
             wk_trainer_replicas(t), wk_trainer_threads(t),
             wk_trainer_threads(t) == 1 ? "" : "s", wk_trainer_conv_impl(t),
             tsr_precision_name(job->precision), (long long)job->batch_size,
             tsr_optim_name(job->optimizer.kind), summ);
  const wk_input_schema *sc = wk_input_get_schema(in);
  int64_t per_epoch = sc->n_examples > 0
                          ? (sc->n_examples + job->batch_size - 1) / job->batch_size
                          : 0;
  int64_t total = job->steps > 0 ? job->steps : per_epoch * job->epochs;
  int64_t every = o->log_every > 0 ? o->log_every : total > 20 ? total / 20 : 1;
  int64_t sum_every = o->summary_every > 0 ? o->summary_every
                      : total >= 100   ? total / 100
                                       : 1;
  double sum_loss = 0;
  int64_t sum_n = 0;
  int32_t tpid = tsr_trace_pid(TSR_TASK_WORKER, 0);
  if (o->trace) tsr_trace_name_process(o->trace, tpid, "standalone");
  r->best_auc = sc->best_auc;
  if (!o->quiet && sc->best_auc == sc->best_auc)
    tsr_info("the synthetic data's hidden model reaches AUC %.4f on it (the "
             "best any model can)", sc->best_auc);
  double t0 = tsr_now_s(), win_loss = 0, ep_loss = 0;
  int64_t win_n = 0, ep_n = 0, cur_epoch = 0, steps = 0;
  const wk_batch *b;
  while (job->steps <= 0 || steps < job->steps) {
    int64_t t_in = o->trace ? tsr_trace_now_us() : 0;
    rc = wk_input_next(in, &b);
    if (o->trace) tsr_trace_end(o->trace, tpid, 0, "step", "input wait", t_in);
    if (rc == TSR_EEOF) break;
    if (rc) {
      rc = tsr_errf(err, errlen, wk__data_code(rc),
                    "training data: %s", wk_input_error(in));
      goto out;
    }
    if (b->epoch != cur_epoch) {
      int64_t ep_every = job->epochs > 10 ? job->epochs / 10 : 1;
      if (!o->quiet && ep_n && (cur_epoch + 1) % ep_every == 0)
        tsr_info("epoch %lld done: loss %.6g", (long long)cur_epoch + 1,
                 ep_loss / (double)ep_n);
      cur_epoch = b->epoch;
      ep_loss = 0;
      ep_n = 0;
    }
    double loss;
    bool applied;
    int64_t t_st = o->trace ? tsr_trace_now_us() : 0;
    if ((rc = wk_trainer_step(t, b, &loss, &applied, err, errlen))) {
      /* a batch the model refuses (a value not finite, a label out of
       * range) is the data's fault, as on a worker */
      if (rc == TSR_ENONFINITE || rc == TSR_ERANGE) rc = TSR_EDATA;
      goto out;
    }
    if (o->trace) tsr_trace_end(o->trace, tpid, 0, "step", "step", t_st);
    steps++;
    sum_loss += loss * (double)b->n;
    sum_n += b->n;
    if (o->on_scalar && steps % sum_every == 0) {
      o->on_scalar(o->hook_data, "loss", steps, sum_loss / (double)sum_n);
      o->on_scalar(o->hook_data, "train/learning_rate", steps,
                   tsr_optim_lr(&job->optimizer, steps));
      sum_loss = 0;
      sum_n = 0;
    }
    if (o->on_checkpoint && o->checkpoint_every > 0 &&
        steps % o->checkpoint_every == 0 &&
        (rc = o->on_checkpoint(o->hook_data, t, m, steps))) {
      rc = tsr_errf(err, errlen, rc,
                    "checkpoint at step %lld failed", (long long)steps);
      goto out;
    }
    r->examples += b->n;
    win_loss += loss * (double)b->n;
    win_n += b->n;
    ep_loss += loss * (double)b->n;
    ep_n += b->n;
    if (!o->quiet && steps % every == 0) {
      double el = tsr_now_s() - t0;
      char ls[48] = "";
      if (job->precision == TSR_PREC_FP16)
        snprintf(ls, sizeof ls, ", loss scale %g", wk_trainer_loss_scale(t));
      tsr_info("step %lld/%lld epoch %lld loss %.6g  %.0f examples/s%s",
               (long long)steps, (long long)total, (long long)b->epoch + 1,
               win_loss / (double)win_n,
               (double)r->examples / (el > 0 ? el : 1e-9), ls);
      win_loss = 0;
      win_n = 0;
    }
  }
  rc = 0;
  r->seconds = tsr_now_s() - t0;
  r->steps = wk_trainer_steps(t);
  r->skipped = wk_trainer_skipped(t);
  r->examples_per_sec = r->seconds > 0 ? (double)r->examples / r->seconds : 0;
  r->train_loss = ep_n ? ep_loss / (double)ep_n : 0;
  r->loss_scale = wk_trainer_loss_scale(t);
  r->skipped_records = wk_input_skipped(in);
  if (o->on_scalar && r->skipped_records > 0)
    o->on_scalar(o->hook_data, "input/skipped_records", steps,
                 (double)r->skipped_records);
  r->threads = wk_trainer_threads(t);
  wk__result_names(r, t, m);
  if (o->on_scalar && sum_n)
    o->on_scalar(o->hook_data, "loss", steps, sum_loss / (double)sum_n);
  if (o->on_checkpoint && (rc = o->on_checkpoint(o->hook_data, t, m, steps))) {
    rc = tsr_errf(err, errlen, rc,
                  "checkpoint at step %lld failed", (long long)steps);
    goto out;
  }
  json_t *data = job->data;
  if (data && json_object_get(data, "eval") &&
      (rc = wk__eval_split(job, t, m, WK_SPLIT_EVAL, NULL, NULL, r, err,
                           errlen)))
    goto out;
  if (o->on_scalar && r->has_eval) {
    o->on_scalar(o->hook_data, "eval/loss", steps, r->eval_loss);
    for (int k = 0; k < r->n_metrics; k++) {
      char tag[TSR_METRIC_NAME_MAX + 16];
      snprintf(tag, sizeof tag, "eval/%s", r->metric_names[k]);
      o->on_scalar(o->hook_data, tag, steps, r->metrics[k]);
    }
  }
  if (!o->quiet) {
    char line[1024];
    int k = snprintf(line, sizeof line,
                     "final: steps %lld (skipped %lld), train loss %.6g",
                     (long long)r->steps, (long long)r->skipped, r->train_loss);
    if (r->has_eval) {
      k += snprintf(line + k, sizeof line - (size_t)k,
                    ", eval loss %.6g on %lld examples", r->eval_loss,
                    (long long)r->eval_examples);
      k = wk__line_metrics(line, sizeof line, k, r);
    }
    if (r->skipped_records > 0 && k < (int)sizeof line)
      k += snprintf(line + k, sizeof line - (size_t)k,
                    ", %lld corrupt records skipped",
                    (long long)r->skipped_records);
    if (r->best_auc == r->best_auc && k < (int)sizeof line)
      k += snprintf(line + k, sizeof line - (size_t)k,
                    ", best reachable auc %.4f", r->best_auc);
    char more[64];
    snprintf(more, sizeof more, ", %d thread%s, %s", r->threads,
             r->threads == 1 ? "" : "s", tsr_precision_name(job->precision));
    wk__line_print(line, sizeof line, k, r, more);
  }
out:
  wk_trainer_close(t);
  tsr_model_free(m);
  wk_input_close(in);
  if (pin) kern_close(pin);
  return rc;
}

int wk_standalone_status(int rc) {
  if (!rc) return 0;
  if (rc == TSR_ENODEVICE) return 4;
  if (rc == TSR_EDATA) return TSR_EXIT_DATA;
  if (rc == TSR_EUNSUPPORTED || rc == TSR_ECONFIG || rc == TSR_ESHAPE)
    return 2;
  return 1;
}
