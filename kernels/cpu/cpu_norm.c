/* CPU batch and layer normalization (kern_nn.h): float64 sums, over the
 * context's pool in ranges of rows. A sum over rows (the batch moments,
 * the gamma and beta gradients) is taken per range into a partial of its
 * own, cut by the sizes alone, and the partials are added in range order:
 * the same bits on one thread or many. Failure modes: out of memory for
 * the partials (TSR_ENOMEM, with the size in the last error).
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_math.h"
#include "common/err.h"

#include <math.h>
#include <string.h>

#define NORM_GRAIN (1 << 15) /* floats a range of rows should hold */

static int64_t rows_grain(int64_t c) {
  int64_t g = NORM_GRAIN / c;
  return g < 16 ? 16 : g;
}

typedef struct {
  const float *x, *dy, *mean, *var, *gamma, *beta, *rstd;
  float *y, *dx;
  float *m_out, *rs_out;    /* layer norm: each row's mean and rstd */
  int64_t c, grain;
  float eps, beta_dx;
  const float *sc, *a, *b;  /* per channel: scale, mean(dy), mean(dy*xh) */
  double *part;             /* [ranges][2c] */
  const double *mu;         /* moments: the mean in double */
} norm_job;

static double *partials(kern__cpu *c, int64_t parts, int64_t w) {
  size_t n = (size_t)(parts * w);
  double *p = (double *)kern__cpu_scratch(c, 2, n * 2);
  if (p) memset(p, 0, n * sizeof *p);
  return p;
}

/* sum of x (first) or of (x - mu)^2 (second) per channel */
KERN__HOT static void sum_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t c = j->c;
  double *s = j->part + (r0 / j->grain) * c;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * c;
    if (!j->mu)
      for (int64_t ch = 0; ch < c; ch++) s[ch] += xr[ch];
    else
      for (int64_t ch = 0; ch < c; ch++) {
        double d = xr[ch] - j->mu[ch];
        s[ch] += d * d;
      }
  }
}

int kern__cpu_moments(void *impl, const float *x, int64_t rows, int64_t c,
                      float *mean, float *var) {
  kern__cpu *k = impl;
  norm_job j = {.x = x, .c = c, .grain = rows_grain(c)};
  int64_t parts = kern__cpu_par_count(rows, j.grain);
  /* the partials, then the mean and the squares in the last 2c doubles */
  double *mem = partials(k, parts + 2, c);
  if (!mem)
    return kern__cpu_fail(k, TSR_ENOMEM, "moments: no memory for %lld "
                          "partial sums", (long long)(parts * c));
  double *mu = mem + parts * c, *q = mu + c;
  j.part = mem;
  kern__cpu_par_fixed(k, rows, j.grain, sum_range, &j);
  for (int64_t p = 0; p < parts; p++)
    for (int64_t ch = 0; ch < c; ch++) mu[ch] += mem[p * c + ch];
  for (int64_t ch = 0; ch < c; ch++) mu[ch] /= (double)rows;
  memset(mem, 0, (size_t)(parts * c) * sizeof *mem);
  j.mu = mu;
  kern__cpu_par_fixed(k, rows, j.grain, sum_range, &j);
  for (int64_t p = 0; p < parts; p++)
    for (int64_t ch = 0; ch < c; ch++) q[ch] += mem[p * c + ch];
  for (int64_t ch = 0; ch < c; ch++) {
    mean[ch] = (float)mu[ch];
    var[ch] = (float)(q[ch] / (double)rows);
  }
  return 0;
}

KERN__HOT static void apply_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t c = j->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * c;
    float *yr = j->y + r * c;
    for (int64_t ch = 0; ch < c; ch++)
      yr[ch] = kern_math_norm_apply(xr[ch], j->mean[ch], j->sc[ch],
                                    j->beta ? j->beta[ch] : 0.0f);
  }
}

int kern__cpu_bn_apply(void *impl, const float *x, int64_t rows, int64_t c,
                       const float *mean, const float *var, float eps,
                       const float *gamma, const float *beta, float *y) {
  kern__cpu *k = impl;
  float *sc = kern__cpu_scratch(k, 3, (size_t)c);
  if (!sc)
    return kern__cpu_fail(k, TSR_ENOMEM, "bn_apply: no memory for %lld "
                          "scales", (long long)c);
  for (int64_t ch = 0; ch < c; ch++)
    sc[ch] = kern_math_norm_scale(gamma ? gamma[ch] : 1.0f, var[ch], eps);
  norm_job j = {.x = x, .y = y, .mean = mean, .beta = beta, .c = c,
                .sc = sc};
  kern__cpu_par(k, rows, rows_grain(c), apply_range, &j);
  return 0;
}

/* per channel: sum(dy) and sum(dy * xh) */
KERN__HOT static void bn_sums_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t c = j->c;
  double *s = j->part + (r0 / j->grain) * 2 * c, *sx = s + c;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * c, *dr = j->dy + r * c;
    for (int64_t ch = 0; ch < c; ch++) {
      s[ch] += dr[ch];
      sx[ch] += (double)dr[ch] * ((xr[ch] - j->mean[ch]) * j->sc[ch]);
    }
  }
}

KERN__HOT static void bn_dx_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t c = j->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * c, *dr = j->dy + r * c;
    float *o = j->dx + r * c;
    for (int64_t ch = 0; ch < c; ch++) {
      float xh = (xr[ch] - j->mean[ch]) * j->sc[ch];
      float v = kern_math_norm_dx(dr[ch], xh, j->a[ch], j->b[ch],
                                  (j->gamma ? j->gamma[ch] : 1.0f) *
                                      j->sc[ch]);
      o[ch] = j->beta_dx == 0.0f ? v : o[ch] + v;
    }
  }
}

