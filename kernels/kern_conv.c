/* kern_nn.h's convolutions: the backend's direct kernels for fp32 where it
 * has them (the CPU backend with oneDNN), else im2col and kern_gemm over
 * chunks of examples whose columns fit the caller's workspace (at most
 * CONV_COLS_MAX floats; a 1x1 kernel with stride 1 multiplies the input
 * as it is). Failure modes: bad sizes (TSR_EINVAL), a workspace missing
 * where one is needed (TSR_EINVAL), and the ops' own errors.
 */
#include "kernels/kern_nn_int.h"
#include "common/err.h"

#define NN(c) (kern__ctx_ops(c)->nn)
#define IMPL(c) kern__ctx_impl(c)
#define CONV_COLS_MAX ((int64_t)4 << 20) /* floats of im2col rows a chunk */

static bool direct_ok(kern_ctx *ctx, kern_prec prec) {
  return prec == KERN_F32 && NN(ctx) && NN(ctx)->conv_fwd;
}

/* The input read as the columns themselves: 1x1, stride 1 (no padding). */
static bool cols_are_x(const kern_win *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1;
}

/* Examples per im2col chunk. */
static int64_t chunk(const kern_win *g) {
  int64_t row = g->oh * g->ow * kern_win_patch(g);
  int64_t cb = CONV_COLS_MAX / (row > 0 ? row : 1);
  return cb > 0 ? cb : 1;
}

static bool bad(const kern_win *g, int64_t n, int64_t f) {
  return n < 0 || f < 1 || g->oh < 1 || g->ow < 1 || g->c < 1 ||
         g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1;
}

int64_t kern_conv2d_ws(kern_ctx *ctx, const kern_win *g, int64_t n,
                       int64_t f, kern_prec prec) {
  if (bad(g, n, f) || direct_ok(ctx, prec) || cols_are_x(g)) return 0;
  int64_t cb = chunk(g);
  return (n < cb ? n : cb) * g->oh * g->ow * kern_win_patch(g);
}

const char *kern_conv_impl(const kern_ctx *ctx) {
  const kern__nn_ops *nn = kern__ctx_ops(ctx)->nn;
  if (nn && nn->conv_name) return nn->conv_name(kern__ctx_impl(ctx));
  return kern_is_host(ctx) ? "im2col + OpenBLAS" : "im2col + products";
}

int kern_conv2d_fwd(kern_ctx *ctx, const kern_win *g, int64_t n, int64_t f,
                    const float *x, const float *w, const float *bias,
                    bool relu, float *y, kern_prec prec, float *ws) {
  if (bad(g, n, f)) return TSR_EINVAL;
  if (n == 0) return 0;
  if (direct_ok(ctx, prec))
    return NN(ctx)->conv_fwd(IMPL(ctx), g, n, f, x, w, bias, relu, y);
  int64_t K = kern_win_patch(g), per = g->oh * g->ow;
  int64_t isz = g->h * g->w * g->c, cb = chunk(g);
  bool as_is = cols_are_x(g);
  if (!as_is && !ws) return TSR_EINVAL;
  int rc;
  for (int64_t b0 = 0; b0 < n; b0 += cb) {
    int64_t cnt = n - b0 < cb ? n - b0 : cb;
    const float *cols = x + b0 * isz;
    if (!as_is) {
      if ((rc = kern_im2col(ctx, g, cnt, cols, ws))) return rc;
      cols = ws;
    }
    if ((rc = kern_gemm(ctx, false, false, cnt * per, f, K, 1.0f, cols, w,
                        0.0f, y + b0 * per * f, prec)))
      return rc;
  }
  return bias || relu ? kern_bias_act(ctx, y, bias, y, n * per, f,
                                       relu ? KERN_ACT_RELU : KERN_ACT_LINEAR,
                                       0.0f)
                      : 0;
}

int kern_conv2d_bwd_data(kern_ctx *ctx, const kern_win *g, int64_t n,
                         int64_t f, const float *dy, const float *w,
                         float beta, float *dx, kern_prec prec, float *ws) {
  if (bad(g, n, f)) return TSR_EINVAL;
  if (n == 0) return 0;
  if (direct_ok(ctx, prec))
    return NN(ctx)->conv_bwd_data(IMPL(ctx), g, n, f, dy, w, beta, dx);
  int64_t K = kern_win_patch(g), per = g->oh * g->ow;
  int64_t isz = g->h * g->w * g->c, cb = chunk(g);
  bool as_is = cols_are_x(g);
  if (!as_is && !ws) return TSR_EINVAL;
  int rc;
  for (int64_t b0 = 0; b0 < n; b0 += cb) {
    int64_t cnt = n - b0 < cb ? n - b0 : cb;
    const float *dyc = dy + b0 * per * f;
    if (as_is) {
      rc = kern_gemm(ctx, false, true, cnt * per, K, f, 1.0f, dyc, w, beta,
                     dx + b0 * isz, prec);
    } else {
      rc = kern_gemm(ctx, false, true, cnt * per, K, f, 1.0f, dyc, w, 0.0f,
                     ws, prec);
      if (!rc) rc = kern_col2im(ctx, g, cnt, ws, beta, dx + b0 * isz);
    }
    if (rc) return rc;
  }
  return 0;
}

int kern_conv2d_bwd_filter(kern_ctx *ctx, const kern_win *g, int64_t n,
                           int64_t f, const float *x, const float *dy,
                           float *dw, float *db, kern_prec prec, float *ws) {
  if (bad(g, n, f) || n == 0) return TSR_EINVAL;
  if (direct_ok(ctx, prec))
    return NN(ctx)->conv_bwd_filter(IMPL(ctx), g, n, f, x, dy, dw, db);
  int64_t K = kern_win_patch(g), per = g->oh * g->ow;
  int64_t isz = g->h * g->w * g->c, cb = chunk(g);
  bool as_is = cols_are_x(g);
  if (!as_is && !ws) return TSR_EINVAL;
  int rc;
  for (int64_t b0 = 0; b0 < n; b0 += cb) {
    int64_t cnt = n - b0 < cb ? n - b0 : cb;
    const float *cols = x + b0 * isz;
    if (!as_is) {
      if ((rc = kern_im2col(ctx, g, cnt, cols, ws))) return rc;
      cols = ws;
    }
    if ((rc = kern_gemm(ctx, true, false, K, f, cnt * per, 1.0f, cols,
                        dy + b0 * per * f, b0 ? 1.0f : 0.0f, dw, prec)))
      return rc;
  }
  return db ? kern_col_sum(ctx, dy, n * per, f, 0.0f, db) : 0;
}
