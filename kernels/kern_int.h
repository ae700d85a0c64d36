/* The backend vtable behind kern.h. The CPU backend fills it statically;
 * the CUDA module exports `kern_cuda_module_v1` (a kern__module) that
 * hands out the same table after dlopen. Plain C so nvcc can include it.
 * Every function returns 0 or a negative TSR_E* code; after a failure
 * last_error() says why (the CUDA or cuBLAS error's name and the
 * operation), which kern_last_error() reports. The element-wise formulas
 * both backends apply are in kern_math.h, their launch geometry and the
 * GEMM argument mapping in kern_plan.h.
 */
#ifndef TSR_KERN_INT_H
#define TSR_KERN_INT_H

#include "kernels/kern.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KERN__ABI 5

struct kern__nn_ops; /* kern_nn_int.h: convolution, pooling, normalization */
struct kern__seq_ops; /* kern_seq_int.h: recurrent cells, attention */

typedef struct kern__ops {
  const char *name;
  bool host;  /* device pointers are host pointers */
  int (*open)(void **impl, int device, int threads, char *err, size_t len);
  void (*close)(void *impl);
  void *(*alloc)(void *impl, size_t bytes);
  void (*free)(void *impl, void *p);
  void *(*host_alloc)(void *impl, size_t bytes);
  void (*host_free)(void *impl, void *p);
  int (*upload)(void *impl, void *dst, const void *src, size_t bytes);
  int (*download)(void *impl, void *dst, const void *src, size_t bytes);
  int (*copy)(void *impl, void *dst, const void *src, size_t bytes);
  int (*sync)(void *impl);
  int (*gemm)(void *impl, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              float alpha, const float *A, const float *B, float beta,
              float *C, kern_prec prec);
  int (*bias_act)(void *impl, float *z, const float *bias, float *y,
                  int64_t n, int64_t d, kern_act act, float alpha);
  int (*act_grad)(void *impl, const float *dy, const float *z,
                  const float *y, float *dz, int64_t n, int64_t d,
                  kern_act act, float alpha);
  int (*col_sum)(void *impl, const float *dz, int64_t n, int64_t d,
                 float beta, float *db);
  int (*loss)(void *impl, kern_loss kind, float param, const float *p,
              const float *y, int64_t n, int64_t d, float grad_scale,
              float *ex_loss, float *grad);
  int (*gather)(void *impl, const float *rows, int64_t dim,
                const int32_t *idx, const int32_t *bag_off, int64_t nb,
                kern_pool pool, float *out, int64_t stride, int64_t off);
  int (*scatter)(void *impl, const float *dout, int64_t stride, int64_t off,
                 int64_t dim, const int32_t *occ_off, const int32_t *occ_bag,
                 const float *occ_w, int64_t n_uniq, float *grad);
  int (*round)(void *impl, float *x, size_t n, kern_prec prec);
  int (*all_finite)(void *impl, const float *x, size_t n, bool *finite);
  int (*scale)(void *impl, float *x, size_t n, float alpha);
  int (*axpy)(void *impl, float *y, const float *x, size_t n, float alpha);
  int (*dropout)(void *impl, float *x, float *mask, size_t n, float rate,
                 uint64_t seed);
  int (*mul)(void *impl, float *x, const float *mask, size_t n);
  int (*allreduce)(void *const *impls, float *const *bufs, int n_impl,
                   size_t n);
  /* Why the last failing op of this context failed; "" when unknown. */
  const char *(*last_error)(void *impl);
  const struct kern__nn_ops *nn;
  const struct kern__seq_ops *seq;
  /* CPU threads the context computes with; NULL: one */
  int (*threads)(void *impl);
} kern__ops;

/* What the CUDA module exports under the symbol name below. */
typedef struct {
  int abi;                      /* KERN__ABI */
  const kern__ops *ops;
  /* Visible GPUs; 0 with a reason in `why` when none (cudaGetDeviceCount
   * fails with error 35 on a machine without a driver). */
  int (*device_count)(int *count, char *why, size_t len);
} kern__module;

#define KERN__MODULE_SYMBOL "kern_cuda_module_v1"

extern const kern__ops kern__cpu_ops;

/* A context's backend and its state, for the ops of kern_nn.c. */
const kern__ops *kern__ctx_ops(const kern_ctx *ctx);
/* Another symbol of the loaded CUDA module (NULL: none loaded, or it has
 * no such symbol). */
void *kern__module_sym(const char *name);
void *kern__ctx_impl(const kern_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
