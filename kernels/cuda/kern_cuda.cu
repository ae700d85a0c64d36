/* The CUDA backend as a dlopen()ed module: exports kern_cuda_module_v1
 * (kern_int.h) with the device count and the ops table.
 *
 * Happy path: device_count() -> open() checks the device (compute
 * capability 8.0 or newer: the module holds sm_80 and sm_90 code), makes a
 * stream and a cuBLAS handle on it -> ops enqueue on that stream;
 * downloads and the finiteness check synchronize. Products go through
 * cublasGemmEx with fp32 compute, arguments from kern_plan_gemm (the
 * mapping the CPU tests check); bf16/fp16 inputs are cast by a kernel into
 * scratch first. Several replicas sum their gradients with NCCL, loaded
 * with dlopen on first use so a single GPU never needs it; the
 * communicators are built once per replica set (ncclCommInitAll) and
 * cached in the first replica's context.
 * Failure modes: no driver (cudaGetDeviceCount gives error 35 and leaves
 * the count unset: we report 0 devices with the reason), a device older
 * than sm_80 (open refuses it, naming it and its capability), a size over
 * cuBLAS's int arguments (TSR_ERANGE), allocation failures (TSR_ENOMEM),
 * CUDA, cuBLAS and NCCL errors (TSR_EIO, TSR_EUNAVAIL). Every failure
 * leaves its CUDA/cuBLAS error name and the operation in last_error; a
 * failed open frees all it made.
 */
#include "kernels/cuda/cuda_int.h"
#include "kernels/kern_plan.h"
#include "kernels/kern_nn_int.h"
#include "kernels/kern_seq_int.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kc__fail(kc_ctx *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->msg, sizeof c->msg, fmt, ap);
  va_end(ap);
  return rc;
}

int kc__cuda_fail(kc_ctx *c, cudaError_t e, const char *op) {
  if (e == cudaSuccess) return 0;
  int rc = e == cudaErrorMemoryAllocation ? TSR_ENOMEM
           : e == cudaErrorNoKernelImageForDevice ||
                   e == cudaErrorUnsupportedPtxVersion
               ? TSR_EUNSUPPORTED
               : TSR_EIO;
  return kc__fail(c, rc, "%s: %s (%s)", op, cudaGetErrorName(e),
                  cudaGetErrorString(e));
}

int kc__blas_fail(kc_ctx *c, cublasStatus_t s, const char *op) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  int rc = s == CUBLAS_STATUS_ALLOC_FAILED ? TSR_ENOMEM
           : s == CUBLAS_STATUS_NOT_SUPPORTED ||
                   s == CUBLAS_STATUS_ARCH_MISMATCH
               ? TSR_EUNSUPPORTED
           : s == CUBLAS_STATUS_INVALID_VALUE ? TSR_EINVAL
                                              : TSR_EIO;
  return kc__fail(c, rc, "%s: %s (%s)", op, cublasGetStatusName(s),
                  cublasGetStatusString(s));
}

int kc__launch_check(kc_ctx *c, const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  char what[96];
  snprintf(what, sizeof what, "%s kernel launch", op);
  return kc__cuda_fail(c, e, what);
}

int kc__scratch(kc_ctx *c, void **p, size_t *have, size_t bytes,
                const char *what) {
  if (*have >= bytes) return 0;
  if (*p) cudaFree(*p);
  *p = NULL;
  *have = 0;
  size_t want = bytes + bytes / 4;
  cudaError_t e = cudaMalloc(p, want);
  if (e != cudaSuccess) {
    *p = NULL;
    cudaGetLastError(); /* not sticky: later calls may still succeed */
    char op[128];
    snprintf(op, sizeof op, "cudaMalloc of %zu bytes for %s", want, what);
    return kc__cuda_fail(c, e, op);
  }
  *have = want;
  return 0;
}

static int kc_device_count(int *count, char *why, size_t len) {
  int n = 0; /* left unset by the runtime when there is no driver */
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why && len)
      snprintf(why, len, "cudaGetDeviceCount: %s (%s, error %d)",
               cudaGetErrorName(e), cudaGetErrorString(e), (int)e);
    cudaGetLastError(); /* clear the sticky error */
    *count = 0;
    return 0;
  }
  *count = n;
  if (n == 0 && why && len) snprintf(why, len, "no CUDA device");
  return 0;
}


/* Frees what a context holds, whatever open got to. */
static void kc_release(kc_ctx *c);

