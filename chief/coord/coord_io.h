/* The coordinator's I/O side, shared by coord_run.c (setup and teardown),
 * coord_io.c (the event queue, the actions, the timer and signals,
 * monitoring), coord_ps.c (the parameter servers), coord_ps_alone.c (one
 * PS restored alone), coord_wk.c (the workers) and coord_status.c (the
 * status service). Private to them.
 *
 * Every decision is the machine's (coord_sm.h). This side owns the loop,
 * the RPC clients, the files and the monitoring: it turns connection
 * changes, answers, the 100 ms tick and signals into events (posted to a
 * queue and fed to the machine one at a time, never from inside a step),
 * and executes the actions that come back. A call that cannot even be
 * started is answered with an event too, so the machine always hears.
 */
#ifndef TSR_CHIEF_COORD_IO_H
#define TSR_CHIEF_COORD_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "chief/ckpt/ckpt.h"
#include "chief/coord/coord.h"
#include "chief/coord/coord_sm.h"
#include "artifacts/monitor/monitor.h"
#include "common/cluster.h"
#include "common/job.h"
#include "common/partition.h"
#include "common/var.h"
#include "common/rpc/rpc.h"
#include "ps/client/client.h"

typedef struct coord coord;
typedef struct coord_fs_job coord_fs_job;

/* A change of the workers that run closures (the machine's MEMBER): a
 * worker joined (configured and ready) or left (lost: its connection
 * closed, or was silent past --heartbeat-timeout, or a closure found it
 * gone; or left out of the run). Whatever forms a group of the workers
 * (the status service now; a ring among them) subscribes and re-forms on
 * it. Called on the loop thread, in the order of the changes; a callback
 * must not block. */
typedef struct {
  int worker;
  bool up;
  uint64_t epoch;        /* bumped by every change */
  const char *why;       /* "ready", or why it left; valid for the call */
  double at;             /* tsr_now_s() */
} coord_member_ev;
typedef void (*coord_member_cb)(coord *co, const coord_member_ev *ev,
                                void *data);
#define COORD_MAX_MEMBER_SUBS 4

typedef struct {
  coord *co;
  int index;
  const tsr_task_addr *addr;
  ps_client *cli;
  bool connected;
  bool busy;             /* a statistics call in flight */
  int64_t vars_created;
  uint64_t bytes_in, bytes_out;
  double apply_ms;
  /* RESTORE_PS: this PS alone set up again and restored */
  uint64_t fix_op;       /* 0: none going on */
  int64_t fix_step;
  int fix_pending;       /* config and create answers still to come */
  int64_t fix_t0_us;     /* --trace: when it began */
  int fix_status;
  bool fix_lost;
  char fix_msg[COORD_MSG_MAX];
} coord_ps;

typedef struct {
  coord *co;
  int index;
  const tsr_task_addr *addr;
  tsr_rpc_client *cli;
  int inflight;          /* our calls outstanding to it */
  uint64_t last_closure; /* the last closure handed to it (a LEAVE says
                            every closure up to it is over) */
  int64_t steps, examples;
  double busy_s, input_s, pull_s, compute_s, push_s;
  double allreduce_s;        /* dense "allreduce": blocked on the ring */
  uint64_t allreduce_bytes;
  int64_t allreduce_steps;   /* steps those figures are of */
  int64_t skipped_seen;  /* its last skipped_records (a restart resets it) */
  char device[32];
  /* as the status service heard it from the membership changes */
  double left_at;        /* 0 while it runs closures (or never did) */
  char left_why[128];
  /* dense "allreduce" (coord_ring.c) */
  bool in_ring;          /* a member of the current ring */
  bool has_state;        /* holds the ring's trained dense state */
} coord_wk;

/* One PS operation over every PS (setup, restore, save, shutdown): its
 * answers are gathered and the machine hears once. */
typedef struct {
  uint64_t op;
  coord_ev_kind done;    /* the event that ends it */
  int pending;
  int status;            /* first failure */
  int failed_ps;
  bool lost;
  char msg[COORD_MSG_MAX];
} coord_psop;

/* A queued event with its own copies of what it points at. */
typedef struct {
  coord_event ev;
  char msg[COORD_MSG_MAX];
  bool has_msg;
  int64_t *steps;          /* and, with has_bases, the bases after them */
  bool has_bases;
} coord_qev;

