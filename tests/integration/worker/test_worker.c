/* tessera-worker end to end, with real tessera-ps and tessera-worker
 * processes on loopback and this program as the chief:
 *   train   2 PS, 2 workers, async: closures run, the eval loss of the
 *           Keras diabetes model goes down, status and PS steps add up;
 *   ssp     the same in ssp:1 (bounded staleness: workers tick every PS);
 *   sync    2 PS, 2 workers, sync: the parameters after N steps equal the
 *           standalone trainer's on the global batch (1e-5 relative);
 *   sparse  the same with a wide-and-deep model whose embedding tables are
 *           row-sparse and split over both PS;
 *   errors  1 PS, 1 worker: another format_version is refused
 *           (TSR_EVERSION), a missing data file answers TSR_EDATA (the
 *           chief stops the run on it) naming the path, a PS killed mid-closure fails the closure naming the PS
 *           and the worker keeps serving (configured again once the PS is
 *           back), shutdown by the method exits 0;
 *   synckill 2 PS, 2 workers, sync: a PS killed while the other holds
 *           calls fails both closures at once, naming it.
 *   syncback 2 PS, 2 workers, sync: a PS that came back without its
 *           shards fails a closure at once, naming it, even while the
 *           other PS holds the closure's first pull (for a step the other
 *           worker has not pushed): the held call is given up, not waited
 *           out to its deadline.
 * Every wait has a deadline; every worker must exit 0 on SIGTERM, every PS
 * 0 or 1 (1: it held a job that was not done).
 */
#include "harness.h"

#include "common/err.h"
#include "worker/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char job_path[1024];

/* closure 1 answers with its step phases */
static int run_closure(h_cluster *c, int w, uint64_t id, int64_t steps,
                       h_result *res) {
  return h_run_start(c, w, id, steps, id == 1, res);
}

static int eval_loss(h_cluster *c, int w, double *loss, int64_t *n) {
  Tessera__Worker__EvalRequest q = TESSERA__WORKER__EVAL_REQUEST__INIT;
  q.eval_id = 1;
  h_result r;
  int rc = h_call(c, w, WK_M_EVAL, &q.base, &r, 30000);
  if (rc) {
    fprintf(stderr, "eval: %s: %s\n", tsr_err_name(rc), r.msg);
    return rc;
  }
  Tessera__Worker__EvalResponse *e =
      tessera__worker__eval_response__unpack(NULL, r.meta_len, r.meta);
  h_result_free(&r);
  if (!e) return TSR_EPROTO;
  *loss = e->loss;
  *n = e->examples;
  tessera__worker__eval_response__free_unpacked(e, NULL);
  return 0;
}

static Tessera__Worker__StatusResponse *status_of(h_cluster *c, int w) {
  Tessera__Worker__StatusRequest q = TESSERA__WORKER__STATUS_REQUEST__INIT;
  h_result r;
  if (h_call(c, w, WK_M_STATUS, &q.base, &r, 10000)) return NULL;
  Tessera__Worker__StatusResponse *s =
      tessera__worker__status_response__unpack(NULL, r.meta_len, r.meta);
  h_result_free(&r);
  return s;
}

/* The standalone trainer on the global batch (nw x batch_size), the job's
 * seed and data order, `steps` steps: the reference of sync and hybrid
 * runs. The caller closes *in and *t. */
static int reference(h_cluster *c, int nw, int steps, wk_input **in,
                     wk_trainer **t) {
  char err[1024];
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = nw * c->job.batch_size,
                      .epochs = -1, .seed = c->job.seed};
  wk_train_opts to = {.device = KERN_DEVICE_CPU, .quiet = true};
  H_CHECK(wk_input_open(&c->job, WK_SPLIT_TRAIN, &io, in, err, sizeof err) ==
              0,
          "%s", err);
  H_CHECK(wk_trainer_open(c->model, &c->job.optimizer, c->job.seed,
                          c->job.precision, &to, nw * c->job.batch_size, t,
                          err, sizeof err) == 0,
          "%s", err);
  for (int s = 0; s < steps; s++) {
    const wk_batch *b;
    double loss;
    bool applied;
    H_CHECK(wk_input_next(*in, &b) == 0, "reference input");
    H_CHECK(wk_trainer_step(*t, b, &loss, &applied, err, sizeof err) == 0,
            "%s", err);
  }
  return 0;
}

/* ---- train ----------------------------------------------------------------- */

