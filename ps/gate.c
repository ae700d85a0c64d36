/* The PS's consistency gates (the clock protocol of ps/consist.c, the
 * Spin model tests/model/clock.pml, asked of one shard) and the sync
 * machinery: when a step's mean is applied, where a joining worker starts,
 * and the reset that begins a new era.
 *
 * Happy path. Every pull and push passes ps__admit / ps__pull_ready: it
 * goes to its shard's queue, or waits on the server's list until its
 * condition holds (ssp: the slowest clock within the staleness; sync: the
 * step applied), re-checked after every apply, clock and membership
 * change, and by the 200 ms timer. In sync mode, once no member owes a
 * shard's step, ps__sync_check queues the apply of the mean of what was
 * pushed; a shard nobody pushed and nobody owes skips to the slowest
 * clock.
 * Failure modes: a call of an era before the last reset, or of a worker
 * that is no member (ssp, sync), is refused with TSR_ESTALE naming the
 * variable, shard and worker; a sync push for a step already applied
 * likewise. Calls whose peer is gone are dropped, and everything held is
 * refused when the server closes. An apply that could not be queued (out
 * of memory) or that ran out of memory is tried again by the timer, only
 * in the era it belongs to: ps__reset drops the retry with the old sum.
 */
#include "ps/svc_int.h"
#include "common/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* 1: may go now; 0: wait; negative: refuse (err filled). The questions
 * of the model's wk__pull and wk__push, asked of one shard. */
static int ps__gate(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  ps_consist *c = &s->cons;
  /* restarted alone and not restored yet: its shards hold initial values,
   * which no worker may read (nor push into: the restore would drop it) */
  if (s->await_restore) return 0;
  if (c->mode != PS_MODE_ASYNC && !ps__cons_era_ok(c, op->era)) {
    snprintf(op->err, sizeof op->err,
             "%s shard %d: the parameter server was reset (a restore or a "
             "new configuration) since worker %d joined: it joins again",
             e->spec.var.name, e->spec.shard.shard, op->worker);
    return TSR_ESTALE;
  }
  /* a call of a joined worker (its era set) that is no member any more:
   * the chief said its closures are over, nobody will move a gate for it */
  if (c->mode != PS_MODE_ASYNC && op->era && op->kind != PS_OP_PUSH &&
      !ps__cons_member(c, op->worker)) {
    snprintf(op->err, sizeof op->err,
             "%s shard %d: worker %d is no member here any more (its closures "
             "are over): it joins again",
             e->spec.var.name, e->spec.shard.shard, op->worker);
    return TSR_ESTALE;
  }
  if (op->kind == PS_OP_PUSH) {
    if (c->mode == PS_MODE_ASYNC) return 1;
    if (!ps__cons_member(c, op->worker)) {
      snprintf(op->err, sizeof op->err,
               "%s shard %d: worker %d is no member here (it left, or "
               "never joined): it joins again",
               e->spec.var.name, e->spec.shard.shard, op->worker);
      return TSR_ESTALE;
    }
    if (c->mode == PS_MODE_SSP) return 1;
    if (op->step < e->sync_done) {
      snprintf(op->err, sizeof op->err,
               "%s shard %d: push for sync step %" PRId64 " from worker %d "
               "arrived after that step was applied (now at %" PRId64 ")",
               e->spec.var.name, e->spec.shard.shard, op->step, op->worker,
               e->sync_done);
      return TSR_ESTALE;
    }
    /* a step ahead, or an apply running (maybe of the era before a
     * reset): wait */
    if (op->step > e->sync_done || e->sync_queued) return 0;
    for (int i = 0; i < e->n_pushed; i++)
      if (e->pushed[i] == op->worker) return 0; /* twice in a step: next */
    return 1;
  }
  switch (c->mode) {
    case PS_MODE_SSP: {
      if (!ps__cons_may_read(c, op->clock)) return 0;
      /* how far ahead of the slowest worker a read was let through */
      int64_t mc = ps__cons_min_clock(c);
      if ((op->kind == PS_OP_PULL || op->kind == PS_OP_PULL_ROWS ||
           op->kind == PS_OP_PUSH) &&
          mc != INT64_MAX && op->clock - mc > s->max_read_lead)
        s->max_read_lead = op->clock - mc;
      return 1;
    }
    case PS_MODE_SYNC: return e->sync_done >= op->clock;
    default: return 1;
  }
}

