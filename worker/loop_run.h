/* The run a configured worker holds, owned by the training thread (see
 * loop_int.h): the parsed job, the input, the model and its executor, the
 * chief's shard layout and the host buffers the PS pulls land in and the
 * pushes leave from.
 */
#ifndef TSR_WK_LOOP_RUN_H
#define TSR_WK_LOOP_RUN_H

#include "common/coll/coll.h"
#include "common/optim_spec.h"
#include "common/trace.h"
#include "worker/loop_int.h"

/* The PS traffic of one variable in flight (loop_xfer.c): per parameter
 * set k (two with prefetch_params, else one), the pull that fills
 * param set k for its next compute and the push that sends grad set k. */
typedef struct {
  ps_ticket pull[2];
  ps_ticket push[2];
  bool early;    /* pull[k] for the next step went out right after the
                    push (wk_run.early_pull); the step's pull skips it */
} wk_var_xfer;

/* Figures of the PS traffic, reset by the closure's phases. */
typedef struct {
  double wait_pull_s;        /* blocked on pulls (hooks, first pull) */
  double wait_push_s;        /* blocked on pushes */
  int64_t max_step, min_step;/* shard steps answered since the reset */
  bool pushed;               /* a push of this step went out */
  int rc;                    /* first failure, with err */
  char err[WK_ERR_MAX];
  tsr_trace *tr;             /* the closure's, or NULL */
  int32_t tpid;
} wk_xstat;

struct wk_run {
  uint64_t run_id;
  int worker_index, num_workers;
  tsr_job job;
  wk_input *in;
  tsr_model *model;
  kern_ctx *kc;
  wk_exec *ex;
  const tsr_var *vars;   /* the model's */
  size_t n_vars;
  tsr_shard *shards;         /* the chief's (proto Shard, checked),
                                sorted by (var, row0) */
  int n_shards;
  int *var_first;            /* shards of var v: [var_first[v], var_first[v+1]) */
  char **ps_addrs;
  int n_ps;
  char device[32];

  /* Per variable: dense, the whole value and its gradient; row-sparse,
   * the rows of the current batch (cap_rows rows allocated). Set 0; with
   * prefetch_params a second set (param1, grad1) for dense variables
   * (row-sparse entries are set 0's), the two alternating by step. */
  float **param, **grad;
  float **param1, **grad1;
  int64_t *cap_rows;
  /* Row-sparse ids (sorted, unique): the batch computed now and the next
   * one, whose rows the fused push-pull fetches. */
  int64_t **ids_cur, **ids_nxt;
  int64_t *n_cur, *n_nxt;
  ps_kv *kv;                 /* the service's PS client */
  ps_dtype wire;             /* job's wire_precision */
  bool prefetch;             /* job's prefetch_params */
  bool defer_push;           /* clipnorm / global_clipnorm: the gradient
                                is clipped whole before any push */
  int cur;                   /* the set the next compute runs on */
  wk_var_xfer *xf;           /* per variable */
  wk_xstat xs;
  bool early_pull;           /* this step: a dense variable's next values
                                are pulled as soon as its push is out
                                (async, no prefetch, no clipping, a next
                                step to come) */
  int hook_set;              /* the compute hooks' set and push step */
  int64_t hook_step;

  /* the clock protocol (worker/clock.c, tests/model/clock.pml) */
  int64_t clock;             /* ssp: steps finished; sync: the next step
                                it pushes */
  bool plain_reads;          /* evaluation: pulls carry no era (the PS
                                client keeps each PS's era, clock.c) */
  uint64_t read_snapshot;    /* evaluation: the PS snapshot its pulls read
                                (0: the live values) */
  uint64_t losses;           /* PS connections lost when the closure began */
  int64_t steps;             /* steps run since configured */
  int64_t examples;

  /* dense "allreduce" (hybrid.c): the dense variables live here, their
   * gradients in the buckets of `fuse` (grad[v] points into it) */
  bool hybrid;
  int *kv_var;               /* model variable -> the PS client's (-1: not
                                on the PS); NULL: the same index */
  tsr_coll *coll;            /* the service's */
  tsr_coll_fuse *fuse;
  int *dense_ix;             /* model variable -> tensor of fuse (-1) */
  int *dense_var;            /* tensor of fuse -> model variable */
  tsr_optim_spec *vopt;      /* per variable */
  int *nslots;
  float ***slots;            /* per dense variable, its optimizer slots */
  int64_t dense_step;        /* optimizer applies so far (Adam's t) */
  int group_size;
  uint64_t group_epoch;      /* the ring's, as the chief named it */
  struct kern_nccl *nccl;    /* GPU workers: the buckets go through NCCL
                                (staged in gpu_buf) instead of the ring */
  float *gpu_buf;
  double hy_wait_s;          /* blocked on the ring, since configure */
};

/* loop_xfer.c: the step's traffic, per variable, through r->kv.
 * Every failure lands in r->xs (rc, err) and is returned. */
