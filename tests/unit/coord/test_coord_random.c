/* The coordinator's state machine under seeded random interleavings:
 * answers in any order, closures that fail, PS and workers that come and
 * go (a lost worker's closures failing, or never answered), checkpoints that fail, chiefs that restart, time that passes. The
 * injected failures stay within what a run must survive (a PS back before
 * --ps-timeout, fewer failed restores in a row than the tries), so every
 * run must end well: status 0 and exactly the job's steps, with sim.h's
 * invariants checked at every step; the one exception is a job with
 * checkpoints that loses a PS after training began and before any
 * checkpoint was committed (all failed): that run must fail, saying so.
 * A second pass stops answering at a random moment and lets only time
 * pass: every run must still end (well, or failed with a message). Thousands of runs per mode; a failing run
 * prints its seed (SIM_SEED=N reruns only it, SIM_VERBOSE=1 shows its
 * notes). */
#include "sim.h"

typedef struct {
  uint64_t s;
} rng;

static uint32_t rnd(rng *r) {
  r->s ^= r->s << 13;
  r->s ^= r->s >> 7;
  r->s ^= r->s << 17;
  return (uint32_t)(r->s >> 11);
}

static double rnd_unit(rng *r) { return (double)(rnd(r) % 1000000) / 1e6; }

typedef struct {
  sim s;
  rng r;
  double ps_down_at[SIM_MAX];
  double op_at;
  double ck_at;               /* the checkpoint's stage went out */
  double ev_at;               /* the evaluation's */
  int other_streak[SIM_MAX];  /* a worker's own failures in a row */
  int cycle_failures;         /* setup/restore failures since training */
  int chief_restarts;
  int last_counts;
  int alone_failures[SIM_MAX]; /* a PS's failed restores alone in a row */
  double recover_at;          /* the machine was first seen recovering (-1) */
} rsim;

static bool any_ps_down(const rsim *x) {
  for (int i = 0; i < x->s.cfg.n_ps; i++)
    if (!x->s.ps_up[i]) return true;
  return false;
}

static int workers_up(const rsim *x) {
  int n = 0;
  for (int w = 0; w < x->s.cfg.n_wk; w++) n += x->s.wk_up[w];
  return n;
}

#define DO(x, call)                                          \
  do {                                                       \
    bool op_ = (x)->s.op_active, ck_ = (x)->s.ck_active;     \
    bool ev_ = (x)->s.ev_active;                             \
    coord_act_kind evk_ = (x)->s.ev_kind;                    \
    uint64_t opn_ = (x)->s.op, ckn_ = (x)->s.ck_op;          \
    call;                                                    \
    if ((x)->s.op_active && (!op_ || (x)->s.op != opn_))     \
      (x)->op_at = (x)->s.now;                               \
    if ((x)->s.ck_active && (!ck_ || (x)->s.ck_op != ckn_))  \
      (x)->ck_at = (x)->s.now;                               \
    if ((x)->s.ev_active && (!ev_ || (x)->s.ev_kind != evk_))\
      (x)->ev_at = (x)->s.now;                               \
  } while (0)

static void answer_closure(rsim *x, int k) {
  sim *s = &x->s;
  sim_fl f = s->fl[k];
  int w = f.c.worker;
  uint32_t p = rnd(&x->r) % 100;
  if (f.lost) {
    DO(x, sim_closure_fail(s, k, COORD_ERR_LOST, "connection closed"));
  } else if (any_ps_down(x) || p < 8) {
    DO(x, sim_closure_fail(s, k, COORD_ERR_TRANSIENT, "ps:1 unavailable"));
  } else if (p < 12 && x->other_streak[w] < s->cfg.max_closure_failures - 1) {
    x->other_streak[w]++;
    DO(x, sim_closure_fail(s, k, COORD_ERR_OTHER, "compute failed"));
  } else {
    x->other_streak[w] = 0;
    int64_t steps = p < 15 && f.c.steps > 1 ? f.c.steps - 1 : -1;
    DO(x, sim_closure_done(s, k, steps));
  }
}

