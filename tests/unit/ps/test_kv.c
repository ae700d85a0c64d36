/* The ticket-based PS client (ps_kv) against real PS services in this
 * process: a request over several variables is split over their shards on
 * two PS and one ticket waits for all of it; pushes and pulls submitted
 * back to back reach each shard in submission order (a pull sees every
 * push submitted before it); several threads submit at once; bfloat16 on
 * the wire halves the bytes and rounds to nearest even while the PS keeps
 * float32; bad requests are refused before anything is sent; failures
 * name the PS, the variable and the shard; a request that checks losses
 * fails at issue after a lost connection; in hold mode a lost PS gives up
 * the calls held on the others; in wait_lost mode (async) calls to a PS
 * that went away wait until it is back and restored; cancel fails what is
 * in flight; the open ticket limit is enforced.
 *
 * Set-up (servers, variables, the client) runs on this thread before the
 * loop thread starts; from then on only the loop thread touches the loop,
 * and the test thread submits and waits as the worker's training thread
 * does. Loop-thread work (closing a server, cancelling) is handed over
 * with a uv_async_t.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_harness.h"
#include "ports.h"

#define NPS 2

/* variables: "w" dense 6x4 over both PS (rows 0-2 on ps:0, 3-5 on ps:1),
 * "b" dense 4 on ps:1, "e" sparse 100x2 (rows 0-49 on ps:1, 50-99 ps:0) */
#define SH(p, k, r0, n) {.ps = (p), .shard = (k), .row0 = (r0), .rows = (n)}
#define VAR(nm, d0, d1, kd)                                                 \
  {.name = (nm), .rank = 2, .shape = {(d0), (d1), 1, 1, 1, 1, 1, 1},       \
   .numel = (d0) * (d1), .row_dim = (d1), .kind = (kd), .trainable = true}
static const tsr_shard sh_w[] = {SH(0, 0, 0, 3), SH(1, 1, 3, 3)};
static const tsr_shard sh_b[] = {SH(1, 0, 0, 4)};
static const tsr_shard sh_e[] = {SH(1, 0, 0, 50), SH(0, 1, 50, 50)};
static const tsr_var var_w = VAR("w", 6, 4, TSR_VAR_DENSE),
                     var_b = VAR("b", 4, 1, TSR_VAR_DENSE),
                     var_e = VAR("e", 100, 2, TSR_VAR_ROW_SPARSE);
static const ps_kv_var kvars[] = {
    {&var_w, 2, sh_w},
    {&var_b, 1, sh_b},
    {&var_e, 2, sh_e},
};

typedef struct {
  h_env e;
  ps_kv *kv;
  pthread_t loop_thread;
  uv_async_t job;           /* loop work handed over by the test */
  uv_async_t wake;          /* wakes the loop to see `stop` */
  void (*fn)(void *);       /* the work */
  void *arg;
  int job_done;
  int stop;
  int kv_closed, srv_closed;/* the test's own closes */
} fx;

static void run_job(uv_async_t *h) {
  fx *f = h->data;
  void (*fn)(void *) = __atomic_load_n(&f->fn, __ATOMIC_ACQUIRE);
  if (fn) {
    fn(f->arg);
    f->fn = NULL;
    __atomic_store_n(&f->job_done, 1, __ATOMIC_RELEASE);
  }
}

static void nothing(uv_async_t *h) { (void)h; }

static void *loop_main(void *arg) {
  fx *f = arg;
  while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE))
    uv_run(&f->e.loop, UV_RUN_ONCE);
  return NULL;
}

/* Runs fn(arg) on the loop thread and waits for it. */
static void on_loop(fx *f, void (*fn)(void *), void *arg) {
  f->job_done = 0;
  f->arg = arg;
  __atomic_store_n(&f->fn, fn, __ATOMIC_RELEASE);
  uv_async_send(&f->job);
  uint64_t end = tsr_now_ms() + 20000;
  while (!__atomic_load_n(&f->job_done, __ATOMIC_ACQUIRE) &&
         tsr_now_ms() < end)
    tsr_sleep_ms(1);
  assert_true(f->job_done);
}

