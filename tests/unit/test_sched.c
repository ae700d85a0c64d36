/* The closure scheduler: closures go to workers with room, at most
 * max_inflight each; failures and dead workers give steps back; rewinds
 * forget old closures; and whatever fails in whatever order, the final
 * count of steps is exactly the total. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "chief/coord/scheduler.h"

static void hands_out_closures_to_workers_with_room(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(2, 35, 10, 2);
  chief_closure c;
  assert_false(chief_sched_next(s, &c)); /* nobody up */
  chief_sched_worker_up(s, 0);
  chief_sched_worker_up(s, 1);
  int per[2] = {0, 0};
  int64_t steps = 0;
  chief_closure got[4];
  for (int i = 0; i < 4; i++) {
    assert_true(chief_sched_next(s, &got[i]));
    per[got[i].worker]++;
    steps += got[i].steps;
  }
  assert_int_equal(per[0], 2);
  assert_int_equal(per[1], 2);
  assert_int_equal(steps, 35); /* 10+10+10+5 */
  assert_false(chief_sched_next(s, &c)); /* pool empty */
  for (int i = 0; i < 4; i++)
    assert_true(chief_sched_done(s, got[i].id, got[i].generation, got[i].steps));
  assert_true(chief_sched_finished(s));
  assert_int_equal(chief_sched_done_steps(s), 35);
  chief_sched_free(s);
}

static void max_inflight_per_worker(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(1, 1000, 10, 2);
  chief_sched_worker_up(s, 0);
  chief_closure a, b, c;
  assert_true(chief_sched_next(s, &a));
  assert_true(chief_sched_next(s, &b));
  assert_false(chief_sched_next(s, &c));
  assert_int_equal(chief_sched_inflight(s, 0), 2);
  assert_true(chief_sched_done(s, a.id, a.generation, 10));
  assert_true(chief_sched_next(s, &c));
  chief_sched_free(s);
}

static void dead_worker_gives_steps_back(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(2, 40, 10, 2);
  chief_sched_worker_up(s, 0);
  chief_sched_worker_up(s, 1);
  chief_closure c[4];
  for (int i = 0; i < 4; i++) assert_true(chief_sched_next(s, &c[i]));
  assert_int_equal(chief_sched_worker_down(s, 1), 2);
  assert_int_equal(chief_sched_inflight(s, 1), 0);
  /* a late answer from the dead worker is ignored */
  for (int i = 0; i < 4; i++)
    if (c[i].worker == 1)
      assert_false(chief_sched_done(s, c[i].id, c[i].generation, 10));
  /* worker 0 picks the steps up once it has room */
  for (int i = 0; i < 4; i++)
    if (c[i].worker == 0) chief_sched_done(s, c[i].id, c[i].generation, 10);
  chief_closure d;
  int64_t left = 0;
  while (chief_sched_next(s, &d)) {
    assert_int_equal(d.worker, 0);
    left += d.steps;
    chief_sched_done(s, d.id, d.generation, d.steps);
  }
  assert_int_equal(left, 20);
  assert_true(chief_sched_finished(s));
  assert_int_equal(chief_sched_retries(s), 2);
  chief_sched_free(s);
}

static void rewind_forgets_old_closures(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(1, 100, 10, 2);
  chief_sched_worker_up(s, 0);
  chief_closure a, b;
  assert_true(chief_sched_next(s, &a));
  chief_sched_done(s, a.id, a.generation, 10);
  assert_true(chief_sched_next(s, &a));
  assert_true(chief_sched_next(s, &b));
  chief_sched_rewind(s, 5);
  assert_int_equal(chief_sched_done_steps(s), 5);
  assert_int_equal(chief_sched_inflight(s, -1), 0);
  assert_false(chief_sched_done(s, a.id, a.generation, 10));
  assert_false(chief_sched_failed(s, b.id, b.generation));
  chief_closure c;
  assert_true(chief_sched_next(s, &c));
  assert_int_equal(c.generation, 1);
  assert_int_equal(c.first_step, 5);
  chief_sched_free(s);
}

