/* Closure scheduler; see scheduler.h. Closures in flight are kept in a small
 * array (at most n_workers * max_inflight entries); lookups are linear,
 * which at that size beats any index. */
#include "chief/coord/scheduler.h"
#include "common/mem.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  chief_closure c;
  bool used;
  int pool_of; /* pinned: whose pool the steps came from */
} chief__slot;

struct chief_sched {
  int n_workers;
  int max_inflight;
  int64_t total, done, pool, per_closure;
  uint64_t next_id;
  uint32_t generation;
  uint64_t retries;
  bool paused;
  bool *up;
  int *load;
  bool pinned;
  bool lockstep;  /* pinned, and every worker up runs as many steps */
  bool level_due; /* lockstep: dealt again once no closure is out */
  int64_t *wpool; /* pinned: each worker's own steps (sum == pool) */
  int64_t *given; /* pinned: steps handed to each worker and not given back */
  int rr; /* next worker to consider */
  chief__slot *slots;
  int n_slots;
};

chief_sched *chief_sched_new(int n_workers, int64_t total_steps,
                             int64_t steps_per_closure, int max_inflight) {
  if (n_workers <= 0 || total_steps < 0 || steps_per_closure <= 0 ||
      max_inflight <= 0)
    return NULL;
  chief_sched *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->n_workers = n_workers;
  s->max_inflight = max_inflight;
  s->total = total_steps;
  s->pool = total_steps;
  s->per_closure = steps_per_closure;
  s->next_id = 1;
  s->up = calloc((size_t)n_workers, sizeof *s->up);
  s->load = calloc((size_t)n_workers, sizeof *s->load);
  s->wpool = calloc((size_t)n_workers, sizeof *s->wpool);
  s->given = calloc((size_t)n_workers, sizeof *s->given);
  s->n_slots = n_workers * max_inflight;
  s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
  if (!s->up || !s->load || !s->slots || !s->wpool || !s->given) {
    chief_sched_free(s);
    return NULL;
  }
  return s;
}

void chief_sched_free(chief_sched *s) {
  if (!s) return;
  TSR_FREE_ALL(s->up, s->load, s->wpool, s->given, s->slots, s);
}

/* Lockstep: the pool dealt in equal shares (rounded up) over the workers
 * that are up. Only with no closure out: one out may belong to the ring
 * before the change (chief__change). */
static void chief__level(chief_sched *s) {
  int up = 0;
  for (int w = 0; w < s->n_workers; w++) up += s->up[w];
  if (up == 0) return;
  /* the steps still to run, not the pool: an earlier rounding up is not
   * rounded again */
  int64_t left = s->total - s->done;
  if (left < 0) left = 0;
  int64_t share = left / up + (left % up != 0);
  s->pool = 0;
  for (int w = 0; w < s->n_workers; w++) {
    s->wpool[w] = s->up[w] ? share : 0;
    s->pool += s->wpool[w];
    s->given[w] = 0;
  }
  s->level_due = false;
}

/* Lockstep: the workers up changed or steps came back. The closures out
 * finish (or fail) first, then the rest is dealt again: a new ring starts
 * with every member's share equal. */
static void chief__change(chief_sched *s) {
  s->level_due = true;
  if (chief_sched_inflight(s, -1) == 0) chief__level(s);
}

/* Pinned: deals the pool evenly over the workers again. */
static void chief__split(chief_sched *s) {
  if (!s->pinned) return;
  memset(s->given, 0, (size_t)s->n_workers * sizeof *s->given);
  if (s->lockstep) {
    chief__level(s);
    return;
  }
  int64_t base = s->pool / s->n_workers, extra = s->pool % s->n_workers;
  for (int w = 0; w < s->n_workers; w++) s->wpool[w] = base + (w < extra);
}

/* Steps going back to the pool. */
static void chief__give_back(chief_sched *s, const chief__slot *sl,
                             int64_t steps) {
  s->pool += steps;
  if (s->pinned) {
    s->wpool[sl->pool_of] += steps;
    s->given[sl->c.worker] -= steps;
  }
}

void chief_sched_set_pinned(chief_sched *s, bool pinned) {
  s->pinned = pinned;
  chief__split(s);
}

void chief_sched_set_lockstep(chief_sched *s, bool lockstep) {
  s->lockstep = lockstep;
  if (lockstep) s->pinned = true;
  chief__split(s);
}

static chief__slot *chief__find(chief_sched *s, uint64_t id, uint32_t gen) {
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].used && s->slots[i].c.id == id &&
        s->slots[i].c.generation == gen)
      return &s->slots[i];
  return NULL;
}

static void chief__release(chief_sched *s, chief__slot *slot) {
  s->load[slot->c.worker]--;
  slot->used = false;
}

void chief_sched_worker_up(chief_sched *s, int w) {
  if (w < 0 || w >= s->n_workers) return;
  bool was = s->up[w];
  s->up[w] = true;
  if (s->lockstep && !was) chief__change(s);
}

int chief_sched_worker_down(chief_sched *s, int w) {
  if (w < 0 || w >= s->n_workers) return 0;
  s->up[w] = false;
  int n = 0;
  for (int i = 0; i < s->n_slots; i++) {
    chief__slot *sl = &s->slots[i];
    if (sl->used && sl->c.worker == w) {
      chief__give_back(s, sl, sl->c.steps);
      chief__release(s, sl);
      s->retries++;
      n++;
    }
  }
  if (s->lockstep) chief__change(s);
  return n;
}

