/* The coordinator's state machine (coord_sm.h): the event dispatch, the
 * phases around training (connect, setup, restore, recovery, final,
 * shutdown) and the queries. Training and the workers are in
 * coord_sm_train.c, checkpoints and evaluation in coord_sm_ckpt.c.
 *
 * Every event first updates what it reports (a PS is up, a call ended),
 * then the current phase's pump runs until the phase stops changing: it
 * checks the phase's deadline and moves on when what it waits for is
 * there. A failure sets FAILED and emits FAIL once; later events are
 * ignored.
 */
#include "chief/coord/coord_sm_int.h"
#include "common/err.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/mem.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sm_phase_names[] = {
    "connect", "setup", "restore",  "train", "pause",  "save",
    "eval",    "recover", "final",  "shutdown", "done",  "failed"};

/* ---- actions ------------------------------------------------------------ */

void coord_actions_init(coord_actions *as) { memset(as, 0, sizeof *as); }

void coord_actions_free(coord_actions *as) {
  free(as->a);
  memset(as, 0, sizeof *as);
}

coord_action *sm__emit(coord_sm *sm, coord_act_kind k) {
  coord_actions *as = sm->out;
  if (tsr_grow(&as->a, &as->cap, as->n, sizeof *as->a, 16)) {
    sm->oom = true;
    return NULL;
  }
  coord_action *a = &as->a[as->n++];
  memset(a, 0, sizeof *a);
  a->kind = k;
  a->index = -1;
  a->step = -1;
  return a;
}

void sm__note(coord_sm *sm, int level, const char *fmt, ...) {
  coord_action *a = sm__emit(sm, COORD_ACT_NOTE);
  if (!a) return;
  a->level = level;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->msg, sizeof a->msg, fmt, ap);
  va_end(ap);
}

void sm__fail(coord_sm *sm, int status, const char *fmt, ...) {
  if (sm->ended) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sm->fail_msg, sizeof sm->fail_msg, fmt, ap);
  va_end(ap);
  if (!sm->fail_msg[0]) snprintf(sm->fail_msg, sizeof sm->fail_msg, "failed");
  sm->exit_status = status ? status : 1;
  sm->phase = SM_FAILED;
  sm->ended = true;
  coord_action *a = sm__emit(sm, COORD_ACT_FAIL);
  if (a) {
    a->status = sm->exit_status;
    snprintf(a->msg, sizeof a->msg, "%s", sm->fail_msg);
  }
}

coord_action *sm__start_op(coord_sm *sm, sm_phase p, coord_act_kind k) {
  sm__set_phase(sm, p);
  sm->op = ++sm->next_op;
  coord_action *a = sm__emit(sm, k);
  if (a) a->op = sm->op;
  return a;
}

void sm__set_phase(coord_sm *sm, sm_phase p) {
  if (sm->phase == p) return;
  sm->phase = p;
  sm->t_phase = sm->now;
  sm->t_note = 0;
}

bool sm__lockstep(const coord_sm *sm) {
  return sm->c.mode == TSR_MODE_SYNC || sm->c.lockstep;
}

bool sm__nodrain(const coord_sm *sm) {
  return sm->c.mode == TSR_MODE_ASYNC && !sm->c.lockstep;
}

int64_t sm__global(const coord_sm *sm) {
  int64_t done = chief_sched_done_steps(sm->sched);
  return sm__lockstep(sm) ? done / sm->c.n_wk : done;
}

int64_t sm__wsteps(const coord_sm *sm, int64_t global) {
  return sm__lockstep(sm) ? global * sm->c.n_wk : global;
}

bool sm__ps_lost(const coord_sm *sm) {
  for (int i = 0; i < sm->c.n_ps; i++)
    if (sm->ps[i].lost) return true;
  return false;
}

/* Our deadline for a call the RPC layer already bounds by d: a little
 * later, so its own error normally comes first. */
double sm__grace(double d) { return d + d / 10 + 5; }

/* ---- connect ------------------------------------------------------------ */

size_t sm__ps_away(const coord_sm *sm, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < sm->c.n_ps && off + 8 < len; i++)
    if (!sm->ps[i].connected)
      off += (size_t)snprintf(buf + off, len - off, " %s", sm->ps[i].name);
  return off;
}