static void pause_and_short_closures(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(1, 20, 10, 2);
  chief_sched_worker_up(s, 0);
  chief_sched_pause(s, true);
  chief_closure a;
  assert_false(chief_sched_next(s, &a));
  chief_sched_pause(s, false);
  assert_true(chief_sched_next(s, &a));
  /* the input ran out after 4 of 10: 6 go back */
  assert_true(chief_sched_done(s, a.id, a.generation, 4));
  assert_int_equal(chief_sched_done_steps(s), 4);
  chief_sched_set_total(s, 8);
  int64_t got = 0;
  while (chief_sched_next(s, &a)) {
    got += a.steps;
    chief_sched_done(s, a.id, a.generation, a.steps);
  }
  assert_int_equal(got, 4);
  assert_true(chief_sched_finished(s));
  assert_null(chief_sched_new(0, 1, 1, 1));
  assert_null(chief_sched_new(1, 1, 0, 1));
  chief_sched_free(s);
}

/* Pinned (ssp, sync): each worker runs its own even share; an idle worker
 * never takes the other's steps while that one is up, so both end at the
 * same clock; a worker that is down has its share run by the others. */
static void pinned_shares(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(2, 25, 10, 2);
  chief_sched_set_pinned(s, true);
  chief_sched_worker_up(s, 0);
  chief_sched_worker_up(s, 1);
  int64_t per[2] = {0, 0};
  chief_closure c;
  while (chief_sched_next(s, &c)) {
    per[c.worker] += c.steps;
    if (c.worker == 0) chief_sched_done(s, c.id, c.generation, c.steps);
  }
  /* worker 0 finished its 13 while worker 1 still holds its 12 */
  assert_int_equal(per[0], 13);
  assert_int_equal(per[1], 12);
  assert_false(chief_sched_next(s, &c));
  chief_sched_free(s);

  s = chief_sched_new(2, 40, 10, 2);
  chief_sched_set_pinned(s, true);
  chief_sched_worker_up(s, 0);
  int64_t got = 0;
  while (chief_sched_next(s, &c)) { /* worker 1 never came: its share too */
    assert_int_equal(c.worker, 0);
    got += c.steps;
    chief_sched_done(s, c.id, c.generation, c.steps);
  }
  assert_int_equal(got, 40);
  assert_true(chief_sched_finished(s));
  chief_sched_free(s);
}

/* Pinned and paused: a worker handed fewer steps than its peer is brought
 * level (so in sync mode the peer's closure is matched) and no further. */
static void pinned_pause_levels_workers(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(2, 200, 10, 2);
  chief_sched_set_pinned(s, true);
  chief_sched_worker_up(s, 0);
  chief_sched_worker_up(s, 1);
  chief_closure a, b, c;
  assert_true(chief_sched_next(s, &a)); /* w0: 10 */
  assert_true(chief_sched_next(s, &b)); /* w1: 10 */
  assert_true(chief_sched_next(s, &c)); /* w0: 20 */
  assert_int_equal(a.worker, c.worker);
  chief_sched_pause(s, true);
  chief_closure d, e;
  assert_true(chief_sched_next(s, &d));
  assert_int_equal(d.worker, b.worker); /* the other is brought level */
  assert_int_equal(d.steps, 10);
  assert_false(chief_sched_next(s, &e)); /* and no one goes further */
  chief_sched_free(s);
  /* not pinned: a pause hands out nothing */
  s = chief_sched_new(2, 200, 10, 2);
  chief_sched_worker_up(s, 0);
  chief_sched_worker_up(s, 1);
  assert_true(chief_sched_next(s, &a));
  chief_sched_pause(s, true);
  assert_false(chief_sched_next(s, &e));
  chief_sched_free(s);
}

/* Lockstep (a ring of workers): after a worker goes, nothing goes out until
 * the closures out have ended, then the rest is dealt in equal shares;
 * every member of the new ring is handed as many steps, an odd remainder
 * rounded up (run once more) while the count stops at the total. */
