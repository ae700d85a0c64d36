/* Collectives driven from other threads than the loop's, every rank in
 * this process over the real RPC on 127.0.0.1: tickets (submit and wait,
 * each waited for once, a waiter woken by the close) and gradient buckets
 * (the fusion layout, and buckets whose tensors become final on other
 * threads in any order). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "common/coll/coll_int.h"
#include "tests/unit/coll/coll_util.h"

/* ---- tickets ------------------------------------------------------------ */

typedef struct {
  tsr_coll *c;
  float *x;
  size_t n;
  int rounds;
  int rc;
  char err[TSR_COLL_ERR_MAX];
  volatile int finished;
} tk_arg;

static void *tk_thread(void *p) {
  tk_arg *a = p;
  for (int k = 0; k < a->rounds && !a->rc; k++) {
    tsr_coll_ticket t1, t2;
    tsr_coll_req q = {TSR_COLL_ALLREDUCE, a->x, a->n, 0, NULL, NULL};
    tsr_coll_req b = {TSR_COLL_BARRIER, NULL, 0, 0, NULL, NULL};
    if ((a->rc = tsr_coll_submit(a->c, &q, &t1))) break;
    if ((a->rc = tsr_coll_submit(a->c, &b, &t2))) break;
    if ((a->rc = tsr_coll_wait(a->c, t1, a->err, sizeof a->err))) break;
    a->rc = tsr_coll_wait(a->c, t2, a->err, sizeof a->err);
  }
  /* a ticket is waited for once */
  if (!a->rc && tsr_coll_wait(a->c, 12345, NULL, 0) != TSR_EINVAL)
    a->rc = -1;
  a->finished = 1;
  return NULL;
}

static void test_tickets(void **state) {
  (void)state;
  enum { N = 3, ROUNDS = 5 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = cu_small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  tk_arg a[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&a[i], 0, sizeof a[i]);
    a[i].c = g.r[i].coll;
    a[i].n = 5000;
    a[i].x = malloc(sizeof(float) * a[i].n);
    for (size_t e = 0; e < a[i].n; e++) a[i].x[e] = 1.0f;
    a[i].rounds = ROUNDS;
    assert_int_equal(pthread_create(&th[i], NULL, tk_thread, &a[i]), 0);
  }
  uint64_t end = tsr_now_ms() + 30000;
  for (;;) {
    int fin = 0;
    for (int i = 0; i < N; i++) fin += a[i].finished;
    if (fin == N || tsr_now_ms() > end) break;
    uv_run(&loop, UV_RUN_ONCE);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(a[i].rc, 0);
    /* 1 -> 3 -> 9 -> ... : N^ROUNDS */
    for (size_t e = 0; e < a[i].n; e++) assert_true(a[i].x[e] == 243.0f);
    free(a[i].x);
  }
  assert_int_equal(cu_end(&g), 0);
}

/* A thread waiting on a ticket is woken by the close. */
static void *tk_blocked(void *p) {
  tk_arg *a = p;
  tsr_coll_ticket t;
  tsr_coll_req q = {TSR_COLL_ALLREDUCE, a->x, a->n, 0, NULL, NULL};
  if ((a->rc = tsr_coll_submit(a->c, &q, &t)) == 0)
    a->rc = tsr_coll_wait(a->c, t, a->err, sizeof a->err);
  a->finished = 1;
  return NULL;
}

static void test_ticket_close(void **state) {
  (void)state;
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = cu_small_opts();
  assert_int_equal(cu_start(&loop, &g, 2, &o, 1), 0);
  float x[16] = {0};
  tk_arg a;
  memset(&a, 0, sizeof a);
  a.c = g.r[0].coll;
  a.x = x;
  a.n = 16;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, tk_blocked, &a), 0);
  /* rank 1 never posts: the op waits until rank 0 closes */
  tsr_coll_stats st = {0};
  uint64_t end = tsr_now_ms() + 20000;
  while (st.inflight == 0 && tsr_now_ms() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    tsr_coll_get_stats(g.r[0].coll, &st);
  }
  assert_int_equal(st.inflight, 1);
  cu_rank_close(&loop, &g.r[0]);
  pthread_join(th, NULL);
  assert_int_equal(a.rc, TSR_ESHUTDOWN);
  if (!strstr(a.err, "closing")) {
    print_error("%s\n", a.err);
    fail();
  }
  assert_int_equal(cu_end(&g), 0);
}

/* ---- gradient buckets --------------------------------------------------- */

