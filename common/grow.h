/* Growable arrays: room for one more element, the capacity doubling.
 *
 * Happy path: `if ((rc = tsr_grow(&a->items, &a->cap, a->n, sizeof
 * *a->items, 16))) return rc;` then `a->items[a->n++] = ...`.
 * Failure modes: TSR_ENOMEM when realloc fails or the byte count passes
 * PTRDIFF_MAX (the largest object there can be); the array and its
 * capacity are then as they were.
 * Threads: none of its own (the owner's lock guards the array).
 */
#ifndef TSR_GROW_H
#define TSR_GROW_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/size.h"

/* `arrp` is the address of the array pointer (T **). When n == *cap, the
 * array is reallocated to twice *cap elements of `elem` bytes (`first`
 * when it has none yet). */
static inline int tsr_grow(void *arrp, size_t *cap, size_t n, size_t elem,
                           size_t first) {
  if (n < *cap) return 0;
  size_t nc = *cap ? *cap : first, bytes;
  while (nc <= n)
    if (tsr_mul_size(nc, 2, &nc)) return TSR_ENOMEM;
  if (tsr_mul_size(nc, elem, &bytes) || bytes > (size_t)PTRDIFF_MAX)
    return TSR_ENOMEM;
  void *old, *p;
  memcpy(&old, arrp, sizeof old);
  if (!(p = realloc(old, bytes))) return TSR_ENOMEM;
  memcpy(arrp, &p, sizeof p);
  *cap = nc;
  return 0;
}

#endif /* TSR_GROW_H */