static ps_var_spec spec_of(const char *name, int rank, const int64_t *shape,
                           int shard, int nshards, bool sparse) {
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  o.learning_rate = 1.0; /* value = -(sum of gradients) */
  ps_var_spec s;
  assert_int_equal(ps_var_spec_init(&s, name, rank, shape, shard, nshards,
                                    "zeros", 1, &o), 0);
  s.var.kind = sparse ? TSR_VAR_ROW_SPARSE : TSR_VAR_DENSE;
  s.bounded = true;
  return s;
}

static void create(fx *f, int ps, const char *name, int rank,
                   const int64_t *shape, int shard, int nshards,
                   bool sparse) {
  ps_var_spec s = spec_of(name, rank, shape, shard, nshards, sparse);
  h_res r;
  H_CALL(&f->e, r, ps_client_create(ps_kv_client(f->kv, ps), &s, 1, h_cb,
                                    &r));
  assert_int_equal(r.status, 0);
}

/* Two PS (their options; on `ports`, NULL: any), the variables, a client
 * with the layout (wait_lost as given), then the loop thread. */
static void fx_up_on(fx *f, const ps_server_opts *so, bool hold,
                     ps_dtype wire, bool wait_lost, const int *ports) {
  memset(f, 0, sizeof *f);
  h_up_on(&f->e, NPS, so, ports);
  char a0[64], a1[64];
  snprintf(a0, sizeof a0, "127.0.0.1:%d", ps_server_port(f->e.srv[0]));
  snprintf(a1, sizeof a1, "127.0.0.1:%d", ps_server_port(f->e.srv[1]));
  char *addrs[NPS] = {a0, a1};
  assert_int_equal(ps_kv_new(&f->kv, f->e.ctx, addrs, NPS), 0);
  int64_t w[2] = {6, 4}, b[1] = {4}, e[2] = {100, 2};
  create(f, 0, "w", 2, w, 0, 2, false);
  create(f, 1, "w", 2, w, 1, 2, false);
  create(f, 1, "b", 1, b, 0, 1, false);
  create(f, 1, "e", 2, e, 0, 2, true);
  create(f, 0, "e", 2, e, 1, 2, true);
  ps_kv_config c = {.worker = 0, .hold = hold, .wait_lost = wait_lost,
                    .wire = wire, .deadline_ms = 10000, .vars = kvars,
                    .n_vars = 3};
  char err[256];
  assert_int_equal(ps_kv_configure(f->kv, &c, err, sizeof err), 0);
  assert_int_equal(uv_async_init(&f->e.loop, &f->job, run_job), 0);
  assert_int_equal(uv_async_init(&f->e.loop, &f->wake, nothing), 0);
  f->job.data = f;
  assert_int_equal(pthread_create(&f->loop_thread, NULL, loop_main, f), 0);
}

/* Two PS in `mode` (NULL: async). */
static void fx_up(fx *f, const char *mode, bool hold, ps_dtype wire) {
  ps_server_opts so = {.mode = mode};
  fx_up_on(f, &so, hold, wire, false, NULL);
}

static void close_kv(void *arg) {
  fx *f = arg;
  ps_kv_close(f->kv, h_closed, &f->kv_closed);
}

/* Closes the client on the loop thread, stops that thread, then closes
 * the rest here; the loop must close clean. */
static void fx_down(fx *f) {
  on_loop(f, close_kv, f);
  __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
  uv_async_send(&f->wake);
  assert_int_equal(pthread_join(f->loop_thread, NULL), 0);
  uv_close((uv_handle_t *)&f->job, NULL);
  uv_close((uv_handle_t *)&f->wake, NULL);
  uint64_t end = tsr_now_ms() + 20000;
  while (!f->kv_closed && tsr_now_ms() < end)
    uv_run(&f->e.loop, UV_RUN_NOWAIT);
  assert_int_equal(f->kv_closed, 1);
  assert_int_equal(h_down(&f->e), 0);
}

static int64_t wait_ok(fx *f, ps_ticket t) {
  ps_kv_result r;
  int rc = ps_kv_wait(f->kv, t, &r);
  if (rc) fail_msg("ticket failed: %s (%s)", tsr_err_name(rc), r.err);
  return r.max_step;
}

/* ---- bfloat16 ---------------------------------------------------------------*/

