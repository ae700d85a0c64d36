/* The PS service over real RPC on loopback (one process): create (and its
 * idempotence), pulls equal to the initializer, pushes equal to the
 * kernel, half-precision gradients, sparse rows, every bad input with a
 * correct pull after it, stats, and a concurrency test of many pushes and
 * pulls where every pulled copy must be whole (never half an update). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "kernels/init.h"
#include "ps_harness.h"

static ps_var_spec mk(const char *name, int64_t d0, int64_t d1, int shard,
                      int nsh, tsr_opt_kind k, const char *init) {
  return h_spec(name, d0, d1, shard, nsh, init, 7, k);
}

static void create_pull_push(void **state) {
  (void)state;
  h_env e;
  h_up(&e, 1, NULL);
  h_res r;
  ps_var_spec v = mk("dense/kernel", 64, 32, 0, 1, TSR_OPT_ADAM, "glorot_uniform");
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.count, 1);
  /* the same spec again: fine, nothing new */
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.count, 0);
  /* another spec under the same name: refused, named */
  ps_var_spec v2 = v;
  v2.optim.learning_rate = 0.5;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v2, 1, h_cb, &r));
  assert_int_equal(r.status, TSR_EEXISTS);
  assert_non_null(strstr(r.message, "dense/kernel"));

  enum { N = 64 * 32 };
  static float got[N], want[N], g[N], m[N], vv[N];
  H_CALL(&e, r, ps_client_pull(e.cl[0], "dense/kernel", 0, 0, 0, got, N, h_cb, &r));
  assert_int_equal(r.status, 0);
  kern_init_fill(&v.var.init, 7, kern_init_var_key("dense/kernel"), 0, want, N);
  assert_memory_equal(got, want, sizeof got);
  float *slots[2] = {m, vv};
  memset(m, 0, sizeof m);
  memset(vv, 0, sizeof vv);
  for (int t = 1; t <= 3; t++) {
    for (int i = 0; i < N; i++) g[i] = sinf((float)(i * t));
    H_CALL(&e, r, ps_client_push(e.cl[0], "dense/kernel", 0, 0, t - 1,
                                 PS_DT_F32, g, sizeof g, h_cb, &r));
    assert_int_equal(r.status, 0);
    assert_int_equal(r.step, t);
    kern_optim_apply(&v.optim, t, want, g, 1.0f, slots, N);
  }
  H_CALL(&e, r, ps_client_pull(e.cl[0], "dense/kernel", 0, 0, 0, got, N, h_cb, &r));
  assert_memory_equal(got, want, sizeof got);
  assert_int_equal(r.version, 3);
  /* bfloat16 gradient: half the bytes, converted on the PS */
  static uint16_t bf[N];
  for (int i = 0; i < N; i++) {
    float f = 0.5f - (float)(i % 3);
    uint32_t u;
    memcpy(&u, &f, 4);
    bf[i] = (uint16_t)(u >> 16);
    g[i] = f; /* exact in bfloat16 */
  }
  kern_optim_apply(&v.optim, 4, want, g, 1.0f, slots, N);
  /* fused push then pull */
  H_CALL(&e, r, ps_client_push_pull(e.cl[0], "dense/kernel", 0, 0, 3,
                                    PS_DT_BF16, bf, sizeof bf, got, N, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(got, want, sizeof got);
  assert_int_equal(h_down(&e), 0);
}

static void pull_ok(h_env *e, const char *name, const float *want, size_t n) {
  static float got[4096];
  h_res r;
  H_CALL(e, r, ps_client_pull(e->cl[0], name, 0, 0, 0, got, n, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(got, want, n * 4);
}

static void bad_inputs_then_correct_pulls(void **state) {
  (void)state;
  ps_server_opts o = {0};
  o.memory_limit = 4 << 20;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  ps_var_spec v = mk("w", 16, 8, 0, 1, TSR_OPT_SGD, "glorot_uniform");
  float want[128], g[128], got[128];
  kern_init_fill(&v.var.init, 7, kern_init_var_key("w"), 0, want, 128);
  /* push before create, pull of an unknown variable */
  for (int i = 0; i < 128; i++) g[i] = 1.0f;
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  assert_non_null(strstr(r.message, "create it first"));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "nope", 0, 0, 0, got, 128, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  pull_ok(&e, "w", want, 128);
  /* wrong gradient length */
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, 100, h_cb, &r));
  assert_int_equal(r.status, TSR_ESHAPE);
  assert_non_null(strstr(r.message, "w shard 0"));
  pull_ok(&e, "w", want, 128);
  /* unknown dtype, and a float16 gradient of float32 length */
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, (ps_dtype)7, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, TSR_EDTYPE);
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F16, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, TSR_ESHAPE);
  assert_non_null(strstr(r.message, "float16"));
  pull_ok(&e, "w", want, 128);
  /* NaN and Inf: refused, counted, nothing applied */
  g[77] = NAN;
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, TSR_ENONFINITE);
  assert_non_null(strstr(r.message, "element 77"));
  g[77] = INFINITY;
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, TSR_ENONFINITE);
  pull_ok(&e, "w", want, 128);
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.nonfinite, 2);
  /* a dense pull method on a dense variable of another size */
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 64, h_cb, &r));
  assert_int_not_equal(r.status, 0);
  /* the flag lets non-finite values through */
  H_CALL(&e, r, ps_client_config(e.cl[0], "async", true, h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 128, h_cb, &r));
  assert_true(isinf(got[77]));
  H_CALL(&e, r, ps_client_config(e.cl[0], "async", false, h_cb, &r));
  H_CALL(&e, r, ps_client_config(e.cl[0], "bogus:1", false, h_cb, &r));
  assert_int_equal(r.status, TSR_EINVAL);
  /* sparse: row id out of range of a bounded table */
  ps_var_spec emb = mk("emb", 100, 4, 1, 2, TSR_OPT_ADAGRAD, "random_uniform");
  emb.bounded = true;
  emb.var.kind = TSR_VAR_ROW_SPARSE;
  H_CALL(&e, r, ps_client_create(e.cl[0], &emb, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  int64_t ids[2] = {70, 20};
  float rg[8] = {1, 1, 1, 1, 1, 1, 1, 1}, rows[8], rwant[8];
  H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 1, 0, 0, PS_DT_F32, ids, 2,
                                    rg, sizeof rg, h_cb, &r));
  assert_int_equal(r.status, TSR_ERANGE);
  assert_non_null(strstr(r.message, "row id 20"));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 1, 0, 0, ids, 1, rows, 4, h_cb, &r));
  assert_int_equal(r.status, 0);
  kern_init_fill(&emb.var.init, 7, kern_init_var_key("emb"), 70 * 4, rwant, 4);
  assert_memory_equal(rows, rwant, 16);
  /* sparse push with a dense method, and the reverse */
  H_CALL(&e, r, ps_client_push(e.cl[0], "emb", 1, 0, 0, PS_DT_F32, rg, 16, h_cb, &r));
  assert_int_equal(r.status, TSR_EINVAL);
  /* memory limit: a variable too large for the budget */
  ps_var_spec big = mk("big", 4096, 1024, 0, 1, TSR_OPT_ADAM, "zeros");
  H_CALL(&e, r, ps_client_create(e.cl[0], &big, 1, h_cb, &r));
  assert_int_equal(r.status, TSR_EMEMLIMIT);
  assert_non_null(strstr(r.message, "memory limit"));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "big", 0, 0, 0, got, 128, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 128, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_true(isinf(got[77]));
  /* an unbounded table grows row by row until the budget says no */
  tsr_optim_spec ao;
  tsr_optim_defaults(TSR_OPT_ADAGRAD, &ao);
  ps_var_spec huge;
  int64_t hs[2] = {1, 64};
  assert_int_equal(ps_var_spec_init(&huge, "huge_emb", 2, hs, 0, 1,
                                    "random_uniform", 1, &ao), 0);
  huge.var.kind = TSR_VAR_ROW_SPARSE;
  H_CALL(&e, r, ps_client_create(e.cl[0], &huge, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  static int64_t hid[1000];
  static float hg[1000 * 64];
  for (int i = 0; i < 1000 * 64; i++) hg[i] = 0.01f;
  int batch;
  for (batch = 0; batch < 100; batch++) {
    for (int i = 0; i < 1000; i++) hid[i] = (int64_t)batch * 1000 + i;
    H_CALL(&e, r, ps_client_push_rows(e.cl[0], "huge_emb", 0, 0, 0, PS_DT_F32,
                                      hid, 1000, hg, sizeof hg, h_cb, &r));
    if (r.status) break;
  }
  assert_int_equal(r.status, TSR_EMEMLIMIT);
  assert_non_null(strstr(r.message, "cannot create row"));
  assert_true(batch > 2 && batch < 100);
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_true(r.mem_used <= (4u << 20));
  /* rows already held are served; the dense variable still is too */
  float row[64], row_want[64];
  int64_t id0 = 0;
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "huge_emb", 0, 0, 0, &id0, 1, row,
                                    64, h_cb, &r));
  assert_int_equal(r.status, 0);
  kern_init_fill(&huge.var.init, 1, kern_init_var_key("huge_emb"), 0, row_want,
                 64);
  for (int i = 0; i < 64; i++) assert_true(row[i] != row_want[i]); /* updated */
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 128, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_true(isinf(got[77]));
  assert_int_equal(h_down(&e), 0);
}

