/* Training steps and evaluation on the training thread.
 *
 * A closure of K steps, happy path: take the first batch and pull every
 * shard it needs from every PS at once (dense shards whole, into their
 * slice of the variable's buffer; row-sparse shards only the batch's rows,
 * which are sorted so each shard's rows are one contiguous run of the
 * buffer). Then per step: compute; take and prepare the next batch; push
 * the gradients to every shard with the next batch's pull fused into the
 * same call (one round trip, and the next pull overlaps this push). The
 * closure's last step pushes only. Consistency is the PS's job: in ssp
 * and sync a closure first joins every PS (clock.c) and continues from
 * the clock they answer; pulls carry this worker's clock (ssp: steps it
 * finished, which each push also tells the PS; sync: steps applied, so a
 * pull for step t+1 waits until every member's step t has been applied)
 * and every call carries the era its PS answered.
 * Failure modes: an input error (named by the pipeline), a bad batch (the
 * model's error), a PS that fails or cannot be reached: the closure stops
 * and fails with that error; the run stays usable for the next closure,
 * which starts with a fresh pull.
 */
#include "common/trace.h"
#include "worker/loop_run.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t len, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return code;
}

static bool stopping(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  bool st = s->stop;
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* First index in sorted ids[0..n) with ids[i] >= x. */
static int64_t lower_bound(const int64_t *ids, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int grow_rows(wk_run *r, size_t v, int64_t n, char *err,
                     size_t errlen) {
  if (n <= r->cap_rows[v]) return 0;
  int64_t cap = r->cap_rows[v] ? r->cap_rows[v] : 64;
  while (cap < n) cap *= 2;
  size_t bytes = (size_t)cap * (size_t)r->vars[v].row_dim * sizeof(float);
  float *p = realloc(r->param[v], bytes);
  if (p) r->param[v] = p;
  float *g = p ? realloc(r->grad[v], bytes) : NULL;
  if (g) r->grad[v] = g;
  if (!p || !g)
    return fail(err, errlen, TSR_ENOMEM, "out of memory for %lld rows of %s",
                (long long)cap, r->vars[v].name);
  r->cap_rows[v] = cap;
  return 0;
}

/* Copies the executor's sorted ids of every row-sparse variable (valid
 * only until the next prepare) into ids_nxt. */
static int take_ids(wk_run *r, char *err, size_t errlen) {
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->vars[v].kind != WK_VAR_ROW_SPARSE) continue;
    const int64_t *ids;
    int64_t n;
    int rc = wk_exec_rows(r->ex, (int)v, &ids, &n);
    if (rc) return fail(err, errlen, rc, "%s: no row list", r->vars[v].name);
    int64_t have = r->cap_rows[v];
    if ((rc = grow_rows(r, v, n, err, errlen))) return rc;
    if (n > have || !r->ids_nxt[v]) {
      int64_t *p = realloc(r->ids_nxt[v], (size_t)(r->cap_rows[v] ? r->cap_rows[v] : 1) * sizeof *p);
      int64_t *q = p ? realloc(r->ids_cur[v], (size_t)(r->cap_rows[v] ? r->cap_rows[v] : 1) * sizeof *q) : NULL;
      if (p) r->ids_nxt[v] = p;
      if (q) r->ids_cur[v] = q;
      if (!p || !q) return fail(err, errlen, TSR_ENOMEM, "out of memory for ids");
    }
    if (n) memcpy(r->ids_nxt[v], ids, (size_t)n * sizeof *ids);
    r->n_nxt[v] = n;
  }
  return 0;
}

static void swap_ids(wk_run *r) {
  for (size_t v = 0; v < r->n_vars; v++) {
    int64_t *t = r->ids_cur[v];
    r->ids_cur[v] = r->ids_nxt[v];
    r->ids_nxt[v] = t;
    int64_t n = r->n_cur[v];
    r->n_cur[v] = r->n_nxt[v];
    r->n_nxt[v] = n;
  }
}

