/* The training thread: takes jobs (configure, run a closure, evaluate) one
 * after the other from the service and hands each back, answered, to the
 * loop. This file holds the thread body and the configure step; the steps
 * themselves are in loop_step.c.
 *
 * Configure, happy path: parse the chief's resolved job (relative paths
 * from job_dir), open this worker's share of the training input, build
 * the model against the input schema, check the chief's shard list against
 * the model's variables (every variable covered by contiguous row ranges,
 * every PS index known), open the compute context and the executor, make
 * one host parameter buffer and one gradient buffer per variable (a dense
 * variable whole, so a shard's pull lands in place at row0 * row_dim),
 * connect to every PS and join their clocks (ssp, sync: clock.c).
 * Failure modes: a data file missing here (TSR_EIO naming the path), a
 * model the worker cannot build or a layout that does not match it
 * (TSR_ECONFIG naming the variable), no GPU when one was asked for, a PS
 * that cannot be reached (TSR_EUNAVAIL naming it). A failed configure
 * leaves the worker unconfigured and serving.
 */
#include "worker/loop_int.h"
#include "worker/loop_run.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/memlimit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wk__run_free(wk_run *r) {
  if (!r) return;
  wk__hy_free(r); /* before the buffers: dense gradients are its own */
  if (r->ex) wk_exec_close(r->ex);
  /* the input's batches may be pinned memory of the compute context */
  if (r->in) wk_input_close(r->in);
  r->in = NULL;
  if (r->kc) kern_close(r->kc);
  if (r->model) tsr_model_free(r->model);
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->param1 && r->param && r->param1[v] != r->param[v])
      free(r->param1[v]);
    if (r->grad1 && r->grad && r->grad1[v] != r->grad[v]) free(r->grad1[v]);
    if (r->param) free(r->param[v]);
    if (r->grad) free(r->grad[v]);
    if (r->ids_cur) free(r->ids_cur[v]);
    if (r->ids_nxt) free(r->ids_nxt[v]);
  }
  for (int i = 0; i < r->n_ps; i++) free(r->ps_addrs[i]);
  TSR_FREE_ALL(r->param, r->grad, r->param1, r->grad1, r->xf, r->ids_cur,
               r->ids_nxt, r->n_cur, r->n_nxt, r->cap_rows, r->shards,
               r->var_first, r->ps_addrs);
  tsr_job_free(&r->job);
  free(r);
}

void *wk__pin_alloc(void *ctx, size_t bytes) {
  return kern_host_alloc(ctx, bytes);
}

void wk__pin_free(void *ctx, void *p) { kern_host_free(ctx, p); }

void wk__job_free(wk_job *j) {
  if (!j) return;
  for (int i = 0; i < j->n_names; i++) free(j->names[i]);
  TSR_FREE_ALL(j->strs[0], j->strs[1], j->names, j->values, j->histo,
               j->affine, j->cols, j->hmsg, j->hptr, j->htag, j->trace,
               j->dvars, j->dvp, j->dslot_names, j);
}

/* Shards arrive in any order; sort by (var, row0) so each variable's
 * shards are one contiguous, ordered run. */
static int shard_cmp(const void *a, const void *b) {
  const tsr_shard *x = a, *y = b;
  if (x->var != y->var) return x->var < y->var ? -1 : 1;
  return x->row0 < y->row0 ? -1 : x->row0 > y->row0;
}

