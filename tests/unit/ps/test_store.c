/* Shard store: initial values independent of the sharding, dense applies
 * equal to the kernel, gradients in bfloat16/float16, sparse rows created
 * on first touch with the initializer (so ids far beyond memory work),
 * duplicate ids summed, the memory budget, ids out of range, sync sums. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ps/ps_int.h"

static ps_var_spec dense_spec(const char *name, int64_t d0, int64_t d1,
                              int shard, int nshards) {
  ps_var_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.var.name, sizeof s.var.name, "%s", name);
  s.var.rank = 2;
  s.var.shape[0] = d0;
  s.var.shape[1] = d1;
  s.shard.shard = shard;
  s.shard.num_shards = nshards;
  int64_t base = d0 / nshards, extra = d0 % nshards;
  s.shard.row0 = shard * base + (shard < extra ? shard : extra);
  s.shard.rows = base + (shard < extra ? 1 : 0);
  tsr_init_parse("glorot_uniform", &s.var.init);
  s.var.init.fan_in = d0;
  s.var.init.fan_out = d1;
  s.seed = 42;
  tsr_optim_defaults(TSR_OPT_ADAM, &s.optim);
  return s;
}

static void init_independent_of_sharding(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_var_spec whole = dense_spec("dense/kernel", 13, 7, 0, 1);
  ps_shard *w;
  char err[256];
  assert_int_equal(ps__shard_new(&whole, &mem, &w, err, sizeof err), 0);
  for (int k = 0; k < 5; k++) {
    ps_var_spec p = dense_spec("dense/kernel", 13, 7, k, 5);
    ps_shard *s;
    assert_int_equal(ps__shard_new(&p, &mem, &s, err, sizeof err), 0);
    assert_int_equal(s->numel, (size_t)(p.shard.rows * 7));
    assert_memory_equal(s->w, w->w + p.shard.row0 * 7, s->numel * 4);
    ps__shard_free(s, &mem);
  }
  ps__shard_free(w, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void dense_apply_matches_kernel(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_var_spec sp = dense_spec("v", 8, 4, 0, 1);
  ps_shard *s;
  char err[256];
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  float w[32], m[32] = {0}, v[32] = {0}, g[32];
  float *slots[2] = {m, v};
  memcpy(w, s->w, sizeof w);
  for (int t = 1; t <= 3; t++) {
    for (int i = 0; i < 32; i++) g[i] = (float)((i % 7) - 3) * 0.1f * t;
    assert_int_equal(ps__shard_apply_dense(s, g, 1.0f), 0);
    kern_optim_apply(&sp.optim, t, w, g, 1.0f, slots, 32);
  }
  assert_memory_equal(s->w, w, sizeof w);
  assert_int_equal(s->version, 3);
  assert_int_equal(s->step, 3);
  ps__shard_free(s, &mem);
}

static void half_precision_gradients(void **state) {
  (void)state;
  /* values exact in every format */
  const float want[6] = {1.0f, -2.5f, 0.125f, 0.0f, 65504.0f, -0.0009765625f};
  uint16_t bf[6], hf[6] = {0x3c00, 0xc100, 0x3000, 0x0000, 0x7bff, 0x9400};
  for (int i = 0; i < 6; i++) {
    uint32_t u;
    memcpy(&u, &want[i], 4);
    bf[i] = (uint16_t)(u >> 16);
  }
  float out[6];
  assert_int_equal(ps__grad_to_f32(hf, PS_DT_F16, 6, out), 1);
  assert_memory_equal(out, want, sizeof want);
  float bwant[6];
  for (int i = 0; i < 6; i++) {
    uint32_t u = (uint32_t)bf[i] << 16;
    memcpy(&bwant[i], &u, 4);
  }
  assert_int_equal(ps__grad_to_f32(bf, PS_DT_BF16, 6, out), 1);
  assert_memory_equal(out, bwant, sizeof bwant);
  /* subnormal float16: 2^-24 */
  uint16_t sub = 0x0001;
  assert_int_equal(ps__grad_to_f32(&sub, PS_DT_F16, 1, out), 1);
  assert_true(out[0] == ldexpf(1.0f, -24));
  /* non-finite values are reported */
  uint16_t inf16 = 0x7c00, nan_bf = 0x7fc0;
  assert_int_equal(ps__grad_to_f32(&inf16, PS_DT_F16, 1, out), 0);
  assert_int_equal(ps__grad_to_f32(&nan_bf, PS_DT_BF16, 1, out), 0);
  float f[3] = {1, NAN, 2};
  assert_int_equal(ps__grad_to_f32(f, PS_DT_F32, 3, out), 0);
  assert_int_equal(ps__grad_to_f32(f, 9, 3, out), TSR_EDTYPE);
}

