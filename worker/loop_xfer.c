/* A step's traffic with the parameter servers, one ticket per variable
 * (ps/client/client.h, ps_kv), so communication overlaps compute.
 *
 * Happy path, per step: the forward pass waits for each variable's pull
 * only when it first reads it (param_need hook, first layer first), the
 * backward pass pushes each variable's gradient as soon as it is final
 * (grad_ready hook, last layer first). In async mode each dense
 * variable's pull for the next step goes out right behind its push (the
 * backward pass no longer reads its values, test_overlap), so the first
 * layer, pushed last and needed first, is on its way back before the
 * step's bookkeeping and the next batch; the remaining pulls (row-sparse
 * rows, whose ids come with the next batch, and every pull of ssp/sync)
 * go out in model order once the next batch is prepared, so the next
 * forward starts as soon as its first layer has arrived. A push is
 * waited for only when the next forward pass reaches its variable (just
 * before the backward pass would write its buffer again), and a
 * row-sparse variable's before its id buffers are reused. With
 * prefetch_params (async) the next step's dense values are pulled into a
 * second set of buffers at the start of this step, while it computes:
 * steps alternate between the two sets, each with its own tickets
 * (row-sparse variables keep one set).
 * ssp and sync: every request carries the closure's count of lost
 * connections, so a PS that went away and came back mid-closure fails the
 * calls at issue. async: the calls to a PS that went away wait for it to
 * be back and restored (the PS client sends them again), the others go
 * on.
 * Failure modes: a refused submission or a failed ticket records the
 * first failure (rc, err naming the PS, variable and shard) in r->xs; a
 * hook that fails stops the compute with that code. Every ticket is
 * waited for before the closure ends (wk__xfer_drain), so no buffer is
 * touched by the PS client after the thread moves on.
 */
#include "worker/loop_run.h"

#include "common/clock.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *const *wk__set_param(wk_run *r, int k) {
  return k && r->param1 ? r->param1 : r->param;
}
float *const *wk__set_grad(wk_run *r, int k) {
  return k && r->grad1 ? r->grad1 : r->grad;
}

static bool sparse_var(const wk_run *r, int v) {
  return r->vars[v].kind == TSR_VAR_ROW_SPARSE;
}

/* Whether v lives on the PS (dense "allreduce": the dense ones do not). */
static bool on_ps(const wk_run *r, int v) {
  return !r->hybrid || sparse_var(r, v);
}

/* v's index in the PS client's layout. */
static int kv_index(const wk_run *r, int v) {
  return r->kv_var ? r->kv_var[v] : v;
}

/* The ticket slot of variable v for set k: row-sparse variables have one
 * set of buffers, so one slot. */
static int slot(const wk_run *r, int v, int k) {
  return sparse_var(r, v) ? 0 : k;
}

static void note_fail(wk_run *r, int rc, const char *msg) {
  if (r->xs.rc == 0 && rc < 0) {
    r->xs.rc = rc;
    snprintf(r->xs.err, sizeof r->xs.err, "%s", msg && *msg ? msg
                                                : tsr_strerror(rc));
  }
}

int wk__xfer_configure(wk_svc *s, wk_run *r, char *err, size_t errlen) {
  ps_kv_var *vars = calloc(r->n_vars ? r->n_vars : 1, sizeof *vars);
  r->xf = calloc(r->n_vars ? r->n_vars : 1, sizeof *r->xf);
  if (r->hybrid) r->kv_var = calloc(r->n_vars ? r->n_vars : 1, sizeof(int));
  int rc = vars && r->xf && (!r->hybrid || r->kv_var) ? 0 : TSR_ENOMEM;
  if (rc) {
    snprintf(err, errlen, "out of memory for the PS layout");
    goto out;
  }
  /* the variables on the PS, in model order */
  int nk = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->kv_var) r->kv_var[v] = on_ps(r, (int)v) ? nk : -1;
    if (!on_ps(r, (int)v)) continue;
    vars[nk++] = (ps_kv_var){.var = &r->vars[v],
                             .n_shards = r->var_first[v + 1] - r->var_first[v],
                             .shards = r->shards + r->var_first[v]};
  }
  r->wire = r->job.wire_precision == TSR_PREC_BF16 ? PS_DT_BF16 : PS_DT_F32;
  r->prefetch = r->job.prefetch_params && r->job.mode == TSR_MODE_ASYNC;
  r->defer_push = r->job.optimizer.clipnorm > 0 ||
                  r->job.optimizer.global_clipnorm > 0;
  ps_kv_config c = {.worker = r->worker_index,
                    .hold = r->job.mode != TSR_MODE_ASYNC,
                    .wait_lost = r->job.mode == TSR_MODE_ASYNC,
                    .wire = r->wire,
                    .deadline_ms = s->ps_deadline_ms,
                    .vars = vars,
                    .n_vars = nk};
  char kerr[WK_ERR_MAX];
  if ((rc = ps_kv_configure(r->kv, &c, kerr, sizeof kerr)))
    snprintf(err, errlen, "PS client: %s", kerr);