static int test_train(const char *mode) {
  h_cluster c;
  int rc = h_start(&c, 2, 2, mode);
  H_CHECK(rc == 0, "start: %s", tsr_strerror(rc));
  char mode_ovr[64];
  snprintf(mode_ovr, sizeof mode_ovr, "mode=\"%s\"", mode);
  const char *ovr[] = {"optimizer.learning_rate=0.01", mode_ovr, NULL};
  H_CHECK(h_load_job(&c, job_path, ovr, 2) == 0, "job");
  H_CHECK(h_create_vars(&c, mode) == 0, "create");
  for (int w = 0; w < 2; w++) {
    h_result r;
    rc = h_configure(&c, w, 7, WK_FORMAT_VERSION, c.job_text, &r);
    H_CHECK(rc == 0, "configure worker %d: %s", w, r.msg);
    Tessera__Worker__ConfigureResponse *cr =
        tessera__worker__configure_response__unpack(NULL, r.meta_len, r.meta);
    h_result_free(&r);
    H_CHECK(cr && strcmp(cr->device, "cpu") == 0, "device %s",
            cr ? cr->device : "?");
    H_CHECK(cr->examples == 177, "examples per epoch %lld, want 177",
            (long long)cr->examples);
    H_CHECK(strstr(cr->model_summary, "Dense") != NULL ||
                strstr(cr->model_summary, "dense") != NULL,
            "summary %s", cr->model_summary);
    tessera__worker__configure_response__free_unpacked(cr, NULL);
  }
  double loss0, loss1;
  int64_t n0, n1;
  H_CHECK(eval_loss(&c, 0, &loss0, &n0) == 0, "eval before");
  H_CHECK(n0 == 88, "eval examples %lld, want 88", (long long)n0);

  const int closures = 10, steps = 20;
  double first_loss = 0, last_loss = 0;
  double t_in = 0, t_pull = 0, t_comp = 0, t_push = 0, t_wall = 0;
  for (int k = 0; k < closures; k++) {
    h_result r[2];
    for (int w = 0; w < 2; w++)
      H_CHECK(run_closure(&c, w, (uint64_t)(k * 2 + w), steps, &r[w]) == 0,
              "run start");
    for (int w = 0; w < 2; w++) {
      rc = h_wait(&c, &r[w], 60000);
      H_CHECK(rc == 0, "closure %d on worker %d: %s", k, w, r[w].msg);
      Tessera__Worker__RunResponse *o =
          tessera__worker__run_response__unpack(NULL, r[w].meta_len,
                                                 r[w].meta);
      h_result_free(&r[w]);
      H_CHECK(o, "run answer does not decode");
      H_CHECK(o->closure_id == (uint64_t)(k * 2 + w), "closure id");
      if (o->closure_id == 1)
        H_CHECK(r[w].trace_events >= 3 * (size_t)steps,
                "traced closure: %zu events in %zu payload bytes",
                r[w].trace_events, r[w].payload_len);
      else
        H_CHECK(r[w].payload_len == 0, "untraced closure with a payload");
      H_CHECK(o->steps_done == steps, "steps_done %lld",
              (long long)o->steps_done);
      H_CHECK(o->examples >= steps && o->examples <= steps * 32,
              "examples %lld", (long long)o->examples);
      H_CHECK(isfinite(o->loss_sum) && o->loss_sum > 0, "loss_sum %g",
              o->loss_sum);
      H_CHECK(o->pull_s >= 0 && o->push_s > 0 && o->compute_s > 0 &&
                  o->input_wait_s >= 0 && o->wall_s > 0,
              "phase times %g %g %g %g", o->pull_s, o->push_s, o->compute_s,
              o->input_wait_s);
      t_in += o->input_wait_s;
      t_pull += o->pull_s;
      t_comp += o->compute_s;
      t_push += o->push_s;
      t_wall += o->wall_s;
      if (k == 0 && w == 0) first_loss = o->loss_sum / steps;
      if (k == closures - 1 && w == 0) last_loss = o->loss_sum / steps;
      tessera__worker__run_response__free_unpacked(o, NULL);
    }
  }
  H_CHECK(eval_loss(&c, 1, &loss1, &n1) == 0, "eval after");
  fprintf(stderr, "train (%s): eval loss %.1f -> %.1f, closure loss %.1f -> "
          "%.1f\n", mode, loss0, loss1, first_loss, last_loss);
  fprintf(stderr, "train (%s): share of closure time: input %.0f%%, pull "
          "%.0f%%, compute %.0f%%, push+pull %.0f%%\n", mode,
          100 * t_in / t_wall, 100 * t_pull / t_wall, 100 * t_comp / t_wall,
          100 * t_push / t_wall);
  H_CHECK(loss1 < 0.5 * loss0, "eval loss %g -> %g did not halve", loss0,
          loss1);
  H_CHECK(last_loss < 0.5 * first_loss, "training loss %g -> %g", first_loss,
          last_loss);

  /* Every push was applied once: each shard counts 2 * closures * steps. */
  for (size_t v = 0; v < c.n_vars; v++) {
    float *val = calloc((size_t)c.vars[v].numel, sizeof(float));
    int64_t step = -1;
    H_CHECK(val && h_pull_var(&c, (int)v, val, &step) == 0, "pull");
    free(val);
    H_CHECK(step == 2 * closures * steps, "%s: %lld applies, want %d",
            c.vars[v].name, (long long)step, 2 * closures * steps);
  }
  /* The same run id again is answered at once; status adds up. */
  h_result r;
  rc = h_configure(&c, 1, 7, WK_FORMAT_VERSION, c.job_text, &r);
  H_CHECK(rc == 0, "configure again: %s", r.msg);
  h_result_free(&r);
  for (int w = 0; w < 2; w++) {
    Tessera__Worker__StatusResponse *s = status_of(&c, w);
    H_CHECK(s, "status");
    char role[16];
    snprintf(role, sizeof role, "worker:%d", w);
    H_CHECK(strcmp(s->role, role) == 0 && strcmp(s->state, "configured") == 0 &&
                s->run_id == 7 && s->steps == closures * steps &&
                s->examples_per_sec > 0 && strcmp(s->device, "cpu") == 0,
            "status %s %s run %llu steps %lld", s->role, s->state,
            (unsigned long long)s->run_id, (long long)s->steps);
    tessera__worker__status_response__free_unpacked(s, NULL);
  }
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* ---- sync ------------------------------------------------------------------ */

static int test_sync(const char *path, const char *const *ovr, int closures,
                     int steps, int nw) {
  h_cluster c;
  int rc = h_start(&c, 2, nw, "sync");
  H_CHECK(rc == 0, "start");
  H_CHECK(h_load_job(&c, path, ovr, nw) == 0, "job");
  H_CHECK(h_create_vars(&c, "sync") == 0, "create");
  for (int w = 0; w < nw; w++) {
    h_result r;
    rc = h_configure(&c, w, 11, WK_FORMAT_VERSION, c.job_text, &r);
    H_CHECK(rc == 0, "configure worker %d: %s", w, r.msg);
    h_result_free(&r);
  }
  for (int k = 0; k < closures; k++) {
    h_result r[2];
    for (int w = 0; w < nw; w++)
      H_CHECK(run_closure(&c, w, (uint64_t)(k * 2 + w), steps, &r[w]) == 0,
              "run");
    for (int w = 0; w < nw; w++) {
      rc = h_wait(&c, &r[w], 60000);
      H_CHECK(rc == 0, "sync closure %d worker %d: %s", k, w, r[w].msg);
      h_result_free(&r[w]);
    }
  }
  /* The reference: one process, the global batch, same seed and order. */
  wk_input *in = NULL;
  wk_trainer *t = NULL;
  H_CHECK(reference(&c, nw, closures * steps, &in, &t) == 0, "reference");
  double worst = 0, moved = 0;
  for (size_t v = 0; v < c.n_vars; v++) {
    size_t n = (size_t)c.vars[v].numel;
    float *val = calloc(n, sizeof(float));
    int64_t step = -1;
    H_CHECK(val && h_pull_var(&c, (int)v, val, &step) == 0, "pull");
    H_CHECK(step == closures * steps, "%s: %lld sync steps, want %d",
            c.vars[v].name, (long long)step, closures * steps);
    const float *ref = wk_trainer_var(t, (int)v);
    double maxref = 0, maxdiff = 0;
    float *init = calloc(n, sizeof(float));
    H_CHECK(init, "memory");
    tsr_model_init_var(c.model, (int)v, c.job.seed, 0, init, n);
    for (size_t i = 0; i < n; i++) {
      double d = fabs(ref[i] - init[i]);
      if (d > moved) moved = d;
    }
    free(init);
    for (size_t i = 0; i < n; i++) {
      if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
      if (fabs(val[i] - ref[i]) > maxdiff) maxdiff = fabs(val[i] - ref[i]);
    }
    free(val);
    double rel = maxdiff / (maxref > 0 ? maxref : 1);
    if (rel > worst) worst = rel;
    fprintf(stderr, "sync: %s max |diff| %.3g, relative %.3g\n",
            c.vars[v].name, maxdiff, rel);
    H_CHECK(rel <= 1e-5, "%s differs from the standalone trainer by %.3g "
            "relative", c.vars[v].name, rel);
  }
  /* Evaluation names the model's metrics (the CTR job asks for auc). */
  {
    Tessera__Worker__EvalRequest q = TESSERA__WORKER__EVAL_REQUEST__INIT;
    h_result r;
    rc = h_call(&c, nw - 1, WK_M_EVAL, &q.base, &r, 30000);
    H_CHECK(rc == 0, "eval: %s", r.msg);
    Tessera__Worker__EvalResponse *e =
        tessera__worker__eval_response__unpack(NULL, r.meta_len, r.meta);
    h_result_free(&r);
    H_CHECK(e && e->examples > 0 && isfinite(e->loss) &&
                (int)e->n_metric_names == c.job.n_metrics &&
                e->n_metric_values == e->n_metric_names,
            "eval answer");
    for (size_t i = 0; i < e->n_metric_names; i++) {
      fprintf(stderr, "sync: eval %s %.4f (loss %.4f)\n", e->metric_names[i],
              e->metric_values[i], e->loss);
      bool unit = strcmp(e->metric_names[i], "auc") == 0 ||
                  strcmp(e->metric_names[i], "accuracy") == 0;
      H_CHECK(strcmp(e->metric_names[i], c.job.metrics[i]) == 0 &&
                  isfinite(e->metric_values[i]) &&
                  (!unit || (e->metric_values[i] >= 0 &&
                             e->metric_values[i] <= 1)),
              "metric %s = %g", e->metric_names[i], e->metric_values[i]);
    }
    tessera__worker__eval_response__free_unpacked(e, NULL);
  }
  /* The comparison means something only if training moved the values. */
  H_CHECK(moved > 1e-3, "no parameter moved more than %g from its initial "
          "value", moved);
  wk_trainer_close(t);
  wk_input_close(in);
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* ---- hybrid ------------------------------------------------------------------ */

/* dense "allreduce": nw workers in a ring (sparse tables on nps PS, the
 * job's mode) run `closures` closures of `steps` steps; then every
 * worker's dense values are bitwise the same, and they (and the PS's
 * tables) equal the standalone trainer's on the global batch (nw x
 * batch_size: what sync mode's summed gradients give) to 1e-5 relative;
 * the optimizer counted every step once. */
static int test_hybrid(const char *path, const char *const *ovr, int closures,
                       int steps, int nw, int nps) {
  h_cluster c;
  int rc = h_start(&c, nps, nw, "async");
  H_CHECK(rc == 0, "start");
  H_CHECK(h_load_job(&c, path, ovr, nps) == 0, "job");
  H_CHECK(c.job.dense_allreduce, "the job is not dense \"allreduce\"");
  const char *mode = c.job.mode == TSR_MODE_SYNC ? "sync" : "async";
  if (nps) H_CHECK(h_create_vars(&c, mode) == 0, "create");
  if (h_configure_all(&c, 31, 30000)) return 1;
  h_result r[H_MAX_PROCS];
  for (int k = 0; k < closures; k++) {
    for (int w = 0; w < nw; w++)
      H_CHECK(run_closure(&c, w, (uint64_t)(k * nw + w + 2), steps,
                          &r[w]) == 0, "run");
    for (int w = 0; w < nw; w++) {
      rc = h_wait(&c, &r[w], 60000);
      H_CHECK(rc == 0, "hybrid closure %d worker %d: %s", k, w, r[w].msg);
      Tessera__Worker__RunResponse *o =
          tessera__worker__run_response__unpack(NULL, r[w].meta_len,
                                                r[w].meta);
      /* a ring of one posts nothing */
      H_CHECK(o && o->steps_done == steps &&
                  (nw == 1 ? o->allreduce_ops == 0
                           : o->allreduce_ops >= (uint64_t)steps &&
                                 o->allreduce_bytes > 0),
              "closure answer: %lld steps, %llu buckets all-reduced",
              o ? (long long)o->steps_done : -1LL,
              o ? (unsigned long long)o->allreduce_ops : 0ULL);
      tessera__worker__run_response__free_unpacked(o, NULL);
      h_result_free(&r[w]);
    }
  }
  /* the reference: one process, the global batch, same seed and order */
  wk_input *in = NULL;
  wk_trainer *t = NULL;
  H_CHECK(reference(&c, nw, closures * steps, &in, &t) == 0, "reference");
  float *dense[H_MAX_PROCS];
  size_t nd[H_MAX_PROCS];
  for (int w = 0; w < nw; w++) {
    int64_t step = -1;
    H_CHECK(h_dense(&c, w, &dense[w], &nd[w], &step) == 0, "dense state");
    H_CHECK(step == closures * steps, "worker %d applied %lld steps, want %d",
            w, (long long)step, closures * steps);
    H_CHECK(nd[w] == nd[0] &&
                memcmp(dense[w], dense[0], nd[0] * sizeof(float)) == 0,
            "worker %d's dense values differ from worker 0's", w);
  }
  double moved = 0;
  size_t off = 0;
  for (size_t v = 0; v < c.n_vars; v++) {
    size_t n = (size_t)c.vars[v].numel;
    bool sparse = c.vars[v].kind == TSR_VAR_ROW_SPARSE;
    float *val = sparse ? calloc(n, sizeof(float)) : dense[0] + off;
    if (sparse) {
      H_CHECK(val && h_pull_var(&c, (int)v, val, NULL) == 0, "pull");
    } else {
      H_CHECK(off + n <= nd[0], "dense state too short");
      off += n;
    }
    const float *ref = wk_trainer_var(t, (int)v);
    float *init = calloc(n, sizeof(float));
    H_CHECK(init, "memory");
    tsr_model_init_var(c.model, (int)v, c.job.seed, 0, init, n);
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < n; i++) {
      if (fabs(ref[i] - init[i]) > moved) moved = fabs(ref[i] - init[i]);
      if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
      if (fabs(val[i] - ref[i]) > maxdiff) maxdiff = fabs(val[i] - ref[i]);
    }
    free(init);
    if (sparse) free(val);
    double rel = maxdiff / (maxref > 0 ? maxref : 1);
    fprintf(stderr, "hybrid %d worker(s): %s (%s) max |diff| %.3g, relative "
            "%.3g\n", nw, c.vars[v].name, sparse ? "PS" : "workers", maxdiff,
            rel);
    H_CHECK(rel <= 1e-5, "%s differs from the standalone trainer by %.3g "
            "relative", c.vars[v].name, rel);
  }
  H_CHECK(off == nd[0], "dense state has %zu floats, the model %zu", nd[0],
          off);
  for (int w = 0; w < nw; w++) free(dense[w]);
  H_CHECK(moved > 1e-3, "no parameter moved more than %g from its initial "
          "value", moved);
  /* status: what went through the ring */
  Tessera__Worker__StatusResponse *st = status_of(&c, 0);
  H_CHECK(st && (nw == 1 ? st->allreduce_ops == 0
                         : st->allreduce_ops >= (uint64_t)(closures * steps) &&
                               st->allreduce_bytes > 0 &&
                               st->allreduce_s > 0),
          "status: %llu buckets, %llu bytes all-reduced",
          st ? (unsigned long long)st->allreduce_ops : 0ULL,
          st ? (unsigned long long)st->allreduce_bytes : 0ULL);
  tessera__worker__status_response__free_unpacked(st, NULL);
  /* evaluation: the dense values here, the tables' rows from the PS */
  double loss;
  int64_t ex;
  H_CHECK(eval_loss(&c, nw - 1, &loss, &ex) == 0 && isfinite(loss) && ex > 0,
          "eval");
  wk_trainer_close(t);
  wk_input_close(in);
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* dense "allreduce" refused at configure: a ring neighbour that cannot be
 * reached (the message names both workers and their addresses), dense
 * variables larger than the worker's memory (named with the bytes); the
 * worker keeps serving and configures for a job that fits. */
static int test_hybrid_errors(void) {
  h_cluster c;
  h_set_ps_deadline(1000); /* the ring's configure gives up after this */
  int rc = h_start(&c, 0, 2, "async");
  H_CHECK(rc == 0, "start");
  const char *ovr[] = {"dense=\"allreduce\"", NULL};
  H_CHECK(h_load_job(&c, job_path, ovr, 0) == 0, "job");
  H_CHECK(h_kill(c.wk_pid[1], SIGKILL, 5000) >= 0, "kill worker 1");
  c.wk_pid[1] = 0;
  h_result r;
  rc = h_configure(&c, 0, 41, WK_FORMAT_VERSION, c.job_text, &r);
  fprintf(stderr, "hybrid_errors: unreachable neighbour: %s: %s\n",
          tsr_err_name(rc), r.msg);
  H_CHECK(rc != 0 && strstr(r.msg, "worker:0") && strstr(r.msg, "worker:1") &&
              strstr(r.msg, "cannot reach") && strstr(r.msg, c.wk_addr[1]),
          "the message names the pair: %s", r.msg);
  h_result_free(&r);
  /* 1.2 x 10^12 floats, 16 bytes each with Adam's slots: far past any
   * worker's memory */
  const char *big[] = {
      "dense=\"allreduce\"",
      "model={\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
      "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": "
      "[null, 10]}}, {\"class_name\": \"Dense\", \"config\": {\"units\": "
      "100000000000}}, {\"class_name\": \"Dense\", \"config\": "
      "{\"units\": 1}}]}}",
      NULL};
  tsr_job_free(&c.job);
  tsr_job_init(&c.job);
  free(c.job_text);
  tsr_model_free(c.model);
  free(c.shards);
  c.shards = NULL;
  c.n_shards = 0;
  H_CHECK(h_load_job(&c, job_path, big, 0) == 0, "big job");
  c.n_workers = 1; /* a ring of worker 0 alone */
  rc = h_configure(&c, 0, 42, WK_FORMAT_VERSION, c.job_text, &r);
  fprintf(stderr, "hybrid_errors: too large: %s: %s\n", tsr_err_name(rc),
          r.msg);
  H_CHECK(rc == TSR_EMEMLIMIT && strstr(r.msg, "19200000000016 bytes") &&
              strstr(r.msg, "dense \"ps\""),
          "refused naming the bytes: %s", r.msg);
  h_result_free(&r);
  c.n_workers = 2;
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* ---- errors ---------------------------------------------------------------- */

static int test_errors(void) {
  h_cluster c;
  int rc = h_start(&c, 1, 1, "async");
  H_CHECK(rc == 0, "start");
  H_CHECK(h_load_job(&c, job_path, NULL, 0) == 0, "job");
  H_CHECK(h_create_vars(&c, "async") == 0, "create");
  h_result r;

  rc = h_configure(&c, 0, 3, WK_FORMAT_VERSION + 1, c.job_text, &r);
  H_CHECK(rc == TSR_EVERSION && strstr(r.msg, "format_version"),
          "wrong version: %s %s", tsr_err_name(rc), r.msg);

  Tessera__Worker__RunRequest rq = TESSERA__WORKER__RUN_REQUEST__INIT;
  rq.steps = 1;
  rc = h_call(&c, 0, WK_M_RUN, &rq.base, &r, 10000);
  H_CHECK(rc == TSR_EINVAL && strstr(r.msg, "not configured"),
          "run unconfigured: %s %s", tsr_err_name(rc), r.msg);

  json_t *bad = json_deep_copy(c.job.raw);
  json_object_set_new(json_object_get(json_object_get(bad, "data"), "train"),
                      "paths", json_string("missing_data_file.csv"));
  char *bad_text = json_dumps(bad, JSON_COMPACT);
  json_decref(bad);
  rc = h_configure(&c, 0, 4, WK_FORMAT_VERSION, bad_text, &r);
  free(bad_text);
  H_CHECK(rc == TSR_EDATA && strstr(r.msg, "missing_data_file.csv"),
          "missing file: %s %s", tsr_err_name(rc), r.msg);

  /* A layout that leaves a variable out is refused, naming it. */
  c.drop_shards = 1;
  rc = h_configure(&c, 0, 4, WK_FORMAT_VERSION, c.job_text, &r);
  c.drop_shards = 0;
  const char *last = c.vars[c.shards[c.n_shards - 1].var].name;
  H_CHECK(rc == TSR_ECONFIG && strstr(r.msg, last),
          "layout without %s: %s %s", last, tsr_err_name(rc), r.msg);

  rc = h_configure(&c, 0, 5, WK_FORMAT_VERSION, c.job_text, &r);
  H_CHECK(rc == 0, "configure after errors: %s", r.msg);
  h_result_free(&r);
  H_CHECK(run_closure(&c, 0, 1, 5, &r) == 0 && h_wait(&c, &r, 30000) == 0,
          "closure: %s", r.msg);
  h_result_free(&r);

  /* A PS killed mid-closure fails the closure, naming the PS. */
  H_CHECK(run_closure(&c, 0, 2, 100000000, &r) == 0, "long closure");
  h_spin(&c, 300);
  H_CHECK(!r.done, "the long closure ended early: %s", r.msg);
  H_CHECK(h_kill(c.ps_pid[0], SIGKILL, 5000) >= 0, "kill ps");
  c.ps_pid[0] = 0;
  rc = h_wait(&c, &r, 20000);
  fprintf(stderr, "errors: closure after PS kill: %s: %s\n",
          tsr_err_name(rc), r.msg);
  H_CHECK(rc != 0 && rc != TSR_ETIMEOUT && strstr(r.msg, "ps:0"),
          "closure after PS kill: %s %s", tsr_err_name(rc), r.msg);
  Tessera__Worker__StatusResponse *s = status_of(&c, 0);
  H_CHECK(s && strcmp(s->state, "failed") == 0 && strstr(s->last_error, "ps:0"),
          "status after PS kill: %s / %s", s ? s->state : "?",
          s ? s->last_error : "?");
  tessera__worker__status_response__free_unpacked(s, NULL);

  /* The PS returns: create, configure a new run, train again. */
  H_CHECK(h_start_ps(&c, 0, "async") == 0, "restart ps");
  H_CHECK(h_create_vars(&c, "async") == 0, "create again");
  rc = h_configure(&c, 0, 6, WK_FORMAT_VERSION, c.job_text, &r);
  H_CHECK(rc == 0, "configure after PS restart: %s", r.msg);
  h_result_free(&r);
  H_CHECK(run_closure(&c, 0, 3, 5, &r) == 0 && h_wait(&c, &r, 30000) == 0,
          "closure after PS restart: %s", r.msg);
  h_result_free(&r);

  /* Shutdown by the method: answered, then the process exits 0. */
  Tessera__Worker__ShutdownRequest sq =
      TESSERA__WORKER__SHUTDOWN_REQUEST__INIT;
  rc = h_call(&c, 0, WK_M_SHUTDOWN, &sq.base, &r, 10000);
  H_CHECK(rc == 0, "shutdown: %s", r.msg);
  h_result_free(&r);
  rc = h_kill(c.wk_pid[0], 0, 10000);
  H_CHECK(rc == 0, "worker exit status after shutdown: %d", rc);
  c.wk_pid[0] = 0;
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* ---- a PS lost in sync mode ------------------------------------------------- */

/* 2 PS and 2 workers in sync, variables created, both workers configured
 * for `run`. The workers' PS deadline is far beyond the tests' waits: a
 * held call must not end by its deadline. */
static int sync_cluster(h_cluster *c, uint64_t run) {
  h_set_ps_deadline(120000);
  H_CHECK(h_start(c, 2, 2, "sync") == 0, "start");
  const char *ovr[] = {"batch_size=16", "mode=\"sync\"", NULL};
  H_CHECK(h_load_job(c, job_path, ovr, 2) == 0, "job");
  H_CHECK(h_create_vars(c, "sync") == 0, "create");
  for (int w = 0; w < 2; w++) {
    h_result r;
    int rc = h_configure(c, w, run, WK_FORMAT_VERSION, c->job_text, &r);
    H_CHECK(rc == 0, "configure worker %d: %s", w, r.msg);
    h_result_free(&r);
  }
  return 0;
}

/* Calls held on the surviving PS (waiting for the other worker's step)
 * must not wait for a step that will never come: both closures fail,
 * naming the lost PS, not by a deadline. */
static int test_synckill(void) {
  h_cluster c;
  H_CHECK(sync_cluster(&c, 21) == 0, "sync cluster");
  int rc;
  h_result r[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(run_closure(&c, w, (uint64_t)w, 100000000, &r[w]) == 0, "run");
  h_spin(&c, 300);
  H_CHECK(!r[0].done && !r[1].done, "closures ended early: %s / %s",
          r[0].msg, r[1].msg);
  H_CHECK(h_kill(c.ps_pid[1], SIGKILL, 5000) >= 0, "kill ps:1");
  c.ps_pid[1] = 0;
  for (int w = 0; w < 2; w++) {
    rc = h_wait(&c, &r[w], 20000);
    fprintf(stderr, "synckill: worker %d: %s: %s\n", w, tsr_err_name(rc),
            r[w].msg);
    H_CHECK(rc != 0 && rc != TSR_ETIMEOUT && strstr(r[w].msg, "ps:1") &&
                !strstr(r[w].msg, "deadline"),
            "worker %d after ps:1 died: %s %s", w, tsr_err_name(rc),
            r[w].msg);
    Tessera__Worker__StatusResponse *st = status_of(&c, w);
    H_CHECK(st && strcmp(st->state, "failed") == 0, "status after the loss");
    tessera__worker__status_response__free_unpacked(st, NULL);
  }
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* ---- a PS back without its shards in sync mode ----------------------------- */

static int test_syncback(void) {
  h_cluster c;
  H_CHECK(sync_cluster(&c, 22) == 0, "sync cluster");
  int rc;
  /* Worker 0 alone: it pushes step 0, then its pulls of step 1 are held
   * on both PS until worker 1 (a member that runs nothing) pushes step 0. */
  h_result r;
  H_CHECK(run_closure(&c, 0, 1, 100000000, &r) == 0, "run");
  h_spin(&c, 300);
  H_CHECK(!r.done, "the closure ended early: %s", r.msg);
  H_CHECK(h_kill(c.ps_pid[1], SIGKILL, 5000) >= 0, "kill ps:1");
  c.ps_pid[1] = 0;
  rc = h_wait(&c, &r, 20000);
  H_CHECK(rc != 0 && rc != TSR_ETIMEOUT && strstr(r.msg, "ps:1"),
          "closure 1 after ps:1 died: %s %s", tsr_err_name(rc), r.msg);
  h_result_free(&r);
  /* ps:1 back, empty. The next closure's first pull is held on ps:0 (step
   * 0 still waits for worker 1) and refused by ps:1 (no shards). */
  H_CHECK(h_start_ps(&c, 1, "sync") == 0, "restart ps:1");
  H_CHECK(run_closure(&c, 0, 2, 100000000, &r) == 0, "run");
  rc = h_wait(&c, &r, 20000);
  fprintf(stderr, "syncback: closure 2: %s: %s\n", tsr_err_name(rc), r.msg);
  H_CHECK(rc != 0 && rc != TSR_ETIMEOUT && !strstr(r.msg, "deadline") &&
              strstr(r.msg, "not on this parameter server"),
          "closure 2 with ps:1 back empty: %s %s", tsr_err_name(rc), r.msg);
  h_result_free(&r);
  Tessera__Worker__StatusResponse *st = status_of(&c, 0);
  H_CHECK(st && strcmp(st->state, "failed") == 0, "status after the failure");
  tessera__worker__status_response__free_unpacked(st, NULL);
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

int main(int argc, char **argv) {
  const char *src =
      h_main_start(argc, argv,
                   "test_worker train|ssp|sync|sync_optim|sync_clip|sparse|"
                   "errors|synckill|syncback|hybrid|hybrid_sparse|"
                   "hybrid_errors",
                   job_path, sizeof job_path);
  if (!src) return 2;
  if (strcmp(argv[1], "train") == 0) return test_train("async");
  if (strcmp(argv[1], "ssp") == 0) return test_train("ssp:1");
  if (strcmp(argv[1], "sync") == 0) {
    /* 12 steps per epoch (11 of 16 and one of a single example per
     * worker: the same 2 rows as the global batch's last), so 22 steps
     * cross an epoch. */
    const char *ovr[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                         "mode=\"sync\"", NULL};
    return test_sync(job_path, ovr, 2, 11, 2);
  }
  if (strcmp(argv[1], "sync_optim") == 0) {
    /* The PS evaluates the schedule at each shard's apply count, applies
     * AdamW's weight decay and clipvalue after the sync mean: the same
     * numbers as the standalone trainer's on the global batch. */
    const char *ovr[] = {
        "data.train.shuffle_buffer=0", "batch_size=16", "mode=\"sync\"",
        "optimizer={\"class_name\": \"AdamW\", \"config\": {"
        "\"weight_decay\": 0.1, \"clipvalue\": 0.02, \"learning_rate\": "
        "{\"class_name\": \"ExponentialDecay\", \"config\": "
        "{\"initial_learning_rate\": 0.05, \"decay_steps\": 4, "
        "\"decay_rate\": 0.5, \"staircase\": true}}}}",
        NULL};
    return test_sync(job_path, ovr, 2, 11, 2);
  }
  if (strcmp(argv[1], "sync_clip") == 0) {
    /* global_clipnorm runs on the worker before its push; with one worker
     * its gradient is the global batch's, so the PS ends where the
     * standalone trainer (which clips the same way) ends. Nadam with a
     * cosine schedule and warmup. */
    const char *ovr[] = {
        "data.train.shuffle_buffer=0", "batch_size=16", "mode=\"sync\"",
        "optimizer={\"name\": \"nadam\", \"global_clipnorm\": 0.5, "
        "\"learning_rate\": {\"class_name\": \"CosineDecay\", \"config\":"
        " {\"initial_learning_rate\": 0.01, \"decay_steps\": 10, "
        "\"warmup_target\": 0.05, \"warmup_steps\": 5}}}",
        NULL};
    return test_sync(job_path, ovr, 2, 11, 1);
  }
  if (strcmp(argv[1], "sparse") == 0) {
    /* Row-sparse embedding tables split over both PS: each step pulls and
     * pushes only the rows its batch touches. */
    char ctr[1024];
    snprintf(ctr, sizeof ctr, "%s/tests/integration/worker/ctr_job.json",
             src);
    const char *ovr[] = {"batch_size=16", "mode=\"sync\"", NULL};
    return test_sync(ctr, ovr, 2, 6, 2);
  }
  if (strcmp(argv[1], "hybrid") == 0) {
    /* dense "allreduce", no PS at all: one worker equals the standalone
     * trainer, two equal it on the global batch (sync mode's sum); the
     * digits classifier (softmax, 10 classes) with one worker */
    const char *ovr[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                         "dense=\"allreduce\"", NULL};
    if (test_hybrid(job_path, ovr, 2, 11, 1, 0)) return 1;
    /* SGD with momentum: the step is proportional to the gradient, so a
     * sum where the mean belongs shows (Adam would hide it) */
    const char *sgd[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                         "dense=\"allreduce\"",
                         "optimizer={\"name\": \"sgd\", \"learning_rate\": "
                         "0.001, \"momentum\": 0.9}", NULL};
    if (test_hybrid(job_path, sgd, 2, 11, 2, 0)) return 1;
    char digits[1024];
    snprintf(digits, sizeof digits, "%s/tests/data/digits_job.json", src);
    return test_hybrid(digits, ovr, 2, 8, 1, 0);
  }
  if (strcmp(argv[1], "hybrid_sparse") == 0) {
    /* wide-and-deep: the embedding tables on 2 PS (sync), the dense
     * layers on 2 workers' ring */
    char ctr[1024];
    snprintf(ctr, sizeof ctr, "%s/tests/integration/worker/ctr_job.json",
             src);
    const char *ovr[] = {"batch_size=16", "mode=\"sync\"",
                         "dense=\"allreduce\"", NULL};
    return test_hybrid(ctr, ovr, 2, 6, 2, 2);
  }
  if (strcmp(argv[1], "hybrid_errors") == 0) return test_hybrid_errors();
  if (strcmp(argv[1], "errors") == 0) return test_errors();
  if (strcmp(argv[1], "synckill") == 0) return test_synckill();
  if (strcmp(argv[1], "syncback") == 0) return test_syncback();
  fprintf(stderr, "unknown test %s\n", argv[1]);
  return 2;
}
