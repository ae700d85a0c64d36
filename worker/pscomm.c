/* The worker's side of the parameter servers: one ps_client per PS, and
 * groups of pulls and pushes the training thread waits for together.
 *
 * Happy path: the training thread fills an array of wk_op (one per shard),
 * wk__ps_run() queues them and wakes the loop; the loop issues every one
 * at once through ps_client (one connection per PS, so shards of different
 * PS move in parallel), each completion lands in the group under the
 * service mutex, and the last one wakes the thread. Pulls land straight in
 * the caller's parameter buffers and pushes are sent from its gradient
 * buffers: nothing is copied here.
 * Failure modes: a call the client refuses at once and a call that fails
 * later (PS gone: TSR_ECLOSED / TSR_EUNAVAIL / TSR_ETIMEOUT, or the PS's
 * own error) both complete the op with that code; the group keeps the
 * first failure with a message naming the PS, its address, the variable
 * and the shard, and still waits for every op so no buffer is touched
 * after the thread moves on. In ssp and sync modes a PS holds calls until
 * the other workers catch up; when one PS connection drops then, the
 * calls held on the others would wait for a step that may never come, so
 * every client is closed (failing what is in flight) and made again, and
 * the closure fails at once naming the lost PS. Every lost connection is
 * counted, so a closure also stops when a PS went away and came back
 * between two of its steps (its shards are then not the ones this closure
 * computed against).
 */
#include "worker/loop_int.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reset_clients(wk_svc *s);

static const char *op_name(wk_op_kind k) {
  switch (k) {
    case WK_OP_PULL: return "pull";
    case WK_OP_PULL_ROWS: return "pull rows";
    case WK_OP_PUSH: return "push";
    case WK_OP_PUSH_ROWS: return "push rows";
    case WK_OP_PUSH_PULL: return "push-pull";
    case WK_OP_PUSH_PULL_ROWS: return "push-pull rows";
    case WK_OP_CLOCK: return "clock";
  }
  return "?";
}

typedef struct {
  wk_svc *svc;
  wk_op *op;
} op_ctx;