out:
  free(vars);
  return rc;
}

void wk__xfer_begin(wk_run *r, tsr_trace *tr, int32_t tpid) {
  memset(&r->xs, 0, sizeof r->xs);
  r->xs.max_step = -1;
  r->xs.min_step = INT64_MAX;
  r->xs.tr = tr;
  r->xs.tpid = tpid;
  r->cur = 0;
}

int wk__xfer_wait(wk_run *r, ps_ticket *t, bool push, const char *what) {
  if (!*t) return 0;
  bool blocked = !ps_kv_done(r->kv, *t);
  double t0 = tsr_now_s();
  int64_t w0 = r->xs.tr && blocked ? tsr_trace_now_us() : 0;
  ps_kv_result res;
  int rc = ps_kv_wait(r->kv, *t, &res);
  *t = 0;
  double dt = tsr_now_s() - t0;
  if (push)
    r->xs.wait_push_s += dt;
  else
    r->xs.wait_pull_s += dt;
  if (r->xs.tr && what) {
    char name[TSR_TRACE_NAME_MAX];
    snprintf(name, sizeof name, "%s %s", push ? "push" : "pull", what);
    /* the call on the traffic track; the wait, if any, on the step's */
    tsr_trace_complete(r->xs.tr, r->xs.tpid, 2, "ps", name, res.submit_us,
                       res.done_us - res.submit_us);
    if (blocked) {
      snprintf(name, sizeof name, "wait %s", what);
      tsr_trace_end(r->xs.tr, r->xs.tpid, 1, "wait", name, w0);
    }
  }
  if (rc) {
    note_fail(r, rc, res.err);
    return rc;
  }
  if (res.max_step > r->xs.max_step) r->xs.max_step = res.max_step;
  if (res.min_step < r->xs.min_step) r->xs.min_step = res.min_step;
  return 0;
}

/* ssp, sync: a call after a PS connection was lost fails (the PS may be
 * back without the shards this closure computed against, and the chief
 * rewinds every PS). async: a lost PS is restored alone from the
 * checkpoint while the others keep theirs, and its calls wait for it
 * (wait_lost), so the closure goes on. */
static unsigned check_flags(const wk_run *r) {
  return r->job.mode == TSR_MODE_ASYNC ? 0u : PS_KV_CHECK_LOSSES;
}

/* Submits the pull of variable v into set k for the step `clock`. */
static int pull_var(wk_run *r, int v, int k, int64_t clock) {
  bool sp = sparse_var(r, v);
  if (!on_ps(r, v)) return 0; /* its values are here */
  ps_kv_item it = {.var = kv_index(r, v), .dst = wk__set_param(r, k)[v]};
  if (sp) {
    if (r->n_nxt[v] == 0) return 0; /* no row to fetch */
    it.dst = r->param[v];
    it.pull_ids = r->ids_nxt[v];
    it.n_pull = (size_t)r->n_nxt[v];
  }
  ps_kv_request q = {.kind = PS_KV_PULL, .items = &it, .n_items = 1,
                     .clock = clock,
                     .flags = check_flags(r) |
                              (r->plain_reads ? PS_KV_NO_ERA : 0u),
                     .losses = r->losses};
  ps_ticket *t = &r->xf[v].pull[slot(r, v, k)];
  if (*t) { /* never two pulls into one buffer */
    int rc = wk__xfer_wait(r, t, false, r->vars[v].name);
    if (rc) return rc;
  }
  int rc = ps_kv_submit(r->kv, &q, t);
  if (rc) {
    char msg[WK_ERR_MAX];
    snprintf(msg, sizeof msg, "pull %s: the PS client refused it: %s",
             r->vars[v].name, tsr_strerror(rc));
    note_fail(r, rc, msg);
  }
  return rc;
}

int wk__xfer_pull(wk_run *r, int k, int64_t clock, bool dense,
                  bool sparse) {
  for (size_t v = 0; v < r->n_vars; v++) {
    if (sparse_var(r, (int)v) ? !sparse : !dense) continue;
    if (r->xf[v].early) { /* already on its way */
      r->xf[v].early = false;
      continue;
    }
    int rc = pull_var(r, (int)v, k, clock);
    if (rc) return rc;
  }
  return 0;
}

int wk__xfer_wait_pulls(wk_run *r, int k) {
  int first = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    int rc = wk__xfer_wait(r, &r->xf[v].pull[slot(r, (int)v, k)], false,
                           r->vars[v].name);
    if (rc && !first) first = rc;
  }
  return first;
}

int wk__xfer_wait_pushes(wk_run *r, int k, bool dense, bool sparse) {
  int first = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (sparse_var(r, (int)v) ? !sparse : !dense) continue;
    int rc = wk__xfer_wait(r, &r->xf[v].push[slot(r, (int)v, k)], true,
                           r->vars[v].name);
    if (rc && !first) first = rc;
  }
  return first;
}

