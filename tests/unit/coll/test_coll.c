/* Collectives (common/coll/coll.h) with every rank in this process, on one
 * loop, over the real RPC on 127.0.0.1: the geometry; all-reduce sums
 * (exact for integers in floats, bitwise the same on every rank and equal
 * to the documented ring order for any floats) for 1..4 ranks and sizes
 * from 0 to many segments; several operations in flight; data for an
 * operation a rank has not posted yet; broadcast and barrier; tickets
 * from another thread; and the failures: a rank closed mid-ring, a rank
 * that never posts, another operation under the same number, data over
 * the early limit, neighbours that cannot be reached or disagree on the
 * group; a new group after a break. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/coll/coll_int.h"
#include "tests/unit/coll/coll_util.h"

static tsr_coll_opts small_opts(void) {
  tsr_coll_opts o;
  memset(&o, 0, sizeof o);
  o.segment_bytes = 4096;
  return o;
}

/* ---- geometry ----------------------------------------------------------- */

static void test_span_covers(void **state) {
  (void)state;
  size_t counts[] = {0, 1, 2, 5, 13, 1000, 100003};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
    for (int n = 1; n <= 5; n++) {
      size_t count = counts[ci];
      uint32_t nseg = tsr_coll__nseg(count, 4, n, 4096);
      assert_true(nseg >= 1);
      size_t next = 0;
      for (int c = 0; c < n; c++)
        for (uint32_t s = 0; s < nseg; s++) {
          size_t off, len;
          tsr_coll__span(count, n, c, nseg, s, &off, &len);
          assert_int_equal(off, next);
          assert_true(len * 4 <= 4096);
          next += len;
        }
      assert_int_equal(next, count);
    }
  /* 13 over 5: 3,3,3,2,2 as the partitioner's "div" layout */
  size_t off, len;
  tsr_coll__span(13, 5, 3, 1, 0, &off, &len);
  assert_int_equal(off, 9);
  assert_int_equal(len, 2);
}

/* ---- all-reduce --------------------------------------------------------- */

/* Fills rank r's data: integers (exact sums) or arbitrary floats. */
static void fill(float *x, size_t count, int r, bool ints) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
  for (size_t i = 0; i < count; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    if (ints)
      x[i] = (float)((int)((s >> 33) % 2001) - 1000);
    else
      x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) *
             (float)(1 << (int)((s >> 7) % 20));
  }
}

static void allreduce_case(int n, size_t count, bool ints) {
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  assert_int_equal(cu_start(&loop, &g, n, &o, 1), 0);
  cu_rec rec[CU_MAX];
  float *x[CU_MAX], *orig[CU_MAX];
  for (int i = 0; i < n; i++) {
    x[i] = malloc(sizeof(float) * (count ? count : 1));
    orig[i] = malloc(sizeof(float) * (count ? count : 1));
    fill(x[i], count, i, ints);
    memcpy(orig[i], x[i], sizeof(float) * count);
  }
  float *ref = malloc(sizeof(float) * (count ? count : 1));
  cu_ref_sum(orig, n, count, ref);
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < n; i++)
    assert_int_equal(tsr_coll_allreduce(g.r[i].coll, x[i], count, cu_rec_cb,
                                        &rec[i]),
                     0);
  /* never from inside the call */
  for (int i = 0; i < n; i++) assert_int_equal(rec[i].done, 0);
  assert_true(cu_run(&loop, rec, n, 30000));
  for (int i = 0; i < n; i++) {
    assert_int_equal(rec[i].status, 0);
    assert_int_equal(rec[i].done, 1);
    assert_memory_equal(x[i], ref, sizeof(float) * count);
  }
  if (ints)
    for (size_t e = 0; e < count; e++) {
      double s = 0;
      for (int i = 0; i < n; i++) s += orig[i][e];
      assert_true((double)x[0][e] == s);
    }
  /* 2(N-1)/N of the data per rank, each way */
  tsr_coll_stats st;
  tsr_coll_get_stats(g.r[0].coll, &st);
  assert_int_equal(st.ops, 1);
  assert_int_equal(st.inflight, 0);
  if (n > 1 && count % (size_t)n == 0)
    assert_int_equal(st.bytes_sent, 2 * (size_t)(n - 1) * count / (size_t)n *
                                        sizeof(float));
  for (int i = 0; i < n; i++) {
    free(x[i]);
    free(orig[i]);
  }
  free(ref);
  assert_int_equal(cu_end(&g), 0);
}

