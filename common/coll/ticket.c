/* Operations posted from another thread (a training thread): a
 * submission is queued under the collective's lock with a ticket, the
 * loop is woken (uv_async) and posts the queued submissions in order;
 * each operation's callback fills its ticket and wakes the waiters.
 *
 * Failure modes: TSR_COLL_TICKETS open tickets at once (TSR_EBUSY); a
 * closing collective fails queued submissions and open tickets with
 * TSR_ESHUTDOWN, so no waiter blocks past the close.
 */
#include "common/coll/coll_int.h"
#include "common/clock.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sub_free(coll_sub *s) {
  free(s->msg);
  for (int i = 0; s->addrs && i < s->g.nranks; i++) {
    free(s->addrs[i]);
    if (s->names) free(s->names[i]);
  }
  free(s->addrs);
  free(s->names);
  free(s);
}

static coll_slot *slot_of(tsr_coll *c, tsr_coll_ticket t) {
  for (int i = 0; i < TSR_COLL_TICKETS; i++)
    if (c->slots[i].t == t) return &c->slots[i];
  return NULL;
}

/* Fills a ticket (under mu). */
static void slot_done(tsr_coll *c, tsr_coll_ticket t, int status,
                      const char *msg) {
  coll_slot *s = slot_of(c, t);
  if (!s) return;
  s->done = true;
  s->done_ns = tsr_now_ns();
  s->status = status;
  snprintf(s->msg, sizeof s->msg, "%s", msg ? msg : "");
  pthread_cond_broadcast(&c->cv);
}

static int group_copy(coll_sub *s, const tsr_coll_group *g) {
  if (!g || !g->addrs || g->nranks < 1 || g->nranks > TSR_COLL_MAX_RANKS)
    return TSR_EINVAL;
  s->g = *g;
  s->addrs = calloc((size_t)g->nranks, sizeof *s->addrs);
  s->names = calloc((size_t)g->nranks, sizeof *s->names);
  if (!s->addrs || !s->names) return TSR_ENOMEM;
  for (int i = 0; i < g->nranks; i++) {
    if (!g->addrs[i]) return TSR_EINVAL;
    if (!(s->addrs[i] = strdup(g->addrs[i]))) return TSR_ENOMEM;
    if (g->names && g->names[i] && !(s->names[i] = strdup(g->names[i])))
      return TSR_ENOMEM;
  }
  s->g.addrs = (const char *const *)s->addrs;
  s->g.names = (const char *const *)s->names;
  s->req.group = &s->g;
  return 0;
}

int tsr_coll_submit(tsr_coll *c, const tsr_coll_req *req,
                    tsr_coll_ticket *t) {
  *t = 0;
  if (!req || req->kind < TSR_COLL_ALLREDUCE || req->kind > TSR_COLL_ABORT)
    return TSR_EINVAL;
  coll_sub *s = calloc(1, sizeof *s);
  if (!s) return TSR_ENOMEM;
  s->c = c;
  s->req = *req;
  int rc = 0;
  if (req->kind == TSR_COLL_ABORT &&
      !(s->msg = strdup(req->message ? req->message : "gave up"))) {
    sub_free(s);
    return TSR_ENOMEM;
  }
  if (req->kind == TSR_COLL_CONFIGURE && (rc = group_copy(s, req->group))) {
    s->g.nranks = req->group ? req->group->nranks : 0;
    sub_free(s);
    return rc;
  }
  pthread_mutex_lock(&c->mu);
  coll_slot *free_slot = NULL;
  if (c->mu_closing) {
    rc = TSR_ESHUTDOWN;
  } else if (!(free_slot = slot_of(c, 0))) {
    rc = TSR_EBUSY;
  } else {
    s->t = ++c->next_ticket;
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->t = s->t;
    tsr_list_push_back(&c->subq, &s->node);
    uv_async_send(&c->wake);
    *t = s->t;
  }
  pthread_mutex_unlock(&c->mu);
  if (rc) sub_free(s);
  return rc;
}

