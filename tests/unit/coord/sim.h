/* A simulated cluster around the coordinator's state machine, for its unit
 * tests: it feeds events, executes the actions the way the I/O side would
 * (keeping what is in flight and what is on disk), and checks the
 * machine's invariants after every step:
 *   - RESTORE names a committed checkpoint on disk;
 *   - PRUNE never removes the newest committed checkpoint, DISCARD never a
 *     committed one;
 *   - a closure is counted at most once, only in the generation it was
 *     dispatched in, and the steps counted since the last REWIND plus its
 *     step are the machine's step count;
 *   - CONFIGURE / DISPATCH / EVALUATE go to a worker that is up, DISPATCH
 *     only to a member (MEMBER up given, no MEMBER down since), EVALUATE
 *     never to a fresh one (ready with `fresh`, no closure of it ended);
 *   - MEMBER changes a worker's membership each time and bumps the epoch
 *     by one;
 *   - RESTORE_PS (a PS restored alone) only in async, of a committed
 *     checkpoint, to a PS that is up (a later one replaces one the
 *     machine gave up on); no SAVE, SNAPSHOT or EVALUATE while one is out;
 *   - a checkpoint or an evaluation whose snapshot a lost PS held goes no
 *     further (no SAVE_WAIT, COMMIT or EVALUATE of it);
 *   - FAIL carries a message and a non-zero status; nothing follows FAIL
 *     or FINISH.
 * A failed check names the seed (random tests) so the run can be redone.
 */
#ifndef TSR_TEST_COORD_SIM_H
#define TSR_TEST_COORD_SIM_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chief/coord/coord_sm.h"
#include "common/log.h"

#define SIM_MAX 8
#define SIM_FL 256
#define SIM_DISK 128

typedef struct {
  chief_closure c;
  bool lost;            /* its worker went away: it can only fail */
  double at;            /* when it was sent */
} sim_fl;

typedef struct {
  coord_sm_config cfg;
  coord_sm *sm;
  coord_actions acts;
  unsigned seed;
  double now;
  /* the cluster as the I/O side sees it */
  bool ps_up[SIM_MAX], wk_up[SIM_MAX];
  int64_t examples[SIM_MAX];      /* what a worker reports configured */
  /* what the actions asked for and is not answered yet */
  bool op_active;
  coord_act_kind op_kind;
  uint64_t op;
  int64_t op_step;
  int op_worker;
  /* the checkpoint being taken (SAVE, SAVE_WAIT, COMMIT): beside the
   * op above, training going on */
  bool ck_active;
  coord_act_kind ck_kind;
  uint64_t ck_op;
  int64_t ck_step;
  /* the evaluation going on (SNAPSHOT, EVALUATE): beside the others */
  bool ev_active;
  coord_act_kind ev_kind;
  uint64_t ev_op;
  int ev_worker;
  bool snap_held;                 /* the PS hold its snapshot */
  /* a PS was lost while it held (or was taking) the snapshot of the
   * checkpoint / the evaluation going on: its answers may still come (a
   * call sent again to the restarted PS) but that one must not go on */
  bool ck_broken, ev_broken;
  bool cfg_pending[SIM_MAX];
  sim_fl fl[SIM_FL];
  int n_fl;
  /* the checkpoint folder: each one's step and the whole checkpoint its
   * chain starts at (increments: the I/O side's choice, every full_every
   * links a whole one; 0 or 1: every one whole) */
  int64_t disk[SIM_DISK];
  int64_t disk_base[SIM_DISK];
  int disk_links[SIM_DISK];
  int n_disk;
  int full_every;
  bool on_valid;                  /* the checkpoint the PS hold */
  int64_t on_step, on_base;
  int on_links;
  /* tracking */
  uint64_t *counted;
  size_t n_counted, cap_counted;
  int64_t base;                   /* step of the last REWIND */
  int64_t counted_steps;          /* worker steps counted since */
  bool ended;
  int status;
  char fail[COORD_MSG_MAX];
  int n_notes;
  char notes[64][COORD_MSG_MAX];  /* the last 64 */
  int count[COORD_ACT_FINISH + 1];
  int64_t last_restore, last_rewind, first_dispatch_step;
  int64_t restored;               /* a RESTORE answered well, not yet
                                     rewound to (-1: none) */
  bool last_rewind_resumed;
  bool member[SIM_MAX];           /* as the MEMBER actions said */
  bool fresh_next[SIM_MAX];       /* the worker's next WK_READY: fresh */
  bool fresh[SIM_MAX];            /* ready fresh, no closure ended since */
  uint64_t members_epoch;
  uint64_t alone_op[SIM_MAX];     /* RESTORE_PS out per PS (0: none) */
  int64_t alone_step[SIM_MAX];
  double alone_at[SIM_MAX];
  int alone_done;                 /* RESTORE_PS answered well */
  bool setup_hold;                /* the last SETUP_PS held calls */
} sim;