/* Records one completion; the caller holds nothing. */
static void op_finish(wk_svc *s, wk_op *op, int status, const char *msg,
                      int64_t step, const ps_result *res) {
  pthread_mutex_lock(&s->mu);
  s->ps_inflight--;
  wk_group *g = op->group;
  if (status < 0 && g->rc == 0 && status == TSR_ESHUTDOWN && s->ps_lost[0]) {
    g->rc = TSR_ECLOSED;
    snprintf(g->err, sizeof g->err, "%s", s->ps_lost);
  } else if (status < 0 && g->rc == 0) {
    g->rc = status;
    const char *addr =
        op->ps >= 0 && op->ps < s->n_ps ? s->ps_addrs[op->ps] : "?";
    if (op->kind == WK_OP_CLOCK)
      snprintf(g->err, sizeof g->err, "ps:%d (%s): clock: %s", op->ps, addr,
               msg ? msg : tsr_strerror(status));
    else
      snprintf(g->err, sizeof g->err, "ps:%d (%s): %s %s shard %d: %s",
               op->ps, addr, op_name(op->kind), op->name, op->shard,
               msg ? msg : tsr_strerror(status));
  }
  if (status == 0) {
    if (step > g->max_step) g->max_step = step;
    if (step >= 0 && step < g->min_step) g->min_step = step;
    if (res) {
      op->min_clock = res->min_clock;
      op->clock = res->clock;
      op->era_out = res->era;
    }
  }
  if (--g->pending == 0) pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void on_result(const ps_result *r, void *data) {
  op_ctx *c = data;
  op_finish(c->svc, c->op, r->status, r->message, r->step, r);
  free(c);
}

static int issue_one(wk_svc *s, wk_op *op, op_ctx *c) {
  if (op->ps < 0 || op->ps >= s->n_ps || !s->ps[op->ps]) return TSR_EUNAVAIL;
  ps_client *pc = s->ps[op->ps];
  int w = s->ps_worker;
  ps_client_set_era(pc, op->era);
  size_t gbytes = op->grad_floats * sizeof(float);
  switch (op->kind) {
    case WK_OP_PULL:
      return ps_client_pull(pc, op->name, op->shard, w, op->pull_clock,
                            op->dst, op->dst_floats, on_result, c);
    case WK_OP_PULL_ROWS:
      return ps_client_pull_rows(pc, op->name, op->shard, w, op->pull_clock,
                                 op->pull_ids, op->n_pull, op->dst,
                                 op->width, on_result, c);
    case WK_OP_PUSH:
      return ps_client_push(pc, op->name, op->shard, w, op->step, PS_DT_F32,
                            op->grad, gbytes, on_result, c);
    case WK_OP_PUSH_ROWS:
      return ps_client_push_rows(pc, op->name, op->shard, w, op->step,
                                 PS_DT_F32, op->ids, op->n_ids, op->grad,
                                 gbytes, on_result, c);
    case WK_OP_PUSH_PULL:
      return ps_client_push_pull(pc, op->name, op->shard, w, op->step,
                                 PS_DT_F32, op->grad, gbytes, op->dst,
                                 op->dst_floats, on_result, c);
    case WK_OP_PUSH_PULL_ROWS:
      return ps_client_push_pull_rows(
          pc, op->name, op->shard, w, op->step, PS_DT_F32, op->ids,
          op->n_ids, op->grad, gbytes, op->pull_ids, op->n_pull, op->dst,
          op->width, on_result, c);
    case WK_OP_CLOCK:
      if (op->clock_op == PS_CLOCK_JOIN)
        return ps_client_join(pc, w, op->step, op->run, op->closure,
                              on_result, c);
      return ps_client_clock(pc, w, op->step, op->clock_op, on_result, c);
  }
  return TSR_EINVAL;
}

void wk__ps_issue(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  wk_op *list = s->ops;
  s->ops = s->ops_tail = NULL;
  bool want = s->want_connect;
  pthread_mutex_unlock(&s->mu);
  if (s->ps_reset) {
    s->ps_reset = false;
    if (!s->closing_ps) reset_clients(s);
  }

  if (want) {
    char err[WK_ERR_MAX] = "";
    int rc = wk__ps_connect(s, s->want_addrs, s->want_n, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    s->want_connect = false;
    s->connect_rc = rc;
    snprintf(s->connect_err, sizeof s->connect_err, "%s", err);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
  }

  while (list) {
    wk_op *op = list;
    list = op->next;
    /* A PS connection lost since the closure began (counted here on the
     * loop, so never between a check and the issue): do not start the
     * call, the closure is over. */
    pthread_mutex_lock(&s->mu);
    bool lost = op->group->check_losses && op->group->losses != s->ps_losses;
    char msg[WK_ERR_MAX];
    if (lost) snprintf(msg, sizeof msg, "%s", s->ps_loss_msg);
    s->ps_inflight++;
    pthread_mutex_unlock(&s->mu);
    if (lost) {
      op_finish(s, op, TSR_ECLOSED, msg, -1, NULL);
      continue;
    }
    op_ctx *c = malloc(sizeof *c);
    int rc = c ? 0 : TSR_ENOMEM;
    if (c) {
      c->svc = s;
      c->op = op;
      rc = issue_one(s, op, c);
      if (rc < 0) free(c);
    }
    if (rc < 0)
      op_finish(s, op, rc,
                rc == TSR_EUNAVAIL ? "not reachable (connection down, "
                                     "reconnecting)"
                                   : tsr_strerror(rc),
                -1, NULL);
  }
}

int wk__ps_run(wk_svc *s, wk_op *ops, int n, wk_group *g) {
  /* check_losses and losses are the caller's */
  g->pending = n;
  g->rc = 0;
  g->err[0] = '\0';
  g->max_step = -1;
  g->min_step = INT64_MAX;
  if (n == 0) return 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    ops[i].group = g;
    ops[i].next = NULL;
    if (s->ops_tail)
      s->ops_tail->next = &ops[i];
    else
      s->ops = &ops[i];
    s->ops_tail = &ops[i];
  }
  pthread_mutex_unlock(&s->mu);
  wk__svc_wake(s);
  pthread_mutex_lock(&s->mu);
  while (g->pending > 0) pthread_cond_wait(&s->cv, &s->mu);
  int rc = g->rc;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static void on_ps_state(tsr_rpc_client *rc_cl, int connected, int status,
                        void *data);
static void on_ps_closed(void *data);

/* Closes every client and makes a new one for the same address (loop
 * thread): calls in flight fail with TSR_ESHUTDOWN. */
static void reset_clients(wk_svc *s) {
  for (int i = 0; i < s->n_ps; i++) {
    ps_client *old = s->ps[i];
    s->ps[i] = NULL;
    if (ps_client_new(&s->ps[i], s->rpc, s->ps_addrs[i]) == 0) {
      if (s->ps_deadline_ms) ps_client_set_deadline(s->ps[i], s->ps_deadline_ms);
      tsr_rpc_client_on_state(ps_client_rpc(s->ps[i]), on_ps_state, s);
    } else {
      s->ps[i] = NULL; /* issue_one answers TSR_EUNAVAIL */
    }
    if (old) {
      s->ps_closing++;
      ps_client_close(old, on_ps_closed, s);
    }
  }
}

static void on_ps_state(tsr_rpc_client *rc_cl, int connected, int status,
                        void *data) {
  wk_svc *s = data;
  if (connected || s->closing_ps) return;
  int i = 0;
  while (i < s->n_ps && (!s->ps[i] || ps_client_rpc(s->ps[i]) != rc_cl)) i++;
  if (i == s->n_ps) return;
  pthread_mutex_lock(&s->mu);
  s->ps_losses++;
  snprintf(s->ps_loss_msg, sizeof s->ps_loss_msg,
           "ps:%d (%s) lost its connection (%s)", i, s->ps_addrs[i],
           tsr_strerror(status));
  bool reset = s->ps_hold && s->ps_inflight > 0;
  if (reset)
    snprintf(s->ps_lost, sizeof s->ps_lost,
             "ps:%d (%s) lost its connection (%s); the calls held on the "
             "other PS were given up", i, s->ps_addrs[i],
             tsr_strerror(status));
  pthread_mutex_unlock(&s->mu);
  if (!reset) return;
  tsr_warn("%s", s->ps_lost);
  /* Not from inside the client's own callback: on the next wake. */
  s->ps_reset = true;
  wk__svc_wake(s);
}

static void on_ps_closed(void *data) {
  wk_svc *s = data;
  s->ps_closing--;
}

void wk__ps_close_all(wk_svc *s) {
  for (int i = 0; i < s->n_ps; i++) {
    if (s->ps[i]) {
      s->ps_closing++;
      ps_client_close(s->ps[i], on_ps_closed, s);
    }
    free(s->ps_addrs[i]);
  }
  free(s->ps);
  free(s->ps_addrs);
  s->ps = NULL;
  s->ps_addrs = NULL;
  s->n_ps = 0;
}

int wk__ps_connect(wk_svc *s, char *const *addrs, int n, char *err,
                   size_t errlen) {
  /* The same layout keeps its connections (a chief reconfiguring). */
  bool same = n == s->n_ps;
  for (int i = 0; same && i < n; i++)
    same = strcmp(addrs[i], s->ps_addrs[i]) == 0;
  if (same) return 0;
  if (s->closing_ps) {
    snprintf(err, errlen, "shutting down: no new PS connections");
    return TSR_ESHUTDOWN;
  }
  wk__ps_close_all(s);
  if (n == 0) return 0;
  s->ps = calloc((size_t)n, sizeof *s->ps);
  s->ps_addrs = calloc((size_t)n, sizeof *s->ps_addrs);
  if (!s->ps || !s->ps_addrs) {
    free(s->ps);
    free(s->ps_addrs);
    s->ps = NULL;
    s->ps_addrs = NULL;
    snprintf(err, errlen, "out of memory for %d PS clients", n);
    return TSR_ENOMEM;
  }
  s->n_ps = n;
  for (int i = 0; i < n; i++) {
    s->ps_addrs[i] = strdup(addrs[i]);
    int rc = s->ps_addrs[i] ? ps_client_new(&s->ps[i], s->rpc, addrs[i])
                            : TSR_ENOMEM;
    if (rc < 0) {
      snprintf(err, errlen, "ps:%d (%s): cannot make a client: %s", i,
               addrs[i], tsr_strerror(rc));
      wk__ps_close_all(s);
      return rc;
    }
    if (s->ps_deadline_ms) ps_client_set_deadline(s->ps[i], s->ps_deadline_ms);
    tsr_rpc_client_on_state(ps_client_rpc(s->ps[i]), on_ps_state, s);
  }
  return 0;
}

int wk__ps_reconnect(wk_svc *s, char *const *addrs, int n, char *err,
                     size_t errlen) {
  pthread_mutex_lock(&s->mu);
  s->want_addrs = (char **)addrs;
  s->want_n = n;
  s->want_connect = true;
  pthread_mutex_unlock(&s->mu);
  wk__svc_wake(s);
  pthread_mutex_lock(&s->mu);
  while (s->want_connect) pthread_cond_wait(&s->cv, &s->mu);
  int rc = s->connect_rc;
  if (rc < 0) snprintf(err, errlen, "%s", s->connect_err);
  s->want_addrs = NULL;
  pthread_mutex_unlock(&s->mu);
  return rc;
}
