/* CUDA kernels of kern_nn.h: im2col (a thread per column entry) and
 * col2im (a thread per image element summing the entries copied from it,
 * so no atomics), 2-D pooling forward (a thread per output) and backward
 * (a thread per input element over the windows that cover it), global
 * average pooling, batch normalization (a block per channel reducing in
 * float64, then an elementwise pass), layer normalization (a block per
 * row; its gamma/beta gradients a thread per column over the rows),
 * strided column copies, the l1/l2 gradient; the element-wise formulas
 * and window clipping are kern_math.h's. Every sum runs in a fixed
 * order, so results do not change between runs; the formulas follow
 * kernels/cpu/cpu_nn.c. Failure modes: launch errors and scratch
 * allocation, recorded in the context's message (kern_last_error) and
 * returned as TSR_E* codes.
 */
#include "kernels/cuda/cuda_int.h"
#include "kernels/kern_math.h"
#include "kernels/kern_nn_int.h"

#include <math.h>

#define TPB 256
#define GRID(n) nn_blocks((size_t)(n)), TPB, 0, c->s
#define LOOP(i, N)                                                        \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (N); \
       i += (size_t)gridDim.x * blockDim.x)

static inline unsigned nn_blocks(size_t n) {
  size_t b = (n + TPB - 1) / TPB;
  return (unsigned)(b > 65535 * 8 ? 65535 * 8 : (b ? b : 1));
}

__global__ void k_im2col(kern_win g, int64_t n, const float *x, float *cols) {
  int64_t K = g.kh * g.kw * g.c;
  size_t N = (size_t)(n * g.oh * g.ow * K);
  LOOP(i, N) {
    int64_t r = (int64_t)(i / K), k = (int64_t)(i % K);
    int64_t ci = k % g.c, kx = (k / g.c) % g.kw, ky = k / (g.c * g.kw);
    int64_t ox = r % g.ow, oy = (r / g.ow) % g.oh, b = r / (g.ow * g.oh);
    int64_t iy = oy * g.sh - g.pt + ky, ix = ox * g.sw - g.pl + kx;
    cols[i] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                  ? x[((b * g.h + iy) * g.w + ix) * g.c + ci]
                  : 0.0f;
  }
}

__global__ void k_col2im(kern_win g, int64_t n, const float *cols,
                         float beta, float *dx) {
  int64_t K = g.kh * g.kw * g.c;
  size_t N = (size_t)(n * g.h * g.w * g.c);
  LOOP(i, N) {
    int64_t ci = (int64_t)(i % g.c), ix = (int64_t)(i / g.c) % g.w;
    int64_t iy = (int64_t)(i / (g.c * g.w)) % g.h;
    int64_t b = (int64_t)(i / (g.c * g.w * g.h));
    float s = 0;
    for (int64_t ky = 0; ky < g.kh; ky++) {
      int64_t ty = iy + g.pt - ky;
      if (ty < 0 || ty % g.sh) continue;
      int64_t oy = ty / g.sh;
      if (oy >= g.oh) continue;
      for (int64_t kx = 0; kx < g.kw; kx++) {
        int64_t tx = ix + g.pl - kx;
        if (tx < 0 || tx % g.sw) continue;
        int64_t ox = tx / g.sw;
        if (ox >= g.ow) continue;
        s += cols[((b * g.oh + oy) * g.ow + ox) * K + (ky * g.kw + kx) * g.c +
                  ci];
      }
    }
    dx[i] = beta == 0.0f ? s : dx[i] + s;
  }
}

