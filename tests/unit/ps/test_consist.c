/* Consistency modes: the state machine on its own (clocks, joins, leaves,
 * the ssp and sync questions), then over the service: sync with three
 * workers equals one worker applying the mean of their gradients, a pull
 * for step t+1 waits for the last push of step t, ssp holds a fast worker
 * back until the slowest catches up, and a worker leaving (or coming back)
 * never deadlocks sync or ssp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "ps_harness.h"
#include "ps/ps_int.h"

static bool pushed_none(void *ctx, int w) { return false; }
static bool pushed_w1(void *ctx, int w) { return w == 1; }

static int64_t join(ps_consist *c, int w, int64_t clock, uint64_t era,
                    uint64_t run, uint64_t closure, int64_t sync_next) {
  ps_join_req q = {.worker = w, .clock = clock, .era = era, .run = run,
                   .closure = closure};
  int64_t out = -1;
  char msg[256];
  int rc = ps__cons_join(c, &q, sync_next, &out, msg, sizeof msg);
  return rc ? rc : out;
}

static void state_machine(void **state) {
  (void)state;
  ps_consist c;
  ps__cons_init(&c, 7);
  assert_int_equal(ps__cons_min_clock(&c), INT64_MAX);
  assert_int_equal(ps__cons_set_mode(&c, PS_MODE_SSP, 2), 0);
  assert_int_equal(join(&c, 0, 0, 0, 0, 1, 0), 0);
  assert_int_equal(join(&c, 1, 0, 0, 0, 1, 0), 0);
  assert_true(ps__cons_may_read(&c, 2));
  assert_false(ps__cons_may_read(&c, 3));
  assert_int_equal(ps__cons_clock(&c, 0, 5, c.era), 0);
  assert_int_equal(ps__cons_clock(&c, 1, 1, 0), 0); /* era 0: unchecked */
  assert_int_equal(ps__cons_min_clock(&c), 1);
  ps__cons_clock(&c, 1, 0, 0); /* never moves back */
  assert_int_equal(ps__cons_min_clock(&c), 1);
  assert_false(ps__cons_may_read(&c, 5));
  assert_int_equal(ps__cons_clock(&c, 1, 2, c.era + 1), TSR_ESTALE);
  uint64_t ep = c.epoch;
  /* LEAVE: closure 1 is over */
  assert_int_equal(ps__cons_leave(&c, 1, 0, 1), 0);
  assert_true(c.epoch > ep);
  assert_true(ps__cons_may_read(&c, 5));
  assert_int_equal(ps__cons_leave(&c, 1, 0, 1), TSR_ENOTFOUND);
  assert_int_equal(ps__cons_clock(&c, 1, 9, 0), TSR_ESTALE); /* no member */
  /* a JOIN for a closure that is over is refused; a later one starts at
   * the slowest member's clock, so it holds nobody back */
  assert_int_equal(join(&c, 1, 0, 0, 0, 1, 0), TSR_ESTALE);
  assert_int_equal(join(&c, 1, 0, 0, 0, 2, 0), 5);
  assert_int_equal(ps__cons_active(&c), 2);
  /* its own clock counts when it knows this era */
  assert_int_equal(ps__cons_leave(&c, 1, 0, 2), 0);
  assert_int_equal(join(&c, 1, 8, c.era, 0, 3, 0), 8);
  assert_int_equal(ps__cons_leave(&c, 1, 0, 3), 0);
  assert_int_equal(join(&c, 1, 8, c.era + 5, 0, 4, 0), 5);
  /* a LEAVE for an earlier closure than the one it joined for is late:
   * it stays a member */
  assert_int_equal(ps__cons_leave(&c, 1, 0, 3), TSR_ENOTFOUND);
  assert_true(ps__cons_member(&c, 1));
  /* sync readiness for step 5: worker 0 and 1 are both at 5 */
  ps__cons_set_mode(&c, PS_MODE_SYNC, 0);
  assert_false(ps__cons_sync_ready(&c, 5, pushed_none, NULL));
  assert_false(ps__cons_sync_ready(&c, 5, pushed_w1, NULL));
  ps__cons_clock(&c, 0, 6, 0); /* worker 0 owes nothing before step 6 */
  assert_true(ps__cons_sync_ready(&c, 5, pushed_w1, NULL));
  /* sync JOIN: the step the shards sum next, never below the member's */
  assert_int_equal(join(&c, 0, 0, 0, 0, 9, 3), 6);
  assert_int_equal(join(&c, 2, 0, 0, 0, 1, 11), 11);
  /* a reset: a new era for run 42 at step 20, every member forgotten */
  uint64_t era = c.era;
  ps__cons_reset(&c, 42, 20);
  assert_int_equal(c.era, era + 1);
  assert_int_equal(ps__cons_active(&c), 0);
  assert_false(ps__cons_era_ok(&c, era));
  assert_true(ps__cons_era_ok(&c, 0));
  assert_int_equal(join(&c, 0, 0, 0, 41, 1, 0), TSR_ESTALE); /* other run */
  assert_int_equal(join(&c, 0, 90, era, 42, 1, 0), 20); /* old era's clock */
  /* the same run keeps what was over; a new one forgets it */
  assert_int_equal(ps__cons_leave(&c, 0, 42, 1), 0);
  assert_int_equal(ps__cons_leave(&c, 0, 41, 7), 0); /* another run's */
  ps__cons_reset(&c, 42, 0);
  assert_int_equal(join(&c, 0, 0, 0, 42, 1, 0), TSR_ESTALE);
  ps__cons_reset(&c, 43, 0);
  assert_int_equal(join(&c, 0, 0, 0, 43, 1, 0), 0);
  assert_int_equal(join(&c, -1, 0, 0, 43, 1, 0), TSR_EINVAL);
  assert_int_equal(ps__cons_clock(&c, -1, 0, 0), TSR_EINVAL);
  ps__cons_free(&c);
}