static void bf16_rounding(void **state) {
  (void)state;
  float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: tie, even stays 1 */,
                1.01171875f /* 1 + 3*2^-8: tie, rounds up to 1 + 2^-6 */,
                -2.5f, 3.4e38f /* over the largest bf16: inf */,
                INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f};
  size_t n = sizeof in / sizeof *in;
  uint16_t h[16];
  float back[16];
  ps_bf16_from_f32(h, in, n);
  ps_bf16_to_f32(back, h, n);
  assert_true(back[0] == 1.0f);
  assert_true(back[1] == 1.0f);
  assert_true(back[2] == 1.015625f);
  assert_true(back[3] == -2.5f);
  assert_true(isinf(back[4]) && back[4] > 0);
  assert_true(isinf(back[5]) && back[5] > 0);
  assert_true(isinf(back[6]) && back[6] < 0);
  assert_true(isnan(back[7]));
  assert_true(back[8] == 0.0f && !signbit(back[8]));
  assert_true(back[9] == 0.0f && signbit(back[9]));
  assert_true(fabsf(back[10] - 1e-40f) < 1e-41f); /* subnormal */
  /* relative error at most 2^-8 (half a unit in the last of 8 bits) */
  for (int i = 1; i < 2000; i++) {
    float x = (float)i * 0.37f - 300.0f, y;
    uint16_t b;
    ps_bf16_from_f32(&b, &x, 1);
    ps_bf16_to_f32(&y, &b, 1);
    assert_true(fabsf(y - x) <= fabsf(x) / 256.0f);
  }
  /* in place over its own source, as the PS packs rows */
  float buf[5] = {1.5f, -3.0f, 0.25f, 7.0f, 1.00390625f};
  ps_bf16_from_f32((uint16_t *)buf, buf, 5);
  uint16_t want[5];
  float src[5] = {1.5f, -3.0f, 0.25f, 7.0f, 1.00390625f};
  ps_bf16_from_f32(want, src, 5);
  assert_memory_equal(buf, want, sizeof want);
}

/* ---- over the service ---------------------------------------------------------*/

static void split_and_gather(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  float gw[24], gb[4], ge[3 * 2];
  for (int i = 0; i < 24; i++) gw[i] = (float)i;
  for (int i = 0; i < 4; i++) gb[i] = 0.5f * (float)i;
  for (int i = 0; i < 6; i++) ge[i] = (float)(i + 1);
  int64_t ids[3] = {3, 49, 77}; /* two rows on ps:1, one on ps:0 */
  ps_kv_item push[3] = {
      {.var = 0, .grad = gw},
      {.var = 1, .grad = gb},
      {.var = 2, .grad = ge, .ids = ids, .n_ids = 3},
  };
  ps_ticket t;
  assert_int_equal(ps_kv_push(f.kv, push, 3, 0, &t), 0);
  assert_true(t != 0);
  ps_kv_result r;
  assert_int_equal(ps_kv_wait(f.kv, t, &r), 0);
  /* w: 2 shards, b: 1, e: 2 (every shard, rows or not) -> 5 shard steps */
  assert_int_equal(r.max_step, 1);
  assert_int_equal(r.bytes_out, (24 + 4 + 6) * 4 + 3 * 8);
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_EINVAL); /* spent */

  float w[24], b[4], e[4 * 2];
  int64_t pids[4] = {0, 3, 77, 99};
  ps_kv_item pull[3] = {
      {.var = 0, .dst = w},
      {.var = 1, .dst = b},
      {.var = 2, .dst = e, .pull_ids = pids, .n_pull = 4},
  };
  assert_int_equal(ps_kv_pull(f.kv, pull, 3, 0, &t), 0);
  wait_ok(&f, t);
  for (int i = 0; i < 24; i++) assert_true(w[i] == -gw[i]);
  for (int i = 0; i < 4; i++) assert_true(b[i] == -gb[i]);
  /* row 0 and 99 untouched (zeros), 3 and 77 got -grad */
  float we[8] = {0, 0, -1, -2, -5, -6, 0, 0};
  for (int i = 0; i < 8; i++) assert_true(e[i] == we[i]);

  /* fused: the answer carries the values after this push */
  ps_kv_item pp[1] = {{.var = 1, .grad = gb, .dst = b}};
  assert_int_equal(ps_kv_push_pull(f.kv, pp, 1, 1, &t), 0);
  wait_ok(&f, t);
  for (int i = 0; i < 4; i++) assert_true(b[i] == -2 * gb[i]);
  fx_down(&f);
}

/* Pushes and pulls of one variable submitted back to back, never waited
 * in between: pull k sees exactly the k pushes submitted before it. */