/* The PS not connected, then the workers down. */
static void sm_missing(const coord_sm *sm, char *buf, size_t len) {
  size_t off = sm__ps_away(sm, buf, len);
  for (int i = 0; i < sm->c.n_wk && off + 8 < len; i++)
    if (sm->wk[i].st == COORD_WK_DOWN)
      off += (size_t)snprintf(buf + off, len - off, " %s", sm->wk[i].name);
}

bool sm__all_ps(const coord_sm *sm) {
  for (int i = 0; i < sm->c.n_ps; i++)
    if (!sm->ps[i].connected) return false;
  return true;
}

void sm__enter_setup(coord_sm *sm) {
  coord_action *a = sm__start_op(sm, SM_SETUP, COORD_ACT_SETUP_PS);
  /* async: closures from before may still run (their calls wait for a
   * lost PS instead of failing); nothing of theirs may read the initial
   * values before the restore swaps the checkpoint in */
  if (a)
    a->hold = sm->c.mode == TSR_MODE_ASYNC && sm->c.ckpt &&
              sm__newest_good(sm) >= 0;
}

static void sm_pump_connect(coord_sm *sm) {
  int up = sm->c.n_wk - sm__count(sm, COORD_WK_DOWN);
  bool ps_ok = sm__all_ps(sm);
  if (ps_ok && up == sm->c.n_wk) {
    sm__note(sm, TSR_LOG_INFO, "cluster ready: %d ps, %d worker(s)",
             sm->c.n_ps, sm->c.n_wk);
    sm__enter_setup(sm);
    return;
  }
  double waited = sm->now - sm->t_phase;
  char missing[COORD_MSG_MAX - 100];
  if (waited > sm->c.wait_timeout_s) {
    if (ps_ok && up > 0) {
      sm__note(sm, TSR_LOG_WARN, "starting with %d of %d workers after "
               "%.0f s; the others get work when they come up", up,
               sm->c.n_wk, waited);
      sm__enter_setup(sm);
      return;
    }
    sm_missing(sm, missing, sizeof missing);
    sm__fail(sm, 1, "cluster not ready after %.0f s; missing:%s", waited,
             missing);
    return;
  }
  if (waited >= 1.0 && sm->now - sm->t_note >= 5.0) {
    sm->t_note = sm->now;
    sm_missing(sm, missing, sizeof missing);
    sm__note(sm, TSR_LOG_INFO, "waiting for:%s (%.0f s of %.0f s)", missing,
             waited, sm->c.wait_timeout_s);
  }
}

/* ---- setup, restore, recovery ------------------------------------------- */

static const char *sm_ps_name(const coord_sm *sm, int i) {
  return i >= 0 && i < sm->c.n_ps ? sm->ps[i].name : "a PS";
}

static void sm_enter_restore(coord_sm *sm, int64_t step) {
  sm->restore_step = step;
  coord_action *a = sm__start_op(sm, SM_RESTORE, COORD_ACT_RESTORE);
  if (a) a->step = step;
}

/* Every PS holds the variables: restore, take the first checkpoint, or
 * train. */
static void sm_setup_ok(coord_sm *sm) {
  int64_t target = sm->c.ckpt ? sm__newest_good(sm) : -1;
  if (target >= 0) {
    sm_enter_restore(sm, target);
    return;
  }
  sm->tries = 0;
  if (sm->recovering) {
    int64_t step = sm__global(sm);
    int lost = 0;
    while (lost < sm->c.n_ps - 1 && !sm->ps[lost].lost) lost++;
    /* from step 0 the initial values are exact; later they are not what
     * the shards had learned */
    if (step > 0 && sm->c.ckpt) {
      sm__fail(sm, 1, "%s was lost at step %" PRId64 " and no checkpoint "
               "was ever committed: its shards would start again from their "
               "initial values; the run stops", sm_ps_name(sm, lost), step);
      return;
    }
    if (step > 0) {
      sm->initial_restarts++;
      sm__note(sm, TSR_LOG_WARN, "no checkpoint to restore (the job keeps "
               "none): %s starts its shards from their initial values at "
               "step %" PRId64 "; the run goes on and will exit 1",
               sm_ps_name(sm, lost), step);
    } else {
      sm__note(sm, TSR_LOG_WARN, "no checkpoint to restore: the PS start "
               "their shards from their initial values at step 0");
    }
    for (int i = 0; i < sm->c.n_ps; i++) sm->ps[i].lost = false;
    sm->restarts_ps++;
    sm->recovering = false;
    sm->pending_resume = step;
    sm->pending_why = SM_START_PS;
    sm__enter_train(sm);
    return;
  }
  /* a PS lost before training began holds the variables made since */
  for (int i = 0; i < sm->c.n_ps; i++) sm->ps[i].lost = false;
  sm->pending_resume = 0;
  sm->pending_why = SM_START_FRESH;
  if (sm->c.ckpt) {
    /* the first checkpoint, so a lost PS always has one to go back to */
    sm->ckpt_due = true;
    sm__enter_drain(sm, SM_TRAIN);
    return;
  }
  sm__enter_train(sm);
}