static ps_var_spec sparse_spec(bool bounded, int64_t d0, int shard, int ns) {
  ps_var_spec s = dense_spec("emb", d0, 4, shard, ns);
  s.var.kind = TSR_VAR_ROW_SPARSE;
  s.bounded = bounded;
  tsr_init_parse("random_uniform", &s.var.init);
  tsr_optim_defaults(TSR_OPT_ADAGRAD, &s.optim);
  return s;
}

static void sparse_rows_first_touch(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  /* ten billion rows: far more than memory could ever hold densely */
  ps_var_spec sp = sparse_spec(true, 10000000000LL, 0, 1);
  ps_shard *s;
  char err[256];
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  int64_t ids[3] = {9999999999LL, 5, 9999999999LL};
  float out[12], want[4];
  assert_int_equal(ps__shard_gather(s, &mem, ids, 3, out, false, err,
                                    sizeof err), 0);
  assert_int_equal(s->rows.count, 0); /* a read without create stores nothing */
  kern_init_fill(&sp.var.init, sp.seed, kern_init_var_key("emb"),
                 9999999999ULL * 4, want, 4);
  assert_memory_equal(out, want, sizeof want);
  assert_memory_equal(out + 8, want, sizeof want);
  for (int i = 0; i < 12; i++) assert_true(out[i] >= -0.05f && out[i] < 0.05f);
  /* apply with a duplicate id: the two gradients are summed first */
  float g[12] = {1, 1, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f, 1, 1, 1, 1};
  assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 3, g, 1.0f, err,
                                        sizeof err), 0);
  assert_int_equal(s->rows.count, 2);
  float w[4], acc[4];
  memcpy(w, want, sizeof w);
  float *sl[1] = {acc};
  kern_optim_init_slots(&sp.optim, sl, 4);
  float g2[4] = {2, 2, 2, 2};
  kern_optim_apply(&sp.optim, 1, w, g2, 1.0f, sl, 4);
  assert_int_equal(ps__shard_gather(s, &mem, ids, 1, out, true, err,
                                    sizeof err), 0);
  assert_memory_equal(out, w, sizeof w);
  assert_true(atomic_load(&mem.used) > 0);
  ps__shard_free(s, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

/* A push of 300 ids in no order, 37 distinct, each named up to a dozen
 * times: every row ends as if its gradients had been summed in the order
 * they came and applied once, which is what a push of the 37 ids in
 * increasing order with those sums gives. */
static void unsorted_duplicates(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_var_spec sp = sparse_spec(false, 1000, 0, 1);
  ps_shard *a, *b;
  char err[256];
  assert_int_equal(ps__shard_new(&sp, &mem, &a, err, sizeof err), 0);
  assert_int_equal(ps__shard_new(&sp, &mem, &b, err, sizeof err), 0);
  enum { N = 300, D = 37 };
  int64_t ids[N], uids[D];
  float g[N * 4], sums[D * 4] = {0};
  bool seen[D] = {false};
  for (int i = 0; i < N; i++) {
    int u = (i * 17 + i / 7) % D;
    ids[i] = 900 - 11 * u; /* decreasing in u: never sorted */
    for (int k = 0; k < 4; k++) g[i * 4 + k] = (float)((i * 7 + k) % 13) * 0.37f - 2.0f;
  }
  for (int u = 0; u < D; u++) uids[u] = 900 - 11 * (D - 1 - u); /* increasing */
  for (int i = 0; i < N; i++) {
    int u = D - 1 - (int)((900 - ids[i]) / 11);
    for (int k = 0; k < 4; k++) {
      if (!seen[u]) sums[u * 4 + k] = g[i * 4 + k];
      else sums[u * 4 + k] += g[i * 4 + k];
    }
    seen[u] = true;
  }
  for (int u = 0; u < D; u++) assert_true(seen[u]);
  assert_int_equal(ps__shard_apply_rows(a, &mem, ids, N, g, 1.0f, err, sizeof err), 0);
  assert_int_equal(ps__shard_apply_rows(b, &mem, uids, D, sums, 1.0f, err, sizeof err), 0);
  assert_int_equal(a->rows.count, D);
  for (int u = 0; u < D; u++) {
    float *x = ps__rows_find(&a->rows, uids[u]), *y = ps__rows_find(&b->rows, uids[u]);
    assert_non_null(x);
    assert_non_null(y);
    assert_memory_equal(x, y, 8 * sizeof(float)); /* value and accumulator */
  }
  ps__shard_free(a, &mem);
  ps__shard_free(b, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void ids_out_of_range(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_var_spec sp = sparse_spec(true, 100, 1, 2); /* rows [50, 100) */
  ps_shard *s;
  char err[256] = "";
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  int64_t ids[2] = {60, 7};
  float g[8] = {0};
  assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 2, g, 1.0f, err,
                                        sizeof err), TSR_ERANGE);
  assert_non_null(strstr(err, "row id 7"));
  assert_non_null(strstr(err, "[50, 100)"));
  assert_int_equal(s->rows.count, 0); /* nothing applied, nothing created */
  assert_int_equal(s->version, 0);
  int64_t neg = -3;
  assert_int_equal(ps__shard_gather(s, &mem, &neg, 1, g, true, err, sizeof err),
                   TSR_ERANGE);
  ps__shard_free(s, &mem);
  /* unbounded: ids go by id % num_shards */
  ps_var_spec u = sparse_spec(false, 1, 1, 3);
  assert_int_equal(ps__shard_new(&u, &mem, &s, err, sizeof err), 0);
  int64_t ok = 3000000000001LL, bad = 3000000000000LL;
  assert_int_equal(ps__shard_gather(s, &mem, &ok, 1, g, true, err, sizeof err), 0);
  assert_int_equal(ps__shard_gather(s, &mem, &bad, 1, g, true, err, sizeof err),
                   TSR_ERANGE);
  ps__shard_free(s, &mem);
}

static void memory_limit(void **state) {
  (void)state;
  ps_var_spec sp = dense_spec("big", 1000, 100, 0, 1); /* 400 KB x3 (adam) */
  ps_mem mem = {0, 1000000, NULL};
  ps_shard *s;
  char err[256] = "";
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), TSR_EMEMLIMIT);
  assert_non_null(strstr(err, "memory limit"));
  assert_int_equal(atomic_load(&mem.used), 0);
  /* sparse rows stop at the budget with a clear error */
  ps_var_spec e = sparse_spec(false, 1, 0, 1);
  mem.limit = 200000;
  assert_int_equal(ps__shard_new(&e, &mem, &s, err, sizeof err), 0);
  float out[4];
  int rc = 0;
  int64_t id;
  for (id = 0; id < 100000 && rc == 0; id++)
    rc = ps__shard_gather(s, &mem, &id, 1, out, true, err, sizeof err);
  assert_int_equal(rc, TSR_EMEMLIMIT);
  assert_non_null(strstr(err, "cannot create row"));
  assert_true(atomic_load(&mem.used) <= mem.limit);
  size_t held = s->rows.count;
  assert_true(held > 1000);
  /* rows already there are still served */
  int64_t first = 0;
  assert_int_equal(ps__shard_gather(s, &mem, &first, 1, out, true, err,
                                    sizeof err), 0);
  ps__shard_free(s, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void sync_sum_is_mean(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_var_spec sp = dense_spec("v", 6, 5, 0, 1);
  tsr_optim_defaults(TSR_OPT_SGD, &sp.optim);
  sp.optim.momentum = 0.9;
  ps_shard *a, *b;
  char err[256];
  assert_int_equal(ps__shard_new(&sp, &mem, &a, err, sizeof err), 0);
  assert_int_equal(ps__shard_new(&sp, &mem, &b, err, sizeof err), 0);
  float g[3][30], mean[30];
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < 30; i++) {
      mean[i] = 0;
      for (int k = 0; k < 3; k++) {
        g[k][i] = (float)((i * (k + 1) + step) % 5) * 0.25f;
        mean[i] += g[k][i];
      }
      mean[i] /= 3;
    }
    for (int k = 0; k < 3; k++)
      assert_int_equal(ps__shard_accum_dense(a, &mem, g[k]), 0);
    assert_int_equal(ps__shard_accum_apply(a, &mem, 3, err, sizeof err), 0);
    assert_int_equal(ps__shard_apply_dense(b, mean, 1.0f), 0);
  }
  for (int i = 0; i < 30; i++) assert_float_equal(a->w[i], b->w[i], 1e-6);
  assert_int_equal(a->step, 3);
  ps__shard_free(a, &mem);
  ps__shard_free(b, &mem);
  /* sparse: rows summed across workers, then the mean applied */
  ps_var_spec e = sparse_spec(true, 10, 0, 1);
  assert_int_equal(ps__shard_new(&e, &mem, &a, err, sizeof err), 0);
  assert_int_equal(ps__shard_new(&e, &mem, &b, err, sizeof err), 0);
  int64_t i1[2] = {1, 3}, i2[1] = {3};
  float g1[8] = {1, 1, 1, 1, 2, 2, 2, 2}, g2[4] = {4, 4, 4, 4};
  assert_int_equal(ps__shard_accum_rows(a, &mem, i1, 2, g1, err, sizeof err), 0);
  assert_int_equal(ps__shard_accum_rows(a, &mem, i2, 1, g2, err, sizeof err), 0);
  assert_int_equal(ps__shard_accum_apply(a, &mem, 2, err, sizeof err), 0);
  float mg[8] = {0.5f, 0.5f, 0.5f, 0.5f, 3, 3, 3, 3};
  assert_int_equal(ps__shard_apply_rows(b, &mem, i1, 2, mg, 1.0f, err,
                                        sizeof err), 0);
  float oa[8], ob[8];
  ps__shard_gather(a, &mem, i1, 2, oa, false, err, sizeof err);
  ps__shard_gather(b, &mem, i1, 2, ob, false, err, sizeof err);
  for (int i = 0; i < 8; i++) assert_float_equal(oa[i], ob[i], 1e-6);
  ps__shard_free(a, &mem);
  ps__shard_free(b, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void bad_specs(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL};
  ps_shard *s;
  char err[256] = "";
  ps_var_spec sp = dense_spec("v", 10, 3, 0, 1);
  sp.shard.rows = 11;
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "outside dim0"));
  sp = dense_spec("v", 10, 3, 0, 1);
  sp.var.shape[1] = 0;
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "shape[1]"));
  sp = dense_spec("v", 10, 3, 2, 2);
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), TSR_EINVAL);
  ps_var_spec a = dense_spec("v", 10, 3, 0, 1), b = a;
  assert_true(ps__spec_equal(&a, &b));
  b.optim.learning_rate *= 2;
  assert_false(ps__spec_equal(&a, &b));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(init_independent_of_sharding),
      cmocka_unit_test(dense_apply_matches_kernel),
      cmocka_unit_test(half_precision_gradients),
      cmocka_unit_test(sparse_rows_first_touch),
      cmocka_unit_test(unsorted_duplicates),
      cmocka_unit_test(ids_out_of_range),
      cmocka_unit_test(memory_limit),
      cmocka_unit_test(sync_sum_is_mean),
      cmocka_unit_test(bad_specs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
