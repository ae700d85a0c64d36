/* CPU activations (forward with the bias add, backward given z and y) and
 * losses with their gradients, with Keras's formulas. Losses are computed
 * in float with float64 accumulation across the classes of a row, and the
 * logit forms use the numerically stable expressions (log-sum-exp,
 * max(z,0) - z*y + log1p(exp(-|z|))). A sparse label outside [0, d) is
 * TSR_ERANGE; nothing else fails.
 */
#include "kernels/cpu/cpu_int.h"
#include "common/err.h"

#include <math.h>
#include <string.h>

#define SELU_ALPHA 1.6732632423543772f
#define SELU_SCALE 1.0507009873554805f
#define KERAS_EPS 1e-7f

static inline float sigm(float z) {
  return z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}

static void softmax_rows(const float *z, float *y, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; i++) {
    const float *zi = z + i * d;
    float *yi = y + i * d;
    float mx = zi[0];
    for (int64_t j = 1; j < d; j++) mx = zi[j] > mx ? zi[j] : mx;
    float s = 0;
    for (int64_t j = 0; j < d; j++) s += (yi[j] = expf(zi[j] - mx));
    float inv = 1.0f / s;
    for (int64_t j = 0; j < d; j++) yi[j] *= inv;
  }
}

int kern__cpu_bias_act(void *impl, float *z, const float *bias, float *y,
                       int64_t n, int64_t d, kern_act act, float alpha) {
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
    case KERN_ACT_RELU:
      for (size_t i = 0; i < N; i++) y[i] = z[i] > 0 ? z[i] : 0.0f;
      break;
    case KERN_ACT_RELU6:
      for (size_t i = 0; i < N; i++)
        y[i] = z[i] > 0 ? (z[i] < 6.0f ? z[i] : 6.0f) : 0.0f;
      break;
    case KERN_ACT_LEAKY_RELU:
      for (size_t i = 0; i < N; i++) y[i] = z[i] > 0 ? z[i] : alpha * z[i];
      break;
    case KERN_ACT_SIGMOID:
      for (size_t i = 0; i < N; i++) y[i] = sigm(z[i]);
      break;
    case KERN_ACT_TANH:
      for (size_t i = 0; i < N; i++) y[i] = tanhf(z[i]);
      break;
    case KERN_ACT_SOFTMAX:
      softmax_rows(z, y, n, d);
      break;
    case KERN_ACT_ELU:
      for (size_t i = 0; i < N; i++)
        y[i] = z[i] > 0 ? z[i] : alpha * expm1f(z[i]);
      break;
    case KERN_ACT_SELU:
      for (size_t i = 0; i < N; i++)
        y[i] = SELU_SCALE * (z[i] > 0 ? z[i] : SELU_ALPHA * expm1f(z[i]));
      break;
    case KERN_ACT_GELU:
      for (size_t i = 0; i < N; i++)
        y[i] = 0.5f * z[i] * (1.0f + erff(z[i] * 0.70710678118654752f));
      break;
    case KERN_ACT_SWISH:
      for (size_t i = 0; i < N; i++) y[i] = z[i] * sigm(z[i]);
      break;
    case KERN_ACT_SOFTPLUS:
      for (size_t i = 0; i < N; i++)
        y[i] = (z[i] > 0 ? z[i] : 0.0f) + log1pf(expf(-fabsf(z[i])));
      break;
    case KERN_ACT_SOFTSIGN:
      for (size_t i = 0; i < N; i++) y[i] = z[i] / (1.0f + fabsf(z[i]));
      break;
    case KERN_ACT_EXPONENTIAL:
      for (size_t i = 0; i < N; i++) y[i] = expf(z[i]);
      break;
    default:
      return TSR_EINVAL;
  }
  return 0;
}

