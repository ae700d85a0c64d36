/* Training steps and evaluation on the training thread.
 *
 * A closure of K steps, happy path: take the first batch and pull every
 * variable it needs from every PS at once (dense variables whole, into
 * their buffer; row-sparse ones only the batch's rows, which are sorted so
 * each shard's rows are one contiguous run of the buffer). Then per step:
 * compute, the forward pass waiting for each variable only as it reaches
 * it and the backward pass pushing each gradient as soon as it is final
 * (loop_xfer.c); take and prepare the next batch; pull the next step's
 * values in model order (dense "allreduce": then wait for the ring and
 * apply the dense gradients, hybrid.c); wait for this step's pushes. The
 * closure's last step pushes only. With prefetch_params (async) the next
 * step's dense values are pulled at the start of a step into the other
 * set of buffers.
 * Consistency is the PS's job: in ssp and sync a closure first joins
 * every PS (clock.c) and continues from the clock they answer; pulls carry
 * this worker's clock (ssp: steps it finished, which each push also tells
 * the PS; sync: steps applied, so a pull for step t+1 waits until every
 * member's step t has been applied) and every call carries the era its PS
 * answered; a push is sent before the pull of the same variable, on the
 * same connection, so the pull sees it.
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
#include "kernels/optim.h"
#include "worker/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool stopping(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  bool st = s->stop;
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* clipnorm / global_clipnorm need the whole gradient, which only this side
 * has (each PS holds a shard): the step's gradients are clipped here before
 * the push, as Keras clips before its update. In sync mode the PS averages
 * gradients clipped per worker (Keras clips the average); the mean of
 * clipped gradients still has a norm within the bound. */
static int clip_grads(wk_run *r, int k) {
  const tsr_optim_spec *o = &r->job.optimizer;
  if (!(o->clipnorm > 0) && !(o->global_clipnorm > 0)) return 0;
  float *gs[256], **g = gs;
  size_t ns[256], *n = ns;
  if (r->n_vars > 256) {
    g = malloc(r->n_vars * sizeof *g);
    n = malloc(r->n_vars * sizeof *n);
    if (!g || !n) {
      if (g != gs) free(g);
      if (n != ns) free(n);
      return TSR_ENOMEM;
    }
  }
  for (size_t v = 0; v < r->n_vars; v++) {
    g[v] = wk__set_grad(r, k)[v];
    n[v] = (size_t)(r->vars[v].kind == TSR_VAR_DENSE
                        ? r->vars[v].numel
                        : r->n_cur[v] * r->vars[v].row_dim);
  }
  kern_optim_clip_norm(o, g, n, (int)r->n_vars, 1.0f);
  if (g != gs) free(g);
  if (n != ns) free(n);
  return 0;
}

/* The metric names and values of `mt` into the job's answer arrays. */
static int metric_answer(wk_run *r, wk_job *j, wk_metrics *mt, double *loss,
                         char *err, size_t errlen) {
  int nm = tsr_model_num_metrics(r->model);
  j->values = calloc((size_t)(nm ? nm : 1), sizeof(double));
  j->names = calloc((size_t)(nm ? nm : 1), sizeof(char *));
  if (!j->values || !j->names)
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for metrics");
  for (int i = 0; i < nm; i++)
    if (!(j->names[i] = strdup(tsr_model_metric_name(r->model, i))))
      return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for metrics");
  j->n_names = nm;
  double l;
  wk_metrics_result(mt, loss ? loss : &l, j->values);
  return 0;
}

/* Histograms of every dense variable (fresh from the PS) and of its last
 * training gradient, for TensorBoard's histograms at each evaluation.
 * Row-sparse tables are left out: only a batch's rows are here. */
