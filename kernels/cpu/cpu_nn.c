/* CPU backend of kern_nn.h: im2col/col2im with one memcpy per run of valid
 * window columns, pooling, global average pooling, batch and layer
 * normalization with float64 sums, strided column copies and the l1/l2
 * gradient. Plain loops over contiguous channels that gcc vectorizes (-O3
 * -fno-math-errno). Failure modes: out of memory for the per-channel
 * float64 sums (TSR_ENOMEM); nothing else fails.
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_math.h"
#include "kernels/kern_nn_int.h"
#include "common/err.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int cpu_im2col(void *impl, const kern_win *g, int64_t n,
                      const float *x, float *cols) {
  (void)impl;
  int64_t K = kern_win_patch(g), C = g->c;
  for (int64_t b = 0; b < n; b++) {
    const float *xb = x + b * g->h * g->w * C;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        float *row = cols + ((b * g->oh + oy) * g->ow + ox) * K;
        int64_t x0 = ox * g->sw - g->pl;
        /* the window's columns that fall inside the image: [k0, k1) */
        int64_t k0 = x0 < 0 ? -x0 : 0;
        int64_t k1 = x0 + g->kw > g->w ? g->w - x0 : g->kw;
        if (k1 < k0) k1 = k0;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          float *r = row + ky * g->kw * C;
          int64_t iy = oy * g->sh - g->pt + ky;
          if (iy < 0 || iy >= g->h) {
            memset(r, 0, (size_t)(g->kw * C) * sizeof *r);
            continue;
          }
          if (k0 > 0) memset(r, 0, (size_t)(k0 * C) * sizeof *r);
          if (k1 > k0)
            memcpy(r + k0 * C, xb + (iy * g->w + x0 + k0) * C,
                   (size_t)((k1 - k0) * C) * sizeof *r);
          if (k1 < g->kw)
            memset(r + k1 * C, 0, (size_t)((g->kw - k1) * C) * sizeof *r);
        }
      }
  }
  return 0;
}

static int cpu_col2im(void *impl, const kern_win *g, int64_t n,
                      const float *cols, float beta, float *dx) {
  (void)impl;
  int64_t K = kern_win_patch(g), C = g->c, img = g->h * g->w * C;
  if (beta == 0.0f) memset(dx, 0, (size_t)(n * img) * sizeof *dx);
  for (int64_t b = 0; b < n; b++) {
    float *db = dx + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        const float *row = cols + ((b * g->oh + oy) * g->ow + ox) * K;
        int64_t x0 = ox * g->sw - g->pl;
        int64_t k0 = x0 < 0 ? -x0 : 0;
        int64_t k1 = x0 + g->kw > g->w ? g->w - x0 : g->kw;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          int64_t iy = oy * g->sh - g->pt + ky;
          if (iy < 0 || iy >= g->h || k1 <= k0) continue;
          const float *r = row + (ky * g->kw + k0) * C;
          float *d = db + (iy * g->w + x0 + k0) * C;
          int64_t len = (k1 - k0) * C;
          for (int64_t i = 0; i < len; i++) d[i] += r[i];
        }
      }
  }
  return 0;
}

/* Channels innermost: every window position updates a contiguous run of
 * channels (vectorized); the first maximum in row-major window order wins,
 * as in TF. */
static int cpu_pool_fwd(void *impl, const kern_win *g, int64_t n,
                        kern_pool2d kind, const float *x, float *y,
                        int32_t *arg) {
  (void)impl;
  int64_t C = g->c, img = g->h * g->w * C;
  for (int64_t b = 0; b < n; b++) {
    const float *xb = x + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t o = ((b * g->oh + oy) * g->ow + ox) * C;
        int64_t ya, yb, xa, xe;
        kern_math_window(oy, g->sh, g->pt, g->kh, g->h, &ya, &yb);
        kern_math_window(ox, g->sw, g->pl, g->kw, g->w, &xa, &xe);
        float *yo = y + o;
        int32_t *ao = arg ? arg + o : NULL;
        int64_t first = (ya * g->w + xa) * C;
        memcpy(yo, xb + first, (size_t)C * sizeof *yo);
        if (ao)
          for (int64_t ch = 0; ch < C; ch++) ao[ch] = (int32_t)(first + ch);
        for (int64_t iy = ya; iy < yb; iy++)
          for (int64_t ix = xa; ix < xe; ix++) {
            int64_t base = (iy * g->w + ix) * C;
            if (base == first) continue;
            const float *xr = xb + base;
            if (kind == KERN_POOL2D_AVG) {
              for (int64_t ch = 0; ch < C; ch++) yo[ch] += xr[ch];
            } else if (ao) {
              for (int64_t ch = 0; ch < C; ch++) {
                bool gt = xr[ch] > yo[ch];
                yo[ch] = gt ? xr[ch] : yo[ch];
                ao[ch] = gt ? (int32_t)(base + ch) : ao[ch];
              }
            } else {
              for (int64_t ch = 0; ch < C; ch++)
                yo[ch] = xr[ch] > yo[ch] ? xr[ch] : yo[ch];
            }
          }
        if (kind == KERN_POOL2D_AVG) {
          float inv = 1.0f / (float)((yb - ya) * (xe - xa));
          for (int64_t ch = 0; ch < C; ch++) yo[ch] *= inv;
        }
      }
  }
  return 0;
}

