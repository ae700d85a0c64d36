/* The chief's status service: tessera-chief listens on its own address
 * from the cluster spec and answers CHIEF_M_STATUS with what it knows of
 * the run and of every worker and PS, for `tessera status`. When the chief
 * runs as worker 0 (a cluster without a chief job), that address belongs to
 * the worker process and no status service is started. The service hears
 * the membership changes (coord__member_subscribe), so it tells since when
 * and why a worker no longer runs closures, and it asks the machine what
 * the run waits for. */
#include "chief.pb-c.h"
#include "chief/coord/coord_io.h"
#include "chief/wire.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const coord__wstate_names[] = {
    "down", "connected", "configuring", "ready", "failed"};

/* The membership changes, as `tessera status` shows them per worker. */
static void coord_status_member(coord *co, const coord_member_ev *ev,
                                void *data) {
  (void)data;
  coord_wk *w = &co->wk[ev->worker];
  w->left_at = ev->up ? 0 : ev->at;
  snprintf(w->left_why, sizeof w->left_why, "%s", ev->up ? "" : ev->why);
}

static void coord_on_status(tsr_rpc_incoming *call, void *data) {
  coord *co = data;
  char waiting[COORD_MSG_MAX];
  coord_sm_waiting(co->sm, waiting, sizeof waiting);
  double now = tsr_now_s();
  Tessera__Chief__StatusResponse r = TESSERA__CHIEF__STATUS_RESPONSE__INIT;
  r.phase = (char *)coord_sm_phase(co->sm);
  r.run_id = co->run_id;
  r.step = coord__step(co);
  r.total_steps = coord_sm_total_steps(co->sm);
  r.examples = co->examples;
  r.examples_per_sec =
      co->progress ? chief_progress_examples_per_sec(co->progress) : 0;
  r.loss = coord__recent_loss(co);
  r.last_checkpoint_step = coord_sm_last_ckpt(co->sm);
  r.job = co->job.path ? co->job.path : (char *)"";
  r.uptime_s = now - co->t_start;
  r.waiting = waiting;
  Tessera__Chief__TaskStatus *ts =
      calloc((size_t)(co->n_wk + co->n_ps), sizeof *ts);
  Tessera__Chief__TaskStatus **wp = calloc((size_t)co->n_wk + 1, sizeof *wp);
  Tessera__Chief__TaskStatus **pp = calloc((size_t)co->n_ps + 1, sizeof *pp);
  char (*names)[32] = calloc((size_t)(co->n_wk + co->n_ps), sizeof *names);
  if (!ts || !wp || !pp || !names) {
    free(ts);
    free(wp);
    free(pp);
    free(names);
    tsr_rpc_reply_error(call, TSR_ENOMEM, NULL);
    return;
  }
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    Tessera__Chief__TaskStatus *t = &ts[i];
    tessera__chief__task_status__init(t);
    snprintf(names[i], sizeof names[i], "worker:%d", i);
    t->task = names[i];
    t->address = (char *)w->addr->addr;
    t->state = (char *)coord__wstate_names[coord_sm_wk_state(co->sm, i)];
    t->steps = w->steps;
    t->examples_per_sec = w->busy_s > 0 ? (double)w->examples / w->busy_s : 0;
    t->device = w->device;
    t->last_error = (char *)coord_sm_wk_error(co->sm, i);
    t->restarts = coord_sm_wk_restarts(co->sm, i);
    t->left_s_ago = w->left_at > 0 ? now - w->left_at : 0;
    t->left_why = w->left_why;
    wp[i] = t;
  }
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    Tessera__Chief__TaskStatus *t = &ts[co->n_wk + i];
    tessera__chief__task_status__init(t);
    snprintf(names[co->n_wk + i], sizeof names[0], "ps:%d", i);
    t->task = names[co->n_wk + i];
    t->address = (char *)p->addr->addr;
    t->state = p->connected ? (char *)"up" : (char *)"down";
    t->bytes_in = p->bytes_in;
    t->bytes_out = p->bytes_out;
    t->apply_ms = p->apply_ms;
    t->device = (char *)"";
    t->last_error = (char *)"";
    pp[i] = t;
  }
  r.n_workers = (size_t)co->n_wk;
  r.workers = wp;
  r.n_ps = (size_t)co->n_ps;
  r.ps = pp;
  size_t len = tessera__chief__status_response__get_packed_size(&r);
  uint8_t *buf = malloc(len ? len : 1);
  if (buf) {
    tessera__chief__status_response__pack(&r, buf);
    if (tsr_rpc_reply(call, buf, len, NULL, 0, NULL, NULL))
      tsr_rpc_reply_error(call, TSR_ETOOBIG, "status too large");
  } else {
    tsr_rpc_reply_error(call, TSR_ENOMEM, NULL);
  }
  free(buf);
  free(ts);
  free(wp);
  free(pp);
  free(names);
}

int coord__status_open(coord *co) {
  int rc = coord__member_subscribe(co, coord_status_member, NULL);
  if (rc) return rc;
  if (co->cluster.task_type != TSR_TASK_CHIEF) return 0;
  const tsr_task_addr *me =
      tsr_cluster_find(&co->cluster, TSR_TASK_CHIEF, co->cluster.task_index);
  if (!me) return 0;
  rc = tsr_rpc_server_new(&co->status, co->rpc);
  if (rc) return rc;
  rc = tsr_rpc_server_register(co->status, CHIEF_M_STATUS, coord_on_status,
                               co);
  /* a name may resolve to an address no interface holds (a Swarm
   * service's virtual IP): listen as the PS and workers do */
  char addr[300];
  tsr_task_listen_addr(me, addr, sizeof addr);
  if (rc == 0) rc = tsr_rpc_server_listen(co->status, addr);
  if (rc) {
    /* Training does not need it: say so and go on. */
    tsr_warn("status service not started on %s: %s", addr,
             tsr_strerror(rc));
    tsr_rpc_server_close(co->status, NULL, NULL);
    co->status = NULL;
  }
  return 0;
}

void coord__status_close(coord *co) {
  if (co->status) tsr_rpc_server_close(co->status, NULL, NULL);
  co->status = NULL;
}
