/* The coordinator's decisions as a pure state machine:
 * (state, event) -> (state, actions). No I/O, no clock reads (an event
 * carries `now`), no logging: what should be said comes back as NOTE
 * actions. The I/O side (coord_io.c, coord_ps.c, coord_wk.c) turns RPC
 * answers, connection changes, signals and a timer into events, and
 * executes the actions; the unit tests (tests/unit/coord/) drive the
 * machine alone through failure sequences and random interleavings.
 *
 * Happy path (phases):
 *   connect   every PS and worker answers (wait_timeout_s, then with the
 *             workers that are there, or failure naming who is missing)
 *   setup     every PS creates the variables (SETUP_PS); a chief restarted
 *             on a checkpoint folder restores its newest committed
 *             checkpoint (RESTORE, then REWIND), else a checkpoint of step
 *             0 is taken so a lost PS always has one to go back to
 *   train     workers are configured (CONFIGURE) and report their share of
 *             the data; an epochs-based job learns its length from them,
 *             and only then is a resumed run rewound to its checkpoint's
 *             step; closures go out (DISPATCH) and come back (COUNT);
 *             every checkpoint.every_steps a checkpoint: SAVE (every PS
 *             snapshots its shards), SAVE_WAIT (their files written),
 *             COMMIT (the manifest). Async training goes on throughout;
 *             sync and ssp drain (PAUSE) to a step boundary and go on
 *             once the snapshots are taken. Every eval_every_steps an
 *             evaluation: SNAPSHOT (every PS), EVALUATE on one worker
 *             reading it, UNSNAPSHOT; training goes on throughout
 *   final     last checkpoint and evaluation, SHUTDOWN (the job is done),
 *             FINISH with status 0
 *
 * Failure modes, each with its decision:
 *   a worker is lost (WK_LOST: its connection closed, or went silent past
 *     the heartbeat timeout; or a closure failed because its connection
 *     is gone): at once its closures' steps go back to the pool and run on
 *     the workers that are up, nothing waits for their answers any more
 *     (a pause for a checkpoint goes on without them), MEMBER says it left;
 *     it is configured again when it comes back, at once, also during a
 *     pause for a checkpoint or an evaluation (sync: it sits the run out
 *     unless cfg.sync_rejoin; dense "allreduce": WK_READY says whether it
 *     is fresh, holding none of the run's dense state, and a fresh worker
 *     evaluates nothing until a closure of it ends). The closure deadline
 *     is for a worker that
 *     is connected but does not answer (alive and stuck);
 *   a closure fails: transient (a PS unreachable, a stale sync push) - its
 *     steps go back; the worker's own error - the same, and after
 *     max_closure_failures in a row the worker is left out; a data error
 *     - the run fails with the worker's message and COORD_EXIT_DATA;
 *   a worker cannot be configured: data error - the run fails as above;
 *     another error - the worker is left out; the run fails when every
 *     worker is left out, with their errors;
 *   a PS is lost, async (with a committed checkpoint, and another PS
 *     still up): training goes on, the other PS keep their values; when
 *     it is back RESTORE_PS has it alone set up and restore its own shards
 *     from the newest good checkpoint, holding every call meanwhile;
 *     PS_RESTORED ends it; no REWIND. Checkpoints and evaluations wait
 *     until it is done; restore_tries failed tries fall back to:
 *   a PS is lost, sync and ssp (or async without the above): PAUSE,
 *     forget the closures in flight, wait for it (ps_timeout_s), SETUP_PS,
 *     RESTORE the newest good committed checkpoint, REWIND to its step; a
 *     failed setup or restore is a try (one NOTE each, naming the PS and
 *     its reason); after restore_tries failed restores of one checkpoint
 *     the next older one is tried; when none is left the run fails with
 *     the last reason;
 *   a checkpoint fails (a PS save, the manifest, disk full): NOTE, DISCARD
 *     its folder, remember it for the summary, go on training;
 *   nothing comes back: every waiting state has a deadline that leads to
 *     progress or to FAIL with a message naming what it waited for.
 *
 * Invariants the tests check: the final step count equals the total; a
 * closure is counted at most once and only in its generation; PRUNE never
 * removes the newest committed checkpoint, nor one a kept increment
 * builds on; RESTORE always names a
 * committed one; a data error always fails the run; every run reaches
 * FINISH or FAIL when only timer events come.
 *
 * Threads: none of its own; one machine is used by one thread.
 */