static void submission_order(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  enum { K = 40 };
  float one[4] = {1, 1, 1, 1};
  float got[K][4];
  ps_ticket tp[K], tq[K];
  for (int k = 0; k < K; k++) {
    ps_kv_item p = {.var = 1, .grad = one};
    ps_kv_item q = {.var = 1, .dst = got[k]};
    assert_int_equal(ps_kv_push(f.kv, &p, 1, k, &tp[k]), 0);
    assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &tq[k]), 0);
  }
  for (int k = K - 1; k >= 0; k--) { /* waited in any order */
    wait_ok(&f, tq[k]);
    wait_ok(&f, tp[k]);
  }
  for (int k = 0; k < K; k++)
    for (int i = 0; i < 4; i++) assert_true(got[k][i] == -(float)(k + 1));
  fx_down(&f);
}

typedef struct {
  fx *f;
  int n;
  int rc;
} pusher;

static void *push_many(void *arg) {
  pusher *p = arg;
  float g[24];
  for (int i = 0; i < 24; i++) g[i] = 1.0f;
  for (int k = 0; k < p->n; k++) {
    ps_kv_item it = {.var = 0, .grad = g};
    ps_ticket t;
    int rc = ps_kv_push(p->f->kv, &it, 1, k, &t);
    if (!rc) rc = ps_kv_wait(p->f->kv, t, NULL);
    if (rc && !p->rc) p->rc = rc;
  }
  return NULL;
}