static int ps__note_push(ps_server *s, ps_entry *e, int worker) {
  if (e->n_pushed == e->cap_pushed) {
    int ncap = e->cap_pushed ? 2 * e->cap_pushed : 8;
    int *p = ps__realloc(&s->mem, e->pushed,
                         (size_t)e->cap_pushed * sizeof *p,
                         (size_t)ncap * sizeof *p);
    if (!p) return TSR_ENOMEM;
    e->pushed = p;
    e->cap_pushed = ncap;
  }
  e->pushed[e->n_pushed++] = worker;
  return 0;
}

static void ps__hold(ps_server *s, ps_op *op) {
  op->next = s->waiting;
  s->waiting = op;
}

/* Whether the gate lets `op` through now; if not, the op is refused (its
 * error) or held until a later wake, and the caller is done with it. */
static bool ps__gate_open(ps_server *s, ps_op *op) {
  int g = ps__gate(s, op);
  if (g < 0)
    ps__op_fail(s, op, g, "%s", op->err);
  else if (g == 0)
    ps__hold(s, op);
  return g > 0;
}

/* Sends an op on its way: queued now, held, or refused. */
void ps__admit(ps_server *s, ps_op *op, bool front) {
  if (!ps__gate_open(s, op)) return;
  if (op->kind == PS_OP_PUSH && op->sync && ps__note_push(s, op->e, op->worker)) {
    ps__op_fail(s, op, TSR_ENOMEM, "out of memory");
    return;
  }
  /* ssp: a gradient of step t means its worker finished t + 1 steps (in
   * sync a worker may still owe other shards of step t) */
  if (op->kind == PS_OP_PUSH && s->cons.mode == PS_MODE_SSP) {
    uint64_t ep = s->cons.epoch;
    ps__cons_clock(&s->cons, op->worker, op->step + 1, op->era);
    if (s->cons.epoch != ep) s->cons_changed = true;
  }
  ps__enqueue(s, op, front);
}

void ps__pull_ready(ps_server *s, ps_op *op, bool front) {
  if (!ps__gate_open(s, op)) return;
  if (op->kind == PS_OP_PULL && !op->e->writing && front) {
    ps__answer_dense(s, op);
    return;
  }
  ps__enqueue(s, op, front);
}

static void ps__wake_once(ps_server *s);

/* Re-checks every held call; a push let through may move an ssp clock,
 * which may let more through: again until nothing changes. */
void ps__wake(ps_server *s) {
  if (s->waking) {
    s->cons_changed = true;
    return;
  }
  s->waking = true;
  do {
    s->cons_changed = false;
    ps__wake_once(s);
  } while (s->cons_changed && !s->closing);
  s->waking = false;
}

static void ps__wake_once(ps_server *s) {
  ps_op **pp = &s->waiting, *ready = NULL, **rt = &ready;
  while (*pp) {
    ps_op *op = *pp;
    if (s->closing) {
      *pp = op->next;
      ps__op_fail(s, op, TSR_ESHUTDOWN, "the parameter server is shutting down");
      continue;
    }
    if (op->call && tsr_rpc_incoming_dead(op->call)) {
      *pp = op->next;
      ps__op_fail(s, op, TSR_ECLOSED, "caller gone");
      continue;
    }
    int g = ps__gate(s, op);
    if (g == 0) {
      pp = &op->next;
      continue;
    }
    *pp = op->next;
    op->next = NULL;
    *rt = op;
    rt = &op->next;
  }
  /* oldest first: the list is newest first */
  ps_op *rev = NULL;
  while (ready) {
    ps_op *n = ready->next;
    ready->next = rev;
    rev = ready;
    ready = n;
  }
  while (rev) {
    ps_op *n = rev->next;
    ps__admit(s, rev, false);
    rev = n;
  }
}

