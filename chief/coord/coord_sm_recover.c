/* The machine's answer to a lost parameter server (coord_sm.h): restored
 * alone while the others train on (async), or the whole cluster rewound to
 * the last checkpoint (the global recovery).
 *
 * Alone (async, a committed checkpoint to go back to, some PS still up):
 * training goes on; the workers' calls to the lost PS wait for it (their
 * PS client sends them again), the other PS keep their values and serve.
 * When the PS is back, RESTORE_PS has it (and only it) set up again,
 * holding every pull and push until it has restored its own shards from
 * the newest checkpoint; PS_RESTORED says it is done. The step counter
 * does not move back: what the lost PS learned since that checkpoint is
 * lost, nothing else. Checkpoints and evaluations wait until every PS is
 * whole again (a checkpoint needs every PS; an evaluation would read the
 * lost one's initial values).
 *
 * Globally (sync and ssp, whose guarantees need every PS at one step;
 * async when every PS is lost, or there is no checkpoint, or restoring
 * alone failed restore_tries times): PAUSE, forget the closures in flight,
 * wait for the lost PS (ps_timeout_s), then every PS is set up and
 * restores the newest good checkpoint and the run rewinds to its step
 * (coord_sm.c: setup, restore, their tries and fallbacks).
 *
 * Every wait has its deadline: a PS not back within ps_timeout_s fails
 * the run naming it; a restore alone not answered within the operation
 * deadline is a failed try.
 */
#include "chief/coord/coord_sm_int.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- globally ------------------------------------------------------------ */

static void sm_alone_cancel(coord_sm *sm) {
  for (int i = 0; i < sm->c.n_ps; i++) {
    sm->ps[i].fix = SM_FIX_NONE;
    sm->ps[i].fix_op = 0;
  }
}

void sm__enter_recover(coord_sm *sm, bool from_training) {
  sm_alone_cancel(sm);
  if (from_training) {
    if (sm->phase == SM_RECOVER) return;
    for (int i = 0; i < sm->c.n_ps; i++)
      if (sm->ps[i].lost)
        sm__note(sm, TSR_LOG_INFO, "%s was lost: training paused until it "
                 "is back", sm->ps[i].name);
    sm->recovering = true;
    sm->tries = 0;
    coord_action *a = sm__emit(sm, COORD_ACT_PAUSE);
    if (a) a->index = 1;
  }
  sm__ckpt_abandon(sm);
  sm__eval_abandon(sm, false);
  chief_sched_pause(sm->sched, true);
  /* forget the closures in flight: they ran against a PS that is gone */
  chief_sched_rewind(sm->sched, chief_sched_done_steps(sm->sched));
  sm->ckpt_due = sm->eval_due = false;
  sm->final_ckpt_done = sm->final_eval_done = false;
  sm->t_phase = sm->now;
  sm->t_note = 0;
  sm->phase = SM_RECOVER;
}

void sm__pump_recover(coord_sm *sm) {
  double waited = sm->now - sm->t_phase;
  /* closures still out ran against the old state: let them end first
   * (ssp, sync: they fail once a PS is lost). Not in async: their calls
   * to the lost PS wait for it, so they cannot end before it is back and
   * restored; the setup holds their calls until the restore */
  double drain = sm->c.closure_timeout_s < 60 ? sm->c.closure_timeout_s : 60;
  if (sm->n_outs > 0 && waited < drain && sm->c.mode != TSR_MODE_ASYNC)
    return;
  if (!sm__all_ps(sm)) {
    if (waited > sm->c.ps_timeout_s) {
      char missing[COORD_MSG_MAX - 100];
      sm__ps_away(sm, missing, sizeof missing);
      sm__fail(sm, 1, "a lost parameter server did not come back within "
               "%.0f s:%s", sm->c.ps_timeout_s, missing);
      return;
    }
    if (sm->now - sm->t_note >= 5.0) {
      sm->t_note = sm->now;
      for (int i = 0; i < sm->c.n_ps; i++)
        if (!sm->ps[i].connected)
          sm__note(sm, TSR_LOG_INFO, "waiting for %s to come back (%.0f s "
                   "of %.0f s)", sm->ps[i].name, waited, sm->c.ps_timeout_s);
    }
    return;
  }
  sm__enter_setup(sm);
}

