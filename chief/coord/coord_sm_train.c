/* The machine's training phase and its workers (coord_sm.h): membership
 * (up, lost, configured, left out), closures out and back, the length of
 * an epochs-based job, the resume point, and the waits of training with
 * their deadlines.
 *
 * A closure answer is counted at most once and only in its generation
 * (the scheduler's check); an answer the machine already gave up on (its
 * deadline passed) is ignored. A data error from a worker, in its
 * configuration or in a closure, fails the run at once with the worker's
 * message.
 */
#include "chief/coord/coord_sm_int.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sm__count(const coord_sm *sm, coord_wk_state st) {
  int n = 0;
  for (int i = 0; i < sm->c.n_wk; i++) n += sm->wk[i].st == st;
  return n;
}

int sm__ready_worker(coord_sm *sm) {
  for (int k = 0; k < sm->c.n_wk; k++) {
    int w = (sm->eval_rr + k) % sm->c.n_wk;
    if (sm->wk[w].st == COORD_WK_READY && !sm->wk[w].fresh) {
      sm->eval_rr = w + 1;
      return w;
    }
  }
  return -1;
}

/* ssp/sync: the PS stop counting worker w (idle, lost or left out). */
static void sm_release(coord_sm *sm, int w) {
  if (sm->c.mode == TSR_MODE_ASYNC || sm->wk[w].left) return;
  sm->wk[w].left = true;
  coord_action *a = sm__emit(sm, COORD_ACT_RELEASE);
  if (a) a->index = w;
}

/* ssp/sync: a configured worker with no closure in flight stops counting
 * (the model's coord__wk_release_idle): else the PS would hold the others
 * back for it (ssp) or wait for its gradient (sync) for ever. Its next
 * closure joins again. */
void sm__release_idle(coord_sm *sm) {
  if (sm->c.mode == TSR_MODE_ASYNC) return;
  for (int w = 0; w < sm->c.n_wk; w++)
    if (sm->wk[w].st == COORD_WK_READY && !sm->wk[w].left &&
        chief_sched_inflight(sm->sched, w) == 0)
      sm_release(sm, w);
}

/* After every PS restored a checkpoint: every worker's closures so far
 * are over, whatever the machine thought of it (a PS that restarted has
 * no memory of it, and a closure still queued in a worker cut off earlier
 * would join it and hold the others for ever): the model's
 * coord__rewind. */
static void sm_release_all(coord_sm *sm) {
  for (int w = 0; w < sm->c.n_wk; w++) {
    sm->wk[w].left = false;
    sm_release(sm, w);
  }
}

/* The set of workers that run closures changed: MEMBER, once per change. */
static void sm_member(coord_sm *sm, int w, bool up, const char *why) {
  sm_wk *k = &sm->wk[w];
  if (k->member == up) return;
  k->member = up;
  sm->members_epoch++;
  coord_action *a = sm__emit(sm, COORD_ACT_MEMBER);
  if (!a) return;
  a->index = w;
  a->up = up;
  a->op = sm->members_epoch;
  snprintf(a->msg, sizeof a->msg, "%s", why ? why : "");
}

/* Nothing waits for worker w's closures any more: their steps went back
 * to the pool with it (chief_sched_worker_down), and an answer that still
 * comes finds them forgotten and is not counted. Else a pause waited for
 * them until their deadline (a closure sent to a worker already gone,
 * never written, is answered only then). */
static void sm_outs_drop(coord_sm *sm, int w) {
  for (size_t i = 0; i < sm->n_outs;)
    if (sm->outs[i].worker == w)
      sm->outs[i] = sm->outs[--sm->n_outs];
    else
      i++;
}

/* "worker:0, worker:2": the workers that are ready, other than `but`;
 * "none" when there is none. */
static void sm_ready_names(const coord_sm *sm, int but, char *buf,
                           size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int w = 0; w < sm->c.n_wk && off + 8 < len; w++)
    if (w != but && sm->wk[w].st == COORD_WK_READY)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? ", " : "",
                              sm->wk[w].name);
  if (!off) snprintf(buf, len, "none");
}

