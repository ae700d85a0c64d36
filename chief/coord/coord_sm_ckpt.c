/* The machine's checkpoints and evaluations (coord_sm.h): the committed
 * checkpoints it knows (from disk at start and from its own commits),
 * which one a restore takes, pruning, the checkpoint being taken, the
 * evaluation going on, and the pause that drains closures before a sync
 * or ssp checkpoint's snapshots.
 *
 * A checkpoint goes SAVE (every PS snapshots its shards: a copy-on-write
 * view, ps/snap.c), SAVE_WAIT (every PS has written its snapshot), COMMIT
 * (the chief checks the files and writes the manifest), with its own op
 * id, whatever the phase. Async training never pauses for it: the
 * checkpoint of step s holds every update of the s steps counted when
 * SAVE went out, and possibly some of the closures then in flight (at
 * least once, as a closure run again after a lost worker). Sync, ssp
 * and dense "allreduce" (its dense state is the workers', taken between
 * closures) drain to a step boundary, SAVE, and resume as soon as every
 * PS holds its snapshot: their checkpoint of step s holds exactly s
 * steps. The
 * first checkpoint (step 0) and the last one are taken drained, and the
 * run ends only once the last one is committed.
 *
 * An evaluation never pauses training either: every PS takes a snapshot
 * of its shards (SNAPSHOT), one worker evaluates reading it (EVALUATE),
 * and the PS drop it (UNSNAPSHOT); it reports the step at its snapshot.
 * With dense "allreduce" it is taken drained and the ring waits for it
 * (SM_EVAL): the evaluating worker is a member every step needs, and
 * its dense values must be those of the snapshot's step.
 *
 * Pruning keeps the newest ckpt_keep committed checkpoints and never the
 * newest one away. A checkpoint that fails anywhere (a PS save, its
 * files, the manifest, a deadline, a PS lost before its files were
 * written) is discarded, remembered for the summary, and training goes
 * on; the last good one stays what a restore takes.
 */
#include "chief/coord/coord_sm_int.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SM_MAX_FAILS 1024

/* ---- the list ----------------------------------------------------------- */

/* Removes entry i of the list. */
static void sm_ck_remove(coord_sm *sm, int i) {
  size_t k = (size_t)(sm->n_ck - 1 - i);
  memmove(&sm->ck[i], &sm->ck[i + 1], k * sizeof sm->ck[0]);
  memmove(&sm->ck_bad[i], &sm->ck_bad[i + 1], k * sizeof sm->ck_bad[0]);
  memmove(&sm->ck_base[i], &sm->ck_base[i + 1], k * sizeof sm->ck_base[0]);
  sm->n_ck--;
}

/* A committed checkpoint of `step` whose chain starts at `base` (itself
 * when whole). */
static void sm_ck_insert(coord_sm *sm, int64_t step, int64_t base) {
  if (step < 0) return;
  if (base < 0 || base > step) base = step;
  int i = 0;
  while (i < sm->n_ck && sm->ck[i] < step) i++;
  if (i < sm->n_ck && sm->ck[i] == step) {
    sm->ck_bad[i] = false; /* written again */
    sm->ck_base[i] = base;
    return;
  }
  if (sm->n_ck == COORD_MAX_CKPTS) {
    if (i == 0) return; /* older than all we track */
    /* forget the oldest (not pruned: only tracking is bounded) */
    sm_ck_remove(sm, 0);
    i--;
  }
  size_t k = (size_t)(sm->n_ck - i);
  memmove(&sm->ck[i + 1], &sm->ck[i], k * sizeof sm->ck[0]);
  memmove(&sm->ck_bad[i + 1], &sm->ck_bad[i], k * sizeof sm->ck_bad[0]);
  memmove(&sm->ck_base[i + 1], &sm->ck_base[i], k * sizeof sm->ck_base[0]);
  sm->ck[i] = step;
  sm->ck_bad[i] = false;
  sm->ck_base[i] = base;
  sm->n_ck++;
}

void sm__ckpt_known(coord_sm *sm, const int64_t *steps, const int64_t *bases,
                    size_t n) {
  for (size_t i = 0; i < n; i++)
    sm_ck_insert(sm, steps[i], bases ? bases[i] : steps[i]);
}

