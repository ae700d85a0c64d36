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

bool coord__conn_error(int status) {
  return status == TSR_ECLOSED || status == TSR_EUNAVAIL ||
         status == TSR_ETIMEOUT || status == TSR_ESHUTDOWN;
}

/* The gathered operation of `op`: the checkpoint's, or the other one
 * (NULL: neither, an answer to an operation given up on). */
static coord_psop *coord_psop_of(coord *co, uint64_t op) {
  if (op && co->psop.op == op) return &co->psop;
  if (op && co->ckop.op == op) return &co->ckop;
  if (op && co->evop.op == op) return &co->evop;
  return NULL;
}

static void coord_psop_begin(coord *co, coord_psop *o, uint64_t op,
                             coord_ev_kind done) {
  memset(o, 0, sizeof *o);
  o->op = op;
  o->done = done;
  o->failed_ps = -1;
  o->pending = 1; /* held until every call is started */
}

static void coord_psop_end(coord *co, uint64_t op) {
  coord_psop *o = coord_psop_of(co, op);
  if (!o || --o->pending > 0) return;
  coord_event ev = {.kind = o->done, .op = o->op, .status = o->status,
                    .index = o->failed_ps, .lost = o->lost,
                    .msg = o->status ? o->msg : NULL};
  o->op = 0; /* answered: late answers find no operation */
  coord__post(co, &ev);
}

static void coord_psop_result(coord *co, uint64_t op, coord_ps *p,
                              const char *what, int status,
                              const char *message) {
  coord_psop *o = coord_psop_of(co, op);
  if (!o) return;
  /* `lost`: a PS's call failed by its connection (the machine then takes
   * the checkpoint again once every PS is whole); the chief's own parts
   * (the folder, the dense state from a worker) are never a lost PS: a
   * checkpoint they fail is not taken again at once (with no worker ready
   * for the dense state, it would be taken again and fail at once, for
   * ever) */
  bool lost = p && coord__conn_error(status);
  if (status && !o->status) {
    o->status = status;
    o->failed_ps = p ? p->index : -1;
    o->lost = lost;
    snprintf(o->msg, sizeof o->msg, "%s: %s", what,
             message && message[0] ? message : tsr_strerror(status));
  } else if (lost) {
    o->lost = true;
  }
  coord_psop_end(co, op);
}

void coord__psop_add(coord *co, uint64_t op) {
  coord_psop *o = coord_psop_of(co, op);
  if (o) o->pending++;
}

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

coord_ps_call *coord__ps_call_new(coord_ps *p, uint64_t op,
                                  const char *what) {
  coord_ps_call *c = calloc(1, sizeof *c);
  if (c) {
    c->ps = p;
    c->op = op;
    c->what = what;
  }
  return c;
}

/* A call to PS p for every-PS operation `op`, or NULL when out of memory
 * after counting that as p's answer (the caller sends no more). */
static coord_ps_call *coord_ps_call_or_fail(coord *co, coord_ps *p,
                                            uint64_t op, const char *what) {
  coord_ps_call *call = coord__ps_call_new(p, op, what);
  if (!call) coord_psop_result(co, op, p, what, TSR_ENOMEM, "out of memory");
  return call;
}

/* One call of the operation: started (its answer ends it) or failed at
 * once. */