static int eval_histograms(wk_run *r, wk_job *j,
                           Tessera__Worker__EvalResponse *o) {
  int nd = 0;
  for (size_t v = 0; v < r->n_vars; v++)
    nd += r->vars[v].kind == TSR_VAR_DENSE;
  int n = 2 * nd;
  j->histo = calloc((size_t)(n ? n : 1), sizeof *j->histo);
  j->hmsg = calloc((size_t)(n ? n : 1), sizeof *j->hmsg);
  j->hptr = calloc((size_t)(n ? n : 1), sizeof *j->hptr);
  j->htag = calloc((size_t)(n ? n : 1), sizeof *j->htag);
  if (!j->histo || !j->hmsg || !j->hptr || !j->htag) return TSR_ENOMEM;
  int k = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    const tsr_var *vi = &r->vars[v];
    if (vi->kind != TSR_VAR_DENSE) continue;
    for (int g = 0; g < 2; g++, k++) {
      const float *x = g ? r->grad[v] : r->param[v];
      tsr_histo_fill(x, (size_t)vi->numel, 30, &j->histo[k]);
      snprintf(j->htag[k], sizeof j->htag[k], "%s%s", vi->name,
               g ? "/gradient" : "");
      Tessera__Worker__Histogram *h = &j->hmsg[k];
      tessera__worker__histogram__init(h);
      h->tag = j->htag[k];
      h->min = j->histo[k].min;
      h->max = j->histo[k].max;
      h->num = j->histo[k].num;
      h->sum = j->histo[k].sum;
      h->sum_squares = j->histo[k].sum_squares;
      h->n_bucket_limit = h->n_bucket = (size_t)j->histo[k].n_buckets;
      h->bucket_limit = j->histo[k].limit;
      h->bucket = j->histo[k].count;
      j->hptr[k] = h;
    }
  }
  j->n_hist = k;
  o->n_histograms = (size_t)k;
  o->histograms = j->hptr;
  return 0;
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
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for %lld rows of %s",
                    (long long)cap, r->vars[v].name);
  r->cap_rows[v] = cap;
  if (r->param1) r->param1[v] = p; /* one set of rows for both */
  if (r->grad1) r->grad1[v] = g;
  return 0;
}

/* Copies the executor's sorted ids of every row-sparse variable (valid
 * only until the next prepare) into ids_nxt. */
static int take_ids(wk_run *r, char *err, size_t errlen) {
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->vars[v].kind != TSR_VAR_ROW_SPARSE) continue;
    const int64_t *ids;
    int64_t n;
    int rc = wk_exec_rows(r->ex, (int)v, &ids, &n);
    if (rc) return tsr_errf(err, errlen, rc, "%s: no row list", r->vars[v].name);
    int64_t have = r->cap_rows[v];
    /* ids_nxt was the last step's push's ids, and the buffers may move:
     * that push must be done (the forward pass waited for it already) */
    if ((rc = wk__xfer_wait_var_push(r, (int)v)))
      return tsr_errf(err, errlen, rc, "%s", r->xs.err);
    if ((rc = grow_rows(r, v, n, err, errlen))) return rc;
    if (n > have || !r->ids_nxt[v]) {
      int64_t *p = realloc(r->ids_nxt[v], (size_t)(r->cap_rows[v] ? r->cap_rows[v] : 1) * sizeof *p);
      int64_t *q = p ? realloc(r->ids_cur[v], (size_t)(r->cap_rows[v] ? r->cap_rows[v] : 1) * sizeof *q) : NULL;
      if (p) r->ids_nxt[v] = p;
      if (q) r->ids_cur[v] = q;
      if (!p || !q) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for ids");
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
    return tsr_errf(err, errlen, wk__data_code(rc), "training data: %s",
                    wk_input_error(r->in));
  if ((rc = wk_exec_prepare(r->ex, *b, 0, (*b)->n, NULL, err, errlen)))
    return wk__data_code(rc);
  return take_ids(r, err, errlen);
}

