/* The coordinator behind tessera-chief: one event loop that connects to
 * every parameter server and worker, creates the model's variables on the
 * PS, configures the workers, hands out closures, checkpoints, evaluates,
 * recovers from failures and reports.
 *
 * Happy path (phases):
 *   CONNECT    wait until every PS and worker answers (naming who is missing
 *              every few seconds, up to --wait-timeout)
 *   SETUP      every PS: consistency mode, then the variables' shards (the
 *              partitioner's plan); if the checkpoint folder has a committed
 *              checkpoint (a restarted chief), every PS restores it and the
 *              run resumes from its step; else a checkpoint of step 0 is
 *              taken so a PS failure always has something to go back to
 *   TRAIN      closures of steps_per_closure steps, at most two in flight
 *              per worker; a checkpoint every checkpoint.every_steps (or
 *              every_secs) and an evaluation every eval_every_steps, each
 *              taken with no closure in flight
 *   FINAL      last checkpoint and evaluation, then the workers and the PS
 *              are told to exit (unless --keep-cluster), and a summary
 *
 * Failure modes:
 *   a worker dies or is cut off: its closures go back to the pool (the RPC
 *     layer's heartbeats notice silence); when it comes back it is
 *     configured again and given work; the final step count stays exact.
 *   a worker fails a closure (e.g. its data file is missing): reported
 *     with the worker's message; a worker that fails to configure is left
 *     out, and the run fails when no worker is left.
 *   a PS dies: training pauses, the chief waits for it to come back
 *     (--ps-timeout), recreates the variables, has every PS restore the last
 *     checkpoint, rewinds the step count to it and resumes, saying so.
 *   the chief dies: on restart it resumes from the last checkpoint.
 */
#ifndef TSR_CHIEF_COORD_H
#define TSR_CHIEF_COORD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "chief/ckpt/ckpt.h"
#include "chief/monitor/monitor.h"
#include "chief/coord/scheduler.h"
#include "common/cluster.h"
#include "common/job.h"
#include "common/partition.h"
#include "common/rpc/rpc.h"
#include "ps/client.h"

/* What tessera-chief's flags say. */
typedef struct {
  const char *job_path;
  const char *const *overrides;  /* "key=value", NULL-terminated */
  const char *cluster_file;      /* NULL: TF_CONFIG */
  const char *task;              /* NULL: from TF_CONFIG */
  const char *token_file;        /* NULL: TESSERA_TOKEN */
  const char *summary_json;      /* --summary-json */
  double wait_timeout_s;         /* CONNECT; default 300 */
  double ps_timeout_s;           /* a dead PS; default 600 */
  double closure_timeout_s;      /* one closure; default 600 */
  bool keep_cluster;             /* do not shut PS and workers down */
  double heartbeat_timeout_s;    /* a silent peer is lost after this; 10 */
  const char *trace_path;        /* --trace: Chrome trace-event JSON */
} chief_coord_opts;

void chief_coord_opts_init(chief_coord_opts *o);

/* Runs the whole training; returns the process exit status (0 done, 1
 * failed, 2 configuration error), having printed the reason. */
int chief_coord_run(const chief_coord_opts *o);

/* ---- internals shared by coord*.c ------------------------------------- */

typedef enum {
  COORD_CONNECT = 0,
  COORD_SETUP,
  COORD_TRAIN,
  COORD_PAUSE,     /* draining closures for a checkpoint or an evaluation */
  COORD_SAVE,      /* PS writing their shards */
  COORD_EVAL,
  COORD_RECOVER,   /* a PS was lost */
  COORD_FINAL,
  COORD_SHUTDOWN,
  COORD_DONE
} coord_phase;

typedef enum {
  CW_DOWN = 0,     /* not connected */
  CW_CONNECTED,    /* connected, not configured */
  CW_CONFIGURING,
  CW_READY,
  CW_FAILED        /* could not be configured for this run */
} coord_wstate;

typedef struct coord coord;

typedef struct {
  coord *co;
  int index;
  const tsr_task_addr *addr;
  ps_client *cli;
  bool connected;
  bool ever_connected;
  bool lost;             /* disconnected during the run: needs recovery */
  bool busy;             /* a setup/save/restore call in flight */
  int64_t vars_created;
  uint64_t bytes_in, bytes_out;
  double apply_ms;
} coord_ps;

typedef struct {
  coord *co;
  int index;
  const tsr_task_addr *addr;
  tsr_rpc_client *cli;
  coord_wstate st;
  bool ever_ready;
  int restarts;          /* came back after being lost */
  int inflight;          /* our calls outstanding to it */
  int failures;          /* closures failed in a row by the worker itself */
  bool left;             /* ssp/sync: told the PS it no longer counts */
  uint64_t last_closure; /* the last closure handed to it (LEAVE says
                            every closure up to it is over) */
  int64_t examples_share;/* per epoch, from configure (-1 unknown) */
  int64_t steps, examples;
  double busy_s, input_s, pull_s, compute_s, push_s;
  char device[32];
  char last_error[256];
} coord_wk;