/* Next batch, prepared, its ids in ids_nxt. TSR_EEOF at the end. */
static int next_batch(wk_run *r, const wk_batch **b, double *wait_s,
                      char *err, size_t errlen) {
  double t0 = tsr_now_s();
  int rc = wk_input_next(r->in, b);
  *wait_s += tsr_now_s() - t0;
  if (rc == TSR_EEOF) return rc;
  if (rc)
    return fail(err, errlen, rc, "training data: %s", wk_input_error(r->in));
  if ((rc = wk_exec_prepare(r->ex, *b, 0, (*b)->n, NULL, err, errlen)))
    return rc;
  return take_ids(r, err, errlen);
}

/* The segment [*lo, *hi) of sorted ids that falls in shard sh. */
static void segment(const wk_shard *sh, const int64_t *ids, int64_t n,
                    int64_t *lo, int64_t *hi) {
  *lo = lower_bound(ids, n, sh->row0);
  *hi = lower_bound(ids, n, sh->row0 + sh->rows);
}

/* Fills r->ops for one exchange. push: send the gradients of the current
 * batch (ids_cur); pull: fetch the values for the next batch (dense, and
 * ids_nxt rows). Returns the number of ops. */
static int build_ops(wk_run *r, bool push, bool pull, int64_t step,
                     int64_t clock) {
  int n = 0;
  for (int i = 0; i < r->n_shards; i++) {
    const wk_shard *sh = &r->shards[i];
    const wk_var_info *vi = &r->vars[sh->var];
    size_t w = (size_t)vi->row_dim;
    wk_op *op = &r->ops[n];
    memset(op, 0, sizeof *op);
    op->ps = sh->ps;
    op->era = r->era[sh->ps];
    op->name = vi->name;
    op->shard = sh->shard;
    op->step = step;
    op->pull_clock = clock;
    op->width = w;
    if (vi->kind == WK_VAR_DENSE) {
      size_t off = (size_t)sh->row0 * w, cnt = (size_t)sh->rows * w;
      op->kind = push && pull ? WK_OP_PUSH_PULL : push ? WK_OP_PUSH : WK_OP_PULL;
      if (push) {
        op->grad = r->grad[sh->var] + off;
        op->grad_floats = cnt;
      }
      if (pull) {
        op->dst = r->param[sh->var] + off;
        op->dst_floats = cnt;
      }
      n++;
      continue;
    }
    int64_t plo = 0, phi = 0, qlo = 0, qhi = 0;
    if (push) segment(sh, r->ids_cur[sh->var], r->n_cur[sh->var], &plo, &phi);
    if (pull) segment(sh, r->ids_nxt[sh->var], r->n_nxt[sh->var], &qlo, &qhi);
    /* A pull of no rows is skipped; a push of none is still sent, so a
     * sync-mode PS counts this worker's step. */
    bool do_pull = pull && qhi > qlo;
    if (!push && !do_pull) continue;
    op->kind = push && do_pull ? WK_OP_PUSH_PULL_ROWS
               : push          ? WK_OP_PUSH_ROWS
                               : WK_OP_PULL_ROWS;
    if (push) {
      op->ids = r->ids_cur[sh->var] + plo;
      op->n_ids = (size_t)(phi - plo);
      op->grad = r->grad[sh->var] + (size_t)plo * w;
      op->grad_floats = (size_t)(phi - plo) * w;
    }
    if (do_pull) {
      op->pull_ids = r->ids_nxt[sh->var] + qlo;
      op->n_pull = (size_t)(qhi - qlo);
      op->dst = r->param[sh->var] + (size_t)qlo * w;
      op->dst_floats = (size_t)(qhi - qlo) * w;
    }
    n++;
  }
  return n;
}

