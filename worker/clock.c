/* The worker's side of the clock protocol of ssp:S and sync (the model's
 * wk__clock_join and wk__clock_tick, tests/model/clock.pml).
 *
 * Happy path: at configure (closure 0: a member from the start) and at
 * the start of every closure the worker JOINs every PS at once (for this
 * closure of its run, with its clock and the era each PS answered last);
 * each PS makes it a member and answers the clock it may go on from and
 * its era, which the PS client (ps_kv) keeps and sends with every later
 * call to that PS, so nothing computed before a reset of that PS
 * (restore, new configuration) is taken after it. The closure continues
 * from the largest answer, and its first pull TICKs every PS up to it
 * (loop_step.c, first_pull).
 * Failure modes: a PS refuses the JOIN (another run: this closure comes
 * from a chief that is gone; a closure the chief gave up): the closure
 * fails with that message. A PS that is down or reconnecting is retried
 * until the caller's deadline, then the closure fails naming it.
 */
#include "worker/loop_run.h"

#include "common/clock.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool wk__ps_retryable(int rc) {
  return rc == TSR_EUNAVAIL || rc == TSR_ECLOSED || rc == UV_ECONNREFUSED;
}

static bool stopping(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  bool st = s->stop;
  pthread_mutex_unlock(&s->mu);
  return st;
}

int wk__clock_join(wk_svc *s, wk_run *r, uint64_t closure, uint64_t end_ms,
                   char *err, size_t errlen) {
  ps_kv_result res;
  int rc;
  for (;;) {
    ps_ticket t = 0;
    memset(&res, 0, sizeof res);
    rc = ps_kv_join(r->kv, r->clock, r->run_id, closure, 0, 0, &t);
    if (rc)
      snprintf(res.err, sizeof res.err, "the PS client refused it: %s",
               tsr_strerror(rc));
    else
      rc = ps_kv_wait(r->kv, t, &res);
    if (!rc || !wk__ps_retryable(rc) || tsr_now_ms() >= end_ms ||
        stopping(s))
      break;
    tsr_sleep_ms(100);
  }
  if (rc)
    return tsr_errf(err, errlen, rc, "joining the parameter servers: %s",
                    res.err);
  r->clock = res.min_clock > 0 ? res.min_clock : 0;
  return 0;
}