struct coord {
  const chief_coord_opts *o;
  uv_loop_t loop;
  uv_timer_t tick;
  uv_signal_t sigint, sigterm;
  tsr_rpc_ctx *rpc;
  tsr_rpc_server *status;  /* CHIEF_M_STATUS on the chief's address */
  tsr_cluster cluster;
  tsr_job job;
  char *job_json;        /* resolved job sent to workers */
  char job_dir[4096];
  char model_digest[24];
  /* the model's variables and their placement */
  struct coord_var {
    char name[128];
    int rank;
    int64_t shape[2];
    int64_t row_dim;
    bool sparse;
    kern_init_spec init;
  } *vars;
  size_t n_vars;
  tsr_shard *shards;
  size_t n_shards;
  coord_ps *ps;
  int n_ps;
  coord_wk *wk;
  int n_wk;
  chief_sched *sched;
  coord_phase phase;
  coord_phase resume_phase;  /* where PAUSE/SAVE/EVAL return to */
  int stage;                 /* sub-step of SETUP and RECOVER */
  bool ckpt_due, eval_due;   /* what a PAUSE is draining for */
  int64_t save_step;         /* the checkpoint being written */
  bool final_ckpt_done, final_eval_done;
  uint64_t run_id;
  int exit_status;
  bool stop_requested;
  char fail_msg[512];
  /* time */
  double t_start, t_phase, t_last_wait_note, t_last_ckpt, t_train_start;
  double t_train_end;    /* when the last step was done (0 before) */
  /* pending calls of the current phase */
  int pending;
  int pending_errors;
  char pending_msg[512];
  /* step bookkeeping */
  int64_t total_steps;   /* in global steps */
  int64_t resumed_from;  /* -1: fresh */
  int64_t last_ckpt_step;
  int64_t next_ckpt_step, next_eval_step;
  bool have_ckpt;
  bool want_final_eval;
  bool final_done;
  int64_t examples;
  double loss_sum;
  int64_t loss_n;
  double last_loss;
  /* the last closures' losses, for the progress bar and the summary's
   * final loss (a mean over the whole run would be dominated by its start) */
  double recent_loss[16];
  int64_t recent_steps[16];
  int n_recent, recent_at;
  uint64_t max_staleness;    /* largest version lag workers saw since the
                                last scalars */
  int restarts_ps, restarts_worker;
  /* eval */
  bool has_eval;
  int eval_worker;
  chief_metric_value eval_vals[16];
  char eval_names[16][64];
  size_t n_eval;
  /* monitoring */
  chief_metrics *metrics;
  chief_progress *progress;
  struct tsr_trace *trace;   /* --trace: every process's events, merged */
  int64_t trace_save_us, trace_eval_us, trace_recover_us;
  double t_last_scalar;
};

/* coord.c (the state machine), coord_run.c (setup and teardown) */
void coord__fail(coord *co, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void coord__set_phase(coord *co, coord_phase p);
void coord__pump(coord *co);
int64_t coord__global_step(const coord *co);
void coord__note(coord *co, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
double coord__recent_loss(const coord *co);  /* NaN before any closure */
void coord__scalars(coord *co, double now);  /* TensorBoard scalars */
void coord__on_tick(uv_timer_t *t);
void coord__on_signal(uv_signal_t *s, int signum);

/* coord_ps.c */
int coord__ps_open(coord *co);
void coord__ps_setup(coord *co);          /* config + create on every PS */
void coord__ps_restore(coord *co, int64_t step);
void coord__ps_save(coord *co, int64_t step);
void coord__ps_stats(coord *co);
void coord__ps_shutdown(coord *co);
void coord__ps_close(coord *co);
bool coord__ps_all_connected(const coord *co);

/* coord_status.c */
int coord__status_open(coord *co);
void coord__status_close(coord *co);

/* coord_wk.c */
int coord__wk_open(coord *co);
void coord__wk_configure_ready(coord *co);   /* configure every connected one */
void coord__wk_dispatch(coord *co);          /* hand out closures */
void coord__wk_release_idle(coord *co);      /* ssp/sync: idle workers leave */
void coord__wk_leave_all(coord *co);         /* ssp/sync: after a restore */
void coord__wk_eval(coord *co, int64_t step);
void coord__wk_shutdown(coord *co);
void coord__wk_close(coord *co);
int coord__wk_count(const coord *co, coord_wstate st);
int coord__wk_inflight(const coord *co);

#endif
