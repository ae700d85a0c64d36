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
 */
#include "artifacts/monitor/monitor.h"
#include "artifacts/weights/export_keras.h"
#include "artifacts/weights/npz.h"
#include "common/cluster.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/job.h"
#include "common/log.h"
#include "worker/service.h"
#include "worker/train.h"

#include "common/clock.h"

#include <errno.h>
#include <getopt.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
      "usage: tessera-worker [--cluster FILE.json] [--task TYPE:INDEX]\n"
      "       tessera-worker --standalone --job JOB.json [--device auto|cpu|gpu]\n"
      "              [--precision fp32|bf16|fp16] [--steps N] [--epochs N]\n"
      "              [--batch-size N] [--seed N] [--gpus N] [--threads N]\n"
      "              [--logdir DIR] [--summary-json PATH]\n"
      "              [--checkpoint-dir DIR] [--trace FILE]\n"
      "              [--set KEY=VALUE ...]\n"
      "  The cluster comes from TF_CONFIG unless --cluster is given.\n"
      "  --standalone trains the job in this process, without a PS.\n");
}

enum { O_STANDALONE = 1, O_JOB, O_DEVICE, O_PREC,
       O_STEPS, O_EPOCHS, O_BATCH, O_SEED, O_GPUS, O_THREADS, O_SET,
       O_LOGDIR, O_SUMMARY, O_CKPT, O_TRACE };

typedef struct {
  chief_metrics *metrics;
  const char *ckpt_dir;
  const tsr_job *job;
} sa_mon;

/* initial_weights (relative to the job file) into the trainer's values. */
static int sa_start(void *data, wk_trainer *t, const tsr_model *m, char *err,
                    size_t errlen) {
  sa_mon *mon = data;
  const char *w = mon->job->initial_weights;
  if (!w) return 0;
  char path[4096];
  const char *slash = mon->job->path ? strrchr(mon->job->path, '/') : NULL;
  if (w[0] != '/' && slash)
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
  if (!rc) tsr_info("initial weights from %s", path);
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
  /* model.get_weights()'s order (a Functional model's layers by depth) */
  const char **names = calloc(nv + 1, sizeof *names);
  size_t *order = calloc(nv + 1, sizeof *order);
  chief_npz *z = NULL;
  int rc = names && order ? 0 : TSR_ENOMEM;
  for (size_t v = 0; !rc && v < nv; v++) names[v] = vi[v].name;
  if (!rc && chief_keras_weight_order(mon->job->model, names, nv, order, err,
                                      sizeof err))
    for (size_t v = 0; v < nv; v++) order[v] = v;
  if (!rc) rc = chief_npz_open(&z, path, err, sizeof err);
  for (size_t k = 0; !rc && k < nv; k++) {
    size_t v = order[k];
    rc = chief_npz_add_f32(z, vi[v].name, vi[v].shape, vi[v].rank,
                           wk_trainer_var(t, (int)v), err, sizeof err);
  }
  free(names);
  free(order);
  if (rc == TSR_ENOMEM && !z) snprintf(err, sizeof err, "out of memory");
  if (rc) {
    if (z) chief_npz_abort(z);
  } else {
    rc = chief_npz_close(z, err, sizeof err);
  }
  if (rc)
    tsr_error("checkpoint %s: %s", path, err);
  else
    tsr_info("step %lld: weights written to %s", (long long)step, path);
  return rc;
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
  sa_mon mon = {NULL, job.checkpoint_dir, &job};
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
  /* a model or job the trainer refuses is a usage error, 2, as the chief
   * says for the same job */
  bool refused = rc == TSR_EUNSUPPORTED || rc == TSR_ECONFIG ||
                 rc == TSR_ESHAPE;
  int status = rc ? (rc == TSR_ENODEVICE ? 4 : rc == TSR_EDATA ? TSR_EXIT_DATA
                     : refused ? 2 : 1)
                  : 0;
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
    chief_metric_value ev[9];
    size_t ne = 0;
    if (!rc && r.has_eval) {
      ev[ne++] = (chief_metric_value){"loss", r.eval_loss};
      for (int k = 0; k < r.n_metrics && k < 8; k++)
        ev[ne++] = (chief_metric_value){r.metric_names[k], r.metrics[k]};
    }
    chief_summary s;
    memset(&s, 0, sizeof s);
    s.steps = rc ? 0 : r.steps;
    s.examples = rc ? 0 : r.examples;
    s.seconds = tsr_now_s() - t0;
    s.has_loss = !rc;
    s.final_loss = r.train_loss;
    s.eval = ne ? ev : NULL;
    s.n_eval = ne;
    s.resumed_from_step = -1;
    s.skipped_records = rc ? 0 : r.skipped_records;
    s.logdir = job.logdir;
    s.checkpoint_dir = job.checkpoint_dir;
    if (chief_summary_write_json(summary_json, &s, err, sizeof err)) {
      tsr_error("--summary-json: %s", err);
      if (!status) status = 1;
    }
  }
  tsr_job_free(&job);
  return status;
}

