/* The compute interface: every numeric step of a model's forward and
 * backward pass, behind one backend vtable with two implementations.
 *
 *   CPU (always built): OpenBLAS cblas_sgemm for matrix products, plain
 *   loops that gcc vectorizes for the rest.
 *   GPU (kernels/cuda/, optional): cuBLAS cublasGemmEx with fp32 accumulate
 *   and CUDA kernels, built by nvcc as a separate shared module that
 *   kern_open() dlopen()s only when a GPU is asked for and present, so a CPU
 *   run never pays the second that loading cuBLAS costs.
 *
 * Happy path: kern_open(KERN_DEVICE_AUTO) -> kern_alloc device buffers ->
 * kern_upload inputs -> ops -> kern_download results -> kern_close.
 * Failure modes: asking for a GPU where none is usable (TSR_ENODEVICE, with
 * the reason in `err`: no device, a module that does not load (its dlerror
 * text), a device older than sm_80 named with its capability), a device
 * allocation that fails (TSR_ENOMEM). An op that fails returns a TSR_E*
 * code and leaves why in kern_last_error(): on the GPU the CUDA or cuBLAS
 * error's name and the operation.
 *
 * The element-wise formulas (activations, losses, 16-bit rounding, the
 * dropout draw) live once in kern_math.h for both backends; the GPU's
 * library arguments and launch geometry in kern_plan.h. Both are tested on
 * the CPU.
 *
 * Memory: every float pointer an op takes is a device pointer of the
 * context (kern_alloc); on the CPU backend device pointers are ordinary
 * host pointers, so callers may pass their own arrays (kern_is_host()).
 * Tensors are row-major float32. Ops are asynchronous on the GPU and ordered
 * on the context's stream; kern_download and kern_sync wait.
 *
 * Mixed precision: `prec` on kern_gemm names the precision of the products'
 * inputs (fp32, bf16 or fp16); accumulation and outputs stay fp32. The GPU
 * casts to real 16-bit types for cublasGemmEx; the CPU emulates by rounding
 * the inputs to the 16-bit type (round to nearest even, fp16 overflow to
 * inf) before sgemm, which gives the same rounding of inputs, the same
 * overflow behaviour for loss scaling, and fp32 accumulation.
 */
#ifndef TSR_KERN_H
#define TSR_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  KERN_DEVICE_AUTO = 0,  /* the GPU when one is present, else the CPU */
  KERN_DEVICE_CPU,
  KERN_DEVICE_GPU
} kern_device;

typedef enum { KERN_F32 = 0, KERN_BF16, KERN_F16 } kern_prec;

typedef enum {
  KERN_ACT_LINEAR = 0,
  KERN_ACT_RELU,
  KERN_ACT_RELU6,
  KERN_ACT_LEAKY_RELU,   /* Keras 3 default negative_slope 0.2 */
  KERN_ACT_SIGMOID,
  KERN_ACT_TANH,
  KERN_ACT_SOFTMAX,      /* row-wise over the last axis */
  KERN_ACT_ELU,
  KERN_ACT_SELU,
  KERN_ACT_GELU,         /* exact (erf) form, Keras's approximate=False */
  KERN_ACT_SWISH,        /* also "silu" */
  KERN_ACT_SOFTPLUS,
  KERN_ACT_SOFTSIGN,
  KERN_ACT_EXPONENTIAL,
  KERN_ACT__COUNT
} kern_act;

typedef enum {
  KERN_LOSS_MSE = 0,
  KERN_LOSS_MAE,
  KERN_LOSS_BCE_LOGITS,       /* sigmoid cross-entropy on logits */
  KERN_LOSS_BCE_PROBS,        /* on probabilities, clipped to [1e-7, 1-1e-7] */
  KERN_LOSS_CCE_LOGITS,       /* softmax cross-entropy, one-hot labels */
  KERN_LOSS_CCE_PROBS,
  KERN_LOSS_SPARSE_CCE_LOGITS,/* labels are class indices (as float) */
  KERN_LOSS_SPARSE_CCE_PROBS,
  KERN_LOSS_HUBER,            /* Keras huber: 0.5 e^2 for |e| <= delta, else
                                 delta (|e| - delta/2); param = delta */
  KERN_LOSS_KLD,              /* Keras kl_divergence on probabilities: labels
                                 and predictions clipped to [1e-7, 1],
                                 sum t log(t / p) */
  KERN_LOSS__COUNT
} kern_loss;

typedef enum { KERN_POOL_SUM = 0, KERN_POOL_MEAN } kern_pool;

