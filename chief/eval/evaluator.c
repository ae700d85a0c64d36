/* The evaluator sidecar; see evaluator.h. One loop: look for a newer
 * committed checkpoint, load it into a trainer's host variables, run the
 * eval split through the model, record the figures, sleep. */
#include "chief/eval/evaluator.h"
#include "chief/eval/eval_int.h"
#include "chief/ckpt/ckpt.h"
#include "artifacts/monitor/monitor.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/input.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "worker/train.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t ev_stop;

static void ev_on_signal(int sig) {
  (void)sig;
  ev_stop = 1;
}

static int ev_evaluate(const tsr_job *job, wk_trainer *tr, wk_metrics *mt,
                       const wk_input_opts *io, char *err, size_t errlen) {
  wk_input *in;
  int rc = wk_input_open(job, WK_SPLIT_EVAL, io, &in, err, errlen);
  if (rc) return rc;
  wk_metrics_reset(mt);
  const wk_batch *b;
  while ((rc = wk_input_next(in, &b)) == 0) {
    rc = wk_trainer_eval(tr, b, mt, err, errlen);
    if (rc) break;
  }
  if (rc == TSR_EEOF)
    rc = 0;
  else if (rc && !err[0])
    snprintf(err, errlen, "%s", wk_input_error(in));
  wk_input_close(in);
  return rc;
}

int chief_evaluator_run(const chief_coord_opts *o, const chief_eval_opts *e) {
  char err[1024] = "";
  tsr_job job;
  int status = 2;
  if (!o->job_path) {
    tsr_error("the evaluator needs --job JOB.json");
    return 2;
  }
  if (tsr_job_load(o->job_path, o->overrides, &job, err, sizeof err)) {
    tsr_error("%s", err);
    return 2;
  }
  tsr_model *m = NULL;
  wk_trainer *tr = NULL;
  wk_metrics *mt = NULL;
  chief_metrics *rec = NULL;
  char *root = NULL, *logdir = NULL;
  if (!job.checkpoint_dir) {
    tsr_error("%s: the evaluator needs checkpoint.dir", job.path);
    goto out;
  }
  if (!job.data || !json_object_get(job.data, "eval")) {
    tsr_error("%s: the evaluator needs data.eval", job.path);
    goto out;
  }
  if (!(root = tsr_job_resolve(&job, job.checkpoint_dir, ""))) goto out;
  if (job.logdir && !(logdir = tsr_job_resolve(&job, job.logdir, "/eval")))
    goto out;
  wk_input_opts io;
  memset(&io, 0, sizeof io);
  io.worker_index = 0;
  io.num_workers = 1;
  io.batch_size = job.batch_size;
  io.epochs = 1;
  io.seed = job.seed;
  {
    /* the data's schema places a Functional model's inputs by name, as
     * the workers place them */
    wk_input *in = NULL;
    int rc = wk_input_open(&job, WK_SPLIT_EVAL, &io, &in, err, sizeof err);
    if (rc == 0)
      rc = tsr_model_from_job(&job, wk_input_get_schema(in), &m, err,
                             sizeof err);
    if (in) wk_input_close(in);
    if (rc) {
      tsr_error("%s", err);
      goto out;
    }
  }
  wk_train_opts to;
  memset(&to, 0, sizeof to);
  to.device = KERN_DEVICE_AUTO;
  to.quiet = true;
  if (wk_trainer_open(m, &job.optimizer, job.seed, job.precision, &to,
                      job.batch_size, &tr, err, sizeof err) ||
      wk_metrics_open(m, &mt)) {
    tsr_error("%s", err[0] ? err : "out of memory");
    status = 1;
    goto out;
  }
  chief_tb_opts tbo = {.flat = true}; /* its own run: logdir/eval */
  if (chief_metrics_open(&rec, logdir, &tbo, err, sizeof err)) {
    tsr_warn("TensorBoard logs disabled: %s", err);
    chief_metrics_open(&rec, NULL, NULL, err, sizeof err);
  }
  signal(SIGINT, ev_on_signal);
  signal(SIGTERM, ev_on_signal);
  tsr_info("evaluator: watching %s%s%s", root, logdir ? "; events in " : "",
           logdir ? logdir : "");
  int64_t last = -1;
  double t_new = tsr_now_s();
  status = 0;
  while (!ev_stop) {
    int64_t step;
    json_t *man = NULL;
    char folder[4096];
    int rc = chief_ckpt_read(root, &step, &man, folder, sizeof folder, err,
                             sizeof err);
    /* the chief writes the job's length into every manifest once it is
     * known (epochs need the workers' data sizes): the checkpoint of that
     * step is the job's last */
    int64_t total = job.steps;
    json_t *ts = rc == 0 ? json_object_get(man, "total_steps") : NULL;
    if (json_is_integer(ts) && json_integer_value(ts) > 0)
      total = json_integer_value(ts);
    json_decref(man);
    if (rc == 0 && step > last) {
      last = step;
      t_new = tsr_now_s();
      err[0] = 0;
      rc = chief_eval__load_ckpt(tr, m, folder, err, sizeof err);
      if (!rc) rc = ev_evaluate(&job, tr, mt, &io, err, sizeof err);
      if (rc) {
        tsr_warn("checkpoint of step %" PRId64 " not evaluated: %s", step,
                 err);
      } else {
        double loss, vals[8];
        wk_metrics_result(mt, &loss, vals);
        char line[512];
        size_t off = (size_t)snprintf(line, sizeof line,
                                      "evaluated step %" PRId64 ": loss %.6g",
                                      step, loss);
        chief_metrics_scalar(rec, "eval/loss", step, loss, 0);
        for (int k = 0; k < tsr_model_num_metrics(m) && k < 8; k++) {
          char tag[96];
          snprintf(tag, sizeof tag, "eval/%s", tsr_model_metric_name(m, k));
          chief_metrics_scalar(rec, tag, step, vals[k], 0);
          if (off < sizeof line)
            off += (size_t)snprintf(line + off, sizeof line - off, ", %s %.4f",
                                    tsr_model_metric_name(m, k), vals[k]);
        }
        chief_metrics_flush(rec);
        printf("%s\n", line);
        fflush(stdout);
      }
      if (total > 0 && step >= total) {
        tsr_info("evaluator: step %" PRId64 " is the job's last; stopping",
                 step);
        break;
      }
      continue;
    }
    if (tsr_now_s() - t_new > e->idle_timeout_s) {
      tsr_info("evaluator: no new checkpoint for %.0f s; stopping",
               e->idle_timeout_s);
      break;
    }
    tsr_sleep_ms((uint64_t)(e->poll_s * 1000));
  }
out:
  if (rec) chief_metrics_close(rec);
  if (mt) wk_metrics_close(mt);
  if (tr) wk_trainer_close(tr);
  if (m) tsr_model_free(m);
  free(root);
  free(logdir);
  tsr_job_free(&job);
  return status;
}
