/* Collectives between processes: each rank is a child process with its
 * own loop, RPC context and server on 127.0.0.1 (the same-host socket, as
 * workers sharing a host), the parent only hands out the addresses and
 * reads the results. Checked: all-reduce sums exact for integers in
 * floats and bitwise the same on every rank (and equal to the ring order)
 * for any floats; then a rank that dies (_exit) in the middle of an
 * all-reduce: the others fail it naming that rank and its address, from
 * the lost connection (the operation timeout is minutes away). Every
 * rank runs a barrier first: its completion anywhere says every rank has
 * joined the group (configure completes per rank). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/coll/coll_util.h"

enum { N = 3 };

typedef struct {
  int status;
  int ok;           /* the sums matched the reference */
  uint64_t hash;    /* of the result's bytes */
  char msg[TSR_COLL_ERR_MAX];
} result;

static uint64_t hash_bytes(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void fill(float *x, size_t count, int r, bool ints) {
  uint64_t s = 0x2545f4914f6cdd1dull * (uint64_t)(r + 3);
  for (size_t i = 0; i < count; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = ints ? (float)((int)((s >> 35) % 4001) - 2000)
                : (float)((double)(s >> 11) / 9007199254740992.0 - 0.3) *
                      (float)(1 << (int)((s >> 5) % 16));
  }
}

/* ---- a child rank ------------------------------------------------------- */

typedef struct {
  tsr_coll *coll;
  uint64_t segs0;   /* segments received before the all-reduce */
} die_arg;

/* The victim leaves as soon as the ring has reached it. */
static void die_check(uv_prepare_t *h) {
  die_arg *d = h->data;
  tsr_coll_stats st;
  tsr_coll_get_stats(d->coll, &st);
  if (st.segs_recv > d->segs0) _exit(0);
}

static int child(int rank, int up, int down, int scenario) {
  alarm(60);
  signal(SIGPIPE, SIG_IGN);
  uv_loop_t loop;
  uv_loop_init(&loop);
  cu_rank k;
  tsr_coll_opts o;
  memset(&o, 0, sizeof o);
  o.segment_bytes = scenario ? 4096 : 65536;
  o.op_timeout_ms = 600000;
  if (cu_rank_open(&k, &loop, rank, &o)) return 2;
  if (cu_write_all(up, k.addr, sizeof k.addr)) return 3;
  char addrs[N][64];
  if (cu_read_all(down, addrs, sizeof addrs)) return 4;
  const char *ap[N], *np[N];
  char names[N][32];
  for (int i = 0; i < N; i++) {
    ap[i] = addrs[i];
    snprintf(names[i], sizeof names[i], "worker:%d", i);
    np[i] = names[i];
  }
  cu_rec rec = {0};
  tsr_coll_group g = {1, rank, N, ap, np, 0};
  if (tsr_coll_configure(k.coll, &g, cu_rec_cb, &rec) ||
      !cu_run(&loop, &rec, 1, 30000) || rec.status)
    return 5;
  /* every rank has joined once a barrier completes anywhere */
  memset(&rec, 0, sizeof rec);
  if (tsr_coll_barrier(k.coll, cu_rec_cb, &rec) ||
      !cu_run(&loop, &rec, 1, 30000) || rec.status)
    return 9;
  size_t count = scenario ? (size_t)4 << 20 : 1000003;
  float *x = malloc(count * sizeof(float));
  float *all[N];
  result res[2];
  memset(res, 0, sizeof res);
  int rounds = scenario ? 1 : 2;
  for (int round = 0; round < rounds; round++) {
    bool ints = round == 0;
    for (int i = 0; i < N; i++) {
      all[i] = malloc(count * sizeof(float));
      fill(all[i], count, i, ints);
    }
    memcpy(x, all[rank], count * sizeof(float));
    float *ref = malloc(count * sizeof(float));
    cu_ref_sum(all, N, count, ref);
    uv_prepare_t prep;
    die_arg d = {k.coll, 0};
    if (scenario && rank == 1) {
      tsr_coll_stats st;
      tsr_coll_get_stats(k.coll, &st);
      d.segs0 = st.segs_recv;
      uv_prepare_init(&loop, &prep);
      prep.data = &d;
      uv_prepare_start(&prep, die_check);
    }
    memset(&rec, 0, sizeof rec);
    if (tsr_coll_allreduce(k.coll, x, count, cu_rec_cb, &rec) ||
        !cu_run(&loop, &rec, 1, 50000))
      return 6;
    res[round].status = rec.status;
    snprintf(res[round].msg, sizeof res[round].msg, "%s", rec.msg);
    res[round].ok = memcmp(x, ref, count * sizeof(float)) == 0;
    if (ints)
      for (size_t e = 0; e < count && res[round].ok; e++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += all[i][e];
        res[round].ok = (double)x[e] == s;
      }
    res[round].hash = hash_bytes(x, count * sizeof(float));
    for (int i = 0; i < N; i++) free(all[i]);
    free(ref);
  }
  if (cu_write_all(up, res, sizeof res)) return 7;
  free(x);
  cu_rank_close(&loop, &k);
  uv_run(&loop, UV_RUN_NOWAIT);
  return uv_loop_close(&loop) ? 8 : 0;
}

/* ---- the parent --------------------------------------------------------- */

typedef struct {
  pid_t pid;
  int up, down;        /* child -> parent, parent -> child */
  char addr[64];
} kid;

static void spawn(kid *k, int scenario) {
  for (int i = 0; i < N; i++) {
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
      close(a[0]);
      close(b[1]);
      _exit(child(i, a[1], b[0], scenario));
    }
    close(a[1]);
    close(b[0]);
    k[i].pid = p;
    k[i].up = a[0];
    k[i].down = b[1];
  }
  for (int i = 0; i < N; i++)
    assert_int_equal(cu_read_all(k[i].up, k[i].addr, sizeof k[i].addr), 0);
  char addrs[N][64];
  for (int i = 0; i < N; i++) memcpy(addrs[i], k[i].addr, 64);
  for (int i = 0; i < N; i++)
    assert_int_equal(cu_write_all(k[i].down, addrs, sizeof addrs), 0);
}