int64_t sm__newest_good(const coord_sm *sm) {
  for (int i = sm->n_ck - 1; i >= 0; i--)
    if (!sm->ck_bad[i]) return sm->ck[i];
  return -1;
}

int64_t sm__newest_committed(const coord_sm *sm) {
  return sm->n_ck ? sm->ck[sm->n_ck - 1] : -1;
}

void sm__mark_bad(coord_sm *sm, int64_t step) {
  /* and every increment that builds on it: none can be restored now */
  for (int i = 0; i < sm->n_ck; i++)
    if (sm->ck[i] == step || (sm->ck_base[i] <= step && sm->ck[i] > step))
      sm->ck_bad[i] = true;
}

/* Keeps the newest ckpt_keep and every checkpoint their chains build on
 * (the ones from a kept increment's base on); never the newest. The
 * others go newest first, so that no increment is ever left without the
 * checkpoints it builds on (were the chief to stop between two). */
static void sm_prune(coord_sm *sm) {
  int kept_from = sm->n_ck - sm->c.ckpt_keep;
  if (kept_from <= 0) return;
  int64_t need = INT64_MAX;
  for (int i = kept_from; i < sm->n_ck; i++)
    if (sm->ck_base[i] < need) need = sm->ck_base[i];
  for (int i = kept_from - 1; i >= 0; i--) {
    if (sm->ck[i] >= need) continue;
    coord_action *a = sm__emit(sm, COORD_ACT_PRUNE);
    if (!a) return;
    a->step = sm->ck[i];
    sm_ck_remove(sm, i);
  }
}

/* ---- the pause ----------------------------------------------------------- */

void sm__enter_drain(coord_sm *sm, sm_phase after) {
  sm->after_drain = after;
  chief_sched_pause(sm->sched, true);
  coord_action *a = sm__emit(sm, COORD_ACT_PAUSE);
  if (a) a->index = 0;
  sm__set_phase(sm, SM_DRAIN);
}

static int64_t sm_next(int64_t from, int64_t every) {
  return every > 0 ? from + every : INT64_MAX;
}

/* Starts the checkpoint of `step` (SAVE); false when there is nothing new
 * since the last one (the due checkpoint is then done). */
static bool sm_ckpt_start(coord_sm *sm, int64_t step) {
  sm->ckpt_due = false;
  if (sm__newest_good(sm) == step) {
    sm->next_ckpt = sm_next(step, sm->c.ckpt_every_steps);
    sm->t_last_ckpt = sm->now;
    return false;
  }
  sm->save_step = step;
  /* the next one is due `every` steps after this one began, whether it
   * ends well or not */
  sm->next_ckpt = sm_next(step, sm->c.ckpt_every_steps);
  sm->t_last_ckpt = sm->now;
  sm->ck_stage = SM_CK_SNAP;
  sm->ck_op = ++sm->next_op;
  sm->t_ck = sm->now;
  coord_action *a = sm__emit(sm, COORD_ACT_SAVE);
  if (a) {
    a->op = sm->ck_op;
    a->step = step;
  }
  return true;
}

bool sm__ckpt_busy(const coord_sm *sm) { return sm->ck_stage != SM_CK_IDLE; }

void sm__ckpt_background(coord_sm *sm) {
  if (sm->ckpt_due && !sm__ckpt_busy(sm)) sm_ckpt_start(sm, sm__global(sm));
}

void sm__pump_drain(coord_sm *sm) {
  /* pinned (ssp, sync): bring every worker level before the pause holds;
   * one with nothing to run meanwhile must not hold the others back */
  sm__dispatch(sm);
  sm__release_idle(sm);
  if (sm->n_outs > 0) {
    double stall = 2 * sm__grace(sm->c.closure_timeout_s);
    if (sm->now - sm->t_progress > stall)
      sm__fail(sm, 1, "no closure has finished in %.0f s while pausing for "
               "a checkpoint", sm->now - sm->t_progress);
    return;
  }
  int64_t step = sm__global(sm);
  if (sm->ckpt_due) {
    /* the checkpoint before is still being written: one at a time */
    if (sm__ckpt_busy(sm)) return;
    if (sm_ckpt_start(sm, step)) {
      sm__set_phase(sm, SM_SAVE); /* until every PS holds its snapshot */
      return;
    }
  }
  if (sm->eval_due && sm->c.lockstep && !sm__eval_busy(sm)) {
    sm__eval_start(sm);
    if (sm__eval_busy(sm)) {
      sm__set_phase(sm, SM_EVAL); /* until the worker answers */
      return;
    }
  }
  if (sm->after_drain == SM_FINAL)
    sm__set_phase(sm, SM_FINAL);
  else
    sm__enter_train(sm);
}

