/* The worker's side of the clock protocol of ssp:S and sync (the model's
 * wk__clock_join and wk__clock_tick, tests/model/clock.pml).
 *
 * Happy path: at configure (closure 0: a member from the start) and at
 * the start of every closure the worker JOINs every PS at once (for this
 * closure of its run, with its clock and the era each PS answered last); each PS makes it a member and answers the clock it may
 * go on from and its era. The closure continues from the largest answer,
 * and its first exchange TICKs every PS up to it together with the first
 * pull (same connection, so the TICK is read first). Every later pull and
 * push carries the PS's era, so nothing computed before a reset of that
 * PS (restore, new configuration) is taken after it.
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

int wk__clock_ticks(wk_run *r, int n, int64_t clock) {
  for (int p = 0; p < r->n_ps; p++) {
    wk_op *op = &r->ops[n++];
    memset(op, 0, sizeof *op);
    op->kind = WK_OP_CLOCK;
    op->ps = p;
    op->step = clock;
    op->clock_op = PS_CLOCK_TICK;
    op->era = r->era[p];
  }
  return n;
}

static bool stopping(wk_svc *s) {
  pthread_mutex_lock(&s->mu);
  bool st = s->stop;
  pthread_mutex_unlock(&s->mu);
  return st;
}

int wk__clock_join(wk_svc *s, wk_run *r, uint64_t closure, uint64_t end_ms,
                   char *err, size_t errlen) {
  wk_group g = {0};
  int rc;
  for (;;) {
    for (int p = 0; p < r->n_ps; p++) {
      wk_op *op = &r->ops[p];
      memset(op, 0, sizeof *op);
      op->kind = WK_OP_CLOCK;
      op->ps = p;
      op->step = r->clock;
      op->clock_op = PS_CLOCK_JOIN;
      op->run = r->run_id;
      op->closure = closure;
      op->era = r->era[p];
    }
    rc = wk__ps_run(s, r->ops, r->n_ps, &g);
    if (!rc || !wk__ps_retryable(rc) || tsr_now_ms() >= end_ms ||
        stopping(s))
      break;
    tsr_sleep_ms(100);
  }
  if (rc) {
    snprintf(err, errlen, "joining the parameter servers: %s", g.err);
    return rc;
  }
  int64_t j = 0;
  for (int p = 0; p < r->n_ps; p++) {
    if (r->ops[p].clock > j) j = r->ops[p].clock;
    r->era[p] = r->ops[p].era_out;
  }
  r->clock = j;
  return 0;
}