#ifndef TSR_CHIEF_COORD_SM_H
#define TSR_CHIEF_COORD_SM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief/coord/scheduler.h"
#include "common/err.h"
#include "common/job.h"

/* Exit status of a run that stops on its data (the chief and
 * `tessera-worker --standalone` alike). */
#define COORD_EXIT_DATA TSR_EXIT_DATA
/* Interrupted by a signal. */
#define COORD_EXIT_SIGNAL 130

#define COORD_MSG_MAX 512
#define COORD_NAME_MAX 96
#define COORD_MAX_CKPTS 64

typedef struct coord_sm coord_sm;

typedef struct {
  int n_ps, n_wk;
  /* "ps:0 (host:port)" etc. for messages; NULL: "ps:I", "worker:I".
   * Copied. */
  const char *const *ps_names;
  const char *const *wk_names;
  const char *job_path;      /* for messages; copied */
  tsr_mode mode;
  int64_t steps;             /* global steps; 0: from epochs */
  int64_t epochs;
  int64_t batch_size;
  int64_t steps_per_closure;
  int max_inflight;          /* closures per worker; 0: 2 */
  bool ckpt;                 /* the job names a checkpoint folder */
  int64_t ckpt_every_steps;  /* 0: only at the end */
  double ckpt_every_secs;    /* 0: off */
  int ckpt_keep;             /* committed checkpoints kept; 0: 3 */
  bool has_eval;
  int64_t eval_every_steps;  /* 0: only at the end */
  bool keep_cluster;         /* no SHUTDOWN at the end */
  bool sync_rejoin;          /* sync: a worker that comes back takes part */
  bool lockstep;             /* the workers step together whatever the
                                mode (dense "allreduce": one global step
                                is a step of every worker, as in sync) */
  /* deadlines (seconds); 0 takes the default in brackets */
  double wait_timeout_s;     /* the cluster, a worker to come back [300] */
  double ps_timeout_s;       /* a lost PS to come back [600] */
  double closure_timeout_s;  /* one closure or evaluation [600] */
  double op_timeout_s;       /* setup, restore, save, commit, configure [150] */
  double shutdown_timeout_s; /* the end-of-job shutdown answers [10] */
  int restore_tries;         /* failed tries per checkpoint [3] */
  int max_closure_failures;  /* a worker's own errors in a row [3] */
} coord_sm_config;

/* How a failure is to be taken. */
typedef enum {
  COORD_ERR_TRANSIENT = 0, /* try again (a PS unreachable, a timeout) */
  COORD_ERR_LOST,          /* the peer's connection is gone */
  COORD_ERR_DATA,          /* the job's data is bad: the run fails */
  COORD_ERR_OTHER          /* the peer's own error */
} coord_err_kind;

/* What a closure's answer says besides its step count; the machine copies
 * it from CLOSURE_DONE to the COUNT action untouched. */
typedef struct {
  int64_t examples;
  double loss_sum;
  double wall_s, input_s, pull_s, compute_s, push_s;
  uint64_t max_staleness;
  double latency_s;
  double allreduce_s;        /* dense "allreduce": waited on the ring */
  uint64_t allreduce_bytes;  /* gradient bytes all-reduced */
} coord_closure_stats;

typedef enum {
  COORD_EV_TIMER = 0,
  COORD_EV_SIGNAL,
  COORD_EV_CHECKPOINTS,    /* steps/n_steps: the committed checkpoints on
                              disk at start, any order (the chief resumes
                              from the newest); bases: each one's base */
  COORD_EV_PS_UP,          /* index */
  COORD_EV_PS_LOST,        /* index, msg */
  COORD_EV_SETUP_DONE,     /* op, status, index (the PS that failed), lost,
                              msg */
  COORD_EV_RESTORE_DONE,   /* op, status, index, lost, msg */
  COORD_EV_PS_RESTORED,    /* op, index, step, status, lost, msg: a
                              RESTORE_PS ended */
  COORD_EV_SAVE_DONE,      /* op, status, index, lost, msg: every PS
                              holds its snapshot (or one failed) */
  COORD_EV_SAVE_WRITTEN,   /* op, status, index, lost, msg: every PS has
                              written its files (or one failed) */
  COORD_EV_CKPT_COMMITTED, /* op, step, increment, base */
  COORD_EV_CKPT_FAILED,    /* op, step, msg */
  COORD_EV_WK_UP,          /* index */
  COORD_EV_WK_LOST,        /* index, msg */
  COORD_EV_WK_READY,       /* index, examples (per epoch, -1 unknown),
                              fresh */
  COORD_EV_WK_CONFIG_FAILED, /* index, err_kind, msg */
  COORD_EV_CLOSURE_DONE,   /* index, closure_id, generation, steps_done,
                              stats */
  COORD_EV_CLOSURE_FAILED, /* index, closure_id, generation, err_kind, msg */
  COORD_EV_SNAPSHOT_DONE,  /* op, status, index, lost, msg: every PS holds
                              the evaluation's snapshot (or one failed) */
  COORD_EV_EVAL_DONE,      /* op, status, msg */
  COORD_EV_SHUTDOWN_DONE   /* op */
} coord_ev_kind;

