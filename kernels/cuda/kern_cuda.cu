/* The CUDA backend as a dlopen()ed module: exports kern_cuda_module_v1
 * (kern_int.h) with the device count and the ops table.
 *
 * Happy path: device_count() -> open() a stream and a cuBLAS handle on the
 * context's GPU -> ops enqueue on that stream; downloads and the finiteness
 * check synchronize. Products go through cublasGemmEx with fp32 compute
 * (bf16/fp16 inputs cast by a kernel into scratch first). Several replicas
 * sum their gradients with NCCL, loaded with dlopen on first use so a
 * single GPU never needs it; the communicators are built once per replica
 * set (ncclCommInitAll) and cached in the first replica's context.
 * Failure modes: no driver (cudaGetDeviceCount gives error 35 and leaves
 * the count unset: we report 0 devices with the reason), allocation
 * failures (TSR_ENOMEM), cuBLAS/NCCL errors (TSR_EIO / TSR_EUNAVAIL).
 */
#include "kernels/cuda/cuda_int.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

int kc__err(cudaError_t e) {
  if (e == cudaSuccess) return 0;
  if (e == cudaErrorMemoryAllocation) return TSR_ENOMEM;
  return TSR_EIO;
}

int kc__launch_check(void) { return kc__err(cudaGetLastError()); }

int kc__scratch(void **p, size_t *have, size_t bytes) {
  if (*have >= bytes) return 0;
  if (*p) cudaFree(*p);
  *p = NULL;
  *have = 0;
  size_t want = bytes + bytes / 4;
  cudaError_t e = cudaMalloc(p, want);
  if (e != cudaSuccess) {
    *p = NULL;
    return kc__err(e);
  }
  *have = want;
  return 0;
}

static int kc_device_count(int *count, char *why, size_t len) {
  int n = 0; /* left unset by the runtime when there is no driver */
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why && len)
      snprintf(why, len, "cudaGetDeviceCount: %s (error %d)",
               cudaGetErrorString(e), (int)e);
    cudaGetLastError(); /* clear the sticky error */
    *count = 0;
    return 0;
  }
  *count = n;
  if (n == 0 && why && len) snprintf(why, len, "no CUDA device");
  return 0;
}

#define C(impl) kc_ctx *c = (kc_ctx *)(impl)
#define SETDEV(c)                                           \
  do {                                                      \
    cudaError_t se_ = cudaSetDevice((c)->dev);              \
    if (se_ != cudaSuccess) return kc__err(se_);            \
  } while (0)

static int kc_open(void **impl, int device, int threads, char *err,
                   size_t len) {
  kc_ctx *c = (kc_ctx *)calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  c->dev = device;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)&c->flag, sizeof(int));
  if (e == cudaSuccess) e = cudaMallocHost((void **)&c->hflag, sizeof(int));
  if (e != cudaSuccess) {
    snprintf(err, len, "GPU %d: %s", device, cudaGetErrorString(e));
    free(c);
    return TSR_ENODEVICE;
  }
  cublasStatus_t bs = cublasCreate(&c->blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->s);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, len, "GPU %d: cuBLAS initialisation failed (status %d)",
             device, (int)bs);
    free(c);
    return TSR_ENODEVICE;
  }
  *impl = c;
  return 0;
}

/* NCCL through dlopen: only multi-GPU workers load it. */
typedef ncclResult_t (*nccl_init_all_fn)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*nccl_group_fn)(void);
typedef ncclResult_t (*nccl_allreduce_fn)(const void *, void *, size_t,
                                          ncclDataType_t, ncclRedOp_t,
                                          ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_destroy_fn)(ncclComm_t);
typedef struct {
  int n;
  int devs[16];
  ncclComm_t comms[16];
  nccl_group_fn start, end;
  nccl_allreduce_fn allreduce;
  nccl_destroy_fn destroy;
} kc_nccl;