__global__ void k_pool_fwd(kern_win g, int64_t n, kern_pool2d kind,
                           const float *x, float *y, int32_t *arg) {
  size_t N = (size_t)(n * g.oh * g.ow * g.c);
  LOOP(i, N) {
    int64_t ch = (int64_t)(i % g.c), ox = (int64_t)(i / g.c) % g.ow;
    int64_t oy = (int64_t)(i / (g.c * g.ow)) % g.oh;
    int64_t b = (int64_t)(i / (g.c * g.ow * g.oh));
    const float *xb = x + b * g.h * g.w * g.c;
    int64_t ya, yb, xa, xe;
    kern_math_window(oy, g.sh, g.pt, g.kh, g.h, &ya, &yb);
    kern_math_window(ox, g.sw, g.pl, g.kw, g.w, &xa, &xe);
    int64_t at = (ya * g.w + xa) * g.c + ch;
    float v = xb[at];
    for (int64_t iy = ya; iy < yb; iy++)
      for (int64_t ix = xa; ix < xe; ix++) {
        int64_t j = (iy * g.w + ix) * g.c + ch;
        if (j == (ya * g.w + xa) * g.c + ch) continue;
        if (kind == KERN_POOL2D_AVG) {
          v += xb[j];
        } else if (xb[j] > v) {
          v = xb[j];
          at = j;
        }
      }
    if (kind == KERN_POOL2D_AVG) v *= 1.0f / (float)((yb - ya) * (xe - xa));
    y[i] = v;
    if (arg) arg[i] = (int32_t)at;
  }
}

__global__ void k_pool_grad(kern_win g, int64_t n, kern_pool2d kind,
                            const float *dy, const int32_t *arg, float beta,
                            float *dx) {
  size_t N = (size_t)(n * g.h * g.w * g.c);
  LOOP(i, N) {
    int64_t ch = (int64_t)(i % g.c), ix = (int64_t)(i / g.c) % g.w;
    int64_t iy = (int64_t)(i / (g.c * g.w)) % g.h;
    int64_t b = (int64_t)(i / (g.c * g.w * g.h));
    int64_t self = (iy * g.w + ix) * g.c + ch;
    /* outputs whose window covers (iy, ix) */
    int64_t oy0 = iy + g.pt - g.kh + 1, ox0 = ix + g.pl - g.kw + 1;
    oy0 = oy0 <= 0 ? 0 : (oy0 + g.sh - 1) / g.sh;
    ox0 = ox0 <= 0 ? 0 : (ox0 + g.sw - 1) / g.sw;
    float s = 0;
    for (int64_t oy = oy0; oy < g.oh && oy * g.sh - g.pt <= iy; oy++)
      for (int64_t ox = ox0; ox < g.ow && ox * g.sw - g.pl <= ix; ox++) {
        int64_t o = ((b * g.oh + oy) * g.ow + ox) * g.c + ch;
        if (kind == KERN_POOL2D_MAX) {
          if (arg[o] == self) s += dy[o];
        } else {
          int64_t ya, yb, xa, xe;
          kern_math_window(oy, g.sh, g.pt, g.kh, g.h, &ya, &yb);
          kern_math_window(ox, g.sw, g.pl, g.kw, g.w, &xa, &xe);
          s += dy[o] * (1.0f / (float)((yb - ya) * (xe - xa)));
        }
      }
    dx[i] = beta == 0.0f ? s : dx[i] + s;
  }
}

__global__ void k_mean_mid(const float *x, int64_t n, int64_t p, int64_t c,
                           float *y) {
  LOOP(i, (size_t)(n * c)) {
    int64_t b = (int64_t)(i / c), ch = (int64_t)(i % c);
    float s = 0;
    for (int64_t k = 0; k < p; k++) s += x[(b * p + k) * c + ch];
    y[i] = s * (1.0f / (float)p);
  }
}

__global__ void k_mean_mid_grad(const float *dy, int64_t n, int64_t p,
                                int64_t c, float beta, float *dx) {
  LOOP(i, (size_t)(n * p * c)) {
    int64_t ch = (int64_t)(i % c), b = (int64_t)(i / (p * c));
    float v = dy[b * c + ch] * (1.0f / (float)p);
    dx[i] = beta == 0.0f ? v : dx[i] + v;
  }
}

/* block-wide sum of a double (every thread gets the total) */
__device__ double block_sum(double v) {
  __shared__ double sh[TPB];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = TPB / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  double t = sh[0];
  __syncthreads();
  return t;
}