static void sm_worker_down(coord_sm *sm, int w, const char *why) {
  sm_wk *k = &sm->wk[w];
  bool was = k->st == COORD_WK_READY || k->st == COORD_WK_CONFIGURING;
  int back = chief_sched_worker_down(sm->sched, w);
  sm_outs_drop(sm, w);
  bool running = sm->phase < SM_SHUTDOWN;
  if (running) sm_release(sm, w);
  k->st = COORD_WK_DOWN;
  k->unanswered_at = 0;
  if (running && was) {
    char others[COORD_MSG_MAX / 2];
    sm_ready_names(sm, w, others, sizeof others);
    if (strcmp(others, "none") != 0)
      sm__note(sm, TSR_LOG_INFO, "lost %s: %s; %d closure(s) go back to the "
               "queue and run now on %s", k->name, why, back, others);
    else
      sm__note(sm, TSR_LOG_WARN, "lost %s: %s; %d closure(s) go back to the "
               "queue; no other worker is ready: training waits for one "
               "(%.0f s)", k->name, why, back, sm->c.wait_timeout_s);
  }
  sm_member(sm, w, false, why);
}

static void sm_leave_out(coord_sm *sm, int w, const char *why) {
  sm_wk *k = &sm->wk[w];
  chief_sched_worker_down(sm->sched, w);
  sm_outs_drop(sm, w);
  k->st = COORD_WK_LEFT;
  k->answered = true;
  sm_release(sm, w);
  sm__note(sm, TSR_LOG_WARN, "%s %s", k->name, why);
  sm_member(sm, w, false, why);
}

void sm__on_worker(coord_sm *sm, const coord_event *ev) {
  int w = ev->index;
  if (w < 0 || w >= sm->c.n_wk) return;
  sm_wk *k = &sm->wk[w];
  const char *msg = ev->msg ? ev->msg : "?";
  switch (ev->kind) {
    case COORD_EV_WK_UP:
      if (k->st != COORD_WK_DOWN) break;
      if (k->ever_ready) {
        k->restarts++;
        sm->restarts_worker++;
        sm__note(sm, TSR_LOG_INFO, "%s is back", k->name);
      }
      k->st = COORD_WK_CONNECTED;
      k->since = sm->now;
      break;
    case COORD_EV_WK_LOST:
      sm_worker_down(sm, w, ev->msg ? ev->msg : "connection lost");
      break;
    case COORD_EV_WK_READY:
      if (k->st != COORD_WK_CONFIGURING) break;
      k->answered = true;
      k->unanswered_at = 0;
      k->examples = ev->examples;
      k->last_error[0] = 0;
      if (sm->c.mode == TSR_MODE_SYNC && !sm->c.sync_rejoin &&
          k->restarts > 0 && sm__count(sm, COORD_WK_READY) > 0) {
        /* its peers went on without it and own its steps now */
        snprintf(k->last_error, sizeof k->last_error,
                 "came back during a sync run: sits it out");
        k->st = COORD_WK_LEFT;
        k->left = false;
        sm_release(sm, w);
        sm__note(sm, TSR_LOG_INFO, "%s is back, but in sync mode it sits the "
                 "rest of this run out (its peers run its steps)", k->name);
        break;
      }
      k->st = COORD_WK_READY;
      k->fresh = ev->fresh;
      k->ever_ready = true;
      k->left = false; /* its configure joined the PS clocks (ssp, sync) */
      k->failures = 0; /* a worker configured again starts afresh */
      chief_sched_worker_up(sm->sched, w);
      sm->t_progress = sm->now;
      sm_member(sm, w, true, "ready");
      break;
    case COORD_EV_WK_CONFIG_FAILED:
      if (k->st != COORD_WK_CONFIGURING) break;
      k->unanswered_at = 0;
      snprintf(k->last_error, sizeof k->last_error, "%s", msg);
      switch (ev->err_kind) {
        case COORD_ERR_DATA:
          sm__fail(sm, COORD_EXIT_DATA, "%s: %s", k->name, msg);
          break;
        case COORD_ERR_LOST: /* WK_LOST says so too, or has */
        case COORD_ERR_TRANSIENT:
          k->st = COORD_WK_CONNECTED;
          k->since = sm->now + 1.0;
          sm__note(sm, TSR_LOG_DEBUG, "configuring %s: %s (trying again)",
                   k->name, msg);
          break;
        case COORD_ERR_OTHER: {
          char why[COORD_MSG_MAX];
          snprintf(why, sizeof why, "cannot take part: %.400s", msg);
          sm_leave_out(sm, w, why);
          break;
        }
      }
      break;
    default:
      break;
  }
}