struct coord {
  const chief_coord_opts *o;
  uv_loop_t loop;
  uv_timer_t tick;
  uv_signal_t sigint, sigterm;
  tsr_rpc_ctx *rpc;
  tsr_rpc_server *status;  /* CHIEF_M_STATUS on the chief's address */
  tsr_cluster cluster;     /* o->cluster, borrowed: not freed here */
  tsr_job job;
  char *job_json;          /* resolved job sent to workers */
  char job_dir[4096];
  char model_digest[24];
  /* the model's variables and their placement; per variable its update
   * rule (the job's, or a moving statistic's) and, with initial_weights,
   * the raw file the PS initialize it from */
  tsr_var *vars;
  tsr_optim_spec *var_optim;
  char (*var_init_path)[256];
  size_t n_vars;
  tsr_shard *shards;
  size_t n_shards;
  coord_ps *ps;
  int n_ps;
  coord_wk *wk;
  int n_wk;
  char (*names)[COORD_NAME_MAX];  /* "ps:0 (addr)"..., then the workers */

  coord_sm *sm;
  coord_actions acts;
  coord_qev *q;            /* the event queue (a ring) */
  size_t q_head, q_len, q_cap;
  bool draining;
  bool stopped;            /* FAIL or FINISH executed */
  int exit_status;
  int64_t done_step;       /* > 0: the newest checkpoint on disk, intact,
                              is the job's last (a chief restarted after
                              the job ended): a cluster that is gone ends
                              the run well */
  bool finished_on_disk;   /* so it did: the run ends at done_step */
  double disk_loss;        /* then: the loss its final checkpoint holds
                              (NaN when none) */
  bool stop_requested;
  coord_psop psop;         /* the PS operation in progress */
  coord_psop ckop;         /* the checkpoint's (it runs beside the others:
                              training goes on while it is written) */
  coord_psop evop;         /* an evaluation's snapshot */
  coord_fs_job *fs_head, *fs_tail; /* coord_fs.c: folders to make or remove,
                                      one at a time off the loop */
  bool fs_running;
  chief_ckpt_files ckpt_files; /* the checkpoint being saved: its id and
                                  the files every PS reported */
  /* the checkpoint whose state the PS hold (the last committed, or the one
   * restored): an increment builds on it */
  struct {
    bool valid;
    int64_t step, base;      /* base: the whole one its chain starts at */
    int links;               /* its chain's length (1: whole) */
    char id[CHIEF_CKPT_ID_MAX + 1];
  } ck_on;
  bool ckpt_inc;           /* the one being saved is asked as an increment */
  bool ckpt_any_inc;       /* some PS saved it as one */
  int shutdown_pending;    /* SHUTDOWN: calls not answered yet */
  uint64_t shutdown_op;
  uint64_t run_id;
  uint64_t group_epoch;      /* dense "allreduce": the workers' ring */
  /* dense "allreduce": a checkpoint's dense state restored and not yet
   * trained past (coord_dense.c) */
  float *dense_state;
  size_t dense_floats;
  int64_t dense_step;
  bool dense_live;           /* workers configured now take it */
  bool dense_trained;        /* a closure went out: the workers' state is
                                past the initial one */
  bool ring_dirty;           /* a ring member lost or failed: re-form */
  bool ring_started;         /* a closure went out in some ring */
  int dense_sending;         /* DENSE_SET calls using dense_state */

  double t_start;
  int64_t worker_steps_run;  /* steps of every counted closure */
  int64_t examples_run;      /* their examples: this process's own */
  int64_t examples;
  /* the examples when the checkpoint of step `save_step` was asked for:
   * its manifest's (training goes on while the files are written, so the
   * count at the commit is past the checkpoint's step); save_step -1:
   * none asked yet */
  int64_t save_step;
  int64_t save_examples;
  double loss_sum;
  int64_t loss_n;
  /* the last closures' losses, for the progress bar and the summary's
   * final loss (a mean over the whole run would be dominated by its start) */
  double recent_loss[16];
  int64_t recent_steps[16];
  int n_recent, recent_at;
  uint64_t max_staleness;  /* largest version lag since the last scalars */
  /* the last evaluation */
  chief_metric_value eval_vals[16];
  char eval_names[16][64];
  size_t n_eval;
  int64_t eval_step;       /* the step it evaluated */
  /* monitoring */
  chief_metrics *metrics;
  chief_progress *progress;
  struct tsr_trace *trace; /* --trace: every process's events, merged */
  int64_t trace_save_us, trace_eval_us, trace_recover_us, trace_restore_us;
  int64_t trace_commit_us;
  double t_last_scalar;
  double t_last_ps;          /* PS statistics every 2 s */
  chief_summary_policy sum_pol;
  chief_train_acc train_acc;
  int64_t skipped_records;   /* corrupt input records, all workers */
  json_t *input_affine;      /* {"scale": [...], "shift": [...]} from the
                                first worker configured, for the manifest */
  struct {
    coord_member_cb cb;
    void *data;
  } member_subs[COORD_MAX_MEMBER_SUBS];
  int n_member_subs;
};