static int kc_open(void **impl, int device, int threads, char *err,
                   size_t len) {
  kc_ctx *c = (kc_ctx *)calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  c->dev = device;
  int rc = TSR_ENODEVICE;
  cudaDeviceProp prop;
  cublasStatus_t bs;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    kc__cuda_fail(c, e, "cudaSetDevice");
    goto fail;
  }
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    kc__cuda_fail(c, e, "cudaGetDeviceProperties");
    goto fail;
  }
  if (kern_plan_check_device(device, prop.name, prop.major, prop.minor,
                             err, len))
    goto fail_said;
  if ((e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking))) {
    kc__cuda_fail(c, e, "cudaStreamCreateWithFlags");
    goto fail;
  }
  if ((e = cudaMalloc((void **)&c->flag, sizeof(int)))) {
    kc__cuda_fail(c, e, "cudaMalloc");
    goto fail;
  }
  if ((e = cudaMallocHost((void **)&c->hflag, sizeof(int)))) {
    kc__cuda_fail(c, e, "cudaMallocHost");
    goto fail;
  }
  if ((bs = cublasCreate(&c->blas))) {
    c->blas = NULL;
    kc__blas_fail(c, bs, "cublasCreate");
    goto fail;
  }
  if ((bs = cublasSetStream(c->blas, c->s))) {
    kc__blas_fail(c, bs, "cublasSetStream");
    goto fail;
  }
  *impl = c;
  return 0;
fail:
  if (err && len) snprintf(err, len, "GPU %d: %s", device, c->msg);
fail_said:
  cudaGetLastError();
  kc_release(c);
  return rc;
}

/* NCCL through dlopen: only multi-GPU workers load it. */
typedef ncclResult_t (*nccl_init_all_fn)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*nccl_group_fn)(void);
typedef ncclResult_t (*nccl_allreduce_fn)(const void *, void *, size_t,
                                          ncclDataType_t, ncclRedOp_t,
                                          ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_destroy_fn)(ncclComm_t);
typedef const char *(*nccl_errstr_fn)(ncclResult_t);
typedef struct {
  int n;
  int devs[16];
  ncclComm_t comms[16];
  nccl_group_fn start, end;
  nccl_allreduce_fn allreduce;
  nccl_destroy_fn destroy;
  nccl_errstr_fn errstr;
} kc_nccl;

static void kc_release(kc_ctx *c) {
  cudaSetDevice(c->dev);
  if (c->s) cudaStreamSynchronize(c->s);
  if (c->nccl) {
    kc_nccl *nc = (kc_nccl *)c->nccl;
    for (int i = 0; i < nc->n; i++) nc->destroy(nc->comms[i]);
    free(nc);
  }
  if (c->blas) cublasDestroy(c->blas);
  cudaFree(c->half_a);
  cudaFree(c->half_b);
  cudaFree(c->part);
  cudaFree(c->nn_part);
  cudaFree(c->flag);
  cudaFreeHost(c->hflag);
  if (c->s) cudaStreamDestroy(c->s);
  free(c);
}

static void kc_close(void *impl) { kc_release((kc_ctx *)impl); }