static void sm_setup_failed(coord_sm *sm, int ps, bool lost,
                            const char *msg) {
  sm->tries++;
  if (!lost) {
    sm__fail(sm, 1, "%s: creating the variables failed: %s",
             sm_ps_name(sm, ps), msg);
    return;
  }
  sm__note(sm, TSR_LOG_WARN, "setting up the PS failed (try %d of %d): "
           "%s: %s", sm->tries, sm->c.restore_tries, sm_ps_name(sm, ps), msg);
  if (sm->tries >= sm->c.restore_tries) {
    sm__fail(sm, 1, "the parameter servers could not be set up in %d "
             "tries; last: %s: %s", sm->tries, sm_ps_name(sm, ps), msg);
    return;
  }
  sm__enter_recover(sm, false);
}

static void sm_restore_failed(coord_sm *sm, int ps, const char *msg) {
  int64_t step = sm->restore_step;
  sm->tries++;
  sm__note(sm, TSR_LOG_WARN, "restoring the checkpoint of step %" PRId64
           " failed (try %d of %d): %s: %s", step, sm->tries,
           sm->c.restore_tries, sm_ps_name(sm, ps), msg);
  if (sm->tries >= sm->c.restore_tries) {
    sm__mark_bad(sm, step);
    int64_t older = sm__newest_good(sm);
    if (older < 0) {
      sm__fail(sm, 1, "the checkpoint of step %" PRId64 " could not be "
               "restored in %d tries and there is no older one: %s: %s",
               step, sm->tries, sm_ps_name(sm, ps), msg);
      return;
    }
    sm__note(sm, TSR_LOG_WARN, "the checkpoint of step %" PRId64 " cannot "
             "be restored; falling back to the checkpoint of step %" PRId64,
             step, older);
    sm->tries = 0;
  }
  sm__enter_recover(sm, false);
}

static void sm_restore_ok(coord_sm *sm) {
  int64_t step = sm->restore_step;
  sm->tries = 0;
  for (int i = 0; i < sm->c.n_ps; i++) sm->ps[i].lost = false;
  if (sm->recovering) {
    sm->restarts_ps++;
    sm__note(sm, TSR_LOG_INFO, "recovered: every PS restored the checkpoint "
             "of step %" PRId64 "; resuming from there", step);
    sm->pending_why = SM_START_PS;
  } else {
    sm->resumed_from = step;
    sm__note(sm, TSR_LOG_INFO, "resuming from the checkpoint of step %"
             PRId64, step);
    sm->pending_why = SM_START_CHIEF;
  }
  sm->recovering = false;
  sm->pending_resume = step;
  sm__enter_train(sm);
}

bool sm__op_answer(coord_sm *sm, const coord_event *ev, sm_phase phase) {
  if (sm->phase != phase || ev->op != sm->op) return false;
  if (ev->lost && ev->index >= 0 && ev->index < sm->c.n_ps)
    sm->ps[ev->index].lost = true;
  return true;
}

