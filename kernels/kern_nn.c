/* kern_nn.h front end: window geometry with TF's padding rules, argument
 * checks, and forwarding to the context's backend table (kern__ops.nn).
 * Failure modes: sizes that are negative or a window that does not fit
 * (TSR_EINVAL / TSR_ESHAPE), a backend without these ops (TSR_EUNSUPPORTED,
 * an old CUDA module); everything else is the backend's.
 */
#include "kernels/kern_nn_int.h"
#include "common/err.h"

#define NN(c) (kern__ctx_ops(c)->nn)
#define IMPL(c) kern__ctx_impl(c)
#define NEED(c) do { if (!NN(c)) return TSR_EUNSUPPORTED; } while (0)

int kern_win_make(kern_win *g, int64_t h, int64_t w, int64_t c, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, bool same) {
  if (h < 1 || w < 1 || c < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1)
    return TSR_EINVAL;
  g->h = h;
  g->w = w;
  g->c = c;
  g->kh = kh;
  g->kw = kw;
  g->sh = sh;
  g->sw = sw;
  if (same) {
    g->oh = (h + sh - 1) / sh;
    g->ow = (w + sw - 1) / sw;
    int64_t ph = (g->oh - 1) * sh + kh - h, pw = (g->ow - 1) * sw + kw - w;
    g->pt = ph > 0 ? ph / 2 : 0;
    g->pl = pw > 0 ? pw / 2 : 0;
  } else {
    if (h < kh || w < kw) return TSR_ESHAPE;
    g->oh = (h - kh) / sh + 1;
    g->ow = (w - kw) / sw + 1;
    g->pt = g->pl = 0;
  }
  return 0;
}

int64_t kern_win_patch(const kern_win *g) { return g->kh * g->kw * g->c; }

int kern_im2col(kern_ctx *ctx, const kern_win *g, int64_t n, const float *x,
                float *cols) {
  NEED(ctx);
  if (n < 0) return TSR_EINVAL;
  return n ? NN(ctx)->im2col(IMPL(ctx), g, n, x, cols) : 0;
}

int kern_col2im(kern_ctx *ctx, const kern_win *g, int64_t n,
                const float *cols, float beta, float *dx) {
  NEED(ctx);
  if (n < 0) return TSR_EINVAL;
  return n ? NN(ctx)->col2im(IMPL(ctx), g, n, cols, beta, dx) : 0;
}

int kern_pool2d_fwd(kern_ctx *ctx, const kern_win *g, int64_t n,
                    kern_pool2d kind, const float *x, float *y,
                    int32_t *arg) {
  NEED(ctx);
  if (n < 0 || (unsigned)kind > KERN_POOL2D_AVG ||
      g->h * g->w * g->c > INT32_MAX)
    return TSR_EINVAL;
  return n ? NN(ctx)->pool_fwd(IMPL(ctx), g, n, kind, x, y, arg) : 0;
}

int kern_pool2d_grad(kern_ctx *ctx, const kern_win *g, int64_t n,
                     kern_pool2d kind, const float *dy, const int32_t *arg,
                     float beta, float *dx) {
  NEED(ctx);
  if (n < 0 || (unsigned)kind > KERN_POOL2D_AVG ||
      (kind == KERN_POOL2D_MAX && !arg))
    return TSR_EINVAL;
  return n ? NN(ctx)->pool_grad(IMPL(ctx), g, n, kind, dy, arg, beta, dx) : 0;
}

int kern_mean_mid(kern_ctx *ctx, const float *x, int64_t n, int64_t p,
                  int64_t c, float *y) {
  NEED(ctx);
  if (n < 0 || p < 1 || c < 1) return TSR_EINVAL;
  return n ? NN(ctx)->mean_mid(IMPL(ctx), x, n, p, c, y) : 0;
}

int kern_mean_mid_grad(kern_ctx *ctx, const float *dy, int64_t n, int64_t p,
                       int64_t c, float beta, float *dx) {
  NEED(ctx);
  if (n < 0 || p < 1 || c < 1) return TSR_EINVAL;
  return n ? NN(ctx)->mean_mid_grad(IMPL(ctx), dy, n, p, c, beta, dx) : 0;
}

int kern_moments(kern_ctx *ctx, const float *x, int64_t rows, int64_t c,
                 float *mean, float *var) {
  NEED(ctx);
  if (rows < 1 || c < 1) return TSR_EINVAL;
  return NN(ctx)->moments(IMPL(ctx), x, rows, c, mean, var);
}

int kern_bn_apply(kern_ctx *ctx, const float *x, int64_t rows, int64_t c,
                  const float *mean, const float *var, float eps,
                  const float *gamma, const float *beta, float *y) {
  NEED(ctx);
  if (rows < 0 || c < 1) return TSR_EINVAL;
  return rows ? NN(ctx)->bn_apply(IMPL(ctx), x, rows, c, mean, var, eps,
                                  gamma, beta, y)
              : 0;
}

int kern_bn_grad(kern_ctx *ctx, const float *dy, const float *x,
                 int64_t rows, int64_t c, const float *mean, const float *var,
                 float eps, const float *gamma, float beta_dx, float *dx,
                 float *dgamma, float *dbeta) {
  NEED(ctx);
  if (rows < 1 || c < 1) return TSR_EINVAL;
  return NN(ctx)->bn_grad(IMPL(ctx), dy, x, rows, c, mean, var, eps, gamma,
                          beta_dx, dx, dgamma, dbeta);
}

int kern_ln_fwd(kern_ctx *ctx, const float *x, int64_t rows, int64_t d,
                float eps, const float *gamma, const float *beta, float *y,
                float *mean, float *rstd) {
  NEED(ctx);
  if (rows < 0 || d < 1) return TSR_EINVAL;
  return rows ? NN(ctx)->ln_fwd(IMPL(ctx), x, rows, d, eps, gamma, beta, y,
                                mean, rstd)
              : 0;
}

int kern_ln_grad(kern_ctx *ctx, const float *dy, const float *x,
                 int64_t rows, int64_t d, const float *mean,
                 const float *rstd, const float *gamma, float beta_dx,
                 float *dx, float *dgamma, float *dbeta) {
  NEED(ctx);
  if (rows < 1 || d < 1) return TSR_EINVAL;
  return NN(ctx)->ln_grad(IMPL(ctx), dy, x, rows, d, mean, rstd, gamma,
                          beta_dx, dx, dgamma, dbeta);
}

int kern_copy_cols(kern_ctx *ctx, int64_t rows, int64_t w, const float *src,
                   int64_t src_stride, int64_t src_off, float beta,
                   float *dst, int64_t dst_stride, int64_t dst_off) {
  NEED(ctx);
  if (rows < 0 || w < 0 || src_off < 0 || dst_off < 0 ||
      src_off + w > src_stride || dst_off + w > dst_stride)
    return TSR_EINVAL;
  if (rows == 0 || w == 0) return 0;
  return NN(ctx)->copy_cols(IMPL(ctx), rows, w, src, src_stride, src_off,
                            beta, dst, dst_stride, dst_off);
}

int kern_l1l2_grad(kern_ctx *ctx, const float *w, size_t n, float a1,
                   float a2, float *g) {
  NEED(ctx);
  return n ? NN(ctx)->l1l2_grad(IMPL(ctx), w, n, a1, a2, g) : 0;
}
