/* The consistency state of one PS: the clock protocol of ssp:S and sync,
 * as checked by Spin in tests/model/clock.pml (the functions here are the
 * model's inlines of the same names; tests/model/README.md maps them).
 *
 * Happy path. A worker JOINs every PS at the start of each closure and
 * becomes a member; the PS answers the clock it goes on from (sync: the
 * step it owes next; ssp: the slowest member's clock, so it holds nobody
 * back) and its era; the worker continues from the largest answer and
 * TICKs every PS up to it. Members count: an ssp read at clock c waits
 * until every member has reached c - S; a sync shard applies step t once
 * no member owes it (every member whose clock is <= t has pushed it).
 * The chief sends LEAVE once a worker has no closure in flight, or is
 * lost: its closures so far are over, it stops counting, and a JOIN for
 * one of them (still queued in a worker the chief gave up on) is refused.
 * A reset (config, restore) starts a new era at a step: every member is
 * forgotten and every call of the old era is refused, so nothing computed
 * before a restore lands after it, and every worker joins again.
 * Failure modes: another run's JOIN, a JOIN for a closure that is over,
 * a TICK of another era or from a non-member (TSR_ESTALE with a message).
 * Pure data: no loop, no threads, tested on its own.
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps__cons_init(ps_consist *c, uint64_t era0) {
  memset(c, 0, sizeof *c);
  c->mode = PS_MODE_ASYNC;
  c->era = era0 ? era0 : 1;
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

void ps__cons_reset(ps_consist *c, uint64_t run, int64_t step) {
  c->era++;
  if (c->era == 0) c->era = 1; /* 0 means "not checked" on the wire */
  for (int i = 0; i < c->n; i++) {
    ps_worker_clock *w = &c->w[i];
    w->active = false;
    w->clock = 0;
    w->closure = 0;
    if (run != c->run) w->left = 0; /* a new run's closures start again */
  }
  c->run = run;
  c->base = step < 0 ? 0 : step;
  c->epoch++;
}

bool ps__cons_era_ok(const ps_consist *c, uint64_t era) {
  return era == 0 || era == c->era;
}

static ps_worker_clock *ps__cons_find(ps_consist *c, int worker) {
  for (int i = 0; i < c->n; i++)
    if (c->w[i].id == worker) return &c->w[i];
  return NULL;
}

bool ps__cons_member(const ps_consist *c, int worker) {
  for (int i = 0; i < c->n; i++)
    if (c->w[i].id == worker) return c->w[i].active;
  return false;
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
  memset(w, 0, sizeof *w);
  w->id = worker;
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

int ps__cons_join(ps_consist *c, const ps_join_req *q, int64_t sync_next,
                  int64_t *out, char *msg, size_t msglen) {
  if (q->worker < 0 || q->clock < 0) {
    snprintf(msg, msglen, "join: worker %d clock %" PRId64 " out of range",
             q->worker, q->clock);
    return TSR_EINVAL;
  }
  if (c->run && q->run != c->run) {
    snprintf(msg, msglen, "join: worker %d is configured for run %" PRIu64
             " but this parameter server serves run %" PRIu64 " (another "
             "chief's closure)", q->worker, q->run, c->run);
    return TSR_ESTALE;
  }
  ps_worker_clock *w = ps__cons_find(c, q->worker);
  if (w && q->closure && q->closure <= w->left) {
    snprintf(msg, msglen, "join: closure %" PRIu64 " of worker %d is over "
             "(the chief gave it up)", q->closure, q->worker);
    return TSR_ESTALE;
  }
  int64_t j;
  if (c->mode == PS_MODE_SYNC) {
    j = sync_next;
  } else {
    /* ssp: the slowest other member's clock, so it holds nobody back */
    j = INT64_MAX;
    for (int i = 0; i < c->n; i++)
      if (c->w[i].active && c->w[i].id != q->worker && c->w[i].clock < j)
        j = c->w[i].clock;
    if (j == INT64_MAX) j = c->base;
  }
  if (j < c->base) j = c->base;
  if (q->era == c->era && q->clock > j) j = q->clock;
  if (w && w->active && w->clock > j) j = w->clock;
  if (!w && !(w = ps__cons_add(c, q->worker))) {
    snprintf(msg, msglen, "join: out of memory");
    return TSR_ENOMEM;
  }
  w->active = true;
  w->clock = j;
  w->closure = q->closure;
  c->epoch++;
  *out = j;
  return 0;
}

int ps__cons_leave(ps_consist *c, int worker, uint64_t run,
                   uint64_t closure) {
  if (c->run && run != c->run) return 0; /* another chief's: changes nothing */
  ps_worker_clock *w = ps__cons_find(c, worker);
  if (!w && !(w = ps__cons_add(c, worker))) return TSR_ENOMEM;
  if (closure > w->left) w->left = closure;
  if (!w->active || w->closure > closure) return TSR_ENOTFOUND;
  w->active = false;
  w->clock = 0;
  w->closure = 0;
  c->epoch++;
  return 0;
}

int ps__cons_clock(ps_consist *c, int worker, int64_t clock, uint64_t era) {
  if (worker < 0 || clock < 0) return TSR_EINVAL;
  if (!ps__cons_era_ok(c, era)) return TSR_ESTALE;
  ps_worker_clock *w = ps__cons_find(c, worker);
  if (!w || !w->active) return TSR_ESTALE;
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
