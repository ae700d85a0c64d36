/* Ops of image and normalized models, beside kern.h's dense ones:
 * convolution (direct where the backend has it, im2col and kern_gemm
 * otherwise), 2-D pooling,
 * global average pooling, batch and layer normalization, strided column
 * copies (Concatenate, inputs cut from the batch's columns) and the l1/l2
 * regularizer gradient. Same context, same device pointers, same stream
 * ordering as kern.h; tensors are row-major float32, images NHWC as Keras
 * stores them.
 *
 * Happy path: kern_win_make() works out a window op's geometry (Keras/TF
 * "valid" and "same" padding) once per layer; the ops take it with the
 * batch size. Every gradient op takes `beta` (0 or 1): the input gradient
 * is written (0) or added to what is there (1), so a tensor read by
 * several layers sums its gradients without an extra buffer.
 * Failure modes: a geometry with an empty output (TSR_ESHAPE from
 * kern_win_make), bad sizes (TSR_EINVAL), device launch errors. The CPU
 * backend implements them in kernels/cpu/cpu_nn.c, the CUDA module in
 * kernels/cuda/nn.cu; both follow the same formulas and summation order
 * where they can (tests/gpu/gpu_check.c compares them).
 */
#ifndef TSR_KERN_NN_H
#define TSR_KERN_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kern.h"

/* Geometry of a 2-D window over an [n, h, w, c] input. */
typedef struct {
  int64_t h, w, c;      /* input rows, columns, channels */
  int64_t kh, kw;       /* window */
  int64_t sh, sw;       /* strides */
  int64_t pt, pl;       /* zero rows above / columns left of the input */
  int64_t oh, ow;       /* output rows, columns */
} kern_win;

/* TF's rules: valid: o = floor((i - k) / s) + 1 (TSR_ESHAPE when i < k);
 * same: o = ceil(i / s), padding max((o-1)*s + k - i, 0) split with the
 * smaller half first (top, left). Sizes must be >= 1 (TSR_EINVAL). */
int kern_win_make(kern_win *g, int64_t h, int64_t w, int64_t c, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, bool same);
/* kh * kw * c: the width of an im2col row. */
int64_t kern_win_patch(const kern_win *g);

typedef enum { KERN_POOL2D_MAX = 0, KERN_POOL2D_AVG } kern_pool2d;

/* Convolution of x [n, h, w, c] with a Keras kernel w [kh, kw, c, f] (a
 * Conv1D is the 1-row image), y [n, oh, ow, f]. The CPU backend built with
 * oneDNN runs its direct kernels for fp32 (kern_conv_impl() names them);
 * otherwise, and for bf16/fp16 products, these are im2col and kern_gemm
 * over chunks of examples in the caller's workspace `ws` of
 * kern_conv2d_ws() floats (NULL when that is 0; the 1x1, stride 1 kernel
 * needs none). Results agree with the im2col path to float rounding.
 * kern_conv2d_ws: floats of workspace for batches of up to n. */
int64_t kern_conv2d_ws(kern_ctx *ctx, const kern_win *g, int64_t n,
                       int64_t f, kern_prec prec);
/* y = conv(x, w) + bias (bias [f] may be NULL), then max(y, 0) when
 * relu (fused into the convolution where the backend can). */
int kern_conv2d_fwd(kern_ctx *ctx, const kern_win *g, int64_t n, int64_t f,
                    const float *x, const float *w, const float *bias,
                    bool relu, float *y, kern_prec prec, float *ws);
/* dx = beta * dx + the input gradient of dy [n, oh, ow, f]. */
int kern_conv2d_bwd_data(kern_ctx *ctx, const kern_win *g, int64_t n,
                         int64_t f, const float *dy, const float *w,
                         float beta, float *dx, kern_prec prec, float *ws);
/* dw [kh, kw, c, f] and db [f] (may be NULL) written: the kernel's and the
 * bias's gradients summed over the batch. */
int kern_conv2d_bwd_filter(kern_ctx *ctx, const kern_win *g, int64_t n,
                           int64_t f, const float *x, const float *dy,
                           float *dw, float *db, kern_prec prec, float *ws);

/* cols[n*oh*ow, kh*kw*c]: row (b, oy, ox) holds the window at that output
 * in (ky, kx, ci) order, zeros where it covers padding; so a Keras Conv2D
 * kernel [kh, kw, c, f] read as [kh*kw*c, f] multiplies it. */