typedef struct kern_ctx kern_ctx;

#define KERN_MAX_THREADS 256 /* kern_opts.cpu_threads */

typedef struct {
  kern_device device;
  int gpu_index;        /* which visible GPU (0-based) */
  int cpu_threads;      /* CPU threads (the caller and cpu_threads - 1
                         * workers that sleep while idle); <= 0 means 1
                         * (one per worker); at most KERN_MAX_THREADS
                         * (TSR_EINVAL) */
  const char *module_path; /* CUDA module file; NULL: search (kern_module_path) */
  bool force_module;    /* load the module even when no /dev/nvidia* exists
                         * (tests of the fallback) */
} kern_opts;

/* Opens a compute context. With KERN_DEVICE_AUTO and no usable GPU the CPU
 * backend is returned and the reason is logged once per process at info
 * level ("no GPU ...: using the CPU"). With KERN_DEVICE_GPU and none,
 * returns TSR_ENODEVICE and says why in `err`. */
int kern_open(const kern_opts *opts, kern_ctx **out, char *err, size_t errlen);
void kern_close(kern_ctx *ctx);

/* Number of GPUs the CUDA module sees (0 when it is not built, does not
 * load, or finds no device; `why` says which). With KERN_DEVICE_AUTO the
 * module is loaded only when a /dev/nvidia* node exists (or force_module);
 * KERN_DEVICE_GPU always loads it. */
int kern_gpu_count(const kern_opts *opts, int *count, char *why, size_t len);

/* Where the CUDA module is looked for: $TESSERA_MODULE_DIR, the build
 * tree, then the install directory; writes the first existing path (or the
 * install path when none exists) and returns 0 when it exists. */
int kern_module_path(char *buf, size_t len);

const char *kern_backend_name(const kern_ctx *ctx); /* "cpu" / "cuda" */
/* CPU threads the context's ops run on (kern_opts.cpu_threads as the CPU
 * backend started them); 1 on a GPU. */
int kern_threads(const kern_ctx *ctx);
/* What computes the CPU backend's convolutions: "oneDNN 2.6.3" or
 * "im2col + OpenBLAS" (the build without oneDNN, and the GPU module). */
const char *kern_conv_impl(const kern_ctx *ctx);
bool kern_is_host(const kern_ctx *ctx);
int kern_device_index(const kern_ctx *ctx);
/* The names a command line gives the devices, indexed by kern_device
 * ("auto", "cpu", "gpu"), NULL-terminated: a TSR_ARG_CHOICE's list. */
extern const char *const kern_device_names[];
/* Why the last op of this context that failed did ("gemm on cuda:
 * cublasGemmEx (bf16, 512 x 256 x 784): CUBLAS_STATUS_EXECUTION_FAILED
 * (...)"); "" after an op that succeeded. Owned by the context, valid until
 * its next op; same thread as the ops. */
const char *kern_last_error(const kern_ctx *ctx);

const char *kern_act_name(kern_act a);
/* Keras name to activation ("relu", "silu", "linear", None -> linear);
 * TSR_EUNSUPPORTED for a name not supported; kern_act_list() names them. */
int kern_act_parse(const char *name, kern_act *out);
const char *kern_act_list(void);
const char *kern_prec_name(kern_prec p);

/* ---- memory ------------------------------------------------------------ */
/* Device buffer (64-byte aligned on the CPU); NULL when out of memory. */
void *kern_alloc(kern_ctx *ctx, size_t bytes);
void kern_free(kern_ctx *ctx, void *p);
/* Host buffer that transfers fast (pinned on the GPU backend). */
void *kern_host_alloc(kern_ctx *ctx, size_t bytes);
void kern_host_free(kern_ctx *ctx, void *p);
int kern_upload(kern_ctx *ctx, void *dst, const void *src, size_t bytes);
int kern_download(kern_ctx *ctx, void *dst, const void *src, size_t bytes);
/* Device to device copy on the context's stream. */
int kern_copy(kern_ctx *ctx, void *dst, const void *src, size_t bytes);
int kern_sync(kern_ctx *ctx);

/* ---- ops (device pointers; sizes in elements) -------------------------- */
/* C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when
 * ta/tb. A is [m,k] (or [k,m] when ta), B is [k,n] (or [n,k] when tb).
 * A size over INT_MAX is TSR_ERANGE (OpenBLAS and cuBLAS take int sizes);
 * a negative one TSR_EINVAL. */
int kern_gemm(kern_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
              int64_t k, float alpha, const float *A, const float *B,
              float beta, float *C, kern_prec prec);