static void test_allreduce_sizes(void **state) {
  (void)state;
  size_t counts[] = {0, 1, 3, 1000, 3 * 1024 * 7 + 5};
  for (int n = 1; n <= 4; n++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      allreduce_case(n, counts[ci], true);
      allreduce_case(n, counts[ci], false);
    }
}

/* Many operations in flight at once, of several sizes, posted by the
 * ranks in different orders of loop turns (some data arrives before its
 * operation is posted): each completes with its own exact sum. */
static void test_allreduce_many_inflight(void **state) {
  (void)state;
  enum { N = 3, OPS = 12 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 7), 0);
  float *x[N][OPS], *ref[OPS];
  size_t cnt[OPS];
  cu_rec rec[N * OPS];
  memset(rec, 0, sizeof rec);
  for (int k = 0; k < OPS; k++) {
    cnt[k] = (size_t)(k * 997 + 1) * (k % 3 ? 1 : 7);
    float *orig[N];
    for (int i = 0; i < N; i++) {
      x[i][k] = malloc(sizeof(float) * cnt[k]);
      orig[i] = x[i][k];
      fill(x[i][k], cnt[k], i + 10 * k, true);
    }
    ref[k] = malloc(sizeof(float) * cnt[k]);
    cu_ref_sum(orig, N, cnt[k], ref[k]);
  }
  /* rank 2 posts everything first and lets the ring run; rank 1 posts
   * half, then rank 0 all, then rank 1 the rest */
  for (int k = 0; k < OPS; k++)
    assert_int_equal(tsr_coll_allreduce(g.r[2].coll, x[2][k], cnt[k],
                                        cu_rec_cb, &rec[2 * OPS + k]), 0);
  for (int t = 0; t < 20; t++) uv_run(&loop, UV_RUN_NOWAIT);
  for (int k = 0; k < OPS / 2; k++)
    assert_int_equal(tsr_coll_allreduce(g.r[1].coll, x[1][k], cnt[k],
                                        cu_rec_cb, &rec[OPS + k]), 0);
  for (int t = 0; t < 20; t++) uv_run(&loop, UV_RUN_NOWAIT);
  for (int k = 0; k < OPS; k++)
    assert_int_equal(tsr_coll_allreduce(g.r[0].coll, x[0][k], cnt[k],
                                        cu_rec_cb, &rec[k]), 0);
  for (int t = 0; t < 20; t++) uv_run(&loop, UV_RUN_NOWAIT);
  tsr_coll_stats st;
  tsr_coll_get_stats(g.r[1].coll, &st);
  uint64_t early_seen = st.early_bytes;
  for (int k = OPS / 2; k < OPS; k++)
    assert_int_equal(tsr_coll_allreduce(g.r[1].coll, x[1][k], cnt[k],
                                        cu_rec_cb, &rec[OPS + k]), 0);
  assert_true(cu_run(&loop, rec, N * OPS, 30000));
  assert_true(early_seen > 0);
  for (int i = 0; i < N; i++)
    for (int k = 0; k < OPS; k++) {
      assert_int_equal(rec[i * OPS + k].status, 0);
      assert_memory_equal(x[i][k], ref[k], sizeof(float) * cnt[k]);
      free(x[i][k]);
    }
  tsr_coll_get_stats(g.r[1].coll, &st);
  assert_int_equal(st.early_bytes, 0);
  assert_int_equal(st.ops, OPS);
  for (int k = 0; k < OPS; k++) free(ref[k]);
  assert_int_equal(cu_end(&g), 0);
}