static int cpu_pool_grad(void *impl, const kern_win *g, int64_t n,
                         kern_pool2d kind, const float *dy,
                         const int32_t *arg, float beta, float *dx) {
  (void)impl;
  int64_t C = g->c, img = g->h * g->w * C;
  if (beta == 0.0f) memset(dx, 0, (size_t)(n * img) * sizeof *dx);
  for (int64_t b = 0; b < n; b++) {
    float *db = dx + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t o = ((b * g->oh + oy) * g->ow + ox) * C;
        if (kind == KERN_POOL2D_MAX) {
          for (int64_t ch = 0; ch < C; ch++) db[arg[o + ch]] += dy[o + ch];
          continue;
        }
        int64_t ya, yb, xa, xb2;
        kern_math_window(oy, g->sh, g->pt, g->kh, g->h, &ya, &yb);
        kern_math_window(ox, g->sw, g->pl, g->kw, g->w, &xa, &xb2);
        float inv = 1.0f / (float)((yb - ya) * (xb2 - xa));
        for (int64_t iy = ya; iy < yb; iy++)
          for (int64_t ix = xa; ix < xb2; ix++) {
            float *d = db + (iy * g->w + ix) * C;
            for (int64_t ch = 0; ch < C; ch++) d[ch] += dy[o + ch] * inv;
          }
      }
  }
  return 0;
}

static int cpu_mean_mid(void *impl, const float *x, int64_t n, int64_t p,
                        int64_t c, float *y) {
  (void)impl;
  float inv = 1.0f / (float)p;
  for (int64_t b = 0; b < n; b++) {
    float *yb = y + b * c;
    memset(yb, 0, (size_t)c * sizeof *yb);
    for (int64_t i = 0; i < p; i++) {
      const float *r = x + (b * p + i) * c;
      for (int64_t ch = 0; ch < c; ch++) yb[ch] += r[ch];
    }
    for (int64_t ch = 0; ch < c; ch++) yb[ch] *= inv;
  }
  return 0;
}

static int cpu_mean_mid_grad(void *impl, const float *dy, int64_t n,
                             int64_t p, int64_t c, float beta, float *dx) {
  (void)impl;
  float inv = 1.0f / (float)p;
  for (int64_t b = 0; b < n; b++)
    for (int64_t i = 0; i < p; i++) {
      float *r = dx + (b * p + i) * c;
      const float *d = dy + b * c;
      if (beta == 0.0f)
        for (int64_t ch = 0; ch < c; ch++) r[ch] = d[ch] * inv;
      else
        for (int64_t ch = 0; ch < c; ch++) r[ch] += d[ch] * inv;
    }
  return 0;
}

static int cpu_moments(void *impl, const float *x, int64_t rows, int64_t c,
                       float *mean, float *var) {
  (void)impl;
  double *s = calloc((size_t)c * 2, sizeof *s);
  if (!s) return TSR_ENOMEM;
  double *q = s + c;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    for (int64_t ch = 0; ch < c; ch++) s[ch] += xr[ch];
  }
  for (int64_t ch = 0; ch < c; ch++) s[ch] /= (double)rows;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    for (int64_t ch = 0; ch < c; ch++) {
      double d = xr[ch] - s[ch];
      q[ch] += d * d;
    }
  }
  for (int64_t ch = 0; ch < c; ch++) {
    mean[ch] = (float)s[ch];
    var[ch] = (float)(q[ch] / (double)rows);
  }
  free(s);
  return 0;
}

static int cpu_bn_apply(void *impl, const float *x, int64_t rows, int64_t c,
                        const float *mean, const float *var, float eps,
                        const float *gamma, const float *beta, float *y) {
  (void)impl;
  float *sc = malloc((size_t)c * sizeof *sc);
  if (!sc) return TSR_ENOMEM;
  for (int64_t ch = 0; ch < c; ch++)
    sc[ch] = kern_math_norm_scale(gamma ? gamma[ch] : 1.0f, var[ch], eps);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    float *yr = y + r * c;
    for (int64_t ch = 0; ch < c; ch++)
      yr[ch] = kern_math_norm_apply(xr[ch], mean[ch], sc[ch],
                                    beta ? beta[ch] : 0.0f);
  }
  free(sc);
  return 0;
}