/* z[n,d] += bias (bias may be NULL), then y = act(z); y may equal z only
 * for the linear activation and relu (whose gradient y tells as well as
 * z: kern_act_grad may be given y for z). */
int kern_bias_act(kern_ctx *ctx, float *z, const float *bias, float *y,
                  int64_t n, int64_t d, kern_act act, float alpha);
/* dz = dy * act'(z) given z and y = act(z) (softmax: the row Jacobian). */
int kern_act_grad(kern_ctx *ctx, const float *dy, const float *z,
                  const float *y, float *dz, int64_t n, int64_t d,
                  kern_act act, float alpha);
/* db[d] = beta * db + sum over rows of dz[n,d] (the bias gradient). */
int kern_col_sum(kern_ctx *ctx, const float *dz, int64_t n, int64_t d,
                 float beta, float *db);

/* Loss of predictions p[n,d] (logits for the *_LOGITS kinds) against
 * labels y ([n,d], or [n] class indices for the sparse kinds): writes the
 * per-example losses to ex_loss[n] (may be NULL) and, when grad is not
 * NULL, dL/dp * grad_scale to grad[n,d] (grad_scale is typically
 * loss_scale / global batch). Keras reductions: mean over the last axis
 * for mse/mae/bce, sum over classes for cross-entropy. Labels out of range
 * for the sparse kinds give TSR_ERANGE (checked by the caller on the host
 * for the GPU). */
int kern_loss_eval(kern_ctx *ctx, kern_loss kind, const float *p,
                   const float *y, int64_t n, int64_t d, float grad_scale,
                   float *ex_loss, float *grad);
/* The same with the loss's parameter (Huber's delta; <= 0 means its
 * default, 1). Huber is a mean over the last axis like mse, KLD a sum. */
int kern_loss_eval_p(kern_ctx *ctx, kern_loss kind, float param,
                     const float *p, const float *y, int64_t n, int64_t d,
                     float grad_scale, float *ex_loss, float *grad);

/* Embedding lookup: for bag b in [0, nb), out[b*stride + off .. +dim) =
 * pool(rows[idx[j]] for j in [bag_off[b], bag_off[b+1])), rows [*, dim]. */
int kern_embed_gather(kern_ctx *ctx, const float *rows, int64_t dim,
                      const int32_t *idx, const int32_t *bag_off,
                      int64_t nb, kern_pool pool, float *out,
                      int64_t stride, int64_t off);
/* The backward of kern_embed_gather, with ids already sorted and
 * de-duplicated: for unique row u, grad[u*dim..] = sum over its occurrences
 * j in [occ_off[u], occ_off[u+1]) of occ_w[j] * dout[occ_bag[j]*stride+off..].
 * Deterministic (no atomics): each row sums its own occurrences. */
int kern_embed_scatter(kern_ctx *ctx, const float *dout, int64_t stride,
                       int64_t off, int64_t dim, const int32_t *occ_off,
                       const int32_t *occ_bag, const float *occ_w,
                       int64_t n_uniq, float *grad);

/* x = round(x) to the 16-bit precision (in place); no-op for KERN_F32. */
int kern_round(kern_ctx *ctx, float *x, size_t n, kern_prec prec);
/* *finite = every element of x is finite (the loss-scale check). */
int kern_all_finite(kern_ctx *ctx, const float *x, size_t n, bool *finite);
int kern_scale(kern_ctx *ctx, float *x, size_t n, float alpha);
/* y += alpha * x */
int kern_axpy(kern_ctx *ctx, float *y, const float *x, size_t n, float alpha);
/* Inverted dropout: mask[i] = keep ? 1/(1-rate) : 0 from a counter-based
 * draw keyed by (seed, i); x *= mask. kern_mul multiplies elementwise
 * (the backward). */
int kern_dropout(kern_ctx *ctx, float *x, float *mask, size_t n, float rate,
                 uint64_t seed);
int kern_mul(kern_ctx *ctx, float *x, const float *mask, size_t n);

/* Sums bufs[r][0..n) over replicas in place (each r on ctxs[r]); with
 * several GPUs through NCCL (an in-process communicator, built once per
 * replica set and cached in the first context); with one context a no-op.
 * All contexts must belong to the same backend. */
int kern_allreduce_sum(kern_ctx *const *ctxs, float *const *bufs, int n_ctx,
                       size_t n);

/* OpenBLAS kernel in use ("Haswell", "SkylakeX", ...) for reports. */
const char *kern_cpu_corename(void);

#endif