static void answer_op(rsim *x) {
  sim *s = &x->s;
  uint32_t p = rnd(&x->r) % 100;
  switch (s->op_kind) {
    case COORD_ACT_SETUP_PS:
    case COORD_ACT_RESTORE:
      if (any_ps_down(x)) {
        if (x->cycle_failures < 1) {
          x->cycle_failures++;
          DO(x, sim_answer(s, -1, 0, true, "connection closed"));
          return;
        }
        for (int i = 0; i < s->cfg.n_ps; i++)
          if (!s->ps_up[i]) DO(x, sim_ps_up(s, i));
        if (!s->op_active) return;
      }
      if (s->op_kind == COORD_ACT_RESTORE && p < 20 &&
          x->cycle_failures < 1) {
        x->cycle_failures++;
        DO(x, sim_answer(s, -5, 1, false, "cannot read a shard"));
        return;
      }
      DO(x, sim_answer(s, 0, -1, false, NULL));
      return;
    default:
      DO(x, sim_answer(s, 0, -1, false, NULL));
      return;
  }
}

/* The evaluation's stage out: its snapshot, or the worker's answer. */
static void answer_ev(rsim *x) {
  sim *s = &x->s;
  uint32_t p = rnd(&x->r) % 100;
  if (s->ev_kind == COORD_ACT_SNAPSHOT && any_ps_down(x))
    DO(x, sim_ev_answer(s, -1, "connection closed"));
  else
    DO(x, sim_ev_answer(s, p < 10 ? -1 : 0, p < 10 ? "worker gone" : NULL));
}

/* The checkpoint's stage out: snapshots, files or manifest. */
static void answer_ck(rsim *x) {
  sim *s = &x->s;
  uint32_t p = rnd(&x->r) % 100;
  switch (s->ck_kind) {
    case COORD_ACT_SAVE:
    case COORD_ACT_SAVE_WAIT:
      if (any_ps_down(x))
        DO(x, sim_ck_answer(s, -1, 0, true, "connection closed"));
      else if (p < (s->ck_kind == COORD_ACT_SAVE ? 4 : 10))
        DO(x, sim_ck_answer(s, -28, 1, false, "No space left on device"));
      else
        DO(x, sim_ck_answer(s, 0, -1, false, NULL));
      return;
    default: /* COMMIT */
      DO(x, sim_ck_answer(s, p < 5 ? -28 : 0, -1, false,
                          p < 5 ? "manifest: No space left on device"
                                : NULL));
      return;
  }
}

/* A PS's restore alone: well, or (once in a while, fewer times in a row
 * than the tries) with the PS's own error. */
static void answer_alone(rsim *x, int i) {
  sim *s = &x->s;
  if (rnd(&x->r) % 100 < 10 && x->alone_failures[i] < 1) {
    x->alone_failures[i]++;
    sim_alone_answer(s, i, -5, false, "restore: cannot read a shard");
    return;
  }
  x->alone_failures[i] = 0;
  sim_alone_answer(s, i, 0, false, NULL);
}

/* Whatever has waited too long for the run to survive it is answered or
 * brought back before time moves on. */
/* a PS is back well within --ps-timeout (and --wait-timeout, which
 * bounds the wait for it at the start) */
static double ps_down_limit(const sim *s) {
  return s->cfg.wait_timeout_s < s->cfg.ps_timeout_s
             ? s->cfg.wait_timeout_s / 3
             : s->cfg.ps_timeout_s / 3;
}

static void keep_within_limits(rsim *x) {
  sim *s = &x->s;
  double ps_limit = ps_down_limit(s);
  for (int i = 0; i < s->cfg.n_ps && !s->ended; i++)
    if (!s->ps_up[i] && s->now - x->ps_down_at[i] > ps_limit)
      DO(x, sim_ps_up(s, i));
  if (!s->ended && workers_up(x) == 0) DO(x, sim_wk_up(s, 0));
  /* and one that runs closures (sync: a worker back mid-run sits it out,
   * so the one down comes back) */
  bool runs = false;
  for (int w = 0; w < s->cfg.n_wk; w++) runs |= s->wk_up[w] && s->member[w];
  for (int w = 0; w < s->cfg.n_wk && !runs && !s->ended; w++)
    if (!s->wk_up[w]) {
      DO(x, sim_wk_up(s, w));
      break;
    }
  for (int k = 0; k < s->n_fl && !s->ended;)
    if (s->now - s->fl[k].at > s->cfg.closure_timeout_s / 2)
      answer_closure(x, k);
    else
      k++;
  if (s->op_active && !s->ended && s->now - x->op_at > s->cfg.op_timeout_s / 2)
    answer_op(x);
  if (s->ck_active && !s->ended && s->now - x->ck_at > s->cfg.op_timeout_s / 2)
    answer_ck(x);
  if (s->ev_active && !s->ended && s->now - x->ev_at > s->cfg.op_timeout_s / 2)
    answer_ev(x);
  for (int i = 0; i < s->cfg.n_ps && !s->ended; i++)
    if (s->alone_op[i] && s->now - s->alone_at[i] > s->cfg.op_timeout_s / 2)
      answer_alone(x, i);
  for (int w = 0; w < s->cfg.n_wk && !s->ended; w++)
    if (s->cfg_pending[w]) DO(x, sim_ready(s, w));
}