/* Pulls (and pushes) with timing; PS failures name the PS. */
static int exchange(wk_svc *s, wk_run *r, bool push, bool pull,
                    int64_t pull_clock, double *secs, wk_group *g, char *err,
                    size_t errlen) {
  pthread_mutex_lock(&s->mu);
  bool lost = s->ps_losses != r->losses;
  if (lost)
    snprintf(err, errlen, "%s during the closure: stopping (the PS may have "
             "restarted without its shards)", s->ps_loss_msg);
  pthread_mutex_unlock(&s->mu);
  if (lost) return TSR_ECLOSED;
  int64_t step = r->clock;
  g->check_losses = true;
  g->losses = r->losses;
  int n = build_ops(r, push, pull, step, pull_clock);
  /* ssp: a push of step t tells the PS this worker finished t + 1 steps.
   * The closure's first exchange TICKs every PS up to the clock the joins
   * agreed on (a PS that answered less would otherwise hold this worker
   * back on its own old clock, or wait for a step it will never push). */
  if (!push && r->job.mode != TSR_MODE_ASYNC)
    n = wk__clock_ticks(r, n, r->clock);
  double t0 = tsr_now_s();
  int rc = wk__ps_run(s, r->ops, n, g);
  *secs += tsr_now_s() - t0;
  if (rc) return fail(err, errlen, rc, "%s", g->err);
  return 0;
}

/* Pulls the values of the closure's first batch at the clock the joins
 * answered (sync: once every member's step before it is applied). */
static int first_pull(wk_svc *s, wk_run *r, Tessera__Worker__RunResponse *o,
                      wk_group *g, char *err, size_t errlen) {
  return exchange(s, r, false, true, r->clock, &o->pull_s, g, err, errlen);
}

/* Closes the phase that began at the last mark and starts the next one. */
#define WK_TRACE(name)                                               \
  do {                                                               \
    if (tr) {                                                        \
      tsr_trace_end(tr, tpid, 1, "step", (name), tt);                \
      tt = tsr_trace_now_us();                                       \
    }                                                                \
  } while (0)

