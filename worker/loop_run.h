/* The run a configured worker holds, owned by the training thread (see
 * loop_int.h): the parsed job, the input, the model and its executor, the
 * chief's shard layout and the host buffers the PS pulls land in and the
 * pushes leave from.
 */
#ifndef TSR_WK_LOOP_RUN_H
#define TSR_WK_LOOP_RUN_H

#include "worker/loop_int.h"

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
   * the rows of the current batch (cap_rows rows allocated). */
  float **param, **grad;
  int64_t *cap_rows;
  /* Row-sparse ids (sorted, unique): the batch computed now and the next
   * one, whose rows the fused push-pull fetches. */
  int64_t **ids_cur, **ids_nxt;
  int64_t *n_cur, *n_nxt;
  wk_op *ops;                /* n_shards + n_ps */

  int64_t clock;             /* steps this worker finished (ssp) or steps
                                applied on the PS (sync) */
  uint64_t losses;           /* PS connections lost when the closure began */
  int64_t steps;             /* steps run since configured */
  int64_t examples;
};

/* Joins every PS's clocks at configure (loop_step.c). */
int wk__run_join(wk_svc *s, wk_run *r, char *err, size_t errlen);
/* Runs a closure (RUN job); fills j->out.run. */
int wk__run_closure(wk_svc *s, wk_run *r, wk_job *j);
/* Evaluates the current parameters (EVAL job); fills j->out.eval. */
int wk__run_eval(wk_svc *s, wk_run *r, wk_job *j);

#endif
