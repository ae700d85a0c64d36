/* The element-wise math of the compute interface, written once for both
 * backends: activations and their gradients, the softmax row, the loss of
 * one row with its gradient, rounding to bfloat16 / IEEE half, and the
 * counter-based dropout draw. The CPU loops (kernels/cpu/) and the CUDA
 * kernels (kernels/cuda/) call these functions and keep only their own
 * indexing, so the backends cannot drift apart and every formula runs on
 * the CPU in the tests (tests/unit/kernels/test_kern_math.c).
 *
 * Plain C99 that nvcc also compiles as C++: under nvcc every function is
 * __host__ __device__. No function allocates, fails or touches memory
 * beyond the row it is given; NaN and infinities pass through as the
 * formula gives them. Precision: activations in float; loss rows
 * accumulate in double over the row (as the CPU always did).
 *
 * New element-wise ops (convolution epilogues, normalisations) belong
 * here too, with a CPU test against a float64 reference.
 */
#ifndef TSR_KERN_MATH_H
#define TSR_KERN_MATH_H

#include "kernels/kern.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif
#define KERN_MATH static inline KERN_HD

#define KERN_SELU_ALPHA 1.6732632423543772f
#define KERN_SELU_SCALE 1.0507009873554805f
#define KERN_KERAS_EPS 1e-7f /* keras.backend.epsilon() */
#define KERN_SQRT1_2 0.70710678118654752f
#define KERN_INV_SQRT_2PI 0.3989422804014327f

/* ---- activations: y = f(z) ---------------------------------------------- */

/* Stable on both tails: never exp of a large positive number. */
KERN_MATH float kern_math_sigmoid(float z) {
  return z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}
KERN_MATH float kern_math_relu(float z) { return z > 0 ? z : 0.0f; }
KERN_MATH float kern_math_relu6(float z) {
  return z > 0 ? (z < 6.0f ? z : 6.0f) : 0.0f;
}
KERN_MATH float kern_math_leaky_relu(float z, float alpha) {
  return z > 0 ? z : alpha * z;
}
KERN_MATH float kern_math_elu(float z, float alpha) {
  return z > 0 ? z : alpha * expm1f(z);
}
KERN_MATH float kern_math_selu(float z) {
  return KERN_SELU_SCALE * (z > 0 ? z : KERN_SELU_ALPHA * expm1f(z));
}
/* exact (erf) form, Keras's approximate=False */
KERN_MATH float kern_math_gelu(float z) {
  return 0.5f * z * (1.0f + erff(z * KERN_SQRT1_2));
}
KERN_MATH float kern_math_swish(float z) { return z * kern_math_sigmoid(z); }
KERN_MATH float kern_math_softplus(float z) {
  return (z > 0 ? z : 0.0f) + log1pf(expf(-fabsf(z)));
}
KERN_MATH float kern_math_softsign(float z) { return z / (1.0f + fabsf(z)); }

/* Every activation but softmax (a row op: kern_math_softmax_row); alpha is
 * the slope of leaky_relu and the alpha of elu. */
KERN_MATH float kern_math_act(kern_act a, float z, float alpha) {
  switch (a) {
    case KERN_ACT_RELU: return kern_math_relu(z);
    case KERN_ACT_RELU6: return kern_math_relu6(z);
    case KERN_ACT_LEAKY_RELU: return kern_math_leaky_relu(z, alpha);
    case KERN_ACT_SIGMOID: return kern_math_sigmoid(z);
    case KERN_ACT_TANH: return tanhf(z);
    case KERN_ACT_ELU: return kern_math_elu(z, alpha);
    case KERN_ACT_SELU: return kern_math_selu(z);
    case KERN_ACT_GELU: return kern_math_gelu(z);
    case KERN_ACT_SWISH: return kern_math_swish(z);
    case KERN_ACT_SOFTPLUS: return kern_math_softplus(z);
    case KERN_ACT_SOFTSIGN: return kern_math_softsign(z);
    case KERN_ACT_EXPONENTIAL: return expf(z);
    default: return z; /* linear */
  }
}

/* ---- gradients: dz = g * f'(z), given z and y = f(z) --------------------- */

