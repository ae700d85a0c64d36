/* Checked size arithmetic. Every size computed from a request or a file
 * (element counts, byte counts, offsets, row ranges) goes through these, so
 * a product or a sum that does not fit is refused with TSR_ERANGE before
 * anything is allocated or read, instead of wrapping to a small number.
 *
 * Each returns 0 and writes the result, or TSR_ERANGE and leaves *out
 * unchanged. Pure, thread-safe, header-only.
 */
#ifndef TSR_SIZE_H
#define TSR_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Largest step, clock or row id accepted from a peer or a file: far
 * beyond any run, and leaves room for +1 and for the differences the
 * consistency gates compute. */
#define TSR_STEP_MAX ((int64_t)1 << 62)

/* One checked operation: `name(a, b, &out)` computes a OP b in `type`
 * with the compiler's overflow builtin. */
#define TSR__SIZE_OP(name, type, builtin)               \
  static inline int name(type a, type b, type *out) {   \
    type r;                                             \
    if (builtin(a, b, &r)) return TSR_ERANGE;           \
    *out = r;                                           \
    return 0;                                           \
  }

/* tsr_mul_size, tsr_add_size: size_t; tsr_mul_u64, tsr_add_u64: uint64_t;
 * tsr_mul_i64, tsr_add_i64: int64_t. */
TSR__SIZE_OP(tsr_mul_size, size_t, __builtin_mul_overflow)
TSR__SIZE_OP(tsr_add_size, size_t, __builtin_add_overflow)
TSR__SIZE_OP(tsr_mul_u64, uint64_t, __builtin_mul_overflow)
TSR__SIZE_OP(tsr_add_u64, uint64_t, __builtin_add_overflow)
TSR__SIZE_OP(tsr_mul_i64, int64_t, __builtin_mul_overflow)
TSR__SIZE_OP(tsr_add_i64, int64_t, __builtin_add_overflow)

#undef TSR__SIZE_OP

/* a * b * c in size_t (bytes = rows * width * elem, ...). */
static inline int tsr_mul3_size(size_t a, size_t b, size_t c, size_t *out) {
  size_t r;
  if (tsr_mul_size(a, b, &r) || tsr_mul_size(r, c, &r)) return TSR_ERANGE;
  *out = r;
  return 0;
}

/* Product of dims[from..to): 1 for an empty range; TSR_ERANGE when a dim
 * is negative or the product does not fit int64. */
static inline int tsr_dims_product(const int64_t *dims, int from, int to,
                                   int64_t *out) {
  int64_t p = 1;
  for (int i = from; i < to; i++)
    if (dims[i] < 0 || tsr_mul_i64(p, dims[i], &p)) return TSR_ERANGE;
  *out = p;
  return 0;
}

#endif
