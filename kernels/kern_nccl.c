/* kern_nccl.h front end: finds the CUDA module's NCCL entry points (its
 * kern_cuda_nccl_v1 symbol) and forwards to them with the context's
 * backend state. On the CPU backend, or with a module that has no NCCL
 * entry points, every setup call answers TSR_ENODEVICE saying why.
 */
#include "kernels/kern_nccl.h"
#include "kernels/kern_int.h"
#include "kernels/kern_nccl_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

struct kern_nccl {
  const kern__nccl_module *m;
  void *impl;
  void *comm;
};

static const kern__nccl_module *nccl_module(kern_ctx *ctx, char *err,
                                            size_t errlen) {
  if (kern_is_host(ctx)) {
    tsr_errf(err, errlen, TSR_ENODEVICE, "NCCL needs a GPU context (this one "
             "is %s)", kern_backend_name(ctx));
    return NULL;
  }
  const kern__nccl_module *m = kern__module_sym(KERN__NCCL_SYMBOL);
  if (!m || m->abi != KERN__NCCL_ABI) {
    tsr_errf(err, errlen, TSR_ENODEVICE, "the CUDA module %s",
             m ? "has another NCCL ABI version than this binary"
               : "has no NCCL entry points");
    return NULL;
  }
  return m;
}

int kern_nccl_available(kern_ctx *ctx, char *err, size_t errlen) {
  const kern__nccl_module *m = nccl_module(ctx, err, errlen);
  if (!m) return TSR_ENODEVICE;
  return m->available(kern__ctx_impl(ctx), err, errlen);
}

int kern_nccl_unique_id(kern_ctx *ctx, uint8_t id[KERN_NCCL_ID_BYTES],
                        char *err, size_t errlen) {
  const kern__nccl_module *m = nccl_module(ctx, err, errlen);
  if (!m) return TSR_ENODEVICE;
  return m->unique_id(kern__ctx_impl(ctx), id, err, errlen);
}

int kern_nccl_open(kern_ctx *ctx, const uint8_t id[KERN_NCCL_ID_BYTES],
                   int nranks, int rank, kern_nccl **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return tsr_errf(err, errlen, TSR_EINVAL, "NCCL: rank %d of %d", rank,
                    nranks);
  const kern__nccl_module *m = nccl_module(ctx, err, errlen);
  if (!m) return TSR_ENODEVICE;
  kern_nccl *c = calloc(1, sizeof *c);
  if (!c) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  c->m = m;
  c->impl = kern__ctx_impl(ctx);
  int rc = m->open(c->impl, id, nranks, rank, &c->comm, err, errlen);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int kern_nccl_allreduce(kern_nccl *c, float *dev, size_t n) {
  return c->m->allreduce(c->impl, c->comm, dev, n);
}

int kern_nccl_broadcast(kern_nccl *c, void *dev, size_t bytes, int root) {
  return c->m->broadcast(c->impl, c->comm, dev, bytes, root);
}

void kern_nccl_close(kern_nccl *c) {
  if (!c) return;
  c->m->close(c->impl, c->comm);
  free(c);
}