static void coord_ps_started(coord *co, coord_ps_call *call, int rc) {
  coord_psop *o = coord_psop_of(co, call->op);
  if (o) o->pending++;
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

int coord__ps_specs(coord *co, int i, ps_var_spec **out, size_t *n_out) {
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
    specs[j].materialized = co->job.sparse_materialized &&
                            ps_var_spec_sparse(&specs[j]);
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

ps_config coord__ps_cfg(coord *co, int i, char *buf, size_t len) {
  return (ps_config){.mode = coord_mode_text(co, buf, len),
                     .allow_nonfinite = false,
                     .trace_pid = co->trace ? tsr_trace_pid(TSR_TASK_PS, i)
                                            : -1,
                     .checkpoint_root = co->job.checkpoint_dir,
                     .run_id = co->run_id};
}

void coord__ps_setup(coord *co, uint64_t op, bool hold) {
  char buf[32];
  coord_psop_begin(co, &co->psop, op, COORD_EV_SETUP_DONE);
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    /* a restore alone still going on is given up: its answers find no
     * operation, and its restore is not sent after this setup */
    p->fix_op = 0;
    coord_ps_call *call = coord_ps_call_or_fail(co, p, op, "config");
    if (!call) break;
    /* a new era on every PS: nothing from before (this chief's own run
     * before a restart, another run) is taken from here on */
    ps_config cfg = coord__ps_cfg(co, i, buf, sizeof buf);
    cfg.hold_until_restore = hold;
    coord_ps_started(co, call, ps_client_configure(p->cli, &cfg,
                                                   coord_ps_on_result, call));
    ps_var_spec *specs;
    size_t n;
    int rc = coord__ps_specs(co, i, &specs, &n);
    if (rc) {
      coord_psop_result(co, op, p, "create", rc, "variable spec");
      break;
    }
    if (n == 0) continue;
    call = coord__ps_call_new(p, op, "create");
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
  const Tessera__Ps__SaveResponse *sr = r->save;
  if (status == 0 && sr && sr->incremental) co->ckpt_any_inc = true;
  coord_psop_result(co, call->op, call->ps, call->what, status, msg);
  free(call);
}

int coord__restore_plan(coord *co, int64_t step, coord_restore_plan *pl,
                        char *err, size_t errlen) {
  memset(pl, 0, sizeof *pl);
  char dir[4096];
  pl->step = step;
  if (chief_ckpt_name(step, pl->name, sizeof pl->name) ||
      chief_ckpt_dir(co->job.checkpoint_dir, step, dir, sizeof dir))
    return tsr_errf(err, errlen, TSR_ERANGE, "checkpoint path too long");
  /* the files must be of the checkpoint the manifest commits */
  int64_t st;
  json_t *m = NULL;
  if (chief_ckpt_read(dir, &st, &m, NULL, 0, err, errlen))
    return 0; /* no manifest: any id, the files must agree on one */
  const char *s = json_string_value(json_object_get(m, "checkpoint_id"));
  snprintf(pl->id, sizeof pl->id, "%s", s ? s : "");
  chief_ckpt_link chain[CHIEF_CKPT_CHAIN_MAX];
  size_t n = 1;
  int rc = chief_ckpt_chain(co->job.checkpoint_dir, step, m, chain, &n, err,
                            errlen);
  json_decref(m);
  if (rc) return rc;
  /* an increment: the checkpoints it builds on, the whole one first */
  pl->n_chain = n - 1;
  for (size_t k = 0; k < pl->n_chain; k++) {
    chief_ckpt_name(chain[k].step, pl->chain_dir[k], sizeof pl->chain_dir[k]);
    snprintf(pl->chain_id[k], sizeof pl->chain_id[k], "%s", chain[k].id);
    pl->links[k] = (ps_chain_link){pl->chain_dir[k], pl->chain_id[k],
                                   chain[k].step};
  }
  pl->base = chain[0].step;
  pl->n_links = (int)n;
  pl->known = true;
  return 0;
}

int coord__restore_call(coord_ps *p, const coord_restore_plan *pl,
                        ps_client_cb cb, void *data) {
  /* a restore starts the clocks at the checkpoint's step on that PS */
  return pl->n_chain
             ? ps_client_restore_chain(p->cli, pl->name, pl->id, pl->step,
                                       pl->links, pl->n_chain, cb, data)
             : ps_client_restore_ckpt(p->cli, pl->name, pl->id, pl->step, cb,
                                      data);
}

static void coord_ps_dir_call(coord *co, uint64_t op, int64_t step,
                              bool save) {
  /* named relative to the checkpoint root each PS was configured with */
  char name[64], dir[4096], err[512];
  coord_restore_plan pl;
  if (save)
    coord_psop_begin(co, &co->ckop, op, COORD_EV_SAVE_DONE);
  else
    coord_psop_begin(co, &co->psop, op, COORD_EV_RESTORE_DONE);
  if (chief_ckpt_name(step, name, sizeof name) ||
      chief_ckpt_dir(co->job.checkpoint_dir, step, dir, sizeof dir)) {
    coord_psop_result(co, op, NULL, save ? "save" : "restore", TSR_ERANGE,
                      "checkpoint path too long");
    coord_psop_end(co, op);
    return;
  }
  if (save) {
    chief_ckpt_files_start(&co->ckpt_files, step);
    /* an increment over the checkpoint the PS hold, up to full_every
     * links; a PS that does not know it saves whole */
    co->ckpt_inc = co->job.checkpoint_full_every > 1 && co->ck_on.valid &&
                   co->ck_on.links < co->job.checkpoint_full_every &&
                   co->ck_on.step < step;
    co->ckpt_any_inc = false;
  } else {
    int rc = coord__restore_plan(co, step, &pl, err, sizeof err);
    if (rc) {
      coord_psop_result(co, op, NULL, "restore", rc, err);
      coord_psop_end(co, op);
      return;
    }
    if (pl.known) { /* the PS hold it once restored: the next increment
                       builds on it */
      co->ck_on.valid = true;
      co->ck_on.step = step;
      co->ck_on.base = pl.base;
      co->ck_on.links = pl.n_links;
      snprintf(co->ck_on.id, sizeof co->ck_on.id, "%s", pl.id);
    }
  }
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    const char *what = save ? "save" : "restore";
    if (save && !p->connected) {
      /* a call waits for the connection, and a save must reach only the
       * process that holds the shards now, never one started after it */
      coord_psop_result(co, op, p, what, TSR_EUNAVAIL, "not connected");
      continue;
    }
    coord_ps_call *call = coord_ps_call_or_fail(co, p, op, what);
    if (!call) break;
    /* a save is answered once snapshotted: its files come with SAVE_WAIT */
    int rc = save ? ps_client_save_since(p->cli, name, co->ckpt_files.id,
                                         step, co->job.checkpoint_per_ps,
                                         co->ckpt_inc ? co->ck_on.id : "",
                                         coord_ps_on_result, call)
                  : coord__restore_call(p, &pl, coord_ps_on_result, call);
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

typedef struct {
  uint64_t op;
  int64_t step;
} coord_save_req;

/* The folder is made (off the loop): every PS saves into it. */
static void coord_ps_folder_made(coord *co, int rc, const char *err,
                                 void *data) {
  coord_save_req *q = data;
  uint64_t op = q->op;
  int64_t step = q->step;
  free(q);
  if (rc) {
    coord_event ev = {.kind = COORD_EV_SAVE_DONE, .op = op, .status = rc,
                      .index = -1, .msg = err};
    coord__post(co, &ev);
    return;
  }
  /* a PS lost while the folder was made ended this checkpoint: nobody
   * waits for its save, which must not reach that PS started again */
  if (!coord_sm_save_wanted(co->sm, op)) {
    tsr_info("checkpoint of step %" PRId64 ": ended (a PS was lost) while "
             "its folder was made; no PS is asked to save it", step);
    return;
  }
  coord_ps_dir_call(co, op, step, true);
}

void coord__ps_save(coord *co, uint64_t op, int64_t step) {
  coord_save_req *q = malloc(sizeof *q);
  if (!q) {
    coord_event ev = {.kind = COORD_EV_SAVE_DONE, .op = op,
                      .status = TSR_ENOMEM, .index = -1,
                      .msg = "out of memory"};
    coord__post(co, &ev);
    return;
  }
  q->op = op;
  q->step = step;
  co->save_step = step;
  co->save_examples = co->examples;
  coord__fs_prepare(co, step, coord_ps_folder_made, q);
}

/* How long every PS may take to write its files: the machine's own
 * deadline for it (coord_sm_ckpt.c) is a little longer, so this call's
 * error comes first. */
static uint32_t coord__ckpt_write_ms(const coord *co) {
  double s = co->o->closure_timeout_s > 120 ? co->o->closure_timeout_s : 120;
  return s * 1000 < UINT32_MAX ? (uint32_t)(s * 1000) : UINT32_MAX;
}

void coord__ps_save_wait(coord *co, uint64_t op, int64_t step) {
  (void)step;
  coord_psop_begin(co, &co->ckop, op, COORD_EV_SAVE_WRITTEN);
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    coord_ps_call *call = coord_ps_call_or_fail(co, p, op, "save");
    if (!call) break;
    /* answered once the files are written: a deadline for the writing
     * (gigabytes at the disk's pace), not for one call */
    ps_client_set_deadline(p->cli, coord__ckpt_write_ms(co));
    coord_ps_started(co, call, ps_client_save_wait(p->cli, co->ckpt_files.id,
                                                   coord_ps_on_save, call));
    ps_client_set_deadline(p->cli, 120000);
  }
  coord_psop_end(co, op);
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

/* The commit's checks read every file whole (a materialized billion-
 * parameter model: gigabytes): they run on the pool, so the loop goes on
 * counting closures and dispatching the next ones meanwhile. Nothing
 * else touches the manifest or the checkpoint's file list until the
 * machine hears the answer. */
typedef struct {
  uv_work_t work;
  coord *co;
  uint64_t op;
  int64_t step;
  json_t *m;
  bool inc;        /* an increment over co->ck_on */
  int64_t base;
  int links;
  char id[CHIEF_CKPT_ID_MAX + 1];
  int rc;
  char err[512];
} coord_commit;

static void coord_commit_work(uv_work_t *w) {
  coord_commit *c = w->data;
  coord *co = c->co;
  /* every PS reported its files and each is verified (ckpt.h) */
  c->rc = chief_ckpt_commit_verified(co->job.checkpoint_dir, c->step, c->m,
                                     &co->ckpt_files, co->n_ps,
                                     co->job.checkpoint_per_ps, c->err,
                                     sizeof c->err);
}

static void coord_commit_done(uv_work_t *w, int status) {
  coord_commit *c = w->data;
  coord *co = c->co;
  int rc = status ? status : c->rc;
  if (!rc) { /* the PS hold it: the next increment builds on it */
    co->ck_on.valid = true;
    co->ck_on.step = c->step;
    co->ck_on.base = c->base;
    co->ck_on.links = c->links;
    snprintf(co->ck_on.id, sizeof co->ck_on.id, "%s", c->id);
  }
  coord_event ev = {.kind = rc ? COORD_EV_CKPT_FAILED
                               : COORD_EV_CKPT_COMMITTED,
                    .op = c->op, .step = c->step, .status = rc,
                    .increment = c->inc, .base = c->base,
                    .msg = rc ? (c->err[0] ? c->err : tsr_strerror(rc))
                              : NULL};
  coord__post(c->co, &ev);
  json_decref(c->m);
  free(c);
}

/* The manifest, the commit point (chief/ckpt/ckpt.h). total_steps (when
 * known) tells the evaluator sidecar which checkpoint is the job's last. */
void coord__ps_commit(coord *co, uint64_t op, int64_t step, int64_t total) {
  json_t *m = json_object();
  json_object_set_new(m, "run_id", json_integer((json_int_t)co->run_id));
  json_object_set_new(m, "wall_time", json_real(tsr_wall_s()));
  json_object_set_new(m, "examples", json_integer(step == co->save_step
                                                       ? co->save_examples
                                                       : co->examples));
  coord__outcome_put(co, m);
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
  coord_commit *c = calloc(1, sizeof *c);
  int rc = c ? 0 : TSR_ENOMEM;
  if (c) {
    c->co = co;
    c->op = op;
    c->step = step;
    c->m = m;
    /* an increment when some PS saved one; else whole */
    c->inc = co->ckpt_inc && co->ckpt_any_inc;
    c->base = c->inc ? co->ck_on.base : step;
    c->links = c->inc ? co->ck_on.links + 1 : 1;
    snprintf(c->id, sizeof c->id, "%s", co->ckpt_files.id);
    json_object_set_new(m, "kind", json_string(c->inc ? "increment" : "full"));
    json_object_set_new(m, "base_step", json_integer(c->base));
    json_object_set_new(m, "links", json_integer(c->links));
    if (c->inc) {
      json_t *prev = json_object();
      json_object_set_new(prev, "step", json_integer(co->ck_on.step));
      json_object_set_new(prev, "checkpoint_id", json_string(co->ck_on.id));
      json_object_set_new(m, "previous", prev);
    }
    c->work.data = c;
    rc = uv_queue_work(&co->loop, &c->work, coord_commit_work,
                       coord_commit_done);
  }
  if (rc) {
    free(c);
    json_decref(m);
    coord_event ev = {.kind = COORD_EV_CKPT_FAILED, .op = op, .step = step,
                      .status = rc, .msg = tsr_strerror(rc)};
    coord__post(co, &ev);
  }
}

/* ---- an evaluation's snapshot ------------------------------------------- */

/* Longer than the evaluation may take (its closure deadline): a PS drops a
 * snapshot nobody released (a chief that died) after this. */
static uint32_t coord_snapshot_ttl_s(const coord *co) {
  double s = co->o->closure_timeout_s * 2 + 60;
  return s < 86400 ? (uint32_t)s : 86400;
}

void coord__ps_snapshot(coord *co, uint64_t op) {
  coord_psop_begin(co, &co->evop, op, COORD_EV_SNAPSHOT_DONE);
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    coord_ps_call *call = coord_ps_call_or_fail(co, p, op, "snapshot");
    if (!call) break;
    coord_ps_started(co, call, ps_client_snapshot(p->cli, op, false,
                                                  coord_snapshot_ttl_s(co),
                                                  coord_ps_on_result, call));
  }
  coord_psop_end(co, op);
}

static void coord_ps_on_unsnapshot(const ps_result *r, void *data) {
  coord_ps *p = data;
  if (r->status)
    tsr_debug("ps:%d: dropping an evaluation snapshot: %s", p->index,
              r->message);
}

void coord__ps_unsnapshot(coord *co, uint64_t op) {
  for (int i = 0; i < co->n_ps; i++)
    if (co->ps[i].cli)
      ps_client_snapshot(co->ps[i].cli, op, true, 0, coord_ps_on_unsnapshot,
                         &co->ps[i]);
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