int wk__run_closure(wk_svc *s, wk_run *r, wk_job *j) {
  const Tessera__Worker__RunRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  Tessera__Worker__RunResponse *o = &j->out.run;
  tessera__worker__run_response__init(o);
  o->closure_id = q->closure_id;
  if (!r)
    return fail(err, errlen, TSR_EINVAL,
                "closure %llu: this worker is not configured (configure "
                "first)", (unsigned long long)q->closure_id);
  if (q->steps < 1)
    return fail(err, errlen, TSR_EINVAL, "closure %llu: steps %lld < 1",
                (unsigned long long)q->closure_id, (long long)q->steps);
  double t_start = tsr_now_s();
  /* --trace on the chief: every step's phases as trace events */
  tsr_trace *tr = NULL;
  int32_t tpid = tsr_trace_pid(TSR_TASK_WORKER, r->worker_index);
  if (q->trace && tsr_trace_create(&tr, (size_t)(4 * q->steps + 8)))
    tr = NULL;
  int64_t tt = tr ? tsr_trace_now_us() : 0;
  pthread_mutex_lock(&s->mu);
  s->ps_lost[0] = '\0';
  r->losses = s->ps_losses;
  pthread_mutex_unlock(&s->mu);
  wk_run_opts ro = {.train = true};
  wk_group g = {0};
  int64_t pulled_step = 0;
  const wk_batch *b;
  int rc = next_batch(r, &b, &o->input_wait_s, err, errlen);
  WK_TRACE("input wait");
  if (rc == TSR_EEOF) goto done;
  if (rc) goto out;
  /* The first pull fetches the batch's rows (ids_nxt), which then become
   * the current ones. Nothing is pushed yet, so a PS that is reconnecting
   * (just restarted) is given a few seconds before the closure fails. */
  uint64_t retry_end = tsr_now_ms() + 3000;
  if (r->job.mode != TSR_MODE_ASYNC &&
      (rc = wk__clock_join(s, r, q->closure_id, retry_end, err, errlen))) {
    swap_ids(r);
    goto out;
  }
  while ((rc = first_pull(s, r, o, &g, err, errlen)) &&
         wk__ps_retryable(rc) && tsr_now_ms() < retry_end && !stopping(s)) {
    tsr_sleep_ms(100);
    pthread_mutex_lock(&s->mu);
    r->losses = s->ps_losses; /* nothing computed yet: a reconnect is fine */
    pthread_mutex_unlock(&s->mu);
  }
  swap_ids(r);
  WK_TRACE("pull");
  if (rc) goto out;
  pulled_step = g.min_step == INT64_MAX ? 0 : g.min_step;

  for (int64_t i = 0; i < q->steps; i++) {
    double t0 = tsr_now_s();
    ro.grad_scale = 1.0f / (float)b->n;
    ro.seed = r->job.seed ^ (uint64_t)(q->first_step + i) * 0x9E3779B97F4A7C15ull;
    wk_run_result res;
    rc = wk_exec_run(r->ex, r->param, r->grad, &ro, &res);
    o->compute_s += tsr_now_s() - t0;
    WK_TRACE("compute");
    if (rc) {
      rc = fail(err, errlen, rc, "step %lld: compute failed: %s",
                (long long)(q->first_step + i), tsr_strerror(rc));
      goto out;
    }
    o->loss_sum += res.n ? res.loss_sum / (double)res.n : 0.0;
    o->examples += res.n;
    bool more = i + 1 < q->steps && !stopping(s);
    if (more) {
      rc = next_batch(r, &b, &o->input_wait_s, err, errlen);
      WK_TRACE("input wait");
      if (rc == TSR_EEOF)
        more = false;
      else if (rc)
        goto out;
    }
    /* The pull after a push is for the next step. */
    rc = exchange(s, r, true, more, r->clock + 1, &o->push_s, &g, err,
                  errlen);
    WK_TRACE(more ? "push + pull" : "push");
    if (rc) {
      /* Sync: some shards may have applied this step already, so it is
       * spent: retrying it would be refused as stale. The next closure
       * tells every PS this worker is past it. */
      if (r->job.mode == TSR_MODE_SYNC) r->clock++;
      goto out;
    }
    if (g.max_step >= 0 && r->job.mode == TSR_MODE_ASYNC &&
        g.max_step > pulled_step + 1) {
      uint64_t lag = (uint64_t)(g.max_step - pulled_step - 1);
      if (lag > o->max_staleness) o->max_staleness = lag;
    }
    if (g.max_step >= 0) pulled_step = g.max_step;
    r->clock++;
    o->steps_done++;
    swap_ids(r);
    pthread_mutex_lock(&s->mu);
    s->steps = ++r->steps;
    pthread_mutex_unlock(&s->mu);
    if (!more) break;
  }
done:
  r->examples += o->examples;
  o->wall_s = tsr_now_s() - t_start;
  pthread_mutex_lock(&s->mu);
  s->ex_per_sec = o->wall_s > 0 ? (double)o->examples / o->wall_s : 0;
  pthread_mutex_unlock(&s->mu);
  if (tr) {
    size_t n = tsr_trace_count(tr);
    tsr_trace_event *ev = malloc((n ? n : 1) * sizeof *ev);
    j->trace = malloc(n * TSR_TRACE_WIRE_SIZE + 1);
    if (ev && j->trace) {
      n = tsr_trace_drain(tr, ev, n);
      tsr_trace_pack(ev, n, j->trace);
      j->trace_len = n * TSR_TRACE_WIRE_SIZE;
    }
    free(ev);
  }
  rc = 0;
out:
  tsr_trace_free(tr);
  return rc;
}

