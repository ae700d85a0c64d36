/* Internals of the distributed worker, shared by service.c (the RPC
 * service on the loop thread), loop.c (the training thread: configure,
 * closures, evaluation) and pscomm.c (the PS client's life cycle).
 *
 * Threads. The loop thread owns the RPC server, the PS clients and every
 * libuv handle. The training thread owns the run (input, model, exec,
 * parameter and gradient buffers) and never touches a handle: it hands
 * finished jobs to the loop through one uv_async_t, and submits PS calls
 * and waits for their tickets through the PS client (which has its own).
 * Everything both sides read is under `mu`.
 */
#ifndef TSR_WK_LOOP_INT_H
#define TSR_WK_LOOP_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/cluster.h"
#include "common/histo.h"
#include "common/list.h"
#include "common/job.h"
#include "common/coll/coll.h"
#include "common/rpc/rpc.h"
#include "kernels/kern.h"
#include "ps/client/client.h"
#include "worker/input.h"
#include "worker/model_exec.h"
#include "worker/train.h"
#include "worker/wire.h"

#include "worker.pb-c.h"

#define WK_ERR_MAX 512

typedef struct wk_svc wk_svc;
typedef struct wk_run wk_run;

/* Host allocations of a compute context (pinned on a GPU), for the input
 * pipeline's batch buffers; ctx is the kern_ctx. */
void *wk__pin_alloc(void *ctx, size_t bytes);

/* The code a failure of the job's data travels with: TSR_EDATA (the chief
 * stops the run on it), except running out of memory or being stopped. */
int wk__data_code(int rc);
void wk__pin_free(void *ctx, void *p);

/* One pass of the standalone trainer's over a split of the job's data
 * (worker/evaluate.c): every batch forward into fresh metrics and on_out
 * (may be NULL); fills r's eval figures. Data errors are TSR_EDATA. */
int wk__eval_split(const tsr_job *job, wk_trainer *t, const tsr_model *m,
                   wk_split split, wk_output_fn on_out, void *out_data,
                   wk_train_result *r, char *err, size_t errlen);

/* Input options of one pass over a split in file order as worker 0 of 1,
 * in the job's batches (evaluation, and checking the eval data). */
wk_input_opts wk__input_once(const tsr_job *job);

/* The figures of r that name rather than measure (worker/evaluate.c): the
 * replicas and backend of t, the model's metric names. */
void wk__result_names(wk_train_result *r, const wk_trainer *t,
                      const tsr_model *m);

/* Appends ", NAME VALUE" for each of r's metrics to the summary line
 * line[0..cap) whose first k characters are written; returns the new k
 * (appending stops once the line is full). */
int wk__line_metrics(char *line, size_t cap, int k, const wk_train_result *r);

/* Ends the summary line line[0..cap) (k characters written) with r's speed,
 * time and backend, then `more` (may be ""), and prints it on stdout. */
void wk__line_print(char *line, size_t cap, int k, const wk_train_result *r,
                    const char *more);

/* ---- jobs: requests handed from the loop to the training thread -------- */

typedef enum {
  WK_JOB_CONFIGURE = 0,
  WK_JOB_RUN,
  WK_JOB_EVAL,
  WK_JOB_DENSE,
  WK_JOB_DENSE_SET
} wk_job_kind;

typedef struct wk_job {
  tsr_list node;           /* in the service's jobs or done */
  wk_job_kind kind;
  tsr_rpc_incoming *call;  /* answered on the loop once the job is done */
  int rc;                  /* outcome, with err when negative */
  char err[WK_ERR_MAX];
  union {
    Tessera__Worker__ConfigureResponse cfg;
    Tessera__Worker__RunResponse run;
    Tessera__Worker__EvalResponse eval;
    Tessera__Worker__DenseResponse dense;
    Tessera__Worker__DenseSetResponse dense_set;
  } out;
  Tessera__Worker__DenseVar *dvars, **dvp;  /* dense: the answer's list */
  char **dslot_names;
  char *strs[2];           /* strings the answer points at (freed after) */
  float *affine;           /* configure: input scale then shift */
  int64_t *cols;           /* configure: the model inputs' first columns
                            * (their names in `names`) */
  uint8_t *trace;          /* the answer's payload: a run with trace, the
                              steps' phases, packed (common/trace.h);
                              dense, the values */
  size_t trace_len;
  char **names;            /* eval / run metric names (copies) */
  int n_names;
  double *values;
  /* eval: histograms of the dense variables and their last gradients */
  struct tsr_histo *histo;
  Tessera__Worker__Histogram *hmsg, **hptr;
  char (*htag)[160];
  int n_hist;
} wk_job;

/* ---- the service ------------------------------------------------------- */

struct wk_svc {
  uv_loop_t *loop;
  tsr_rpc_ctx *rpc;
  tsr_rpc_server *srv;
  tsr_coll *coll;            /* the ring of dense "allreduce" (freed once
                                the server and the thread are done) */
  bool coll_closed;
  uv_signal_t sig_term, sig_int;
  uv_async_t wake;           /* thread -> loop: done jobs, connects */
  uv_timer_t exit_timer;     /* shutdown after the answer is written */
  struct tsr_idle *idle;     /* --idle-exit watcher, or NULL */
  bool closing;
  bool wake_closed;
  int exit_code;
  int handles_open;

  tsr_cluster cluster;
  int task_index;
  char role[32];             /* "worker:1" */
  kern_opts kopts;
  uint32_t ps_deadline_ms;

  /* The PS client (ps/client/client.h, ps_kv): made, replaced (a configure for
   * another layout) and closed on the loop; the thread submits and waits
   * through it. `kv` is under mu. */
  ps_kv *kv;
  char **ps_addrs;
  int n_ps;
  int ps_closing;            /* clients still closing */

  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* thread: new job; waiters: group done */
  tsr_list jobs;              /* loop -> thread (wk_job.node) */
  tsr_list done;              /* thread -> loop (wk_job.node) */
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
/* Serves the thread's connect request, if any (loop thread). */
void wk__ps_issue(wk_svc *s);
/* Replaces the PS client with one for `addrs` (loop thread). */
int wk__ps_connect(wk_svc *s, char *const *addrs, int n, char *err,
                   size_t errlen);
/* Fails every PS call in flight and every later one: the thread moves on
 * (loop thread, shutting down). */
void wk__ps_cancel(wk_svc *s);
/* Closes the PS client (loop thread, the thread gone or waiting on the
 * loop); s->ps_closing counts down. */
void wk__ps_close_all(wk_svc *s);
/* Asks the loop to connect to `addrs` and waits for it (thread); *kv is
 * the client to use until the next reconnect. */
int wk__ps_reconnect(wk_svc *s, char *const *addrs, int n, ps_kv **kv,
                     char *err, size_t errlen);

#endif