static int check_layout(wk_run *r, const Tessera__Worker__ConfigureRequest *q,
                        char *err, size_t errlen) {
  int n = (int)q->n_shards;
  r->shards = calloc((size_t)(n ? n : 1), sizeof *r->shards);
  r->var_first = calloc(r->n_vars + 1, sizeof *r->var_first);
  if (!r->shards || !r->var_first)
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for the layout");
  for (int i = 0; i < n; i++) {
    const Tessera__Worker__Shard *s = q->shards[i];
    if (s->var >= r->n_vars)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "layout: shard %d names variable %u but the model has %zu "
                      "variables", i, s->var, r->n_vars);
    if ((int)s->ps >= r->n_ps)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "layout: %s shard %u is placed on ps:%u but only %d PS "
                      "addresses were given", r->vars[s->var].name, s->shard,
                      s->ps, r->n_ps);
    r->shards[i] = (tsr_shard){.var = (int)s->var, .shard = (int)s->shard,
                               .num_shards = (int)s->num_shards,
                               .row0 = s->row0, .rows = s->rows,
                               .ps = (int)s->ps};
  }
  qsort(r->shards, (size_t)n, sizeof *r->shards, shard_cmp);
  r->n_shards = n;
  int i = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    const tsr_var *vi = &r->vars[v];
    r->var_first[v] = i;
    int64_t next = 0, count = 0;
    for (; i < n && r->shards[i].var == (int)v; i++, count++) {
      const tsr_shard *s = &r->shards[i];
      if (s->row0 != next || s->rows < 1)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "layout: %s shard %d covers rows [%lld, %lld) but rows "
                        "from %lld were expected", vi->name, s->shard,
                        (long long)s->row0, (long long)(s->row0 + s->rows),
                        (long long)next);
      next = s->row0 + s->rows;
    }
    /* dense "allreduce": dense variables live on the workers */
    bool here = r->hybrid && vi->kind == TSR_VAR_DENSE;
    if (here && count > 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "layout: %s has shards on the PS but the job keeps dense "
                      "variables on the workers (dense \"allreduce\")",
                      vi->name);
    if (here) continue;
    if (count == 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "layout: the model's variable %s (%zu) has no shard in the "
                      "chief's layout", vi->name, v);
    for (int k = r->var_first[v]; k < i; k++)
      if (r->shards[k].num_shards != count)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "layout: %s shard %d says %d shards but %lld were given",
                        vi->name, r->shards[k].shard, r->shards[k].num_shards,
                        (long long)count);
    if (next != vi->shape[0])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "layout: %s has %lld rows in the model but its shards "
                      "cover %lld (shape mismatch: the chief built another "
                      "model?)", vi->name, (long long)vi->shape[0],
                      (long long)next);
  }
  r->var_first[r->n_vars] = i;
  if (i != n)
    return tsr_errf(err, errlen, TSR_ECONFIG, "layout: shards out of order");
  return 0;
}

static int alloc_buffers(wk_run *r, char *err, size_t errlen) {
  size_t nv = r->n_vars;
  bool two = r->job.prefetch_params && r->job.mode == TSR_MODE_ASYNC;
  /* the last two only with prefetch_params: a second set */
  const tsr_array per_var[] = {
      TSR_ARRAY(r->param), TSR_ARRAY(r->grad), TSR_ARRAY(r->ids_cur),
      TSR_ARRAY(r->ids_nxt), TSR_ARRAY(r->n_cur), TSR_ARRAY(r->n_nxt),
      TSR_ARRAY(r->cap_rows), TSR_ARRAY(r->param1), TSR_ARRAY(r->grad1)};
  size_t n_arrays = sizeof per_var / sizeof per_var[0] - (two ? 0 : 2);
  if (tsr_calloc_each(per_var, n_arrays, nv))
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for buffers");
  for (size_t v = 0; v < nv; v++) {
    const tsr_var *vi = &r->vars[v];
    if (vi->kind == TSR_VAR_ROW_SPARSE) continue; /* grown per batch */
    if (r->hybrid) continue; /* hybrid.c: values here, gradients bucketed */
    r->param[v] = calloc((size_t)vi->numel, sizeof(float));
    r->grad[v] = calloc((size_t)vi->numel, sizeof(float));
    if (two) { /* prefetch_params: a second set, the steps alternate */
      r->param1[v] = calloc((size_t)vi->numel, sizeof(float));
      r->grad1[v] = calloc((size_t)vi->numel, sizeof(float));
    }
    if (!r->param[v] || !r->grad[v] ||
        (two && (!r->param1[v] || !r->grad1[v])))
      return tsr_errf(err, errlen, TSR_ENOMEM,
                  "out of memory for %s (%lld floats)", vi->name,
                  (long long)vi->numel);
  }
  return 0;
}

