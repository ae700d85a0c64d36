/* The run a configured worker holds, owned by the training thread (see
 * loop_int.h): the parsed job, the input, the model and its executor, the
 * chief's shard layout and the host buffers the PS pulls land in and the
 * pushes leave from.
 */
#ifndef TSR_WK_LOOP_RUN_H
#define TSR_WK_LOOP_RUN_H

#include "worker/loop_int.h"

/* One shard of one variable (proto Shard, checked). */
typedef struct {
  int var, shard, num_shards;
  int64_t row0, rows;
  int ps;
} wk_shard;

struct wk_run {
  uint64_t run_id;
  int worker_index, num_workers;
  tsr_job job;
  wk_input *in;
  wk_model *model;
  kern_ctx *kc;
  wk_exec *ex;
  const wk_var_info *vars;   /* the model's */
  size_t n_vars;
  wk_shard *shards;          /* sorted by (var, row0) */
  int n_shards;
  int *var_first;            /* shards of var v: [var_first[v], var_first[v+1]) */
  char **ps_addrs;
  int n_ps;
  char device[32];

  /* Per variable: dense, the whole value and its gradient; row-sparse,
   * the rows of the current batch (cap_rows rows allocated). */
  float **param, **grad;
  int64_t *cap_rows;
  /* Row-sparse ids (sorted, unique): the batch computed now and the next
   * one, whose rows the fused push-pull fetches. */
  int64_t **ids_cur, **ids_nxt;
  int64_t *n_cur, *n_nxt;
  wk_op *ops;                /* n_shards + n_ps */

  /* the clock protocol (worker/clock.c, tests/model/clock.pml) */
  int64_t clock;             /* ssp: steps finished; sync: the next step
                                it pushes */
  uint64_t *era;             /* per PS: the era its last JOIN answered */
  uint64_t losses;           /* PS connections lost when the closure began */
  int64_t steps;             /* steps run since configured */
  int64_t examples;
};

/* ssp and sync, at the start of closure `closure` (clock.c): JOIN every
 * PS, continue from the largest clock answered, and hold each PS's era
 * for the calls that follow; the caller's first exchange TICKs every PS
 * up to that clock. Retries a PS that is reconnecting until `end_ms`. */
int wk__clock_join(wk_svc *s, wk_run *r, uint64_t closure, uint64_t end_ms,
                   char *err, size_t errlen);
/* Adds a TICK to `clock` for every PS at r->ops[n..]; returns the count. */
int wk__clock_ticks(wk_run *r, int n, int64_t clock);
/* A PS that is down or not up yet: worth trying again shortly. */
bool wk__ps_retryable(int rc);
/* Runs a closure (RUN job); fills j->out.run. */
int wk__run_closure(wk_svc *s, wk_run *r, wk_job *j);
/* Evaluates the current parameters (EVAL job); fills j->out.eval. */
int wk__run_eval(wk_svc *s, wk_run *r, wk_job *j);

#endif