/* ssp, sync: a PS connection lost since the closure began: the shards may
 * not be the ones this closure computed against (the chief rewinds every
 * PS). async: the lost PS restores its own shards and its calls wait for
 * it (the PS client's wait_lost): the closure goes on. */
static int check_losses(wk_run *r, char *err, size_t errlen) {
  if (r->job.mode == TSR_MODE_ASYNC) return 0;
  char msg[WK_ERR_MAX];
  if (ps_kv_losses(r->kv, msg, sizeof msg) == r->losses) return 0;
  return tsr_errf(err, errlen, TSR_ECLOSED, "%s during the closure: stopping (the "
              "PS may have restarted without its shards)", msg);
}

/* Pulls the values of the closure's first batch into set 0 at the clock
 * the joins answered (sync: once every member's step before it is
 * applied). ssp and sync: the same exchange TICKs every PS up to that
 * clock (a PS that answered less would otherwise hold this worker back on
 * its own old clock, or wait for a step it will never push). */
static int first_pull(wk_run *r, Tessera__Worker__RunResponse *o, char *err,
                      size_t errlen) {
  int rc = check_losses(r, err, errlen);
  if (rc) return rc;
  tsr_trace *tr = r->xs.tr;
  int32_t tpid = r->xs.tpid;
  wk__xfer_begin(r, tr, tpid);
  ps_ticket tick = 0;
  rc = wk__xfer_pull(r, 0, r->clock, true, true);
  if (!rc && r->job.mode != TSR_MODE_ASYNC)
    rc = wk__xfer_clock_submit(r, PS_CLOCK_TICK, r->clock, &tick);
  int w = wk__xfer_wait_pulls(r, 0);
  int c = wk__xfer_wait(r, &tick, false, NULL);
  o->pull_s += r->xs.wait_pull_s;
  if (!rc) rc = w ? w : c;
  if (rc) return tsr_errf(err, errlen, rc, "%s", r->xs.err);
  return 0;
}

/* Closes the phase that began at the last mark and starts the next one. */
#define WK_TRACE(name)                                               \
  do {                                                               \
    if (tr) {                                                        \
      tsr_trace_end(tr, tpid, 1, "step", (name), tt);                \
      tt = tsr_trace_now_us();                                       \
    }                                                                \
  } while (0)

/* One step's computation on set k, pushing each gradient as the backward
 * pass finishes it; the time blocked on pulls inside is not compute. */
static int compute(wk_run *r, int k, const wk_batch *b, uint64_t seed,
                   Tessera__Worker__RunResponse *o, wk_run_result *res) {
  wk_run_opts ro = {.train = true};
  ro.grad_scale = 1.0f / (float)b->n;
  ro.seed = seed;
  wk__xfer_hooks(r, &ro, k, r->clock);
  double w0 = r->xs.wait_pull_s + r->xs.wait_push_s, t0 = tsr_now_s();
  int rc = wk_exec_run(r->ex, wk__set_param(r, k), wk__set_grad(r, k), &ro,
                       res);
  double waited = r->xs.wait_pull_s + r->xs.wait_push_s - w0;
  o->compute_s += tsr_now_s() - t0 - waited;
  o->push_s += waited; /* the network share: blocked on the PS */
  if (!rc && r->xs.rc) rc = r->xs.rc; /* a push the client refused */
  return rc;
}