static void any_thread(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  enum { T = 4, N = 50 };
  pthread_t th[T];
  pusher p[T];
  for (int i = 0; i < T; i++) {
    p[i] = (pusher){&f, N, 0};
    assert_int_equal(pthread_create(&th[i], NULL, push_many, &p[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(p[i].rc, 0);
  }
  float w[24];
  ps_kv_item q = {.var = 0, .dst = w};
  ps_ticket t;
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  wait_ok(&f, t);
  for (int i = 0; i < 24; i++) assert_true(w[i] == -(float)(T * N));
  fx_down(&f);
}

static void bf16_wire(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_BF16);
  float g[24], w[24];
  for (int i = 0; i < 24; i++) g[i] = 1.0f + (float)i / 300.0f;
  ps_kv_item it = {.var = 0, .grad = g};
  ps_ticket t;
  assert_int_equal(ps_kv_push(f.kv, &it, 1, 0, &t), 0);
  g[0] = 1e9f; /* converted at submit: the buffer is free again */
  ps_kv_result r;
  assert_int_equal(ps_kv_wait(f.kv, t, &r), 0);
  assert_int_equal(r.bytes_out, 24 * 2); /* half of float32 */
  ps_kv_item q = {.var = 0, .dst = w};
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  assert_int_equal(ps_kv_wait(f.kv, t, &r), 0);
  assert_int_equal(r.bytes_in, 24 * 2);
  for (int i = 0; i < 24; i++) {
    float x = 1.0f + (float)i / 300.0f, want;
    uint16_t h;
    ps_bf16_from_f32(&h, &x, 1); /* the gradient as it travelled */
    ps_bf16_to_f32(&want, &h, 1);
    want = -want;                /* applied in float32, pulled as bf16 */
    ps_bf16_from_f32(&h, &want, 1);
    ps_bf16_to_f32(&want, &h, 1);
    assert_true(w[i] == want);
    assert_true(fabsf(w[i] + x) <= x / 128.0f);
  }
  /* sparse rows both ways */
  float ge[2] = {0.3f, -0.7f}, e[2];
  int64_t id = 60;
  ps_kv_item pe = {.var = 2, .grad = ge, .ids = &id, .n_ids = 1, .dst = e,
                   .pull_ids = &id, .n_pull = 1};
  assert_int_equal(ps_kv_push_pull(f.kv, &pe, 1, 1, &t), 0);
  wait_ok(&f, t);
  assert_true(fabsf(e[0] + 0.3f) < 0.3f / 128 && fabsf(e[1] - 0.7f) < 0.7f / 128);
  /* a push of no rows at all (a batch that touched none): nothing to
   * convert, every shard still told */
  ps_kv_item none = {.var = 2, .grad = ge, .ids = &id, .n_ids = 0};
  assert_int_equal(ps_kv_push(f.kv, &none, 1, 2, &t), 0);
  assert_int_equal(ps_kv_wait(f.kv, t, &r), 0);
  assert_int_equal(r.bytes_out, 0);
  assert_int_equal(r.max_step, 2);
  fx_down(&f);
}

static void bad_requests(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  float g[24] = {0};
  ps_ticket t = 1;
  ps_kv_item bad_var = {.var = 3, .grad = g};
  assert_int_equal(ps_kv_push(f.kv, &bad_var, 1, 0, &t), TSR_EINVAL);
  assert_int_equal(t, 0);
  ps_kv_item no_buf = {.var = 0};
  assert_int_equal(ps_kv_push(f.kv, &no_buf, 1, 0, &t), TSR_EINVAL);
  assert_int_equal(ps_kv_pull(f.kv, &no_buf, 1, 0, &t), TSR_EINVAL);
  int64_t unsorted[2] = {5, 4}, dup[2] = {5, 5}, out[1] = {100};
  ps_kv_item s1 = {.var = 2, .grad = g, .ids = unsorted, .n_ids = 2};
  ps_kv_item s2 = {.var = 2, .grad = g, .ids = dup, .n_ids = 2};
  ps_kv_item s3 = {.var = 2, .dst = g, .pull_ids = out, .n_pull = 1};
  assert_int_equal(ps_kv_push(f.kv, &s1, 1, 0, &t), TSR_EINVAL);
  assert_int_equal(ps_kv_push(f.kv, &s2, 1, 0, &t), TSR_EINVAL);
  assert_int_equal(ps_kv_pull(f.kv, &s3, 1, 0, &t), TSR_EINVAL);
  assert_int_equal(ps_kv_wait(f.kv, 12345, NULL), TSR_EINVAL);
  assert_int_equal(ps_kv_wait(f.kv, 0, NULL), TSR_EINVAL);
  /* a layout that does not cover its rows */
  tsr_shard gap[] = {SH(0, 0, 0, 2), SH(1, 1, 3, 3)};
  ps_kv_var v = {&var_w, 2, gap};
  ps_kv_config c = {.vars = &v, .n_vars = 1};
  char err[256];
  assert_int_equal(ps_kv_configure(f.kv, &c, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "w shard 1"));
  /* no ticket open: a configure is refused while one is */
  ps_kv_item ok = {.var = 1, .grad = g};
  assert_int_equal(ps_kv_push(f.kv, &ok, 1, 0, &t), 0);
  ps_kv_config same = {.vars = kvars, .n_vars = 3};
  assert_int_equal(ps_kv_configure(f.kv, &same, err, sizeof err), TSR_EBUSY);
  wait_ok(&f, t);
  /* the open ticket limit */
  static ps_ticket many[PS_KV_MAX_TICKETS];
  for (int i = 0; i < PS_KV_MAX_TICKETS; i++) /* empty: done at once */
    assert_int_equal(ps_kv_push(f.kv, NULL, 0, i, &many[i]), 0);
  assert_int_equal(ps_kv_push(f.kv, NULL, 0, 0, &t), TSR_EBUSY);
  for (int i = 0; i < PS_KV_MAX_TICKETS; i++) wait_ok(&f, many[i]);
  assert_int_equal(ps_kv_push(f.kv, NULL, 0, 0, &t), 0);
  wait_ok(&f, t);
  fx_down(&f);
}

/* A PS's own refusal comes back naming the PS, its address, the call,
 * the variable and the shard. */
static void failures_named(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  /* a layout naming a variable no PS holds */
  tsr_shard s[] = {SH(1, 0, 0, 2)};
  tsr_var nope = VAR("nope", 2, 1, TSR_VAR_DENSE);
  ps_kv_var v = {&nope, 1, s};
  ps_kv_config c = {.vars = &v, .n_vars = 1, .deadline_ms = 5000};
  char err[256];
  assert_int_equal(ps_kv_configure(f.kv, &c, err, sizeof err), 0);
  float d[2];
  ps_kv_item q = {.var = 0, .dst = d};
  ps_ticket t;
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  ps_kv_result r;
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_ENOTFOUND);
  char want[128];
  snprintf(want, sizeof want, "ps:1 (127.0.0.1:%d): pull nope shard 0: ",
           ps_server_port(f.e.srv[1]));
  assert_non_null(strstr(r.err, want));
  fx_down(&f);
}

typedef struct {
  fx *f;
  int i;
} srv_ref;

static void close_server(void *arg) {
  srv_ref *s = arg;
  ps_server_close(s->f->e.srv[s->i], h_closed, &s->f->srv_closed);
  s->f->e.srv[s->i] = NULL;
}

static void wait_losses(fx *f, uint64_t want) {
  uint64_t end = tsr_now_ms() + 20000;
  while (ps_kv_losses(f->kv, NULL, 0) < want && tsr_now_ms() < end)
    tsr_sleep_ms(5);
  assert_true(ps_kv_losses(f->kv, NULL, 0) >= want);
}

/* After a lost connection a request that names the count before it fails
 * at issue, even for a PS that is still up. */
static void losses_checked(void **state) {
  (void)state;
  fx f;
  fx_up(&f, NULL, false, PS_DT_F32);
  float b[4];
  ps_kv_item q = {.var = 1, .dst = b}; /* on ps:1 */
  ps_ticket t;
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  wait_ok(&f, t);
  uint64_t before = ps_kv_losses(f.kv, NULL, 0);
  srv_ref s = {&f, 0};
  on_loop(&f, close_server, &s);
  wait_losses(&f, before + 1);
  ps_kv_request rq = {.kind = PS_KV_PULL, .items = &q, .n_items = 1,
                      .flags = PS_KV_CHECK_LOSSES, .losses = before};
  assert_int_equal(ps_kv_submit(f.kv, &rq, &t), 0);
  ps_kv_result r;
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_ECLOSED);
  assert_non_null(strstr(r.err, "ps:0"));
  assert_non_null(strstr(r.err, "lost its connection"));
  /* with the current count it goes */
  rq.losses = ps_kv_losses(f.kv, NULL, 0);
  assert_int_equal(ps_kv_submit(f.kv, &rq, &t), 0);
  wait_ok(&f, t);
  fx_down(&f);
}