/* ---- over the service -----------------------------------------------------*/

typedef struct {
  h_env e;
  ps_client *w[3];
} cl3;

static void cl3_up(cl3 *c, const char *mode) {
  h_up(&c->e, 1, NULL);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_server_port(c->e.srv[0]));
  c->w[0] = c->e.cl[0];
  for (int i = 1; i < 3; i++) {
    if (ps_client_new(&c->w[i], c->e.ctx, addr)) abort();
    c->e.cl[i] = c->w[i];
  }
  h_res r;
  H_CALL(&c->e, r, ps_client_config(c->w[0], mode, false, h_cb, &r));
  assert_int_equal(r.status, 0);
}

enum { D0 = 24, D1 = 10, N = D0 * D1 };

static float grad_of(int worker, int step, int i) {
  return sinf(0.3f * (float)i + (float)worker * 1.7f + (float)step * 0.9f) *
         (float)(1 + worker);
}

static void sync_three_workers_equal_one(void **state) {
  (void)state;
  cl3 c;
  cl3_up(&c, "sync");
  h_res r;
  ps_var_spec v = h_spec("sync/w", D0, D1, 0, 1, "glorot_uniform", 11,
                         TSR_OPT_SGD);
  v.optim.learning_rate = 0.1;
  v.optim.momentum = 0.9;
  const tsr_optim_spec o = v.optim;
  H_CALL(&c.e, r, ps_client_create(c.w[0], &v, 1, h_cb, &r));
  for (int w = 0; w < 3; w++) {
    H_CALL(&c.e, r, ps_client_clock(c.w[w], w, 0, PS_CLOCK_JOIN, h_cb, &r));
    assert_int_equal(r.status, 0);
  }
  assert_int_equal(r.count, 3);
  static float ref[N], mom[N], g[3][N], got[3][N], sum[N];
  kern_init_fill(&v.var.init, 11, kern_init_var_key("sync/w"), 0, ref, N);
  float *slots[1] = {mom};
  memset(mom, 0, sizeof mom);
  for (int step = 0; step < 4; step++) {
    h_res rr[3];
    memset(rr, 0, sizeof rr);
    for (int w = 0; w < 3; w++)
      for (int i = 0; i < N; i++) g[w][i] = grad_of(w, step, i);
    for (int w = 0; w < 2; w++)
      assert_int_equal(ps_client_push_pull(c.w[w], "sync/w", 0, w, step,
                                           PS_DT_F32, g[w], sizeof g[w],
                                           got[w], N, h_cb, &rr[w]), 0);
    /* a stats round trip: the first two pulls are still held */
    H_CALL(&c.e, r, ps_client_stats(c.w[2], h_cb, &r));
    H_CALL(&c.e, r, ps_client_stats(c.w[0], h_cb, &r));
    assert_false(rr[0].done || rr[1].done);
    assert_int_equal(ps_client_push_pull(c.w[2], "sync/w", 0, 2, step,
                                         PS_DT_F32, g[2], sizeof g[2], got[2],
                                         N, h_cb, &rr[2]), 0);
    for (int w = 0; w < 3; w++) {
      assert_true(h_wait(&c.e, &rr[w].done));
      assert_int_equal(rr[w].status, 0);
    }
    /* one worker on the global batch: the mean of the three gradients */
    for (int i = 0; i < N; i++) sum[i] = (g[0][i] + g[1][i]) + g[2][i];
    kern_optim_apply(&o, step + 1, ref, sum, 1.0f / 3, slots, N);
    for (int w = 0; w < 3; w++)
      for (int i = 0; i < N; i++)
        if (fabsf(got[w][i] - ref[i]) > 1e-6f * (1 + fabsf(ref[i])))
          fail_msg("step %d worker %d element %d: %g vs %g", step, w, i,
                   got[w][i], ref[i]);
    assert_int_equal(rr[0].step, step + 1);
  }
  /* a worker leaves: the other two are not held */
  H_CALL(&c.e, r, ps_client_clock(c.w[2], 2, 0, PS_CLOCK_LEAVE, h_cb, &r));
  assert_int_equal(r.count, 2);
  h_res rr[3];
  memset(rr, 0, sizeof rr);
  for (int w = 0; w < 2; w++)
    assert_int_equal(ps_client_push_pull(c.w[w], "sync/w", 0, w, 4, PS_DT_F32,
                                         g[w], sizeof g[w], got[w], N, h_cb,
                                         &rr[w]), 0);
  for (int w = 0; w < 2; w++) {
    assert_true(h_wait(&c.e, &rr[w].done));
    assert_int_equal(rr[w].status, 0);
  }
  for (int i = 0; i < N; i++) sum[i] = g[0][i] + g[1][i];
  kern_optim_apply(&o, 5, ref, sum, 0.5f, slots, N);
  for (int i = 0; i < N; i++) assert_float_equal(got[0][i], ref[i], 1e-5);
  /* it comes back: joins at the current step, and step 5 needs it again */
  H_CALL(&c.e, r, ps_client_clock(c.w[2], 2, 0, PS_CLOCK_JOIN, h_cb, &r));
  assert_int_equal(r.count, 3);
  memset(rr, 0, sizeof rr);
  for (int w = 0; w < 2; w++)
    assert_int_equal(ps_client_push_pull(c.w[w], "sync/w", 0, w, 5, PS_DT_F32,
                                         g[w], sizeof g[w], got[w], N, h_cb,
                                         &rr[w]), 0);
  H_CALL(&c.e, r, ps_client_stats(c.w[2], h_cb, &r));
  assert_false(rr[0].done || rr[1].done);
  /* its clock past step 5 (it had nothing to push) lets the step apply */
  H_CALL(&c.e, r, ps_client_clock(c.w[2], 2, 6, PS_CLOCK_TICK, h_cb, &r));
  for (int w = 0; w < 2; w++) {
    assert_true(h_wait(&c.e, &rr[w].done));
    assert_int_equal(rr[w].status, 0);
  }
  /* every worker jumps ahead (as after a PS restart): the steps nobody
   * pushed are skipped at once and step 40 needs all three again */
  for (int w = 0; w < 3; w++)
    H_CALL(&c.e, r, ps_client_clock(c.w[w], w, 40, PS_CLOCK_TICK, h_cb, &r));
  assert_int_equal(r.min_clock, 40);
  memset(rr, 0, sizeof rr);
  for (int w = 0; w < 3; w++)
    assert_int_equal(ps_client_push_pull(c.w[w], "sync/w", 0, w, 40,
                                         PS_DT_F32, g[w], sizeof g[w], got[w],
                                         N, h_cb, &rr[w]), 0);
  for (int w = 0; w < 3; w++) {
    assert_true(h_wait(&c.e, &rr[w].done));
    assert_int_equal(rr[w].status, 0);
  }
  /* a push for a step already applied is refused as stale */
  H_CALL(&c.e, r, ps_client_push(c.w[0], "sync/w", 0, 0, 1, PS_DT_F32, g[0],
                                 sizeof g[0], h_cb, &r));
  assert_int_equal(r.status, TSR_ESTALE);
  assert_int_equal(h_down(&c.e), 0);
}