int wk__run_closure(wk_svc *s, wk_run *r, wk_job *j) {
  const Tessera__Worker__RunRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  Tessera__Worker__RunResponse *o = &j->out.run;
  tessera__worker__run_response__init(o);
  o->closure_id = q->closure_id;
  if (!r)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "closure %llu: this worker is not configured (configure "
                    "first)", (unsigned long long)q->closure_id);
  if (q->steps < 1)
    return tsr_errf(err, errlen, TSR_EINVAL, "closure %llu: steps %lld < 1",
                    (unsigned long long)q->closure_id, (long long)q->steps);
  double t_start = tsr_now_s();
  /* --trace on the chief: every step's phases as trace events, and every
   * variable's pull and push on the traffic track */
  tsr_trace *tr = NULL;
  int32_t tpid = tsr_trace_pid(TSR_TASK_WORKER, r->worker_index);
  if (q->trace &&
      tsr_trace_create(&tr, (size_t)((4 + 4 * r->n_vars) * (size_t)q->steps +
                                     4 * r->n_vars + 8)))
    tr = NULL;
  if (tr) {
    tsr_trace_name_thread(tr, tpid, 1, "steps");
    tsr_trace_name_thread(tr, tpid, 2, "PS traffic");
  }
  int64_t tt = tr ? tsr_trace_now_us() : 0;
  r->losses = ps_kv_losses(r->kv, NULL, 0);
  r->plain_reads = false;
  r->read_snapshot = 0;
  wk__xfer_begin(r, tr, tpid);
  int64_t pulled_step = 0;
  wk_metrics *tm = NULL; /* the model's metrics on this closure's batches */
  if (tsr_model_num_metrics(r->model) > 0 && wk_metrics_open(r->model, &tm))
    tm = NULL;
  const wk_batch *b;
  int rc = next_batch(r, &b, &o->input_wait_s, err, errlen);
  WK_TRACE("input wait");
  if (rc == TSR_EEOF) goto done;
  if (rc) goto out;
  /* The first pull fetches the batch's rows (ids_nxt), which then become
   * the current ones. Nothing is pushed yet, so a PS that is reconnecting
   * (just restarted) is given a few seconds before the closure fails. */
  uint64_t retry_end = tsr_now_ms() + 3000;
  /* dense "allreduce": a new ring (a worker lost or joining) first */
  if (r->hybrid && (rc = wk__hy_ring(r, q, err, errlen))) {
    swap_ids(r);
    goto out;
  }
  if (r->job.mode != TSR_MODE_ASYNC &&
      (rc = wk__clock_join(s, r, q->closure_id, retry_end, err, errlen))) {
    swap_ids(r);
    goto out;
  }
  while ((rc = first_pull(r, o, err, errlen)) && wk__ps_retryable(rc) &&
         tsr_now_ms() < retry_end && !stopping(s)) {
    tsr_sleep_ms(100);
    /* nothing computed yet: a reconnect is fine */
    r->losses = ps_kv_losses(r->kv, NULL, 0);
  }
  swap_ids(r);
  WK_TRACE("pull");
  if (rc) goto out;
  pulled_step = r->xs.min_step == INT64_MAX ? 0 : r->xs.min_step;

  for (int64_t i = 0; i < q->steps; i++) {
    int k = r->cur, nk = r->prefetch ? k ^ 1 : k;
    if ((rc = check_losses(r, err, errlen))) goto out;
    r->xs.max_step = -1;
    r->xs.min_step = INT64_MAX;
    r->xs.pushed = false;
    /* prefetch: the next step's values, pulled while this one computes */
    if (r->prefetch && i + 1 < q->steps &&
        (rc = wk__xfer_pull(r, nk, r->clock + 1, true, false)))
      goto xfail;
    r->early_pull = !r->prefetch && !r->defer_push &&
                    r->job.mode == TSR_MODE_ASYNC && i + 1 < q->steps;
    wk_run_result res;
    if (r->hybrid) wk__hy_start(r);
    rc = compute(r, k, b,
                 r->job.seed ^ (uint64_t)(q->first_step + i) *
                                   0x9E3779B97F4A7C15ull,
                 o, &res);
    r->early_pull = false;
    WK_TRACE("compute");
    /* dense "allreduce": every bucket is on the ring now; with clipping
     * the whole mean gradient is waited for here and clipped below, else
     * the ring runs on while the next batch is prepared and its rows'
     * pulls go out, and is waited for after them */
    bool late_reduce = r->hybrid && !r->defer_push;
    if (r->hybrid && !rc) {
      rc = late_reduce ? wk__hy_post(r) : wk__hy_reduce(r, false, o);
      if (!late_reduce) WK_TRACE("all-reduce");
      if (rc) goto xfail;
    }
    if (r->defer_push && !rc) {
      /* clipnorm / global_clipnorm: the whole gradient first, then the
       * pushes, last variable first */
      if (!(rc = clip_grads(r, k))) rc = wk__xfer_push_all(r, k, r->clock);
      if (!rc && r->hybrid) wk__hy_apply(r, 1.0f);
      if (rc && r->xs.rc) goto xfail;
    }
    if (rc) {
      if (r->xs.rc) goto xfail;
      const char *why = kern_last_error(wk_exec_ctx(r->ex));
      rc = tsr_errf(err, errlen, rc, "step %lld: compute failed: %s",
                    (long long)(q->first_step + i),
                    *why ? why : tsr_strerror(rc));
      goto out;
    }
    o->loss_sum += res.n ? res.loss_sum / (double)res.n : 0.0;
    o->examples += res.n;
    if (tm && wk_metrics_add(tm, res.pred, res.labels, res.n, res.loss_sum)) {
      wk_metrics_close(tm);
      tm = NULL;
    }
    bool more = i + 1 < q->steps && !stopping(s);
    if (more) {
      rc = next_batch(r, &b, &o->input_wait_s, err, errlen);
      WK_TRACE("input wait");
      if (rc == TSR_EEOF)
        more = false;
      else if (rc)
        goto out;
    }
    /* The next step's values, first layer first (prefetch: the rows
     * only); this step's pushes are waited for as the next forward pass
     * reaches each variable, the last step's here. */
    if (more && (rc = wk__xfer_pull(r, nk, r->clock + 1, !r->prefetch, true)))
      goto xfail;
    if (late_reduce) {
      /* each bucket's mean gradient applied as it arrives, before the
       * next forward pass reads the dense values */
      if (more) WK_TRACE("pull");
      if ((rc = wk__hy_reduce(r, true, o))) goto xfail;
      WK_TRACE("all-reduce");
    }
    if (!more) {
      double wp0 = r->xs.wait_push_s;
      rc = wk__xfer_wait_pushes(r, k, true, true);
      o->push_s += r->xs.wait_push_s - wp0;
    }
    if (!late_reduce || !more) WK_TRACE(more ? "pull" : "push");
    if (rc) goto xfail;
    if (r->xs.max_step >= 0 && r->job.mode == TSR_MODE_ASYNC &&
        r->xs.max_step > pulled_step + 1) {
      uint64_t lag = (uint64_t)(r->xs.max_step - pulled_step - 1);
      if (lag > o->max_staleness) o->max_staleness = lag;
    }
    if (r->xs.max_step >= 0) pulled_step = r->xs.max_step;
    r->clock++;
    r->xs.pushed = false;
    o->steps_done++;
    swap_ids(r);
    r->cur = nk;
    pthread_mutex_lock(&s->mu);
    s->steps = ++r->steps;
    pthread_mutex_unlock(&s->mu);
    if (!more) break;
  }
  /* the last pushes (and a prefetch nobody will use) */
  if ((rc = wk__xfer_drain(r))) goto xfail;