/* dense "allreduce": a worker configured while another holds the ring's
 * state (ready, a closure of it ended) may be fresh, as the I/O side
 * says of one configured after the ring's first closures */
static void maybe_fresh(rsim *x, int w) {
  sim *s = &x->s;
  if (!s->cfg.lockstep || s->count[COORD_ACT_DISPATCH] == 0) return;
  for (int k = 0; k < s->cfg.n_wk; k++)
    if (k != w && s->wk_up[k] && !s->fresh[k] && !s->cfg_pending[k])
      s->fresh_next[w] = rnd(&x->r) % 2;
}

static void one_event(rsim *x) {
  sim *s = &x->s;
  uint32_t p = rnd(&x->r) % 100;
  /* a cluster that keeps flapping before it was ever whole fails its
   * --wait-timeout, rightly: no losses while the chief connects */
  if (strcmp(coord_sm_phase(s->sm), "connect") == 0 && p >= 72 && p < 93)
    p = 60;
  if (p < 30 && s->n_fl) {
    answer_closure(x, (int)(rnd(&x->r) % (uint32_t)s->n_fl));
  } else if (p < 42) {
    for (int k = 0; k < s->cfg.n_wk; k++) {
      int w = (int)((rnd(&x->r) + (uint32_t)k) % (uint32_t)s->cfg.n_wk);
      if (!s->cfg_pending[w]) continue;
      if (rnd(&x->r) % 10 == 0)
        DO(x, sim_cfg_fail(s, w, COORD_ERR_TRANSIENT, "ps:0 unavailable"));
      else
        DO(x, sim_ready(s, w));
      break;
    }
  } else if (p < 56 && (s->op_active || s->ck_active || s->ev_active ||
                         sim_alone_out(s) >= 0)) {
    uint32_t q = rnd(&x->r) % 4;
    int a = sim_alone_out(s);
    if (a >= 0 && (q == 3 || (!s->op_active && !s->ck_active &&
                              !s->ev_active)))
      answer_alone(x, a);
    else if (s->op_active && (q == 0 || (!s->ck_active && !s->ev_active)))
      answer_op(x);
    else if (s->ck_active && (q == 1 || !s->ev_active))
      answer_ck(x);
    else
      answer_ev(x);
  } else if (p < 72) {
    keep_within_limits(x);
    if (!s->ended) DO(x, sim_tick(s, 0.1 + 3 * rnd_unit(&x->r)));
  } else if (p < 76) {
    int i = (int)(rnd(&x->r) % (uint32_t)s->cfg.n_ps);
    bool busy = s->op_active && (s->op_kind == COORD_ACT_SETUP_PS ||
                                 s->op_kind == COORD_ACT_RESTORE) &&
                x->cycle_failures >= 1;
    /* PS that keep going away through a whole recovery wait fail it,
     * rightly (its --ps-timeout counts from its start): none goes once
     * the wait is past the time a PS is kept down */
    if (strcmp(coord_sm_phase(s->sm), "recover") != 0)
      x->recover_at = -1;
    else if (x->recover_at < 0)
      x->recover_at = s->now;
    else if (s->now - x->recover_at > ps_down_limit(s))
      busy = true;
    if (s->ps_up[i] && !busy) {
      x->ps_down_at[i] = s->now;
      DO(x, sim_ps_lost(s, i));
    }
  } else if (p < 81) {
    for (int i = 0; i < s->cfg.n_ps; i++)
      if (!s->ps_up[i]) {
        DO(x, sim_ps_up(s, i));
        break;
      }
  } else if (p < 86) {
    int w = (int)(rnd(&x->r) % (uint32_t)s->cfg.n_wk);
    if (s->wk_up[w]) {
      /* its closures fail with it, or are never answered at all */
      if (rnd(&x->r) % 2)
        DO(x, sim_wk_lost(s, w));
      else
        DO(x, sim_wk_vanish(s, w));
      x->other_streak[w] = 0;
    }
  } else if (p < 93) {
    for (int w = 0; w < s->cfg.n_wk; w++)
      if (!s->wk_up[w]) {
        maybe_fresh(x, w);
        DO(x, sim_wk_up(s, w));
        break;
      }
  } else if (p < 94 && x->chief_restarts < 2 && s->cfg.ckpt) {
    x->chief_restarts++;
    x->cycle_failures = 0;
    sim_restart_chief(s);
    /* the new chief connects to whoever is up */
    for (int i = 0; i < s->cfg.n_ps; i++)
      if (s->ps_up[i]) DO(x, sim_ps_up(s, i));
    for (int w = 0; w < s->cfg.n_wk; w++)
      if (s->wk_up[w]) DO(x, sim_wk_up(s, w));
  } else {
    keep_within_limits(x);
  }
  /* training again: the next recovery may fail once more */
  if (s->count[COORD_ACT_COUNT] != x->last_counts) {
    x->last_counts = s->count[COORD_ACT_COUNT];
    x->cycle_failures = 0;
  }
}

