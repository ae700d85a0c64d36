/* How the GPU backend turns a kern.h call into library arguments and
 * launches, as pure functions the CPU tests run (tests/unit/kernels/
 * test_kern_plan.c checks the GEMM mapping against cblas_sgemm in
 * column-major order and simulates every launch's index coverage):
 *
 *   - the row-major GEMM of kern_gemm as cuBLAS's column-major arguments;
 *   - grid sizes: grid-stride loops, a block per row, column-sum chunks;
 *   - the device check: compute capability 8.0 (sm_80) or newer.
 *
 * Failure modes: sizes that do not fit the int arguments of cuBLAS and
 * OpenBLAS or a grid dimension give TSR_ERANGE; an older device gives
 * TSR_ENODEVICE with a message naming it. Nothing here allocates.
 * Plain C that nvcc compiles too; the row bounds of a column-sum chunk are
 * __host__ __device__ so the kernel and the test share them.
 */
#ifndef TSR_KERN_PLAN_H
#define TSR_KERN_PLAN_H

#include "common/err.h"
#include "kernels/kern_math.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- GEMM ---------------------------------------------------------------
 * kern_gemm computes, row-major, C[m,n] = alpha op(A) op(B) + beta C with
 * A [m,k] ([k,m] when ta) and B [k,n] ([n,k] when tb). A row-major matrix
 * is its transpose in column-major order, so the same memory holds the
 * column-major C^T[n,m] = op(B)^T op(A)^T: cuBLAS is called with the
 * operands swapped (its A is our B), its sizes (n, m, k), and the leading
 * dimensions of the row-major arrays (their row lengths). */
typedef struct {
  bool trans_a, trans_b; /* cuBLAS's transa / transb */
  int m, n, k;           /* cuBLAS's sizes */
  int lda, ldb, ldc;     /* lda belongs to cuBLAS's A, i.e. our B */
} kern_gemm_args;

static inline int kern_plan_gemm(bool ta, bool tb, int64_t m, int64_t n,
                                 int64_t k, kern_gemm_args *out) {
  if (m < 0 || n < 0 || k < 0) return TSR_EINVAL;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return TSR_ERANGE;
  out->trans_a = tb;
  out->trans_b = ta;
  out->m = (int)n;
  out->n = (int)m;
  out->k = (int)k;
  out->lda = (int)(tb ? k : n);
  out->ldb = (int)(ta ? m : k);
  out->ldc = (int)n;
  /* a zero leading dimension is refused by BLAS even for empty operands */
  if (out->lda < 1) out->lda = 1;
  if (out->ldb < 1) out->ldb = 1;
  if (out->ldc < 1) out->ldc = 1;
  return 0;
}

/* ---- launch geometry ------------------------------------------------------ */

#define KERN_PLAN_TPB 256               /* threads per block */
#define KERN_PLAN_STRIDE_MAX_BLOCKS (65535u * 8u)
#define KERN_PLAN_GRID_X_MAX 2147483647ll /* CUDA's limit on gridDim.x */
#define KERN_PLAN_GRID_Y_MAX 65535ll
#define KERN_PLAN_COLSUM_CHUNKS 64

/* Blocks of a grid-stride loop over n elements: enough to cover n once
 * (capped; each thread then loops), at least 1. Thread t of block b visits
 * b*tpb + t, then steps by blocks*tpb. */
static inline unsigned kern_plan_stride_blocks(size_t n, unsigned tpb) {
  size_t b = (n + tpb - 1) / tpb;
  if (b > KERN_PLAN_STRIDE_MAX_BLOCKS) b = KERN_PLAN_STRIDE_MAX_BLOCKS;
  return (unsigned)(b ? b : 1);
}

/* One block (or one thread, for kern_plan_thread_blocks) per row. */
static inline int kern_plan_row_blocks(int64_t rows, unsigned *grid) {
  if (rows < 0 || rows > KERN_PLAN_GRID_X_MAX) return TSR_ERANGE;
  *grid = (unsigned)(rows ? rows : 1);
  return 0;
}
static inline int kern_plan_thread_blocks(int64_t items, unsigned tpb,
                                          unsigned *grid) {
  if (items < 0) return TSR_ERANGE;
  int64_t b = (items + tpb - 1) / tpb;
  return kern_plan_row_blocks(b, grid);
}

/* Threads of a block that walks one embedding row of `dim` floats. */
static inline unsigned kern_plan_row_threads(int64_t dim) {
  return dim >= 128 ? 128u : dim >= 32 ? 32u : dim > 0 ? (unsigned)dim : 1u;
}

/* Column sums of dz[n,d] in two deterministic passes: pass 1 sums chunk c
 * of the rows into part[c][d] (grid grid_x * chunks), pass 2 adds the
 * chunks in order. */
typedef struct {
  int chunks;
  int64_t rows_per;
  unsigned grid_x;  /* blocks over the d columns */
} kern_colsum_plan;

static inline int kern_plan_colsum(int64_t n, int64_t d, unsigned tpb,
                                   kern_colsum_plan *p) {
  if (n < 0 || d < 1) return TSR_EINVAL;
  p->chunks = n < KERN_PLAN_COLSUM_CHUNKS ? (int)(n > 0 ? n : 1)
                                          : KERN_PLAN_COLSUM_CHUNKS;
  p->rows_per = (n + p->chunks - 1) / p->chunks;
  return kern_plan_thread_blocks(d, tpb, &p->grid_x);
}

/* Rows [*r0, *r1) of chunk c (empty past the end). */
static inline KERN_HD void kern_plan_colsum_rows(const kern_colsum_plan *p,
                                                 int c, int64_t n,
                                                 int64_t *r0, int64_t *r1) {
  int64_t a = (int64_t)c * p->rows_per, b = a + p->rows_per;
  *r0 = a < n ? a : n;
  *r1 = b < n ? b : n;
}

/* ---- device -------------------------------------------------------------- */

#define KERN_PLAN_MIN_CC_MAJOR 8 /* the module is built for sm_80 and sm_90 */

/* 0 when the module runs on a device of compute capability major.minor;
 * else TSR_ENODEVICE with a message naming the device. */
static inline int kern_plan_check_device(int dev, const char *name, int major,
                                         int minor, char *why, size_t len) {
  if (major >= KERN_PLAN_MIN_CC_MAJOR) return 0;
  if (why && len)
    snprintf(why, len,
             "GPU %d (%s) has compute capability %d.%d; the CUDA module "
             "needs %d.0 (sm_80) or newer",
             dev, name && *name ? name : "unnamed", major, minor,
             KERN_PLAN_MIN_CC_MAJOR);
  return TSR_ENODEVICE;
}

#endif