static void sm_on_ps(coord_sm *sm, const coord_event *ev) {
  int i = ev->index;
  bool one = i >= 0 && i < sm->c.n_ps;
  sm_ps *p = one ? &sm->ps[i] : NULL;
  const char *msg = ev->msg ? ev->msg : "connection lost";
  if (!one && (ev->kind == COORD_EV_PS_UP || ev->kind == COORD_EV_PS_LOST))
    return;
  switch (ev->kind) {
    case COORD_EV_PS_UP:
      if (!p->connected && p->lost)
        sm__note(sm, TSR_LOG_INFO, "%s is back", p->name);
      p->connected = true;
      break;
    case COORD_EV_PS_LOST:
      p->connected = false;
      if (sm->phase == SM_CONNECT || sm->phase >= SM_SHUTDOWN) break;
      if (!p->lost) sm__note(sm, TSR_LOG_WARN, "lost %s: %s", p->name, msg);
      p->lost = true;
      break;
    case COORD_EV_SETUP_DONE:
      if (!sm__op_answer(sm, ev, SM_SETUP)) break;
      if (ev->status == 0)
        sm_setup_ok(sm);
      else
        sm_setup_failed(sm, ev->index, ev->lost, msg);
      break;
    case COORD_EV_RESTORE_DONE:
      if (!sm__op_answer(sm, ev, SM_RESTORE)) break;
      if (ev->status == 0)
        sm_restore_ok(sm);
      else
        sm_restore_failed(sm, ev->index, msg);
      break;
    default:
      break;
  }
}

/* ---- the end ------------------------------------------------------------ */

void sm__enter_final(coord_sm *sm) {
  sm->t_train_end = sm->now;
  sm__set_phase(sm, SM_FINAL);
  sm->t_final_wait = sm->now;
}

static void sm_finish(coord_sm *sm) {
  sm->phase = SM_DONE;
  sm->ended = true;
  sm->exit_status = 0;
  coord_action *a = sm__emit(sm, COORD_ACT_FINISH);
  if (a) a->status = 0;
}

static void sm_pump_final(coord_sm *sm) {
  /* the last checkpoint and evaluation need every PS whole */
  if (sm__ps_fixing(sm)) return;
  /* the last checkpoint; or one still due, left by a pause that a lost PS
   * ended (the one before was still committing, say): the run must not
   * end on the checkpoint before */
  if (!sm->final_ckpt_done || sm->ckpt_due) {
    sm->final_ckpt_done = true;
    if (sm->c.ckpt && sm__newest_good(sm) != sm__global(sm)) {
      sm->ckpt_due = true;
      sm__enter_drain(sm, SM_FINAL);
      return;
    }
    sm->ckpt_due = false;
  }
  if (!sm->final_eval_done && sm->c.has_eval) {
    if (sm__ready_worker(sm) < 0) {
      /* a finished job resumed by a restarted chief: its workers may not
       * be configured yet */
      sm__configure_workers(sm);
      double waited = sm->now - sm->t_final_wait;
      if (waited <= sm->c.wait_timeout_s) return;
      sm__note(sm, TSR_LOG_WARN, "final evaluation skipped: no worker was "
               "ready within %.0f s", waited);
      sm->final_eval_done = true;
    } else {
      sm->final_eval_done = true;
      sm->eval_due = true;
      sm__eval_start(sm);
    }
  }
  sm->final_eval_done = true;
  if (sm__ckpt_busy(sm)) return; /* the last checkpoint is still written */
  if (sm__eval_busy(sm)) return; /* the last evaluation is going on */
  if (sm->c.keep_cluster) {
    sm_finish(sm);
    return;
  }
  sm__start_op(sm, SM_SHUTDOWN, COORD_ACT_SHUTDOWN);
}

/* ---- dispatch ----------------------------------------------------------- */