typedef struct {
  coord_ev_kind kind;
  double now;              /* seconds, monotonic */
  int index;
  uint64_t op;
  int status;              /* 0 or a negative code */
  bool lost;               /* a PS op failed because a PS went away */
  coord_err_kind err_kind;
  const char *msg;         /* borrowed for the call; NULL: none */
  int64_t step;
  int64_t examples;
  /* WK_READY, dense "allreduce": the worker holds none of the run's dense
   * state (configured after the ring's first closures: a fresh process,
   * its initial values, until a closure of it ends); it does not
   * evaluate */
  bool fresh;
  uint64_t closure_id;
  uint32_t generation;
  int64_t steps_done;
  coord_closure_stats stats;
  const int64_t *steps;    /* CHECKPOINTS */
  size_t n_steps;
  /* an increment's chain starts at the whole checkpoint of step `base`:
   * CKPT_COMMITTED's `increment` and `base`, CHECKPOINTS's `bases` (one per
   * step, the step itself for a whole one; NULL: every one whole).
   * Pruning keeps every checkpoint a kept one builds on. */
  bool increment;
  int64_t base;
  const int64_t *bases;
} coord_event;

typedef enum {
  COORD_ACT_SETUP_PS = 0,  /* op, hold: mode and variables on every PS;
                              hold: their pulls and pushes wait until the
                              RESTORE that follows (async: a closure still
                              running then reads the restored values) */
  COORD_ACT_RESTORE,       /* op, step: every PS restores that checkpoint */
  COORD_ACT_RESTORE_PS,    /* op, index, step: PS `index` alone is set up
                              again (holding every pull and push) and
                              restores its shards of that checkpoint;
                              answered by PS_RESTORED */
  COORD_ACT_REWIND,        /* step, resumed: the run goes on from step,
                              the step every PS was restored to (resumed:
                              a restarted chief, else a PS recovery);
                              comes once the job's length is known, before
                              any closure of the new generation */
  COORD_ACT_PAUSE,         /* training holds (index: 0 checkpoint or
                              evaluation, 1 recovery) */
  COORD_ACT_SAVE,          /* op, step: make the folder; every PS takes
                              a snapshot and writes it in the background */
  COORD_ACT_SAVE_WAIT,     /* op, step: every PS answers once written */
  COORD_ACT_COMMIT,        /* op, step, total: write the manifest */
  COORD_ACT_DISCARD,       /* step: remove a checkpoint folder that failed */
  COORD_ACT_PRUNE,         /* step: remove an old committed checkpoint */
  COORD_ACT_CONFIGURE,     /* index: configure worker */
  COORD_ACT_DISPATCH,      /* index, closure */
  COORD_ACT_COUNT,         /* index, closure, stats: its steps counted */
  COORD_ACT_RELEASE,       /* index: ssp/sync, the worker leaves the PS
                              clocks (idle, lost or left out) */
  COORD_ACT_MEMBER,        /* index, up, op, msg: the workers that run
                              closures changed: worker `index` joined (up:
                              configured and ready) or left (lost, or left
                              out; msg says why); op is the membership's
                              epoch, bumped by every change. What a group
                              of workers (a ring) re-forms on */
  COORD_ACT_SNAPSHOT,      /* op, step: every PS takes snapshot `op` of its
                              shards for an evaluation (training goes on) */
  COORD_ACT_EVALUATE,      /* op, index (worker), step: evaluate reading
                              snapshot `op` */
  COORD_ACT_UNSNAPSHOT,    /* op: every PS drops snapshot `op` */
  COORD_ACT_NOTE,          /* level (log.h), msg */
  COORD_ACT_SHUTDOWN,      /* op: tell every worker and PS the job is done */
  COORD_ACT_FAIL,          /* status, msg: the run fails; nothing follows */
  COORD_ACT_FINISH         /* status 0: the run is done */
} coord_act_kind;