static void sparse_rows_and_fused(void **state) {
  (void)state;
  ps_var_spec emb = h_sparse(h_spec("user_emb", 1000000000000LL, 8, 0, 1,
                                    "random_uniform", 3, TSR_OPT_FTRL),
                             false);
  tsr_optim_spec o = emb.optim;
  h_env e;
  h_up_var(&e, &emb);
  h_res r;
  int64_t ids[3] = {999999999999LL, 3, 999999999999LL};
  float g[24], want[24], got[24], acc[8], lin[8];
  for (int i = 0; i < 24; i++) g[i] = 0.1f * (float)(i % 8 + 1);
  kern_init_fill(&emb.var.init, 3, kern_init_var_key("user_emb"),
                 999999999999ULL * 8, want, 8);
  float *sl[2] = {acc, lin};
  kern_optim_init_slots(&o, sl, 8);
  float sum[8];
  for (int k = 0; k < 8; k++) sum[k] = g[k] + g[16 + k];
  kern_optim_apply(&o, 1, want, sum, 1.0f, sl, 8);
  int64_t pull_ids[2] = {999999999999LL, 5};
  H_CALL(&e, r, ps_client_push_pull_rows(e.cl[0], "user_emb", 0, 0, 0, PS_DT_F32,
                                         ids, 3, g, sizeof g, pull_ids, 2, got,
                                         8, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.nbytes, 64);
  assert_memory_equal(got, want, 32);
  kern_init_fill(&emb.var.init, 3, kern_init_var_key("user_emb"), 5 * 8,
                 want + 8, 8);
  assert_memory_equal(got + 8, want + 8, 32);
  assert_int_equal(h_down(&e), 0);
}

/* ---- concurrency: many pushes and pulls, every pull whole --------------------*/

typedef struct {
  h_env *e;
  int pushes_left, pulls_left, inflight;
  float *bufs[4];
  int bad;
  int errors;
} conc;

static void conc_pull_done(const ps_result *r, void *data);

static void conc_push_done(const ps_result *r, void *data) {
  conc *c = data;
  c->inflight--;
  if (r->status) c->errors++;
}

typedef struct {
  conc *c;
  float *buf;
} conc_pull;

static void conc_pull_done(const ps_result *r, void *data) {
  conc_pull *p = data;
  conc *c = p->c;
  c->inflight--;
  if (r->status) {
    c->errors++;
  } else {
    /* SGD lr 1, gradient -1: every element equals the version */
    for (int i = 0; i < 65536; i++)
      if (p->buf[i] != (float)r->version) {
        c->bad++;
        break;
      }
  }
  free(p);
}

static void concurrent_pushes_and_pulls(void **state) {
  (void)state;
  ps_var_spec v = h_spec("c", 256, 256, 0, 1, "zeros", 1, TSR_OPT_SGD);
  v.optim.learning_rate = 1.0;
  h_env e;
  h_up_var(&e, &v);
  h_res r;
  /* a second connection to the same PS */
  ps_client *c2;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_server_port(e.srv[0]));
  assert_int_equal(ps_client_new(&c2, e.ctx, addr), 0);
  e.cl[1] = c2;
  static float g[65536];
  for (int i = 0; i < 65536; i++) g[i] = -1.0f;
  conc c = {0};
  c.e = &e;
  enum { ROUNDS = 60, PULLS = 4 };
  float *bufs = malloc((size_t)ROUNDS * PULLS * 65536 * 4);
  for (int round = 0; round < ROUNDS; round++) {
    ps_client *cl = e.cl[round & 1];
    c.inflight++;
    assert_int_equal(ps_client_push(cl, "c", 0, round & 1, round, PS_DT_F32, g,
                                    sizeof g, conc_push_done, &c), 0);
    for (int k = 0; k < PULLS; k++) {
      conc_pull *p = malloc(sizeof *p);
      p->c = &c;
      p->buf = bufs + ((size_t)round * PULLS + k) * 65536;
      c.inflight++;
      assert_int_equal(ps_client_pull(e.cl[(round + k) & 1], "c", 0, 0, 0,
                                      p->buf, 65536, conc_pull_done, p), 0);
    }
    uv_run(&e.loop, UV_RUN_NOWAIT);
  }
  uint64_t end = tsr_now_ms() + 30000;
  while (c.inflight > 0 && tsr_now_ms() < end) uv_run(&e.loop, UV_RUN_NOWAIT);
  assert_int_equal(c.inflight, 0);
  assert_int_equal(c.errors, 0);
  assert_int_equal(c.bad, 0);
  float last[65536];
  H_CALL(&e, r, ps_client_pull(e.cl[0], "c", 0, 0, 0, last, 65536, h_cb, &r));
  assert_int_equal(r.version, ROUNDS);
  assert_true(last[123] == (float)ROUNDS);
  free(bufs);
  assert_int_equal(h_down(&e), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(create_pull_push),
      cmocka_unit_test(bad_inputs_then_correct_pulls),
      cmocka_unit_test(sparse_rows_and_fused),
      cmocka_unit_test(concurrent_pushes_and_pulls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
