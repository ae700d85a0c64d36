/* The machine's private state, shared by coord_sm.c (events, setup,
 * restore, the end), coord_sm_train.c (workers, closures, training),
 * coord_sm_ckpt.c (drain, checkpoints, evaluation) and coord_sm_recover.c
 * (a lost PS: restored alone, or the global recovery). Nothing outside
 * these files includes it.
 */
#ifndef TSR_CHIEF_COORD_SM_INT_H
#define TSR_CHIEF_COORD_SM_INT_H

#include "chief/coord/coord_sm.h"

typedef enum {
  SM_CONNECT = 0,
  SM_SETUP,     /* SETUP_PS sent */
  SM_RESTORE,   /* RESTORE sent */
  SM_TRAIN,
  SM_DRAIN,     /* paused: closures finish before a save or an eval */
  SM_SAVE,      /* paused (sync, ssp, the first and last checkpoint):
                   SAVE sent, until every PS holds its snapshot */
  SM_EVAL,      /* paused (dense "allreduce"): an evaluation runs on a
                   worker of the ring, until it answers */
  SM_RECOVER,   /* a PS lost, or a setup/restore try failed */
  SM_FINAL,
  SM_SHUTDOWN,  /* SHUTDOWN sent */
  SM_DONE,
  SM_FAILED
} sm_phase;

enum { SM_START_FRESH = 0, SM_START_CHIEF, SM_START_PS };

/* A PS restored alone (async), coord_sm_recover.c. */
typedef enum {
  SM_FIX_NONE = 0,
  SM_FIX_WAIT,          /* lost: waiting for it to be connected again */
  SM_FIX_RUN            /* RESTORE_PS sent (fix_op) */
} sm_fix;

typedef struct {
  bool connected;
  bool lost;            /* went away after the run started */
  char name[COORD_NAME_MAX];
  sm_fix fix;
  uint64_t fix_op;
  double fix_lost_at;   /* when it was found lost (its ps_timeout_s) */
  double fix_since;     /* RESTORE_PS sent at */
  int fix_tries;        /* failed tries of restoring it alone */
} sm_ps;

typedef struct {
  coord_wk_state st;
  bool ever_ready;
  bool answered;        /* has answered a configuration of this run */
  bool left;            /* ssp/sync: told the PS it no longer counts */
  bool member;          /* MEMBER up given, no MEMBER down since */
  bool fresh;           /* dense "allreduce": ready, holding none of the
                           run's dense state yet (WK_READY's fresh) */
  int restarts;
  int failures;         /* its own closure errors in a row */
  int64_t examples;     /* per epoch, -1 unknown */
  double since;         /* CONFIGURING: sent at; CONNECTED: retry at */
  double unanswered_at; /* its first configuration still unanswered went
                           out at (0: none; asking again keeps it) */
  char name[COORD_NAME_MAX];
  char last_error[COORD_MSG_MAX];
} sm_wk;

/* A closure sent and not answered yet (any generation). */
typedef struct {
  uint64_t id;
  uint32_t gen;
  int worker;
  double sent;
  double deadline;
} sm_out;

struct coord_sm {
  coord_sm_config c;
  char job_path[COORD_NAME_MAX * 4];
  sm_ps *ps;
  sm_wk *wk;
  chief_sched *sched;
  coord_actions *out;   /* the current step's actions */
  bool oom;
  bool started;         /* the first event set the clock */
  double now;

  sm_phase phase;
  double t_phase;
  double t_note;        /* last "waiting for" note */
  sm_phase after_drain; /* SM_TRAIN or SM_FINAL */
  bool recovering;      /* a PS was lost during the run */
  uint64_t next_op, op; /* op: the PS/eval/shutdown call awaited */
  int tries;            /* failed setup/restore tries of this target */

  int64_t total;        /* global steps; 0 until known */
  double t_total_wait;
  int64_t pending_resume;  /* rewind to this once the total is known */
  int pending_why;         /* SM_START_FRESH, _CHIEF (restarted), _PS */
  int64_t resumed_from;

