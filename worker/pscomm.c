/* The worker's PS client over its life: made when the training thread
 * configures a run (on the loop, which owns every handle), kept while the
 * chief configures the same PS layout again, replaced for another one,
 * cancelled when the worker shuts down (every call in flight fails, so the
 * thread moves on) and closed once the thread has gone.
 *
 * Everything else about the PS (splitting requests over shards, fan-out
 * to every PS, tickets, lost connections and the resets of ssp/sync) is
 * the client's (ps/client/client.h, ps_kv); the training thread submits and waits
 * through it directly (loop_xfer.c).
 * Failure modes: a client that cannot be made (out of memory, a bad
 * address) fails the configure with a message naming the PS; a connect
 * asked while shutting down fails with TSR_ESHUTDOWN.
 */
#include "worker/loop_int.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wk__ps_issue(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  bool want = s->want_connect;
  pthread_mutex_unlock(&s->mu);
  if (!want) return;
  char err[WK_ERR_MAX] = "";
  int rc = wk__ps_connect(s, s->want_addrs, s->want_n, err, sizeof err);
  pthread_mutex_lock(&s->mu);
  s->want_connect = false;
  s->connect_rc = rc;
  snprintf(s->connect_err, sizeof s->connect_err, "%s", err);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void on_kv_closed(void *data) {
  wk_svc *s = data;
  s->ps_closing--;
}

void wk__ps_cancel(wk_svc *s) {
  if (s->kv) ps_kv_cancel(s->kv);
}

void wk__ps_close_all(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  ps_kv *kv = s->kv;
  s->kv = NULL;
  pthread_mutex_unlock(&s->mu);
  if (kv) {
    s->ps_closing++;
    ps_kv_close(kv, on_kv_closed, s);
  }
  for (int i = 0; i < s->n_ps; i++) free(s->ps_addrs[i]);
  free(s->ps_addrs);
  s->ps_addrs = NULL;
  s->n_ps = 0;
}

int wk__ps_connect(wk_svc *s, char *const *addrs, int n, char *err,
                   size_t errlen) {
  /* The same layout keeps its connections (a chief reconfiguring). */
  bool same = s->kv && n == s->n_ps;
  for (int i = 0; same && i < n; i++)
    same = strcmp(addrs[i], s->ps_addrs[i]) == 0;
  if (same) return 0;
  if (s->closing_ps) {
    snprintf(err, errlen, "shutting down: no new PS connections");
    return TSR_ESHUTDOWN;
  }
  wk__ps_close_all(s);
  /* n == 0: a client with no PS (dense "allreduce" without sparse
   * tables), so the thread's calls still have one to go through */
  s->ps_addrs = calloc((size_t)(n ? n : 1), sizeof *s->ps_addrs);
  if (!s->ps_addrs) {
    snprintf(err, errlen, "out of memory for %d PS addresses", n);
    return TSR_ENOMEM;
  }
  s->n_ps = n;
  for (int i = 0; i < n; i++)
    if (!(s->ps_addrs[i] = strdup(addrs[i]))) {
      snprintf(err, errlen, "out of memory for %d PS addresses", n);
      wk__ps_close_all(s);
      return TSR_ENOMEM;
    }
  ps_kv *kv;
  int rc = ps_kv_new(&kv, s->rpc, addrs, n);
  if (rc < 0) {
    snprintf(err, errlen, "cannot make a client for the %d PS (%s%s): %s", n,
             n ? addrs[0] : "", n > 1 ? ", ..." : "", tsr_strerror(rc));
    wk__ps_close_all(s);
    return rc;
  }
  pthread_mutex_lock(&s->mu);
  s->kv = kv;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

int wk__ps_reconnect(wk_svc *s, char *const *addrs, int n, ps_kv **kv,
                     char *err, size_t errlen) {
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
  *kv = rc < 0 ? NULL : s->kv;
  pthread_mutex_unlock(&s->mu);
  if (rc == 0 && !*kv) {
    snprintf(err, errlen, "shutting down: no PS client");
    rc = TSR_ESHUTDOWN;
  }
  return rc;
}