int wk__data_code(int rc) {
  if (rc == TSR_ENOMEM || rc == TSR_ECANCELED || rc == TSR_ESHUTDOWN ||
      rc == TSR_ENODEVICE)
    return rc;
  return TSR_EDATA;
}

/* Opens the eval split and checks all of it, so a bad eval file stops the
 * run before the first step, not after training. */
static int check_eval(wk_svc *s, wk_run *r, char *err, size_t errlen) {
  if (!r->job.data || !json_object_get(r->job.data, "eval")) return 0;
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = r->job.batch_size, .epochs = 1,
                      .seed = r->job.seed};
  wk_input *in = NULL;
  char ierr[WK_ERR_MAX];
  int rc = wk_input_open(&r->job, WK_SPLIT_EVAL, &io, &in, ierr, sizeof ierr);
  if (!rc)
    rc = wk_input_validate(in, tsr_model_num_classes(r->model), ierr,
                           sizeof ierr);
  wk_input_close(in);
  if (rc)
    return tsr_errf(err, errlen, wk__data_code(rc), "worker %d: eval data: %s",
                    s->task_index, ierr);
  return 0;
}

static int do_configure(wk_svc *s, wk_job *j) {
  const Tessera__Worker__ConfigureRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  int rc;

  wk__run_free(s->run);
  s->run = NULL;
  pthread_mutex_lock(&s->mu);
  snprintf(s->state, sizeof s->state, "idle");
  s->run_id = 0;
  s->steps = 0;
  pthread_mutex_unlock(&s->mu);

  wk_run *r = calloc(1, sizeof *r);
  if (!r) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  tsr_job_init(&r->job);
  r->run_id = q->run_id;
  r->worker_index = (int)q->worker_index;
  r->num_workers = (int)q->num_workers;
  if (r->num_workers < 1 || r->worker_index >= r->num_workers) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG,
                  "configure: worker_index %u is not below num_workers %u",
                  q->worker_index, q->num_workers);
    goto out;
  }
  r->n_ps = (int)q->n_ps_addrs;
  r->ps_addrs = calloc((size_t)(r->n_ps ? r->n_ps : 1), sizeof(char *));
  if (!r->ps_addrs) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < r->n_ps; i++)
    if (!(r->ps_addrs[i] = strdup(q->ps_addrs[i]))) {
      rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
      goto out;
    }

  const char *base = q->job_dir && q->job_dir[0] ? q->job_dir : NULL;
  if ((rc = tsr_job_parse(q->job_json, "the chief's job", base, NULL, &r->job,
                          err, errlen)))
    goto out;
  r->hybrid = r->job.dense_allreduce;

  /* The input repeats: the chief counts steps (and epochs from the
   * examples per epoch answered below), and closures that run again after
   * a failure or a checkpoint restore need more than `epochs` passes. */
  wk_input_opts io = {.worker_index = r->worker_index,
                      .num_workers = r->num_workers,
                      .batch_size = r->job.batch_size,
                      .drop_remainder = false,
                      .epochs = -1,
                      .seed = r->job.seed};
  /* the compute context first, so a GPU backend's batches are read into
   * pinned memory and copied to the device at full speed */
  if ((rc = kern_open(&s->kopts, &r->kc, err, errlen))) goto out;
  if (!kern_is_host(r->kc)) {
    io.pinned = true;
    io.host_alloc_ctx = wk__pin_alloc;
    io.host_free_ctx = wk__pin_free;
    io.host_ctx = r->kc;
  }
  char ierr[WK_ERR_MAX];
  if ((rc = wk_input_open(&r->job, WK_SPLIT_TRAIN, &io, &r->in, ierr,
                          sizeof ierr))) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "worker %d: training data: %s",
                  s->task_index, ierr);
    goto out;
  }
  const wk_input_schema *schema = wk_input_get_schema(r->in);
  if ((rc = tsr_model_from_job(&r->job, schema, &r->model, err, errlen)))
    goto out;
  /* every input checked before the first step */
  if ((rc = wk_input_validate(r->in, tsr_model_num_classes(r->model), ierr,
                              sizeof ierr))) {
    rc = tsr_errf(err, errlen, wk__data_code(rc), "worker %d: training data: %s",
                  s->task_index, ierr);
    goto out;
  }
  if ((rc = check_eval(s, r, err, errlen))) goto out;
  if ((rc = tsr_model_variables(r->model, &r->vars, &r->n_vars))) {
    tsr_errf(err, errlen, rc, "model: no variable list");
    goto out;
  }
  if ((rc = check_layout(r, q, err, errlen))) goto out;
  size_t n_sparse = 0;
  for (size_t v = 0; v < r->n_vars; v++)
    n_sparse += r->vars[v].kind == TSR_VAR_ROW_SPARSE;
  if (r->n_ps < 1 && (!r->hybrid || n_sparse > 0)) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "configure: no PS address given");
    goto out;
  }
  if (r->hybrid) {
    /* the dense variables must fit, before anything is allocated */
    uint64_t avail;
    tsr_mem_source src;
    char desc[300];
    tsr_mem_available("", 0, &avail, &src, desc, sizeof desc);
    if ((rc = wk__hy_check_memory(r, avail, desc, err, errlen))) goto out;
    /* no table on a PS: no clock protocol either */
    if (n_sparse == 0) r->job.mode = TSR_MODE_ASYNC;
  }
  kern_prec prec = r->job.precision == TSR_PREC_BF16   ? KERN_BF16
                   : r->job.precision == TSR_PREC_FP16 ? KERN_F16
                                                       : KERN_F32;
  if ((rc = wk_exec_open(r->model, r->kc, r->job.batch_size, prec, &r->ex,
                         err, errlen)))
    goto out;
  if ((rc = alloc_buffers(r, err, errlen))) goto out;

  if ((rc = wk__ps_reconnect(s, r->ps_addrs, r->n_ps, &r->kv, err, errlen)))
    goto out;
  /* the worker id, the mode (ssp/sync: a PS may hold calls) and the
   * layout, for the PS client */
  if ((rc = wk__xfer_configure(s, r, err, errlen))) goto out;
  /* ssp and sync: a configured worker is a member from the start (so the
   * first steps of a sync run wait for every worker); every closure joins
   * again (clock.c) */
  r->clock = 0;
  if (r->job.mode != TSR_MODE_ASYNC &&
      (rc = wk__clock_join(s, r, 0, tsr_now_ms() + s->ps_deadline_ms, err,
                           errlen)))
    goto out;
  /* dense "allreduce": the dense values and the ring, last (the other
   * workers are configured meanwhile) */
  if (r->hybrid && (rc = wk__hy_configure(s, r, q, err, errlen))) goto out;

  if (strcmp(kern_backend_name(r->kc), "cpu") == 0)
    snprintf(r->device, sizeof r->device, "cpu");
  else
    snprintf(r->device, sizeof r->device, "cuda:%d",
             kern_device_index(r->kc));
  char summary[4096];
  tsr_model_summary(r->model, summary, sizeof summary);
  j->strs[0] = strdup(r->device);
  j->strs[1] = strdup(summary);
  if (!j->strs[0] || !j->strs[1]) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    goto out;
  }
  tessera__worker__configure_response__init(&j->out.cfg);
  j->out.cfg.device = j->strs[0];
  j->out.cfg.examples = schema->n_examples;
  j->out.cfg.model_summary = j->strs[1];
  {
    const float *ia, *ib;
    int64_t nd = wk_input_affine(r->in, &ia, &ib);
    if (nd > 0 && (j->affine = malloc((size_t)(2 * nd) * sizeof(float)))) {
      memcpy(j->affine, ia, (size_t)nd * sizeof(float));
      memcpy(j->affine + nd, ib, (size_t)nd * sizeof(float));
      j->out.cfg.n_input_scale = j->out.cfg.n_input_shift = (size_t)nd;
      j->out.cfg.input_scale = j->affine;
      j->out.cfg.input_shift = j->affine + nd;
    }
    const char *in_names[64];
    int64_t in_first[64];
    int ni = nd > 0 ? tsr_model_inputs(r->model, in_names, in_first, 64) : 0;
    if (ni > 64) ni = 0; /* more than an export needs to tell apart */
    if (ni > 0 && (j->names = calloc((size_t)ni, sizeof *j->names)) &&
        (j->cols = malloc((size_t)ni * sizeof *j->cols))) {
      bool all = true;
      j->n_names = ni;
      for (int i = 0; i < ni; i++) {
        j->names[i] = strdup(in_names[i]);
        j->cols[i] = in_first[i];
        all = all && j->names[i];
      }
      if (all) {
        j->out.cfg.n_input_names = j->out.cfg.n_input_columns = (size_t)ni;
        j->out.cfg.input_names = j->names;
        j->out.cfg.input_columns = j->cols;
      }
    }
  }
  tsr_info("configured for run %llu: worker %d of %d, %zu variables in %d "
           "shards over %d PS, %s, %lld examples per epoch",
           (unsigned long long)r->run_id, r->worker_index, r->num_workers,
           r->n_vars, r->n_shards, r->n_ps, r->device,
           (long long)schema->n_examples);
  s->run = r;
  pthread_mutex_lock(&s->mu);
  snprintf(s->state, sizeof s->state, "configured");
  snprintf(s->device, sizeof s->device, "%s", r->device);
  s->run_id = r->run_id;
  pthread_mutex_unlock(&s->mu);
  return 0;