static void sm_pump(coord_sm *sm) {
  for (int guard = 0; guard < 32 && !sm->ended && !sm->oom; guard++) {
    sm_phase before = sm->phase;
    bool training = sm->phase == SM_TRAIN || sm->phase == SM_DRAIN ||
                    sm->phase == SM_FINAL;
    /* async: a lost PS is restored alone while training goes on; else
     * (or when that cannot be) every PS goes back to the checkpoint, from
     * training or the snapshot it paused for (which went with the PS) */
    if (sm__ps_lost(sm) && !sm__pump_alone(sm) &&
        (training || sm->phase == SM_SAVE || sm->phase == SM_EVAL)) {
      sm__enter_recover(sm, true);
      continue;
    }
    if (sm->ended) return;
    sm__closure_deadlines(sm);
    sm__ckpt_deadlines(sm);
    if (sm->ended) return;
    sm__ckpt_release(sm);
    if (training) sm__note_waiting(sm);
    switch (sm->phase) {
      case SM_CONNECT: sm_pump_connect(sm); break;
      case SM_SETUP:
        if (sm->now - sm->t_phase > sm__grace(sm->c.op_timeout_s))
          sm_setup_failed(sm, -1, true, "no answer to the variables' setup");
        break;
      case SM_RESTORE:
        if (sm->now - sm->t_phase > sm__grace(sm->c.op_timeout_s))
          sm_restore_failed(sm, -1, "no answer to the restore");
        break;
      case SM_TRAIN: sm__pump_train(sm); break;
      /* a pause for a checkpoint or an evaluation (a large model's can
       * take minutes): a worker back meanwhile is configured now, ready
       * when training goes on */
      case SM_DRAIN:
        sm__configure_workers(sm);
        if (!sm->ended && sm->phase == SM_DRAIN) sm__pump_drain(sm);
        break;
      case SM_SAVE: /* its answer moves it on */
      case SM_EVAL: /* likewise */
        sm__configure_workers(sm);
        break;
      case SM_RECOVER: sm__pump_recover(sm); break;
      case SM_FINAL: sm_pump_final(sm); break;
      case SM_SHUTDOWN:
        if (sm->now - sm->t_phase > sm->c.shutdown_timeout_s) sm_finish(sm);
        break;
      case SM_DONE:
      case SM_FAILED: return;
    }
    if (sm->phase == before) break;
  }
}

int coord_sm_step(coord_sm *sm, const coord_event *ev, coord_actions *out) {
  if (sm->ended) return 0;
  sm->out = out;
  if (ev->now > sm->now || !sm->started) sm->now = ev->now;
  if (!sm->started) {
    sm->started = true; /* the waits count from the first event */
    sm->t_phase = sm->now;
  }
  switch (ev->kind) {
    case COORD_EV_TIMER: break;
    case COORD_EV_SIGNAL:
      sm__fail(sm, COORD_EXIT_SIGNAL, "interrupted at step %" PRId64,
               sm__global(sm));
      break;
    case COORD_EV_CHECKPOINTS:
      sm__ckpt_known(sm, ev->steps, ev->bases, ev->n_steps);
      break;
    case COORD_EV_PS_UP:
    case COORD_EV_PS_LOST:
    case COORD_EV_SETUP_DONE:
    case COORD_EV_RESTORE_DONE: sm_on_ps(sm, ev); break;
    case COORD_EV_PS_RESTORED: sm__on_ps_restored(sm, ev); break;
    case COORD_EV_SAVE_DONE:
    case COORD_EV_SAVE_WRITTEN:
    case COORD_EV_CKPT_COMMITTED:
    case COORD_EV_CKPT_FAILED: sm__on_ckpt(sm, ev); break;
    case COORD_EV_SNAPSHOT_DONE:
    case COORD_EV_EVAL_DONE: sm__on_eval(sm, ev); break;
    case COORD_EV_WK_UP:
    case COORD_EV_WK_LOST:
    case COORD_EV_WK_READY:
    case COORD_EV_WK_CONFIG_FAILED: sm__on_worker(sm, ev); break;
    case COORD_EV_CLOSURE_DONE:
    case COORD_EV_CLOSURE_FAILED: sm__on_closure(sm, ev); break;
    case COORD_EV_SHUTDOWN_DONE:
      if (sm->phase == SM_SHUTDOWN && ev->op == sm->op) sm_finish(sm);
      break;
  }
  sm_pump(sm);
  if (sm->oom && !sm->ended) {
    sm->oom = false;
    sm__fail(sm, 1, "the coordinator ran out of memory");
  }
  sm->out = NULL;
  return sm->oom ? TSR_ENOMEM : 0;
}

/* ---- life --------------------------------------------------------------- */