/* What the runs went through (SIM_STATS=1 prints it). */
static struct {
  int runs, restores, discards, chief_restarts, ps_recoveries, left,
      worker_restarts, epochs, timers_failed, no_ckpt_failed, alone;
} stats;

static bool lockstep; /* the runs of dense "allreduce" (async tables) */

static coord_sm_config random_config(rng *r, tsr_mode mode) {
  bool epochs = rnd(r) % 3 == 0;
  coord_sm_config c =
      sim_config(1 + (int)(rnd(r) % 3), 1 + (int)(rnd(r) % 3), mode,
                 epochs ? 0 : 40 + rnd(r) % 160);
  c.epochs = 1 + rnd(r) % 4;
  c.steps_per_closure = 1 + rnd(r) % 12;
  c.ckpt = rnd(r) % 4 != 0;
  c.ckpt_every_steps = rnd(r) % 3 ? 15 + rnd(r) % 40 : 0;
  c.ckpt_keep = 1 + (int)(rnd(r) % 3);
  c.has_eval = rnd(r) % 2;
  c.eval_every_steps = rnd(r) % 2 ? 30 + rnd(r) % 50 : 0;
  c.sync_rejoin = rnd(r) % 2;
  c.lockstep = lockstep;
  return c;
}

/* One run: random events, then (calm) everything answered until the end,
 * or (timers_only) nothing but time. */