/* Worker 0 joins every PS (sync), then pulls `q` for clock 5, a step
 * nobody pushed: the pull is held. Its ticket. */
static ps_ticket held_pull(fx *f, const ps_kv_item *q) {
  ps_ticket j, t;
  assert_int_equal(ps_kv_clock(f->kv, PS_CLOCK_JOIN, 0, 0, 0, &j), 0);
  wait_ok(f, j);
  assert_int_equal(ps_kv_pull(f->kv, q, 1, 5, &t), 0);
  return t;
}

/* Sync mode holds a pull for a step nobody pushed; when the other PS
 * goes away, hold mode gives the held call up at once, naming it. */
static void hold_reset(void **state) {
  (void)state;
  fx f;
  fx_up(&f, "sync", true, PS_DT_F32);
  float b[4];
  ps_kv_item q = {.var = 1, .dst = b}; /* ps:1 */
  ps_ticket t = held_pull(&f, &q);
  tsr_sleep_ms(100);
  assert_false(ps_kv_done(f.kv, t));
  srv_ref s = {&f, 0};
  on_loop(&f, close_server, &s);
  ps_kv_result r;
  uint64_t t0 = tsr_now_ms();
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_ECLOSED);
  assert_true(tsr_now_ms() - t0 < 9000); /* not the 10 s deadline */
  assert_non_null(strstr(r.err, "ps:0"));
  assert_non_null(strstr(r.err, "given up"));
  fx_down(&f);
}

/* ssp/sync: a JOIN's era goes with every later call to that PS, so a
 * pull held there is refused at once when the PS starts a new era (a new
 * configuration, a restore) instead of waiting for a step of the new era
 * or its deadline; the next call of the old era is refused too, and a
 * JOIN makes the worker a member of the new one. */
static void on_cfg(const ps_result *r, void *data) { (void)r; (void)data; }
static void reconfig_ps1(void *arg) {
  fx *f = arg;
  assert_int_equal(ps_client_config(ps_kv_client(f->kv, 1), "sync", false,
                                    on_cfg, NULL), 0);
}

