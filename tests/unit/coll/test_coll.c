/* Collectives (common/coll/coll.h) with every rank in this process, on one
 * loop, over the real RPC on 127.0.0.1: the geometry; all-reduce sums
 * (exact for integers in floats, bitwise the same on every rank and equal
 * to the documented ring order for any floats) for 1..4 ranks and sizes
 * from 0 to many segments; several operations in flight; data for an
 * operation a rank has not posted yet; broadcast and barrier; options
 * refused. Tickets from other threads: test_coll_threads.c; failures:
 * test_coll_fail.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <signal.h>
#include <unistd.h>

#include "common/coll/coll_int.h"
#include "tests/unit/coll/coll_util.h"

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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
  /* enough in flight that rank 0 runs far ahead of rank 1 */
  o.max_sends = 64;
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
  tsr_coll_opts o = cu_small_opts();
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
      cmocka_unit_test(test_opts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