out:
  wk__run_free(r);
  return rc;
}

static void run_job(wk_svc *s, wk_job *j) {
  switch (j->kind) {
    case WK_JOB_CONFIGURE: j->rc = do_configure(s, j); break;
    case WK_JOB_RUN: j->rc = wk__run_closure(s, s->run, j); break;
    case WK_JOB_EVAL: j->rc = wk__run_eval(s, s->run, j); break;
    case WK_JOB_DENSE: j->rc = wk__hy_get(s->run, j); break;
    case WK_JOB_DENSE_SET: j->rc = wk__hy_set(s->run, j); break;
  }
  if (j->rc < 0 && j->err[0] == '\0')
    snprintf(j->err, sizeof j->err, "%s", tsr_strerror(j->rc));
}

void *wk__thread_main(void *arg) {
  wk_svc *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (tsr_list_empty(&s->jobs) && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) {
      pthread_mutex_unlock(&s->mu);
      break;
    }
    wk_job *j = tsr_list_entry(tsr_list_first(&s->jobs), wk_job, node);
    tsr_list_remove(&j->node);
    if (j->kind == WK_JOB_RUN && s->run)
      snprintf(s->state, sizeof s->state, "running");
    pthread_mutex_unlock(&s->mu);

    run_job(s, j);

    pthread_mutex_lock(&s->mu);
    if (j->rc < 0) {
      snprintf(s->last_error, sizeof s->last_error, "%s", j->err);
      if (j->kind == WK_JOB_RUN || !s->run)
        snprintf(s->state, sizeof s->state, s->run ? "failed" : "idle");
    } else if (j->kind == WK_JOB_RUN) {
      snprintf(s->state, sizeof s->state, "configured");
    }
    tsr_list_push_back(&s->done, &j->node);
    pthread_mutex_unlock(&s->mu);
    wk__svc_wake(s);
  }
  wk__run_free(s->run);
  s->run = NULL;
  pthread_mutex_lock(&s->mu);
  s->thread_exited = true;
  pthread_mutex_unlock(&s->mu);
  wk__svc_wake(s);
  return NULL;
}
