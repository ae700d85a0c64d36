/* NCCL among processes (kernels/kern_nccl.h), exported as
 * kern_cuda_nccl_v1: one GPU per rank, a communicator from an id rank 0
 * makes (ncclGetUniqueId) and every rank passes to ncclCommInitRank, then
 * ncclAllReduce / ncclBroadcast on the context's stream.
 *
 * libnccl.so.2 is loaded with dlopen the first time any of this is asked
 * for (once per process, never unloaded), as the in-process replica
 * communicators of kern_cuda.cu load it: a machine without NCCL still
 * runs the rest of the module.
 * Failure modes: NCCL missing or lacking an entry point (TSR_ENODEVICE,
 * with dlerror's text), a NCCL call that fails (TSR_EIO naming the call
 * and ncclGetErrorString's text, recorded in the context's message).
 */
#include "kernels/cuda/cuda_int.h"
#include "kernels/kern_nccl_int.h"

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef ncclResult_t (*kn_id_fn)(ncclUniqueId *);
typedef ncclResult_t (*kn_init_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*kn_allreduce_fn)(const void *, void *, size_t,
                                        ncclDataType_t, ncclRedOp_t,
                                        ncclComm_t, cudaStream_t);
typedef ncclResult_t (*kn_bcast_fn)(const void *, void *, size_t,
                                    ncclDataType_t, int, ncclComm_t,
                                    cudaStream_t);
typedef ncclResult_t (*kn_destroy_fn)(ncclComm_t);
typedef const char *(*kn_errstr_fn)(ncclResult_t);

static struct {
  pthread_once_t once;
  char why[256];       /* why it did not load; "" when it did */
  kn_id_fn id;
  kn_init_fn init;
  kn_allreduce_fn allreduce;
  kn_bcast_fn bcast;
  kn_destroy_fn destroy;
  kn_errstr_fn errstr;
} kn = {PTHREAD_ONCE_INIT, "", NULL, NULL, NULL, NULL, NULL, NULL};

static void kn_load(void) {
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(kn.why, sizeof kn.why, "cannot load NCCL: %s", dlerror());
    return;
  }
  kn.id = (kn_id_fn)dlsym(h, "ncclGetUniqueId");
  kn.init = (kn_init_fn)dlsym(h, "ncclCommInitRank");
  kn.allreduce = (kn_allreduce_fn)dlsym(h, "ncclAllReduce");
  kn.bcast = (kn_bcast_fn)dlsym(h, "ncclBroadcast");
  kn.destroy = (kn_destroy_fn)dlsym(h, "ncclCommDestroy");
  kn.errstr = (kn_errstr_fn)dlsym(h, "ncclGetErrorString");
  if (!kn.id || !kn.init || !kn.allreduce || !kn.bcast || !kn.destroy)
    snprintf(kn.why, sizeof kn.why, "the NCCL library lacks ncclGetUniqueId, "
             "ncclCommInitRank, ncclAllReduce, ncclBroadcast or "
             "ncclCommDestroy");
}

static const char *kn_err(ncclResult_t r) {
  return kn.errstr ? kn.errstr(r) : "error";
}

static int kn_ready(char *err, size_t len) {
  pthread_once(&kn.once, kn_load);
  if (!kn.why[0]) return 0;
  if (err && len) snprintf(err, len, "%s", kn.why);
  return TSR_ENODEVICE;
}

static int kn_available(void *impl, char *err, size_t len) {
  (void)impl;
  return kn_ready(err, len);
}

static int kn_unique_id(void *impl, uint8_t *id, char *err, size_t len) {
  (void)impl;
  int rc = kn_ready(err, len);
  if (rc) return rc;
  ncclUniqueId u;
  ncclResult_t r = kn.id(&u);
  if (r != ncclSuccess) {
    if (err && len) snprintf(err, len, "ncclGetUniqueId: %s", kn_err(r));
    return TSR_EIO;
  }
  static_assert(sizeof u == 128, "ncclUniqueId is 128 bytes");
  memcpy(id, &u, sizeof u);
  return 0;
}

static int kn_open(void *impl, const uint8_t *id, int nranks, int rank,
                   void **comm, char *err, size_t len) {
  kc_ctx *c = (kc_ctx *)impl;
  int rc = kn_ready(err, len);
  if (rc) return rc;
  cudaError_t e = cudaSetDevice(c->dev);
  if (e != cudaSuccess) {
    if (err && len) snprintf(err, len, "cudaSetDevice(%d): %s", c->dev,
                             cudaGetErrorName(e));
    return TSR_EIO;
  }
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclComm_t cm;
  ncclResult_t r = kn.init(&cm, nranks, u, rank);
  if (r != ncclSuccess) {
    if (err && len) snprintf(err, len, "ncclCommInitRank (rank %d of %d, "
                             "GPU %d): %s", rank, nranks, c->dev, kn_err(r));
    return TSR_EIO;
  }
  *comm = (void *)cm;
  return 0;
}

static int kn_allreduce(void *impl, void *comm, float *dev, size_t n) {
  C(impl);
  SETDEV(c);
  ncclResult_t r = kn.allreduce(dev, dev, n, ncclFloat, ncclSum,
                                (ncclComm_t)comm, c->s);
  if (r != ncclSuccess)
    return kc__fail(c, TSR_EIO, "ncclAllReduce of %zu floats: %s", n,
                    kn_err(r));
  return 0;
}

static int kn_broadcast(void *impl, void *comm, void *dev, size_t bytes,
                        int root) {
  C(impl);
  SETDEV(c);
  ncclResult_t r = kn.bcast(dev, dev, bytes, ncclUint8, root,
                            (ncclComm_t)comm, c->s);
  if (r != ncclSuccess)
    return kc__fail(c, TSR_EIO, "ncclBroadcast of %zu bytes from rank %d: %s",
                    bytes, root, kn_err(r));
  return 0;
}

static void kn_close(void *impl, void *comm) {
  kc_ctx *c = (kc_ctx *)impl;
  cudaSetDevice(c->dev);
  cudaStreamSynchronize(c->s);
  if (comm) kn.destroy((ncclComm_t)comm);
}

extern "C" __attribute__((visibility("default")))
const kern__nccl_module kern_cuda_nccl_v1 = {
    KERN__NCCL_ABI, kn_available, kn_unique_id, kn_open,
    kn_allreduce,   kn_broadcast, kn_close};