/* a block per channel */
__global__ void k_moments(const float *x, int64_t rows, int64_t c,
                          float *mean, float *var) {
  int64_t ch = blockIdx.x;
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += TPB) s += x[r * c + ch];
  double mu = block_sum(s) / (double)rows;
  double q = 0;
  for (int64_t r = threadIdx.x; r < rows; r += TPB) {
    double d = x[r * c + ch] - mu;
    q += d * d;
  }
  q = block_sum(q);
  if (threadIdx.x == 0) {
    mean[ch] = (float)mu;
    var[ch] = (float)(q / (double)rows);
  }
}

__global__ void k_bn_apply(const float *x, int64_t rows, int64_t c,
                           const float *mean, const float *var, float eps,
                           const float *gamma, const float *beta, float *y) {
  LOOP(i, (size_t)(rows * c)) {
    int64_t ch = (int64_t)(i % c);
    float sc = kern_math_norm_scale(gamma ? gamma[ch] : 1.0f, var[ch], eps);
    y[i] = kern_math_norm_apply(x[i], mean[ch], sc, beta ? beta[ch] : 0.0f);
  }
}

/* a block per channel: sum(dy), sum(dy * xh); their means to st */
__global__ void k_bn_sums(const float *dy, const float *x, int64_t rows,
                          int64_t c, const float *mean, const float *var,
                          float eps, float *dgamma, float *dbeta, float *st) {
  int64_t ch = blockIdx.x;
  float inv = kern_math_norm_scale(1.0f, var[ch], eps);
  double s = 0, sx = 0;
  for (int64_t r = threadIdx.x; r < rows; r += TPB) {
    float d = dy[r * c + ch];
    s += d;
    sx += (double)d * ((x[r * c + ch] - mean[ch]) * inv);
  }
  s = block_sum(s);
  sx = block_sum(sx);
  if (threadIdx.x == 0) {
    if (dgamma) dgamma[ch] = (float)sx;
    if (dbeta) dbeta[ch] = (float)s;
    st[ch] = (float)(s / (double)rows);
    st[c + ch] = (float)(sx / (double)rows);
  }
}

__global__ void k_bn_dx(const float *dy, const float *x, int64_t rows,
                        int64_t c, const float *mean, const float *var,
                        float eps, const float *gamma, const float *st,
                        float beta_dx, float *dx) {
  LOOP(i, (size_t)(rows * c)) {
    int64_t ch = (int64_t)(i % c);
    float inv = kern_math_norm_scale(1.0f, var[ch], eps);
    float xh = (x[i] - mean[ch]) * inv;
    float v = kern_math_norm_dx(dy[i], xh, st[ch], st[c + ch],
                                (gamma ? gamma[ch] : 1.0f) * inv);
    dx[i] = beta_dx == 0.0f ? v : dx[i] + v;
  }
}

/* a block per row */
__global__ void k_ln_fwd(const float *x, int64_t d, float eps,
                         const float *gamma, const float *beta, float *y,
                         float *mean, float *rstd) {
  int64_t r = blockIdx.x;
  const float *xr = x + r * d;
  double s = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) s += xr[j];
  double mu = block_sum(s) / (double)d;
  double q = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) {
    double t = xr[j] - mu;
    q += t * t;
  }
  q = block_sum(q);
  float m = (float)mu, rs = (float)(1.0 / sqrt(q / (double)d + eps));
  if (threadIdx.x == 0) {
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < d; j += TPB)
    y[r * d + j] = kern_math_norm_apply(xr[j], m,
                                        rs * (gamma ? gamma[j] : 1.0f),
                                        beta ? beta[j] : 0.0f);
}