static void sm_defaults(coord_sm_config *c) {
  if (c->max_inflight <= 0) c->max_inflight = 2;
  if (c->ckpt_keep <= 0) c->ckpt_keep = 3;
  if (c->ckpt_keep > COORD_MAX_CKPTS - 1) c->ckpt_keep = COORD_MAX_CKPTS - 1;
  if (c->wait_timeout_s <= 0) c->wait_timeout_s = 300;
  if (c->ps_timeout_s <= 0) c->ps_timeout_s = 600;
  if (c->closure_timeout_s <= 0) c->closure_timeout_s = 600;
  if (c->op_timeout_s <= 0) c->op_timeout_s = 150;
  if (c->shutdown_timeout_s <= 0) c->shutdown_timeout_s = 10;
  if (c->restore_tries <= 0) c->restore_tries = 3;
  if (c->max_closure_failures <= 0) c->max_closure_failures = 3;
}

int coord_sm_new(coord_sm **out, const coord_sm_config *cfg) {
  *out = NULL;
  if ((cfg->n_ps < 1 && !cfg->lockstep) || cfg->n_ps < 0 || cfg->n_wk < 1 ||
      cfg->batch_size < 1 ||
      cfg->steps_per_closure < 1 || cfg->steps < 0 ||
      (cfg->steps == 0 && cfg->epochs < 1))
    return TSR_EINVAL;
  coord_sm *sm = calloc(1, sizeof *sm);
  if (!sm) return TSR_ENOMEM;
  sm->c = *cfg;
  sm_defaults(&sm->c);
  snprintf(sm->job_path, sizeof sm->job_path, "%s",
           cfg->job_path ? cfg->job_path : "the job");
  sm->c.job_path = sm->job_path;
  sm->c.ps_names = sm->c.wk_names = NULL;
  sm->ps = calloc((size_t)(cfg->n_ps ? cfg->n_ps : 1), sizeof *sm->ps);
  sm->wk = calloc((size_t)cfg->n_wk, sizeof *sm->wk);
  sm->total = cfg->steps;
  sm->sched = chief_sched_new(cfg->n_wk, sm__wsteps(sm, cfg->steps),
                              cfg->steps_per_closure, sm->c.max_inflight);
  if (!sm->ps || !sm->wk || !sm->sched) {
    coord_sm_free(sm);
    return TSR_ENOMEM;
  }
  /* ssp and sync: every worker runs its own share of the steps, so none
   * waits at the end on a worker that has no closure left */
  chief_sched_set_pinned(sm->sched,
                         cfg->mode != TSR_MODE_ASYNC || cfg->lockstep);
  /* dense "allreduce": each step of a worker needs one of every other */
  if (cfg->lockstep) chief_sched_set_lockstep(sm->sched, true);
  chief_sched_pause(sm->sched, true);
  for (int i = 0; i < cfg->n_ps; i++) {
    if (cfg->ps_names && cfg->ps_names[i])
      snprintf(sm->ps[i].name, sizeof sm->ps[i].name, "%s", cfg->ps_names[i]);
    else
      snprintf(sm->ps[i].name, sizeof sm->ps[i].name, "ps:%d", i);
  }
  for (int i = 0; i < cfg->n_wk; i++) {
    sm_wk *w = &sm->wk[i];
    w->examples = -1;
    if (cfg->wk_names && cfg->wk_names[i])
      snprintf(w->name, sizeof w->name, "%s", cfg->wk_names[i]);
    else
      snprintf(w->name, sizeof w->name, "worker:%d", i);
  }
  sm->phase = SM_CONNECT;
  sm->after_drain = SM_TRAIN;
  sm->pending_resume = -1;
  sm->resumed_from = -1;
  sm->restore_step = -1;
  sm->save_step = -1;
  sm->next_ckpt = sm->next_eval = INT64_MAX;
  *out = sm;
  return 0;
}

void coord_sm_free(coord_sm *sm) {
  if (!sm) return;
  chief_sched_free(sm->sched);
  TSR_FREE_ALL(sm->ps, sm->wk, sm->outs, sm->fails, sm);
}

/* ---- queries ------------------------------------------------------------ */