void chief_sched_pause(chief_sched *s, bool paused) { s->paused = paused; }

/* Pinned: where worker w's next steps come from: its own pool, else the
 * pool of a worker that is down (so a lost worker's share still runs);
 * -1 when neither has steps. */
static int chief__source(const chief_sched *s, int w) {
  if (s->wpool[w] > 0) return w;
  for (int k = 0; k < s->n_workers; k++)
    if (!s->up[k] && s->wpool[k] > 0) return k;
  return -1;
}

/* Pinned and paused: the most steps any worker that is up has been
 * handed. A pause lets the others be handed as many (and no more), so in
 * sync and ssp modes no worker is left holding steps its peers will not
 * run until after the pause. */
static int64_t chief__given_max(const chief_sched *s) {
  int64_t m = 0;
  for (int w = 0; w < s->n_workers; w++)
    if (s->up[w] && s->given[w] > m) m = s->given[w];
  return m;
}

bool chief_sched_next(chief_sched *s, chief_closure *out) {
  if (s->lockstep && s->level_due) return false; /* draining: see above */
  if (s->pool <= 0) return false;
  if (s->paused && !s->pinned) return false;
  int64_t cap = s->paused ? chief__given_max(s) : INT64_MAX;
  /* least loaded worker that is up (and, pinned, has steps to run), ties
   * broken round-robin */
  int best = -1;
  for (int k = 0; k < s->n_workers; k++) {
    int w = (s->rr + k) % s->n_workers;
    if (!s->up[w] || s->load[w] >= s->max_inflight) continue;
    if (s->pinned && chief__source(s, w) < 0) continue;
    if (s->given[w] >= cap) continue;
    if (best < 0 || s->load[w] < s->load[best]) best = w;
  }
  if (best < 0) return false;
  chief__slot *slot = NULL;
  for (int i = 0; i < s->n_slots; i++)
    if (!s->slots[i].used) {
      slot = &s->slots[i];
      break;
    }
  if (!slot) return false; /* cannot happen: loads bound the slots */
  int src = s->pinned ? chief__source(s, best) : best;
  int64_t avail = s->pinned ? s->wpool[src] : s->pool;
  int64_t n = avail < s->per_closure ? avail : s->per_closure;
  if (s->paused && cap - s->given[best] < n) n = cap - s->given[best];
  slot->used = true;
  slot->pool_of = src;
  slot->c.id = s->next_id++;
  slot->c.generation = s->generation;
  slot->c.worker = best;
  slot->c.steps = n;
  slot->c.first_step = s->total - s->pool;
  s->pool -= n;
  if (s->pinned) {
    s->wpool[src] -= n;
    s->given[best] += n;
  }
  s->load[best]++;
  s->rr = (best + 1) % s->n_workers;
  *out = slot->c;
  return true;
}

bool chief_sched_done(chief_sched *s, uint64_t id, uint32_t gen,
                      int64_t steps_done) {
  chief__slot *sl = chief__find(s, id, gen);
  if (!sl) return false;
  if (steps_done < 0) steps_done = 0;
  if (steps_done > sl->c.steps) steps_done = sl->c.steps;
  int64_t back = sl->c.steps - steps_done;
  s->done += steps_done;
  if (s->lockstep && s->done > s->total) s->done = s->total; /* rounding */
  chief__give_back(s, sl, back);
  chief__release(s, sl);
  if (s->lockstep && (back > 0 || s->level_due)) chief__change(s);
  return true;
}

bool chief_sched_failed(chief_sched *s, uint64_t id, uint32_t gen) {
  chief__slot *sl = chief__find(s, id, gen);
  if (!sl) return false;
  chief__give_back(s, sl, sl->c.steps);
  s->retries++;
  chief__release(s, sl);
  if (s->lockstep) chief__change(s);
  return true;
}

void chief_sched_rewind(chief_sched *s, int64_t step) {
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].used) chief__release(s, &s->slots[i]);
  if (step < 0) step = 0;
  if (step > s->total) step = s->total;
  s->done = step;
  s->pool = s->total - step;
  chief__split(s);
  s->generation++;
}

void chief_sched_set_total(chief_sched *s, int64_t total) {
  int64_t floor_ = s->done + chief_sched_inflight_steps(s);
  if (total < floor_) total = floor_;
  s->pool += total - s->total;
  s->total = total;
  chief__split(s);
}

int64_t chief_sched_done_steps(const chief_sched *s) { return s->done; }

int64_t chief_sched_inflight_steps(const chief_sched *s) {
  int64_t n = 0;
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].used) n += s->slots[i].c.steps;
  return n;
}

int chief_sched_inflight(const chief_sched *s, int worker) {
  if (worker < 0) {
    int n = 0;
    for (int w = 0; w < s->n_workers; w++) n += s->load[w];
    return n;
  }
  return worker < s->n_workers ? s->load[worker] : 0;
}

uint32_t chief_sched_generation(const chief_sched *s) { return s->generation; }

bool chief_sched_finished(const chief_sched *s) {
  return s->done >= s->total && chief_sched_inflight(s, -1) == 0;
}

uint64_t chief_sched_retries(const chief_sched *s) { return s->retries; }
