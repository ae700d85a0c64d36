/* Internals of the CUDA module: the per-context state shared by
 * kern_cuda.cu (module entry, memory, cuBLAS, NCCL) and ops.cu (the CUDA
 * kernels), and the error helpers both use. Every entry point first makes
 * its context's device current, because replicas run on their own
 * threads. A failure is recorded in the context's message with the CUDA or
 * cuBLAS error's name and the operation, then returned as a TSR_E* code. */
#ifndef TSR_KERN_CUDA_INT_H
#define TSR_KERN_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/kern_int.h"

struct kc_ctx {
  int dev;
  cudaStream_t s;
  cublasHandle_t blas;
  void *half_a, *half_b;      /* 16-bit copies of GEMM inputs */
  size_t half_a_bytes, half_b_bytes;
  float *part;                /* column-sum partials */
  size_t part_bytes;
  float *nn_part;             /* batch-norm per-channel sums (nn.cu) */
  size_t nn_part_n;
  int *flag;                  /* device flag for the finiteness check */
  int *hflag;                 /* pinned host copy */
  void *nccl;                 /* cached communicators (kern_cuda.cu) */
  char msg[256];              /* why the last failing op failed */
};

/* Record why an op failed and return the project's code for it:
 * kc__fail with a message of its own, kc__cuda_fail for a cudaError_t
 * ("op: cudaErrorMemoryAllocation (out of memory)"), kc__blas_fail for a
 * cublasStatus_t. Allocation failures are TSR_ENOMEM, the rest TSR_EIO
 * (TSR_EUNSUPPORTED for what the device or library cannot do). */
int kc__fail(kc_ctx *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kc__cuda_fail(kc_ctx *c, cudaError_t e, const char *op);
int kc__blas_fail(kc_ctx *c, cublasStatus_t s, const char *op);
/* The backend's entry points (kern.h and kern_nn.h ops): the context
 * from the opaque handle, and the device made current for the calls that
 * follow, failing the op with the CUDA error's name. */
#define C(impl) kc_ctx *c = (kc_ctx *)(impl)
#define SETDEV(c)                                                  \
  do {                                                             \
    cudaError_t se_ = cudaSetDevice((c)->dev);                     \
    if (se_ != cudaSuccess) return kc__cuda_fail(c, se_, "cudaSetDevice"); \
  } while (0)
/* The launch error of the kernels just enqueued, if any. */
int kc__launch_check(kc_ctx *c, const char *op);
/* Grows a device scratch buffer to at least `bytes`. */
int kc__scratch(kc_ctx *c, void **p, size_t *have, size_t bytes,
                const char *what);

/* ops.cu */
int kc__bias_act(kc_ctx *c, float *z, const float *bias, float *y, int64_t n,
                 int64_t d, kern_act act, float alpha);
int kc__act_grad(kc_ctx *c, const float *dy, const float *z, const float *y,
                 float *dz, int64_t n, int64_t d, kern_act act, float alpha);
int kc__col_sum(kc_ctx *c, const float *dz, int64_t n, int64_t d, float beta,
                float *db);
int kc__loss(kc_ctx *c, kern_loss kind, float param, const float *p,
             const float *y, int64_t n, int64_t d, float s, float *ex_loss,
             float *grad);
int kc__gather(kc_ctx *c, const float *rows, int64_t dim, const int32_t *idx,
               const int32_t *bag_off, int64_t nb, kern_pool pool, float *out,
               int64_t stride, int64_t off);
int kc__scatter(kc_ctx *c, const float *dout, int64_t stride, int64_t off,
                int64_t dim, const int32_t *occ_off, const int32_t *occ_bag,
                const float *occ_w, int64_t n_uniq, float *grad);
int kc__to_half(kc_ctx *c, const float *x, void *out, size_t n,
                kern_prec prec);
int kc__round(kc_ctx *c, float *x, size_t n, kern_prec prec);
int kc__all_finite(kc_ctx *c, const float *x, size_t n, bool *finite);
int kc__scale(kc_ctx *c, float *x, size_t n, float a);
int kc__axpy(kc_ctx *c, float *y, const float *x, size_t n, float a);
int kc__dropout(kc_ctx *c, float *x, float *mask, size_t n, float rate,
                uint64_t seed);
int kc__mul(kc_ctx *c, float *x, const float *m, size_t n);

/* nn.cu: kern_nn.h's ops */
extern "C" const struct kern__nn_ops kc__nn_ops;
/* seq.cu: kern_seq.h's ops */
extern "C" const struct kern__seq_ops kc__seq_ops;

#endif