int main(int argc, char **argv) {
  if (wk_service_selected(argc, argv)) return wk_service_main(argc, argv);
  const char *job_path = NULL;
  wk_train_opts to = {.device = KERN_DEVICE_AUTO};
  char *ovr[64];
  int novr = 0;
  static const struct option opts[] = {
      {"standalone", no_argument, 0, O_STANDALONE},
      {"job", required_argument, 0, O_JOB},
      {"device", required_argument, 0, O_DEVICE},
      {"precision", required_argument, 0, O_PREC},
      {"steps", required_argument, 0, O_STEPS},
      {"epochs", required_argument, 0, O_EPOCHS},
      {"batch-size", required_argument, 0, O_BATCH},
      {"seed", required_argument, 0, O_SEED},
      {"gpus", required_argument, 0, O_GPUS},
      {"threads", required_argument, 0, O_THREADS},
      {"set", required_argument, 0, O_SET},
      {"logdir", required_argument, 0, O_LOGDIR},
      {"summary-json", required_argument, 0, O_SUMMARY},
      {"checkpoint-dir", required_argument, 0, O_CKPT},
      {"trace", required_argument, 0, O_TRACE},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  static const char *const keys[] = {
      [O_PREC] = "precision", [O_STEPS] = "steps", [O_EPOCHS] = "epochs",
      [O_BATCH] = "batch_size", [O_SEED] = "seed", [O_LOGDIR] = "logdir",
      [O_CKPT] = "checkpoint.dir"};
  const char *summary_json = NULL, *trace_path = NULL;
  int ch;
  tsr_log_init("worker");
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case O_STANDALONE: break; /* how main() got here */
      case O_JOB: job_path = optarg; break;
      case O_DEVICE:
        if (!strcmp(optarg, "auto")) to.device = KERN_DEVICE_AUTO;
        else if (!strcmp(optarg, "cpu")) to.device = KERN_DEVICE_CPU;
        else if (!strcmp(optarg, "gpu")) to.device = KERN_DEVICE_GPU;
        else {
          tsr_error("--device %s: must be auto, cpu or gpu", optarg);
          return 2;
        }
        break;
      case O_GPUS: to.max_gpus = atoi(optarg); break;
      case O_THREADS: to.cpu_threads = atoi(optarg); break;
      case O_SUMMARY: summary_json = optarg; break;
      case O_TRACE: trace_path = optarg; break;
      case O_PREC: case O_STEPS: case O_EPOCHS: case O_BATCH: case O_SEED:
      case O_LOGDIR: case O_CKPT: case O_SET: {
        if (novr == 63) {
          tsr_error("too many overrides");
          return 2;
        }
        char buf[512];
        if (ch == O_SET) snprintf(buf, sizeof buf, "%s", optarg);
        else if (ch == O_LOGDIR || ch == O_CKPT)
          snprintf(buf, sizeof buf, "%s=\"%s\"", keys[ch], optarg);
        else snprintf(buf, sizeof buf, "%s=%s", keys[ch], optarg);
        ovr[novr++] = strdup(buf);
        break;
      }
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  ovr[novr] = NULL;
  /* every command line without --standalone went to the service above */
  int ret;
  if (!job_path) {
    tsr_error("--standalone needs --job JOB.json");
    ret = 2;
  } else {
    ret = run_standalone(job_path, ovr, &to, summary_json, trace_path);
  }
  for (int i = 0; i < novr; i++) free(ovr[i]);
  return ret;
}