int tsr_coll_wait(tsr_coll *c, tsr_coll_ticket t, char *err, size_t errlen) {
  return tsr_coll_wait_timed(c, t, err, errlen, NULL, NULL);
}

int tsr_coll_done(tsr_coll *c, tsr_coll_ticket t) {
  pthread_mutex_lock(&c->mu);
  coll_slot *s = t ? slot_of(c, t) : NULL;
  int done = s && s->done;
  pthread_mutex_unlock(&c->mu);
  return done;
}

int tsr_coll_wait_timed(tsr_coll *c, tsr_coll_ticket t, char *err,
                        size_t errlen, uint64_t *post_ns, uint64_t *done_ns) {
  if (err && errlen) err[0] = 0;
  if (!t) return TSR_EINVAL;
  pthread_mutex_lock(&c->mu);
  coll_slot *s = slot_of(c, t);
  if (!s) {
    pthread_mutex_unlock(&c->mu);
    return tsr_errf(err, errlen, TSR_EINVAL, "ticket %llu is not open",
                    (unsigned long long)t);
  }
  while (!s->done) pthread_cond_wait(&c->cv, &c->mu);
  int rc = s->status;
  if (rc && err && errlen) snprintf(err, errlen, "%s", s->msg);
  if (post_ns) *post_ns = s->post_ns;
  if (done_ns) *done_ns = s->done_ns;
  s->t = 0;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static void on_ticket(int status, const char *message, void *data) {
  coll_sub *s = data;
  tsr_coll *c = s->c;
  pthread_mutex_lock(&c->mu);
  slot_done(c, s->t, status, message);
  pthread_mutex_unlock(&c->mu);
  sub_free(s);
}

void tsr_coll__subs_run(tsr_coll *c) {
  tsr_list q;
  tsr_list_init(&q);
  pthread_mutex_lock(&c->mu);
  while (!tsr_list_empty(&c->subq)) {
    tsr_list *n = tsr_list_first(&c->subq);
    tsr_list_remove(n);
    tsr_list_push_back(&q, n);
  }
  pthread_mutex_unlock(&c->mu);
  tsr_list *n;
  while ((n = tsr_list_first(&q))) {
    tsr_list_remove(n);
    coll_sub *s = tsr_list_entry(n, coll_sub, node);
    const tsr_coll_req *r = &s->req;
    pthread_mutex_lock(&c->mu);
    coll_slot *sl = slot_of(c, s->t);
    if (sl) sl->post_ns = tsr_now_ns();
    pthread_mutex_unlock(&c->mu);
    int rc;
    switch (r->kind) {
    case TSR_COLL_ALLREDUCE:
      rc = tsr_coll_allreduce(c, r->buf, r->count, on_ticket, s);
      break;
    case TSR_COLL_BROADCAST:
      rc = tsr_coll_broadcast(c, r->root, r->buf, r->count, on_ticket, s);
      break;
    case TSR_COLL_BARRIER:
      rc = tsr_coll_barrier(c, on_ticket, s);
      break;
    case TSR_COLL_ABORT:
      tsr_coll_abort(c, r->root, s->msg);
      on_ticket(0, "", s);
      continue;
    default:
      rc = tsr_coll_configure(c, &s->g, on_ticket, s);
      if (rc == TSR_EINVAL && s->g.epoch <= c->epoch) {
        char m[160];
        snprintf(m, sizeof m, "group %llu is not newer than group %llu, "
                 "which this rank is in", (unsigned long long)s->g.epoch,
                 (unsigned long long)c->epoch);
        on_ticket(rc, m, s);
        continue;
      }
      break;
    }
    if (rc) on_ticket(rc, tsr_strerror(rc), s);
  }
}

void tsr_coll__subs_fail(tsr_coll *c) {
  pthread_mutex_lock(&c->mu);
  tsr_list *n;
  while ((n = tsr_list_first(&c->subq))) {
    tsr_list_remove(n);
    coll_sub *s = tsr_list_entry(n, coll_sub, node);
    slot_done(c, s->t, TSR_ESHUTDOWN, "the collective is closing");
    sub_free(s);
  }
  pthread_mutex_unlock(&c->mu);
}