/* ---- alone ---------------------------------------------------------------- */

bool sm__ps_fixing(const coord_sm *sm) {
  for (int i = 0; i < sm->c.n_ps; i++)
    if (sm->ps[i].fix != SM_FIX_NONE) return true;
  return false;
}

/* Whether the PS lost now can be restored alone: async (no guarantee ties
 * the PS to one step), a checkpoint to restore from, and some PS still up
 * (with every PS lost nothing newer survives anywhere: the run rewinds,
 * as it costs nothing more). Not during a global recovery. */
static bool sm_alone_ok(const coord_sm *sm) {
  if (sm->c.mode != TSR_MODE_ASYNC || !sm->c.ckpt || sm->recovering ||
      sm__newest_good(sm) < 0)
    return false;
  for (int i = 0; i < sm->c.n_ps; i++)
    if (!sm->ps[i].lost) return true;
  return false;
}

/* The phases in which a lost PS is restored alone or starts the global
 * recovery: training, its pauses, and the operations that interrupt it. */
static bool sm_alone_phase(const coord_sm *sm) {
  switch (sm->phase) {
    case SM_TRAIN:
    case SM_DRAIN:
    case SM_SAVE:
    case SM_EVAL:
    case SM_FINAL: return true;
    default: return false;
  }
}

static void sm_alone_send(coord_sm *sm, int i, int64_t step) {
  sm_ps *p = &sm->ps[i];
  p->fix = SM_FIX_RUN;
  p->fix_op = ++sm->next_op;
  p->fix_since = sm->now;
  sm__note(sm, TSR_LOG_INFO, "%s restores its own shards from "
           "the checkpoint of step %" PRId64 " (the other PS keep theirs; "
           "training is at step %" PRId64 ")", p->name, step,
           sm__global(sm));
  coord_action *a = sm__emit(sm, COORD_ACT_RESTORE_PS);
  if (!a) return;
  a->op = p->fix_op;
  a->index = i;
  a->step = step;
}

/* A try of restoring PS i alone failed: it is tried again when it is
 * connected, and after restore_tries failed tries the run recovers
 * globally (which falls back to older checkpoints, and fails naming the
 * last reason when none is left). */
static void sm_alone_failed(coord_sm *sm, int i, bool lost,
                            const char *why) {
  sm_ps *p = &sm->ps[i];
  (void)lost; /* a PS gone again is sent the restore when PS_UP says so */
  p->fix_tries++;
  p->fix = SM_FIX_WAIT;
  p->fix_op = 0;
  sm__note(sm, TSR_LOG_WARN, "restoring %s alone failed (try %d of %d): %s",
           p->name, p->fix_tries, sm->c.restore_tries, why);
  if (p->fix_tries >= sm->c.restore_tries) {
    sm__note(sm, TSR_LOG_WARN, "%s could not be restored alone: every PS "
             "goes back to the last checkpoint", p->name);
    sm__enter_recover(sm, true);
  }
}

void sm__on_ps_restored(coord_sm *sm, const coord_event *ev) {
  int i = ev->index;
  if (i < 0 || i >= sm->c.n_ps) return;
  sm_ps *p = &sm->ps[i];
  if (p->fix != SM_FIX_RUN || ev->op != p->fix_op) return; /* stale */
  if (ev->status) {
    sm_alone_failed(sm, i, ev->lost, ev->msg ? ev->msg : "?");
    return;
  }
  p->fix = SM_FIX_NONE;
  p->fix_op = 0;
  p->fix_tries = 0;
  p->lost = false;
  sm->restarts_ps++;
  sm__note(sm, TSR_LOG_INFO, "%s alone restored the checkpoint of step %"
           PRId64 " (its own shards), %.1f s after it was lost; the other PS "
           "kept theirs, training went on (step %" PRId64 ") and goes on with "
           "every PS", p->name, ev->step, sm->now - p->fix_lost_at,
           sm__global(sm));
}