__global__ void k_ln_dx(const float *dy, const float *x, int64_t d,
                        const float *mean, const float *rstd,
                        const float *gamma, float beta_dx, float *dx) {
  int64_t r = blockIdx.x;
  const float *xr = x + r * d, *dr = dy + r * d;
  double sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) {
    float xh = (xr[j] - mean[r]) * rstd[r];
    float gj = dr[j] * (gamma ? gamma[j] : 1.0f);
    sg += gj;
    sgx += (double)gj * xh;
  }
  sg = block_sum(sg);
  sgx = block_sum(sgx);
  float mg = (float)(sg / (double)d), mgx = (float)(sgx / (double)d);
  for (int64_t j = threadIdx.x; j < d; j += TPB) {
    float xh = (xr[j] - mean[r]) * rstd[r];
    float gj = dr[j] * (gamma ? gamma[j] : 1.0f);
    float v = kern_math_norm_dx(gj, xh, mg, mgx, rstd[r]);
    dx[r * d + j] = beta_dx == 0.0f ? v : dx[r * d + j] + v;
  }
}

/* a thread per column over the rows */
__global__ void k_ln_params(const float *dy, const float *x, int64_t rows,
                            int64_t d, const float *mean, const float *rstd,
                            float *dgamma, float *dbeta) {
  LOOP(j, (size_t)d) {
    double a = 0, b = 0;
    for (int64_t r = 0; r < rows; r++) {
      float g = dy[r * d + j];
      a += (double)g * ((x[r * d + j] - mean[r]) * rstd[r]);
      b += g;
    }
    if (dgamma) dgamma[j] = (float)a;
    if (dbeta) dbeta[j] = (float)b;
  }
}

__global__ void k_copy_cols(int64_t rows, int64_t w, const float *src,
                            int64_t ss, int64_t so, float beta, float *dst,
                            int64_t ds, int64_t doff) {
  LOOP(i, (size_t)(rows * w)) {
    int64_t r = (int64_t)(i / w), j = (int64_t)(i % w);
    float v = src[r * ss + so + j];
    float *d = dst + r * ds + doff + j;
    *d = beta == 0.0f ? v : *d + v;
  }
}

__global__ void k_l1l2(const float *w, size_t n, float a1, float a2,
                       float *g) {
  LOOP(i, n) g[i] += kern_math_l1l2_grad(w[i], a1, a2);
}

/* ---- the table -----------------------------------------------------------*/

static int nn_im2col(void *impl, const kern_win *g, int64_t n, const float *x,
                     float *cols) {
  C(impl);
  SETDEV(c);
  k_im2col<<<GRID(n * g->oh * g->ow * g->kh * g->kw * g->c)>>>(*g, n, x,
                                                                cols);
  return kc__launch_check(c, "im2col");
}

static int nn_col2im(void *impl, const kern_win *g, int64_t n,
                     const float *cols, float beta, float *dx) {
  C(impl);
  SETDEV(c);
  k_col2im<<<GRID(n * g->h * g->w * g->c)>>>(*g, n, cols, beta, dx);
  return kc__launch_check(c, "col2im");
}

static int nn_pool_fwd(void *impl, const kern_win *g, int64_t n,
                       kern_pool2d kind, const float *x, float *y,
                       int32_t *arg) {
  C(impl);
  SETDEV(c);
  k_pool_fwd<<<GRID(n * g->oh * g->ow * g->c)>>>(*g, n, kind, x, y, arg);
  return kc__launch_check(c, "pool2d");
}

static int nn_pool_grad(void *impl, const kern_win *g, int64_t n,
                        kern_pool2d kind, const float *dy, const int32_t *arg,
                        float beta, float *dx) {
  C(impl);
  SETDEV(c);
  k_pool_grad<<<GRID(n * g->h * g->w * g->c)>>>(*g, n, kind, dy, arg, beta,
                                                 dx);
  return kc__launch_check(c, "pool2d backward");
}

static int nn_mean_mid(void *impl, const float *x, int64_t n, int64_t p,
                       int64_t ch, float *y) {
  C(impl);
  SETDEV(c);
  k_mean_mid<<<GRID(n * ch)>>>(x, n, p, ch, y);
  return kc__launch_check(c, "global average pooling");
}

static int nn_mean_mid_grad(void *impl, const float *dy, int64_t n, int64_t p,
                            int64_t ch, float beta, float *dx) {
  C(impl);
  SETDEV(c);
  k_mean_mid_grad<<<GRID(n * p * ch)>>>(dy, n, p, ch, beta, dx);
  return kc__launch_check(c, "global average pooling backward");
}