/* coord_io.c */
/* Calls cb on every change of the workers that run closures, from now on;
 * 0, or TSR_EBUSY past COORD_MAX_MEMBER_SUBS subscribers. */
int coord__member_subscribe(coord *co, coord_member_cb cb, void *data);
void coord__post(coord *co, const coord_event *ev);
void coord__post_simple(coord *co, coord_ev_kind kind, int index,
                        const char *msg);
void coord__note(coord *co, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double coord__recent_loss(const coord *co);  /* NaN before any closure */
void coord__scalars(coord *co, double now);  /* TensorBoard scalars */
void coord__on_tick(uv_timer_t *t);
void coord__on_signal(uv_signal_t *s, int signum);
int64_t coord__step(const coord *co);        /* the global step */
/* The manifest of the checkpoint of `step` (the caller decrefs it), or
 * NULL when it cannot be read. */
json_t *coord__ckpt_manifest(coord *co, int64_t step);
/* The run's outcome so far into a manifest being written: "loss" (the
 * recent training loss, when finite) and "eval" (the last evaluation's
 * values by name) with "eval_step" (the step it evaluated). */
void coord__outcome_put(const coord *co, json_t *m);
/* A chief that finds its job finished on disk: the examples, loss and
 * evaluation (when of that step) of the checkpoint of done_step, for its
 * summary (left as they are when the manifest cannot be read or lacks
 * them). */
void coord__outcome_take(coord *co);

/* coord_ps.c */
int coord__ps_open(coord *co);
/* hold: every PS holds its pulls and pushes until its restore. */
void coord__ps_setup(coord *co, uint64_t op, bool hold);
void coord__ps_restore(coord *co, uint64_t op, int64_t step);
/* SAVE: every PS snapshots (SAVE_DONE); SAVE_WAIT: every PS has written
 * its files (SAVE_WRITTEN); COMMIT: the files checked and the manifest
 * written off the loop (the checks read every byte), then
 * CKPT_COMMITTED or CKPT_FAILED. */
void coord__ps_save(coord *co, uint64_t op, int64_t step);
void coord__ps_save_wait(coord *co, uint64_t op, int64_t step);
void coord__ps_commit(coord *co, uint64_t op, int64_t step, int64_t total);
/* A restore of the checkpoint of `step`: its folder's name, its id, and
 * for an increment the checkpoints it builds on (the whole one first),
 * read from the manifests; what one PS's restore call needs (every PS's,
 * or a single one restarted). */
typedef struct {
  int64_t step;
  char name[64];                      /* the folder, under the root */
  char id[CHIEF_CKPT_ID_MAX + 1];     /* "": no manifest, the files agree */
  bool known;                         /* its manifest was read */
  int64_t base;                       /* the whole checkpoint of its chain */
  int n_links;                        /* the chain's length, itself included */
  size_t n_chain;                     /* the links before it */
  char chain_dir[CHIEF_CKPT_CHAIN_MAX][64];
  char chain_id[CHIEF_CKPT_CHAIN_MAX][CHIEF_CKPT_ID_MAX + 1];
  ps_chain_link links[CHIEF_CKPT_CHAIN_MAX];
} coord_restore_plan;

/* The plan, or the error naming the link of the chain that is missing. */
int coord__restore_plan(coord *co, int64_t step, coord_restore_plan *pl,
                        char *err, size_t errlen);
/* That restore sent to PS p (the plan must outlive the call's start). */
int coord__restore_call(coord_ps *p, const coord_restore_plan *pl,
                        ps_client_cb cb, void *data);
/* SNAPSHOT: every PS takes snapshot `op` for an evaluation
 * (SNAPSHOT_DONE); UNSNAPSHOT: every PS drops it (no answer awaited). */
void coord__ps_snapshot(coord *co, uint64_t op);
void coord__ps_unsnapshot(coord *co, uint64_t op);
void coord__ps_release(coord *co, int worker);
void coord__ps_stats(coord *co);
void coord__ps_shutdown(coord *co);
void coord__ps_close(coord *co);
/* One more call in the PS operation `op` (the checkpoint's, an
 * evaluation's or the other one); its answer. */
void coord__psop_add(coord *co, uint64_t op);
void coord__psop_answer(coord *co, uint64_t op, const char *what, int status,
                        const char *message);
/* A call to one PS for operation `op`: `what` names it in messages; a
 * create's specs are kept until its answer (both freed with it). */
typedef struct {
  coord_ps *ps;
  uint64_t op;
  ps_var_spec *specs;
  const char *what;
} coord_ps_call;
/* NULL when out of memory. */
coord_ps_call *coord__ps_call_new(coord_ps *p, uint64_t op, const char *what);
/* Whether a call's status says the PS went away (not its own answer). */
bool coord__conn_error(int status);
/* The specs of the shards placed on PS i (n may be 0; *out the caller's). */
int coord__ps_specs(coord *co, int i, ps_var_spec **out, size_t *n_out);
/* PS i's configuration (mode points into buf). */
ps_config coord__ps_cfg(coord *co, int i, char *buf, size_t len);

/* coord_ps_alone.c */
/* PS i alone: config holding its calls, its variables, its shards of the
 * checkpoint of `step` (with the checkpoints it builds on, as
 * coord__restore_plan reads them); PS_RESTORED when done. */
void coord__ps_restore_alone(coord *co, uint64_t op, int i, int64_t step);

/* coord_dense.c: dense "allreduce", the dense variables in checkpoints */
/* Part of a SAVE: a ready worker's dense state into the folder. */
void coord__dense_save(coord *co, uint64_t op, int64_t step);
/* Part of a RESTORE: the checkpoint's dense state read, and sent to every
 * ready worker (later ones get it with their configure, until training
 * goes on). */
void coord__dense_restore(coord *co, uint64_t op, int64_t step);
/* A worker answered its configure: with a restored dense state pending,
 * it takes that first, then `ready` is posted (or a failure). */
void coord__dense_ready(coord *co, int w, const coord_event *ready);
/* Training went on: the restored state is behind it (freed once no call
 * uses it). */
void coord__dense_forget(coord *co);
/* Every worker that held the dense state was lost: the newest committed
 * checkpoint's goes to the ready ones (ahead of their next closure, on
 * the same connection), or they keep the initial values when there is
 * none; said in the log either way. */
void coord__dense_from_ckpt(coord *co);

/* coord_ring.c: dense "allreduce", the ring each closure runs in */
/* The ring for a closure to worker w, into req (a new epoch when the
 * ready workers changed or a member failed since the last one). */
struct Tessera__Worker__RunRequest;
int coord__ring_for(coord *co, int w, struct Tessera__Worker__RunRequest *req,
                    char ***strs);
void coord__ring_free(char **strs);
/* A worker lost, configured again, a closure failed or done. */
void coord__ring_lost(coord *co, int w);
void coord__ring_configured(coord *co, int w);
void coord__ring_failed(coord *co, int w, uint64_t epoch);
void coord__ring_done(coord *co, int w);
/* A global recovery starts (a lost PS; PAUSE): the ring's steps in flight
 * are void. Every connected worker is told to break its ring now
 * (WK_M_RING_BREAK), so a closure waiting in an all-reduce on a member
 * with none left fails at once and the recovery's wait for the closures
 * in flight (sync, ssp) ends; the next closures re-form the ring. A
 * worker that does not get it is no worse off than before: its closure
 * ends at the ring's stall bound, or when the restored state arrives. */
void coord__ring_break(coord *co, const char *why);

/* coord_fs.c: a checkpoint's folder made (emptied first when it is there)
 * or removed off the loop, one after the other in the order asked; `done`
 * runs on the loop with 0 or the error. */
void coord__fs_prepare(coord *co, int64_t step,
                       void (*done)(coord *co, int rc, const char *err,
                                    void *data),
                       void *data);
void coord__fs_remove(coord *co, int64_t step, const char *why);

/* coord_status.c */
int coord__status_open(coord *co);
void coord__status_close(coord *co);

/* coord_wk.c */
int coord__wk_open(coord *co);
void coord__wk_configure(coord *co, int w);
void coord__wk_dispatch(coord *co, const chief_closure *c);
void coord__wk_count(coord *co, const coord_action *a);
void coord__wk_eval(coord *co, uint64_t op, int w, int64_t step);
void coord__wk_shutdown(coord *co);
void coord__wk_close(coord *co);
/* Packs msg (its meta copied by the RPC layer) and calls worker w with an
 * optional payload that must stay valid until cb. */
int coord__wk_send(coord *co, int w, uint32_t method,
                   const ProtobufCMessage *msg, const uv_buf_t *payload,
                   uint32_t deadline_ms, tsr_rpc_call_cb cb, void *data);
/* The machine's reading of a failed call to a worker. */
coord_err_kind coord__wk_err_kind(const coord_wk *w, const tsr_rpc_result *r);

#endif