/* A rank posts the operation while a segment for it is on its way (its
 * payload_alloc saw no operation, its handler sees one): the segment is
 * applied, not parked for an operation that has come and gone. */
typedef struct {
  cu_group *g;
  float *x;
  size_t n;
  cu_rec *rec;
  bool posted;
} midland_arg;

static void midland_check(uv_prepare_t *h) {
  midland_arg *a = h->data;
  tsr_coll_stats st;
  tsr_coll_get_stats(a->g->r[1].coll, &st);
  if (a->posted || st.landing == 0) return;
  a->posted = true;
  assert_int_equal(tsr_coll_allreduce(a->g->r[1].coll, a->x, a->n, cu_rec_cb,
                                      a->rec), 0);
  uv_prepare_stop(h);
}

static void test_post_while_landing(void **state) {
  (void)state;
  enum { COUNT = 2 << 20 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o;
  memset(&o, 0, sizeof o);
  o.segment_bytes = 4 << 20;
  o.op_timeout_ms = 3000;
  assert_int_equal(cu_start(&loop, &g, 2, &o, 1), 0);
  cu_rec rec[2];
  float *x[2];
  for (int i = 0; i < 2; i++) {
    x[i] = malloc(COUNT * sizeof(float));
    for (size_t e = 0; e < COUNT; e++) x[i][e] = (float)(i + 1);
  }
  memset(rec, 0, sizeof rec);
  midland_arg a = {&g, x[1], COUNT, &rec[1], false};
  uv_prepare_t prep;
  uv_prepare_init(&loop, &prep);
  prep.data = &a;
  uv_prepare_start(&prep, midland_check);
  assert_int_equal(tsr_coll_allreduce(g.r[0].coll, x[0], COUNT, cu_rec_cb,
                                      &rec[0]), 0);
  assert_true(cu_run(&loop, rec, 2, 30000));
  uv_close((uv_handle_t *)&prep, NULL);
  assert_true(a.posted);
  for (int i = 0; i < 2; i++) {
    if (rec[i].status) print_error("rank %d: %s\n", i, rec[i].msg);
    assert_int_equal(rec[i].status, 0);
    assert_true(x[i][0] == 3.0f && x[i][COUNT - 1] == 3.0f);
    free(x[i]);
  }
  assert_int_equal(cu_end(&g), 0);
}

/* ---- broadcast and barrier ---------------------------------------------- */

static void test_broadcast_barrier(void **state) {
  (void)state;
  enum { N = 4 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  cu_rec rec[N];
  size_t sizes[] = {0, 1, 4095, 50001};
  for (int root = 0; root < N; root++)
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
      size_t bytes = sizes[si];
      uint8_t *b[N];
      for (int i = 0; i < N; i++) {
        b[i] = malloc(bytes + 1);
        for (size_t e = 0; e < bytes; e++)
          b[i][e] = (uint8_t)(i == root ? e * 7 + (size_t)root : 0xee);
      }
      memset(rec, 0, sizeof rec);
      for (int i = 0; i < N; i++)
        assert_int_equal(tsr_coll_broadcast(g.r[i].coll, root, b[i], bytes,
                                            cu_rec_cb, &rec[i]), 0);
      assert_true(cu_run(&loop, rec, N, 30000));
      for (int i = 0; i < N; i++) {
        assert_int_equal(rec[i].status, 0);
        assert_memory_equal(b[i], b[root], bytes);
      }
      for (int i = 0; i < N; i++) free(b[i]);
    }
  /* a barrier completes nowhere before every rank posted it */
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < N - 1; i++)
    assert_int_equal(tsr_coll_barrier(g.r[i].coll, cu_rec_cb, &rec[i]), 0);
  for (int t = 0; t < 200; t++) uv_run(&loop, UV_RUN_NOWAIT);
  for (int i = 0; i < N - 1; i++) assert_int_equal(rec[i].done, 0);
  assert_int_equal(tsr_coll_barrier(g.r[N - 1].coll, cu_rec_cb,
                                    &rec[N - 1]), 0);
  assert_true(cu_run(&loop, rec, N, 30000));
  for (int i = 0; i < N; i++) assert_int_equal(rec[i].status, 0);
  /* bad arguments never reach the ring */
  assert_int_equal(tsr_coll_broadcast(g.r[0].coll, N, rec, 1, cu_rec_cb,
                                      rec), TSR_EINVAL);
  assert_int_equal(tsr_coll_allreduce(g.r[0].coll, NULL, 3, cu_rec_cb, rec),
                   TSR_EINVAL);
  assert_int_equal(cu_end(&g), 0);
}

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
  tsr_coll_opts o = small_opts();
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
  tsr_coll_opts o = small_opts();
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
  tsr_coll_opts o = small_opts();
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