static void kc_close(void *impl) {
  C(impl);
  cudaSetDevice(c->dev);
  cudaStreamSynchronize(c->s);
  if (c->nccl) {
    kc_nccl *nc = (kc_nccl *)c->nccl;
    for (int i = 0; i < nc->n; i++) nc->destroy(nc->comms[i]);
    free(nc);
  }
  cublasDestroy(c->blas);
  cudaFree(c->half_a);
  cudaFree(c->half_b);
  cudaFree(c->part);
  cudaFree(c->flag);
  cudaFreeHost(c->hflag);
  cudaStreamDestroy(c->s);
  free(c);
}

static void *kc_alloc(void *impl, size_t bytes) {
  C(impl);
  if (cudaSetDevice(c->dev) != cudaSuccess) return NULL;
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}
static void kc_free(void *impl, void *p) {
  C(impl);
  cudaSetDevice(c->dev);
  cudaStreamSynchronize(c->s);
  cudaFree(p);
}
static void *kc_host_alloc(void *impl, size_t bytes) {
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 4) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}
static void kc_host_free(void *impl, void *p) { cudaFreeHost(p); }

/* Uploads wait for the copy: callers reuse their host buffers at once. */
static int kc_upload(void *impl, void *dst, const void *src, size_t b) {
  C(impl);
  SETDEV(c);
  cudaError_t e = cudaMemcpyAsync(dst, src, b, cudaMemcpyHostToDevice, c->s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
  return kc__err(e);
}
static int kc_download(void *impl, void *dst, const void *src, size_t b) {
  C(impl);
  SETDEV(c);
  cudaError_t e = cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToHost, c->s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
  return kc__err(e);
}
static int kc_memset0(void *impl, void *p, size_t b) {
  C(impl);
  SETDEV(c);
  return kc__err(cudaMemsetAsync(p, 0, b, c->s));
}
static int kc_copy(void *impl, void *dst, const void *src, size_t b) {
  C(impl);
  SETDEV(c);
  return kc__err(cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, c->s));
}
static int kc_sync(void *impl) {
  C(impl);
  SETDEV(c);
  return kc__err(cudaStreamSynchronize(c->s));
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
static int kc_gemm(void *impl, bool ta, bool tb, int64_t m, int64_t n,
                   int64_t k, float alpha, const float *A, const float *B,
                   float beta, float *Cm, kern_prec prec) {
  C(impl);
  SETDEV(c);
  const void *a = A, *b = B;
  cudaDataType_t t = CUDA_R_32F;
  if (prec != KERN_F32) {
    size_t na = (size_t)(m * k), nb = (size_t)(k * n);
    int rc;
    if ((rc = kc__scratch(&c->half_a, &c->half_a_n, na * 2)) ||
        (rc = kc__scratch(&c->half_b, &c->half_b_n, nb * 2)) ||
        (rc = kc__to_half(c, A, c->half_a, na, prec)) ||
        (rc = kc__to_half(c, B, c->half_b, nb, prec)))
      return rc;
    a = c->half_a;
    b = c->half_b;
    t = prec == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  cublasStatus_t s = cublasGemmEx(
      c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      (int)n, (int)m, (int)k, &alpha, b, t, tb ? (int)k : (int)n, a, t,
      ta ? (int)m : (int)k, &beta, Cm, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? 0 : TSR_EIO;
}

#define FWD(name, sig, args) \
  static int kc_##name sig { C(impl); SETDEV(c); return kc__##name args; }

FWD(bias_act, (void *impl, float *z, const float *bias, float *y, int64_t n,
               int64_t d, kern_act act, float alpha),
    (c, z, bias, y, n, d, act, alpha))
FWD(act_grad, (void *impl, const float *dy, const float *z, const float *y,
               float *dz, int64_t n, int64_t d, kern_act act, float alpha),
    (c, dy, z, y, dz, n, d, act, alpha))
FWD(col_sum, (void *impl, const float *dz, int64_t n, int64_t d, float beta,
              float *db),
    (c, dz, n, d, beta, db))
FWD(loss, (void *impl, kern_loss kind, float param, const float *p,
           const float *y, int64_t n, int64_t d, float s, float *ex,
           float *g),
    (c, kind, param, p, y, n, d, s, ex, g))
FWD(gather, (void *impl, const float *rows, int64_t dim, const int32_t *idx,
             const int32_t *bag_off, int64_t nb, kern_pool pool, float *out,
             int64_t stride, int64_t off),
    (c, rows, dim, idx, bag_off, nb, pool, out, stride, off))
FWD(scatter, (void *impl, const float *dout, int64_t stride, int64_t off,
              int64_t dim, const int32_t *occ_off, const int32_t *occ_bag,
              const float *occ_w, int64_t n_uniq, float *grad),
    (c, dout, stride, off, dim, occ_off, occ_bag, occ_w, n_uniq, grad))
FWD(round, (void *impl, float *x, size_t n, kern_prec p), (c, x, n, p))
FWD(all_finite, (void *impl, const float *x, size_t n, bool *f), (c, x, n, f))
FWD(scale, (void *impl, float *x, size_t n, float a), (c, x, n, a))
FWD(axpy, (void *impl, float *y, const float *x, size_t n, float a),
    (c, y, x, n, a))
FWD(dropout, (void *impl, float *x, float *mask, size_t n, float rate,
              uint64_t seed),
    (c, x, mask, n, rate, seed))
FWD(mul, (void *impl, float *x, const float *m, size_t n), (c, x, m, n))

static kc_nccl *kc_nccl_get(kc_ctx *const *cs, int n) {
  kc_ctx *c0 = cs[0];
  kc_nccl *nc = (kc_nccl *)c0->nccl;
  if (nc && nc->n == n) {
    bool same = true;
    for (int i = 0; i < n; i++) same &= nc->devs[i] == cs[i]->dev;
    if (same) return nc;
  }
  if (nc) return NULL; /* a different replica set on the same context */
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "tessera: cannot load NCCL for %d GPUs: %s\n", n,
            dlerror());
    return NULL;
  }
  nc = (kc_nccl *)calloc(1, sizeof *nc);
  if (!nc) return NULL;
  nccl_init_all_fn init = (nccl_init_all_fn)dlsym(h, "ncclCommInitAll");
  nc->start = (nccl_group_fn)dlsym(h, "ncclGroupStart");
  nc->end = (nccl_group_fn)dlsym(h, "ncclGroupEnd");
  nc->allreduce = (nccl_allreduce_fn)dlsym(h, "ncclAllReduce");
  nc->destroy = (nccl_destroy_fn)dlsym(h, "ncclCommDestroy");
  nc->n = n;
  for (int i = 0; i < n; i++) nc->devs[i] = cs[i]->dev;
  if (!init || !nc->start || !nc->end || !nc->allreduce || !nc->destroy ||
      init(nc->comms, n, nc->devs) != ncclSuccess) {
    fprintf(stderr, "tessera: NCCL communicator for %d GPUs failed\n", n);
    free(nc);
    return NULL;
  }
  c0->nccl = nc;
  return nc;
}

static int kc_allreduce(void *const *impls, float *const *bufs, int n,
                        size_t count) {
  if (n > 16) return TSR_ERANGE;
  kc_ctx *cs[16];
  for (int i = 0; i < n; i++) cs[i] = (kc_ctx *)impls[i];
  kc_nccl *nc = kc_nccl_get(cs, n);
  if (!nc) return TSR_EUNAVAIL;
  if (nc->start() != ncclSuccess) return TSR_EIO;
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n && r == ncclSuccess; i++)
    r = nc->allreduce(bufs[i], bufs[i], count, ncclFloat, ncclSum,
                      nc->comms[i], cs[i]->s);
  ncclResult_t r2 = nc->end();
  return r == ncclSuccess && r2 == ncclSuccess ? 0 : TSR_EIO;
}

static const kern__ops kc_ops = {
    "cuda", false, kc_open, kc_close, kc_alloc, kc_free, kc_host_alloc,
    kc_host_free, kc_upload, kc_download, kc_memset0, kc_copy, kc_sync,
    kc_gemm, kc_bias_act, kc_act_grad, kc_col_sum, kc_loss, kc_gather,
    kc_scatter, kc_round, kc_all_finite, kc_scale, kc_axpy, kc_dropout,
    kc_mul, kc_allreduce};

extern "C" __attribute__((visibility("default")))
const kern__module kern_cuda_module_v1 = {KERN__ABI, &kc_ops, kc_device_count};
