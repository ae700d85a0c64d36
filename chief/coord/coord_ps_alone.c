/* The coordinator's restore of one parameter server alone (coord_io.h),
 * after it restarted while the others kept their state: a config that
 * holds its calls, its variables, then its shards of the checkpoint, the
 * whole checkpoint first and the increments it builds on after it. The
 * other PS are not touched.
 *
 * Failure modes: the first call that fails (or cannot start) names the
 * PS and what failed in PS_RESTORED; a connection error marks it lost.
 * An answer to an attempt given up (fix_op moved on) is dropped.
 */
#include "chief/coord/coord_io.h"
#include "common/err.h"
#include "common/trace.h"

#include <stdio.h>
#include <stdlib.h>

static void coord_alone_fail(coord_ps *p, const char *what, int status,
                             const char *message) {
  if (p->fix_status) return;
  p->fix_status = status;
  p->fix_lost = coord__conn_error(status);
  snprintf(p->fix_msg, sizeof p->fix_msg, "%s: %s: %s", p->addr->addr, what,
           message && message[0] ? message : tsr_strerror(status));
}

static void coord_alone_done(coord_ps *p, uint64_t op) {
  if (p->fix_op != op) return;
  coord *co = p->co;
  coord_event ev = {.kind = COORD_EV_PS_RESTORED, .op = op,
                    .index = p->index, .step = p->fix_step,
                    .status = p->fix_status, .lost = p->fix_lost,
                    .msg = p->fix_status ? p->fix_msg : NULL};
  p->fix_op = 0;
  if (co->trace) {
    char name[64];
    snprintf(name, sizeof name, "ps:%d restored alone", p->index);
    tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                  name, p->fix_t0_us);
  }
  coord__post(co, &ev);
}

static void coord_alone_on_restore(const ps_result *r, void *data) {
  coord_ps_call *call = data;
  coord_ps *p = call->ps;
  uint64_t op = call->op;
  free(call);
  if (p->fix_op != op) return; /* a later try, or given up */
  if (r->status) coord_alone_fail(p, "restore", r->status, r->message);
  coord_alone_done(p, op);
}

/* Its shards of the checkpoint as every PS would restore them: an
 * increment with the checkpoints it builds on, the whole one first. */
static void coord_alone_restore(coord_ps *p, uint64_t op) {
  char err[512];
  coord_restore_plan pl;
  coord_ps_call *call = NULL;
  int rc = coord__restore_plan(p->co, p->fix_step, &pl, err, sizeof err);
  if (!rc) {
    call = coord__ps_call_new(p, op, "restore");
    rc = call ? coord__restore_call(p, &pl, coord_alone_on_restore, call)
              : TSR_ENOMEM;
    snprintf(err, sizeof err, "%s", tsr_strerror(rc));
  }
  if (rc) {
    free(call);
    coord_alone_fail(p, "restore", rc, err);
    coord_alone_done(p, op);
  }
}

/* The config and the create answered: the restore, unless one failed. */
static void coord_alone_setup_end(coord_ps *p, uint64_t op) {
  if (p->fix_op != op || --p->fix_pending > 0) return;
  if (p->fix_status)
    coord_alone_done(p, op);
  else
    coord_alone_restore(p, op);
}

static void coord_alone_on_setup(const ps_result *r, void *data) {
  coord_ps_call *call = data;
  coord_ps *p = call->ps;
  uint64_t op = call->op;
  const char *what = call->what;
  free(call->specs);
  free(call);
  if (p->fix_op != op) return;
  if (r->status) coord_alone_fail(p, what, r->status, r->message);
  coord_alone_setup_end(p, op);
}

static void coord_alone_send(coord_ps *p, uint64_t op, coord_ps_call *call,
                             int rc) {
  if (rc == 0) {
    p->fix_pending++;
    return;
  }
  coord_alone_fail(p, call ? call->what : "setup", rc, tsr_strerror(rc));
  if (call) free(call->specs);
  free(call);
  (void)op;
}

/* Like the setup of every PS, for PS i only: a config that starts its new
 * era holding every pull and push (its variables would serve their
 * initial values until the restore swaps its shards in), its variables,
 * then its shards of the checkpoint. The other PS are not touched. */
void coord__ps_restore_alone(coord *co, uint64_t op, int i, int64_t step) {
  coord_ps *p = &co->ps[i];
  char buf[32];
  p->fix_op = op;
  p->fix_step = step;
  p->fix_status = 0;
  p->fix_lost = false;
  p->fix_msg[0] = 0;
  p->fix_pending = 1; /* held until both calls are started */
  p->fix_t0_us = co->trace ? tsr_trace_now_us() : 0;
  ps_config cfg = coord__ps_cfg(co, i, buf, sizeof buf);
  cfg.hold_until_restore = true;
  coord_ps_call *call = coord__ps_call_new(p, op, "config");
  coord_alone_send(p, op, call, call ? ps_client_configure(p->cli, &cfg,
                                                           coord_alone_on_setup,
                                                           call)
                                     : TSR_ENOMEM);
  ps_var_spec *specs = NULL;
  size_t n = 0;
  int rc = coord__ps_specs(co, i, &specs, &n);
  if (rc) {
    coord_alone_fail(p, "create", rc, "variable spec");
  } else if (n > 0) {
    call = coord__ps_call_new(p, op, "create");
    if (call) call->specs = specs;
    else free(specs);
    coord_alone_send(p, op, call, call ? ps_client_create(p->cli, specs, n,
                                                          coord_alone_on_setup,
                                                          call)
                                       : TSR_ENOMEM);
  }
  coord_alone_setup_end(p, op);
}