const char *coord_sm_phase(const coord_sm *sm) {
  return sm_phase_names[sm->phase];
}
bool coord_sm_ended(const coord_sm *sm) { return sm->ended; }
bool coord_sm_training(const coord_sm *sm) {
  return sm->phase >= SM_TRAIN && sm->phase <= SM_FINAL;
}
int coord_sm_exit_status(const coord_sm *sm) { return sm->exit_status; }
const char *coord_sm_fail_msg(const coord_sm *sm) { return sm->fail_msg; }
int64_t coord_sm_global_step(const coord_sm *sm) { return sm__global(sm); }
int64_t coord_sm_total_steps(const coord_sm *sm) { return sm->total; }
int64_t coord_sm_last_ckpt(const coord_sm *sm) {
  return sm__newest_committed(sm);
}
int64_t coord_sm_resumed_from(const coord_sm *sm) { return sm->resumed_from; }
bool coord_sm_save_wanted(const coord_sm *sm, uint64_t op) {
  return sm->ck_stage == SM_CK_SNAP && sm->ck_op == op;
}
int coord_sm_restarts_ps(const coord_sm *sm) { return sm->restarts_ps; }
int coord_sm_initial_restarts(const coord_sm *sm) {
  return sm->initial_restarts;
}
int coord_sm_restarts_worker(const coord_sm *sm) {
  return sm->restarts_worker;
}
coord_wk_state coord_sm_wk_state(const coord_sm *sm, int w) {
  return w >= 0 && w < sm->c.n_wk ? sm->wk[w].st : COORD_WK_DOWN;
}
const char *coord_sm_wk_error(const coord_sm *sm, int w) {
  return w >= 0 && w < sm->c.n_wk ? sm->wk[w].last_error : "";
}
int coord_sm_wk_restarts(const coord_sm *sm, int w) {
  return w >= 0 && w < sm->c.n_wk ? sm->wk[w].restarts : 0;
}
size_t coord_sm_ckpt_failures(const coord_sm *sm,
                              const coord_ckpt_failure **out) {
  *out = sm->fails;
  return sm->n_fails;
}
double coord_sm_train_start(const coord_sm *sm) { return sm->t_train_start; }
double coord_sm_train_end(const coord_sm *sm) { return sm->t_train_end; }
const chief_sched *coord_sm_sched(const coord_sm *sm) { return sm->sched; }
uint64_t coord_sm_members_epoch(const coord_sm *sm) {
  return sm->members_epoch;
}

size_t coord_sm_waiting(const coord_sm *sm, char *buf, size_t len) {
  if (!len) return 0;
  buf[0] = 0;
  double waited = sm->now - sm->t_phase;
  char missing[COORD_MSG_MAX - 100];
  int n = 0;
  switch (sm->phase) {
    case SM_CONNECT:
      sm_missing(sm, missing, sizeof missing);
      n = snprintf(buf, len, "%s to answer (%.0f s of %.0f s)",
                   missing[0] ? missing + 1 : "every PS and worker",
                   waited, sm->c.wait_timeout_s);
      break;
    case SM_SETUP:
      n = snprintf(buf, len, "every PS to create the variables (%.0f s)",
                   waited);
      break;
    case SM_RESTORE:
      n = snprintf(buf, len, "every PS to restore the checkpoint of step %"
                   PRId64 " (%.0f s)", sm->restore_step, waited);
      break;
    case SM_SAVE:
      n = snprintf(buf, len, "every PS to snapshot the checkpoint of step %"
                   PRId64 " (%.0f s)", sm->save_step, waited);
      break;
    case SM_EVAL:
      n = snprintf(buf, len, "%s to evaluate (%.0f s)",
                   sm->wk[sm->eval_worker].name, waited);
      break;
    case SM_RECOVER: {
      size_t off = 0;
      missing[0] = 0;
      for (int i = 0; i < sm->c.n_ps && off + 8 < sizeof missing; i++)
        if (!sm->ps[i].connected)
          off += (size_t)snprintf(missing + off, sizeof missing - off,
                                  "%s%s", off ? ", " : "", sm->ps[i].name);
      if (off)
        n = snprintf(buf, len, "%s to come back (%.0f s of %.0f s)", missing,
                     waited, sm->c.ps_timeout_s);
      else if (sm->n_outs)
        n = snprintf(buf, len, "%zu closure(s) of before the PS loss to end",
                     sm->n_outs);
      break;
    }
    case SM_SHUTDOWN:
      n = snprintf(buf, len, "the answers to the shutdown");
      break;
    case SM_TRAIN:
    case SM_DRAIN:
    case SM_FINAL: return sm__waiting_train(sm, buf, len);
    case SM_DONE:
    case SM_FAILED: break;
  }
  return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}
