/* Collectives that fail, every rank in this process over the real RPC on
 * 127.0.0.1: a rank closed mid-ring, a rank that never posts, another
 * operation under the same number, a rank that gives up, data over the
 * early limit, neighbours that cannot be reached or disagree on the
 * group; a new group after a break. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/coll/coll_int.h"
#include "tests/unit/coll/coll_util.h"

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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
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
  tsr_coll_opts o = cu_small_opts();
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

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_dies_midring),
      cmocka_unit_test(test_op_timeout),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_early_limit),
      cmocka_unit_test(test_configure_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
