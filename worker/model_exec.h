/* Running a model description (model.h) on the kern_ compute interface.
 *
 * Happy path: a wk_exec binds the model to one compute context (one per
 * GPU replica). Per step: wk_exec_prepare(batch) checks the batch (NaN,
 * label range, ids) and sorts and de-duplicates the ids of every
 * row-sparse variable; the caller fetches those rows (wk_exec_rows) and the
 * dense variables into parameter buffers, calls wk_exec_run(), and gets
 * the gradients in buffers of the same layout.
 * Failure modes: a batch with NaN or a bad label or id (named with the
 * batch, example and feature); the compute context's errors, named with
 * the operation.
 *
 * Parameter and gradient buffers (caller-owned host memory, float32):
 *   dense variable v:       its full value, numel floats
 *   row-sparse variable v:  the rows of the ids wk_exec_rows() lists, in
 *                           that order, n_rows * row_dim floats
 * The "gradient" of a moving statistic (trainable false) is the slice's
 * batch statistic times n_slice * grad_scale, i.e. its share of the global
 * batch (times the loss scale): summed over replicas and divided by the
 * loss scale it is the batch statistic the moving-average rule takes.
 * Regularizers add their gradient the same way (each replica its share),
 * and their value to the loss of every example.
 *
 * Threads: one wk_exec is used by one thread at a time (its context's).
 */
#ifndef TSR_WK_MODEL_EXEC_H
#define TSR_WK_MODEL_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "worker/input.h"
#include "worker/model.h"

typedef struct wk_exec wk_exec;

typedef struct {
  bool train;          /* dropout on, gradients computed */
  float grad_scale;    /* multiplies dLoss/dOutput: loss_scale / global batch */
  uint64_t seed;       /* dropout draws (job seed mixed with the step) */
  bool keep_on_device; /* leave gradients on the device (replicas reduce
                        * them with wk_exec_allreduce, then
                        * wk_exec_fetch_grads) */
  bool params_resident;/* the parameters uploaded by the previous run are
                        * still current: skip the upload (evaluation loops,
                        * benchmarks) */
  /* Overlap with the parameter servers (each may be NULL), on the calling
   * thread. param_need(arg, v) runs before variable v's parameters are
   * first read, in forward order (a negative return stops the run with
   * that code); grad_ready(arg, v) once v's gradient is final in grads[v],
   * in backward order (last layer first). On a GPU every need comes before
   * the upload and every ready after the download. */
  int (*param_need)(void *arg, int var);
  void (*grad_ready)(void *arg, int var);
  void *hook_arg;
} wk_run_opts;

typedef struct {
  double loss_sum;     /* sum of per-example losses of the slice */
  int64_t n;           /* examples in the slice */
  const float *pred;   /* host copy of the outputs [n, out_dim]
                        * (probabilities), valid until the next run */
  const float *labels; /* host labels of the slice [n] */
} wk_run_result;

/* Binds the model to a compute context for batches of up to max_batch
 * examples; `prec` is the precision of the matrix products' inputs. */
int wk_exec_open(const tsr_model *m, kern_ctx *ctx, int64_t max_batch,
                 kern_prec prec, wk_exec **out, char *err, size_t errlen);
void wk_exec_close(wk_exec *e);
kern_ctx *wk_exec_ctx(const wk_exec *e);

/* Checks examples [lo, hi) of a batch and lists the sparse ids. Replicas of
 * one step call it with their own slice and the same `global` exec (the
 * one that saw the whole batch with lo = 0, hi = n first), so every replica
 * uses the same row list and their gradients can be summed. Pass NULL as
 * global for a single replica. */
int wk_exec_prepare(wk_exec *e, const wk_batch *b, int64_t lo, int64_t hi,
                    const wk_exec *global, char *err, size_t errlen);

/* The sorted unique ids of row-sparse variable v in the prepared batch; for
 * a dense variable n = 0 and ids = NULL. */
int wk_exec_rows(const wk_exec *e, int v, const int64_t **ids, int64_t *n);

/* Forward (and backward when o->train) on the prepared slice. params[v] and
 * grads[v] are host buffers as described at the top (grads may be NULL when
 * not training). On the CPU the parameters are read in place. */
int wk_exec_run(wk_exec *e, float *const *params, float *const *grads,
                const wk_run_opts *o, wk_run_result *r);

/* Sums the device gradients of several replicas in place (NCCL on GPUs). */
int wk_exec_allreduce(wk_exec *const *reps, int n);
/* Copies the device gradients to host grads (after keep_on_device). */
int wk_exec_fetch_grads(wk_exec *e, float *const *grads);

#endif /* TSR_WK_MODEL_EXEC_H */
