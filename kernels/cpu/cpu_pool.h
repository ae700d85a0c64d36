/* The CPU backend's threads: a parallel-for over numbered items, run by
 * the calling thread and the pool's workers together.
 *
 * Happy path: kern__pool_open(threads) starts threads - 1 workers, which
 * sleep on a condition variable (no spinning: a worker that waits never
 * takes a core from anyone); kern__pool_run(n, fn, arg) wakes them, and
 * every thread, the caller first, claims the next item from a shared
 * counter until none is left. Items are claimed one at a time, so a
 * worker the scheduler has taken off its core holds up at most the one
 * item it claimed: the caller and the other workers take the rest, and a
 * loaded machine slows the op down instead of stalling it on the slowest
 * thread. The caller then sleeps until the items in flight are done.
 * What is computed never depends on which thread ran an item, nor on how
 * many threads there are: callers cut the work by its size alone and reduce
 * per-item partial results in item order, so 1 and N threads give the
 * same bits.
 * Failure modes: a worker that cannot be started (kern__pool_open returns
 * TSR_ENOMEM or TSR_EIO, nothing left running). fn must not fail; an item
 * that can fail records it in its own slot of arg.
 * Ownership: one pool per CPU context; run is called by one thread at a
 * time (the context's), never from inside fn.
 */
#ifndef TSR_KERN_CPU_POOL_H
#define TSR_KERN_CPU_POOL_H

#include <stdint.h>

#include "kernels/kern.h"

typedef struct kern__pool kern__pool;

/* Item i of a run, on thread tid (0 is the caller, 1..threads-1 the
 * workers): for per-thread scratch, never for what is computed. */
typedef void (*kern__pool_fn)(void *arg, int64_t i, int tid);

/* Most threads a context may have (kern_opts.cpu_threads). */
#define KERN__POOL_MAX KERN_MAX_THREADS

int kern__pool_open(kern__pool **out, int threads);
void kern__pool_close(kern__pool *p);
int kern__pool_threads(const kern__pool *p);
/* fn(arg, i, tid) for every i in [0, n); returns when all have run. With
 * one thread, or n == 1, the caller runs them in order. */
void kern__pool_run(kern__pool *p, int64_t n, kern__pool_fn fn, void *arg);

/* Items of about `grain` units of work each for `total` units (at least
 * one, at most total): the cut depends only on the sizes. */
int64_t kern__pool_items(int64_t total, int64_t grain);

#endif
