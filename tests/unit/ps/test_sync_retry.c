/* The sync apply's out-of-memory retry, with the PS's allocation-fault
 * injection: two workers push one sync step of a sparse variable and the
 * allocation of the apply's summed rows fails once.
 * (a) the apply that failed keeps the pushed sum and the timer's retry
 *     applies it: the values after two steps equal those of a run without
 *     the fault (the step lands exactly once);
 * (b) an apply whose failure ends after a reset (a new era) is not retried,
 *     and the old era's sum is never applied: the new era's first step
 *     gives the values of a fresh server that only ran that step;
 * (c) a reset clears a retry still pending from the era before.
 * (b) and (c) stop the server's timer and look at the shard's entry
 * (svc_int.h), so a pending retry stays visible and a step that waited on
 * a stale retry would never land. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>

#include "ps_harness.h"
#include "ps/svc_int.h"

enum { ROWS = 40, W = 5 };

/* Fails allocations of exactly `size` bytes, `left` times; with `hold`, the
 * failing one first waits (on its pool thread) until hold is cleared. */
typedef struct {
  _Atomic size_t size;
  _Atomic int left;
  _Atomic int failed;
  _Atomic int hold;
  _Atomic int holding;
} fault;

static void *f_alloc(void *ctx, size_t n) {
  fault *f = ctx;
  if (n == atomic_load(&f->size)) {
    int left = atomic_load(&f->left);
    while (left > 0 && !atomic_compare_exchange_weak(&f->left, &left,
                                                     left - 1)) {
    }
    if (left > 0) {
      atomic_fetch_add(&f->failed, 1);
      atomic_store(&f->holding, 1);
      while (atomic_load(&f->hold)) tsr_sleep_ms(1);
      atomic_store(&f->holding, 0);
      return NULL;
    }
  }
  return malloc(n);
}

/* Step 0 of the first era: worker 0 pushes rows 0..5, worker 1 rows
 * 10..16, so the apply collects 13 summed rows: 13 * W floats is the
 * allocation that fails (no push or pull of these tests allocates that
 * size). */
static const int64_t ids0[6] = {0, 1, 2, 3, 4, 5};
static const int64_t ids1[7] = {10, 11, 12, 13, 14, 15, 16};
#define FAIL_BYTES ((size_t)13 * W * sizeof(float))
/* Another step: rows 3..6 and 20..24 (9 summed rows). */
static const int64_t ids2[4] = {3, 4, 5, 6};
static const int64_t ids3[5] = {20, 21, 22, 23, 24};

static float grad(int salt, int i) {
  return sinf(0.37f * (float)i + 1.3f * (float)salt) * (float)(1 + salt % 3);
}

typedef struct {
  h_env e;
  fault f;
  tsr_rpc_allocator al;
  ps_entry *ent;
} env;