/* ---- save, write, commit ------------------------------------------------- */

static void sm_ckpt_done(coord_sm *sm) {
  sm->ck_stage = SM_CK_IDLE;
  sm->ck_op = 0;
  if (sm->phase == SM_SAVE) sm__set_phase(sm, SM_DRAIN);
}

static void sm_ckpt_failed(coord_sm *sm, const char *reason) {
  int64_t step = sm->save_step;
  if (sm->n_fails < SM_MAX_FAILS) {
    if (sm->n_fails == sm->cap_fails) {
      size_t cap = sm->cap_fails ? sm->cap_fails * 2 : 8;
      coord_ckpt_failure *f = realloc(sm->fails, cap * sizeof *f);
      if (f) {
        sm->fails = f;
        sm->cap_fails = cap;
      }
    }
    if (sm->n_fails < sm->cap_fails) {
      coord_ckpt_failure *f = &sm->fails[sm->n_fails++];
      f->step = step;
      snprintf(f->reason, sizeof f->reason, "%s", reason);
    }
  }
  coord_action *a = sm__emit(sm, COORD_ACT_DISCARD);
  if (a) a->step = step;
  int64_t last = sm__newest_good(sm);
  if (last >= 0)
    sm__note(sm, TSR_LOG_WARN, "checkpoint of step %" PRId64 " failed: "
             "%.300s; the last good checkpoint is step %" PRId64, step,
             reason, last);
  else
    sm__note(sm, TSR_LOG_WARN, "checkpoint of step %" PRId64 " failed: "
             "%.300s; there is no good checkpoint yet", step, reason);
  sm_ckpt_done(sm);
}

void sm__ckpt_abandon(coord_sm *sm) {
  /* a commit is the chief's own work on files already written: it ends
   * on its own, well or not */
  if (sm->ck_stage != SM_CK_SNAP && sm->ck_stage != SM_CK_WRITE) return;
  sm_ckpt_failed(sm, "a parameter server was lost before its files were "
                 "written");
}

/* An answer to the checkpoint's current stage: a PS it says was lost is
 * marked so (the pump then recovers). */
static bool sm_ck_answer(coord_sm *sm, const coord_event *ev, int stage) {
  if (sm->ck_stage != stage || ev->op != sm->ck_op) return false;
  if (ev->lost && ev->index >= 0 && ev->index < sm->c.n_ps)
    sm->ps[ev->index].lost = true;
  return true;
}

static void sm_ck_next(coord_sm *sm, int stage, coord_act_kind k) {
  sm->ck_stage = stage;
  sm->ck_op = ++sm->next_op;
  sm->t_ck = sm->now;
  coord_action *a = sm__emit(sm, k);
  if (a) {
    a->op = sm->ck_op;
    a->step = sm->save_step;
    a->total = sm->total;
  }
}

static void sm_ck_ps_failed(coord_sm *sm, const coord_event *ev) {
  char why[COORD_MSG_MAX];
  const char *msg = ev->msg ? ev->msg : "?";
  if (ev->index >= 0 && ev->index < sm->c.n_ps)
    snprintf(why, sizeof why, "%s: %.400s", sm->ps[ev->index].name, msg);
  else
    snprintf(why, sizeof why, "%.450s", msg);
  sm_ckpt_failed(sm, why);
}

/* An answer to `stage` (sm_ck_answer) that reports success; a PS's failure
 * fails the checkpoint. One that failed because the PS was lost is due
 * again once every PS is whole, as when the loss is seen first
 * (sm__ckpt_retake): the save's error and the loss come in either order. */
