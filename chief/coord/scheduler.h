/* The chief's closure scheduler: a pure state machine (no I/O, no clock) so
 * every failure path can be tested without processes.
 *
 * Work is a pool of steps. A worker with room (fewer than max_inflight
 * closures) gets a closure of min(steps_per_closure, unassigned) steps.
 * A closure that completes adds its steps to the done count; one that
 * fails (its worker died, was cut off, or answered an error) gives its
 * steps back to the pool, so they run elsewhere (at-least-once, as in
 * TensorFlow: a lost closure may have applied some updates before dying,
 * but its steps are counted only once, when a closure of them completes).
 * Hence the final step count is exact: done == total.
 *
 * Recovery from a parameter-server failure rewinds: chief_sched_rewind()
 * sets the done count back to the checkpoint's step, forgets every closure
 * in flight (their results, if they ever arrive, are ignored: they carry
 * an older generation) and puts every remaining step back in the pool.
 */
#ifndef TSR_CHIEF_SCHED_H
#define TSR_CHIEF_SCHED_H

#include <stdbool.h>
#include <stdint.h>

typedef struct chief_sched chief_sched;

typedef struct {
  uint64_t id;          /* unique, increasing */
  uint32_t generation;  /* bumped by every rewind */
  int worker;           /* the worker it was given to */
  int64_t steps;        /* steps to run */
  int64_t first_step;   /* global step the closure starts at (for logs) */
} chief_closure;

/* total_steps > 0, steps_per_closure > 0, max_inflight > 0. NULL on
 * allocation failure. Every worker starts down. */
chief_sched *chief_sched_new(int n_workers, int64_t total_steps,
                             int64_t steps_per_closure, int max_inflight);
void chief_sched_free(chief_sched *s);

/* Pinned pools (ssp and sync modes): the steps are dealt evenly to the
 * workers and each runs its own share, so every worker reaches the same
 * final clock and none is left waiting on an idle one. A worker that is
 * down has its share run by the others. */
void chief_sched_set_pinned(chief_sched *s, bool pinned);

/* Lockstep pools (a ring of workers, dense "allreduce"): every worker that
 * is up runs the same number of steps, since each of its steps needs a
 * step of every other one. Whenever the workers that are up change or a
 * closure's steps come back, no closure goes out until those out have
 * ended, then the steps left are dealt again evenly over the workers that
 * are up, each share rounded up so all are equal (the fewer than n extra
 * steps that adds run at least once, as a retried closure's do; the done
 * count stops at the total). Pinned too. */
void chief_sched_set_lockstep(chief_sched *s, bool lockstep);

/* A worker came up (configured and ready) or went down. Down gives the
 * steps of its closures back to the pool and returns how many closures
 * that was. */
void chief_sched_worker_up(chief_sched *s, int worker);
int chief_sched_worker_down(chief_sched *s, int worker);

/* Stops and restarts handing out closures (checkpoints, recovery). Pinned,
 * a pause still hands a worker the steps that bring it level with the
 * most any worker has been handed, so peers stay matched in sync and ssp
 * and the pause can drain. */
void chief_sched_pause(chief_sched *s, bool paused);

/* Next closure to send, if a worker that is up has room and the pool has
 * steps (and the scheduler is not paused): returns true and fills *out.
 * Workers are served round-robin, least loaded first. */
bool chief_sched_next(chief_sched *s, chief_closure *out);

/* Outcome of a closure. Returns false when the closure is unknown or of
 * an older generation (a result after a rewind or a down): it is ignored.
 * Completed closures may report fewer steps than given when the input ran
 * out (steps_done < steps): the rest go back to the pool. */
bool chief_sched_done(chief_sched *s, uint64_t id, uint32_t generation,
                      int64_t steps_done);
bool chief_sched_failed(chief_sched *s, uint64_t id, uint32_t generation);

/* Rewinds to `step` (a checkpoint): forgets closures in flight, pool =
 * total - step. */
void chief_sched_rewind(chief_sched *s, int64_t step);

/* Lowers or raises the total (epochs known only after the workers report
 * their data sizes); never below what is done or in flight. */
void chief_sched_set_total(chief_sched *s, int64_t total_steps);

int64_t chief_sched_done_steps(const chief_sched *s);
int64_t chief_sched_inflight_steps(const chief_sched *s);
int chief_sched_inflight(const chief_sched *s, int worker); /* -1: all */
uint32_t chief_sched_generation(const chief_sched *s);
/* done == total and nothing in flight. */
bool chief_sched_finished(const chief_sched *s);
/* Closures given back to the pool because they failed or their worker went
 * down, since creation. */
uint64_t chief_sched_retries(const chief_sched *s);

#endif