/* The parameter set k's arrays. */
float *const *wk__set_param(wk_run *r, int k);
float *const *wk__set_grad(wk_run *r, int k);
/* Tells the PS client the layout, the worker and the mode (configure). */
int wk__xfer_configure(wk_svc *s, wk_run *r, char *err, size_t errlen);
/* Starts a closure's figures (tr may be NULL). */
void wk__xfer_begin(wk_run *r, tsr_trace *tr, int32_t tpid);
/* Pulls into set k for the next compute on it, variable by variable in
 * model order: dense ones when `dense`, and row-sparse ones (the rows of
 * ids_nxt, into set 0) when `sparse`. */
int wk__xfer_pull(wk_run *r, int k, int64_t clock, bool dense, bool sparse);
/* Waits for every pull into set k (first pull). */
int wk__xfer_wait_pulls(wk_run *r, int k);
/* Waits for the pushes from set k: every one, or the dense or the
 * row-sparse ones only. */
int wk__xfer_wait_pushes(wk_run *r, int k, bool dense, bool sparse);
/* Waits for variable v's pushes from either set (before its row buffers
 * move). */
int wk__xfer_wait_var_push(wk_run *r, int v);
/* Pushes every variable's gradient from set k, last variable first (when
 * the pushes wait for the whole gradient). */
int wk__xfer_push_all(wk_run *r, int k, int64_t step);
/* Waits for every ticket still open; the first failure. */
int wk__xfer_drain(wk_run *r);
/* Sets the compute hooks for set k, pushing with `step`. */
void wk__xfer_hooks(wk_run *r, wk_run_opts *ro, int k, int64_t step);
/* A clock report to every PS, waited for; *min_clock the largest answer. */
int wk__xfer_clock(wk_run *r, ps_clock_op op, int64_t clock, bool check,
                   int64_t *min_clock);
/* Submits a clock report without waiting (ticket into *t). */
int wk__xfer_clock_submit(wk_run *r, ps_clock_op op, int64_t clock,
                          ps_ticket *t);
/* Waits for one ticket, folding its figures into r->xs. */
int wk__xfer_wait(wk_run *r, ps_ticket *t, bool push, const char *what);

/* hybrid.c: dense "allreduce". */
/* Bytes the dense variables take on a worker (values, gradients, slots). */
uint64_t wk__hy_dense_bytes(const wk_run *r, const tsr_optim_spec *opt);
/* TSR_EMEMLIMIT naming the bytes when they pass `avail` (`where` says
 * whose limit). */
int wk__hy_check_memory(const wk_run *r, uint64_t avail, const char *where,
                        char *err, size_t errlen);
/* Values (the seed's or initial_weights'), slots, buckets, the ring. */
int wk__hy_configure(wk_svc *s, wk_run *r,
                     const Tessera__Worker__ConfigureRequest *q, char *err,
                     size_t errlen);
void wk__hy_free(wk_run *r);
/* A step begins: no gradient final yet. */
void wk__hy_start(wk_run *r);
/* Dense variable v's gradient is final (the grad_ready hook). */
void wk__hy_ready(wk_run *r, int v);
/* After the compute: the buckets not on the ring yet (their last
 * gradient was never marked final) go out; the ring runs on while the
 * training thread prepares the next step. A failure lands in r->xs. */
int wk__hy_post(wk_run *r);
/* After the compute: every bucket waited for in order; `apply`: the
 * optimizer on each bucket's variables with the mean gradient as it
 * arrives; else the gradients are only made the mean (clipping comes
 * first, then wk__hy_apply(r, 1)). Bytes, buckets and the wait into o.
 * A failure lands in r->xs. */
int wk__hy_reduce(wk_run *r, bool apply, Tessera__Worker__RunResponse *o);
void wk__hy_apply(wk_run *r, float scale);
/* The DENSE job: the dense values (and slots) into j->trace, the list
 * into j->out.dense. */
int wk__hy_get(wk_run *r, wk_job *j);
/* The DENSE_SET job: values, slots and applies from the request's payload,
 * all checked against the model first. */
int wk__hy_set(wk_run *r, wk_job *j);
/* A closure in another ring than this worker's (a worker lost or joining):
 * the ring re-forms, then the dense state of the closure's state_root
 * goes to every member by broadcast. Failures into err. */
int wk__hy_ring(wk_run *r, const Tessera__Worker__RunRequest *q, char *err,
                size_t errlen);
/* The step failed: abort the ring with `why`, wait for what was posted. */
void wk__hy_fail(wk_run *r, int code, const char *why);

/* ssp and sync, at configure (closure 0) and at the start of closure
 * `closure` (clock.c): JOIN every PS, continue from the largest clock
 * answered (r->clock); each PS's answer sets the era every later call to
 * it carries; the closure's first pull TICKs every PS up to that clock.
 * Retries a PS that is reconnecting until `end_ms`. */
int wk__clock_join(wk_svc *s, wk_run *r, uint64_t closure, uint64_t end_ms,
                   char *err, size_t errlen);
/* A PS that is down or not up yet: worth trying again shortly. */
bool wk__ps_retryable(int rc);
/* Runs a closure (RUN job); fills j->out.run. */
int wk__run_closure(wk_svc *s, wk_run *r, wk_job *j);
/* Evaluates the current parameters (EVAL job); fills j->out.eval. */
int wk__run_eval(wk_svc *s, wk_run *r, wk_job *j);

#endif
