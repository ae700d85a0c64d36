/* Consistency state machine: worker clocks and membership, and the two
 * questions the service asks before letting a call through:
 *   - ssp:S  may a worker at clock c read? (slowest active clock >= c - S)
 *   - sync   may shard X apply the sum of step t? (every active worker has
 *            pushed X for t or has finished step t)
 * A worker's clock is the number of steps it finished and never moves back.
 * Leaving drops a worker from both questions at once, so a dead worker
 * never deadlocks the others; a returning worker starts at the slowest
 * active clock (or its own, if further), so it never holds anyone back.
 * Every change bumps `epoch` so the service knows to re-check its waiters.
 * Pure data: no loop, no threads, tested on its own.
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

void ps__cons_init(ps_consist *c) {
  memset(c, 0, sizeof *c);
  c->mode = PS_MODE_ASYNC;
}

void ps__cons_free(ps_consist *c) {
  free(c->w);
  memset(c, 0, sizeof *c);
}

int ps__cons_set_mode(ps_consist *c, ps_mode mode, int staleness) {
  if ((unsigned)mode > PS_MODE_SYNC || staleness < 0) return TSR_EINVAL;
  c->mode = mode;
  c->staleness = mode == PS_MODE_SSP ? staleness : 0;
  c->epoch++;
  return 0;
}

static ps_worker_clock *ps__cons_find(ps_consist *c, int worker) {
  for (int i = 0; i < c->n; i++)
    if (c->w[i].id == worker) return &c->w[i];
  return NULL;
}

static ps_worker_clock *ps__cons_add(ps_consist *c, int worker) {
  if (c->n == c->cap) {
    int ncap = c->cap ? c->cap * 2 : 8;
    ps_worker_clock *w = realloc(c->w, (size_t)ncap * sizeof *w);
    if (!w) return NULL;
    c->w = w;
    c->cap = ncap;
  }
  ps_worker_clock *w = &c->w[c->n++];
  w->id = worker;
  w->active = false;
  w->clock = 0;
  return w;
}

int64_t ps__cons_min_clock(const ps_consist *c) {
  int64_t m = INT64_MAX;
  for (int i = 0; i < c->n; i++)
    if (c->w[i].active && c->w[i].clock < m) m = c->w[i].clock;
  return m;
}

int ps__cons_active(const ps_consist *c) {
  int k = 0;
  for (int i = 0; i < c->n; i++) k += c->w[i].active;
  return k;
}

int ps__cons_join(ps_consist *c, int worker, int64_t clock) {
  if (worker < 0 || clock < 0) return TSR_EINVAL;
  ps_worker_clock *w = ps__cons_find(c, worker);
  if (w && w->active) {
    if (clock > w->clock) w->clock = clock;
    c->epoch++;
    return 0;
  }
  int64_t slowest = ps__cons_min_clock(c);
  if (!w && !(w = ps__cons_add(c, worker))) return TSR_ENOMEM;
  if (slowest != INT64_MAX && slowest > clock) clock = slowest;
  if (clock < w->clock) clock = w->clock;
  w->clock = clock;
  w->active = true;
  c->epoch++;
  return 0;
}

int ps__cons_leave(ps_consist *c, int worker) {
  ps_worker_clock *w = ps__cons_find(c, worker);
  if (!w || !w->active) return TSR_ENOTFOUND;
  w->active = false;
  c->epoch++;
  return 0;
}

int ps__cons_clock(ps_consist *c, int worker, int64_t clock) {
  if (worker < 0 || clock < 0) return TSR_EINVAL;
  ps_worker_clock *w = ps__cons_find(c, worker);
  if (!w || !w->active) return ps__cons_join(c, worker, clock);
  if (clock > w->clock) {
    w->clock = clock;
    c->epoch++;
  }
  return 0;
}

bool ps__cons_may_read(const ps_consist *c, int64_t clock) {
  if (c->mode != PS_MODE_SSP) return true;
  int64_t m = ps__cons_min_clock(c);
  return m == INT64_MAX || m >= clock - c->staleness;
}

bool ps__cons_sync_ready(const ps_consist *c, int64_t step,
                         bool (*pushed)(void *ctx, int worker), void *ctx) {
  for (int i = 0; i < c->n; i++) {
    const ps_worker_clock *w = &c->w[i];
    if (!w->active || w->clock > step) continue;
    if (!pushed || !pushed(ctx, w->id)) return false;
  }
  return true;
}