/* ---- failures ----------------------------------------------------------- */

typedef struct {
  cu_group *g;
  int victim;
  bool killed;
} kill_arg;

static void kill_check(uv_prepare_t *h) {
  kill_arg *k = h->data;
  if (k->killed) return;
  tsr_coll_stats st;
  tsr_coll_get_stats(k->g->r[k->victim].coll, &st);
  if (st.segs_recv == 0) return;
  k->killed = true;
  uv_prepare_stop(h);
}

/* A rank closed in the middle of an all-reduce: the others fail it,
 * naming that rank and its address, by the lost connection (not by a
 * timeout: op_timeout_ms is far away). Then the survivors form a new
 * group and all-reduce again. */
static void test_rank_dies_midring(void **state) {
  (void)state;
  enum { N = 4, COUNT = 1 << 20 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  o.op_timeout_ms = 600000;
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  cu_rec rec[N];
  float *x[N];
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < N; i++) {
    x[i] = calloc(COUNT, sizeof(float));
    assert_int_equal(tsr_coll_allreduce(g.r[i].coll, x[i], COUNT, cu_rec_cb,
                                        &rec[i]), 0);
  }
  kill_arg k = {&g, 2, false};
  uv_prepare_t prep;
  uv_prepare_init(&loop, &prep);
  prep.data = &k;
  uv_prepare_start(&prep, kill_check);
  while (!k.killed) uv_run(&loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&prep, NULL);
  for (int i = 0; i < N; i++) assert_int_equal(rec[i].done, 0);
  cu_rank_close(&loop, &g.r[2]);
  assert_int_equal(rec[2].status, TSR_ESHUTDOWN);
  cu_rec survivors[N - 1] = {{0}};
  int map[N - 1] = {0, 1, 3};
  /* the records of the survivors */
  assert_true(cu_run(&loop, rec, 2, 30000));
  assert_true(cu_run(&loop, &rec[3], 1, 30000));
  for (int j = 0; j < N - 1; j++) {
    cu_rec *r = &rec[map[j]];
    assert_int_equal(r->done, 1);
    assert_true(r->status != 0 && r->status != TSR_ETIMEOUT);
    if (!strstr(r->msg, "worker:2") || !strstr(r->msg, g.r[2].addr)) {
      print_error("rank %d: %s\n", map[j], r->msg);
      fail();
    }
    assert_non_null(strstr(r->msg, "all-reduce #0"));
    tsr_coll_stats st;
    tsr_coll_get_stats(g.r[map[j]].coll, &st);
    assert_true(st.broken);
  }
  /* a later post fails at once with the same cause */
  cu_rec late = {0};
  assert_int_equal(tsr_coll_barrier(g.r[0].coll, cu_rec_cb, &late), 0);
  assert_true(cu_run(&loop, &late, 1, 5000));
  assert_non_null(strstr(late.msg, "worker:2"));
  /* the survivors form a new group */
  const char *addrs[N - 1], *names[N - 1];
  for (int j = 0; j < N - 1; j++) {
    addrs[j] = g.r[map[j]].addr;
    names[j] = g.r[map[j]].name;
  }
  for (int j = 0; j < N - 1; j++) {
    tsr_coll_group gr = {2, j, N - 1, addrs, names, 0};
    assert_int_equal(tsr_coll_configure(g.r[map[j]].coll, &gr, cu_rec_cb,
                                        &survivors[j]), 0);
  }
  assert_true(cu_run(&loop, survivors, N - 1, 20000));
  memset(survivors, 0, sizeof survivors);
  for (int j = 0; j < N - 1; j++) {
    for (size_t e = 0; e < 1000; e++) x[map[j]][e] = (float)(j + 1);
    assert_int_equal(tsr_coll_allreduce(g.r[map[j]].coll, x[map[j]], 1000,
                                        cu_rec_cb, &survivors[j]), 0);
  }
  assert_true(cu_run(&loop, survivors, N - 1, 20000));
  for (int j = 0; j < N - 1; j++) {
    assert_int_equal(survivors[j].status, 0);
    assert_true(x[map[j]][999] == 6.0f);
  }
  for (int i = 0; i < N; i++) free(x[i]);
  assert_int_equal(cu_end(&g), 0);
}

