/* The coordinator's side of the parameter servers (coord_io.h): one
 * ps_client each; connection changes become PS_UP / PS_LOST; the machine's
 * SETUP_PS, RESTORE and SAVE go to every PS and their answers are gathered
 * into one SETUP_DONE / RESTORE_DONE / SAVE_DONE naming the first PS that
 * failed and why; COMMIT writes the manifest; RELEASE and the statistics
 * are fire-and-forget.
 *
 * Failure modes: a call that cannot start counts as failed at once; a
 * connection error marks the operation "lost" (the PS went away), anything
 * else is the PS's own answer. A checkpoint folder that cannot be made
 * (disk full, permissions) fails the SAVE before any PS is asked.
 */
#include "chief/coord/coord_io.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"
#include "ps.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  coord_ps *ps;
  uint64_t op;
  ps_var_spec *specs; /* create: kept until the answer */
  const char *what;
} coord_ps_call;

static void coord_ps_on_state(tsr_rpc_client *c, int connected, int status,
                              void *data) {
  coord_ps *p = data;
  (void)c;
  p->connected = connected != 0;
  if (connected)
    coord__post_simple(p->co, COORD_EV_PS_UP, p->index, NULL);
  else
    coord__post_simple(p->co, COORD_EV_PS_LOST, p->index,
                       tsr_strerror(status));
}

int coord__ps_open(coord *co) {
  /* none: dense "allreduce" without sparse tables */
  co->ps = calloc((size_t)(co->n_ps ? co->n_ps : 1), sizeof *co->ps);
  if (!co->ps) return TSR_ENOMEM;
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    p->co = co;
    p->index = i;
    p->addr = &co->cluster.jobs[TSR_TASK_PS][i];
    int rc = ps_client_new(&p->cli, co->rpc, p->addr->addr);
    if (rc) {
      tsr_error("ps:%d (%s): %s", i, p->addr->addr, tsr_strerror(rc));
      return rc;
    }
    ps_client_set_deadline(p->cli, 120000);
    tsr_rpc_client_on_state(ps_client_rpc(p->cli), coord_ps_on_state, p);
  }
  return 0;
}

/* ---- gathered operations ------------------------------------------------ */

static bool coord_conn_error(int status) {
  return status == TSR_ECLOSED || status == TSR_EUNAVAIL ||
         status == TSR_ETIMEOUT || status == TSR_ESHUTDOWN;
}

static void coord_psop_begin(coord *co, uint64_t op, coord_ev_kind done) {
  memset(&co->psop, 0, sizeof co->psop);
  co->psop.op = op;
  co->psop.done = done;
  co->psop.failed_ps = -1;
  co->psop.pending = 1; /* held until every call is started */
}

static void coord_psop_end(coord *co, uint64_t op) {
  coord_psop *o = &co->psop;
  if (o->op != op || --o->pending > 0) return;
  coord_event ev = {.kind = o->done, .op = o->op, .status = o->status,
                    .index = o->failed_ps, .lost = o->lost,
                    .msg = o->status ? o->msg : NULL};
  coord__post(co, &ev);
}

static void coord_psop_result(coord *co, uint64_t op, coord_ps *p,
                              const char *what, int status,
                              const char *message) {
  coord_psop *o = &co->psop;
  if (o->op == op && status && !o->status) {
    o->status = status;
    o->failed_ps = p ? p->index : -1;
    o->lost = coord_conn_error(status);
    snprintf(o->msg, sizeof o->msg, "%s: %s", what,
             message && message[0] ? message : tsr_strerror(status));
  } else if (o->op == op && status && coord_conn_error(status)) {
    o->lost = true;
  }
  coord_psop_end(co, op);
}

void coord__psop_add(coord *co) { co->psop.pending++; }

void coord__psop_answer(coord *co, uint64_t op, const char *what, int status,
                        const char *message) {
  coord_psop_result(co, op, NULL, what, status, message);
}

static void coord_ps_on_result(const ps_result *r, void *data) {
  coord_ps_call *call = data;
  coord_psop_result(call->ps->co, call->op, call->ps, call->what, r->status,
                    r->message);
  free(call->specs);
  free(call);
}

static coord_ps_call *coord_ps_call_new(coord_ps *p, uint64_t op,
                                        const char *what) {
  coord_ps_call *c = calloc(1, sizeof *c);
  if (c) {
    c->ps = p;
    c->op = op;
    c->what = what;
  }
  return c;
}