static void up(env *v, bool timer) {
  memset(v, 0, sizeof *v);
  atomic_store(&v->f.size, (size_t)0);
  v->al = (tsr_rpc_allocator){f_alloc, h_malloc_free, &v->f};
  ps_server_opts o = {0};
  o.allocator = &v->al;
  h_up(&v->e, 1, &o);
  if (!timer) uv_timer_stop(&v->e.srv[0]->timer);
  h_res r;
  tsr_optim_spec opt;
  tsr_optim_defaults(TSR_OPT_SGD, &opt);
  opt.learning_rate = 0.1;
  ps_var_spec s;
  int64_t shape[2] = {ROWS, W};
  assert_int_equal(ps_var_spec_init(&s, "s", 2, shape, 0, 1, "random_uniform",
                                    7, &opt), 0);
  s.bounded = true;
  s.var.kind = TSR_VAR_ROW_SPARSE;
  H_CALL(&v->e, r, ps_client_create(v->e.cl[0], &s, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  v->ent = ps__find(v->e.srv[0], "s", 0);
  assert_non_null(v->ent);
}

/* A new era in sync mode (a reset) and both workers joined at clock 0. */
static void era(env *v) {
  h_res r;
  H_CALL(&v->e, r, ps_client_config(v->e.cl[0], "sync", false, h_cb, &r));
  assert_int_equal(r.status, 0);
  for (int w = 0; w < 2; w++) {
    H_CALL(&v->e, r, ps_client_clock(v->e.cl[0], w, 0, PS_CLOCK_JOIN, h_cb,
                                     &r));
    assert_int_equal(r.status, 0);
  }
}

/* Worker w pushes its rows of `step` (gradients salted by `salt`). */
static void push(env *v, int w, int64_t step, const int64_t *ids, size_t n,
                 int salt) {
  float g[7 * W];
  for (size_t i = 0; i < n * W; i++) g[i] = grad(salt, (int)i);
  h_res r;
  H_CALL(&v->e, r, ps_client_push_rows(v->e.cl[0], "s", 0, w, step,
                                       PS_DT_F32, ids, n, g,
                                       n * W * sizeof(float), h_cb, &r));
  assert_int_equal(r.status, 0);
}

/* Every row, once the step before `clock` is applied. */
static void pull_all(env *v, int64_t clock, float *out) {
  int64_t ids[ROWS];
  for (int i = 0; i < ROWS; i++) ids[i] = i;
  h_res r;
  H_CALL(&v->e, r, ps_client_pull_rows(v->e.cl[0], "s", 0, 0, clock, ids,
                                       ROWS, out, W, h_cb, &r));
  assert_int_equal(r.status, 0);
}

/* Runs the loop until the entry has nothing queued, running or pending. */
static void settle(env *v) {
  uint64_t end = tsr_now_ms() + 20000;
  while ((v->ent->sync_queued || v->ent->writing || v->ent->head) &&
         tsr_now_ms() < end)
    uv_run(&v->e.loop, UV_RUN_NOWAIT);
  assert_false(v->ent->sync_queued || v->ent->writing || v->ent->head);
}

static void down(env *v) { assert_int_equal(h_down(&v->e), 0); }

/* Two sync steps; with `fail`, the first step's apply runs out of memory
 * once. Returns the values after both steps. */
static void two_steps(bool fail, float *out) {
  env v;
  up(&v, true);
  era(&v);
  if (fail) {
    atomic_store(&v.f.size, FAIL_BYTES);
    atomic_store(&v.f.left, 1);
  }
  push(&v, 0, 0, ids0, 6, 1);
  push(&v, 1, 0, ids1, 7, 2);
  float mid[ROWS * W];
  pull_all(&v, 1, mid); /* held until the step is applied (the retry) */
  assert_int_equal(atomic_load(&v.f.failed), fail ? 1 : 0);
  assert_int_equal(v.ent->sync_done, 1);
  push(&v, 0, 1, ids2, 4, 3);
  push(&v, 1, 1, ids3, 5, 4);
  pull_all(&v, 2, out);
  h_res r;
  H_CALL(&v.e, r, ps_client_stats(v.e.cl[0], h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.sync_step, 2);
  down(&v);
}

static void retry_applies_the_kept_sum_once(void **state) {
  (void)state;
  static float want[ROWS * W], got[ROWS * W], init[ROWS * W];
  two_steps(false, want);
  two_steps(true, got);
  assert_memory_equal(got, want, sizeof got);
  /* and the steps did change the rows they touched */
  env v;
  up(&v, true);
  pull_all(&v, 0, init);
  down(&v);
  for (int k = 0; k < 6; k++)
    for (int j = 0; j < W; j++)
      assert_true(init[ids0[k] * W + j] != want[ids0[k] * W + j]);
}

/* The new era's first step alone, on a fresh server: worker 0 pushes rows
 * 3..6, worker 1 rows 20..24. */
static void new_era_step(env *v, float *out) {
  push(v, 0, 0, ids2, 4, 5);
  push(v, 1, 0, ids3, 5, 6);
  pull_all(v, 1, out);
  assert_int_equal(v->ent->sync_done, 1);
}

static void reference(float *out) {
  env v;
  up(&v, false);
  era(&v);
  new_era_step(&v, out);
  down(&v);
}

/* A server with its timer stopped, a sync era, and step 0 pushed by both
 * workers with the apply's allocation set to fail once (with `hold`, the
 * failing allocation waits until the test lets it go). */
static void failing_step0(env *v, bool hold) {
  up(v, false);
  era(v);
  atomic_store(&v->f.size, FAIL_BYTES);
  atomic_store(&v->f.left, 1);
  atomic_store(&v->f.hold, hold ? 1 : 0);
  push(v, 0, 0, ids0, 6, 1);
  push(v, 1, 0, ids1, 7, 2);
}

/* The new era's step lands alone: the values of a fresh server that ran
 * only that step. Ends the server (before the fresh one starts). */
static void new_era_alone(env *v) {
  static float want[ROWS * W], got[ROWS * W];
  new_era_step(v, got);
  down(v);
  reference(want);
  assert_memory_equal(got, want, sizeof got);
}

static void failure_after_reset_is_not_retried(void **state) {
  (void)state;
  env v;
  failing_step0(&v, true);
  /* the apply is on the pool, inside the allocation that will fail */
  uint64_t end = tsr_now_ms() + 20000;
  while (!atomic_load(&v.f.holding) && tsr_now_ms() < end)
    uv_run(&v.e.loop, UV_RUN_NOWAIT);
  assert_true(atomic_load(&v.f.holding));
  uint64_t era0 = v.e.srv[0]->cons.era;
  h_res r;
  H_CALL(&v.e, r, ps_client_config(v.e.cl[0], "sync", false, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_true(v.e.srv[0]->cons.era != era0);
  atomic_store(&v.f.hold, 0); /* the old era's apply fails now */
  settle(&v);
  assert_int_equal(atomic_load(&v.f.failed), 1);
  assert_false(v.ent->sync_retry);
  assert_int_equal(v.ent->sync_done, 0);
  /* the new era: its step alone lands, nothing of the old sum */
  for (int w = 0; w < 2; w++) {
    H_CALL(&v.e, r, ps_client_clock(v.e.cl[0], w, 0, PS_CLOCK_JOIN, h_cb,
                                    &r));
    assert_int_equal(r.status, 0);
  }
  new_era_alone(&v);
}

static void reset_clears_a_pending_retry(void **state) {
  (void)state;
  env v;
  failing_step0(&v, false);
  settle(&v);
  assert_int_equal(atomic_load(&v.f.failed), 1);
  /* failed in its own era: the retry waits for the (stopped) timer */
  assert_true(v.ent->sync_retry);
  assert_int_equal(v.ent->sync_done, 0);
  era(&v); /* a reset, and both workers join the new era */
  assert_false(v.ent->sync_retry);
  /* the new era's step is applied at once, without the old sum */
  new_era_alone(&v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(retry_applies_the_kept_sum_once),
      cmocka_unit_test(failure_after_reset_is_not_retried),
      cmocka_unit_test(reset_clears_a_pending_retry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