  /* committed checkpoints, oldest first */
  int64_t ck[COORD_MAX_CKPTS];
  bool ck_bad[COORD_MAX_CKPTS];   /* failed to restore restore_tries times */
  int64_t ck_base[COORD_MAX_CKPTS]; /* the whole checkpoint its chain starts
                                       at (itself when whole) */
  int n_ck;
  int64_t restore_step;
  int64_t save_step;
  /* the checkpoint being taken (coord_sm_ckpt.c), whatever the phase:
   * SM_CK_SNAP (SAVE out), SM_CK_WRITE (SAVE_WAIT out), SM_CK_HOLD (the
   * run's last: its files written, its manifest waits for the final
   * evaluation, whose figures it records), SM_CK_COMMIT (COMMIT out); its
   * own op id, apart from `op` */
  int ck_stage;
  uint64_t ck_op;
  double t_ck;
  /* the evaluation going on (coord_sm_ckpt.c), whatever the phase:
   * SM_EV_SNAP (SNAPSHOT out), SM_EV_RUN (EVALUATE out); ev_op names the
   * snapshot and both calls */
  int ev_stage;
  uint64_t ev_op;
  double t_ev;
  int64_t ev_step;
  bool ckpt_due, eval_due;
  int64_t next_ckpt, next_eval;
  double t_last_ckpt;
  bool final_ckpt_done, final_eval_done;
  double t_final_wait;
  int eval_worker, eval_rr;
  coord_ckpt_failure *fails;
  size_t n_fails, cap_fails;

  sm_out *outs;
  size_t n_outs, cap_outs;
  double t_progress;    /* last closure counted (or training entered) */
  double t_noworker;    /* since when no worker is ready (0: one is) */
  bool gate_open;       /* sync: a closure went out since the last rewind */
  double t_gate;
  double t_wait_note;   /* last "waiting for" note of training or a pause */
  uint64_t members_epoch;

  int restarts_ps, restarts_worker;
  int initial_restarts;      /* a lost PS's shards started again from their
                               initial values after training began (a job
                               without checkpoints): the run exits 1 */
  int exit_status;
  char fail_msg[COORD_MSG_MAX];
  double t_train_start, t_train_end;
  bool ended;
};