/* ---- closures ----------------------------------------------------------- */

static bool sm_out_take(coord_sm *sm, uint64_t id) {
  for (size_t i = 0; i < sm->n_outs; i++)
    if (sm->outs[i].id == id) {
      sm->outs[i] = sm->outs[--sm->n_outs];
      return true;
    }
  return false;
}

static void sm_out_add(coord_sm *sm, const chief_closure *c) {
  if (sm->n_outs == sm->cap_outs) {
    size_t cap = sm->cap_outs ? sm->cap_outs * 2 : 16;
    sm_out *o = realloc(sm->outs, cap * sizeof *o);
    if (!o) {
      sm->oom = true;
      return;
    }
    sm->outs = o;
    sm->cap_outs = cap;
  }
  sm->outs[sm->n_outs++] = (sm_out){
      .id = c->id, .gen = c->generation, .worker = c->worker,
      .sent = sm->now, .deadline = sm->now + sm__grace(sm->c.closure_timeout_s)};
}

/* A worker's own failure (not a connection, not a PS): counted. */
static void sm_own_failure(coord_sm *sm, int w, const char *msg) {
  sm_wk *k = &sm->wk[w];
  if (++k->failures < sm->c.max_closure_failures || k->st != COORD_WK_READY)
    return;
  char why[COORD_MSG_MAX];
  snprintf(why, sizeof why, "failed %d closures in a row and is left out "
           "of the run: %.400s", k->failures, msg);
  sm_leave_out(sm, w, why);
}

void sm__on_closure(coord_sm *sm, const coord_event *ev) {
  int w = ev->index;
  if (w < 0 || w >= sm->c.n_wk) return;
  sm_wk *k = &sm->wk[w];
  bool known = sm_out_take(sm, ev->closure_id);
  if (ev->kind == COORD_EV_CLOSURE_DONE) {
    k->fresh = false; /* it took the ring's state */
    if (chief_sched_done(sm->sched, ev->closure_id, ev->generation,
                         ev->steps_done)) {
      coord_action *a = sm__emit(sm, COORD_ACT_COUNT);
      if (a) {
        a->index = w;
        a->closure.id = ev->closure_id;
        a->closure.generation = ev->generation;
        a->closure.worker = w;
        a->closure.steps = ev->steps_done;
        a->stats = ev->stats;
      }
      sm->t_progress = sm->now;
    }
    if (!known) return;
    if (ev->steps_done > 0) {
      k->failures = 0;
    } else if (++k->failures >= sm->c.max_closure_failures &&
               k->st == COORD_WK_READY) {
      char why[COORD_MSG_MAX];
      snprintf(why, sizeof why, "ran no step in %d closures in a row (its "
               "input gives no batch) and is left out of the run",
               k->failures);
      sm_leave_out(sm, w, why);
    }
    return;
  }
  const char *msg = ev->msg ? ev->msg : "?";
  if (ev->err_kind == COORD_ERR_DATA) {
    chief_sched_failed(sm->sched, ev->closure_id, ev->generation);
    snprintf(k->last_error, sizeof k->last_error, "%s", msg);
    sm__fail(sm, COORD_EXIT_DATA, "%s: %s", k->name, msg);
    return;
  }
  if (!known) return; /* given up on at its deadline */
  chief_sched_failed(sm->sched, ev->closure_id, ev->generation);
  snprintf(k->last_error, sizeof k->last_error, "%s", msg);
  /* its connection is gone. WK_LOST follows, but nothing more may go to
   * it meanwhile: a closure sent now waits for a connection that may never
   * come back. (An answer of a worker already taken down is not known: its
   * closures were forgotten with it.) */
  if (ev->err_kind == COORD_ERR_LOST) {
    if (k->st == COORD_WK_READY) sm_worker_down(sm, w, msg);
    return;
  }
  if (ev->generation != chief_sched_generation(sm->sched)) return;
  sm__note(sm, TSR_LOG_WARN, "%s failed closure %" PRIu64 " (its steps go "
           "back to the queue): %s", k->name, ev->closure_id, msg);
  if (ev->err_kind == COORD_ERR_OTHER) sm_own_failure(sm, w, msg);
}