KERN_MATH float kern_math_relu_grad(float g, float z) {
  return z > 0 ? g : 0.0f;
}
KERN_MATH float kern_math_relu6_grad(float g, float z) {
  return (z > 0 && z < 6.0f) ? g : 0.0f;
}
KERN_MATH float kern_math_leaky_relu_grad(float g, float z, float alpha) {
  return z > 0 ? g : alpha * g;
}
KERN_MATH float kern_math_sigmoid_grad(float g, float y) {
  return g * y * (1.0f - y);
}
KERN_MATH float kern_math_tanh_grad(float g, float y) {
  return g * (1.0f - y * y);
}
KERN_MATH float kern_math_elu_grad(float g, float z, float y, float alpha) {
  return z > 0 ? g : g * (y + alpha);
}
KERN_MATH float kern_math_selu_grad(float g, float z, float y) {
  return z > 0 ? g * KERN_SELU_SCALE
               : g * (y + KERN_SELU_SCALE * KERN_SELU_ALPHA);
}
KERN_MATH float kern_math_gelu_grad(float g, float z) {
  float cdf = 0.5f * (1.0f + erff(z * KERN_SQRT1_2));
  float pdf = KERN_INV_SQRT_2PI * expf(-0.5f * z * z);
  return g * (cdf + z * pdf);
}
KERN_MATH float kern_math_swish_grad(float g, float z, float y) {
  float s = kern_math_sigmoid(z);
  return g * (s + y * (1.0f - s));
}
KERN_MATH float kern_math_softplus_grad(float g, float z) {
  return g * kern_math_sigmoid(z);
}
KERN_MATH float kern_math_softsign_grad(float g, float z) {
  float a = 1.0f + fabsf(z);
  return g / (a * a);
}
KERN_MATH float kern_math_exponential_grad(float g, float y) { return g * y; }

/* Every activation but softmax (kern_math_softmax_grad). */
KERN_MATH float kern_math_act_grad(kern_act a, float g, float z, float y,
                                   float alpha) {
  switch (a) {
    case KERN_ACT_RELU: return kern_math_relu_grad(g, z);
    case KERN_ACT_RELU6: return kern_math_relu6_grad(g, z);
    case KERN_ACT_LEAKY_RELU: return kern_math_leaky_relu_grad(g, z, alpha);
    case KERN_ACT_SIGMOID: return kern_math_sigmoid_grad(g, y);
    case KERN_ACT_TANH: return kern_math_tanh_grad(g, y);
    case KERN_ACT_ELU: return kern_math_elu_grad(g, z, y, alpha);
    case KERN_ACT_SELU: return kern_math_selu_grad(g, z, y);
    case KERN_ACT_GELU: return kern_math_gelu_grad(g, z);
    case KERN_ACT_SWISH: return kern_math_swish_grad(g, z, y);
    case KERN_ACT_SOFTPLUS: return kern_math_softplus_grad(g, z);
    case KERN_ACT_SOFTSIGN: return kern_math_softsign_grad(g, z);
    case KERN_ACT_EXPONENTIAL: return kern_math_exponential_grad(g, y);
    default: return g; /* linear */
  }
}

/* ---- softmax over a row ---------------------------------------------------
 * y_j = exp(z_j - max z) / sum_k exp(z_k - max z); the backward of a row is
 * dz_j = y_j * (g_j - sum_k g_k y_k). The GPU reduces a row with a block
 * and applies the same element formulas. */
KERN_MATH float kern_math_softmax_exp(float z, float zmax) {
  return expf(z - zmax);
}
KERN_MATH float kern_math_softmax_grad(float g, float y, float gy_sum) {
  return y * (g - gy_sum);
}
KERN_MATH void kern_math_softmax_row(const float *z, float *y, int64_t d) {
  float mx = z[0];
  for (int64_t j = 1; j < d; j++) mx = z[j] > mx ? z[j] : mx;
  float s = 0;
  for (int64_t j = 0; j < d; j++) s += (y[j] = kern_math_softmax_exp(z[j], mx));
  float inv = 1.0f / s;
  for (int64_t j = 0; j < d; j++) y[j] *= inv;
}
KERN_MATH void kern_math_softmax_grad_row(const float *g, const float *y,
                                          float *dz, int64_t d) {
  float s = 0;
  for (int64_t j = 0; j < d; j++) s += g[j] * y[j];
  for (int64_t j = 0; j < d; j++) dz[j] = kern_math_softmax_grad(g[j], y[j], s);
}

/* ---- losses: one row -------------------------------------------------------
 * Keras's formulas and reductions (mean over the row for mse/mae/bce, sum
 * over classes for cross-entropy). p is the row of predictions (logits for
 * the *_LOGITS kinds), t the row of labels, or NULL for the sparse kinds
 * with `cls` the class index. Returns the row's loss; when g is not NULL
 * writes dL/dp * s to g[0..d). */