/* A rank that never posts: the others fail after op_timeout_ms, naming
 * the neighbour they wait on. */
static void test_op_timeout(void **state) {
  (void)state;
  enum { N = 3 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  o.op_timeout_ms = 300;
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  cu_rec rec[N];
  float x[2][64] = {{0}};
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < 2; i++)
    assert_int_equal(tsr_coll_allreduce(g.r[i].coll, x[i], 64, cu_rec_cb,
                                        &rec[i]), 0);
  assert_true(cu_run(&loop, rec, 2, 20000));
  int timeouts = 0;
  for (int i = 0; i < 2; i++) {
    assert_true(rec[i].status != 0);
    assert_non_null(strstr(rec[i].msg, "worker:"));
    timeouts += rec[i].status == TSR_ETIMEOUT;
  }
  assert_true(timeouts >= 1);
  assert_int_equal(cu_end(&g), 0);
}

/* Another operation under the same number fails on the ranks that see
 * it, naming both, and the abort makes every rank fail. */
static void test_mismatch(void **state) {
  (void)state;
  enum { N = 3 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  cu_rec rec[N];
  float x[N][300];
  memset(x, 0, sizeof x);
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < N; i++)
    assert_int_equal(tsr_coll_allreduce(g.r[i].coll, x[i], i == 1 ? 100 : 300,
                                        cu_rec_cb, &rec[i]), 0);
  assert_true(cu_run(&loop, rec, N, 20000));
  int named = 0;
  for (int i = 0; i < N; i++) {
    assert_int_equal(rec[i].status, TSR_ESHAPE);
    named += strstr(rec[i].msg, "100 floats") != NULL &&
             strstr(rec[i].msg, "300 floats") != NULL;
  }
  assert_int_equal(named, N);
  assert_int_equal(cu_end(&g), 0);
}

/* A rank that gives up (its step failed after it posted part of it)
 * aborts: the others fail at once with its message. */
static void test_abort(void **state) {
  (void)state;
  enum { N = 3 };
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  assert_int_equal(cu_start(&loop, &g, N, &o, 1), 0);
  cu_rec rec[N];
  float x[2][64] = {{0}};
  memset(rec, 0, sizeof rec);
  for (int i = 0; i < 2; i++)
    assert_int_equal(tsr_coll_allreduce(g.r[i].coll, x[i], 64, cu_rec_cb,
                                        &rec[i]), 0);
  for (int t = 0; t < 20; t++) uv_run(&loop, UV_RUN_NOWAIT);
  tsr_coll_abort(g.r[2].coll, TSR_EDATA, "step 7: a NaN in the batch");
  assert_true(cu_run(&loop, rec, 2, 20000));
  for (int i = 0; i < 2; i++) {
    assert_int_equal(rec[i].status, TSR_EDATA);
    assert_non_null(strstr(rec[i].msg, "worker:2"));
    assert_non_null(strstr(rec[i].msg, "a NaN in the batch"));
  }
  assert_int_equal(cu_end(&g), 0);
}

