/* CPU backend of kern_seq.h: the recurrent cells as loops over rows and
 * units around kern_seq_math.h's formulas, layout changes as runs of
 * memcpy, batched products as one cblas_sgemm per matrix (the mapping of
 * kern_plan.h, as kern_gemm), the masked attention softmax and the masked
 * mean with float64 sums where rows are long. Nothing here fails beyond
 * sizes BLAS cannot take (checked by kern_seq.c).
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_plan.h"
#include "kernels/kern_seq_int.h"
#include "kernels/kern_seq_math.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

static int cpu_to_steps(void *impl, int64_t n, int64_t T, int64_t d,
                        const float *x, bool reverse, float beta,
                        float *out) {
  (void)impl;
  for (int64_t s = 0; s < T; s++) {
    int64_t t = reverse ? T - 1 - s : s;
    for (int64_t b = 0; b < n; b++) {
      const float *src = x + (b * T + t) * d;
      float *dst = out + (s * n + b) * d;
      if (beta == 0.0f)
        memcpy(dst, src, (size_t)d * sizeof *dst);
      else
        for (int64_t j = 0; j < d; j++) dst[j] += src[j];
    }
  }
  return 0;
}

static int cpu_from_steps(void *impl, int64_t n, int64_t T, int64_t d,
                          const float *in, bool reverse, const float *m,
                          float beta, float *y) {
  (void)impl;
  for (int64_t s = 0; s < T; s++) {
    int64_t t = reverse ? T - 1 - s : s;
    for (int64_t b = 0; b < n; b++) {
      const float *src = in + (s * n + b) * d;
      float *dst = y + (b * T + t) * d;
      float k = m ? m[s * n + b] : 1.0f;
      if (beta == 0.0f && k == 1.0f) {
        if (dst != src) memcpy(dst, src, (size_t)d * sizeof *dst);
      }
      else if (beta == 0.0f)
        for (int64_t j = 0; j < d; j++) dst[j] = src[j] * k;
      else
        for (int64_t j = 0; j < d; j++) dst[j] += src[j] * k;
    }
  }
  return 0;
}

static int cpu_lstm(void *impl, int64_t n, int64_t u, float *g,
                    const float *c_prev, const float *h_prev, const float *m,
                    float *c, float *h) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float keep = m ? m[b] : 1.0f;
    float *gb = g + b * 4 * u;
    for (int64_t j = 0; j < u; j++) {
      int64_t i = b * u + j;
      kern_seq_lstm(u, j, gb, c_prev[i], h_prev[i], keep, &c[i], &h[i]);
    }
  }
  return 0;
}

static int cpu_lstm_grad(void *impl, int64_t n, int64_t u, const float *g,
                         const float *c_prev, const float *c, const float *m,
                         const float *dh_out, float *dh, float *dc,
                         float *dg) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float keep = m ? m[b] : 1.0f;
    for (int64_t j = 0; j < u; j++) {
      int64_t i = b * u + j;
      if (dh_out) dh[i] += dh_out[i];
      kern_seq_lstm_grad(u, j, g + b * 4 * u, c_prev[i], c[i], keep, &dh[i],
                         &dc[i], dg + b * 4 * u);
    }
  }
  return 0;
}

static int cpu_gru(void *impl, int64_t n, int64_t u, float *xg,
                   const float *rg, const float *h_prev, const float *m,
                   float *h) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float keep = m ? m[b] : 1.0f;
    for (int64_t j = 0; j < u; j++)
      h[b * u + j] = kern_seq_gru(u, j, xg + b * 3 * u, rg + b * 3 * u,
                                  h_prev[b * u + j], keep);
  }
  return 0;
}

static int cpu_gru_grad(void *impl, int64_t n, int64_t u, const float *xg,
                        const float *rg, const float *h_prev, const float *m,
                        const float *dh_out, float *dh, float *dxg,
                        float *drg) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float keep = m ? m[b] : 1.0f;
    for (int64_t j = 0; j < u; j++) {
      int64_t i = b * u + j;
      if (dh_out) dh[i] += dh_out[i];
      kern_seq_gru_grad(u, j, xg + b * 3 * u, rg + b * 3 * u, h_prev[i], keep,
                        &dh[i], dxg + b * 3 * u, drg + b * 3 * u);
    }
  }
  return 0;
}

static int cpu_gemm_batched(void *impl, bool ta, bool tb, int64_t m,
                            int64_t n, int64_t k, float alpha, const float *A,
                            int64_t sa, const float *B, int64_t sb,
                            float beta, float *C, int64_t sc, int64_t batch) {
  kern_gemm_args g;
  if (kern_plan_gemm(ta, tb, m, n, k, &g))
    return kern__cpu_fail(impl, TSR_ERANGE, "batched gemm %lld x %lld x "
                          "%lld: sizes OpenBLAS cannot take", (long long)m,
                          (long long)n, (long long)k);
  for (int64_t i = 0; i < batch; i++)
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha,
                B + i * sb, g.lda, A + i * sa, g.ldb, beta, C + i * sc, g.ldc);
  return 0;
}

static int cpu_swap12(void *impl, int64_t a, int64_t b, int64_t c, int64_t d,
                      const float *src, float beta, float *dst) {
  (void)impl;
  for (int64_t i = 0; i < a; i++)
    for (int64_t j = 0; j < b; j++)
      for (int64_t k = 0; k < c; k++) {
        const float *s = src + ((i * b + j) * c + k) * d;
        float *o = dst + ((i * c + k) * b + j) * d;
        if (beta == 0.0f)
          memcpy(o, s, (size_t)d * sizeof *o);
        else
          for (int64_t l = 0; l < d; l++) o[l] += s[l];
      }
  return 0;
}

static int cpu_attn_softmax(void *impl, int64_t B, int64_t H, int64_t Tq,
                            int64_t Tk, const float *s, float scale,
                            const float *qm, const float *km, float *p) {
  (void)impl;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t q = 0; q < Tq; q++) {
        int64_t r = ((b * H + h) * Tq + q) * Tk;
        float qv = qm ? qm[b * Tq + q] : 1.0f;
        float mx = -INFINITY;
        for (int64_t k = 0; k < Tk; k++) {
          float v = kern_seq_attn_logit(s[r + k], scale, qv,
                                        km ? km[b * Tk + k] : 1.0f);
          p[r + k] = v;
          mx = v > mx ? v : mx;
        }
        double sum = 0;
        for (int64_t k = 0; k < Tk; k++) {
          p[r + k] = kern_math_softmax_exp(p[r + k], mx);
          sum += p[r + k];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t k = 0; k < Tk; k++) p[r + k] *= inv;
      }
  return 0;
}

static int cpu_attn_softmax_grad(void *impl, int64_t rows, int64_t Tk,
                                 const float *dp, const float *p, float scale,
                                 float *ds) {
  (void)impl;
  for (int64_t r = 0; r < rows; r++) {
    const float *g = dp + r * Tk, *y = p + r * Tk;
    double dot = 0;
    for (int64_t k = 0; k < Tk; k++) dot += (double)g[k] * y[k];
    float fd = (float)dot;
    for (int64_t k = 0; k < Tk; k++)
      ds[r * Tk + k] = scale * kern_math_softmax_grad(g[k], y[k], fd);
  }
  return 0;
}

static int cpu_masked_mean(void *impl, int64_t n, int64_t T, int64_t c,
                           const float *x, const float *m, float *y) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float *yb = y + b * c;
    float cnt = 0;
    memset(yb, 0, (size_t)c * sizeof *yb);
    for (int64_t t = 0; t < T; t++) {
      float k = m[b * T + t];
      cnt += k;
      if (k == 0.0f) continue;
      const float *r = x + (b * T + t) * c;
      for (int64_t j = 0; j < c; j++) yb[j] += r[j] * k;
    }
    for (int64_t j = 0; j < c; j++) yb[j] /= cnt;
  }
  return 0;
}

static int cpu_masked_mean_grad(void *impl, int64_t n, int64_t T, int64_t c,
                                const float *dy, const float *m, float beta,
                                float *dx) {
  (void)impl;
  for (int64_t b = 0; b < n; b++) {
    float cnt = 0;
    for (int64_t t = 0; t < T; t++) cnt += m[b * T + t];
    for (int64_t t = 0; t < T; t++) {
      float k = m[b * T + t] / cnt;
      float *r = dx + (b * T + t) * c;
      const float *d = dy + b * c;
      for (int64_t j = 0; j < c; j++)
        r[j] = (beta == 0.0f ? 0.0f : r[j]) + d[j] * k;
    }
  }
  return 0;
}

const kern__seq_ops kern__cpu_seq_ops = {
    .to_steps = cpu_to_steps,
    .from_steps = cpu_from_steps,
    .lstm = cpu_lstm,
    .lstm_grad = cpu_lstm_grad,
    .gru = cpu_gru,
    .gru_grad = cpu_gru_grad,
    .gemm_batched = cpu_gemm_batched,
    .swap12 = cpu_swap12,
    .attn_softmax = cpu_attn_softmax,
    .attn_softmax_grad = cpu_attn_softmax_grad,
    .masked_mean = cpu_masked_mean,
    .masked_mean_grad = cpu_masked_mean_grad,
};
