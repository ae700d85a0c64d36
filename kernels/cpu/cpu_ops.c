/* CPU activations (forward with the bias add, backward given z and y) and
 * losses with their gradients. The formulas are kern_math.h's, shared with
 * the CUDA kernels; this file only loops. Each activation has its own loop
 * (the switch sits outside), so gcc vectorizes the simple ones. A sparse
 * label that is not an integer in [0, d) is TSR_ERANGE, with the row named
 * in the backend's last error; nothing else fails. Activations run over
 * the context's pool, in ranges of whole rows.
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_math.h"
#include "common/err.h"

#include <stdio.h>
#include <string.h>

#define EACH(N) for (size_t i = 0; i < (N); i++)

KERN__HOT static int bias_act_rows(float *z, const float *bias, float *y, int64_t n,
                         int64_t d, kern_act act, float alpha) {
  if (bias)
    for (int64_t i = 0; i < n; i++) {
      float *zi = z + i * d;
      for (int64_t j = 0; j < d; j++) zi[j] += bias[j];
    }
  size_t N = (size_t)(n * d);
  switch (act) {
    case KERN_ACT_LINEAR:
      if (y != z) memcpy(y, z, N * sizeof *y);
      break;
    case KERN_ACT_RELU: EACH(N) y[i] = kern_math_relu(z[i]); break;
    case KERN_ACT_RELU6: EACH(N) y[i] = kern_math_relu6(z[i]); break;
    case KERN_ACT_LEAKY_RELU:
      EACH(N) y[i] = kern_math_leaky_relu(z[i], alpha);
      break;
    case KERN_ACT_SIGMOID: EACH(N) y[i] = kern_math_sigmoid(z[i]); break;
    case KERN_ACT_TANH: EACH(N) y[i] = tanhf(z[i]); break;
    case KERN_ACT_SOFTMAX:
      for (int64_t i = 0; i < n; i++)
        kern_math_softmax_row(z + i * d, y + i * d, d);
      break;
    case KERN_ACT_ELU: EACH(N) y[i] = kern_math_elu(z[i], alpha); break;
    case KERN_ACT_SELU: EACH(N) y[i] = kern_math_selu(z[i]); break;
    case KERN_ACT_GELU: EACH(N) y[i] = kern_math_gelu(z[i]); break;
    case KERN_ACT_SWISH: EACH(N) y[i] = kern_math_swish(z[i]); break;
    case KERN_ACT_SOFTPLUS: EACH(N) y[i] = kern_math_softplus(z[i]); break;
    case KERN_ACT_SOFTSIGN: EACH(N) y[i] = kern_math_softsign(z[i]); break;
    case KERN_ACT_EXPONENTIAL: EACH(N) y[i] = expf(z[i]); break;
    default:
      return TSR_EINVAL;
  }
  return 0;
}

KERN__HOT static int act_grad_rows(const float *dy, const float *z, const float *y,
                         float *dz, int64_t n, int64_t d, kern_act act,
                         float alpha) {
  size_t N = (size_t)(n * d);
  switch (act) {
    case KERN_ACT_LINEAR:
      if (dz != dy) memcpy(dz, dy, N * sizeof *dz);
      break;
    case KERN_ACT_RELU: EACH(N) dz[i] = kern_math_relu_grad(dy[i], z[i]); break;
    case KERN_ACT_RELU6:
      EACH(N) dz[i] = kern_math_relu6_grad(dy[i], z[i]);
      break;
    case KERN_ACT_LEAKY_RELU:
      EACH(N) dz[i] = kern_math_leaky_relu_grad(dy[i], z[i], alpha);
      break;
    case KERN_ACT_SIGMOID:
      EACH(N) dz[i] = kern_math_sigmoid_grad(dy[i], y[i]);
      break;
    case KERN_ACT_TANH: EACH(N) dz[i] = kern_math_tanh_grad(dy[i], y[i]); break;
    case KERN_ACT_SOFTMAX:
      for (int64_t i = 0; i < n; i++)
        kern_math_softmax_grad_row(dy + i * d, y + i * d, dz + i * d, d);
      break;
    case KERN_ACT_ELU:
      EACH(N) dz[i] = kern_math_elu_grad(dy[i], z[i], y[i], alpha);
      break;
    case KERN_ACT_SELU:
      EACH(N) dz[i] = kern_math_selu_grad(dy[i], z[i], y[i]);
      break;
    case KERN_ACT_GELU: EACH(N) dz[i] = kern_math_gelu_grad(dy[i], z[i]); break;
    case KERN_ACT_SWISH:
      EACH(N) dz[i] = kern_math_swish_grad(dy[i], z[i], y[i]);
      break;
    case KERN_ACT_SOFTPLUS:
      EACH(N) dz[i] = kern_math_softplus_grad(dy[i], z[i]);
      break;
    case KERN_ACT_SOFTSIGN:
      EACH(N) dz[i] = kern_math_softsign_grad(dy[i], z[i]);
      break;
    case KERN_ACT_EXPONENTIAL:
      EACH(N) dz[i] = kern_math_exponential_grad(dy[i], y[i]);
      break;
    default:
      return TSR_EINVAL;
  }
  return 0;
}

/* Both over the pool in ranges of rows (a softmax row stays whole). */
#define ACT_GRAIN (1 << 15) /* elements per range */
typedef struct {
  float *z, *y, *dz;
  const float *bias, *dy, *cz, *cy;
  int64_t d;
  kern_act act;
  float alpha;
} act_job;