/* Data for operations not posted here is held up to early_bytes_max. */
static void test_early_limit(void **state) {
  (void)state;
  uv_loop_t loop;
  cu_group g;
  tsr_coll_opts o = small_opts();
  o.early_bytes_max = 16384;
  assert_int_equal(cu_start(&loop, &g, 2, &o, 1), 0);
  cu_rec rec[2];
  enum { COUNT = 100000 };
  float *x = calloc(COUNT, sizeof(float));
  memset(rec, 0, sizeof rec);
  assert_int_equal(tsr_coll_allreduce(g.r[0].coll, x, COUNT, cu_rec_cb,
                                      &rec[0]), 0);
  assert_true(cu_run(&loop, rec, 1, 20000));
  assert_int_equal(rec[0].status, TSR_ENOMEM);
  tsr_coll_stats st;
  tsr_coll_get_stats(g.r[1].coll, &st);
  assert_true(st.broken);
  assert_non_null(strstr(st.cause, "limit 16384"));
  assert_int_equal(st.early_bytes, 0);
  free(x);
  assert_int_equal(cu_end(&g), 0);
}

/* A loopback TCP port bound and not listened on, as "127.0.0.1:P" in
 * addr: a connection to it is refused for as long as the socket is open.
 * The socket, or -1. */
static int bound_port(char *addr, size_t n) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
      getsockname(fd, (struct sockaddr *)&sa, &len)) {
    close(fd);
    return -1;
  }
  snprintf(addr, n, "127.0.0.1:%d", ntohs(sa.sin_port));
  return fd;
}

/* Configure: a neighbour nobody listens at, member lists that differ,
 * another segment size, an older group. */