static void one_run(unsigned seed, tsr_mode mode, bool timers_only) {
  rsim x;
  memset(&x, 0, sizeof x);
  x.recover_at = -1;
  x.r.s = 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed * 0x2545F4914F6CDD1Dull);
  for (int i = 0; i < 4; i++) rnd(&x.r);
  coord_sm_config c = random_config(&x.r, mode);
  sim *s = &x.s;
  sim_init(s, &c, seed);
  /* increments between whole ones (from the seed: the events drawn stay
   * the same) */
  s->full_every = 1 + (int)(seed % 4);
  for (int w = 0; w < c.n_wk; w++) s->examples[w] = 5 + rnd(&x.r) % 120;
  int events = 50 + (int)(rnd(&x.r) % 400);
  /* the cluster comes up in any order */
  for (int i = 0; i < c.n_ps; i++) DO(&x, sim_ps_up(s, i));
  for (int w = 0; w < c.n_wk; w++) DO(&x, sim_wk_up(s, w));
  for (int e = 0; e < events && !s->ended; e++) one_event(&x);
  stats.runs++;
  stats.epochs += c.steps == 0;
  if (timers_only) {
    for (int i = 0; i < 200000 && !s->ended; i++)
      sim_tick(s, 0.5 + 10 * rnd_unit(&x.r));
    SIM_CHECK(s, s->ended, "still running after only timers");
    stats.timers_failed += s->status != 0;
    return sim_free(s);
  }
  for (int r = 0; r < 200000 && !s->ended; r++) {
    keep_within_limits(&x);
    if (!s->ended) sim_run_calm(s, 1);
  }
  stats.restores += s->count[COORD_ACT_RESTORE] > 0;
  stats.discards += s->count[COORD_ACT_DISCARD] > 0;
  stats.chief_restarts += x.chief_restarts > 0;
  stats.ps_recoveries += coord_sm_restarts_ps(s->sm) > 0;
  stats.alone += s->alone_done > 0;
  stats.worker_restarts += coord_sm_restarts_worker(s->sm) > 0;
  for (int w = 0; w < c.n_wk; w++)
    if (coord_sm_wk_state(s->sm, w) == COORD_WK_LEFT) {
      stats.left++;
      break;
    }
  SIM_CHECK(s, s->ended, "not done after the calm phase (phase %s)",
            coord_sm_phase(s->sm));
  if (s->status != 0 && c.ckpt && coord_sm_last_ckpt(s->sm) < 0 &&
      strstr(s->fail, "no checkpoint was ever committed")) {
    stats.no_ckpt_failed++;
    sim_free(s);
    return;
  }
  SIM_CHECK(s, s->status == 0, "failed: %s", s->fail);
  SIM_CHECK(s, coord_sm_initial_restarts(s->sm) == 0 || !c.ckpt,
            "a job with checkpoints went on from initial values");
  int64_t total = coord_sm_total_steps(s->sm);
  SIM_CHECK(s, total > 0, "no total");
  SIM_CHECK(s, coord_sm_global_step(s->sm) == total,
            "ended at step %" PRId64 " of %" PRId64,
            coord_sm_global_step(s->sm), total);
  SIM_CHECK(s, s->base * sim_k(s) + s->counted_steps == total * sim_k(s),
            "counted %" PRId64 " worker steps from step %" PRId64
            ", total %" PRId64, s->counted_steps, s->base, total);
  sim_free(s);
}

/* runs()'s mode flag: dense "allreduce" over tables of that mode */
#define RUNS_LOCKSTEP 0x100

static void runs(int mode_flags, bool timers_only, unsigned first) {
  lockstep = mode_flags & RUNS_LOCKSTEP;
  tsr_mode mode = (tsr_mode)(mode_flags & ~RUNS_LOCKSTEP);
  const char *one = getenv("SIM_SEED");
  if (one) {
    one_run((unsigned)strtoul(one, NULL, 10), mode, timers_only);
    return;
  }
  const char *n_env = getenv("SIM_RUNS");
  unsigned n = n_env ? (unsigned)strtoul(n_env, NULL, 10) : 3000;
  memset(&stats, 0, sizeof stats);
  for (unsigned i = 0; i < n; i++) one_run(first + i, mode, timers_only);
  if (getenv("SIM_STATS"))
    fprintf(stderr, "%d runs (%d epochs-based): with a restore %d, a "
            "failed checkpoint %d, a chief restart %d, a PS recovery %d (a "
            "PS restored alone %d), a worker back %d, a worker left out %d, "
            "a PS lost before any checkpoint %d; timers only, failed %d\n",
            stats.runs, stats.epochs, stats.restores, stats.discards,
            stats.chief_restarts, stats.ps_recoveries, stats.alone,
            stats.worker_restarts, stats.left, stats.no_ckpt_failed,
            stats.timers_failed);
}

static void async_runs(void **state) {
  (void)state;
  runs(TSR_MODE_ASYNC, false, 1);
}
static void ssp_runs(void **state) {
  (void)state;
  runs(TSR_MODE_SSP, false, 100001);
}
static void sync_runs(void **state) {
  (void)state;
  runs(TSR_MODE_SYNC, false, 200001);
}
static void lockstep_runs(void **state) {
  (void)state;
  runs(TSR_MODE_ASYNC | RUNS_LOCKSTEP, false, 500001);
}
static void async_timers_only(void **state) {
  (void)state;
  runs(TSR_MODE_ASYNC, true, 300001);
}
static void sync_timers_only(void **state) {
  (void)state;
  runs(TSR_MODE_SYNC, true, 400001);
}

int main(void) {
  tsr_log_set_level(TSR_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(async_runs),
      cmocka_unit_test(ssp_runs),
      cmocka_unit_test(sync_runs),
      cmocka_unit_test(lockstep_runs),
      cmocka_unit_test(async_timers_only),
      cmocka_unit_test(sync_timers_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