static bool ps__pushed(void *ctx, int worker) {
  ps_entry *e = ctx;
  for (int i = 0; i < e->n_pushed; i++)
    if (e->pushed[i] == worker) return true;
  return false;
}

/* The model's PS process, first half: a shard whose step no member owes
 * queues its apply (the mean of what was pushed), or, pushed by nobody
 * and owed by nobody because every member is past it, skips to the
 * slowest member's clock. The set is closed while the apply runs (pushes
 * for the next step wait), and `sync_target` says where it ends, for the
 * joins meanwhile. */
void ps__sync_check(ps_server *s) {
  if (s->cons.mode != PS_MODE_SYNC || s->closing) return;
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    if (!e->sh || e->sync_queued || e->sync_retry) continue;
    if (ps__cons_active(&s->cons) == 0 && e->n_pushed == 0) continue;
    if (!ps__cons_sync_ready(&s->cons, e->sync_done, ps__pushed, e)) continue;
    int64_t target = e->sync_done + 1;
    if (e->n_pushed == 0) {
      int64_t slowest = ps__cons_min_clock(&s->cons);
      if (slowest == INT64_MAX || slowest <= e->sync_done) continue;
      target = slowest;
    }
    ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
    if (!op) return; /* tried again at the next check */
    op->kind = PS_OP_SYNC_APPLY;
    op->e = e;
    op->srv = s;
    /* the mean of the gradients summed (0 pushes: nothing applied) */
    op->worker = e->n_pushed;
    op->clock = target;
    op->era = s->cons.era;
    e->sync_target = target;
    e->sync_queued = true;
    ps__enqueue(s, op, false);
  }
}

int64_t ps__sync_next(ps_server *s, int worker) {
  int64_t next = s->cons.base;
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    int64_t n = e->sync_done;
    if (e->sync_queued)
      n = e->sync_target;
    else if (ps__pushed(e, worker))
      n = e->sync_done + 1;
    if (n > next) next = n;
  }
  return next;
}

int64_t ps__sync_step(const ps_server *s) {
  int64_t m = 0;
  for (int i = 0; i < s->n_ents; i++)
    if (s->ents[i]->sync_done > m) m = s->ents[i]->sync_done;
  return m;
}

void ps__reset(ps_server *s, uint64_t run, int64_t step) {
  ps__cons_reset(&s->cons, run, step);
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    e->sync_done = s->cons.base;
    e->n_pushed = 0;
    e->sync_retry = false; /* the sum it kept goes with the old era */
    /* an apply still running belongs to the old era: it changes nothing
     * when it ends, and joins meanwhile start at the reset's step */
    if (e->sync_queued) e->sync_target = s->cons.base;
    /* the old era's sum goes, after the writes already queued */
    ps_op *op = e->sh ? ps__calloc(&s->mem, 1, sizeof *op) : NULL;
    if (op) {
      op->kind = PS_OP_SYNC_CLEAR;
      op->e = e;
      op->srv = s;
      ps__enqueue(s, op, false);
    }
  }
  ps__wake(s); /* held calls of the old era are refused */
  ps__sync_check(s);
}

void ps__restored(ps_server *s) {
  if (!s->await_restore) return;
  s->await_restore = false;
  ps__wake(s);
}

void ps__timer_cb(uv_timer_t *t) {
  ps_server *s = t->data;
  /* sync applies that ran out of memory, or could not be queued */
  for (int i = 0; i < s->n_ents; i++) s->ents[i]->sync_retry = false;
  ps__sync_check(s);
  ps__wake(s);
}
