/* Internals of the distributed worker, shared by service.c (the RPC
 * service on the loop thread), loop.c (the training thread: configure,
 * closures, evaluation) and pscomm.c (pulls and pushes through ps_client).
 *
 * Threads. The loop thread owns the RPC server, the PS clients and every
 * libuv handle. The training thread owns the run (input, model, exec,
 * parameter and gradient buffers) and never touches a handle: it hands
 * finished jobs and PS operations to the loop through one uv_async_t and
 * waits for PS completions on a condition variable. Everything both sides
 * read is under `mu`.
 */
#ifndef TSR_WK_LOOP_INT_H
#define TSR_WK_LOOP_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/cluster.h"
#include "common/job.h"
#include "common/rpc/rpc.h"
#include "kernels/kern.h"
#include "ps/client.h"
#include "worker/input.h"
#include "worker/model.h"
#include "worker/wire.h"

#include "worker.pb-c.h"

#define WK_ERR_MAX 512

typedef struct wk_svc wk_svc;
typedef struct wk_run wk_run;

/* Host allocations of a compute context (pinned on a GPU), for the input
 * pipeline's batch buffers; ctx is the kern_ctx. */
void *wk__pin_alloc(void *ctx, size_t bytes);
void wk__pin_free(void *ctx, void *p);

/* ---- jobs: requests handed from the loop to the training thread -------- */

typedef enum { WK_JOB_CONFIGURE = 0, WK_JOB_RUN, WK_JOB_EVAL } wk_job_kind;

typedef struct wk_job {
  struct wk_job *next;
  wk_job_kind kind;
  tsr_rpc_incoming *call;  /* answered on the loop once the job is done */
  int rc;                  /* outcome, with err when negative */
  char err[WK_ERR_MAX];
  union {
    Tessera__Worker__ConfigureResponse cfg;
    Tessera__Worker__RunResponse run;
    Tessera__Worker__EvalResponse eval;
  } out;
  char *strs[2];           /* strings the answer points at (freed after) */
  uint8_t *trace;          /* run with trace: the steps' phases, packed
                              (common/trace.h), sent as the payload */
  size_t trace_len;
  char **names;            /* eval metric names (copies) */
  int n_names;
  double *values;
} wk_job;

/* ---- PS operations: issued on the loop on behalf of the thread --------- */

typedef enum {
  WK_OP_PULL = 0,
  WK_OP_PULL_ROWS,
  WK_OP_PUSH,
  WK_OP_PUSH_ROWS,
  WK_OP_PUSH_PULL,
  WK_OP_PUSH_PULL_ROWS,
  WK_OP_CLOCK
} wk_op_kind;

typedef struct wk_group wk_group;

typedef struct wk_op {
  struct wk_op *next;
  wk_op_kind kind;
  int ps;                  /* index into the PS clients */
  const char *name;
  int shard;
  int64_t step;            /* push step / pull clock / clock value */
  int64_t pull_clock;
  ps_clock_op clock_op;
  const int64_t *ids;      /* push ids (rows) */
  size_t n_ids;
  const float *grad;       /* gradient to push */
  size_t grad_floats;
  const int64_t *pull_ids; /* rows to pull */
  size_t n_pull;
  float *dst;              /* pull destination */
  size_t dst_floats;
  size_t width;            /* row width (rows ops) */
  uint64_t run, closure;   /* join */
  uint64_t era;            /* the era the call carries (0: unchecked) */
  wk_group *group;
  int64_t min_clock;       /* clock answer */
  int64_t clock;           /* join answer: the clock to go on from */
  uint64_t era_out;        /* join answer: the PS's era */
} wk_op;

/* A set of operations the thread waits for together. */
struct wk_group {
  bool check_losses;       /* fail ops at issue once a PS connection was */
  uint64_t losses;         /* lost after this count (closures) */
  int pending;
  int rc;                  /* first failure */
  char err[WK_ERR_MAX];
  int64_t max_step;        /* largest shard step seen in answers */
  int64_t min_step;
  uint64_t staleness;      /* largest step lag seen within the group */
};

/* ---- the service ------------------------------------------------------- */

struct wk_svc {
  uv_loop_t *loop;
  tsr_rpc_ctx *rpc;
  tsr_rpc_server *srv;
  uv_signal_t sig_term, sig_int;
  uv_async_t wake;           /* thread -> loop: done jobs, PS ops */
  uv_timer_t exit_timer;     /* shutdown after the answer is written */
  bool closing;
  bool wake_closed;
  int exit_code;
  int handles_open;

  tsr_cluster cluster;
  int task_index;
  char role[32];             /* "worker:1" */
  kern_opts kopts;
  uint32_t ps_deadline_ms;
  int ps_worker;              /* worker id on the PS (configure's index) */
  bool ps_hold;               /* ssp/sync: a PS may hold calls (under mu) */
  int ps_inflight;            /* PS calls issued and not completed (mu) */
  char ps_lost[WK_ERR_MAX];   /* why the clients were reset (mu) */
  bool ps_reset;              /* loop: reset the clients on the next wake */
  uint64_t ps_losses;         /* PS connections lost so far (mu) */
  char ps_loss_msg[WK_ERR_MAX]; /* the last one (mu) */

  /* PS clients, loop-owned; replaced by a configure for another layout */
  ps_client **ps;
  char **ps_addrs;
  int n_ps;
  int ps_closing;            /* clients still closing */

  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* thread: new job; waiters: group done */
  wk_job *jobs, *jobs_tail;   /* loop -> thread */
  wk_job *done, *done_tail;   /* thread -> loop */
  wk_op *ops, *ops_tail;      /* thread -> loop */
  char **want_addrs;          /* thread asks the loop to reconnect to these */
  int want_n;
  bool want_connect;
  int connect_rc;             /* the loop's answer */
  char connect_err[WK_ERR_MAX];
  bool stop;                  /* the thread leaves after its current job */
  bool thread_exited;         /* set by the thread as it leaves */
  bool closing_ps;            /* no new PS connections (shutting down) */

  /* status, under mu */
  char state[16];
  uint64_t run_id;
  int64_t steps;
  double ex_per_sec;
  char device[32];
  char last_error[WK_ERR_MAX];
  int queued;                 /* jobs waiting or running */

  /* the last successful configure's answer, for a chief that repeats it */
  uint64_t cfg_run_id;
  char *cfg_device, *cfg_summary;
  int64_t cfg_examples;

  wk_run *run;                /* thread-owned */
};

/* service.c */
/* Queues work for the loop and wakes it (any thread). */
void wk__svc_wake(wk_svc *s);

/* loop.c: the training thread's body and the run it owns. */
void *wk__thread_main(void *arg);
void wk__run_free(wk_run *r);
void wk__job_free(wk_job *j);

/* pscomm.c */
/* Issues the queued operations (loop thread). */
void wk__ps_issue(wk_svc *s);
/* Replaces the PS clients with ones for `addrs` (loop thread). */
int wk__ps_connect(wk_svc *s, char *const *addrs, int n, char *err,
                   size_t errlen);
/* Closes every PS client (loop thread); s->ps_closing counts down. */
void wk__ps_close_all(wk_svc *s);
/* Runs `ops` (thread): queues them, wakes the loop and waits until every
 * one has completed; 0 or the first failure with `err` naming the PS. */
int wk__ps_run(wk_svc *s, wk_op *ops, int n, wk_group *g);
/* Asks the loop to connect to `addrs` and waits for it (thread). */
int wk__ps_reconnect(wk_svc *s, char *const *addrs, int n, char *err,
                     size_t errlen);

#endif
