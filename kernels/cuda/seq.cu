/* CUDA kernels of kern_seq.h: layout changes (a thread per element), the
 * recurrent cells (a thread per row and unit, kern_seq_math.h's formulas),
 * batched products through cublasGemmStridedBatchedEx (fp32 compute, the
 * arguments of kern_plan_gemm), the masked attention softmax and its
 * gradient (a thread per row, sums in a fixed order) and the masked mean
 * (a thread per example and channel). Results follow
 * kernels/cpu/cpu_seq.c; tests/gpu/gpu_check_seq.c compares them.
 * Failure modes: launch and cuBLAS errors, recorded in the context's
 * message (kern_last_error) and returned as TSR_E* codes.
 */
#include "kernels/cuda/cuda_int.h"
#include "kernels/kern_plan.h"
#include "kernels/kern_seq_int.h"
#include "kernels/kern_seq_math.h"

#include <math.h>

#define TPB 256
#define GRID(n) sq_blocks((size_t)(n)), TPB, 0, c->s
#define LOOP(i, N)                                                        \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (N); \
       i += (size_t)gridDim.x * blockDim.x)

static inline unsigned sq_blocks(size_t n) {
  return kern_plan_stride_blocks(n, TPB);
}

__global__ void k_to_steps(int64_t n, int64_t T, int64_t d, const float *x,
                           bool reverse, float beta, float *out) {
  LOOP(i, (size_t)(n * T * d)) {
    int64_t j = (int64_t)(i % d), b = (int64_t)(i / d) % n;
    int64_t s = (int64_t)(i / (d * n));
    int64_t t = reverse ? T - 1 - s : s;
    float v = x[(b * T + t) * d + j];
    out[i] = beta == 0.0f ? v : out[i] + v;
  }
}

__global__ void k_from_steps(int64_t n, int64_t T, int64_t d,
                             const float *in, bool reverse, const float *m,
                             float beta, float *y) {
  LOOP(i, (size_t)(n * T * d)) {
    int64_t j = (int64_t)(i % d), b = (int64_t)(i / d) % n;
    int64_t s = (int64_t)(i / (d * n));
    int64_t t = reverse ? T - 1 - s : s;
    float v = in[i] * (m ? m[s * n + b] : 1.0f);
    float *o = y + (b * T + t) * d + j;
    *o = beta == 0.0f ? v : *o + v;
  }
}

__global__ void k_lstm(int64_t n, int64_t u, float *g, const float *c_prev,
                       const float *h_prev, const float *m, float *cc,
                       float *h) {
  LOOP(i, (size_t)(n * u)) {
    int64_t b = (int64_t)(i / u), j = (int64_t)(i % u);
    kern_seq_lstm(u, j, g + b * 4 * u, c_prev[i], h_prev[i],
                  m ? m[b] : 1.0f, &cc[i], &h[i]);
  }
}

__global__ void k_lstm_grad(int64_t n, int64_t u, const float *g,
                            const float *c_prev, const float *cc,
                            const float *m, const float *dh_out, float *dh,
                            float *dc, float *dg) {
  LOOP(i, (size_t)(n * u)) {
    int64_t b = (int64_t)(i / u), j = (int64_t)(i % u);
    float d = dh[i] + (dh_out ? dh_out[i] : 0.0f);
    kern_seq_lstm_grad(u, j, g + b * 4 * u, c_prev[i], cc[i],
                       m ? m[b] : 1.0f, &d, &dc[i], dg + b * 4 * u);
    dh[i] = d;
  }
}

__global__ void k_gru(int64_t n, int64_t u, float *xg, const float *rg,
                      const float *h_prev, const float *m, float *h) {
  LOOP(i, (size_t)(n * u)) {
    int64_t b = (int64_t)(i / u), j = (int64_t)(i % u);
    h[i] = kern_seq_gru(u, j, xg + b * 3 * u, rg + b * 3 * u, h_prev[i],
                        m ? m[b] : 1.0f);
  }
}

__global__ void k_gru_grad(int64_t n, int64_t u, const float *xg,
                           const float *rg, const float *h_prev,
                           const float *m, const float *dh_out, float *dh,
                           float *dxg, float *drg) {
  LOOP(i, (size_t)(n * u)) {
    int64_t b = (int64_t)(i / u), j = (int64_t)(i % u);
    float d = dh[i] + (dh_out ? dh_out[i] : 0.0f);
    kern_seq_gru_grad(u, j, xg + b * 3 * u, rg + b * 3 * u, h_prev[i],
                      m ? m[b] : 1.0f, &d, dxg + b * 3 * u, drg + b * 3 * u);
    dh[i] = d;
  }
}