/* One call of the operation: started (its answer ends it) or failed at
 * once. */
static void coord_ps_started(coord *co, coord_ps_call *call, int rc) {
  co->psop.pending++;
  if (rc) {
    coord_psop_result(co, call->op, call->ps, call->what, rc,
                      tsr_strerror(rc));
    free(call->specs);
    free(call);
  }
}

static const char *coord_mode_text(const coord *co, char *buf, size_t len) {
  switch (co->job.mode) {
    case TSR_MODE_SYNC: return "sync";
    case TSR_MODE_SSP: snprintf(buf, len, "ssp:%d", co->job.staleness); return buf;
    default: return "async";
  }
}

/* The specs of the shards placed on PS i (n may be 0). */
static int coord_ps_specs(coord *co, int i, ps_var_spec **out, size_t *n_out) {
  size_t n = 0;
  *out = NULL;
  *n_out = 0;
  for (size_t k = 0; k < co->n_shards; k++)
    if (co->shards[k].ps == i) n++;
  if (n == 0) return 0;
  ps_var_spec *specs = calloc(n, sizeof *specs);
  if (!specs) return TSR_ENOMEM;
  size_t j = 0;
  int rc = 0;
  for (size_t k = 0; k < co->n_shards && !rc; k++) {
    const tsr_shard *s = &co->shards[k];
    if (s->ps != i) continue;
    rc = ps_var_spec_from_var(&specs[j], &co->vars[s->var], s, co->job.seed,
                              &co->var_optim[s->var],
                              co->var_init_path[s->var]);
    j++;
  }
  if (rc) {
    free(specs);
    return rc;
  }
  *out = specs;
  *n_out = n;
  return 0;
}

/* PS i's configuration (mode points into buf). */
static ps_config coord_ps_cfg(coord *co, int i, char *buf, size_t len) {
  return (ps_config){.mode = coord_mode_text(co, buf, len),
                     .allow_nonfinite = false,
                     .trace_pid = co->trace ? tsr_trace_pid(TSR_TASK_PS, i)
                                            : -1,
                     .checkpoint_root = co->job.checkpoint_dir,
                     .run_id = co->run_id};
}

void coord__ps_setup(coord *co, uint64_t op, bool hold) {
  char buf[32];
  coord_psop_begin(co, op, COORD_EV_SETUP_DONE);
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    coord_ps_call *call = coord_ps_call_new(p, op, "config");
    if (!call) {
      coord_psop_result(co, op, p, "config", TSR_ENOMEM, "out of memory");
      break;
    }
    /* a new era on every PS: nothing from before (this chief's own run
     * before a restart, another run) is taken from here on */
    ps_config cfg = coord_ps_cfg(co, i, buf, sizeof buf);
    cfg.hold_until_restore = hold;
    coord_ps_started(co, call, ps_client_configure(p->cli, &cfg,
                                                   coord_ps_on_result, call));
    ps_var_spec *specs;
    size_t n;
    int rc = coord_ps_specs(co, i, &specs, &n);
    if (rc) {
      coord_psop_result(co, op, p, "create", rc, "variable spec");
      break;
    }
    if (n == 0) continue;
    call = coord_ps_call_new(p, op, "create");
    if (!call) {
      free(specs);
      coord_psop_result(co, op, p, "create", TSR_ENOMEM, "out of memory");
      break;
    }
    call->specs = specs;
    p->vars_created = (int64_t)n;
    coord_ps_started(co, call, ps_client_create(p->cli, specs, n,
                                                coord_ps_on_result, call));
  }
  coord_psop_end(co, op);
}

/* A save answer: its files go on the checkpoint's list (what the commit
 * verifies and the manifest lists). */
static void coord_ps_on_save(const ps_result *r, void *data) {
  coord_ps_call *call = data;
  coord *co = call->ps->co;
  char err[512];
  int status = r->status;
  const char *msg = r->message;
  if (status == 0 &&
      (status = chief_ckpt_files_add(&co->ckpt_files, call->ps->index,
                                     r->save, err, sizeof err)))
    msg = err;
  coord_psop_result(co, call->op, call->ps, call->what, status, msg);
  free(call);
}

