/* The multi-PS client's loop side (client.h, "tickets over a shard
 * layout"): issuing queued calls, their completions, connection resets and
 * the life cycle; the submitting side is client_kv.c.
 *
 * Happy path: the async handle wakes the loop, which issues every queued
 * call through the per-PS ps_client (one connection per PS, in submission
 * order) and records each completion in its ticket slot; the last one
 * stamps the ticket done and wakes the waiters. bfloat16 values are read
 * into the first half of the caller's float destination and widened there
 * in place.
 * Failure modes: a call the client refuses at once and a call that fails
 * later both complete with their code; the ticket keeps the first failure
 * with a message naming the PS, its address, the variable and the shard.
 * A connection lost while calls are in flight in hold mode resets every
 * connection (on the next loop wake, never from inside a client callback);
 * calls failed by that reset report TSR_ECLOSED naming the lost PS. Calls
 * of a request that asked to check losses fail at issue once any
 * connection was lost since the count it gave. With wait_lost (async) a
 * call that failed because its PS went away (the connection dropped, no
 * connection, or a PS started again without its variables yet) goes on
 * the retry list and is issued again by the retry timer, until its
 * deadline counted from its first issue; only then does it complete with
 * its failure. Cancel and close fail the queued and retried calls with
 * TSR_ESHUTDOWN; the calls in flight fail through their clients' close,
 * and the client is freed once every handle has closed.
 */
#include "ps/client/client_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "common/trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name(kv_kind k) {
  switch (k) {
    case KV_PULL: return "pull";
    case KV_PULL_ROWS: return "pull rows";
    case KV_PUSH: return "push";
    case KV_PUSH_ROWS: return "push rows";
    case KV_PUSH_PULL: return "push-pull";
    case KV_PUSH_PULL_ROWS: return "push-pull rows";
    case KV_CLOCK: return "clock";
  }
  return "?";
}


/* ---- completions (loop thread) ------------------------------------------ */

static void on_retry(uv_timer_t *t);

/* With hold (ssp, sync): a call that failed on its own (the PS refused
 * it, or it could not be sent; not given up by a reset or a cancel). The
 * caller's other pulls and pushes may be held by another PS for a step
 * that will not come now (this PS came back without its shards, say, and
 * the other workers wait as this one does): waiting for them would wait
 * out their deadline. So, when the failed call is a pull or a push, or
 * pulls or pushes are in flight: the loss count goes up (calls checking
 * it that are not sent yet fail at issue, naming this failure) and the
 * calls in flight are given up (TSR_ECLOSED) by resetting every
 * connection on the next wake. A clock call that fails with nothing else
 * out (a JOIN retried while a PS is down) changes nothing. */
static void give_up_held(ps_kv *kv, const kv_call *c, int status,
                         const char *why) {
  if (!why || !*why) why = tsr_strerror(status);
  pthread_mutex_lock(&kv->mu);
  bool own = !(status == TSR_ESHUTDOWN && c->gen != kv->gen) &&
             !kv->cancelled;
  bool data = c->kind != KV_CLOCK;
  int others = kv->inflight_data - data; /* c is still counted */
  bool give_up = kv->hold && own && (data || others > 0);
  bool reset = give_up && others > 0;
  if (give_up) {
    const char *addr = ps_kv_addr(kv, c->ps);
    if (data)
      snprintf(kv->loss_msg, sizeof kv->loss_msg, "ps:%d (%s): %s %s shard "
               "%d: %s", c->ps, addr, kind_name(c->kind),
               c->var >= 0 && c->var < kv->n_vars ? kv->vars[c->var].name
                                                  : "?",
               c->shard, why);
    else
      snprintf(kv->loss_msg, sizeof kv->loss_msg, "ps:%d (%s): clock: %s",
               c->ps, addr, why);
    kv->losses++;
  }
  if (reset) {
    snprintf(kv->lost, sizeof kv->lost, "%.400s; the calls held on the "
             "other PS were given up", kv->loss_msg);
    kv->reset_wanted = true;
  }
  pthread_mutex_unlock(&kv->mu);
  if (reset) uv_async_send(&kv->async);
}

