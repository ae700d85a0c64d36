/* tessera-worker: with --standalone, trains a whole job in this process
 * (worker/train.h); otherwise resolves its place in the cluster (TF_CONFIG
 * or --cluster/--task) and runs the worker service.
 * Flags that change the job (--steps, --precision, ...) become job
 * overrides, so they are validated with the job file's own rules. The
 * standalone trainer has the chief's monitoring flags: --logdir (the job's
 * logdir: TensorBoard runs, metrics.jsonl, report.html, written with the
 * artifacts library, as the chief writes them), --summary-json, --checkpoint-dir (the weights
 * as weights.npz, Keras names and order, every checkpoint.every_steps and
 * at the end) and --trace (every step's input wait and step as Chrome
 * trace events).
 * --standalone --evaluate evaluates weights without training (train.h's
 * wk_eval_standalone): --weights F (.npz, .keras, .weights.h5, .h5) or
 * --checkpoint DIR (the weights.npz the standalone trainer's
 * --checkpoint-dir writes; a cluster's checkpoint is `tessera evaluate`'s).
 */
#include "artifacts/monitor/monitor.h"
#include "artifacts/weights/export_keras.h"
#include "common/arg.h"
#include "common/cluster.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/job.h"
#include "common/log.h"
#include "worker/service.h"
#include "worker/train.h"

#include "common/clock.h"

#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f,
      "usage: tessera-worker [--cluster FILE.json] [--task TYPE:INDEX]\n"
      "       tessera-worker --standalone --job JOB.json [--device auto|cpu|gpu]\n"
      "              [--precision fp32|bf16|fp16] [--steps N] [--epochs N]\n"
      "              [--batch-size N] [--seed N] [--gpus N] [--threads N]\n"
      "              [--logdir DIR] [--summary-json PATH]\n"
      "              [--checkpoint-dir DIR] [--trace FILE]\n"
      "              [--set KEY=VALUE ...]\n"
      "       tessera-worker --standalone --evaluate --job JOB.json\n"
      "              (--weights F.npz|F.keras|F.weights.h5|F.h5 | --checkpoint DIR)\n"
      "              [--data eval|train] [--summary-json PATH] [--device ...]\n"
      "              [--threads N] [--set KEY=VALUE ...]\n"
      "  The cluster comes from TF_CONFIG unless --cluster is given.\n"
      "  --standalone trains the job in this process, without a PS.\n"
      "  --evaluate gives the job's metrics for the weights on its eval data\n"
      "  (or --data train) without training; DIR holds the weights.npz that\n"
      "  --checkpoint-dir writes.\n");
}

/* The flags that change the job, as job overrides in the command line's
 * order (room is left for --evaluate's own), and the last of them that
 * only training takes. */
typedef struct {
  char *ovr[64];
  int novr;
  const char *train_flag;
} sa_overrides;

static int add_override(void *data, const char *flag, const char *value,
                        char *err, size_t errlen) {
  /* each flag's key, and how its value is written ("%s=%s") */
  static const struct {
    const char *flag, *fmt, *key;
    bool training;
  } keys[] = {{"--precision", "%s=%s", "precision", false},
              {"--steps", "%s=%s", "steps", false},
              {"--epochs", "%s=%s", "epochs", false},
              {"--batch-size", "%s=%s", "batch_size", false},
              {"--seed", "%s=%s", "seed", false},
              {"--logdir", "%s=\"%s\"", "logdir", true},
              {"--checkpoint-dir", "%s=\"%s\"", "checkpoint.dir", true},
              {"--set", "%s%s", "", false}};
  sa_overrides *o = data;
  if (o->novr == 62) {
    snprintf(err, errlen, "too many overrides");
    return TSR_EINVAL;
  }
  size_t k = 0;
  while (k + 1 < sizeof keys / sizeof keys[0] && strcmp(keys[k].flag, flag))
    k++;
  char buf[512];
  snprintf(buf, sizeof buf, keys[k].fmt, keys[k].key, value);
  if (keys[k].training) o->train_flag = keys[k].flag;
  o->ovr[o->novr++] = strdup(buf);
  o->ovr[o->novr] = NULL;
  return 0;
}

typedef struct {
  chief_metrics *metrics;
  const char *ckpt_dir;
  const tsr_job *job;
  const char *weights;    /* --evaluate: the weights (relative to here) */
} sa_mon;

/* The weights to evaluate, else initial_weights (relative to the job
 * file), into the trainer's values. */