int kern_im2col(kern_ctx *ctx, const kern_win *g, int64_t n, const float *x,
                float *cols);
/* dx[n, h, w, c] = beta * dx + the sum of every cols entry that im2col
 * copied from that element (the backward of kern_im2col). */
int kern_col2im(kern_ctx *ctx, const kern_win *g, int64_t n,
                const float *cols, float beta, float *dx);

/* y[n, oh, ow, c]: max or mean over each window. Padding never wins a max
 * and is left out of a mean (TF's avg_pool). For max, arg[n*oh*ow*c] (may
 * be NULL when no backward follows) gets the index in x of the winner. */
int kern_pool2d_fwd(kern_ctx *ctx, const kern_win *g, int64_t n,
                    kern_pool2d kind, const float *x, float *y, int32_t *arg);
/* dx = beta * dx + the backward of kern_pool2d_fwd (arg for max). */
int kern_pool2d_grad(kern_ctx *ctx, const kern_win *g, int64_t n,
                     kern_pool2d kind, const float *dy, const int32_t *arg,
                     float beta, float *dx);

/* Global average pooling: y[n, c] = mean over p of x[n, p, c]; and its
 * backward dx = beta * dx + dy / p. */
int kern_mean_mid(kern_ctx *ctx, const float *x, int64_t n, int64_t p,
                  int64_t c, float *y);
int kern_mean_mid_grad(kern_ctx *ctx, const float *dy, int64_t n, int64_t p,
                       int64_t c, float beta, float *dx);

/* Batch normalization over the last axis of x[rows, c] (rows = batch times
 * every axis but the channels). kern_moments: per-channel mean and biased
 * variance (Keras's batch statistics), accumulated in double. */
int kern_moments(kern_ctx *ctx, const float *x, int64_t rows, int64_t c,
                 float *mean, float *var);
/* y = gamma * (x - mean) / sqrt(var + eps) + beta; gamma and beta may be
 * NULL (scale=False, center=False). */
int kern_bn_apply(kern_ctx *ctx, const float *x, int64_t rows, int64_t c,
                  const float *mean, const float *var, float eps,
                  const float *gamma, const float *beta, float *y);
/* Training-mode backward (mean and var are the batch's): with xh the
 * normalized input, dgamma = sum(dy * xh), dbeta = sum(dy) (each may be
 * NULL), dx = beta_dx * dx + gamma / sqrt(var + eps) *
 * (dy - mean(dy) - xh * mean(dy * xh)). */
int kern_bn_grad(kern_ctx *ctx, const float *dy, const float *x,
                 int64_t rows, int64_t c, const float *mean, const float *var,
                 float eps, const float *gamma, float beta_dx, float *dx,
                 float *dgamma, float *dbeta);

/* Layer normalization of every row of x[rows, d]: y = gamma * (x - mu) *
 * rstd + beta with rstd = 1 / sqrt(var + eps) (biased variance, as Keras);
 * mean[rows] and rstd[rows] are kept for the backward (may be NULL in
 * inference). gamma, beta [d] may be NULL. */
int kern_ln_fwd(kern_ctx *ctx, const float *x, int64_t rows, int64_t d,
                float eps, const float *gamma, const float *beta, float *y,
                float *mean, float *rstd);
/* dgamma = sum over rows of dy * xh, dbeta = sum of dy (each may be NULL;
 * written, not added), dx = beta_dx * dx + rstd * (g - mean(g) - xh *
 * mean(g * xh)) with g = dy * gamma. */
int kern_ln_grad(kern_ctx *ctx, const float *dy, const float *x,
                 int64_t rows, int64_t d, const float *mean,
                 const float *rstd, const float *gamma, float beta_dx,
                 float *dx, float *dgamma, float *dbeta);

/* dst[r*dst_stride + dst_off + j] = beta * dst[...] +
 * src[r*src_stride + src_off + j] for r < rows, j < w. */
int kern_copy_cols(kern_ctx *ctx, int64_t rows, int64_t w, const float *src,
                   int64_t src_stride, int64_t src_off, float beta,
                   float *dst, int64_t dst_stride, int64_t dst_off);

/* g += a1 * sign(w) + a2 * w (the gradient of l1*|w| + l2*w^2 terms with
 * a1 = l1 * s, a2 = 2 * l2 * s). */
int kern_l1l2_grad(kern_ctx *ctx, const float *w, size_t n, float a1,
                   float a2, float *g);

#endif