static void ssp_holds_fast_worker(void **state) {
  (void)state;
  cl3 c;
  cl3_up(&c, "ssp:1");
  h_res r;
  ps_var_spec v = h_spec("ssp/w", D0, D1, 0, 1, "zeros", 1, TSR_OPT_SGD);
  H_CALL(&c.e, r, ps_client_create(c.w[0], &v, 1, h_cb, &r));
  H_CALL(&c.e, r, ps_client_clock(c.w[0], 0, 0, PS_CLOCK_JOIN, h_cb, &r));
  H_CALL(&c.e, r, ps_client_clock(c.w[1], 1, 0, PS_CLOCK_JOIN, h_cb, &r));
  static float got[N];
  /* worker 0 runs ahead to clock 3: its pull needs the slowest at 2 */
  H_CALL(&c.e, r, ps_client_clock(c.w[0], 0, 3, PS_CLOCK_TICK, h_cb, &r));
  assert_int_equal(r.min_clock, 0);
  h_res held;
  memset(&held, 0, sizeof held);
  assert_int_equal(ps_client_pull(c.w[0], "ssp/w", 0, 0, 3, got, N, h_cb,
                                  &held), 0);
  /* worker 1 within the bound is not held */
  H_CALL(&c.e, r, ps_client_pull(c.w[1], "ssp/w", 0, 1, 1, got, N, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_false(held.done);
  H_CALL(&c.e, r, ps_client_clock(c.w[1], 1, 1, PS_CLOCK_TICK, h_cb, &r));
  H_CALL(&c.e, r, ps_client_stats(c.w[2], h_cb, &r));
  assert_false(held.done);
  /* in ssp a push of step 1 means worker 1 finished 2 steps */
  float g1[N];
  for (int i = 0; i < N; i++) g1[i] = 0.0f;
  H_CALL(&c.e, r, ps_client_push(c.w[1], "ssp/w", 0, 1, 1, PS_DT_F32, g1,
                                 sizeof g1, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_true(h_wait(&c.e, &held.done));
  assert_int_equal(held.status, 0);
  /* worker 0 further ahead; worker 1 leaves instead of catching up */
  memset(&held, 0, sizeof held);
  H_CALL(&c.e, r, ps_client_clock(c.w[0], 0, 6, PS_CLOCK_TICK, h_cb, &r));
  assert_int_equal(ps_client_pull(c.w[0], "ssp/w", 0, 0, 6, got, N, h_cb,
                                  &held), 0);
  H_CALL(&c.e, r, ps_client_stats(c.w[2], h_cb, &r));
  assert_false(held.done);
  assert_int_equal(r.min_clock, 2);
  H_CALL(&c.e, r, ps_client_clock(c.w[2], 1, 0, PS_CLOCK_LEAVE, h_cb, &r));
  assert_true(h_wait(&c.e, &held.done));
  assert_int_equal(held.status, 0);
  /* it returns at the slowest clock, so it holds nobody back */
  H_CALL(&c.e, r, ps_client_clock(c.w[1], 1, 0, PS_CLOCK_JOIN, h_cb, &r));
  assert_int_equal(r.min_clock, 6);
  assert_int_equal(h_down(&c.e), 0);
}

static void shutdown_answers_held_calls(void **state) {
  (void)state;
  cl3 c;
  cl3_up(&c, "ssp:0");
  h_res r, held;
  ps_var_spec v = h_spec("h", 4, 4, 0, 1, "zeros", 1, TSR_OPT_SGD);
  H_CALL(&c.e, r, ps_client_create(c.w[0], &v, 1, h_cb, &r));
  H_CALL(&c.e, r, ps_client_clock(c.w[0], 0, 0, PS_CLOCK_JOIN, h_cb, &r));
  H_CALL(&c.e, r, ps_client_clock(c.w[1], 1, 0, PS_CLOCK_JOIN, h_cb, &r));
  float got[16];
  memset(&held, 0, sizeof held);
  assert_int_equal(ps_client_pull(c.w[0], "h", 0, 0, 5, got, 16, h_cb, &held), 0);
  H_CALL(&c.e, r, ps_client_stats(c.w[2], h_cb, &r));
  assert_false(held.done);
  /* closing the server answers the held pull instead of hanging */
  int closed = 0;
  ps_server_close(c.e.srv[0], h_closed, &closed);
  c.e.srv[0] = NULL;
  assert_true(h_wait(&c.e, &held.done));
  assert_int_not_equal(held.status, 0);
  assert_true(h_wait(&c.e, &closed));
  assert_int_equal(h_down(&c.e), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(state_machine),
      cmocka_unit_test(sync_three_workers_equal_one),
      cmocka_unit_test(ssp_holds_fast_worker),
      cmocka_unit_test(shutdown_answers_held_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