static const char *kc_last_error(void *impl) { return ((kc_ctx *)impl)->msg; }

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
  if (e != cudaSuccess) return kc__cuda_fail(c, e, "upload: cudaMemcpyAsync");
  return kc__cuda_fail(c, cudaStreamSynchronize(c->s),
                       "upload: cudaStreamSynchronize");
}
static int kc_download(void *impl, void *dst, const void *src, size_t b) {
  C(impl);
  SETDEV(c);
  cudaError_t e = cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToHost, c->s);
  if (e != cudaSuccess) return kc__cuda_fail(c, e, "download: cudaMemcpyAsync");
  return kc__cuda_fail(c, cudaStreamSynchronize(c->s),
                       "download: cudaStreamSynchronize");
}
static int kc_copy(void *impl, void *dst, const void *src, size_t b) {
  C(impl);
  SETDEV(c);
  return kc__cuda_fail(
      c, cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, c->s),
      "copy: cudaMemcpyAsync");
}
static int kc_sync(void *impl) {
  C(impl);
  SETDEV(c);
  return kc__cuda_fail(c, cudaStreamSynchronize(c->s),
                       "sync: cudaStreamSynchronize");
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
 * arguments come from kern_plan_gemm. */
static int kc_gemm(void *impl, bool ta, bool tb, int64_t m, int64_t n,
                   int64_t k, float alpha, const float *A, const float *B,
                   float beta, float *Cm, kern_prec prec) {
  C(impl);
  SETDEV(c);
  kern_gemm_args g;
  if (kern_plan_gemm(ta, tb, m, n, k, &g))
    return kc__fail(c, TSR_ERANGE, "gemm %lld x %lld x %lld: cuBLAS takes "
                    "sizes up to %d", (long long)m, (long long)n,
                    (long long)k, INT_MAX);
  const void *a = A, *b = B;
  cudaDataType_t t = CUDA_R_32F;
  if (prec != KERN_F32 && k > 0) {
    size_t na = (size_t)(m * k), nb = (size_t)(k * n);
    int rc;
    if ((rc = kc__scratch(c, &c->half_a, &c->half_a_bytes, na * 2,
                          "a 16-bit GEMM input")) ||
        (rc = kc__scratch(c, &c->half_b, &c->half_b_bytes, nb * 2,
                          "a 16-bit GEMM input")) ||
        (rc = kc__to_half(c, A, c->half_a, na, prec)) ||
        (rc = kc__to_half(c, B, c->half_b, nb, prec)))
      return rc;
    a = c->half_a;
    b = c->half_b;
    t = prec == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  cublasStatus_t s = cublasGemmEx(
      c->blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, b, t,
      g.lda, a, t, g.ldb, &beta, Cm, CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char op[160];
  snprintf(op, sizeof op, "cublasGemmEx (%s, %lld x %lld x %lld%s%s)",
           prec == KERN_BF16 ? "bf16" : prec == KERN_F16 ? "fp16" : "fp32",
           (long long)m, (long long)n, (long long)k,
           ta ? ", A transposed" : "", tb ? ", B transposed" : "");
  return kc__blas_fail(c, s, op);
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

/* The communicators of this replica set; NULL with the reason in the first
 * context's message when NCCL does not load or initialise. */
static kc_nccl *kc_nccl_get(kc_ctx *const *cs, int n) {
  kc_ctx *c0 = cs[0];
  kc_nccl *nc = (kc_nccl *)c0->nccl;
  if (nc && nc->n == n) {
    bool same = true;
    for (int i = 0; i < n; i++) same &= nc->devs[i] == cs[i]->dev;
    if (same) return nc;
  }
  if (nc) {
    kc__fail(c0, 0, "all-reduce: GPU %d already belongs to another replica "
             "set", c0->dev);
    return NULL;
  }
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    kc__fail(c0, 0, "cannot load NCCL for %d GPUs: %s", n, dlerror());
    return NULL;
  }
  nc = (kc_nccl *)calloc(1, sizeof *nc);
  if (!nc) {
    kc__fail(c0, 0, "out of memory for the NCCL communicators");
    return NULL;
  }
  nccl_init_all_fn init = (nccl_init_all_fn)dlsym(h, "ncclCommInitAll");
  nc->start = (nccl_group_fn)dlsym(h, "ncclGroupStart");
  nc->end = (nccl_group_fn)dlsym(h, "ncclGroupEnd");
  nc->allreduce = (nccl_allreduce_fn)dlsym(h, "ncclAllReduce");
  nc->destroy = (nccl_destroy_fn)dlsym(h, "ncclCommDestroy");
  nc->errstr = (nccl_errstr_fn)dlsym(h, "ncclGetErrorString");
  nc->n = n;
  for (int i = 0; i < n; i++) nc->devs[i] = cs[i]->dev;
  if (!init || !nc->start || !nc->end || !nc->allreduce || !nc->destroy) {
    kc__fail(c0, 0, "the NCCL library lacks ncclCommInitAll, ncclGroupStart, "
             "ncclGroupEnd, ncclAllReduce or ncclCommDestroy");
    free(nc);
    return NULL;
  }
  ncclResult_t r = init(nc->comms, n, nc->devs);
  if (r != ncclSuccess) {
    kc__fail(c0, 0, "ncclCommInitAll for %d GPUs: %s", n,
             nc->errstr ? nc->errstr(r) : "error");
    free(nc);
    return NULL;
  }
  c0->nccl = nc;
  return nc;
}

static int kc_allreduce(void *const *impls, float *const *bufs, int n,
                        size_t count) {
  kc_ctx *cs[16] = {NULL};
  if (n > 16)
    return kc__fail((kc_ctx *)impls[0], TSR_ERANGE,
                    "all-reduce over %d GPUs: at most 16", n);
  for (int i = 0; i < n; i++) cs[i] = (kc_ctx *)impls[i];
  kc_nccl *nc = kc_nccl_get(cs, n);
  if (!nc) return TSR_EUNAVAIL; /* kc_nccl_get said why */
  ncclResult_t r = nc->start(), r2 = ncclSuccess;
  if (r != ncclSuccess)
    return kc__fail(cs[0], TSR_EIO, "ncclGroupStart: %s",
                    nc->errstr ? nc->errstr(r) : "error");
  for (int i = 0; i < n && r == ncclSuccess; i++)
    r = nc->allreduce(bufs[i], bufs[i], count, ncclFloat, ncclSum,
                      nc->comms[i], cs[i]->s);
  r2 = nc->end();
  if (r == ncclSuccess) r = r2;
  if (r != ncclSuccess)
    return kc__fail(cs[0], TSR_EIO, "ncclAllReduce over %d GPUs: %s", n,
                    nc->errstr ? nc->errstr(r) : "error");
  return 0;
}

static const kern__ops kc_ops = {
    "cuda", false, kc_open, kc_close, kc_alloc, kc_free, kc_host_alloc,
    kc_host_free, kc_upload, kc_download, kc_copy, kc_sync, kc_gemm,
    kc_bias_act, kc_act_grad, kc_col_sum, kc_loss, kc_gather, kc_scatter,
    kc_round, kc_all_finite, kc_scale, kc_axpy, kc_dropout, kc_mul,
    kc_allreduce, kc_last_error, &kc__nn_ops, &kc__seq_ops,
    NULL /* threads: one host thread drives the device */};

extern "C" __attribute__((visibility("default")))
const kern__module kern_cuda_module_v1 = {KERN__ABI, &kc_ops, kc_device_count};