int kern__cpu_bn_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t c, const float *mean,
                      const float *var, float eps, const float *gamma,
                      float beta_dx, float *dx, float *dgamma,
                      float *dbeta) {
  kern__cpu *k = impl;
  norm_job j = {.x = x, .dy = dy, .mean = mean, .gamma = gamma, .dx = dx,
                .c = c, .grain = rows_grain(c), .beta_dx = beta_dx};
  int64_t parts = kern__cpu_par_count(rows, j.grain);
  double *mem = partials(k, parts + 1, 2 * c);
  float *inv = kern__cpu_scratch(k, 3, (size_t)c * 3);
  if (!mem || !inv)
    return kern__cpu_fail(k, TSR_ENOMEM, "bn_grad: no memory for %lld "
                          "partial sums", (long long)(parts * 2 * c));
  double *s = mem + parts * 2 * c, *sx = s + c;
  float *a = inv + c, *bb = inv + 2 * c;
  for (int64_t ch = 0; ch < c; ch++)
    inv[ch] = kern_math_norm_scale(1.0f, var[ch], eps);
  j.sc = inv;
  j.part = mem;
  kern__cpu_par_fixed(k, rows, j.grain, bn_sums_range, &j);
  for (int64_t p = 0; p < parts; p++)
    for (int64_t ch = 0; ch < c; ch++) {
      s[ch] += mem[p * 2 * c + ch];
      sx[ch] += mem[p * 2 * c + c + ch];
    }
  for (int64_t ch = 0; ch < c; ch++) {
    if (dgamma) dgamma[ch] = (float)sx[ch];
    if (dbeta) dbeta[ch] = (float)s[ch];
    a[ch] = (float)(s[ch] / (double)rows);   /* mean(dy) */
    bb[ch] = (float)(sx[ch] / (double)rows); /* mean(dy * xh) */
  }
  if (dx) {
    j.a = a;
    j.b = bb;
    kern__cpu_par(k, rows, j.grain, bn_dx_range, &j);
  }
  return 0;
}

KERN__HOT static void ln_fwd_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t d = j->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * d;
    float *yr = j->y + r * d;
    double s = 0, q = 0;
    for (int64_t t = 0; t < d; t++) s += xr[t];
    double mu = s / (double)d;
    for (int64_t t = 0; t < d; t++) {
      double e = xr[t] - mu;
      q += e * e;
    }
    float m = (float)mu, rs = (float)(1.0 / sqrt(q / (double)d + j->eps));
    if (j->m_out) j->m_out[r] = m;
    if (j->rs_out) j->rs_out[r] = rs;
    for (int64_t t = 0; t < d; t++)
      yr[t] = kern_math_norm_apply(xr[t], m,
                                   rs * (j->gamma ? j->gamma[t] : 1.0f),
                                   j->beta ? j->beta[t] : 0.0f);
  }
}

int kern__cpu_ln_fwd(void *impl, const float *x, int64_t rows, int64_t d,
                     float eps, const float *gamma, const float *beta,
                     float *y, float *mean, float *rstd) {
  norm_job j = {.x = x, .y = y, .gamma = gamma, .beta = beta, .c = d,
                .eps = eps, .m_out = mean, .rs_out = rstd};
  kern__cpu_par(impl, rows, rows_grain(d), ln_fwd_range, &j);
  return 0;
}

/* dx per row, and per range the partial sums of dy * xh and dy */
KERN__HOT static void ln_grad_range(void *a, int64_t r0, int64_t r1, int tid) {
  const norm_job *j = a;
  int64_t d = j->c;
  double *acc = j->part + (r0 / j->grain) * 2 * d;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * d, *dr = j->dy + r * d;
    float *o = j->dx ? j->dx + r * d : NULL;
    float m = j->mean[r], rs = j->rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t t = 0; t < d; t++) {
      float xh = (xr[t] - m) * rs;
      float gj = dr[t] * (j->gamma ? j->gamma[t] : 1.0f);
      sg += gj;
      sgx += (double)gj * xh;
      acc[t] += (double)dr[t] * xh;
      acc[d + t] += dr[t];
    }
    if (!o) continue;
    float mg = (float)(sg / (double)d), mgx = (float)(sgx / (double)d);
    for (int64_t t = 0; t < d; t++) {
      float xh = (xr[t] - m) * rs;
      float gj = dr[t] * (j->gamma ? j->gamma[t] : 1.0f);
      float v = kern_math_norm_dx(gj, xh, mg, mgx, rs);
      o[t] = j->beta_dx == 0.0f ? v : o[t] + v;
    }
  }
}

int kern__cpu_ln_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t d, const float *mean,
                      const float *rstd, const float *gamma, float beta_dx,
                      float *dx, float *dgamma, float *dbeta) {
  kern__cpu *k = impl;
  norm_job j = {.x = x, .dy = dy, .mean = mean, .rstd = rstd,
                .gamma = gamma, .beta_dx = beta_dx, .dx = dx, .c = d,
                .grain = rows_grain(d)};
  int64_t parts = kern__cpu_par_count(rows, j.grain);
  if (!(j.part = partials(k, parts, 2 * d)))
    return kern__cpu_fail(k, TSR_ENOMEM, "ln_grad: no memory for %lld "
                          "partial sums", (long long)(parts * 2 * d));
  kern__cpu_par_fixed(k, rows, j.grain, ln_grad_range, &j);
  for (int64_t t = 0; t < 2 * d; t++) {
    double v = 0;
    for (int64_t p = 0; p < parts; p++) v += j.part[p * 2 * d + t];
    if (t < d && dgamma) dgamma[t] = (float)v;
    if (t >= d && dbeta) dbeta[t - d] = (float)v;
  }
  return 0;
}