/* wait_lost: whether `c`, failed with `status`, waits for its PS (true:
 * it is on the retry list, no longer in flight, and the timer runs). A
 * connection that dropped or is not up (TSR_ECLOSED, TSR_EUNAVAIL), or a
 * PS that has lost its connection before and does not know the variable
 * (started again, not set up yet: TSR_ENOTFOUND); clocks never (ssp and
 * sync have no wait_lost), nor reads of an evaluation's snapshot: the
 * snapshot went with the PS, and a call waiting for it to come back would
 * hold the evaluation (and the worker's next job) until its deadline.
 * Loop thread. */
static bool retry_later(ps_kv *kv, kv_call *c, int status) {
  bool gone = status == TSR_ECLOSED || status == TSR_EUNAVAIL ||
              (status == TSR_ENOTFOUND && c->ps >= 0 && c->ps < kv->n_ps &&
               kv->ps_lost[c->ps] > 0);
  if (!gone || c->kind == KV_CLOCK || c->snapshot || kv->closing)
    return false;
  uint64_t now = tsr_now_ms();
  pthread_mutex_lock(&kv->mu);
  uint64_t limit = kv->deadline_ms ? kv->deadline_ms : 30000;
  bool go = kv->wait_lost && !kv->cancelled && c->first_ms &&
            now < c->first_ms + limit;
  if (go) {
    kv->inflight--;
    kv->inflight_data--;
    tsr_fifo_append(kv->r_head, kv->r_tail, c);
    kv->resent++;
  }
  pthread_mutex_unlock(&kv->mu);
  if (go && !uv_is_active((uv_handle_t *)&kv->retry))
    uv_timer_start(&kv->retry, on_retry, 100, 0);
  return go;
}

static void finish(ps_kv *kv, kv_call *c, int status, const char *msg,
                   int64_t step, int64_t min_clock, size_t bytes_in) {
  pthread_mutex_lock(&kv->mu);
  kv->inflight--;
  if (c->kind != KV_CLOCK) kv->inflight_data--;
  kv_slot *s = &kv->slots[c->slot];
  if (status == TSR_ESHUTDOWN && c->gen != kv->gen && !kv->cancelled) {
    status = TSR_ECLOSED; /* a reset gave it up */
    msg = kv->lost;
  }
  if (status < 0 && s->res.rc == 0) {
    s->res.rc = status;
    const char *addr = ps_kv_addr(kv, c->ps);
    const char *why = msg && *msg ? msg : tsr_strerror(status);
    char *err = s->res.err;
    size_t errlen = sizeof s->res.err;
    if (status == TSR_ECLOSED && msg == kv->lost)
      snprintf(err, errlen, "%s", kv->lost);
    else if (c->kind == KV_CLOCK)
      snprintf(err, errlen, "ps:%d (%s): clock: %s", c->ps, addr, why);
    else
      snprintf(err, errlen, "ps:%d (%s): %s %s shard %d: %s", c->ps, addr,
               kind_name(c->kind),
               c->var >= 0 && c->var < kv->n_vars ? kv->vars[c->var].name
                                                  : "?",
               c->shard, why);
  }
  if (status == 0) {
    if (step > s->res.max_step) s->res.max_step = step;
    if (step >= 0 && step < s->res.min_step) s->res.min_step = step;
    if (c->kind == KV_CLOCK && min_clock > s->res.min_clock)
      s->res.min_clock = min_clock;
    s->res.bytes_in += bytes_in;
  }
  if (--s->pending == 0) {
    s->res.done_us = tsr_trace_now_us();
    pthread_cond_broadcast(&kv->cv);
  }
  pthread_mutex_unlock(&kv->mu);
}

static bool is_pull(kv_kind k) {
  return k == KV_PULL || k == KV_PULL_ROWS || k == KV_PUSH_PULL ||
         k == KV_PUSH_PULL_ROWS;
}

static void on_result(const ps_result *r, void *data) {
  kv_call *c = data;
  if (r->status == 0 && c->wire == PS_DT_BF16 && is_pull(c->kind) &&
      c->dst_floats)
    ps__bf16_expand(c->dst, c->dst_floats);
  int64_t clock = r->min_clock;
  if (c->kind == KV_CLOCK && c->clock_op == PS_CLOCK_JOIN) {
    clock = r->clock;
    if (r->status == 0) c->kv->era[c->ps] = r->era; /* loop thread */
  }
  if (r->status < 0 && retry_later(c->kv, c, r->status)) return;
  if (r->status < 0) give_up_held(c->kv, c, r->status, r->message);
  finish(c->kv, c, r->status, r->message, r->step, clock, r->nbytes);
}