/* The class of a sparse label given as a float; -1 when it is not an
 * integer in [0, d) (the CPU reports TSR_ERANGE, the GPU's caller checks
 * labels on the host). */
KERN_MATH int64_t kern_math_sparse_class(float lab, int64_t d) {
  if (!(lab >= 0 && lab < (float)d) || lab != floorf(lab)) return -1;
  return (int64_t)lab;
}

KERN_MATH double kern_math_label(const float *t, int64_t cls, int64_t j) {
  return t ? (double)t[j] : (j == cls ? 1.0 : 0.0);
}

KERN_MATH double kern_math_clip_eps(double q) {
  return q < KERN_KERAS_EPS ? KERN_KERAS_EPS
         : q > 1.0 - KERN_KERAS_EPS ? 1.0 - KERN_KERAS_EPS
                                    : q;
}

KERN_MATH double kern_math_mse_row(const float *p, const float *t, int64_t d,
                                   float s, float *g) {
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    float e = p[j] - t[j];
    L += (double)e * e;
    if (g) g[j] = 2.0f * e / (float)d * s;
  }
  return L / (double)d;
}

KERN_MATH double kern_math_mae_row(const float *p, const float *t, int64_t d,
                                   float s, float *g) {
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    float e = p[j] - t[j];
    L += fabs((double)e);
    if (g) g[j] = (e > 0 ? 1.0f : e < 0 ? -1.0f : 0.0f) / (float)d * s;
  }
  return L / (double)d;
}

/* max(z,0) - z*t + log1p(exp(-|z|)), gradient (sigmoid(z) - t) / d */
KERN_MATH double kern_math_bce_logits_row(const float *p, const float *t,
                                          int64_t d, float s, float *g) {
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    double z = p[j], tj = t[j];
    L += (z > 0 ? z : 0) - z * tj + log1p(exp(-fabs(z)));
    if (g) g[j] = (kern_math_sigmoid(p[j]) - t[j]) / (float)d * s;
  }
  return L / (double)d;
}

/* on probabilities clipped to [eps, 1-eps] (no gradient where clipped) */
KERN_MATH double kern_math_bce_probs_row(const float *p, const float *t,
                                         int64_t d, float s, float *g) {
  const double eps = KERN_KERAS_EPS;
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    double q = p[j], tj = t[j];
    bool clipped = q < eps || q > 1.0 - eps;
    double qc = kern_math_clip_eps(q);
    L -= tj * log(qc + eps) + (1 - tj) * log(1 - qc + eps);
    if (g)
      g[j] = clipped ? 0.0f
                     : (float)((-tj / (q + eps) + (1 - tj) / (1 - q + eps)) /
                               (double)d * s);
  }
  return L / (double)d;
}

/* Softmax cross-entropy of a row of logits (log-sum-exp); gradient
 * (softmax * sum(t) - t) * s. */
KERN_MATH double kern_math_cce_logits_row(const float *z, const float *t,
                                          int64_t cls, int64_t d, float s,
                                          float *g) {
  float mx = z[0];
  for (int64_t j = 1; j < d; j++) mx = z[j] > mx ? z[j] : mx;
  double se = 0;
  for (int64_t j = 0; j < d; j++) se += exp((double)(z[j] - mx));
  double lse = log(se) + mx, loss = 0, tsum = 0;
  for (int64_t j = 0; j < d; j++) {
    double tj = kern_math_label(t, cls, j);
    loss += tj * (lse - z[j]);
    tsum += tj;
  }
  if (g)
    for (int64_t j = 0; j < d; j++)
      g[j] = (float)((exp(z[j] - lse) * tsum - kern_math_label(t, cls, j)) * s);
  return loss;
}

/* Keras categorical_crossentropy on probabilities: p normalised by its row
 * sum, clipped to [eps, 1-eps] (no gradient where clipped), -sum t log q;
 * dq_k/dp_m = (delta_km - q_k) / S. */
KERN_MATH double kern_math_cce_probs_row(const float *p, const float *t,
                                         int64_t cls, int64_t d, float s,
                                         float *g) {
  double S = 0, loss = 0, gq = 0;
  for (int64_t j = 0; j < d; j++) S += p[j];
  for (int64_t j = 0; j < d; j++) {
    double tj = kern_math_label(t, cls, j);
    double q = p[j] / S;
    bool clipped = q < KERN_KERAS_EPS || q > 1.0 - KERN_KERAS_EPS;
    loss -= tj * log(kern_math_clip_eps(q));
    double dq = clipped ? 0.0 : -tj / q; /* dL/dq_j */
    if (g) g[j] = (float)dq;
    gq += dq * q;
  }
  if (g)
    for (int64_t j = 0; j < d; j++) g[j] = (float)((g[j] - gq) / S * s);
  return loss;
}