int wk__run_eval(wk_svc *s, wk_run *r, wk_job *j) {
  const Tessera__Worker__EvalRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  Tessera__Worker__EvalResponse *o = &j->out.eval;
  tessera__worker__eval_response__init(o);
  if (!r)
    return fail(err, errlen, TSR_EINVAL,
                "eval %llu: this worker is not configured (configure first)",
                (unsigned long long)q->eval_id);
  wk_input *in = NULL;
  wk_metrics *mt = NULL;
  wk_group g = {0};
  int rc;
  int nm = wk_model_num_metrics(r->model);
  /* Fresh dense values (clock 0: never waits). */
  for (size_t v = 0; v < r->n_vars; v++) r->n_nxt[v] = 0;
  int n = build_ops(r, false, true, 0, 0);
  for (int i = 0; i < n; i++) r->ops[i].era = 0; /* plain reads */
  if ((rc = wk__ps_run(s, r->ops, n, &g)))
    return fail(err, errlen, rc, "eval: %s", g.err);

  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = r->job.batch_size, .epochs = 1,
                      .seed = r->job.seed};
  char ierr[WK_ERR_MAX];
  if ((rc = wk_input_open(&r->job, WK_SPLIT_EVAL, &io, &in, ierr,
                          sizeof ierr))) {
    rc = fail(err, errlen, tsr_err_is_own(rc) ? rc : TSR_EIO,
              "eval data: %s", ierr);
    goto out;
  }
  if ((rc = wk_metrics_open(r->model, &mt))) {
    fail(err, errlen, rc, "eval: out of memory for metrics");
    goto out;
  }
  wk_run_opts ro = {.train = false, .grad_scale = 1.0f, .seed = r->job.seed};
  for (int64_t nb = 0; q->max_batches <= 0 || nb < q->max_batches; nb++) {
    const wk_batch *b;
    rc = wk_input_next(in, &b);
    if (rc == TSR_EEOF) break;
    if (rc) {
      fail(err, errlen, rc, "eval data: %s", wk_input_error(in));
      goto out;
    }
    if ((rc = wk_exec_prepare(r->ex, b, 0, b->n, NULL, err, errlen)) ||
        (rc = take_ids(r, err, errlen)))
      goto out;
    n = build_ops(r, false, true, 0, 0);
    /* Dense values are already here: pull only the rows. */
    int k = 0;
    for (int i = 0; i < n; i++)
      if (r->ops[i].kind == WK_OP_PULL_ROWS) {
        r->ops[k] = r->ops[i];
        r->ops[k++].era = 0;
      }
    if ((rc = wk__ps_run(s, r->ops, k, &g))) {
      fail(err, errlen, rc, "eval: %s", g.err);
      goto out;
    }
    swap_ids(r);
    wk_run_result res;
    if ((rc = wk_exec_run(r->ex, r->param, NULL, &ro, &res))) {
      fail(err, errlen, rc, "eval: compute failed: %s", tsr_strerror(rc));
      goto out;
    }
    if ((rc = wk_metrics_add(mt, res.pred, res.labels, res.n,
                             res.loss_sum))) {
      fail(err, errlen, rc, "eval: out of memory for metrics");
      goto out;
    }
  }
  j->values = calloc((size_t)(nm ? nm : 1), sizeof(double));
  j->names = calloc((size_t)(nm ? nm : 1), sizeof(char *));
  if (!j->values || !j->names) {
    rc = fail(err, errlen, TSR_ENOMEM, "eval: out of memory");
    goto out;
  }
  for (int i = 0; i < nm; i++)
    if (!(j->names[i] = strdup(wk_model_metric_name(r->model, i)))) {
      rc = fail(err, errlen, TSR_ENOMEM, "eval: out of memory");
      goto out;
    }
  j->n_names = nm;
  wk_metrics_result(mt, &o->loss, j->values);
  o->examples = wk_metrics_count(mt);
  o->n_metric_names = (size_t)nm;
  o->metric_names = j->names;
  o->n_metric_values = (size_t)nm;
  o->metric_values = j->values;
  rc = 0;
out:
  if (mt) wk_metrics_close(mt);
  if (in) wk_input_close(in);
  return rc;
}