/* ---- issuing (loop thread) ---------------------------------------------- */

static int issue(ps_kv *kv, kv_call *c, int worker) {
  ps_client *pc = c->ps >= 0 && c->ps < kv->n_ps ? kv->cl[c->ps] : NULL;
  if (!pc) return TSR_EUNAVAIL;
  const char *name = c->var >= 0 ? kv->vars[c->var].name : NULL;
  size_t pb = c->dst_floats * ps__dtype_size(c->wire);
  ps_client_set_era(pc, c->flags & PS_KV_NO_ERA ? 0 : kv->era[c->ps]);
  ps_client_set_snapshot(pc, c->snapshot);
  switch (c->kind) {
    case KV_PULL:
      return ps_client_pull_as(pc, name, c->shard, worker, c->clock, c->wire,
                               c->dst, pb, on_result, c);
    case KV_PULL_ROWS:
      return ps_client_pull_rows_as(pc, name, c->shard, worker, c->clock,
                                    c->wire, c->pull_ids, c->n_pull, c->dst,
                                    pb, on_result, c);
    case KV_PUSH:
      return ps_client_push(pc, name, c->shard, worker, c->step, c->wire,
                            c->grad, c->grad_bytes, on_result, c);
    case KV_PUSH_ROWS:
      return ps_client_push_rows(pc, name, c->shard, worker, c->step, c->wire,
                                 c->ids, c->n_ids, c->grad, c->grad_bytes,
                                 on_result, c);
    case KV_PUSH_PULL:
    case KV_PUSH_PULL_ROWS:
      return ps_client_push_pull_as(pc, name, c->shard, worker, c->step,
                                    c->wire, c->ids, c->n_ids, c->grad,
                                    c->grad_bytes, c->pull_ids, c->n_pull,
                                    c->wire, c->dst, pb, on_result, c);
    case KV_CLOCK:
      if (c->clock_op == PS_CLOCK_JOIN)
        return ps_client_join(pc, worker, c->clock, c->run, c->closure,
                              on_result, c);
      return ps_client_clock(pc, worker, c->clock, c->clock_op, on_result, c);
  }
  return TSR_EINVAL;
}

static void on_state(tsr_rpc_client *rc, int connected, int status,
                     void *data);
static void on_client_closed(void *data);

/* Closes every client and makes a new one for the same address: calls in
 * flight fail with TSR_ESHUTDOWN (reported as the loss that caused it). */
static void reset_clients(ps_kv *kv) {
  pthread_mutex_lock(&kv->mu);
  kv->gen++;
  pthread_mutex_unlock(&kv->mu);
  for (int i = 0; i < kv->n_ps; i++) {
    ps_client *old = kv->cl[i];
    kv->cl[i] = NULL;
    if (ps_client_new(&kv->cl[i], kv->ctx, kv->addrs[i]) == 0) {
      kv->open_handles++;
      tsr_rpc_client_on_state(ps_client_rpc(kv->cl[i]), on_state, kv);
    } else {
      kv->cl[i] = NULL; /* its calls answer TSR_EUNAVAIL */
    }
    if (old) ps_client_close(old, on_client_closed, kv);
  }
}

