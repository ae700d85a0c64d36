/* kern__pool (cpu_pool.h): workers that sleep on a condition variable
 * between runs, items claimed from one atomic counter.
 *
 * The counter holds the run's generation in its high 32 bits and the next
 * item in its low 32: a worker that wakes late, after its run has ended
 * and the next has begun, sees another generation when it tries to claim
 * and goes back to sleep, so it can never run one run's function on
 * another run's items. The caller publishes a run under the mutex
 * (function, argument, count, then the counter) and waits under the same
 * mutex for `done` to reach the count; the worker that finishes the last
 * item signals it.
 */
#include "kernels/cpu/cpu_pool.h"
#include "common/err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct kern__pool {
  int threads;
  int started;             /* workers running */
  pthread_t *th;
  struct kern__pool_worker *ws; /* each worker's identity */
  pthread_mutex_t mu;
  pthread_cond_t go;       /* a run was published, or stop */
  pthread_cond_t fin;      /* the last item of a run is done */
  bool stop;
  uint32_t gen;            /* the current run (under mu) */
  kern__pool_fn fn;        /* the current run (under mu) */
  void *arg;
  int64_t n;
  _Atomic uint64_t next;   /* gen << 32 | next item */
  _Atomic int64_t done;    /* items of the current run finished */
};

typedef struct kern__pool_worker {
  kern__pool *p;
  int tid;
} kern__pool_worker;

/* Claims the next item of run `gen`; false when the run has none left or
 * is over. */
static bool claim(kern__pool *p, uint32_t gen, int64_t n, int64_t *item) {
  uint64_t v = atomic_load_explicit(&p->next, memory_order_relaxed);
  for (;;) {
    if ((uint32_t)(v >> 32) != gen || (int64_t)(v & 0xffffffffu) >= n)
      return false;
    if (atomic_compare_exchange_weak_explicit(&p->next, &v, v + 1,
                                              memory_order_acquire,
                                              memory_order_relaxed)) {
      *item = (int64_t)(v & 0xffffffffu);
      return true;
    }
  }
}

static void finish_one(kern__pool *p, int64_t n) {
  if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->fin);
    pthread_mutex_unlock(&p->mu);
  }
}

static void *worker_main(void *a) {
  kern__pool_worker *w = a;
  kern__pool *p = w->p;
  uint32_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
    if (p->stop) break;
    seen = p->gen;
    kern__pool_fn fn = p->fn;
    void *arg = p->arg;
    int64_t n = p->n, i;
    pthread_mutex_unlock(&p->mu);
    while (claim(p, seen, n, &i)) {
      fn(arg, i, w->tid);
      finish_one(p, n);
    }
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void stop_workers(kern__pool *p) {
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int t = 0; t < p->started; t++) pthread_join(p->th[t], NULL);
}

int kern__pool_open(kern__pool **out, int threads) {
  *out = NULL;
  if (threads < 1 || threads > KERN__POOL_MAX) return TSR_EINVAL;
  kern__pool *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  p->threads = threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->fin, NULL);
  atomic_init(&p->next, 0);
  atomic_init(&p->done, 0);
  if (threads > 1) {
    p->th = calloc((size_t)threads - 1, sizeof *p->th);
    p->ws = calloc((size_t)threads - 1, sizeof *p->ws);
    if (!p->th || !p->ws) {
      kern__pool_close(p);
      return TSR_ENOMEM;
    }
    for (int t = 0; t < threads - 1; t++) {
      p->ws[t] = (kern__pool_worker){p, t + 1};
      if (pthread_create(&p->th[t], NULL, worker_main, &p->ws[t])) {
        kern__pool_close(p);
        return TSR_EIO;
      }
      p->started++;
    }
  }
  *out = p;
  return 0;
}

void kern__pool_close(kern__pool *p) {
  if (!p) return;
  stop_workers(p);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->fin);
  pthread_mutex_destroy(&p->mu);
  free(p->ws);
  free(p->th);
  free(p);
}

int kern__pool_threads(const kern__pool *p) { return p->threads; }

void kern__pool_run(kern__pool *p, int64_t n, kern__pool_fn fn, void *arg) {
  if (n <= 0) return;
  if (p->threads == 1 || n == 1 || n > (int64_t)UINT32_MAX) {
    for (int64_t i = 0; i < n; i++) fn(arg, i, 0);
    return;
  }
  pthread_mutex_lock(&p->mu);
  if (++p->gen == 0) p->gen = 1; /* 0 is what a new worker has seen */
  uint32_t gen = p->gen;
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->next, (uint64_t)gen << 32, memory_order_release);
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  int64_t i;
  while (claim(p, gen, n, &i)) {
    fn(arg, i, 0);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
  }
  /* the items still in flight: sleep until the last one signals */
  if (atomic_load_explicit(&p->done, memory_order_acquire) < n) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n)
      pthread_cond_wait(&p->fin, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}

int64_t kern__pool_items(int64_t total, int64_t grain) {
  if (total <= 0) return 1;
  if (grain < 1) grain = 1;
  int64_t k = (total + grain - 1) / grain;
  return k < 1 ? 1 : k;
}
