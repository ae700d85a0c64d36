/* What the CUDA module exports for kern_nccl.h, under its own symbol so
 * the compute vtable (kern_int.h) does not change for it. Plain C so nvcc
 * can include it. Every function returns 0 or a TSR_E* code; the reason of
 * a failure goes to `err` (setup) or to the context's last error (ops). */
#ifndef TSR_KERN_NCCL_INT_H
#define TSR_KERN_NCCL_INT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN__NCCL_ABI 1
#define KERN__NCCL_SYMBOL "kern_cuda_nccl_v1"

typedef struct {
  int abi;  /* KERN__NCCL_ABI */
  /* impl is the CUDA context (the kern__ops impl of the module) */
  int (*available)(void *impl, char *err, size_t len);
  int (*unique_id)(void *impl, uint8_t *id, char *err, size_t len);
  int (*open)(void *impl, const uint8_t *id, int nranks, int rank,
              void **comm, char *err, size_t len);
  int (*allreduce)(void *impl, void *comm, float *dev, size_t n);
  int (*broadcast)(void *impl, void *comm, void *dev, size_t bytes,
                   int root);
  void (*close)(void *impl, void *comm);
} kern__nccl_module;

#ifdef __cplusplus
}
#endif

#endif