/* coord_sm.c */
coord_action *sm__emit(coord_sm *sm, coord_act_kind k);
void sm__note(coord_sm *sm, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sm__fail(coord_sm *sm, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sm__set_phase(coord_sm *sm, sm_phase p);
/* Enters phase p with a new operation and emits its action k (with the
 * operation's id); NULL when out of memory (sm->oom is then set). */
coord_action *sm__start_op(coord_sm *sm, sm_phase p, coord_act_kind k);
/* Whether `ev` answers the operation of phase p now going on (false: a
 * stale answer); a PS the answer says was lost is marked so. */
bool sm__op_answer(coord_sm *sm, const coord_event *ev, sm_phase p);
/* sync, or dense "allreduce": every worker runs every global step */
bool sm__lockstep(const coord_sm *sm);
/* async with every variable on the PS: checkpoints and evaluations are
 * taken while training goes on. Otherwise a checkpoint is taken at a step
 * boundary; with dense "allreduce" an evaluation too, and the ring waits
 * for it (the dense variables are the workers' own, changed by every
 * step, and the evaluating worker is a member the ring needs). */
bool sm__nodrain(const coord_sm *sm);
int64_t sm__global(const coord_sm *sm);
int64_t sm__wsteps(const coord_sm *sm, int64_t global);
bool sm__ps_lost(const coord_sm *sm);
double sm__grace(double d);
void sm__enter_final(coord_sm *sm);
bool sm__all_ps(const coord_sm *sm);      /* every PS connected */
/* " ps:0 (addr) ps:1 (addr)": the PS not connected, into buf (cut to
 * len); the length written. */
size_t sm__ps_away(const coord_sm *sm, char *buf, size_t len);
void sm__enter_setup(coord_sm *sm);       /* SETUP_PS on every PS */

/* coord_sm_recover.c */
void sm__enter_recover(coord_sm *sm, bool from_training);
void sm__pump_recover(coord_sm *sm);
/* A lost PS in training: restored alone when it can be (async); false
 * when it cannot (the caller recovers globally). */
bool sm__pump_alone(coord_sm *sm);
void sm__on_ps_restored(coord_sm *sm, const coord_event *ev);
/* A PS is being restored alone: checkpoints and evaluations wait. */
bool sm__ps_fixing(const coord_sm *sm);
/* "ps:1 to come back (...)": what the restores alone wait for. */
size_t sm__waiting_alone(const coord_sm *sm, char *buf, size_t len);

/* coord_sm_train.c */
void sm__on_worker(coord_sm *sm, const coord_event *ev);
void sm__on_closure(coord_sm *sm, const coord_event *ev);
void sm__closure_deadlines(coord_sm *sm);
void sm__configure_workers(coord_sm *sm);
int sm__dispatch(coord_sm *sm);
void sm__release_idle(coord_sm *sm);  /* closures sent */
void sm__enter_train(coord_sm *sm);
void sm__pump_train(coord_sm *sm);
int sm__count(const coord_sm *sm, coord_wk_state st);
/* A ready worker for an evaluation, round robin, never a fresh one;
 * -1: none */
int sm__ready_worker(coord_sm *sm);
/* What training or a pause waits for (closures out, no worker): the text
 * of coord_sm_waiting; "" when nothing. */
size_t sm__waiting_train(const coord_sm *sm, char *buf, size_t len);
/* Says in a note, every 10 s while it lasts, what training or a pause has
 * waited on for 5 s or more without a closure coming back. */
void sm__note_waiting(coord_sm *sm);

/* coord_sm_ckpt.c */
void sm__ckpt_known(coord_sm *sm, const int64_t *steps, const int64_t *bases,
                    size_t n);
int64_t sm__newest_good(const coord_sm *sm);   /* -1: none */
int64_t sm__newest_committed(const coord_sm *sm);
void sm__mark_bad(coord_sm *sm, int64_t step);
enum { SM_CK_IDLE = 0, SM_CK_SNAP, SM_CK_WRITE, SM_CK_HOLD, SM_CK_COMMIT };
void sm__enter_drain(coord_sm *sm, sm_phase after);
void sm__pump_drain(coord_sm *sm);
/* Training (async): a due checkpoint starts without a pause. */
void sm__ckpt_background(coord_sm *sm);
/* Whether a checkpoint is being taken (its snapshot, files or manifest
 * still out). */
bool sm__ckpt_busy(const coord_sm *sm);
/* A PS was lost: a checkpoint whose snapshots or files were still out
 * fails (its files cannot all be written now). */
void sm__ckpt_abandon(coord_sm *sm);
/* A checkpoint ended by a lost PS is due again once every PS is whole
 * (in the final phase: the final checkpoint is taken again). */
void sm__ckpt_retake(coord_sm *sm);
/* Every pump: a held final checkpoint (SM_CK_HOLD) is committed once the
 * final evaluation has ended, well or not, or the run left the final
 * phase. */
void sm__ckpt_release(coord_sm *sm);
/* Whether the run is in its final phase, or pausing on the way to it. */
bool sm__in_final(const coord_sm *sm);
void sm__on_ckpt(coord_sm *sm, const coord_event *ev);
enum { SM_EV_IDLE = 0, SM_EV_SNAP, SM_EV_RUN };
/* A due evaluation starts (training goes on): SNAPSHOT. */
void sm__eval_start(coord_sm *sm);
bool sm__eval_busy(const coord_sm *sm);
/* A PS was lost: the evaluation's snapshot went with it. drop: the
 * other PS go on serving (the lost one is restored alone) and are told
 * to drop theirs; else every PS is set up again, which drops it. */
void sm__eval_abandon(coord_sm *sm, bool drop);
void sm__on_eval(coord_sm *sm, const coord_event *ev);
/* Every pump: the deadlines of the checkpoint and evaluation out. */
void sm__ckpt_deadlines(coord_sm *sm);

#endif