void sm__closure_deadlines(coord_sm *sm) {
  for (size_t i = 0; i < sm->n_outs;) {
    sm_out o = sm->outs[i];
    if (sm->now <= o.deadline) {
      i++;
      continue;
    }
    sm->outs[i] = sm->outs[--sm->n_outs];
    bool cur = chief_sched_failed(sm->sched, o.id, o.gen);
    char msg[COORD_MSG_MAX];
    snprintf(msg, sizeof msg, "no answer to closure %" PRIu64 " within "
             "%.0f s", o.id, sm__grace(sm->c.closure_timeout_s));
    sm__note(sm, TSR_LOG_WARN, "%s: %s; its steps go back to the queue",
             sm->wk[o.worker].name, msg);
    if (cur) sm_own_failure(sm, o.worker, msg);
  }
}

int sm__dispatch(coord_sm *sm) {
  chief_closure c;
  int n = 0;
  while (!sm->oom && chief_sched_next(sm->sched, &c)) {
    coord_action *a = sm__emit(sm, COORD_ACT_DISPATCH);
    if (!a) break;
    n++;
    a->index = c.worker;
    a->closure = c;
    sm->wk[c.worker].left = false; /* its first pull or push joins it */
    sm_out_add(sm, &c);
    if (sm->t_train_start == 0) sm->t_train_start = sm->now;
  }
  return n;
}

void sm__configure_workers(coord_sm *sm) {
  for (int w = 0; w < sm->c.n_wk; w++) {
    sm_wk *k = &sm->wk[w];
    if (k->st == COORD_WK_CONFIGURING &&
        sm->now - k->since > sm__grace(sm->c.op_timeout_s)) {
      sm__note(sm, TSR_LOG_WARN, "%s did not answer its configuration "
               "within %.0f s; asking again", k->name,
               sm__grace(sm->c.op_timeout_s));
      if (k->unanswered_at == 0) k->unanswered_at = k->since;
      k->st = COORD_WK_CONNECTED;
      k->since = sm->now + 1.0;
    }
    if (k->st != COORD_WK_CONNECTED || sm->now < k->since) continue;
    coord_action *a = sm__emit(sm, COORD_ACT_CONFIGURE);
    if (!a) return;
    a->index = w;
    k->st = COORD_WK_CONFIGURING;
    k->since = sm->now;
  }
}

/* ---- training ------------------------------------------------------------ */

void sm__enter_train(coord_sm *sm) {
  sm__set_phase(sm, SM_TRAIN);
  chief_sched_pause(sm->sched, false);
  sm->t_progress = sm->now;
  /* the waits of training count from here (not from before a recovery) */
  sm->t_noworker = 0;
  if (sm->total == 0) sm->t_total_wait = sm->now;
}

/* "worker:0 (addr): its error; worker:1 ...": what the workers said. */
static void sm_worker_errors(const coord_sm *sm, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int w = 0; w < sm->c.n_wk && off + 16 < len; w++) {
    const sm_wk *k = &sm->wk[w];
    const char *e = k->last_error[0] ? k->last_error
                    : k->st == COORD_WK_DOWN ? "down"
                                              : "no answer";
    off += (size_t)snprintf(buf + off, len - off, "%s%s: %s",
                            off ? "; " : "", k->name, e);
  }
}