static int reap(kid *k) {
  int st = 0;
  waitpid(k->pid, &st, 0);
  close(k->up);
  close(k->down);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static void test_proc_allreduce(void **state) {
  (void)state;
  kid k[N];
  spawn(k, 0);
  result res[N][2];
  for (int i = 0; i < N; i++)
    assert_int_equal(cu_read_all(k[i].up, res[i], sizeof res[i]), 0);
  for (int i = 0; i < N; i++) assert_int_equal(reap(&k[i]), 0);
  for (int i = 0; i < N; i++)
    for (int round = 0; round < 2; round++) {
      assert_int_equal(res[i][round].status, 0);
      assert_true(res[i][round].ok);
      assert_true(res[i][round].hash == res[0][round].hash);
    }
}

static void test_proc_rank_dies(void **state) {
  (void)state;
  kid k[N];
  spawn(k, 1);
  result res[N][2];
  int got[N] = {0};
  for (int i = 0; i < N; i++)
    got[i] = cu_read_all(k[i].up, res[i], sizeof res[i]) == 0;
  int codes[N];
  for (int i = 0; i < N; i++) codes[i] = reap(&k[i]);
  /* the victim left without a word */
  assert_false(got[1]);
  assert_int_equal(codes[1], 0);
  for (int i = 0; i < N; i += 2) {
    assert_true(got[i]);
    assert_int_equal(codes[i], 0);
    const result *r = &res[i][0];
    assert_true(r->status != 0 && r->status != TSR_ETIMEOUT);
    if (!strstr(r->msg, "worker:1") || !strstr(r->msg, k[1].addr) ||
        !strstr(r->msg, "all-reduce #1")) {
      print_error("rank %d: %s\n", i, r->msg);
      fail();
    }
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_proc_allreduce),
      cmocka_unit_test(test_proc_rank_dies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