static void on_async(uv_async_t *h) {
  ps_kv *kv = h->data;
  pthread_mutex_lock(&kv->mu);
  bool reset = kv->reset_wanted;
  kv->reset_wanted = false;
  pthread_mutex_unlock(&kv->mu);
  if (reset && !kv->closing) reset_clients(kv);
  pthread_mutex_lock(&kv->mu);
  kv_call *list = kv->q_head;
  kv->q_head = kv->q_tail = NULL;
  int worker = kv->worker;
  uint32_t deadline = kv->deadline_ms;
  pthread_mutex_unlock(&kv->mu);
  for (int i = 0; i < kv->n_ps; i++)
    if (kv->cl[i]) ps_client_set_deadline(kv->cl[i], deadline);
  while (list) {
    kv_call *c = list;
    list = c->next;
    char msg[512];
    pthread_mutex_lock(&kv->mu);
    bool lost = (c->flags & PS_KV_CHECK_LOSSES) && c->losses != kv->losses;
    bool cancelled = kv->cancelled;
    if (lost) snprintf(msg, sizeof msg, "%s", kv->loss_msg);
    kv->inflight++;
    if (c->kind != KV_CLOCK) kv->inflight_data++;
    c->gen = kv->gen;
    pthread_mutex_unlock(&kv->mu);
    if (cancelled) {
      finish(kv, c, TSR_ESHUTDOWN, "the PS client is closing", -1, -1, 0);
      continue;
    }
    if (lost) {
      finish(kv, c, TSR_ECLOSED, msg, -1, -1, 0);
      continue;
    }
    if (!c->first_ms) c->first_ms = tsr_now_ms();
    int rc = issue(kv, c, worker);
    if (rc < 0 && retry_later(kv, c, rc)) continue;
    if (rc < 0) {
      const char *why = rc == TSR_EUNAVAIL ? "not reachable (connection "
                                             "down, reconnecting)"
                                           : tsr_strerror(rc);
      give_up_held(kv, c, rc, why);
      finish(kv, c, rc, why, -1, -1, 0);
    }
  }
}

/* The retry timer: the calls waiting for their PS go out again (the RPC
 * client holds them until its connection is up, within their deadline). */
static void on_retry(uv_timer_t *t) {
  ps_kv *kv = t->data;
  pthread_mutex_lock(&kv->mu);
  kv_call *list = kv->r_head;
  kv->r_head = kv->r_tail = NULL;
  if (list) {
    kv_call *last = list;
    while (last->next) last = last->next;
    tsr_fifo_append_chain(kv->q_head, kv->q_tail, list, last);
  }
  pthread_mutex_unlock(&kv->mu);
  if (list) on_async(&kv->async);
}

static void on_state(tsr_rpc_client *rc, int connected, int status,
                     void *data) {
  ps_kv *kv = data;
  if (connected || kv->closing) return;
  int i = 0;
  while (i < kv->n_ps && (!kv->cl[i] || ps_client_rpc(kv->cl[i]) != rc)) i++;
  if (i == kv->n_ps) return;
  kv->ps_lost[i]++;
  pthread_mutex_lock(&kv->mu);
  kv->losses++;
  snprintf(kv->loss_msg, sizeof kv->loss_msg,
           "ps:%d (%s) lost its connection (%s)", i, kv->addrs[i],
           tsr_strerror(status));
  bool reset = kv->hold && kv->inflight > 0;
  if (reset)
    snprintf(kv->lost, sizeof kv->lost,
             "ps:%d (%s) lost its connection (%s); the calls held on the "
             "other PS were given up", i, kv->addrs[i],
             tsr_strerror(status));
  /* not from inside the client's own callback: on the next wake */
  if (reset) kv->reset_wanted = true;
  pthread_mutex_unlock(&kv->mu);
  if (!reset) return;
  tsr_warn("%s", kv->lost);
  uv_async_send(&kv->async);
}

/* ---- life cycle (loop thread) ------------------------------------------- */