static void bias_act_range(void *a, int64_t r0, int64_t r1, int tid) {
  const act_job *j = a;
  int64_t o = r0 * j->d;
  bias_act_rows(j->z + o, j->bias, j->y + o, r1 - r0, j->d, j->act,
                j->alpha);
}

static int64_t act_rows_grain(int64_t d) {
  return d >= ACT_GRAIN ? 1 : ACT_GRAIN / d;
}

int kern__cpu_bias_act(void *impl, float *z, const float *bias, float *y,
                       int64_t n, int64_t d, kern_act act, float alpha) {
  if ((unsigned)act >= KERN_ACT__COUNT) return TSR_EINVAL;
  act_job j = {.z = z, .y = y, .bias = bias, .d = d, .act = act,
               .alpha = alpha};
  kern__cpu_par(impl, n, act_rows_grain(d), bias_act_range, &j);
  return 0;
}

static void act_grad_range(void *a, int64_t r0, int64_t r1, int tid) {
  const act_job *j = a;
  int64_t o = r0 * j->d;
  act_grad_rows(j->dy + o, j->cz ? j->cz + o : NULL, j->cy ? j->cy + o : NULL,
                j->dz + o, r1 - r0, j->d, j->act, j->alpha);
}

int kern__cpu_act_grad(void *impl, const float *dy, const float *z,
                       const float *y, float *dz, int64_t n, int64_t d,
                       kern_act act, float alpha) {
  if ((unsigned)act >= KERN_ACT__COUNT) return TSR_EINVAL;
  act_job j = {.dz = dz, .dy = dy, .cz = z, .cy = y, .d = d, .act = act,
               .alpha = alpha};
  kern__cpu_par(impl, n, act_rows_grain(d), act_grad_range, &j);
  return 0;
}

int kern__cpu_loss(void *impl, kern_loss kind, float param, const float *p,
                   const float *y, int64_t n, int64_t d, float s,
                   float *ex_loss, float *grad) {
  bool sparse = kern_math_loss_sparse(kind);
  for (int64_t i = 0; i < n; i++) {
    int64_t cls = -1;
    if (sparse && (cls = kern_math_sparse_class(y[i], d)) < 0)
      return kern__cpu_fail(impl, TSR_ERANGE,
                            "label %g of example %lld is not a class index "
                            "in [0, %lld)",
                            (double)y[i], (long long)i, (long long)d);
    double L = kern_math_loss_row_p(kind, param, p + i * d, sparse ? NULL : y + i * d,
                                  cls, d, s, grad ? grad + i * d : NULL);
    if (ex_loss) ex_loss[i] = (float)L;
  }
  return 0;
}
