/* The per-element math of kern_seq.h's recurrent cells and attention
 * softmax, written once for both backends (the CPU loops of
 * kernels/cpu/cpu_seq.c and the CUDA kernels of kernels/cuda/seq.cu keep
 * only their indexing). One call handles unit j of row b; every function is
 * pure and touches only that unit's entries. Under nvcc __host__
 * __device__ (kern_math.h's KERN_MATH).
 */
#ifndef TSR_KERN_SEQ_MATH_H
#define TSR_KERN_SEQ_MATH_H

#include "kernels/kern_math.h"

#define KERN_MASK_ADD (-1e9f) /* Keras's large negative for float32 */

/* LSTM unit j of one row: g[4u] pre-activations in, activated gates out. */
KERN_MATH void kern_seq_lstm(int64_t u, int64_t j, float *g, float c_prev,
                             float h_prev, float keep, float *c, float *h) {
  float i = kern_math_sigmoid(g[j]);
  float f = kern_math_sigmoid(g[u + j]);
  float gg = tanhf(g[2 * u + j]);
  float o = kern_math_sigmoid(g[3 * u + j]);
  g[j] = i;
  g[u + j] = f;
  g[2 * u + j] = gg;
  g[3 * u + j] = o;
  if (keep == 0.0f) {
    *c = c_prev;
    *h = h_prev;
    return;
  }
  float cn = f * c_prev + i * gg;
  *c = cn;
  *h = o * tanhf(cn);
}

/* Its backward for unit j: *dh in (later steps + output), out the direct
 * part of h_prev's gradient (0; the caller adds dg U^T); *dc in / out. */
KERN_MATH void kern_seq_lstm_grad(int64_t u, int64_t j, const float *g,
                                  float c_prev, float c, float keep,
                                  float *dh, float *dc, float *dg) {
  if (keep == 0.0f) {
    dg[j] = dg[u + j] = dg[2 * u + j] = dg[3 * u + j] = 0.0f;
    return;
  }
  float i = g[j], f = g[u + j], gg = g[2 * u + j], o = g[3 * u + j];
  float tc = tanhf(c);
  float d = *dh;
  float dcn = *dc + d * o * (1.0f - tc * tc);
  dg[3 * u + j] = d * tc * o * (1.0f - o);
  dg[j] = dcn * gg * i * (1.0f - i);
  dg[u + j] = dcn * c_prev * f * (1.0f - f);
  dg[2 * u + j] = dcn * i * (1.0f - gg * gg);
  *dc = dcn * f;
  *dh = 0.0f;
}

/* GRU (reset_after) unit j: xg[3u] = x W + b_in in, [z, r, hh] out;
 * rg[3u] = h_prev U + b_rec. */
KERN_MATH float kern_seq_gru(int64_t u, int64_t j, float *xg, const float *rg,
                             float h_prev, float keep) {
  float z = kern_math_sigmoid(xg[j] + rg[j]);
  float r = kern_math_sigmoid(xg[u + j] + rg[u + j]);
  float hh = tanhf(xg[2 * u + j] + r * rg[2 * u + j]);
  xg[j] = z;
  xg[u + j] = r;
  xg[2 * u + j] = hh;
  return keep == 0.0f ? h_prev : z * h_prev + (1.0f - z) * hh;
}

/* Its backward for unit j: *dh in, out the direct part (z dh). */
KERN_MATH void kern_seq_gru_grad(int64_t u, int64_t j, const float *xg,
                                 const float *rg, float h_prev, float keep,
                                 float *dh, float *dxg, float *drg) {
  if (keep == 0.0f) {
    dxg[j] = dxg[u + j] = dxg[2 * u + j] = 0.0f;
    drg[j] = drg[u + j] = drg[2 * u + j] = 0.0f;
    return;
  }
  float z = xg[j], r = xg[u + j], hh = xg[2 * u + j];
  float d = *dh;
  float dz = d * (h_prev - hh) * z * (1.0f - z);
  float dah = d * (1.0f - z) * (1.0f - hh * hh);
  float dr = dah * rg[2 * u + j] * r * (1.0f - r);
  dxg[j] = dz;
  dxg[u + j] = dr;
  dxg[2 * u + j] = dah;
  drg[j] = dz;
  drg[u + j] = dr;
  drg[2 * u + j] = dah * r;
  *dh = d * z;
}

/* Attention logit: scale * s plus Keras's adder where masked. */
KERN_MATH float kern_seq_attn_logit(float s, float scale, float qm,
                                    float km) {
  float v = scale * s;
  if (qm == 0.0f || km == 0.0f) v += KERN_MASK_ADD;
  return v;
}

#endif