static bool sm_ck_ok(coord_sm *sm, const coord_event *ev, int stage) {
  if (!sm_ck_answer(sm, ev, stage)) return false;
  if (ev->status) {
    sm_ck_ps_failed(sm, ev);
    if (ev->lost) sm__ckpt_retake(sm);
    return false;
  }
  return true;
}

/* The run's last checkpoint records the final evaluation (its manifest's
 * "eval", which a chief started after the end reports): its manifest waits
 * while an evaluation of the checkpoint's step is going on (the final one
 * starts as soon as every PS holds the checkpoint's snapshot, before its
 * files are written). Only while one is out: one still to start may wait
 * on this checkpoint. */
static bool sm_final_eval_pending(const coord_sm *sm) {
  return sm__in_final(sm) && sm__eval_busy(sm) &&
         sm->ev_step == sm->save_step;
}

void sm__ckpt_release(coord_sm *sm) {
  if (sm->ck_stage != SM_CK_HOLD || sm_final_eval_pending(sm)) return;
  sm_ck_next(sm, SM_CK_COMMIT, COORD_ACT_COMMIT);
}

void sm__on_ckpt(coord_sm *sm, const coord_event *ev) {
  switch (ev->kind) {
    case COORD_EV_SAVE_DONE:
      if (!sm_ck_ok(sm, ev, SM_CK_SNAP)) return;
      /* every PS holds its snapshot: a paused run goes on */
      sm_ck_next(sm, SM_CK_WRITE, COORD_ACT_SAVE_WAIT);
      if (sm->phase == SM_SAVE) sm__set_phase(sm, SM_DRAIN);
      return;
    case COORD_EV_SAVE_WRITTEN:
      if (!sm_ck_ok(sm, ev, SM_CK_WRITE)) return;
      if (sm_final_eval_pending(sm)) {
        sm->ck_stage = SM_CK_HOLD; /* sm__ckpt_release commits it */
        sm->ck_op = 0;
        return;
      }
      sm_ck_next(sm, SM_CK_COMMIT, COORD_ACT_COMMIT);
      return;
    case COORD_EV_CKPT_COMMITTED:
      if (!sm_ck_answer(sm, ev, SM_CK_COMMIT)) return;
      sm_ck_insert(sm, sm->save_step,
                   ev->increment ? ev->base : sm->save_step);
      if (ev->increment)
        sm__note(sm, TSR_LOG_INFO, "checkpoint of step %" PRId64 " committed "
                 "(an increment over the checkpoints from step %" PRId64 ")",
                 sm->save_step, ev->base);
      else
        sm__note(sm, TSR_LOG_INFO, "checkpoint of step %" PRId64
                 " committed", sm->save_step);
      sm_prune(sm);
      sm_ckpt_done(sm);
      return;
    case COORD_EV_CKPT_FAILED:
      if (!sm_ck_answer(sm, ev, SM_CK_COMMIT)) return;
      sm_ckpt_failed(sm, ev->msg ? ev->msg : "?");
      return;
    default:
      return;
  }
}

/* ---- evaluation --------------------------------------------------------- */

bool sm__eval_busy(const coord_sm *sm) { return sm->ev_stage != SM_EV_IDLE; }

void sm__eval_start(coord_sm *sm) {
  int64_t step = sm__global(sm);
  sm->eval_due = false;
  sm->next_eval = sm_next(step, sm->c.eval_every_steps);
  int w = sm__ready_worker(sm);
  if (w < 0) {
    sm__note(sm, TSR_LOG_WARN, "evaluation at step %" PRId64 " skipped: "
             "no worker is ready", step);
    return;
  }
  sm->eval_worker = w;
  sm->ev_step = step;
  sm->ev_stage = SM_EV_SNAP;
  sm->ev_op = ++sm->next_op;
  sm->t_ev = sm->now;
  coord_action *a = sm__emit(sm, COORD_ACT_SNAPSHOT);
  if (a) {
    a->op = sm->ev_op;
    a->step = step;
  }
}

static void sm_eval_done(coord_sm *sm, const char *failed) {
  if (failed)
    sm__note(sm, TSR_LOG_WARN, "evaluation at step %" PRId64 " failed: %s",
             sm->ev_step, failed);
  if (sm->ev_stage == SM_EV_RUN) { /* the PS hold its snapshot */
    coord_action *a = sm__emit(sm, COORD_ACT_UNSNAPSHOT);
    if (a) a->op = sm->ev_op;
  }
  sm->ev_stage = SM_EV_IDLE;
  sm->ev_op = 0;
  if (sm->phase == SM_EVAL) sm__set_phase(sm, SM_DRAIN);
}