int kern__cpu_act_grad(void *impl, const float *dy, const float *z,
                       const float *y, float *dz, int64_t n, int64_t d,
                       kern_act act, float alpha) {
  size_t N = (size_t)(n * d);
  switch (act) {
    case KERN_ACT_LINEAR:
      if (dz != dy) memcpy(dz, dy, N * sizeof *dz);
      break;
    case KERN_ACT_RELU:
      for (size_t i = 0; i < N; i++) dz[i] = z[i] > 0 ? dy[i] : 0.0f;
      break;
    case KERN_ACT_RELU6:
      for (size_t i = 0; i < N; i++)
        dz[i] = (z[i] > 0 && z[i] < 6.0f) ? dy[i] : 0.0f;
      break;
    case KERN_ACT_LEAKY_RELU:
      for (size_t i = 0; i < N; i++) dz[i] = z[i] > 0 ? dy[i] : alpha * dy[i];
      break;
    case KERN_ACT_SIGMOID:
      for (size_t i = 0; i < N; i++) dz[i] = dy[i] * y[i] * (1.0f - y[i]);
      break;
    case KERN_ACT_TANH:
      for (size_t i = 0; i < N; i++) dz[i] = dy[i] * (1.0f - y[i] * y[i]);
      break;
    case KERN_ACT_SOFTMAX:
      for (int64_t i = 0; i < n; i++) {
        const float *yi = y + i * d, *gi = dy + i * d;
        float *o = dz + i * d;
        float s = 0;
        for (int64_t j = 0; j < d; j++) s += gi[j] * yi[j];
        for (int64_t j = 0; j < d; j++) o[j] = yi[j] * (gi[j] - s);
      }
      break;
    case KERN_ACT_ELU:
      for (size_t i = 0; i < N; i++)
        dz[i] = z[i] > 0 ? dy[i] : dy[i] * (y[i] + alpha);
      break;
    case KERN_ACT_SELU:
      for (size_t i = 0; i < N; i++)
        dz[i] = z[i] > 0 ? dy[i] * SELU_SCALE
                         : dy[i] * (y[i] + SELU_SCALE * SELU_ALPHA);
      break;
    case KERN_ACT_GELU:
      for (size_t i = 0; i < N; i++) {
        float x = z[i];
        float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
        dz[i] = dy[i] * (cdf + x * pdf);
      }
      break;
    case KERN_ACT_SWISH:
      for (size_t i = 0; i < N; i++) {
        float s = sigm(z[i]);
        dz[i] = dy[i] * (s + y[i] * (1.0f - s));
      }
      break;
    case KERN_ACT_SOFTPLUS:
      for (size_t i = 0; i < N; i++) dz[i] = dy[i] * sigm(z[i]);
      break;
    case KERN_ACT_SOFTSIGN:
      for (size_t i = 0; i < N; i++) {
        float a = 1.0f + fabsf(z[i]);
        dz[i] = dy[i] / (a * a);
      }
      break;
    case KERN_ACT_EXPONENTIAL:
      for (size_t i = 0; i < N; i++) dz[i] = dy[i] * y[i];
      break;
    default:
      return TSR_EINVAL;
  }
  return 0;
}

/* Softmax cross-entropy of one row against a label distribution t (or a
 * class index when t is NULL); gradient (softmax * sum(t) - t) * s. */
static double ce_logits_row(const float *z, const float *t, int64_t cls,
                            int64_t d, float s, float *g) {
  float mx = z[0];
  for (int64_t j = 1; j < d; j++) mx = z[j] > mx ? z[j] : mx;
  double se = 0;
  for (int64_t j = 0; j < d; j++) se += exp((double)(z[j] - mx));
  double lse = log(se) + mx, loss = 0, tsum = 0;
  for (int64_t j = 0; j < d; j++) {
    double tj = t ? t[j] : (j == cls ? 1.0 : 0.0);
    loss += tj * (lse - z[j]);
    tsum += tj;
  }
  if (g)
    for (int64_t j = 0; j < d; j++) {
      double tj = t ? t[j] : (j == cls ? 1.0 : 0.0);
      g[j] = (float)((exp(z[j] - lse) * tsum - tj) * s);
    }
  return loss;
}

/* Keras categorical_crossentropy on probabilities: p normalized by its row
 * sum, clipped to [eps, 1-eps] (no gradient where clipped), -sum t log q. */
static double ce_probs_row(const float *p, const float *t, int64_t cls,
                           int64_t d, float s, float *g) {
  double S = 0, loss = 0, gq = 0;
  for (int64_t j = 0; j < d; j++) S += p[j];
  for (int64_t j = 0; j < d; j++) {
    double tj = t ? t[j] : (j == cls ? 1.0 : 0.0);
    double q = p[j] / S;
    bool clipped = q < KERAS_EPS || q > 1.0 - KERAS_EPS;
    double qc = q < KERAS_EPS ? KERAS_EPS : q > 1.0 - KERAS_EPS ? 1.0 - KERAS_EPS : q;
    loss -= tj * log(qc);
    double dq = clipped ? 0.0 : -tj / q;   /* dL/dq_j */
    if (g) g[j] = (float)dq;
    gq += dq * q;
  }
  if (g) /* dq_k/dp_m = (delta_km - q_k) / S */
    for (int64_t j = 0; j < d; j++) g[j] = (float)((g[j] - gq) / S * s);
  return loss;
}

