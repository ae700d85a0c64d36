/* Freeing the blocks a structure owns in one statement.
 *
 * Happy path: `TSR_FREE_ALL(s->a, s->b, s->c, s);` frees each block in
 * the order given, as a run of free() calls would.
 * Failure modes: none (free(NULL) does nothing); each argument is a
 * pointer the caller owns and no longer uses.
 * Threads: none of its own.
 */
#ifndef TSR_MEM_H
#define TSR_MEM_H

#include <stddef.h>
#include <stdlib.h>

static inline void tsr_free_each(void *const *blocks, size_t n) {
  for (size_t i = 0; i < n; i++) free(blocks[i]);
}

/* The arguments are evaluated once, into a table of pointers. */
#define TSR_FREE_ALL(...)                                   \
  tsr_free_each((void *const[]){__VA_ARGS__},               \
                sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif /* TSR_MEM_H */