int ps_kv_new(ps_kv **out, tsr_rpc_ctx *ctx, char *const *addrs, int n) {
  *out = NULL;
  if (n < 0 || (n && !addrs)) return TSR_EINVAL;
  ps_kv *kv = calloc(1, sizeof *kv);
  if (!kv) return TSR_ENOMEM;
  kv->ctx = ctx;
  kv->worker = -1;
  kv->addrs = calloc((size_t)(n ? n : 1), sizeof *kv->addrs);
  kv->cl = calloc((size_t)(n ? n : 1), sizeof *kv->cl);
  kv->era = calloc((size_t)(n ? n : 1), sizeof *kv->era);
  kv->ps_lost = calloc((size_t)(n ? n : 1), sizeof *kv->ps_lost);
  int rc = kv->addrs && kv->cl && kv->era && kv->ps_lost ? 0 : TSR_ENOMEM;
  if (!rc && (rc = pthread_mutex_init(&kv->mu, NULL))) rc = TSR_ENOMEM;
  bool mu = !rc;
  if (!rc && pthread_cond_init(&kv->cv, NULL)) rc = TSR_ENOMEM;
  bool cv = !rc;
  if (!rc) rc = uv_async_init(tsr_rpc_ctx_loop(ctx), &kv->async, on_async);
  if (rc) {
    if (cv) pthread_cond_destroy(&kv->cv);
    if (mu) pthread_mutex_destroy(&kv->mu);
    free(kv->addrs);
    free(kv->cl);
    free(kv->era);
    free(kv->ps_lost);
    free(kv);
    return rc;
  }
  kv->async.data = kv;
  uv_timer_init(tsr_rpc_ctx_loop(ctx), &kv->retry);
  kv->retry.data = kv;
  kv->open_handles = 2;
  kv->n_ps = n;
  for (int i = 0; i < n && !rc; i++) {
    if (!(kv->addrs[i] = strdup(addrs[i]))) {
      rc = TSR_ENOMEM;
      break;
    }
    if ((rc = ps_client_new(&kv->cl[i], ctx, addrs[i]))) break;
    kv->open_handles++;
    tsr_rpc_client_on_state(ps_client_rpc(kv->cl[i]), on_state, kv);
  }
  if (rc) {
    ps_kv_close(kv, NULL, NULL);
    return rc;
  }
  *out = kv;
  return 0;
}

static void kv_free(ps_kv *kv) {
  for (int i = 0; i < kv->n_ps; i++) free(kv->addrs[i]);
  free(kv->addrs);
  free(kv->cl);
  free(kv->era);
  free(kv->ps_lost);
  for (uint32_t i = 0; i < KV_SLOTS; i++) {
    free(kv->slots[i].calls);
    if (kv->slots[i].buf) {
      free(kv->slots[i].buf->data);
      free(kv->slots[i].buf);
    }
  }
  while (kv->pool) {
    kv_buf *b = kv->pool;
    kv->pool = b->next;
    free(b->data);
    free(b);
  }
  ps__kv_free_vars(kv->vars, kv->n_vars);
  pthread_cond_destroy(&kv->cv);
  pthread_mutex_destroy(&kv->mu);
  tsr_rpc_close_cb cb = kv->close_cb;
  void *data = kv->close_data;
  free(kv);
  if (cb) cb(data);
}

static void on_client_closed(void *data) {
  ps_kv *kv = data;
  if (--kv->open_handles == 0 && kv->closing) kv_free(kv);
}

static void on_async_closed(uv_handle_t *h) {
  ps_kv *kv = h->data;
  if (--kv->open_handles == 0 && kv->closing) kv_free(kv);
}

void ps_kv_cancel(ps_kv *kv) {
  pthread_mutex_lock(&kv->mu);
  if (kv->cancelled) {
    pthread_mutex_unlock(&kv->mu);
    return;
  }
  kv->cancelled = true;
  kv_call *list = kv->q_head;
  kv->q_head = kv->q_tail = NULL;
  if (kv->r_head) { /* waiting to be sent again: as if queued */
    kv->r_tail->next = list;
    list = kv->r_head;
    kv->r_head = kv->r_tail = NULL;
  }
  pthread_mutex_unlock(&kv->mu);
  uv_timer_stop(&kv->retry);
  while (list) { /* queued, never issued */
    kv_call *c = list;
    list = c->next;
    pthread_mutex_lock(&kv->mu);
    kv->inflight++;
    if (c->kind != KV_CLOCK) kv->inflight_data++;
    pthread_mutex_unlock(&kv->mu);
    finish(kv, c, TSR_ESHUTDOWN, "the PS client is closing", -1, -1, 0);
  }
  /* in flight: failed by their clients' close */
  for (int i = 0; i < kv->n_ps; i++) {
    ps_client *c = kv->cl[i];
    kv->cl[i] = NULL;
    if (c) ps_client_close(c, on_client_closed, kv);
  }
}

void ps_kv_close(ps_kv *kv, tsr_rpc_close_cb cb, void *data) {
  if (kv->closing) return;
  ps_kv_cancel(kv);
  kv->closing = true;
  kv->close_cb = cb;
  kv->close_data = data;
  uv_close((uv_handle_t *)&kv->retry, on_async_closed);
  uv_close((uv_handle_t *)&kv->async, on_async_closed);
}