static void test_fuse_layout(void **state) {
  (void)state;
  /* tensors 0..5 final in backward order 5..0; 100-float buckets:
   * [5] (50, +60 would pass 100), [4, 3] (70, +250 would), [2] (alone,
   * larger than a bucket), [1, 0] */
  size_t counts[6] = {30, 30, 250, 10, 60, 50};
  tsr_coll_fuse *f;
  assert_int_equal(tsr_coll_fuse_new(&f, counts, NULL, 6, 400), 0);
  int nb = tsr_coll_fuse_nbuckets(f);
  size_t total = 0;
  const float *prev_end = NULL;
  for (int b = 0; b < nb; b++) {
    int n;
    const int *m = tsr_coll_fuse_members(f, b, &n);
    size_t fl = 0;
    for (int i = 0; i < n; i++) {
      /* contiguous, in final order */
      if (prev_end) assert_ptr_equal(tsr_coll_fuse_slot(f, m[i]), prev_end);
      prev_end = tsr_coll_fuse_slot(f, m[i]) + counts[m[i]];
      fl += counts[m[i]];
    }
    assert_int_equal(fl, tsr_coll_fuse_bucket_floats(f, b));
    assert_true(fl <= 100 || n == 1);
    total += fl;
  }
  assert_int_equal(total, 430);
  assert_int_equal(nb, 4);
  int n;
  const int *m = tsr_coll_fuse_members(f, 1, &n);
  assert_int_equal(n, 2);
  assert_int_equal(m[0], 4);
  assert_int_equal(m[1], 3);
  tsr_coll_fuse_free(f);
  int bad[3] = {0, 0, 2};
  assert_int_equal(tsr_coll_fuse_new(&f, counts, bad, 3, 400), TSR_EINVAL);
}

typedef struct {
  tsr_coll *c;
  int rank;
  int rc;
  volatile int finished;
} fz_arg;

static void *fz_thread(void *p) {
  fz_arg *a = p;
  size_t counts[6] = {3000, 5, 7000, 1, 2500, 900};
  tsr_coll_fuse *f;
  if ((a->rc = tsr_coll_fuse_new(&f, counts, NULL, 6, 16384))) goto out;
  for (int step = 0; step < 3 && !a->rc; step++) {
    tsr_coll_fuse_start(f, a->c);
    for (int t = 0; t < 6; t++)
      for (size_t e = 0; e < counts[t]; e++)
        tsr_coll_fuse_slot(f, t)[e] = (float)((a->rank + 1) * (t + 1) + step);
    /* final out of order, and differently on each rank */
    int ord[6] = {2, 5, 0, 4, 1, 3};
    for (int i = 0; i < 6 && !a->rc; i++)
      a->rc = tsr_coll_fuse_ready(f, ord[(i + a->rank) % 6]);
    char err[TSR_COLL_ERR_MAX];
    for (int b = 0; b < tsr_coll_fuse_nbuckets(f) && !a->rc; b++) {
      uint64_t t0, t1;
      a->rc = tsr_coll_fuse_wait(f, b, err, sizeof err, &t0, &t1);
      if (!a->rc && t1 < t0) a->rc = -1;
    }
    if (!a->rc) a->rc = tsr_coll_fuse_wait_all(f, err, sizeof err);
    /* ranks 1, 2, 3 summed: 6 * (t + 1) + 3 * step */
    for (int t = 0; t < 6 && !a->rc; t++)
      for (size_t e = 0; e < counts[t]; e++)
        if (tsr_coll_fuse_slot(f, t)[e] != (float)(6 * (t + 1) + 3 * step))
          a->rc = -2;
  }
  tsr_coll_fuse_free(f);
out:
  a->finished = 1;
  return NULL;
}

/* Three ranks' threads drive buckets whose tensors become final in other
 * orders on each: buckets still go out in one order and sum right. */
static void test_fuse_allreduce(void **state) {
  (void)state;
  enum { N = 3 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = cu_small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  fz_arg a[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&a[i], 0, sizeof a[i]);
    a[i].c = g.r[i].coll;
    a[i].rank = i;
    assert_int_equal(pthread_create(&th[i], NULL, fz_thread, &a[i]), 0);
  }
  uint64_t end = tsr_now_ms() + 30000;
  for (;;) {
    int fin = 0;
    for (int i = 0; i < N; i++) fin += a[i].finished;
    if (fin == N || tsr_now_ms() > end) break;
    uv_run(&loop, UV_RUN_ONCE);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(a[i].rc, 0);
  }
  assert_int_equal(cu_end(&g), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tickets),
      cmocka_unit_test(test_fuse_layout),
      cmocka_unit_test(test_fuse_allreduce),
      cmocka_unit_test(test_ticket_close),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