typedef struct {
  coord_act_kind kind;
  uint64_t op;
  int index;
  int64_t step;
  int64_t total;           /* COMMIT: global steps of the job, 0 unknown */
  bool resumed;
  bool up;                 /* MEMBER */
  bool hold;               /* SETUP_PS */
  int level;
  int status;
  chief_closure closure;
  coord_closure_stats stats;
  char msg[COORD_MSG_MAX];
} coord_action;

typedef struct {
  coord_action *a;
  size_t n, cap;
} coord_actions;

void coord_actions_init(coord_actions *as);
void coord_actions_free(coord_actions *as);

/* cfg is copied. 0, TSR_EINVAL (no worker, no PS unless lockstep,
 * steps and epochs both 0, a batch or closure size below 1) or
 * TSR_ENOMEM. With no PS (dense "allreduce" without sparse tables) the
 * PS operations still come and their answers complete them at once. */
int coord_sm_new(coord_sm **out, const coord_sm_config *cfg);
void coord_sm_free(coord_sm *sm);

/* Feeds one event; appends the actions to be executed, in order, to *out
 * (which is not cleared). After FAIL or FINISH every event is ignored.
 * 0 or TSR_ENOMEM (the machine is then failed). */
int coord_sm_step(coord_sm *sm, const coord_event *ev, coord_actions *out);

/* ---- what the I/O side shows (status, progress, summary) --------------- */

typedef enum {
  COORD_WK_DOWN = 0,
  COORD_WK_CONNECTED,
  COORD_WK_CONFIGURING,
  COORD_WK_READY,
  COORD_WK_LEFT           /* left out of this run */
} coord_wk_state;

typedef struct {
  int64_t step;
  char reason[COORD_MSG_MAX];
} coord_ckpt_failure;

const char *coord_sm_phase(const coord_sm *sm);   /* "train", ... */
bool coord_sm_ended(const coord_sm *sm);          /* FINISH or FAIL given */
bool coord_sm_training(const coord_sm *sm);       /* train .. final */
int coord_sm_exit_status(const coord_sm *sm);
const char *coord_sm_fail_msg(const coord_sm *sm); /* "" unless failed */
int64_t coord_sm_global_step(const coord_sm *sm);
int64_t coord_sm_total_steps(const coord_sm *sm);  /* 0: not known yet */
int64_t coord_sm_last_ckpt(const coord_sm *sm);    /* -1: none */
int64_t coord_sm_resumed_from(const coord_sm *sm); /* -1: a fresh run */
/* Whether SAVE `op` is still the checkpoint being taken: its folder is
 * made off the loop, and a PS lost meanwhile ends it; its calls must then
 * not go out (a PS started again would take a save nobody waits for). */
bool coord_sm_save_wanted(const coord_sm *sm, uint64_t op);
int coord_sm_restarts_ps(const coord_sm *sm);
/* Recoveries of a lost PS with no checkpoint to go back to after training
 * had begun (a job without checkpoints goes on from the shards' initial
 * values; the run's exit is then 1). */
int coord_sm_initial_restarts(const coord_sm *sm);
int coord_sm_restarts_worker(const coord_sm *sm);
coord_wk_state coord_sm_wk_state(const coord_sm *sm, int w);
const char *coord_sm_wk_error(const coord_sm *sm, int w);
int coord_sm_wk_restarts(const coord_sm *sm, int w);
size_t coord_sm_ckpt_failures(const coord_sm *sm,
                              const coord_ckpt_failure **out);
/* Training time: first closure out to the last step done (0 before). */
double coord_sm_train_start(const coord_sm *sm);
double coord_sm_train_end(const coord_sm *sm);
const chief_sched *coord_sm_sched(const coord_sm *sm);
/* What the run waits for now, in words ("worker:0 closure 12 (sent 3 s
 * ago) before the checkpoint of step 1040", "ps:1 to come back"), written
 * to buf; "" (and 0) when it is not waiting on anyone. Returns the
 * length. */
size_t coord_sm_waiting(const coord_sm *sm, char *buf, size_t len);
/* The epoch of the set of workers that run closures (see MEMBER); 0
 * before the first joins. */
uint64_t coord_sm_members_epoch(const coord_sm *sm);

#endif