/* Epochs: the length of the run, from the workers' shares of the data,
 * once every worker that is coming has answered its configuration. */
static bool sm_total_known(coord_sm *sm) {
  if (sm->total > 0) return true;
  int waiting = 0;
  for (int w = 0; w < sm->c.n_wk; w++)
    waiting += !sm->wk[w].answered && sm->wk[w].st != COORD_WK_LEFT;
  if (waiting > 0 && sm->now - sm->t_total_wait <= sm->c.wait_timeout_s)
    return false;
  int64_t per_epoch = 0;
  int known = 0;
  for (int w = 0; w < sm->c.n_wk; w++) {
    const sm_wk *k = &sm->wk[w];
    if (!k->answered || k->examples <= 0) continue;
    per_epoch += (k->examples + sm->c.batch_size - 1) / sm->c.batch_size;
    known++;
  }
  if (known == 0) {
    char errs[COORD_MSG_MAX - 128];
    bool any = false;
    for (int w = 0; w < sm->c.n_wk; w++) any |= sm->wk[w].last_error[0] != 0;
    sm_worker_errors(sm, errs, sizeof errs);
    if (any)
      sm__fail(sm, 1, "%s: no worker could take part: %s", sm->job_path,
               errs);
    else if (waiting > 0)
      sm__fail(sm, 1, "%s: the job gives epochs and no worker reported the "
               "size of its data within %.0f s: %s", sm->job_path,
               sm->c.wait_timeout_s, errs);
    else
      sm__fail(sm, 2, "%s: the job gives epochs but no worker knows the "
               "size of its data; give \"steps\"", sm->job_path);
    return false;
  }
  /* A worker that holds a configuration and does not answer it (stuck,
   * not gone): its share of the data is part of an epoch. Counted over the
   * others, the run was cut short, and a chief resumed past the cut called
   * the job done. It gets the whole wait from when its first unanswered
   * configuration went out (asking again does not restart it); past that
   * the run fails naming it. A worker that is down is counted out as
   * before. */
  char silent[COORD_MSG_MAX - 128];
  size_t off = 0;
  silent[0] = 0;
  for (int w = 0; w < sm->c.n_wk; w++) {
    const sm_wk *k = &sm->wk[w];
    if (k->answered) continue;
    double first = k->unanswered_at > 0           ? k->unanswered_at
                   : k->st == COORD_WK_CONFIGURING ? k->since
                                                   : 0;
    if (first == 0) continue;
    if (sm->now - first <= sm->c.wait_timeout_s) return false;
    if (off + 24 < sizeof silent)
      off += (size_t)snprintf(silent + off, sizeof silent - off, "%s%s",
                              off ? ", " : "", k->name);
  }
  if (off) {
    sm__fail(sm, 1, "%s: the job gives epochs and %s did not report the "
             "size of its data within %.0f s; an epoch cannot be counted "
             "without it", sm->job_path, silent, sm->c.wait_timeout_s);
    return false;
  }
  if (known < sm->c.n_wk)
    sm__note(sm, TSR_LOG_WARN, "%d of %d workers reported their data size; "
             "an epoch is counted over those", known, sm->c.n_wk);
  if (sm__lockstep(sm)) per_epoch /= sm->c.n_wk;
  if (per_epoch < 1) per_epoch = 1;
  sm->total = per_epoch * sm->c.epochs;
  chief_sched_set_total(sm->sched, sm__wsteps(sm, sm->total));
  sm__note(sm, TSR_LOG_INFO, "%" PRId64 " epoch(s) of %" PRId64 " steps: %"
           PRId64 " steps", sm->c.epochs, per_epoch, sm->total);
  return true;
}

/* The run goes on from the restored (or first) step, now that the total
 * is known: a rewind before it would clamp the step to a total of 0. */