/* The checkpoint of `step` as a PS names it: its folder relative to the
 * checkpoint root each PS was configured with, and (with id) the id its
 * manifest commits, so a restore takes only files of that checkpoint ("":
 * no readable manifest). TSR_ERANGE for a path too long. */
static int coord_ckpt_ref(coord *co, int64_t step, char *name, size_t nlen,
                          char *id, size_t idlen) {
  char dir[4096];
  if (chief_ckpt_name(step, name, nlen) ||
      chief_ckpt_dir(co->job.checkpoint_dir, step, dir, sizeof dir))
    return TSR_ERANGE;
  if (!id) return 0;
  id[0] = 0;
  int64_t st;
  json_t *m = NULL;
  char err[512];
  if (chief_ckpt_read(dir, &st, &m, NULL, 0, err, sizeof err) == 0) {
    const char *s = json_string_value(json_object_get(m, "checkpoint_id"));
    snprintf(id, idlen, "%s", s ? s : "");
    json_decref(m);
  }
  return 0;
}

static void coord_ps_dir_call(coord *co, uint64_t op, int64_t step,
                              bool save) {
  char name[64], id[CHIEF_CKPT_ID_MAX + 1] = "";
  coord_psop_begin(co, op, save ? COORD_EV_SAVE_DONE : COORD_EV_RESTORE_DONE);
  if (coord_ckpt_ref(co, step, name, sizeof name, save ? NULL : id,
                     sizeof id)) {
    coord_psop_result(co, op, NULL, save ? "save" : "restore", TSR_ERANGE,
                      "checkpoint path too long");
    coord_psop_end(co, op);
    return;
  }
  if (save) chief_ckpt_files_start(&co->ckpt_files, step);
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    const char *what = save ? "save" : "restore";
    coord_ps_call *call = coord_ps_call_new(p, op, what);
    if (!call) {
      coord_psop_result(co, op, p, what, TSR_ENOMEM, "out of memory");
      break;
    }
    /* a restore starts the clocks at the checkpoint's step on every PS */
    int rc = save ? ps_client_save_ckpt(p->cli, name, co->ckpt_files.id,
                                        step, co->job.checkpoint_per_ps,
                                        coord_ps_on_save, call)
                  : ps_client_restore_ckpt(p->cli, name, id, step,
                                           coord_ps_on_result, call);
    coord_ps_started(co, call, rc);
  }
  /* dense "allreduce": the dense variables, from a worker, written here */
  if (co->job.dense_allreduce) {
    if (save)
      coord__dense_save(co, op, step);
    else
      coord__dense_restore(co, op, step);
  }
  coord_psop_end(co, op);
}

void coord__ps_save(coord *co, uint64_t op, int64_t step) {
  char err[512];
  int rc = chief_ckpt_prepare(co->job.checkpoint_dir, step, err, sizeof err);
  if (rc) {
    coord_event ev = {.kind = COORD_EV_SAVE_DONE, .op = op, .status = rc,
                      .index = -1, .msg = err};
    coord__post(co, &ev);
    return;
  }
  coord_ps_dir_call(co, op, step, true);
}

void coord__ps_restore(coord *co, uint64_t op, int64_t step) {
  json_t *m = coord__ckpt_manifest(co, step);
  if (m) {
    json_t *dig = json_object_get(m, "model_digest");
    if (json_is_string(dig) &&
        strcmp(json_string_value(dig), co->model_digest) != 0)
      tsr_warn("the checkpoint of step %" PRId64 " was made with another "
               "model (digest %s, now %s); restoring it anyway", step,
               json_string_value(dig), co->model_digest);
    json_decref(m);
  }
  coord_ps_dir_call(co, op, step, false);
}

/* ---- one PS restored alone ------------------------------------------------ */