static void era_refused(void **state) {
  (void)state;
  fx f;
  fx_up(&f, "sync", true, PS_DT_F32);
  ps_ticket j;
  assert_int_equal(ps_kv_join(f.kv, 0, 0, 0, 0, 0, &j), 0);
  wait_ok(&f, j);
  float b[4];
  ps_kv_item q = {.var = 1, .dst = b}; /* ps:1 */
  ps_ticket t;
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 5, &t), 0); /* held */
  tsr_sleep_ms(100);
  assert_false(ps_kv_done(f.kv, t));
  on_loop(&f, reconfig_ps1, &f);
  ps_kv_result r;
  uint64_t t0 = tsr_now_ms();
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_ESTALE);
  assert_true(tsr_now_ms() - t0 < 9000); /* not the 10 s deadline */
  assert_non_null(strstr(r.err, "ps:1"));
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  assert_int_equal(ps_kv_wait(f.kv, t, &r), TSR_ESTALE);
  assert_int_equal(ps_kv_join(f.kv, 0, 0, 0, 0, 0, &j), 0);
  wait_ok(&f, j);
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), 0);
  wait_ok(&f, t);
  fx_down(&f);
}

/* ---- a PS that goes away and comes back (async, wait_lost) ---------------- */

typedef struct {
  fx *f;
  int port;
  const char *root;
  int done, want;    /* answers so far (atomic), and expected */
  int status;
  char msg[256];
} ps1_ref;

static void ps1_cb(const ps_result *r, void *data) {
  ps1_ref *x = data;
  if (r->status && !x->status) {
    x->status = r->status;
    snprintf(x->msg, sizeof x->msg, "%s", r->message);
  }
  __atomic_add_fetch(&x->done, 1, __ATOMIC_RELEASE);
}

static void ps1_wait(ps1_ref *x) {
  uint64_t end = tsr_now_ms() + 20000;
  while (__atomic_load_n(&x->done, __ATOMIC_ACQUIRE) < x->want &&
         tsr_now_ms() < end)
    tsr_sleep_ms(2);
  assert_int_equal(__atomic_load_n(&x->done, __ATOMIC_ACQUIRE), x->want);
  if (x->status) fail_msg("ps:1: %s", x->msg);
}

static void ps1_save(void *arg) {
  ps1_ref *x = arg;
  assert_int_equal(ps_client_save_ckpt(ps_kv_client(x->f->kv, 1), "c1", "t-1",
                                       1, false, ps1_cb, x), 0);
}

/* ps:1 started again on its address: empty, as a restarted process. */
static void ps1_start(void *arg) {
  ps1_ref *x = arg;
  ps_server_opts so = {.checkpoint_root = x->root};
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", x->port);
  assert_int_equal(ps_server_new(&x->f->e.srv[1], x->f->e.ctx, &so), 0);
  assert_int_equal(ps_server_listen(x->f->e.srv[1], addr), 0);
}

/* What the chief sends a PS restored alone: a config holding every call
 * until the restore, then its variables. */
static ps_var_spec ps1_specs[2];
static void ps1_setup(void *arg) {
  ps1_ref *x = arg;
  ps_client *c = ps_kv_client(x->f->kv, 1);
  ps_config cfg = {.mode = "async", .trace_pid = -1,
                   .hold_until_restore = true};
  int64_t w[2] = {6, 4}, b[1] = {4};
  ps1_specs[0] = spec_of("w", 2, w, 1, 2, false);
  ps1_specs[1] = spec_of("b", 1, b, 0, 1, false);
  assert_int_equal(ps_client_configure(c, &cfg, ps1_cb, x), 0);
  assert_int_equal(ps_client_create(c, ps1_specs, 2, ps1_cb, x), 0);
}

static void ps1_restore(void *arg) {
  ps1_ref *x = arg;
  assert_int_equal(ps_client_restore_ckpt(ps_kv_client(x->f->kv, 1), "c1",
                                          "t-1", 1, ps1_cb, x), 0);
}

/* async: ps:1 saves, learns more, goes away. Pulls from it (and from a
 * variable over both PS) wait: while it is gone, while it is back without
 * its variables, and while it holds them for its restore (a pull then
 * would read the initial zeros); after the restore they answer the saved
 * values. The closure would have gone on: nothing failed. */
