/* NCCL among processes: one GPU per rank, a communicator made from an id
 * that rank 0 makes and every rank receives some other way (the workers
 * broadcast it over their own ring, common/coll), then all-reduce and
 * broadcast of device memory on the context's stream. It backs dense
 * "allreduce" on GPU workers; the CPU ring (common/coll) is the rest.
 *
 * NCCL lives in the CUDA module (kernels/cuda/nccl.cu), which loads
 * libnccl.so.2 with dlopen on first use, so a CPU build and a CPU run need
 * neither.
 *
 * Failure modes: a context that is not a GPU, a module without NCCL or a
 * NCCL that does not load: TSR_ENODEVICE with the reason in `err`; NCCL's
 * own errors: TSR_EIO naming the call and ncclGetErrorString's text (in
 * kern_last_error of the context after an op).
 *
 * Threads: a communicator is used by one thread at a time, with its
 * context.
 */
#ifndef TSR_KERN_NCCL_H
#define TSR_KERN_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"

/* ncclUniqueId's size. */
#define KERN_NCCL_ID_BYTES 128

typedef struct kern_nccl kern_nccl;

/* Whether ctx can take part (a GPU context with a NCCL that loads): 0, or
 * TSR_ENODEVICE with the reason. */
int kern_nccl_available(kern_ctx *ctx, char *err, size_t errlen);
/* A fresh communicator id (ncclGetUniqueId), on rank 0. */
int kern_nccl_unique_id(kern_ctx *ctx, uint8_t id[KERN_NCCL_ID_BYTES],
                        char *err, size_t errlen);
/* Joins communicator `id` as `rank` of `nranks` on ctx's GPU
 * (ncclCommInitRank): blocks until every rank has joined. */
int kern_nccl_open(kern_ctx *ctx, const uint8_t id[KERN_NCCL_ID_BYTES],
                   int nranks, int rank, kern_nccl **out, char *err,
                   size_t errlen);
/* Sums n floats of device memory in place over the ranks; ordered on the
 * context's stream (kern_download or kern_sync waits for it). */
int kern_nccl_allreduce(kern_nccl *c, float *dev, size_t n);
/* Root's `bytes` of device memory to every rank, in place. */
int kern_nccl_broadcast(kern_nccl *c, void *dev, size_t bytes, int root);
void kern_nccl_close(kern_nccl *c);

#endif