static int sa_start(void *data, wk_trainer *t, const tsr_model *m, char *err,
                    size_t errlen) {
  sa_mon *mon = data;
  const char *w = mon->weights ? mon->weights : mon->job->initial_weights;
  if (!w) return 0;
  char path[4096];
  const char *slash = mon->job->path ? strrchr(mon->job->path, '/') : NULL;
  if (w[0] != '/' && slash && !mon->weights)
    snprintf(path, sizeof path, "%.*s/%s", (int)(slash - mon->job->path),
             mon->job->path, w);
  else
    snprintf(path, sizeof path, "%s", w);
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  chief_import_var *iv = calloc(nv ? nv : 1, sizeof *iv);
  if (!iv) return TSR_ENOMEM;
  for (size_t v = 0; v < nv; v++)
    iv[v] = (chief_import_var){vi[v].name, vi[v].rank, vi[v].shape,
                               wk_trainer_var(t, (int)v)};
  int rc = chief_weights_load(path, mon->job->model, iv, nv, err, errlen);
  free(iv);
  if (!rc)
    tsr_info("%s from %s", mon->weights ? "weights" : "initial weights",
             path);
  /* weights that are not there or do not fit the model: the command
   * line's (or the job's) fault */
  if (rc && rc != TSR_ENOMEM) rc = TSR_ECONFIG;
  return rc;
}

static void sa_scalar(void *data, const char *tag, int64_t step,
                      double value) {
  sa_mon *mon = data;
  if (mon->metrics) chief_metrics_scalar(mon->metrics, tag, step, value, 0);
}

/* The weights as `tessera ckpt export --npz` writes them, replaced
 * atomically (write to a temp file, rename). */
static int sa_checkpoint(void *data, wk_trainer *t, const tsr_model *m,
                         int64_t step) {
  sa_mon *mon = data;
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/weights.npz", mon->ckpt_dir);
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  /* model.get_weights()'s order and shapes (a Functional model's layers
   * by depth) */
  chief_export_var *ev = calloc(nv + 1, sizeof *ev);
  int rc = ev ? 0 : TSR_ENOMEM;
  if (rc) snprintf(err, sizeof err, "out of memory");
  for (size_t v = 0; !rc && v < nv; v++)
    ev[v] = (chief_export_var){vi[v].name, vi[v].rank, vi[v].shape,
                               wk_trainer_var(t, (int)v)};
  if (!rc) rc = chief_export_npz(path, mon->job->model, ev, nv, err, sizeof err);
  free(ev);
  if (rc)
    tsr_error("checkpoint %s: %s", path, err);
  else
    tsr_info("step %lld: weights written to %s", (long long)step, path);
  return rc;
}

/* Writes the --summary-json of a run begun at t0: s as the caller filled
 * it, with the seconds and the eval figures (the loss, then each metric;
 * none when the run failed). Returns the exit status: `status`, or 1 when
 * the summary cannot be written and the run had succeeded. */
static int write_summary(const char *path, chief_summary *s,
                         const wk_train_result *r, bool ok, double t0,
                         int status) {
  chief_metric_value ev[9];
  size_t ne = 0;
  if (ok && r->has_eval) {
    ev[ne++] = (chief_metric_value){"loss", r->eval_loss};
    for (int k = 0; k < r->n_metrics && k < 8; k++)
      ev[ne++] = (chief_metric_value){r->metric_names[k], r->metrics[k]};
  }
  s->seconds = tsr_now_s() - t0;
  s->eval = ne ? ev : NULL;
  s->n_eval = ne;
  s->resumed_from_step = -1;
  char err[1024];
  if (chief_summary_write_json(path, s, err, sizeof err)) {
    tsr_error("--summary-json: %s", err);
    if (!status) status = 1;
  }
  return status;
}