static int cpu_bn_grad(void *impl, const float *dy, const float *x,
                       int64_t rows, int64_t c, const float *mean,
                       const float *var, float eps, const float *gamma,
                       float beta_dx, float *dx, float *dgamma,
                       float *dbeta) {
  (void)impl;
  double *s = calloc((size_t)c * 2, sizeof *s);
  float *inv = malloc((size_t)c * 3 * sizeof *inv);
  if (!s || !inv) {
    free(s);
    free(inv);
    return TSR_ENOMEM;
  }
  double *sx = s + c;
  float *a = inv + c, *bb = inv + 2 * c;
  for (int64_t ch = 0; ch < c; ch++)
    inv[ch] = kern_math_norm_scale(1.0f, var[ch], eps);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c, *dr = dy + r * c;
    for (int64_t ch = 0; ch < c; ch++) {
      s[ch] += dr[ch];
      sx[ch] += (double)dr[ch] * ((xr[ch] - mean[ch]) * inv[ch]);
    }
  }
  for (int64_t ch = 0; ch < c; ch++) {
    if (dgamma) dgamma[ch] = (float)sx[ch];
    if (dbeta) dbeta[ch] = (float)s[ch];
    a[ch] = (float)(s[ch] / (double)rows);   /* mean(dy) */
    bb[ch] = (float)(sx[ch] / (double)rows); /* mean(dy * xh) */
  }
  if (dx)
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * c, *dr = dy + r * c;
      float *o = dx + r * c;
      for (int64_t ch = 0; ch < c; ch++) {
        float xh = (xr[ch] - mean[ch]) * inv[ch];
        float v = kern_math_norm_dx(dr[ch], xh, a[ch], bb[ch],
                                    (gamma ? gamma[ch] : 1.0f) * inv[ch]);
        o[ch] = beta_dx == 0.0f ? v : o[ch] + v;
      }
    }
  free(s);
  free(inv);
  return 0;
}

static int cpu_ln_fwd(void *impl, const float *x, int64_t rows, int64_t d,
                      float eps, const float *gamma, const float *beta,
                      float *y, float *mean, float *rstd) {
  (void)impl;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double s = 0, q = 0;
    for (int64_t j = 0; j < d; j++) s += xr[j];
    double mu = s / (double)d;
    for (int64_t j = 0; j < d; j++) {
      double t = xr[j] - mu;
      q += t * t;
    }
    float m = (float)mu, rs = (float)(1.0 / sqrt(q / (double)d + eps));
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
    for (int64_t j = 0; j < d; j++)
      yr[j] = kern_math_norm_apply(xr[j], m, rs * (gamma ? gamma[j] : 1.0f),
                                   beta ? beta[j] : 0.0f);
  }
  return 0;
}

static int cpu_ln_grad(void *impl, const float *dy, const float *x,
                       int64_t rows, int64_t d, const float *mean,
                       const float *rstd, const float *gamma, float beta_dx,
                       float *dx, float *dgamma, float *dbeta) {
  (void)impl;
  double *acc = calloc((size_t)d * 2, sizeof *acc);
  if (!acc) return TSR_ENOMEM;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d, *dr = dy + r * d;
    float *o = dx ? dx + r * d : NULL;
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < d; j++) {
      float xh = (xr[j] - mean[r]) * rstd[r];
      float gj = dr[j] * (gamma ? gamma[j] : 1.0f);
      sg += gj;
      sgx += (double)gj * xh;
      acc[j] += (double)dr[j] * xh;
      acc[d + j] += dr[j];
    }
    if (!o) continue;
    float mg = (float)(sg / (double)d), mgx = (float)(sgx / (double)d);
    for (int64_t j = 0; j < d; j++) {
      float xh = (xr[j] - mean[r]) * rstd[r];
      float gj = dr[j] * (gamma ? gamma[j] : 1.0f);
      float v = kern_math_norm_dx(gj, xh, mg, mgx, rstd[r]);
      o[j] = beta_dx == 0.0f ? v : o[j] + v;
    }
  }
  for (int64_t j = 0; j < d; j++) {
    if (dgamma) dgamma[j] = (float)acc[j];
    if (dbeta) dbeta[j] = (float)acc[d + j];
  }
  free(acc);
  return 0;
}

static int cpu_copy_cols(void *impl, int64_t rows, int64_t w,
                         const float *src, int64_t ss, int64_t so, float beta,
                         float *dst, int64_t ds, int64_t doff) {
  (void)impl;
  for (int64_t r = 0; r < rows; r++) {
    const float *s = src + r * ss + so;
    float *d = dst + r * ds + doff;
    if (beta == 0.0f)
      memcpy(d, s, (size_t)w * sizeof *d);
    else
      for (int64_t j = 0; j < w; j++) d[j] += s[j];
  }
  return 0;
}

static int cpu_l1l2_grad(void *impl, const float *w, size_t n, float a1,
                         float a2, float *g) {
  (void)impl;
  for (size_t i = 0; i < n; i++) g[i] += kern_math_l1l2_grad(w[i], a1, a2);
  return 0;
}

const kern__nn_ops kern__cpu_nn_ops = {
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .pool_fwd = cpu_pool_fwd,
    .pool_grad = cpu_pool_grad,
    .mean_mid = cpu_mean_mid,
    .mean_mid_grad = cpu_mean_mid_grad,
    .moments = cpu_moments,
    .bn_apply = cpu_bn_apply,
    .bn_grad = cpu_bn_grad,
    .ln_fwd = cpu_ln_fwd,
    .ln_grad = cpu_ln_grad,
    .copy_cols = cpu_copy_cols,
    .l1l2_grad = cpu_l1l2_grad,
};