static void coord_alone_fail(coord_ps *p, const char *what, int status,
                             const char *message) {
  if (p->fix_status) return;
  p->fix_status = status;
  p->fix_lost = coord_conn_error(status);
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

static void coord_alone_restore(coord_ps *p, uint64_t op) {
  char name[64], id[CHIEF_CKPT_ID_MAX + 1];
  int rc = coord_ckpt_ref(p->co, p->fix_step, name, sizeof name, id,
                          sizeof id);
  coord_ps_call *call = NULL;
  if (!rc) {
    call = coord_ps_call_new(p, op, "restore");
    rc = call ? ps_client_restore_ckpt(p->cli, name, id, p->fix_step,
                                       coord_alone_on_restore, call)
              : TSR_ENOMEM;
  }
  if (rc) {
    free(call);
    coord_alone_fail(p, "restore", rc, rc == TSR_ERANGE
                                           ? "checkpoint path too long"
                                           : tsr_strerror(rc));
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
  ps_config cfg = coord_ps_cfg(co, i, buf, sizeof buf);
  cfg.hold_until_restore = true;
  coord_ps_call *call = coord_ps_call_new(p, op, "config");
  coord_alone_send(p, op, call, call ? ps_client_configure(p->cli, &cfg,
                                                           coord_alone_on_setup,
                                                           call)
                                     : TSR_ENOMEM);
  ps_var_spec *specs = NULL;
  size_t n = 0;
  int rc = coord_ps_specs(co, i, &specs, &n);
  if (rc) {
    coord_alone_fail(p, "create", rc, "variable spec");
  } else if (n > 0) {
    call = coord_ps_call_new(p, op, "create");
    if (call) call->specs = specs;
    else free(specs);
    coord_alone_send(p, op, call, call ? ps_client_create(p->cli, specs, n,
                                                          coord_alone_on_setup,
                                                          call)
                                       : TSR_ENOMEM);
  }
  coord_alone_setup_end(p, op);
}

/* The manifest, the commit point (chief/ckpt/ckpt.h). total_steps (when
 * known) tells the evaluator sidecar which checkpoint is the job's last. */
void coord__ps_commit(coord *co, uint64_t op, int64_t step, int64_t total) {
  json_t *m = json_object();
  json_object_set_new(m, "run_id", json_integer((json_int_t)co->run_id));
  json_object_set_new(m, "wall_time", json_real(tsr_wall_s()));
  json_object_set_new(m, "examples", json_integer(co->examples));
  if (total > 0) json_object_set_new(m, "total_steps", json_integer(total));
  json_object_set_new(m, "num_ps", json_integer(co->n_ps));
  if (co->job.dense_allreduce)
    json_object_set_new(m, "dense", json_string("allreduce"));
  json_object_set_new(m, "seed", json_integer((json_int_t)co->job.seed));
  json_object_set_new(m, "model_digest", json_string(co->model_digest));
  if (co->job.model) json_object_set(m, "model", co->job.model);
  if (co->input_affine) json_object_set(m, "input", co->input_affine);
  json_object_set_new(m, "optimizer",
                      json_string(tsr_optim_name(co->job.optimizer.kind)));
  json_t *vars = json_array();
  for (size_t v = 0; v < co->n_vars; v++) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(co->vars[v].name));
    json_t *shape = json_array();
    for (int d = 0; d < co->vars[v].rank; d++)
      json_array_append_new(shape, json_integer(co->vars[v].shape[d]));
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "kind", json_string(co->vars[v].kind ==
                                                       TSR_VAR_ROW_SPARSE
                                                   ? "row_sparse"
                                                   : "dense"));
    int ns = 0;
    for (size_t k = 0; k < co->n_shards; k++)
      if ((size_t)co->shards[k].var == v) ns = co->shards[k].num_shards;
    /* dense "allreduce": one part, the chief's, from a worker */
    if (co->job.dense_allreduce && co->vars[v].kind == TSR_VAR_DENSE) ns = 1;
    json_object_set_new(o, "num_shards", json_integer(ns));
    json_t *init = json_object();
    json_object_set_new(init, "name",
                        json_string(tsr_init_name(co->vars[v].init.kind)));
    json_object_set_new(init, "a", json_real(co->vars[v].init.a));
    json_object_set_new(init, "b", json_real(co->vars[v].init.b));
    json_object_set_new(init, "fan_in", json_integer(co->vars[v].init.fan_in));
    json_object_set_new(init, "fan_out",
                        json_integer(co->vars[v].init.fan_out));
    json_object_set_new(o, "init", init);
    json_array_append_new(vars, o);
  }
  json_object_set_new(m, "variables", vars);
  char err[512] = "";
  /* every PS reported its files and each is verified (ckpt.h) */
  int rc = chief_ckpt_commit_verified(co->job.checkpoint_dir, step, m,
                                      &co->ckpt_files, co->n_ps,
                                      co->job.checkpoint_per_ps, err,
                                      sizeof err);
  json_decref(m);
  coord_event ev = {.kind = rc ? COORD_EV_CKPT_FAILED
                               : COORD_EV_CKPT_COMMITTED,
                    .op = op, .step = step, .status = rc,
                    .msg = rc ? (err[0] ? err : tsr_strerror(rc)) : NULL};
  coord__post(co, &ev);
}