static int run_standalone(const char *job_path, char **ovr,
                          wk_train_opts *o, const char *summary_json,
                          const char *trace_path) {
  tsr_job job;
  char err[1024];
  int rc = tsr_job_load(job_path, (const char *const *)ovr, &job, err,
                        sizeof err);
  if (rc) {
    tsr_error("%s", err);
    return 2;
  }
  sa_mon mon = {NULL, job.checkpoint_dir, &job, NULL};
  if (job.logdir) {
    if (chief_metrics_open(&mon.metrics, job.logdir, NULL, err, sizeof err)) {
      tsr_error("--logdir: %s", err);
      tsr_job_free(&job);
      return 2;
    }
    chief_metrics_job_info(mon.metrics, &job);
  }
  if (job.checkpoint_dir) {
    if (tsr_mkdir_p(job.checkpoint_dir, 0777, err, sizeof err)) {
      tsr_error("--checkpoint-dir: %s", err);
      chief_metrics_close(mon.metrics);
      tsr_job_free(&job);
      return 2;
    }
    o->on_checkpoint = sa_checkpoint;
    o->checkpoint_every = job.checkpoint_every_steps;
  }
  tsr_trace *tr = NULL;
  if (trace_path && tsr_trace_create(&tr, 0)) {
    tsr_error("--trace: out of memory");
    chief_metrics_close(mon.metrics);
    tsr_job_free(&job);
    return 2;
  }
  o->trace = tr;
  o->on_scalar = sa_scalar;
  o->on_start = sa_start;
  o->hook_data = &mon;
  o->summary_every = job.summary_every_steps;
  wk_train_result r;
  double t0 = tsr_now_s();
  rc = wk_train_standalone(&job, o, &r, err, sizeof err);
  int status = wk_standalone_status(rc);
  if (rc) tsr_error("%s", err);
  if (tr) {
    if (tsr_trace_write(tr, trace_path, err, sizeof err))
      tsr_error("--trace: %s", err);
    else
      tsr_info("trace: %zu events in %s", tsr_trace_count(tr), trace_path);
    tsr_trace_free(tr);
  }
  if (mon.metrics) {
    char rp[4096];
    snprintf(rp, sizeof rp, "%s/%s", job.logdir, CHIEF_REPORT_HTML);
    chief_report_opts ro = {"Tessera standalone training report", job_path};
    if (chief_report_write(rp, chief_metrics_series(mon.metrics), &ro, err,
                           sizeof err))
      tsr_warn("report.html: %s", err);
    if (chief_metrics_close(mon.metrics))
      tsr_warn("TensorBoard files under %s: a write failed", job.logdir);
  }
  if (summary_json) {
    chief_summary s;
    memset(&s, 0, sizeof s);
    s.steps = rc ? 0 : r.steps;
    s.examples = rc ? 0 : r.examples;
    s.has_loss = !rc;
    s.final_loss = r.train_loss;
    s.skipped_records = rc ? 0 : r.skipped_records;
    s.logdir = job.logdir;
    s.checkpoint_dir = job.checkpoint_dir;
    status = write_summary(summary_json, &s, &r, rc == 0, t0, status);
  }
  tsr_job_free(&job);
  return status;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* --evaluate: the weights of --weights, or the weights.npz of the
 * standalone trainer's checkpoint folder; a cluster's checkpoint folder
 * (manifest.json and shard files) is `tessera evaluate`'s. */
static int eval_weights(const char *weights, const char *ckpt, char *path,
                        size_t len) {
  if (weights) {
    snprintf(path, len, "%s", weights);
    return 0;
  }
  snprintf(path, len, "%s/weights.npz", ckpt);
  if (is_file(path)) return 0;
  char probe[4096];
  struct stat st;
  if (stat(ckpt, &st) != 0) {
    tsr_error("--checkpoint %s: %s", ckpt, strerror(errno));
    return 2;
  }
  snprintf(probe, sizeof probe, "%s/%s", ckpt, "checkpoint");
  bool cluster = is_file(probe);
  snprintf(probe, sizeof probe, "%s/%s", ckpt, "manifest.json");
  cluster = cluster || is_file(probe);
  if (cluster)
    tsr_error("--checkpoint %s: a cluster's checkpoint (manifest and shard "
              "files); evaluate it with `tessera evaluate --job JOB "
              "--checkpoint %s`", ckpt, ckpt);
  else
    tsr_error("--checkpoint %s: no weights.npz in it (the folder "
              "`tessera-worker --standalone --checkpoint-dir` writes)", ckpt);
  return 2;
}

static int run_evaluate(const char *job_path, char **ovr, wk_train_opts *o,
                        const char *weights, const char *ckpt,
                        wk_split split, const char *summary_json) {
  char path[4096], err[1024];
  int status = eval_weights(weights, ckpt, path, sizeof path);
  if (status) return status;
  tsr_job job;
  int rc = tsr_job_load(job_path, (const char *const *)ovr, &job, err,
                        sizeof err);
  if (rc) {
    tsr_error("%s", err);
    return 2;
  }
  sa_mon mon = {NULL, NULL, &job, path};
  o->on_start = sa_start;
  o->hook_data = &mon;
  wk_eval_opts eo = {.split = split};
  wk_train_result r;
  double t0 = tsr_now_s();
  rc = wk_eval_standalone(&job, o, &eo, &r, err, sizeof err);
  status = wk_standalone_status(rc);
  if (rc) tsr_error("%s", err);
  if (summary_json) {
    chief_summary s;
    memset(&s, 0, sizeof s);
    s.examples = rc ? 0 : r.eval_examples;
    status = write_summary(summary_json, &s, &r, rc == 0, t0, status);
  }
  tsr_job_free(&job);
  return status;
}

int main(int argc, char **argv) {
  if (wk_service_selected(argc, argv)) return wk_service_main(argc, argv);
  const char *job_path = NULL;
  wk_train_opts to = {.device = KERN_DEVICE_AUTO};
  sa_overrides ov = {.novr = 0};
  const char *summary_json = NULL, *trace_path = NULL;
  const char *weights = NULL, *ckpt = NULL, *data = NULL;
  bool evaluate = false, standalone = false;
  const tsr_arg opts[] = {
      TSR_ARG_FLAG("standalone", &standalone), /* how main() got here */
      TSR_ARG_STR("job", &job_path),
      TSR_ARG_CHOICE("device", &to.device, kern_device_names),
      TSR_ARG_CALL("precision", add_override, &ov),
      TSR_ARG_CALL("steps", add_override, &ov),
      TSR_ARG_CALL("epochs", add_override, &ov),
      TSR_ARG_CALL("batch-size", add_override, &ov),
      TSR_ARG_CALL("seed", add_override, &ov),
      TSR_ARG_INT("gpus", &to.max_gpus, 0, 1024),
      TSR_ARG_INT("threads", &to.cpu_threads, 1, KERN_MAX_THREADS),
      TSR_ARG_CALL("set", add_override, &ov),
      TSR_ARG_CALL("logdir", add_override, &ov),
      TSR_ARG_STR("summary-json", &summary_json),
      TSR_ARG_CALL("checkpoint-dir", add_override, &ov),
      TSR_ARG_STR("trace", &trace_path),
      TSR_ARG_FLAG("evaluate", &evaluate),
      TSR_ARG_STR("weights", &weights),
      TSR_ARG_STR("checkpoint", &ckpt),
      TSR_ARG_STR("data", &data),
      TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera-worker", .log = true,
                                  .usage = usage};
  tsr_log_init("worker");
  int ret = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  char **ovr = ov.ovr;
  int novr = ov.novr;
  ovr[novr] = NULL;
  const char *train_flag = trace_path ? "--trace" : ov.train_flag;
  if (ret) {
    ret = tsr_arg_status(ret);
    goto out;
  }
  /* every command line without --standalone went to the service above */
  ret = 2;
  const char *eval_flag = weights ? "--weights" : ckpt ? "--checkpoint"
                          : data ? "--data" : NULL;
  if (!job_path) {
    tsr_error("--standalone needs --job JOB.json");
  } else if (!evaluate && eval_flag) {
    tsr_error("%s: only with --evaluate (training starts from weights with "
              "--set initial_weights=FILE)", eval_flag);
  } else if (evaluate && !weights == !ckpt) {
    tsr_error("--evaluate needs the weights to evaluate: --weights "
              "F.npz|F.keras|F.weights.h5|F.h5 or --checkpoint DIR (one of "
              "them)");
  } else if (evaluate && train_flag) {
    tsr_error("%s: not with --evaluate (evaluation alone writes nothing but "
              "--summary-json)", train_flag);
  } else if (evaluate && data && strcmp(data, "eval") &&
             strcmp(data, "train")) {
    tsr_error("--data %s: must be eval (the job's data.eval) or train "
              "(data.train)", data);
  } else if (evaluate) {
    /* the job's epochs do not matter here; one that says 0 (refused for
     * training, with a pointer here) is evaluated as it is */
    if ((ovr[novr] = strdup("epochs=1"))) ovr[++novr] = NULL;
    ret = run_evaluate(job_path, ovr, &to, weights, ckpt,
                       data && !strcmp(data, "train") ? WK_SPLIT_TRAIN
                                                      : WK_SPLIT_EVAL,
                       summary_json);
  } else {
    ret = run_standalone(job_path, ovr, &to, summary_json, trace_path);
  }
out:
  for (int i = 0; i < novr; i++) free(ovr[i]);
  return ret;
}