static void lockstep_equal_shares(void **state) {
  (void)state;
  chief_sched *s = chief_sched_new(3, 301, 10, 2);
  chief_sched_set_lockstep(s, true);
  for (int w = 0; w < 3; w++) chief_sched_worker_up(s, w);
  chief_closure c[6];
  int64_t handed[3] = {0};
  for (int i = 0; i < 6; i++) {
    assert_true(chief_sched_next(s, &c[i]));
    handed[c[i].worker] += c[i].steps;
  }
  assert_int_equal(handed[0], handed[1]);
  assert_int_equal(handed[1], handed[2]);
  chief_sched_worker_down(s, 2);
  chief_closure x;
  /* draining: the survivors' closures of the old ring end first */
  assert_false(chief_sched_next(s, &x));
  int64_t done = 0;
  for (int i = 0; i < 6; i++)
    if (c[i].worker != 2) {
      assert_true(chief_sched_done(s, c[i].id, c[i].generation, c[i].steps));
      done += c[i].steps;
      if (done < 40) assert_false(chief_sched_next(s, &x));
    }
  int64_t now[3] = {0};
  while (chief_sched_next(s, &x)) {
    now[x.worker] += x.steps;
    chief_sched_done(s, x.id, x.generation, x.steps);
  }
  /* 301 - 40 = 261 over two: 131 each (one more than the total) */
  assert_int_equal(now[0], 131);
  assert_int_equal(now[1], 131);
  assert_int_equal(now[2], 0);
  assert_true(chief_sched_finished(s));
  assert_int_equal(chief_sched_done_steps(s), 301);
  chief_sched_free(s);
}

/* Random failures, deaths, returns and rewinds: the count ends exact. */
static void exact_count_under_random_failures(void **state) {
  (void)state;
  srand(12345);
  for (int trial = 0; trial < 400; trial++) {
    int nw = 1 + rand() % 4;
    int64_t total = 1 + rand() % 500;
    chief_sched *s = chief_sched_new(nw, total, 1 + rand() % 20, 2);
    chief_sched_set_pinned(s, trial % 3 == 1);
    if (trial % 3 == 2) chief_sched_set_lockstep(s, true);
    chief_closure fl[64];
    int nfl = 0;
    for (int w = 0; w < nw; w++) chief_sched_worker_up(s, w);
    for (int it = 0; it < 100000 && !chief_sched_finished(s); it++) {
      chief_closure c;
      while (nfl < 64 && chief_sched_next(s, &c)) fl[nfl++] = c;
      int r = rand() % 100;
      if (r < 5) {
        int w = rand() % nw;
        chief_sched_worker_down(s, w);
      } else if (r < 15) {
        chief_sched_worker_up(s, rand() % nw);
      } else if (r < 16) {
        chief_sched_rewind(s, chief_sched_done_steps(s) / 2);
      }
      if (nfl > 0) {
        int k = rand() % nfl;
        c = fl[k];
        fl[k] = fl[--nfl];
        if (rand() % 4 == 0)
          chief_sched_failed(s, c.id, c.generation);
        else
          chief_sched_done(s, c.id, c.generation, c.steps);
      }
      if (nfl == 0) /* make sure someone can work */
        chief_sched_worker_up(s, rand() % nw);
      /* lockstep rounds shares up: fewer than nw extra steps out */
      assert_true(chief_sched_done_steps(s) + chief_sched_inflight_steps(s) <=
                  total + (trial % 3 == 2 ? nw * 2 * 20 : 0));
    }
    assert_true(chief_sched_finished(s));
    assert_int_equal(chief_sched_done_steps(s), total);
    chief_sched_free(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hands_out_closures_to_workers_with_room),
      cmocka_unit_test(max_inflight_per_worker),
      cmocka_unit_test(dead_worker_gives_steps_back),
      cmocka_unit_test(rewind_forgets_old_closures),
      cmocka_unit_test(pause_and_short_closures),
      cmocka_unit_test(pinned_shares),
      cmocka_unit_test(pinned_pause_levels_workers),
      cmocka_unit_test(lockstep_equal_shares),
      cmocka_unit_test(exact_count_under_random_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