/* The loss of one row of any kind (t NULL and cls for the sparse kinds);
 * 0 for an unknown kind (the front end refuses those). */
/* Keras huber: 0.5 e^2 for |e| <= delta, else delta (|e| - delta/2); the
 * mean over the row. */
KERN_MATH double kern_math_huber_row(const float *p, const float *t,
                                     int64_t d, float delta, float s,
                                     float *g) {
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    double e = (double)p[j] - t[j], a = fabs(e);
    L += a <= delta ? 0.5 * e * e : delta * (a - 0.5 * delta);
    if (g)
      g[j] = (float)((a <= delta ? e : e > 0 ? delta : -delta) / (double)d *
                     s);
  }
  return L / (double)d;
}

/* Keras kl_divergence: labels and predictions clipped to [eps, 1],
 * sum t log(t / p); no gradient where the prediction is clipped. */
KERN_MATH double kern_math_kld_row(const float *p, const float *t, int64_t d,
                                   float s, float *g) {
  double L = 0;
  for (int64_t j = 0; j < d; j++) {
    double tj = t[j], q = p[j];
    double tc = tj < KERN_KERAS_EPS ? KERN_KERAS_EPS : tj > 1 ? 1 : tj;
    bool clipped = q < KERN_KERAS_EPS || q > 1;
    double qc = q < KERN_KERAS_EPS ? KERN_KERAS_EPS : q > 1 ? 1 : q;
    L += tc * log(tc / qc);
    if (g) g[j] = clipped ? 0.0f : (float)(-tc / q * s);
  }
  return L;
}

KERN_MATH double kern_math_loss_row(kern_loss kind, const float *p,
                                    const float *t, int64_t cls, int64_t d,
                                    float s, float *g) {
  switch (kind) {
    case KERN_LOSS_MSE: return kern_math_mse_row(p, t, d, s, g);
    case KERN_LOSS_MAE: return kern_math_mae_row(p, t, d, s, g);
    case KERN_LOSS_BCE_LOGITS: return kern_math_bce_logits_row(p, t, d, s, g);
    case KERN_LOSS_BCE_PROBS: return kern_math_bce_probs_row(p, t, d, s, g);
    case KERN_LOSS_CCE_LOGITS:
    case KERN_LOSS_SPARSE_CCE_LOGITS:
      return kern_math_cce_logits_row(p, t, cls, d, s, g);
    case KERN_LOSS_CCE_PROBS:
    case KERN_LOSS_SPARSE_CCE_PROBS:
      return kern_math_cce_probs_row(p, t, cls, d, s, g);
    case KERN_LOSS_HUBER: return kern_math_huber_row(p, t, d, 1.0f, s, g);
    case KERN_LOSS_KLD: return kern_math_kld_row(p, t, d, s, g);
    default: return 0;
  }
}

/* kern_math_loss_row with the loss's parameter (huber's delta). */
KERN_MATH double kern_math_loss_row_p(kern_loss kind, float param,
                                      const float *p, const float *t,
                                      int64_t cls, int64_t d, float s,
                                      float *g) {
  if (kind == KERN_LOSS_HUBER)
    return kern_math_huber_row(p, t, d, param > 0 ? param : 1.0f, s, g);
  return kern_math_loss_row(kind, p, t, cls, d, s, g);
}

KERN_MATH bool kern_math_loss_sparse(kern_loss kind) {
  return kind == KERN_LOSS_SPARSE_CCE_LOGITS ||
         kind == KERN_LOSS_SPARSE_CCE_PROBS;
}

/* ---- 16-bit rounding --------------------------------------------------------
 * Round to nearest even, as __float2bfloat16_rn / __float2half_rn do: the
 * CPU emulates 16-bit products by multiplying rounded inputs, the GPU
 * stores the same bits for cuBLAS, so both see identical inputs. bf16
 * overflows to inf by carrying into the exponent; fp16 overflows to inf
 * from 65520 on and keeps subnormals (quantum 2^-24). NaN stays NaN. */

KERN_MATH uint32_t kern_math_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
KERN_MATH float kern_math_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

KERN_MATH float kern_math_round_bf16(float f) {
  uint32_t u = kern_math_f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return f; /* inf, nan */
  u += 0x7fffu + ((u >> 16) & 1u);
  return kern_math_f32_from_bits(u & 0xffff0000u);
}

