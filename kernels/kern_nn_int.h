/* The backend table of kern_nn.h's ops, reached from kern__ops.nn. The CPU
 * backend fills it in kernels/cpu/cpu_nn.c, the CUDA module in
 * kernels/cuda/nn.cu. Plain C so nvcc can include it. Arguments are
 * checked by kern_nn.c before they get here. */
#ifndef TSR_KERN_NN_INT_H
#define TSR_KERN_NN_INT_H

#include "kernels/kern_int.h"
#include "kernels/kern_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern__nn_ops {
  int (*im2col)(void *impl, const kern_win *g, int64_t n, const float *x,
                float *cols);
  int (*col2im)(void *impl, const kern_win *g, int64_t n, const float *cols,
                float beta, float *dx);
  int (*pool_fwd)(void *impl, const kern_win *g, int64_t n, kern_pool2d kind,
                  const float *x, float *y, int32_t *arg);
  int (*pool_grad)(void *impl, const kern_win *g, int64_t n,
                   kern_pool2d kind, const float *dy, const int32_t *arg,
                   float beta, float *dx);
  int (*mean_mid)(void *impl, const float *x, int64_t n, int64_t p,
                  int64_t c, float *y);
  int (*mean_mid_grad)(void *impl, const float *dy, int64_t n, int64_t p,
                       int64_t c, float beta, float *dx);
  int (*moments)(void *impl, const float *x, int64_t rows, int64_t c,
                 float *mean, float *var);
  int (*bn_apply)(void *impl, const float *x, int64_t rows, int64_t c,
                  const float *mean, const float *var, float eps,
                  const float *gamma, const float *beta, float *y);
  int (*bn_grad)(void *impl, const float *dy, const float *x, int64_t rows,
                 int64_t c, const float *mean, const float *var, float eps,
                 const float *gamma, float beta_dx, float *dx,
                 float *dgamma, float *dbeta);
  int (*ln_fwd)(void *impl, const float *x, int64_t rows, int64_t d,
                float eps, const float *gamma, const float *beta, float *y,
                float *mean, float *rstd);
  int (*ln_grad)(void *impl, const float *dy, const float *x, int64_t rows,
                 int64_t d, const float *mean, const float *rstd,
                 const float *gamma, float beta_dx, float *dx, float *dgamma,
                 float *dbeta);
  int (*copy_cols)(void *impl, int64_t rows, int64_t w, const float *src,
                   int64_t src_stride, int64_t src_off, float beta,
                   float *dst, int64_t dst_stride, int64_t dst_off);
  int (*l1l2_grad)(void *impl, const float *w, size_t n, float a1, float a2,
                   float *g);
  /* Direct fp32 convolutions (kern_conv2d_*); NULL where the backend has
   * none (the front end then runs im2col and products). */
  int (*conv_fwd)(void *impl, const kern_win *g, int64_t n, int64_t f,
                  const float *x, const float *w, const float *bias,
                  bool relu, float *y);
  int (*conv_bwd_data)(void *impl, const kern_win *g, int64_t n, int64_t f,
                       const float *dy, const float *w, float beta,
                       float *dx);
  int (*conv_bwd_filter)(void *impl, const kern_win *g, int64_t n,
                         int64_t f, const float *x, const float *dy,
                         float *dw, float *db);
  const char *(*conv_name)(void *impl);
} kern__nn_ops;

extern const kern__nn_ops kern__cpu_nn_ops;

#ifdef __cplusplus
}
#endif

#endif
