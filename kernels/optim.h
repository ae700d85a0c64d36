/* Optimizers with Keras semantics, shared by the parameter server (applies
 * on push) and the standalone trainer. Pure functions over float32 arrays:
 * no threads, no allocation, so the caller decides where they run (the PS
 * runs them on its thread pool, one writer per shard).
 *
 * Update rules and defaults are Keras's (tf.keras.optimizers):
 *   SGD      v = m*v - lr*g; w += v            (nesterov: w += m*v - lr*g)
 *            momentum 0: w -= lr*g
 *   Adagrad  a += g^2; w -= lr*g/(sqrt(a)+eps)
 *   RMSprop  ms = rho*ms + (1-rho)*g^2; (centered: mg = rho*mg+(1-rho)*g,
 *            denom = ms - mg^2); momentum: mom = m*mom + lr*g/sqrt(denom+eps)
 *            w -= mom; else w -= lr*g/(sqrt(denom)+eps)  (Keras 2.11+ form)
 *   Adam     m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *   (AdamW)  alpha = lr*sqrt(1-b2^t)/(1-b1^t); w -= alpha*m/(sqrt(v)+eps)
 *            (Keras's epsilon is the paper's "epsilon hat": used as is)
 *   Nadam    m, v as Adam; u_t = b1*(1-0.5*0.96^t), P_t = u_1*...*u_t;
 *            m_hat = u_{t+1}*m/(1-P_t*u_{t+1}) + (1-u_t)*g/(1-P_t);
 *            w -= lr*m_hat/(sqrt(v/(1-b2^t))+eps)
 *   Adamax   m as Adam; u = max(b2*u, |g|); w -= lr*m/((1-b1^t)*(u+eps))
 *   FTRL     (TF's ApplyFtrlV2, with l2 shrinkage) for sparse rows and dense.
 *   moving average (not a Keras optimizer: the update of non-trainable
 *            statistics such as BatchNormalization's moving mean and
 *            variance, Keras's momentum rule) w += lr * (g - w), with
 *            lr = 1 - momentum and g the pushed batch statistic (a mean of
 *            the k pushes summed in sync mode, through `scale`); no slots.
 * Every kind: the learning rate is tsr_optim_lr(spec, t-1) (a schedule is
 * evaluated at the iteration count before this update, as Keras does);
 * weight_decay > 0 first does w -= w*weight_decay*lr (Keras's decoupled
 * decay; AdamW's default 0.004); clipvalue > 0 clips the scaled gradient
 * elementwise to [-clipvalue, clipvalue]. clipnorm and global_clipnorm need
 * the whole gradient, which only the worker has: kern_optim_clip_norm()
 * runs there, before the push.
 * `step` is the 1-based count of applies to this variable (Adam's t).
 * For sparse rows each row is applied with its own slots (lazy: rows not
 * in the batch keep their slots, as TF's LazyAdam and as embedding tables
 * too large to sweep require).
 */
#ifndef TSR_KERN_OPTIM_H
#define TSR_KERN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/optim_spec.h"

#define KERN_OPTIM_MAX_SLOTS 3

/* Number of float32 slot arrays (each the size of the variable) the
 * optimizer needs with these hyperparameters: SGD 0 (1 with momentum),
 * Adagrad 1, RMSprop 1..3, Adam 2, FTRL 2. */
int kern_optim_num_slots(const tsr_optim_spec *spec);

/* Slot names as checkpoints store them ("m", "v", "accumulator", ...). */
const char *kern_optim_slot_name(const tsr_optim_spec *spec, int slot);

/* Fills slot arrays with their initial values (zeros, or the initial
 * accumulator value for Adagrad and FTRL). */
void kern_optim_init_slots(const tsr_optim_spec *spec, float *const *slots,
                           size_t n);

/* One update of n elements in place. `slots` has kern_optim_num_slots()
 * arrays of n floats. `scale` multiplies the gradient first (1/k for a mean
 * of k summed gradients). Returns 0, or TSR_EINVAL for step < 1. */
int kern_optim_apply(const tsr_optim_spec *spec, int64_t step, float *w,
                     const float *g, float scale, float *const *slots,
                     size_t n);

/* clipnorm / global_clipnorm of the spec over `count` gradient arrays
 * (g[a] has n[a] floats), in place, as Keras clips before an update:
 * clipnorm scales each array by clipnorm / max(||g[a]||, clipnorm),
 * global_clipnorm all of them by global_clipnorm / max(||g||, global).
 * `scale` is the factor the optimizer will apply (1/loss_scale): norms are
 * of the scaled values. A non-finite norm leaves the arrays as they are
 * (the loss-scale check or the PS rejects them). Returns the smallest
 * factor applied (1 when nothing was clipped or neither option is set). */
double kern_optim_clip_norm(const tsr_optim_spec *spec, float *const *g,
                            const size_t *n, int count, float scale);

#endif