done:
  o->skipped_records = r->in ? wk_input_skipped(r->in) : 0;
  if (tm && wk_metrics_count(tm) > 0 &&
      metric_answer(r, j, tm, NULL, err, errlen) == 0) {
    o->n_metric_names = o->n_metric_values = (size_t)j->n_names;
    o->metric_names = j->names;
    o->metric_values = j->values;
  }
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
  goto out;
xfail:
  /* A PS failure. Sync: once a push of this step went out, some shards
   * may have applied it already, so it is spent: retrying it would be
   * refused as stale. The next closure tells every PS this worker is past
   * it. */
  if (r->job.mode == TSR_MODE_SYNC && r->xs.pushed) r->clock++;
  tsr_errf(err, errlen, rc, "%s", r->xs.err[0] ? r->xs.err : tsr_strerror(rc));
out:
  /* dense "allreduce": the other workers would wait on this one's next
   * bucket; they fail now with its reason */
  if (rc && r->hybrid) wk__hy_fail(r, rc, err);
  wk__xfer_drain(r); /* no call may still use the buffers */
  r->xs.tr = NULL;
  wk_metrics_close(tm);
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
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "eval %llu: this worker is not configured (configure first)",
                    (unsigned long long)q->eval_id);
  wk_input *in = NULL;
  wk_metrics *mt = NULL;
  int rc;
  int nm = tsr_model_num_metrics(r->model);
  /* Fresh dense values (clock 0: never waits) into set 0. */
  for (size_t v = 0; v < r->n_vars; v++) r->n_nxt[v] = 0;
  r->losses = ps_kv_losses(r->kv, NULL, 0);
  r->plain_reads = true; /* no part of the clock protocol */
  /* the values as the chief's snapshot holds them while training goes on
   * (0: as they are) */
  r->read_snapshot = q->snapshot;
  wk__xfer_begin(r, NULL, 0);
  rc = wk__xfer_pull(r, 0, 0, true, false);
  int w = wk__xfer_wait_pulls(r, 0);
  if (rc || (rc = w)) return tsr_errf(err, errlen, rc, "eval: %s", r->xs.err);

  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = r->job.batch_size, .epochs = 1,
                      .seed = r->job.seed};
  char ierr[WK_ERR_MAX];
  if ((rc = wk_input_open(&r->job, WK_SPLIT_EVAL, &io, &in, ierr,
                          sizeof ierr))) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "eval data: %s", ierr);
    goto out;
  }
  if ((rc = wk_metrics_open(r->model, &mt))) {
    tsr_errf(err, errlen, rc, "eval: out of memory for metrics");
    goto out;
  }
  wk_run_opts ro = {.train = false, .grad_scale = 1.0f, .seed = r->job.seed};
  for (int64_t nb = 0; q->max_batches <= 0 || nb < q->max_batches; nb++) {
    const wk_batch *b;
    rc = wk_input_next(in, &b);
    if (rc == TSR_EEOF) break;
    if (rc) {
      rc = tsr_errf(err, errlen, wk__data_code(rc), "eval data: %s",
                    wk_input_error(in));
      goto out;
    }
    if ((rc = wk_exec_prepare(r->ex, b, 0, b->n, NULL, err, errlen))) {
      rc = wk__data_code(rc);
      goto out;
    }
    if ((rc = take_ids(r, err, errlen))) goto out;
    /* Dense values are already here: pull only the rows. */
    rc = wk__xfer_pull(r, 0, 0, false, true);
    w = wk__xfer_wait_pulls(r, 0);
    if (rc || (rc = w)) {
      tsr_errf(err, errlen, rc, "eval: %s", r->xs.err);
      goto out;
    }
    swap_ids(r);
    wk_run_result res;
    if ((rc = wk_exec_run(r->ex, r->param, NULL, &ro, &res))) {
      const char *why = kern_last_error(wk_exec_ctx(r->ex));
      tsr_errf(err, errlen, rc, "eval: compute failed: %s",
               *why ? why : tsr_strerror(rc));
      goto out;
    }
    if ((rc = wk_metrics_add(mt, res.pred, res.labels, res.n,
                             res.loss_sum))) {
      tsr_errf(err, errlen, rc, "eval: out of memory for metrics");
      goto out;
    }
  }
  if ((rc = metric_answer(r, j, mt, &o->loss, err, errlen))) goto out;
  if ((rc = eval_histograms(r, j, o))) {
    tsr_errf(err, errlen, rc, "eval: out of memory for histograms");
    goto out;
  }
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