int wk__xfer_wait_var_push(wk_run *r, int v) {
  int a = wk__xfer_wait(r, &r->xf[v].push[0], true, r->vars[v].name);
  int b = wk__xfer_wait(r, &r->xf[v].push[1], true, r->vars[v].name);
  return a ? a : b;
}

int wk__xfer_drain(wk_run *r) {
  int first = 0;
  for (size_t v = 0; r->xf && v < r->n_vars; v++)
    for (int k = 0; k < 2; k++) {
      r->xf[v].early = false;
      int a = wk__xfer_wait(r, &r->xf[v].push[k], true, r->vars[v].name);
      int b = wk__xfer_wait(r, &r->xf[v].pull[k], false, r->vars[v].name);
      if (!first) first = a ? a : b;
    }
  return first;
}

/* ---- the compute hooks ---------------------------------------------------*/

/* Before the forward pass reads v: its values, and the end of the last
 * push from the gradient buffer the backward pass is about to write (on
 * the same connections, that push was answered before this pull, so it
 * costs no wait of its own). */
static int hook_need(void *arg, int v) {
  wk_run *r = arg;
  int k = slot(r, v, r->hook_set);
  int rc = wk__xfer_wait(r, &r->xf[v].pull[k], false, r->vars[v].name);
  if (!rc) rc = wk__xfer_wait(r, &r->xf[v].push[k], true, r->vars[v].name);
  return rc;
}

static void push_var(wk_run *r, int v, int k) {
  if (!on_ps(r, v)) return; /* all-reduced instead (hybrid.c) */
  ps_kv_item it = {.var = kv_index(r, v), .grad = wk__set_grad(r, k)[v]};
  if (sparse_var(r, v)) {
    it.grad = r->grad[v];
    it.ids = r->ids_cur[v];
    it.n_ids = (size_t)r->n_cur[v];
  }
  ps_kv_request q = {.kind = PS_KV_PUSH, .items = &it, .n_items = 1,
                     .step = r->hook_step, .flags = check_flags(r),
                     .losses = r->losses};
  int rc = ps_kv_submit(r->kv, &q, &r->xf[v].push[slot(r, v, k)]);
  if (!rc) r->xs.pushed = true;
  if (rc) {
    char msg[WK_ERR_MAX];
    snprintf(msg, sizeof msg, "push %s: the PS client refused it: %s",
             r->vars[v].name, tsr_strerror(rc));
    note_fail(r, rc, msg);
  }
}

/* v's gradient is final: push it. In async mode a dense variable's next
 * values are pulled right behind the push (the PS answers in order, so
 * the pull sees it applied): the backward pass no longer reads v, and the
 * first layer, the last pushed and the first the next forward needs,
 * starts back while the rest of the step's work goes on. With the layer
 * in several shards the PS applies and answers one while the next
 * arrives. */
static void hook_ready(void *arg, int v) {
  wk_run *r = arg;
  if (!on_ps(r, v)) { /* dense "allreduce": its bucket */
    wk__hy_ready(r, v);
    return;
  }
  if (r->defer_push) return;
  push_var(r, v, r->hook_set);
  if (r->early_pull && !sparse_var(r, v) && !r->xs.rc &&
      !pull_var(r, v, r->hook_set, r->hook_step + 1))
    r->xf[v].early = true;
}

int wk__xfer_push_all(wk_run *r, int k, int64_t step) {
  r->hook_step = step;
  for (size_t v = r->n_vars; v-- > 0;) push_var(r, (int)v, k);
  return r->xs.rc;
}

void wk__xfer_hooks(wk_run *r, wk_run_opts *ro, int k, int64_t step) {
  r->hook_set = k;
  r->hook_step = step;
  ro->param_need = hook_need;
  ro->grad_ready = hook_ready;
  ro->hook_arg = r;
}

/* ---- clocks --------------------------------------------------------------*/

int wk__xfer_clock_submit(wk_run *r, ps_clock_op op, int64_t clock,
                          ps_ticket *t) {
  int rc = ps_kv_clock(r->kv, op, clock, check_flags(r), r->losses, t);
  if (rc) {
    char msg[WK_ERR_MAX];
    snprintf(msg, sizeof msg, "clock: the PS client refused it: %s",
             tsr_strerror(rc));
    note_fail(r, rc, msg);
  }
  return rc;
}

int wk__xfer_clock(wk_run *r, ps_clock_op op, int64_t clock, bool check,
                   int64_t *min_clock) {
  ps_ticket t;
  int rc = ps_kv_clock(r->kv, op, clock, check ? check_flags(r) : 0,
                       r->losses, &t);
  if (rc) {
    note_fail(r, rc, "clock: the PS client refused it");
    return rc;
  }
  ps_kv_result res;
  rc = ps_kv_wait(r->kv, t, &res);
  if (rc) {
    note_fail(r, rc, res.err);
    return rc;
  }
  if (min_clock) *min_clock = res.min_clock;
  return 0;
}
