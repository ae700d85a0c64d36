/* Allocating and freeing the arrays a structure owns in one statement.
 *
 * Happy path: `const tsr_array a[] = {TSR_ARRAY(s->x), TSR_ARRAY(s->y)};
 * if (tsr_calloc_each(a, 2, n)) goto fail;` gives each array n zeroed
 * elements; `TSR_FREE_ALL(s->x, s->y, s);` frees each block in the order
 * given, as a run of free() calls would.
 * Failure modes: tsr_calloc_each returns TSR_ENOMEM when any array could
 * not be had; the others are set all the same, for the owner's teardown
 * to free. Freeing cannot fail (free(NULL) does nothing); each argument
 * is a pointer the caller owns and no longer uses.
 * Threads: none of their own.
 */
#ifndef TSR_MEM_H
#define TSR_MEM_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* An array tsr_calloc_each allocates: the address of its pointer (T **)
 * and the size of its elements. */
typedef struct {
  void *ptrp;
  size_t elem;
} tsr_array;

#define TSR_ARRAY(p) {&(p), sizeof *(p)}

/* Points each of the `count` arrays at n zeroed elements (n == 0 asks
 * calloc for none; callers that need a block pass 1). */
static inline int tsr_calloc_each(const tsr_array *a, size_t count,
                                  size_t n) {
  int rc = 0;
  for (size_t i = 0; i < count; i++) {
    void *p = calloc(n, a[i].elem);
    if (!p) rc = TSR_ENOMEM;
    memcpy(a[i].ptrp, &p, sizeof p);
  }
  return rc;
}

static inline void tsr_free_each(void *const *blocks, size_t n) {
  for (size_t i = 0; i < n; i++) free(blocks[i]);
}

/* The arguments are evaluated once, into a table of pointers. */
#define TSR_FREE_ALL(...)                                   \
  tsr_free_each((void *const[]){__VA_ARGS__},               \
                sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif /* TSR_MEM_H */