static void lost_ps_waited_for(void **state) {
  (void)state;
  char root[256], c1[300];
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(root, sizeof root, "%s/tsr-kv-lost-XXXXXX", base);
  assert_non_null(mkdtemp(root));
  snprintf(c1, sizeof c1, "%s/c1", root);
  assert_int_equal(mkdir(c1, 0700), 0);
  ps_server_opts so = {.checkpoint_root = root};
  /* ps:1 comes back on its port: a port the kernel picked could be taken
   * meanwhile by any connection on the host, a claimed one cannot */
  int ports[NPS] = {0, test_port()};
  fx f;
  fx_up_on(&f, &so, false, PS_DT_F32, true, ports);
  ps1_ref x = {.f = &f, .port = ports[1], .root = root};
  float g[4] = {1, 2, 3, 4}, one[4] = {1, 1, 1, 1}, b[4], w[24];
  ps_kv_item pb = {.var = 1, .grad = g}, qb = {.var = 1, .dst = b},
             qw = {.var = 0, .dst = w};
  ps_ticket t, tw;
  assert_int_equal(ps_kv_push(f.kv, &pb, 1, 0, &t), 0);
  wait_ok(&f, t);
  x.want = 1;
  on_loop(&f, ps1_save, &x);
  ps1_wait(&x);
  pb.grad = one; /* learned after the checkpoint: lost with ps:1 */
  assert_int_equal(ps_kv_push(f.kv, &pb, 1, 1, &t), 0);
  wait_ok(&f, t);
  uint64_t before = ps_kv_losses(f.kv, NULL, 0);
  srv_ref s = {&f, 1};
  on_loop(&f, close_server, &s);
  wait_losses(&f, before + 1);
  assert_int_equal(ps_kv_pull(f.kv, &qb, 1, 0, &t), 0);
  assert_int_equal(ps_kv_pull(f.kv, &qw, 1, 0, &tw), 0);
  tsr_sleep_ms(300); /* gone */
  assert_false(ps_kv_done(f.kv, t));
  assert_false(ps_kv_done(f.kv, tw));
  on_loop(&f, ps1_start, &x);
  tsr_sleep_ms(400); /* back, without its variables */
  assert_false(ps_kv_done(f.kv, t));
  x.done = 0;
  x.want = 2;
  on_loop(&f, ps1_setup, &x);
  ps1_wait(&x);
  tsr_sleep_ms(400); /* its variables, holding for the restore */
  assert_false(ps_kv_done(f.kv, t));
  assert_false(ps_kv_done(f.kv, tw));
  x.done = 0;
  x.want = 1;
  on_loop(&f, ps1_restore, &x);
  ps1_wait(&x);
  wait_ok(&f, t);
  wait_ok(&f, tw);
  for (int i = 0; i < 4; i++) assert_true(b[i] == -g[i]);
  assert_true(ps_kv_resent(f.kv) > 0);
  /* and it learns again */
  assert_int_equal(ps_kv_push(f.kv, &pb, 1, 2, &t), 0);
  wait_ok(&f, t);
  assert_int_equal(ps_kv_pull(f.kv, &qb, 1, 0, &t), 0);
  wait_ok(&f, t);
  for (int i = 0; i < 4; i++) assert_true(b[i] == -g[i] - 1);
  fx_down(&f);
  char p[400];
  const char *files[] = {"w.part-1-of-2.tshard", "b.part-0-of-1.tshard"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", c1, files[i]);
    unlink(p);
  }
  rmdir(c1);
  rmdir(root);
}

static void cancel_kv(void *arg) { ps_kv_cancel(arg); }

static void cancel_fails(void **state) {
  (void)state;
  fx f;
  fx_up(&f, "sync", false, PS_DT_F32);
  float b[4];
  ps_kv_item q = {.var = 1, .dst = b};
  ps_ticket t = held_pull(&f, &q);
  on_loop(&f, cancel_kv, f.kv);
  assert_int_equal(ps_kv_wait(f.kv, t, NULL), TSR_ESHUTDOWN);
  assert_int_equal(ps_kv_pull(f.kv, &q, 1, 0, &t), TSR_ESHUTDOWN);
  fx_down(&f);
}

int main(void) {
  /* The PS and the client share this process; a write to a connection the
   * test has just closed must fail with EPIPE, not end the process (the
   * daemons ignore SIGPIPE as well). */
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bf16_rounding),
      cmocka_unit_test(split_and_gather),
      cmocka_unit_test(submission_order),
      cmocka_unit_test(any_thread),
      cmocka_unit_test(bf16_wire),
      cmocka_unit_test(bad_requests),
      cmocka_unit_test(failures_named),
      cmocka_unit_test(losses_checked),
      cmocka_unit_test(hold_reset),
      cmocka_unit_test(era_refused),
      cmocka_unit_test(lost_ps_waited_for),
      cmocka_unit_test(cancel_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