KERN_MATH float kern_math_round_f16(float f) {
  float a = fabsf(f);
  if (!(a < INFINITY)) return f;
  if (a >= 65520.0f) return copysignf(INFINITY, f);
  if (a < 6.103515625e-05f) /* half subnormals: a quantum of 2^-24 */
    return rintf(f * 16777216.0f) * (1.0f / 16777216.0f);
  uint32_t u = kern_math_f32_bits(f);
  u += 0xfffu + ((u >> 13) & 1u);
  return kern_math_f32_from_bits(u & ~0x1fffu);
}

KERN_MATH float kern_math_round(kern_prec p, float f) {
  return p == KERN_BF16 ? kern_math_round_bf16(f)
         : p == KERN_F16 ? kern_math_round_f16(f)
                         : f;
}

/* The storage bits of the rounded value (what cuBLAS reads as CUDA_R_16BF
 * and CUDA_R_16F). A NaN becomes a quiet NaN of the same sign. */
KERN_MATH uint16_t kern_math_bf16_bits(float f) {
  uint32_t u = kern_math_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)(kern_math_f32_bits(kern_math_round_bf16(f)) >> 16);
}

KERN_MATH uint16_t kern_math_f16_bits(float f) {
  uint32_t u = kern_math_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  float h = kern_math_round_f16(f);
  float a = fabsf(h);
  if (a == INFINITY) return (uint16_t)(sign | 0x7c00u);
  if (a < 6.103515625e-05f) /* subnormal: the count of 2^-24 quanta */
    return (uint16_t)(sign | (uint16_t)(a * 16777216.0f));
  uint32_t r = kern_math_f32_bits(h);
  uint32_t e = ((r >> 23) & 0xffu) - 127u + 15u;
  return (uint16_t)(sign | (e << 10) | ((r >> 13) & 0x3ffu));
}

/* ---- windows, normalization, regularizers (kern_nn.h) -----------------------
 * The rows [*lo, *hi) of an input of size n that output o's window covers
 * (k wide, stride s, padding p before the input): padding is clipped. */
KERN_MATH void kern_math_window(int64_t o, int64_t s, int64_t p, int64_t k,
                                int64_t n, int64_t *lo, int64_t *hi) {
  int64_t a = o * s - p;
  *lo = a < 0 ? 0 : a;
  *hi = a + k > n ? n : a + k;
}
/* Batch/layer normalization: y = (x - mean) * scale + beta with scale =
 * gamma / sqrt(var + eps) (gamma 1 when the layer does not scale). */
KERN_MATH float kern_math_norm_scale(float gamma, float var, float eps) {
  return gamma / sqrtf(var + eps);
}
KERN_MATH float kern_math_norm_apply(float x, float mean, float scale,
                                     float beta) {
  return (x - mean) * scale + beta;
}
/* The input gradient of a normalization over m values given xh (the
 * normalized input), g = dy * gamma, and the means over the m values of g
 * (mg) and of g * xh (mgx): rstd * (g - mg - xh * mgx). Batch
 * normalization passes gamma * rstd as rstd and dy as g. */
KERN_MATH float kern_math_norm_dx(float g, float xh, float mg, float mgx,
                                  float rstd) {
  return rstd * (g - mg - xh * mgx);
}
/* l1 * |w| + l2 * w^2's gradient as a1 * sign(w) + a2 * w (sign(0) = 0). */
KERN_MATH float kern_math_l1l2_grad(float w, float a1, float a2) {
  return a1 * (float)((w > 0) - (w < 0)) + a2 * w;
}

/* ---- dropout ----------------------------------------------------------------
 * Inverted dropout from a counter-based draw keyed by (seed, element), so a
 * step gives the same mask on either backend, whatever the launch. */
KERN_MATH uint32_t kern_math_hash32(uint64_t seed, uint64_t i) {
  uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}
/* rate in [0, 1): an element is dropped when its draw is below this */
KERN_MATH uint32_t kern_math_dropout_threshold(float rate) {
  return (uint32_t)((double)rate * 4294967296.0);
}
KERN_MATH float kern_math_dropout_keep(float rate) {
  return 1.0f / (1.0f - rate);
}
KERN_MATH float kern_math_dropout_mask(uint64_t seed, uint64_t i,
                                       uint32_t threshold, float keep) {
  return kern_math_hash32(seed, i) >= threshold ? keep : 0.0f;
}

#endif