/* ---- fire and forget ----------------------------------------------------- */

static void coord_ps_on_leave(const ps_result *r, void *data) {
  coord_ps *p = data;
  if (r->status && r->status != TSR_ENOTFOUND)
    tsr_debug("ps:%d: a worker leaving its clocks: %s", p->index, r->message);
}

void coord__ps_release(coord *co, int worker) {
  for (int p = 0; p < co->n_ps; p++)
    if (co->ps[p].cli)
      ps_client_leave(co->ps[p].cli, worker, co->run_id,
                      co->wk[worker].last_closure, coord_ps_on_leave,
                      &co->ps[p]);
}

/* Statistics never hold a phase: the machine does not hear of them. */
typedef struct {
  coord_ps *ps;
} coord_stats_call;

static void coord_ps_on_stats(const ps_result *r, void *data) {
  coord_stats_call *call = data;
  coord_ps *p = call->ps;
  coord *co = p->co;
  p->busy = false;
  free(call);
  if (r->status == 0 && co->trace && r->payload_len) {
    size_t max = r->payload_len / TSR_TRACE_WIRE_SIZE, n = 0;
    tsr_trace_event *ev = malloc((max ? max : 1) * sizeof *ev);
    if (ev && tsr_trace_unpack(r->payload, r->payload_len, ev, max, &n) == 0)
      tsr_trace_append(co->trace, ev, n);
    free(ev);
  }
  if (r->status || !r->stats || !co->metrics) return;
  const Tessera__Ps__StatsResponse *st = r->stats;
  int64_t step = coord__step(co);
  char tag[64];
  snprintf(tag, sizeof tag, "ps/%d/bytes_in", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->bytes_in, 0);
  snprintf(tag, sizeof tag, "ps/%d/bytes_out", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->bytes_out, 0);
  double apply_ms = st->applies ? (double)st->apply_ns / 1e6 /
                                      (double)st->applies
                                : 0;
  snprintf(tag, sizeof tag, "ps/%d/apply_ms", p->index);
  chief_metrics_scalar(co->metrics, tag, step, apply_ms, 0);
  snprintf(tag, sizeof tag, "ps/%d/mem_bytes", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->mem_used, 0);
  p->bytes_in = st->bytes_in;
  p->bytes_out = st->bytes_out;
  p->apply_ms = apply_ms;
}

static void coord_ps_stats_one(coord_ps *p, bool drain) {
  coord_stats_call *call = calloc(1, sizeof *call);
  if (!call) return;
  call->ps = p;
  int rc = drain ? ps_client_stats_drain(p->cli, coord_ps_on_stats, call)
                 : ps_client_stats(p->cli, coord_ps_on_stats, call);
  if (rc == 0)
    p->busy = true;
  else
    free(call);
}

void coord__ps_stats(coord *co) {
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    if (p->connected && !p->busy) coord_ps_stats_one(p, co->trace != NULL);
  }
}

/* ---- the end ------------------------------------------------------------ */

static void coord_ps_on_shutdown(const ps_result *r, void *data) {
  coord_ps *p = data;
  coord *co = p->co;
  (void)r;
  if (--co->shutdown_pending == 0) {
    coord_event ev = {.kind = COORD_EV_SHUTDOWN_DONE, .op = co->shutdown_op};
    coord__post(co, &ev);
  }
}

void coord__ps_shutdown(coord *co) {
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    /* the last applies, answered before the shutdown sent after it */
    if (co->trace) coord_ps_stats_one(p, true);
    /* the job is done: the PS may exit 0 */
    if (ps_client_shutdown(p->cli, true, coord_ps_on_shutdown, p) == 0)
      co->shutdown_pending++;
  }
}

static void coord_ps_closed(void *data) { (void)data; }

void coord__ps_close(coord *co) {
  if (!co->ps) return;
  for (int i = 0; i < co->n_ps; i++)
    if (co->ps[i].cli) {
      ps_client_close(co->ps[i].cli, coord_ps_closed, NULL);
      co->ps[i].cli = NULL;
    }
}