bool sm__in_final(const coord_sm *sm) {
  return sm->phase == SM_FINAL ||
         ((sm->phase == SM_DRAIN || sm->phase == SM_SAVE ||
           sm->phase == SM_EVAL) && sm->after_drain == SM_FINAL);
}

void sm__ckpt_retake(coord_sm *sm) {
  if (sm__in_final(sm)) sm->final_ckpt_done = false;
  else sm->ckpt_due = true;
}

/* A PS was lost: a checkpoint or an evaluation going on read its
 * snapshot, which went with it. It ends here (nothing committed) and is
 * due again: taken once every PS is whole (the run's last ones too). */
static void sm_alone_end_ops(coord_sm *sm) {
  bool ck = sm__ckpt_busy(sm), ev = sm__eval_busy(sm);
  sm__ckpt_abandon(sm);
  sm__eval_abandon(sm, true);
  bool final = sm__in_final(sm);
  if (ck && !sm__ckpt_busy(sm)) sm__ckpt_retake(sm);
  if (ev && !sm__eval_busy(sm)) {
    if (final) sm->final_eval_done = false;
    else sm->eval_due = true;
  }
}

/* Every event while a PS is lost in training: newly lost PS start
 * waiting, PS that are back are restored, deadlines. False when the PS
 * cannot be restored alone (the caller recovers globally). */
bool sm__pump_alone(coord_sm *sm) {
  if (!sm_alone_phase(sm)) return true;
  if (!sm_alone_ok(sm)) return false;
  int64_t step = sm__newest_good(sm);
  for (int i = 0; i < sm->c.n_ps && !sm->ended; i++) {
    sm_ps *p = &sm->ps[i];
    if (!p->lost) continue;
    switch (p->fix) {
      case SM_FIX_NONE:
        p->fix = SM_FIX_WAIT;
        p->fix_lost_at = p->fix_since = sm->now;
        p->fix_tries = 0;
        sm__note(sm, TSR_LOG_INFO, "%s is lost: training goes on with the "
                 "other PS, which keep their values; calls to it wait until "
                 "it is back and has restored its shards from the checkpoint "
                 "of step %" PRId64 " (checkpoints and evaluations wait too)",
                 p->name, step);
        sm_alone_end_ops(sm);
        /* it may be connected again already */
        __attribute__((fallthrough));
      case SM_FIX_WAIT:
        if (p->connected) {
          sm_alone_send(sm, i, step);
        } else if (sm->now - p->fix_lost_at > sm->c.ps_timeout_s) {
          sm__fail(sm, 1, "a lost parameter server did not come back within "
                   "%.0f s: %s", sm->c.ps_timeout_s, p->name);
        }
        break;
      case SM_FIX_RUN:
        if (sm->now - p->fix_since > sm__grace(sm->c.op_timeout_s))
          sm_alone_failed(sm, i, false, "no answer to the restore");
        break;
    }
  }
  /* a pause for a checkpoint or an evaluation waits for every PS: training
   * goes on meanwhile (both stay due) */
  if (!sm->ended && sm->phase == SM_DRAIN && sm__ps_fixing(sm)) {
    if (sm->after_drain == SM_FINAL)
      sm__set_phase(sm, SM_FINAL);
    else
      sm__enter_train(sm);
  }
  return true;
}

size_t sm__waiting_alone(const coord_sm *sm, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < sm->c.n_ps && off + 64 < len; i++) {
    const sm_ps *p = &sm->ps[i];
    if (p->fix == SM_FIX_NONE) continue;
    int n = p->fix == SM_FIX_RUN
                ? snprintf(buf + off, len - off, "%s%s to restore its shards "
                           "(%.0f s)", off ? ", " : "", p->name,
                           sm->now - p->fix_since)
                : snprintf(buf + off, len - off, "%s%s to come back (%.0f s "
                           "of %.0f s; training goes on, its calls wait)",
                           off ? ", " : "", p->name, sm->now - p->fix_lost_at,
                           sm->c.ps_timeout_s);
    if (n > 0) off += (size_t)n < len - off ? (size_t)n : len - off - 1;
  }
  return off;
}