#define SIM_CHECK(s, cond, ...)                                      \
  do {                                                               \
    if (!(cond)) {                                                   \
      char m_[600];                                                  \
      snprintf(m_, sizeof m_, __VA_ARGS__);                          \
      fail_msg("seed %u: %s (%s)", (s)->seed, m_, #cond);            \
    }                                                                \
  } while (0)

static inline bool sim_on_disk(const sim *s, int64_t step) {
  for (int i = 0; i < s->n_disk; i++)
    if (s->disk[i] == step) return true;
  return false;
}

static inline int64_t sim_disk_newest(const sim *s) {
  int64_t m = -1;
  for (int i = 0; i < s->n_disk; i++)
    if (s->disk[i] > m) m = s->disk[i];
  return m;
}

static inline void sim_disk_remove(sim *s, int64_t step) {
  for (int i = 0; i < s->n_disk; i++)
    if (s->disk[i] == step) {
      s->n_disk--;
      s->disk[i] = s->disk[s->n_disk];
      s->disk_base[i] = s->disk_base[s->n_disk];
      s->disk_links[i] = s->disk_links[s->n_disk];
      return;
    }
}

static inline int sim_disk_at(const sim *s, int64_t step) {
  for (int i = 0; i < s->n_disk; i++)
    if (s->disk[i] == step) return i;
  return -1;
}

static inline int64_t sim_k(const sim *s) {
  return s->cfg.mode == TSR_MODE_SYNC || s->cfg.lockstep ? s->cfg.n_wk : 1;
}

static inline bool sim_was_counted(const sim *s, uint64_t id) {
  for (size_t i = 0; i < s->n_counted; i++)
    if (s->counted[i] == id) return true;
  return false;
}

static inline void sim_apply(sim *s, const coord_action *a) {
  SIM_CHECK(s, !s->ended, "action %d after the run ended", (int)a->kind);
  s->count[a->kind]++;
  switch (a->kind) {
    case COORD_ACT_SAVE:
    case COORD_ACT_SAVE_WAIT:
    case COORD_ACT_COMMIT:
      /* one stage at a time, each of the checkpoint SAVE started */
      SIM_CHECK(s, a->kind == COORD_ACT_SAVE || s->ck_step == a->step,
                "%s of step %" PRId64 " during the checkpoint of step %"
                PRId64, a->kind == COORD_ACT_COMMIT ? "COMMIT" : "SAVE_WAIT",
                a->step, s->ck_step);
      for (int i = 0; a->kind == COORD_ACT_SAVE && i < s->cfg.n_ps; i++)
        SIM_CHECK(s, s->alone_op[i] == 0, "SAVE while ps %d is restored "
                  "alone", i);
      if (a->kind == COORD_ACT_SAVE) s->ck_broken = false;
      SIM_CHECK(s, !s->ck_broken, "%s of step %" PRId64 ", whose snapshot "
                "a lost PS held", a->kind == COORD_ACT_COMMIT ? "COMMIT"
                                                             : "SAVE_WAIT",
                a->step);
      s->ck_active = true;
      s->ck_kind = a->kind;
      s->ck_op = a->op;
      s->ck_step = a->step;
      break;
    case COORD_ACT_SNAPSHOT:
    case COORD_ACT_EVALUATE:
      for (int i = 0; i < s->cfg.n_ps; i++)
        SIM_CHECK(s, s->alone_op[i] == 0, "%s while ps %d is restored "
                  "alone", a->kind == COORD_ACT_SNAPSHOT ? "SNAPSHOT"
                                                         : "EVALUATE", i);
      if (a->kind == COORD_ACT_SNAPSHOT) s->ev_broken = false;
      if (a->kind == COORD_ACT_EVALUATE) {
        SIM_CHECK(s, a->index >= 0 && s->wk_up[a->index],
                  "EVALUATE on worker %d that is down", a->index);
        SIM_CHECK(s, !s->fresh[a->index], "EVALUATE on worker %d, which "
                  "holds no dense state yet", a->index);
        SIM_CHECK(s, s->snap_held && a->op == s->ev_op,
                  "EVALUATE of snapshot %" PRIu64 " the PS do not hold",
                  a->op);
        SIM_CHECK(s, !s->ev_broken, "EVALUATE of snapshot %" PRIu64
                  ", which a lost PS held", a->op);
      }
      s->ev_active = true;
      s->ev_kind = a->kind;
      s->ev_op = a->op;
      s->ev_worker = a->index;
      break;
    case COORD_ACT_UNSNAPSHOT:
      s->snap_held = false;
      break;
    case COORD_ACT_SETUP_PS:
    case COORD_ACT_SHUTDOWN:
    case COORD_ACT_RESTORE:
      /* an op out still is one the machine gave up on at its deadline:
       * its answer, if it ever comes, carries an old op id */
      if (a->kind == COORD_ACT_RESTORE) {
        SIM_CHECK(s, sim_on_disk(s, a->step),
                  "RESTORE of step %" PRId64 ", not a committed checkpoint",
                  a->step);
        /* and the whole checkpoint its chain starts at */
        int at = sim_disk_at(s, a->step);
        SIM_CHECK(s, at >= 0 && sim_on_disk(s, s->disk_base[at]),
                  "RESTORE of step %" PRId64 ", whose chain's whole "
                  "checkpoint is gone", a->step);
        s->last_restore = a->step;
      }
      if (a->kind == COORD_ACT_SETUP_PS)
        SIM_CHECK(s, !a->hold || (s->cfg.mode == TSR_MODE_ASYNC &&
                                  coord_sm_last_ckpt(s->sm) >= 0),
                  "SETUP_PS holding calls in mode %d, or without a "
                  "checkpoint to restore", (int)s->cfg.mode);
      if (a->kind == COORD_ACT_SETUP_PS) {
        s->setup_hold = a->hold;
        /* every PS set up again: a restore alone the machine gave up on
         * is over (its answer would carry an old op) */
        memset(s->alone_op, 0, sizeof s->alone_op);
      }
      s->op_active = true;
      s->op_kind = a->kind;
      s->op = a->op;
      s->op_step = a->step;
      s->op_worker = a->index;
      break;
    case COORD_ACT_REWIND: {
      /* the run goes on from the restored checkpoint (the job's end when
       * the checkpoint is past it), never from elsewhere */
      int64_t total = coord_sm_total_steps(s->sm);
      if (s->restored >= 0)
        SIM_CHECK(s, total > 0 && a->step == (s->restored < total
                                                  ? s->restored
                                                  : total),
                  "REWIND to %" PRId64 " after restoring step %" PRId64
                  " (total %" PRId64 ")", a->step, s->restored, total);
      s->restored = -1;
      s->base = a->step;
      s->counted_steps = 0;
      s->last_rewind = a->step;
      s->last_rewind_resumed = a->resumed;
      break;
    }
    case COORD_ACT_PAUSE:
    case COORD_ACT_RELEASE:
      break;
    case COORD_ACT_RESTORE_PS:
      SIM_CHECK(s, s->cfg.mode == TSR_MODE_ASYNC, "RESTORE_PS in mode %d",
                (int)s->cfg.mode);
      SIM_CHECK(s, a->index >= 0 && a->index < s->cfg.n_ps,
                "RESTORE_PS of ps %d", a->index);
      SIM_CHECK(s, s->ps_up[a->index], "RESTORE_PS of ps %d, down",
                a->index);
      SIM_CHECK(s, sim_on_disk(s, a->step), "RESTORE_PS of step %" PRId64
                ", not a committed checkpoint", a->step);
      s->alone_op[a->index] = a->op;
      s->alone_at[a->index] = s->now;
      s->alone_step[a->index] = a->step;
      break;
    case COORD_ACT_MEMBER:
      SIM_CHECK(s, a->index >= 0 && a->index < s->cfg.n_wk,
                "MEMBER of worker %d", a->index);
      SIM_CHECK(s, s->member[a->index] != a->up, "MEMBER %s of worker %d "
                "that already was", a->up ? "up" : "down", a->index);
      SIM_CHECK(s, a->op == s->members_epoch + 1, "MEMBER epoch %" PRIu64
                " after %" PRIu64, a->op, s->members_epoch);
      SIM_CHECK(s, !a->up || s->wk_up[a->index], "MEMBER up of worker %d, "
                "down", a->index);
      SIM_CHECK(s, a->msg[0] != 0, "MEMBER without a reason");
      s->member[a->index] = a->up;
      s->members_epoch = a->op;
      break;
    case COORD_ACT_DISCARD:
      SIM_CHECK(s, !sim_on_disk(s, a->step),
                "DISCARD of the committed checkpoint of step %" PRId64,
                a->step);
      break;
    case COORD_ACT_PRUNE:
      SIM_CHECK(s, sim_on_disk(s, a->step),
                "PRUNE of step %" PRId64 " that is not on disk", a->step);
      SIM_CHECK(s, a->step != sim_disk_newest(s),
                "PRUNE of the newest committed checkpoint (step %" PRId64
                ")", a->step);
      sim_disk_remove(s, a->step);
      for (int i = 0; i < s->n_disk; i++)
        SIM_CHECK(s, !(s->disk_base[i] <= a->step && a->step < s->disk[i]),
                  "PRUNE of step %" PRId64 ", a link of the increment of "
                  "step %" PRId64 " (its chain from step %" PRId64 ")",
                  a->step, s->disk[i], s->disk_base[i]);
      break;
    case COORD_ACT_CONFIGURE:
      SIM_CHECK(s, s->wk_up[a->index], "CONFIGURE of worker %d, down",
                a->index);
      s->cfg_pending[a->index] = true;
      break;
    case COORD_ACT_DISPATCH:
      SIM_CHECK(s, s->wk_up[a->index], "DISPATCH to worker %d, down",
                a->index);
      SIM_CHECK(s, s->n_fl < SIM_FL, "too many closures in flight");
      SIM_CHECK(s, a->closure.steps > 0, "a closure of %" PRId64 " steps",
                a->closure.steps);
      SIM_CHECK(s, s->member[a->index], "DISPATCH to worker %d, no member",
                a->index);
      if (s->first_dispatch_step < 0)
        s->first_dispatch_step = a->closure.first_step;
      s->fl[s->n_fl++] = (sim_fl){.c = a->closure, .at = s->now};
      break;
    case COORD_ACT_COUNT:
      SIM_CHECK(s, !sim_was_counted(s, a->closure.id),
                "closure %" PRIu64 " counted twice", a->closure.id);
      if (s->n_counted == s->cap_counted) {
        s->cap_counted = s->cap_counted ? s->cap_counted * 2 : 256;
        s->counted = realloc(s->counted, s->cap_counted * sizeof *s->counted);
        assert_non_null(s->counted);
      }
      s->counted[s->n_counted++] = a->closure.id;
      s->counted_steps += a->closure.steps;
      if (s->cfg.lockstep) {
        /* lockstep: the scheduler's count stops at the run's worker
         * steps (the last closures round up) */
        int64_t room = (coord_sm_total_steps(s->sm) - s->base) * sim_k(s);
        if (s->counted_steps > room) s->counted_steps = room;
      }
      break;
    case COORD_ACT_NOTE:
      SIM_CHECK(s, a->msg[0] != 0, "an empty note");
      snprintf(s->notes[s->n_notes % 64], COORD_MSG_MAX, "%s", a->msg);
      s->n_notes++;
      if (getenv("SIM_VERBOSE"))
        fprintf(stderr, "  [%.1f] note: %s\n", s->now, a->msg);
      break;
    case COORD_ACT_FAIL:
      SIM_CHECK(s, a->msg[0] != 0, "FAIL without a message");
      SIM_CHECK(s, a->status != 0, "FAIL with status 0");
      s->ended = true;
      s->status = a->status;
      snprintf(s->fail, sizeof s->fail, "%s", a->msg);
      if (getenv("SIM_VERBOSE"))
        fprintf(stderr, "  [%.1f] FAIL %d: %s\n", s->now, a->status, a->msg);
      break;
    case COORD_ACT_FINISH:
      s->ended = true;
      s->status = a->status;
      break;
  }
}

/* Feeds one event (its `now` is the simulation's) and applies the
 * actions. */
static inline void sim_ev(sim *s, coord_event ev) {
  ev.now = s->now;
  s->acts.n = 0;
  assert_int_equal(coord_sm_step(s->sm, &ev, &s->acts), 0);
  for (size_t i = 0; i < s->acts.n; i++) sim_apply(s, &s->acts.a[i]);
  /* The machine's own account of its end agrees with the actions it gave. */
  SIM_CHECK(s, coord_sm_ended(s->sm) == s->ended,
            "the machine says it %s ended, its actions say it %s",
            coord_sm_ended(s->sm) ? "has" : "has not",
            s->ended ? "has" : "has not");
  if (s->ended) {
    SIM_CHECK(s, coord_sm_exit_status(s->sm) == s->status,
              "exit status %d, the FINISH/FAIL action said %d",
              coord_sm_exit_status(s->sm), s->status);
    return;
  }
  const chief_sched *sc = coord_sm_sched(s->sm);
  SIM_CHECK(s, s->base * sim_k(s) + s->counted_steps ==
                   chief_sched_done_steps(sc),
            "done %" PRId64 " but %" PRId64 " rewound to + %" PRId64
            " counted", chief_sched_done_steps(sc), s->base,
            s->counted_steps);
}

static inline void sim_init(sim *s, const coord_sm_config *cfg, unsigned seed) {
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  s->seed = seed;
  s->now = 1000;
  s->last_restore = s->last_rewind = s->first_dispatch_step = -1;
  s->restored = -1;
  for (int i = 0; i < SIM_MAX; i++) s->examples[i] = 100;
  coord_actions_init(&s->acts);
  assert_int_equal(coord_sm_new(&s->sm, cfg), 0);
}

/* A chief that restarts: a new machine, the same cluster and disk; what
 * the old one had in flight is forgotten. */
static inline void sim_restart_chief(sim *s) {
  coord_sm_free(s->sm);
  assert_int_equal(coord_sm_new(&s->sm, &s->cfg), 0);
  s->op_active = false;
  s->ck_active = false;
  s->ev_active = false;
  memset(s->cfg_pending, 0, sizeof s->cfg_pending);
  s->n_fl = 0;
  s->base = 0;
  s->counted_steps = 0;
  s->n_counted = 0; /* its closure ids are its own */
  memset(s->alone_op, 0, sizeof s->alone_op);
  memset(s->member, 0, sizeof s->member);
  s->members_epoch = 0;
  s->restored = -1;
  s->ended = false;
  s->on_valid = false; /* the new chief knows what it restores */
  if (s->n_disk)
    sim_ev(s, (coord_event){.kind = COORD_EV_CHECKPOINTS, .steps = s->disk,
                            .n_steps = (size_t)s->n_disk,
                            .bases = s->disk_base});
}

static inline void sim_free(sim *s) {
  coord_sm_free(s->sm);
  coord_actions_free(&s->acts);
  free(s->counted);
}

static inline void sim_tick(sim *s, double dt) {
  s->now += dt;
  sim_ev(s, (coord_event){.kind = COORD_EV_TIMER});
}

static inline void sim_ps_up(sim *s, int i) {
  s->ps_up[i] = true;
  sim_ev(s, (coord_event){.kind = COORD_EV_PS_UP, .index = i});
}

static inline void sim_wk_up(sim *s, int w) {
  if (getenv("SIM_VERBOSE")) fprintf(stderr, "  [%.1f] sim: worker %d up\n", s->now, w);
  s->wk_up[w] = true;
  sim_ev(s, (coord_event){.kind = COORD_EV_WK_UP, .index = w});
}

static inline void sim_all_up(sim *s) {
  for (int i = 0; i < s->cfg.n_ps; i++) sim_ps_up(s, i);
  for (int w = 0; w < s->cfg.n_wk; w++) sim_wk_up(s, w);
}

static inline void sim_alone_answer(sim *s, int i, int status, bool lost,
                                    const char *msg);

/* The PS goes away; a restore alone out to it fails with it. */
static inline void sim_ps_lost(sim *s, int i) {
  s->ps_up[i] = false;
  if (s->ck_active && s->ck_kind != COORD_ACT_COMMIT) s->ck_broken = true;
  if (s->ev_active || s->snap_held) s->ev_broken = true;
  sim_ev(s, (coord_event){.kind = COORD_EV_PS_LOST, .index = i,
                          .msg = "connection closed"});
  if (s->alone_op[i] && !s->ended)
    sim_alone_answer(s, i, -1, true, "restore: connection closed");
}

/* The worker goes away: its configuration and closures fail with it. */
static inline void sim_wk_lost(sim *s, int w) {
  if (getenv("SIM_VERBOSE")) fprintf(stderr, "  [%.1f] sim: worker %d lost\n", s->now, w);
  s->wk_up[w] = false;
  for (int k = 0; k < s->n_fl; k++)
    if (s->fl[k].c.worker == w) s->fl[k].lost = true;
  sim_ev(s, (coord_event){.kind = COORD_EV_WK_LOST, .index = w,
                          .msg = "connection closed"});
  if (s->cfg_pending[w]) {
    s->cfg_pending[w] = false;
    sim_ev(s, (coord_event){.kind = COORD_EV_WK_CONFIG_FAILED, .index = w,
                            .err_kind = COORD_ERR_LOST, .status = -1,
                            .msg = "connection closed"});
  }
}

/* The worker goes away and its closures are never answered (a closure
 * sent to it after its connection broke, waiting for a connection that
 * will not come back, answers only at its deadline). */
static inline void sim_wk_vanish(sim *s, int w) {
  sim_wk_lost(s, w);
  for (int k = 0; k < s->n_fl;)
    if (s->fl[k].c.worker == w)
      s->fl[k] = s->fl[--s->n_fl];
    else
      k++;
}

/* Answers PS i's restore alone: well, with its own error, or lost. */
static inline void sim_alone_answer(sim *s, int i, int status, bool lost,
                                    const char *msg) {
  assert_true(s->alone_op[i] != 0);
  uint64_t op = s->alone_op[i];
  s->alone_op[i] = 0;
  if (!status) s->alone_done++;
  sim_ev(s, (coord_event){.kind = COORD_EV_PS_RESTORED, .op = op, .index = i,
                          .step = s->alone_step[i], .status = status,
                          .lost = lost, .msg = msg});
}

static inline int sim_alone_out(const sim *s) {
  for (int i = 0; i < s->cfg.n_ps; i++)
    if (s->alone_op[i]) return i;
  return -1;
}

/* Answers the PS / eval / shutdown operation out. */
static inline void sim_answer(sim *s, int status, int ps, bool lost,
                              const char *msg) {
  assert_true(s->op_active);
  s->op_active = false;
  coord_event ev = {.op = s->op, .status = status, .index = ps, .lost = lost,
                    .msg = msg, .step = s->op_step};
  switch (s->op_kind) {
    case COORD_ACT_SETUP_PS: ev.kind = COORD_EV_SETUP_DONE; break;
    case COORD_ACT_RESTORE: {
      ev.kind = COORD_EV_RESTORE_DONE;
      s->restored = status ? -1 : s->op_step;
      int at = sim_disk_at(s, s->op_step);
      if (!status && at >= 0) { /* the PS hold it now */
        s->on_valid = true;
        s->on_step = s->op_step;
        s->on_base = s->disk_base[at];
        s->on_links = s->disk_links[at];
      }
      break;
    }
    case COORD_ACT_SHUTDOWN: ev.kind = COORD_EV_SHUTDOWN_DONE; break;
    default: fail_msg("no op to answer");
  }
  sim_ev(s, ev);
}

/* Answers the checkpoint's stage out (SAVE: the snapshots; SAVE_WAIT:
 * the files; COMMIT: the manifest, on disk when it went well). */
static inline void sim_ck_answer(sim *s, int status, int ps, bool lost,
                                 const char *msg) {
  assert_true(s->ck_active);
  s->ck_active = false;
  coord_event ev = {.op = s->ck_op, .status = status, .index = ps,
                    .lost = lost, .msg = msg, .step = s->ck_step};
  switch (s->ck_kind) {
    case COORD_ACT_SAVE: ev.kind = COORD_EV_SAVE_DONE; break;
    case COORD_ACT_SAVE_WAIT: ev.kind = COORD_EV_SAVE_WRITTEN; break;
    case COORD_ACT_COMMIT: {
      ev.kind = status ? COORD_EV_CKPT_FAILED : COORD_EV_CKPT_COMMITTED;
      if (status) break;
      /* as the I/O side: an increment over what the PS hold, up to
       * full_every links */
      bool inc = s->full_every > 1 && s->on_valid &&
                 s->on_links < s->full_every && s->on_step < s->ck_step;
      int64_t base = inc ? s->on_base : s->ck_step;
      int links = inc ? s->on_links + 1 : 1;
      ev.increment = inc;
      ev.base = base;
      int at = sim_disk_at(s, s->ck_step);
      if (at < 0 && s->n_disk < SIM_DISK) at = s->n_disk++;
      if (at >= 0) {
        s->disk[at] = s->ck_step;
        s->disk_base[at] = base;
        s->disk_links[at] = links;
      }
      s->on_valid = true;
      s->on_step = s->ck_step;
      s->on_base = base;
      s->on_links = links;
      break;
    }
    default: fail_msg("no checkpoint stage to answer");
  }
  sim_ev(s, ev);
}

/* Answers the evaluation's stage out (SNAPSHOT: every PS holds it;
 * EVALUATE: the worker's answer). */
static inline void sim_ev_answer(sim *s, int status, const char *msg) {
  assert_true(s->ev_active);
  s->ev_active = false;
  coord_event ev = {.op = s->ev_op, .status = status, .index = -1,
                    .msg = msg};
  if (s->ev_kind == COORD_ACT_SNAPSHOT) {
    ev.kind = COORD_EV_SNAPSHOT_DONE;
    s->snap_held = status == 0;
  } else {
    ev.kind = COORD_EV_EVAL_DONE;
    ev.index = s->ev_worker;
  }
  sim_ev(s, ev);
}

/* A whole checkpoint answered well: snapshots, files, manifest. */
static inline void sim_ck_through(sim *s) {
  for (int i = 0; i < 3 && s->ck_active; i++)
    sim_ck_answer(s, 0, -1, false, NULL);
}

static inline void sim_ready(sim *s, int w) {
  assert_true(s->cfg_pending[w]);
  s->cfg_pending[w] = false;
  s->fresh[w] = s->fresh_next[w];
  s->fresh_next[w] = false;
  sim_ev(s, (coord_event){.kind = COORD_EV_WK_READY, .index = w,
                          .examples = s->examples[w], .fresh = s->fresh[w]});
}

static inline void sim_cfg_fail(sim *s, int w, coord_err_kind k,
                                const char *msg) {
  assert_true(s->cfg_pending[w]);
  s->cfg_pending[w] = false;
  sim_ev(s, (coord_event){.kind = COORD_EV_WK_CONFIG_FAILED, .index = w,
                          .err_kind = k, .status = -1, .msg = msg});
}

static inline sim_fl sim_take(sim *s, int k) {
  sim_fl f = s->fl[k];
  s->fl[k] = s->fl[--s->n_fl];
  return f;
}

static inline void sim_closure_done(sim *s, int k, int64_t steps) {
  sim_fl f = sim_take(s, k);
  s->fresh[f.c.worker] = false;
  coord_event ev = {.kind = COORD_EV_CLOSURE_DONE, .index = f.c.worker,
                    .closure_id = f.c.id, .generation = f.c.generation,
                    .steps_done = steps < 0 ? f.c.steps : steps};
  ev.stats.examples = ev.steps_done * 32;
  ev.stats.loss_sum = (double)ev.steps_done;
  sim_ev(s, ev);
}

static inline void sim_closure_fail(sim *s, int k, coord_err_kind kind,
                                    const char *msg) {
  sim_fl f = sim_take(s, k);
  sim_ev(s, (coord_event){.kind = COORD_EV_CLOSURE_FAILED,
                          .index = f.c.worker, .closure_id = f.c.id,
                          .generation = f.c.generation, .err_kind = kind,
                          .status = -1, .msg = msg});
}

/* Answers one thing that is out (a configuration, an op, the oldest
 * closure), or lets time pass. */
static inline void sim_step(sim *s) {
  for (int w = 0; w < s->cfg.n_wk; w++)
    if (s->cfg_pending[w]) {
      sim_ready(s, w);
      return;
    }
  if (s->op_active) {
    sim_answer(s, 0, -1, false, NULL);
    return;
  }
  if (s->ck_active) {
    sim_ck_answer(s, 0, -1, false, NULL);
    return;
  }
  if (s->ev_active) {
    sim_ev_answer(s, 0, NULL);
    return;
  }
  int a = sim_alone_out(s);
  if (a >= 0) {
    sim_alone_answer(s, a, 0, false, NULL);
    return;
  }
  if (s->n_fl) {
    sim_closure_done(s, 0, -1);
    return;
  }
  sim_tick(s, 0.1);
}

/* Everything answered and well, until the run ends (or `max` rounds). */
static inline void sim_run_calm(sim *s, int max) {
  for (int r = 0; r < max && !s->ended; r++) {
    bool any = false;
    for (int i = 0; i < s->cfg.n_ps && !s->ended; i++)
      if (!s->ps_up[i]) sim_ps_up(s, i), any = true;
    for (int w = 0; w < s->cfg.n_wk && !s->ended; w++)
      if (!s->wk_up[w]) sim_wk_up(s, w), any = true;
    for (int w = 0; w < s->cfg.n_wk && !s->ended; w++)
      if (s->cfg_pending[w]) sim_ready(s, w), any = true;
    while (s->n_fl > 0 && !s->ended) {
      if (s->fl[0].lost)
        sim_closure_fail(s, 0, COORD_ERR_LOST, "connection closed");
      else
        sim_closure_done(s, 0, -1);
      any = true;
    }
    if (s->op_active && !s->ended) {
      sim_answer(s, 0, -1, false, NULL);
      any = true;
    }
    if (s->ck_active && !s->ended) {
      sim_ck_answer(s, 0, -1, false, NULL);
      any = true;
    }
    if (s->ev_active && !s->ended) {
      sim_ev_answer(s, 0, NULL);
      any = true;
    }
    for (int a; !s->ended && (a = sim_alone_out(s)) >= 0; any = true)
      sim_alone_answer(s, a, 0, false, NULL);
    if (!any && !s->ended) sim_tick(s, 0.5);
  }
}

static inline coord_sm_config sim_config(int n_ps, int n_wk, tsr_mode mode,
                                         int64_t steps) {
  coord_sm_config c = {
      .n_ps = n_ps, .n_wk = n_wk, .mode = mode, .steps = steps, .epochs = 1,
      .batch_size = 10, .steps_per_closure = 10, .max_inflight = 2,
      .job_path = "job.json", .wait_timeout_s = 30, .ps_timeout_s = 60,
      .closure_timeout_s = 20, .op_timeout_s = 10, .shutdown_timeout_s = 5,
      .restore_tries = 3, .max_closure_failures = 3, .ckpt_keep = 3};
  return c;
}

/* sim_config with checkpoints on, saved every `every` steps (0: only at
 * the end). */
static inline coord_sm_config sim_ckpt_config(int n_ps, int n_wk,
                                              tsr_mode mode, int64_t steps,
                                              int64_t every) {
  coord_sm_config c = sim_config(n_ps, n_wk, mode, steps);
  c.ckpt = true;
  c.ckpt_every_steps = every;
  return c;
}

/* A new chief on a disk that holds the committed checkpoints of `steps`
 * (n of them, oldest first). */
static inline void sim_restart_on(sim *s, const int64_t *steps, int n) {
  for (int i = 0; i < n; i++) {
    s->disk_base[s->n_disk] = steps[i];
    s->disk_links[s->n_disk] = 1;
    s->disk[s->n_disk++] = steps[i];
  }
  sim_restart_chief(s);
}

/* Runs until a checkpoint of step >= `at_least` is on disk, no operation
 * is going on, and training is `past` steps beyond the newest checkpoint;
 * returns that checkpoint's step. */
static inline int64_t sim_run_past_ckpt(sim *s, int64_t at_least,
                                        int64_t past) {
  while (sim_disk_newest(s) < at_least || s->op_active || s->ck_active ||
         coord_sm_global_step(s->sm) < sim_disk_newest(s) + past)
    sim_step(s);
  return sim_disk_newest(s);
}

static inline bool sim_noted(const sim *s, const char *needle) {
  int n = s->n_notes < 64 ? s->n_notes : 64;
  for (int i = 0; i < n; i++)
    if (strstr(s->notes[i], needle)) return true;
  return false;
}

#endif