__global__ void k_swap12(int64_t a, int64_t b, int64_t c, int64_t d,
                         const float *src, float beta, float *dst) {
  LOOP(i, (size_t)(a * b * c * d)) {
    int64_t l = (int64_t)(i % d), k = (int64_t)(i / d) % c;
    int64_t j = (int64_t)(i / (d * c)) % b, x = (int64_t)(i / (d * c * b));
    float *o = dst + ((x * c + k) * b + j) * d + l;
    *o = beta == 0.0f ? src[i] : *o + src[i];
  }
}

__global__ void k_attn_softmax(int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                               const float *s, float scale, const float *qm,
                               const float *km, float *p) {
  LOOP(row, (size_t)(B * H * Tq)) {
    int64_t q = (int64_t)(row % Tq), b = (int64_t)(row / (Tq * H));
    const float *sr = s + row * Tk;
    float *pr = p + row * Tk;
    float qv = qm ? qm[b * Tq + q] : 1.0f, mx = -INFINITY;
    for (int64_t k = 0; k < Tk; k++) {
      float v = kern_seq_attn_logit(sr[k], scale, qv, km ? km[b * Tk + k] : 1.0f);
      pr[k] = v;
      mx = v > mx ? v : mx;
    }
    double sum = 0;
    for (int64_t k = 0; k < Tk; k++) {
      pr[k] = kern_math_softmax_exp(pr[k], mx);
      sum += pr[k];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t k = 0; k < Tk; k++) pr[k] *= inv;
  }
}

__global__ void k_attn_softmax_grad(int64_t rows, int64_t Tk, const float *dp,
                                    const float *p, float scale, float *ds) {
  LOOP(r, (size_t)rows) {
    const float *g = dp + r * Tk, *y = p + r * Tk;
    double dot = 0;
    for (int64_t k = 0; k < Tk; k++) dot += (double)g[k] * y[k];
    float fd = (float)dot;
    for (int64_t k = 0; k < Tk; k++)
      ds[r * Tk + k] = scale * kern_math_softmax_grad(g[k], y[k], fd);
  }
}

__global__ void k_masked_mean(int64_t n, int64_t T, int64_t c, const float *x,
                              const float *m, float *y) {
  LOOP(i, (size_t)(n * c)) {
    int64_t b = (int64_t)(i / c), j = (int64_t)(i % c);
    float s = 0, cnt = 0;
    for (int64_t t = 0; t < T; t++) {
      float k = m[b * T + t];
      cnt += k;
      if (k != 0.0f) s += x[(b * T + t) * c + j] * k;
    }
    y[i] = s / cnt;
  }
}

__global__ void k_masked_mean_grad(int64_t n, int64_t T, int64_t c,
                                   const float *dy, const float *m,
                                   float beta, float *dx) {
  LOOP(i, (size_t)(n * T * c)) {
    int64_t j = (int64_t)(i % c), t = (int64_t)(i / c) % T;
    int64_t b = (int64_t)(i / (c * T));
    float cnt = 0;
    for (int64_t k = 0; k < T; k++) cnt += m[b * T + k];
    float v = dy[b * c + j] * (m[b * T + t] / cnt);
    dx[i] = beta == 0.0f ? v : dx[i] + v;
  }
}

static int sq_to_steps(void *impl, int64_t n, int64_t T, int64_t d,
                       const float *x, bool reverse, float beta, float *out) {
  C(impl);
  SETDEV(c);
  k_to_steps<<<GRID(n * T * d)>>>(n, T, d, x, reverse, beta, out);
  return kc__launch_check(c, "sequence to steps");
}

static int sq_from_steps(void *impl, int64_t n, int64_t T, int64_t d,
                         const float *in, bool reverse, const float *m,
                         float beta, float *y) {
  C(impl);
  SETDEV(c);
  k_from_steps<<<GRID(n * T * d)>>>(n, T, d, in, reverse, m, beta, y);
  return kc__launch_check(c, "sequence from steps");
}

static int sq_lstm(void *impl, int64_t n, int64_t u, float *g,
                   const float *c_prev, const float *h_prev, const float *m,
                   float *cc, float *h) {
  C(impl);
  SETDEV(c);
  k_lstm<<<GRID(n * u)>>>(n, u, g, c_prev, h_prev, m, cc, h);
  return kc__launch_check(c, "lstm step");
}