static int nn_moments(void *impl, const float *x, int64_t rows, int64_t ch,
                      float *mean, float *var) {
  C(impl);
  SETDEV(c);
  k_moments<<<(unsigned)ch, TPB, 0, c->s>>>(x, rows, ch, mean, var);
  return kc__launch_check(c, "batch norm moments");
}

static int nn_bn_apply(void *impl, const float *x, int64_t rows, int64_t ch,
                       const float *mean, const float *var, float eps,
                       const float *gamma, const float *beta, float *y) {
  C(impl);
  SETDEV(c);
  k_bn_apply<<<GRID(rows * ch)>>>(x, rows, ch, mean, var, eps, gamma, beta,
                                   y);
  return kc__launch_check(c, "batch norm");
}

static int nn_bn_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t ch, const float *mean,
                      const float *var, float eps, const float *gamma,
                      float beta_dx, float *dx, float *dgamma, float *dbeta) {
  C(impl);
  SETDEV(c);
  int rc = kc__scratch(c, (void **)&c->nn_part, &c->nn_part_n,
                       (size_t)(2 * ch) * sizeof(float),
                       "batch-norm channel sums");
  if (rc) return rc;
  k_bn_sums<<<(unsigned)ch, TPB, 0, c->s>>>(dy, x, rows, ch, mean, var, eps,
                                            dgamma, dbeta, c->nn_part);
  if (dx)
    k_bn_dx<<<GRID(rows * ch)>>>(dy, x, rows, ch, mean, var, eps, gamma,
                                  c->nn_part, beta_dx, dx);
  return kc__launch_check(c, "batch norm backward");
}

static int nn_ln_fwd(void *impl, const float *x, int64_t rows, int64_t d,
                     float eps, const float *gamma, const float *beta,
                     float *y, float *mean, float *rstd) {
  C(impl);
  SETDEV(c);
  k_ln_fwd<<<(unsigned)rows, TPB, 0, c->s>>>(x, d, eps, gamma, beta, y, mean,
                                             rstd);
  return kc__launch_check(c, "layer norm");
}

static int nn_ln_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t d, const float *mean,
                      const float *rstd, const float *gamma, float beta_dx,
                      float *dx, float *dgamma, float *dbeta) {
  C(impl);
  SETDEV(c);
  if (dx)
    k_ln_dx<<<(unsigned)rows, TPB, 0, c->s>>>(dy, x, d, mean, rstd, gamma,
                                              beta_dx, dx);
  if (dgamma || dbeta)
    k_ln_params<<<GRID(d)>>>(dy, x, rows, d, mean, rstd, dgamma, dbeta);
  return kc__launch_check(c, "layer norm backward");
}

static int nn_copy_cols(void *impl, int64_t rows, int64_t w, const float *src,
                        int64_t ss, int64_t so, float beta, float *dst,
                        int64_t ds, int64_t doff) {
  C(impl);
  SETDEV(c);
  k_copy_cols<<<GRID(rows * w)>>>(rows, w, src, ss, so, beta, dst, ds, doff);
  return kc__launch_check(c, "column copy");
}

static int nn_l1l2_grad(void *impl, const float *w, size_t n, float a1,
                        float a2, float *g) {
  C(impl);
  SETDEV(c);
  k_l1l2<<<GRID(n)>>>(w, n, a1, a2, g);
  return kc__launch_check(c, "l1/l2 gradient");
}

extern "C" const kern__nn_ops kc__nn_ops = {
    nn_im2col,    nn_col2im,   nn_pool_fwd,      nn_pool_grad,
    nn_mean_mid,  nn_mean_mid_grad, nn_moments,  nn_bn_apply,
    nn_bn_grad,   nn_ln_fwd,   nn_ln_grad,       nn_copy_cols,
    nn_l1l2_grad,
    /* no direct convolutions: the front end runs im2col and cuBLAS */
    NULL,         NULL,        NULL,             NULL};