int kern__cpu_loss(void *impl, kern_loss kind, float param, const float *p,
                   const float *y, int64_t n, int64_t d, float s,
                   float *ex_loss, float *grad) {
  for (int64_t i = 0; i < n; i++) {
    const float *pi = p + i * d;
    float *gi = grad ? grad + i * d : NULL;
    double L = 0;
    int64_t cls = -1;
    if (kind == KERN_LOSS_SPARSE_CCE_LOGITS ||
        kind == KERN_LOSS_SPARSE_CCE_PROBS) {
      float lab = y[i];
      if (!(lab >= 0 && lab < (float)d) || lab != floorf(lab))
        return TSR_ERANGE;
      cls = (int64_t)lab;
    }
    const float *yi = cls >= 0 ? NULL : y + i * d;
    switch (kind) {
      case KERN_LOSS_MSE:
        for (int64_t j = 0; j < d; j++) {
          float e = pi[j] - yi[j];
          L += (double)e * e;
          if (gi) gi[j] = 2.0f * e / (float)d * s;
        }
        L /= (double)d;
        break;
      case KERN_LOSS_MAE:
        for (int64_t j = 0; j < d; j++) {
          float e = pi[j] - yi[j];
          L += fabs((double)e);
          if (gi) gi[j] = (e > 0 ? 1.0f : e < 0 ? -1.0f : 0.0f) / (float)d * s;
        }
        L /= (double)d;
        break;
      case KERN_LOSS_BCE_LOGITS:
        for (int64_t j = 0; j < d; j++) {
          double z = pi[j], t = yi[j];
          L += (z > 0 ? z : 0) - z * t + log1p(exp(-fabs(z)));
          if (gi) gi[j] = (sigm(pi[j]) - yi[j]) / (float)d * s;
        }
        L /= (double)d;
        break;
      case KERN_LOSS_BCE_PROBS:
        for (int64_t j = 0; j < d; j++) {
          double q = pi[j], t = yi[j];
          bool clipped = q < KERAS_EPS || q > 1.0 - KERAS_EPS;
          double qc = q < KERAS_EPS ? KERAS_EPS : q > 1.0 - KERAS_EPS ? 1.0 - KERAS_EPS : q;
          L -= t * log(qc + KERAS_EPS) + (1 - t) * log(1 - qc + KERAS_EPS);
          if (gi)
            gi[j] = clipped ? 0.0f
                            : (float)((-t / (q + KERAS_EPS) +
                                       (1 - t) / (1 - q + KERAS_EPS)) /
                                      (double)d * s);
        }
        L /= (double)d;
        break;
      case KERN_LOSS_CCE_LOGITS:
        L = ce_logits_row(pi, yi, -1, d, s, gi);
        break;
      case KERN_LOSS_SPARSE_CCE_LOGITS:
        L = ce_logits_row(pi, NULL, cls, d, s, gi);
        break;
      case KERN_LOSS_CCE_PROBS:
        L = ce_probs_row(pi, yi, -1, d, s, gi);
        break;
      case KERN_LOSS_SPARSE_CCE_PROBS:
        L = ce_probs_row(pi, NULL, cls, d, s, gi);
        break;
      case KERN_LOSS_HUBER:
        for (int64_t j = 0; j < d; j++) {
          double e = (double)pi[j] - yi[j], a = fabs(e);
          L += a <= param ? 0.5 * e * e : param * (a - 0.5 * param);
          if (gi)
            gi[j] = (float)((a <= param ? e : e > 0 ? param : -param) /
                            (double)d * s);
        }
        L /= (double)d;
        break;
      case KERN_LOSS_KLD:
        for (int64_t j = 0; j < d; j++) {
          double t = yi[j], q = pi[j];
          double tc = t < KERAS_EPS ? KERAS_EPS : t > 1 ? 1 : t;
          bool clipped = q < KERAS_EPS || q > 1;
          double qc = q < KERAS_EPS ? KERAS_EPS : q > 1 ? 1 : q;
          L += tc * log(tc / qc);
          if (gi) gi[j] = clipped ? 0.0f : (float)(-tc / q * s);
        }
        break;
      default:
        return TSR_EINVAL;
    }
    if (ex_loss) ex_loss[i] = (float)L;
  }
  return 0;
}