void sm__eval_abandon(coord_sm *sm, bool drop) {
  if (!sm__eval_busy(sm)) return;
  sm__note(sm, TSR_LOG_WARN, "evaluation at step %" PRId64 " abandoned: a "
           "parameter server was lost", sm->ev_step);
  if (drop) { /* asked of every PS: the one lost holds none now */
    coord_action *a = sm__emit(sm, COORD_ACT_UNSNAPSHOT);
    if (a) a->op = sm->ev_op;
  }
  sm->ev_stage = SM_EV_IDLE; /* its snapshot went with the PS, or lapses */
  sm->ev_op = 0;
  if (sm->phase == SM_EVAL) sm__set_phase(sm, SM_DRAIN);
}

void sm__on_eval(coord_sm *sm, const coord_event *ev) {
  if (!sm__eval_busy(sm) || ev->op != sm->ev_op) return;
  if (ev->kind == COORD_EV_SNAPSHOT_DONE) {
    if (sm->ev_stage != SM_EV_SNAP) return;
    if (ev->lost && ev->index >= 0 && ev->index < sm->c.n_ps)
      sm->ps[ev->index].lost = true;
    if (ev->status) {
      sm->ev_stage = SM_EV_RUN; /* the PS that took one drop it */
      sm_eval_done(sm, ev->msg ? ev->msg : "?");
      return;
    }
    int w = sm->eval_worker;
    /* gone since, or back fresh (holding no dense state): another */
    if ((sm->wk[w].st != COORD_WK_READY || sm->wk[w].fresh) &&
        (w = sm__ready_worker(sm)) < 0) {
      sm->ev_stage = SM_EV_RUN;
      sm_eval_done(sm, "no worker is ready");
      return;
    }
    sm->eval_worker = w;
    sm->ev_stage = SM_EV_RUN;
    sm->t_ev = sm->now;
    coord_action *a = sm__emit(sm, COORD_ACT_EVALUATE);
    if (a) {
      a->op = sm->ev_op;
      a->index = w;
      a->step = sm->ev_step;
    }
    return;
  }
  if (sm->ev_stage != SM_EV_RUN) return;
  sm_eval_done(sm, ev->status ? (ev->msg ? ev->msg : "?") : NULL);
}

void sm__ckpt_deadlines(coord_sm *sm) {
  char why[COORD_MSG_MAX];
  double ck = sm->now - sm->t_ck;
  /* the files written, then read back by the commit's checks: gigabytes
   * at the disk's pace, bounded like a closure */
  double limit = sm->ck_stage != SM_CK_SNAP &&
                         sm->c.closure_timeout_s > sm->c.op_timeout_s
                     ? sm->c.closure_timeout_s
                     : sm->c.op_timeout_s;
  /* a held one waits on the evaluation, which has deadlines of its own */
  if (sm__ckpt_busy(sm) && sm->ck_stage != SM_CK_HOLD &&
      ck > sm__grace(limit)) {
    snprintf(why, sizeof why, "%s within %.0f s",
             sm->ck_stage == SM_CK_SNAP    ? "no snapshot from every PS"
             : sm->ck_stage == SM_CK_WRITE ? "the PS did not all write their "
                                             "files"
                                           : "the manifest was not written",
             ck);
    sm_ckpt_failed(sm, why);
  }
  if (!sm__eval_busy(sm)) return;
  double waited = sm->now - sm->t_ev;
  double elimit = sm->ev_stage == SM_EV_SNAP ? sm->c.op_timeout_s
                                             : sm->c.closure_timeout_s;
  if (waited <= sm__grace(elimit)) return;
  if (sm->ev_stage == SM_EV_SNAP)
    snprintf(why, sizeof why, "no snapshot from every PS within %.0f s",
             waited);
  else
    snprintf(why, sizeof why, "%s did not answer within %.0f s",
             sm->wk[sm->eval_worker].name, waited);
  sm_eval_done(sm, why);
}
