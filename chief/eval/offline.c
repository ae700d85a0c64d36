/* Evaluation alone from the front door; see offline.h. The job is loaded
 * as the chief loads it (its length is not read: a job that says
 * "epochs": 0, refused for training with a pointer here, evaluates), the
 * weights are found (a checkpoint folder's committed checkpoint or
 * weights.npz, or a weights file), and the standalone trainer's
 * evaluation runs with them, writing predictions as it goes. */
#include "chief/eval/offline.h"
#include "chief/eval/eval_int.h"
#include "chief/ckpt/ckpt.h"
#include "artifacts/monitor/monitor.h"
#include "artifacts/weights/npz.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
  const chief_offline_opts *o;
  const tsr_job *job;
  const char *file;      /* a weights file, or NULL: */
  char folder[4096];     /* a cluster checkpoint's ckpt-<step> folder */
  chief_npy *npy;        /* predict */
  int64_t row[8];        /* the output's shape after the batch axis */
  int rank;
} off_run;

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Where the weights are: a file, or a committed checkpoint's folder. */
static int off_find(off_run *r, char *wpath, size_t wlen, char *err,
                    size_t errlen) {
  const chief_offline_opts *o = r->o;
  if (o->weights) {
    if (!is_file(o->weights))
      return tsr_errf(err, errlen, TSR_ECONFIG, "--weights %s: %s",
                      o->weights, errno ? strerror(errno) : "not a file");
    r->file = o->weights;
    return 0;
  }
  struct stat st;
  if (stat(o->checkpoint, &st) != 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "--checkpoint %s: %s",
                    o->checkpoint, strerror(errno));
  snprintf(wpath, wlen, "%s/weights.npz", o->checkpoint);
  if (is_file(wpath)) { /* the standalone trainer's --checkpoint-dir */
    r->file = wpath;
    return 0;
  }
  int64_t step;
  json_t *man = NULL;
  char cerr[768];
  int rc = chief_ckpt_read(o->checkpoint, &step, &man, r->folder,
                           sizeof r->folder, cerr, sizeof cerr);
  json_decref(man);
  if (rc)
    return tsr_errf(err, errlen, TSR_ECONFIG, "--checkpoint %s: neither a "
                    "committed checkpoint (%s) nor the standalone trainer's "
                    "weights.npz: %s", o->checkpoint, CHIEF_CKPT_MANIFEST,
                    cerr);
  tsr_info("checkpoint of step %" PRId64 ": %s", step, r->folder);
  return 0;
}

static int off_start(void *data, wk_trainer *t, const tsr_model *m,
                     char *err, size_t errlen) {
  off_run *r = data;
  int rc = r->file ? chief_eval__load_file(t, m, r->file, r->job->model, err,
                                           errlen)
                   : chief_eval__load_ckpt(t, m, r->folder, err, errlen);
  /* weights that are not there or do not fit the model: the command
   * line's fault */
  if (rc) return rc == TSR_ENOMEM ? rc : TSR_ECONFIG;
  if (r->file) tsr_info("weights from %s", r->file);
  if (r->o->predict_out) {
    r->rank = tsr_model_output_shape(m, r->row, 8);
    char why[512];
    if ((rc = chief_npy_open(&r->npy, r->o->predict_out, r->row, r->rank,
                             why, sizeof why)))
      return tsr_errf(err, errlen, rc == TSR_ENOMEM ? rc : TSR_ECONFIG,
                      "--out %s: %s", r->o->predict_out, why);
  }
  return 0;
}

static int off_output(void *data, const float *pred, int64_t n, int64_t dim,
                      char *err, size_t errlen) {
  off_run *r = data;
  (void)dim; /* the npy's row, from the model's output shape */
  return chief_npy_append(r->npy, pred, n, err, errlen);
}

static int off_summary(const chief_offline_opts *o, const wk_train_result *res,
                       bool ok, double seconds) {
  chief_metric_value ev[9];
  size_t ne = 0;
  if (ok) {
    ev[ne++] = (chief_metric_value){"loss", res->eval_loss};
    for (int k = 0; k < res->n_metrics && k < 8; k++)
      ev[ne++] = (chief_metric_value){res->metric_names[k], res->metrics[k]};
  }
  chief_summary s;
  memset(&s, 0, sizeof s);
  s.examples = ok ? res->eval_examples : 0;
  s.seconds = seconds;
  s.eval = ne ? ev : NULL;
  s.n_eval = ne;
  s.resumed_from_step = -1;
  char err[512];
  if (chief_summary_write_json(o->summary_json, &s, err, sizeof err)) {
    tsr_error("--summary-json: %s", err);
    return 1;
  }
  return 0;
}

int chief_offline_run(const chief_offline_opts *o) {
  char err[1024], wpath[4096];
  double t0 = tsr_now_s();
  /* the job's length is not read: one that says epochs 0 evaluates */
  size_t no = 0;
  while (o->overrides && o->overrides[no]) no++;
  const char **ov = calloc(no + 2, sizeof *ov);
  if (!ov) {
    tsr_error("out of memory");
    return 1;
  }
  for (size_t i = 0; i < no; i++) ov[i] = o->overrides[i];
  ov[no] = "epochs=1";
  tsr_job job;
  int rc = tsr_job_load(o->job_path, ov, &job, err, sizeof err);
  free(ov);
  if (rc) {
    tsr_error("%s", err);
    return 2;
  }
  off_run r = {.o = o, .job = &job};
  wk_train_result res;
  memset(&res, 0, sizeof res);
  if ((rc = off_find(&r, wpath, sizeof wpath, err, sizeof err)) == 0) {
    wk_train_opts to = {.device = o->device, .cpu_threads = o->threads,
                        .on_start = off_start, .hook_data = &r};
    wk_eval_opts eo = {.split = o->train_split ? WK_SPLIT_TRAIN
                                               : WK_SPLIT_EVAL,
                       .on_output = o->predict_out ? off_output : NULL,
                       .output_data = &r};
    rc = wk_eval_standalone(&job, &to, &eo, &res, err, sizeof err);
  }
  if (!rc && r.npy) {
    rc = chief_npy_close(r.npy, err, sizeof err);
    r.npy = NULL;
    if (!rc) {
      char shape[256];
      size_t k = (size_t)snprintf(shape, sizeof shape, "%" PRId64,
                                  res.eval_examples);
      for (int d = 0; d < r.rank && k < sizeof shape; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, " x %" PRId64,
                              r.row[d]);
      printf("predictions: %s float32 in %s\n", shape, o->predict_out);
      fflush(stdout);
    }
  }
  chief_npy_abort(r.npy);
  int status = wk_standalone_status(rc);
  if (rc) tsr_error("%s", err);
  if (o->summary_json && off_summary(o, &res, rc == 0, tsr_now_s() - t0) &&
      !status)
    status = 1;
  tsr_job_free(&job);
  return status;
}