static int sq_lstm_grad(void *impl, int64_t n, int64_t u, const float *g,
                        const float *c_prev, const float *cc, const float *m,
                        const float *dh_out, float *dh, float *dc,
                        float *dg) {
  C(impl);
  SETDEV(c);
  k_lstm_grad<<<GRID(n * u)>>>(n, u, g, c_prev, cc, m, dh_out, dh, dc, dg);
  return kc__launch_check(c, "lstm step backward");
}

static int sq_gru(void *impl, int64_t n, int64_t u, float *xg,
                  const float *rg, const float *h_prev, const float *m,
                  float *h) {
  C(impl);
  SETDEV(c);
  k_gru<<<GRID(n * u)>>>(n, u, xg, rg, h_prev, m, h);
  return kc__launch_check(c, "gru step");
}

static int sq_gru_grad(void *impl, int64_t n, int64_t u, const float *xg,
                       const float *rg, const float *h_prev, const float *m,
                       const float *dh_out, float *dh, float *dxg,
                       float *drg) {
  C(impl);
  SETDEV(c);
  k_gru_grad<<<GRID(n * u)>>>(n, u, xg, rg, h_prev, m, dh_out, dh, dxg, drg);
  return kc__launch_check(c, "gru step backward");
}

static int sq_gemm_batched(void *impl, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *A, int64_t sa,
                           const float *B, int64_t sb, float beta, float *Cm,
                           int64_t sc, int64_t batch) {
  C(impl);
  SETDEV(c);
  kern_gemm_args g;
  if (kern_plan_gemm(ta, tb, m, n, k, &g))
    return kc__fail(c, TSR_ERANGE, "batched gemm %lld x %lld x %lld: "
                    "cuBLAS takes sizes up to %d", (long long)m,
                    (long long)n, (long long)k, INT_MAX);
  cublasStatus_t s = cublasGemmStridedBatchedEx(
      c->blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, B,
      CUDA_R_32F, g.lda, sb, A, CUDA_R_32F, g.ldb, sa, &beta, Cm, CUDA_R_32F,
      g.ldc, sc, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char op[160];
  snprintf(op, sizeof op, "cublasGemmStridedBatchedEx (%lld x %lld x %lld, "
           "%lld matrices)", (long long)m, (long long)n, (long long)k,
           (long long)batch);
  return kc__blas_fail(c, s, op);
}

static int sq_swap12(void *impl, int64_t a, int64_t b, int64_t cc, int64_t d,
                     const float *src, float beta, float *dst) {
  C(impl);
  SETDEV(c);
  k_swap12<<<GRID(a * b * cc * d)>>>(a, b, cc, d, src, beta, dst);
  return kc__launch_check(c, "axis swap");
}

static int sq_attn_softmax(void *impl, int64_t B, int64_t H, int64_t Tq,
                           int64_t Tk, const float *s, float scale,
                           const float *qm, const float *km, float *p) {
  C(impl);
  SETDEV(c);
  k_attn_softmax<<<GRID(B * H * Tq)>>>(B, H, Tq, Tk, s, scale, qm, km, p);
  return kc__launch_check(c, "attention softmax");
}

static int sq_attn_softmax_grad(void *impl, int64_t rows, int64_t Tk,
                                const float *dp, const float *p, float scale,
                                float *ds) {
  C(impl);
  SETDEV(c);
  k_attn_softmax_grad<<<GRID(rows)>>>(rows, Tk, dp, p, scale, ds);
  return kc__launch_check(c, "attention softmax backward");
}

static int sq_masked_mean(void *impl, int64_t n, int64_t T, int64_t ch,
                          const float *x, const float *m, float *y) {
  C(impl);
  SETDEV(c);
  k_masked_mean<<<GRID(n * ch)>>>(n, T, ch, x, m, y);
  return kc__launch_check(c, "masked mean");
}

static int sq_masked_mean_grad(void *impl, int64_t n, int64_t T, int64_t ch,
                               const float *dy, const float *m, float beta,
                               float *dx) {
  C(impl);
  SETDEV(c);
  k_masked_mean_grad<<<GRID(n * T * ch)>>>(n, T, ch, dy, m, beta, dx);
  return kc__launch_check(c, "masked mean backward");
}

extern "C" const kern__seq_ops kc__seq_ops = {
    sq_to_steps,      sq_from_steps,        sq_lstm,        sq_lstm_grad,
    sq_gru,           sq_gru_grad,          sq_gemm_batched, sq_swap12,
    sq_attn_softmax,  sq_attn_softmax_grad, sq_masked_mean, sq_masked_mean_grad};