static void test_configure_errors(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  cu_group g;
  tsr_coll_opts o = small_opts();
  o.configure_timeout_ms = 400;
  assert_int_equal(cu_open(&g, &loop, 3, &o), 0);
  /* an address where nothing listens: a port this test holds bound and
   * never listens on (a port closed again is free for any process of the
   * host to take, another test's rank among them) */
  char dead[64];
  int dead_fd = bound_port(dead, sizeof dead);
  assert_true(dead_fd >= 0);
  const char *addrs[2] = {g.r[0].addr, dead};
  const char *names[2] = {"worker:0", "worker:1"};
  tsr_coll_group gr = {1, 0, 2, addrs, names, 0};
  cu_rec r0 = {0};
  assert_int_equal(tsr_coll_configure(g.r[0].coll, &gr, cu_rec_cb, &r0), 0);
  assert_true(cu_run(&loop, &r0, 1, 20000));
  assert_true(r0.status != 0);
  if (!strstr(r0.msg, "worker:0") || !strstr(r0.msg, "cannot reach") ||
      !strstr(r0.msg, dead)) {
    print_error("%s\n", r0.msg);
    fail();
  }
  /* ops of a group that failed to form fail */
  cu_rec op = {0};
  assert_int_equal(tsr_coll_barrier(g.r[0].coll, cu_rec_cb, &op), 0);
  assert_true(cu_run(&loop, &op, 1, 5000));
  assert_true(op.status != 0);

  /* rank 1 sees rank 2 elsewhere */
  const char *a1[3] = {g.r[0].addr, g.r[1].addr, g.r[2].addr};
  const char *a2[3] = {g.r[0].addr, g.r[1].addr, dead};
  cu_rec rr[3];
  memset(rr, 0, sizeof rr);
  for (int i = 0; i < 3; i++) {
    tsr_coll_group gi = {5, i, 3, i == 1 ? a2 : a1, NULL, 0};
    assert_int_equal(tsr_coll_configure(g.r[i].coll, &gi, cu_rec_cb, &rr[i]),
                     0);
  }
  assert_true(cu_run(&loop, rr, 3, 20000));
  assert_int_equal(rr[0].status, TSR_ECONFIG);
  assert_non_null(strstr(rr[0].msg, "other addresses"));
  /* the epoch only grows */
  assert_int_equal(tsr_coll_configure(g.r[0].coll, &gr, cu_rec_cb, &r0),
                   TSR_EINVAL);
  /* a neighbour already in a newer group */
  memset(rr, 0, sizeof rr);
  tsr_coll_group g9 = {9, 1, 2, a1, NULL, 0};
  assert_int_equal(tsr_coll_configure(g.r[1].coll, &g9, cu_rec_cb, &rr[1]),
                   0);
  tsr_coll_group g8 = {8, 0, 2, a1, NULL, 0};
  assert_int_equal(tsr_coll_configure(g.r[0].coll, &g8, cu_rec_cb, &rr[0]),
                   0);
  assert_true(cu_run(&loop, rr, 1, 20000));
  assert_int_equal(rr[0].status, TSR_ESTALE);
  assert_non_null(strstr(rr[0].msg, "newer"));
  /* rank 1 waited for a rank 0 in group 9: it times out naming it */
  assert_true(cu_run(&loop, &rr[1], 1, 20000));
  assert_int_equal(rr[1].status, TSR_ETIMEOUT);
  assert_non_null(strstr(rr[1].msg, "did not join group 9"));
  /* a group whose configure failed here may be configured again (a chief
   * that retries it), and forms once both ranks are in it */
  memset(rr, 0, sizeof rr);
  tsr_coll_group g9r0 = {9, 0, 2, a1, NULL, 0};
  assert_int_equal(tsr_coll_configure(g.r[1].coll, &g9, cu_rec_cb, &rr[1]),
                   0);
  assert_int_equal(tsr_coll_configure(g.r[0].coll, &g9r0, cu_rec_cb, &rr[0]),
                   0);
  assert_true(cu_run(&loop, rr, 2, 20000));
  assert_int_equal(rr[0].status, 0);
  assert_int_equal(rr[1].status, 0);
  /* a group that formed is not configured again */
  assert_int_equal(tsr_coll_configure(g.r[1].coll, &g9, cu_rec_cb, &rr[1]),
                   TSR_EINVAL);
  assert_int_equal(cu_end(&g), 0);
  close(dead_fd);
}

static void test_opts(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  cu_rank k;
  tsr_coll_opts o;
  memset(&o, 0, sizeof o);
  o.segment_bytes = 100;
  memset(&k, 0, sizeof k);
  assert_int_equal(cu_rank_open(&k, &loop, 0, &o), TSR_EINVAL);
  int n = 0;
  tsr_rpc_server_close(k.srv, cu_count, &n);
  while (n < 1) uv_run(&loop, UV_RUN_ONCE);
  tsr_rpc_ctx_free(k.ctx);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_span_covers),
      cmocka_unit_test(test_allreduce_sizes),
      cmocka_unit_test(test_allreduce_many_inflight),
      cmocka_unit_test(test_post_while_landing),
      cmocka_unit_test(test_broadcast_barrier),
      cmocka_unit_test(test_tickets),
      cmocka_unit_test(test_fuse_layout),
      cmocka_unit_test(test_fuse_allreduce),
      cmocka_unit_test(test_ticket_close),
      cmocka_unit_test(test_rank_dies_midring),
      cmocka_unit_test(test_op_timeout),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_early_limit),
      cmocka_unit_test(test_configure_errors),
      cmocka_unit_test(test_opts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