static void sm_apply_resume(coord_sm *sm) {
  int64_t s = sm->pending_resume;
  if (s < 0) return;
  sm->pending_resume = -1;
  int64_t start = s < sm->total ? s : sm->total;
  chief_sched_rewind(sm->sched, sm__wsteps(sm, start));
  int64_t every = sm->c.ckpt_every_steps;
  sm->next_ckpt = every > 0 ? start + every : INT64_MAX;
  int64_t ev = sm->c.eval_every_steps;
  sm->next_eval = ev > 0 && sm->c.has_eval ? start + ev : INT64_MAX;
  sm->t_last_ckpt = sm->now;
  sm->t_gate = sm->now;
  sm->gate_open = false;
  if (sm->pending_why == SM_START_PS) sm_release_all(sm);
  if (sm->pending_why != SM_START_FRESH) {
    coord_action *a = sm__emit(sm, COORD_ACT_REWIND);
    if (a) {
      a->step = start;
      a->resumed = sm->pending_why == SM_START_CHIEF;
    }
  }
  if (sm->pending_why == SM_START_CHIEF && s >= sm->total)
    sm__note(sm, TSR_LOG_INFO, "the job is already done: its checkpoint of "
             "step %" PRId64 " is at its end (%" PRId64 " steps); nothing "
             "to train", s, sm->total);
  else if (sm->pending_why == SM_START_CHIEF)
    sm__note(sm, TSR_LOG_INFO, "training goes on from step %" PRId64
             " of %" PRId64, start, sm->total);
  sm->pending_why = SM_START_FRESH;
}

/* "worker:0 closure 12 (sent 3 s ago), ...": the closures out. */
static void sm_outs_text(const coord_sm *sm, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (size_t i = 0; i < sm->n_outs && off + 48 < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%s closure %" PRIu64
                            " (sent %.0f s ago)", off ? ", " : "",
                            sm->wk[sm->outs[i].worker].name, sm->outs[i].id,
                            sm->now - sm->outs[i].sent);
  if (!off) snprintf(buf, len, "none");
}

size_t sm__waiting_train(const coord_sm *sm, char *buf, size_t len) {
  buf[0] = 0;
  if (sm->phase != SM_TRAIN && sm->phase != SM_DRAIN && sm->phase != SM_FINAL)
    return 0;
  int n = 0;
  size_t alone = sm__waiting_alone(sm, buf, len);
  if (alone) return alone;
  if (sm__count(sm, COORD_WK_READY) == 0 &&
      sm__count(sm, COORD_WK_CONFIGURING) == 0 && !chief_sched_finished(
          sm->sched)) {
    n = snprintf(buf, len, "a worker to be ready (none is; %.0f s of %.0f "
                 "s)", sm->t_noworker > 0 ? sm->now - sm->t_noworker : 0.0,
                 sm->c.wait_timeout_s);
  } else if (sm->n_outs > 0 && sm->now - sm->t_progress >= 2.0) {
    char outs[COORD_MSG_MAX - 96];
    sm_outs_text(sm, outs, sizeof outs);
    if (sm->phase == SM_DRAIN)
      n = snprintf(buf, len, "%s, before the %s at step %" PRId64, outs,
                   sm->ckpt_due ? "checkpoint" : "evaluation", sm__global(sm));
    else
      n = snprintf(buf, len, "%s", outs);
  }
  return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

void sm__note_waiting(coord_sm *sm) {
  if (sm->n_outs == 0 || sm->now - sm->t_progress < 5.0 ||
      sm->now - sm->t_wait_note < 10.0)
    return;
  char what[COORD_MSG_MAX - 64];
  if (!sm__waiting_train(sm, what, sizeof what)) return;
  sm->t_wait_note = sm->now;
  sm__note(sm, TSR_LOG_INFO, "no closure came back for %.0f s; waiting for "
           "%s", sm->now - sm->t_progress, what);
}

static bool sm_stalled(coord_sm *sm) {
  double stall = 2 * sm__grace(sm->c.closure_timeout_s);
  if (sm->now - sm->t_progress <= stall) return false;
  char outs[COORD_MSG_MAX - 128];
  sm_outs_text(sm, outs, sizeof outs);
  sm__fail(sm, 1, "no closure has finished in %.0f s (closures out: %s)",
           sm->now - sm->t_progress, outs);
  return true;
}

void sm__pump_train(coord_sm *sm) {
  sm__configure_workers(sm);
  if (sm->ended) return;
  if (sm__count(sm, COORD_WK_LEFT) == sm->c.n_wk) {
    char errs[COORD_MSG_MAX - 64];
    sm_worker_errors(sm, errs, sizeof errs);
    sm__fail(sm, 1, "no worker can take part in this run: %s", errs);
    return;
  }
  if (!sm_total_known(sm)) {
    if (!sm->ended) sm_stalled(sm);
    return;
  }
  sm_apply_resume(sm);
  if (chief_sched_finished(sm->sched)) {
    sm__enter_final(sm);
    return;
  }
  int64_t step = sm__global(sm);
  /* async: as often as the disk allows, at most every N steps (training
   * never waits); sync and ssp: every N steps, the pause waiting for the
   * checkpoint before when the disk is slower than that */
  if (sm->c.ckpt && (!sm__nodrain(sm) || !sm__ckpt_busy(sm)) &&
      !sm->ckpt_due &&
      (step >= sm->next_ckpt ||
       (sm->c.ckpt_every_secs > 0 &&
        sm->now - sm->t_last_ckpt >= sm->c.ckpt_every_secs)))
    sm->ckpt_due = true;
  if (sm->c.has_eval && step >= sm->next_eval) sm->eval_due = true;
  /* both stay due while a PS is restored alone (they need every PS) */
  if (!sm__ps_fixing(sm)) {
    /* async: taken while training goes on (sync, ssp, dense "allreduce":
     * at a step boundary) */
    if (sm__nodrain(sm)) sm__ckpt_background(sm);
    /* an evaluation reads a snapshot: training goes on (dense
     * "allreduce": the ring pauses for it) */
    if (sm->eval_due && !sm__eval_busy(sm) && !sm->c.lockstep)
      sm__eval_start(sm);
    if (sm->ckpt_due || (sm->eval_due && sm->c.lockstep)) {
      sm__enter_drain(sm, SM_TRAIN);
      return;
    }
  }
  int ready = sm__count(sm, COORD_WK_READY);
  int coming = sm__count(sm, COORD_WK_CONFIGURING) +
               sm__count(sm, COORD_WK_CONNECTED);
  if (ready == 0 && sm__count(sm, COORD_WK_CONFIGURING) == 0) {
    if (sm->t_noworker == 0) sm->t_noworker = sm->now;
    double waited = sm->now - sm->t_noworker;
    if (waited > sm->c.wait_timeout_s) {
      char errs[COORD_MSG_MAX - 64];
      sm_worker_errors(sm, errs, sizeof errs);
      sm__fail(sm, 1, "no worker has been ready for %.0f s: %s", waited,
               errs);
      return;
    }
    if (waited >= 1.0 && sm->now - sm->t_note >= 10.0) {
      sm->t_note = sm->now;
      sm__note(sm, TSR_LOG_INFO, "no worker is ready; waiting for one to "
               "come back (%.0f s of %.0f s)", waited, sm->c.wait_timeout_s);
    }
  } else {
    sm->t_noworker = 0;
  }
  /* sync and ssp: no closure goes out before every worker that is coming
   * has answered its configuration. In sync one that starts early runs
   * steps alone that the others then push too late; in ssp (and sync) a
   * worker still configuring counts as away, so the first ready one would
   * be handed its share and run the whole job (a slow link made that the
   * rule, and left the slow worker gated on an idle clock); dense
   * "allreduce" likewise: every step of the ring needs every worker */
  if ((sm->c.mode != TSR_MODE_ASYNC || sm->c.lockstep) && !sm->gate_open &&
      coming > 0 &&
      sm->now - sm->t_gate <= sm__grace(sm->c.op_timeout_s)) {
    sm_stalled(sm);
    return;
  }
  if (sm__dispatch(sm) > 0) sm->gate_open = true;
  sm__release_idle(sm);
  sm_stalled(sm);
}
