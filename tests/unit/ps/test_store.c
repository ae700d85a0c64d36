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
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 1000000, NULL, NULL};
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


/* A materialized table holds every row from its creation with the values
 * and slots a table of rows made on first touch gives them, and applies
 * the same: both answer alike before and after pushes; it costs its
 * records and a chunk pointer per 65536 rows, nothing per row. */
static void materialized_equals_on_touch(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL, NULL};
  char err[256];
  for (int k = 0; k < 3; k++) {
    ps_var_spec a = sparse_spec(true, 1000, k, 3), b = a;
    b.materialized = true;
    ps_shard *ta, *tb;
    assert_int_equal(ps__shard_new(&a, &mem, &ta, err, sizeof err), 0);
    size_t before = atomic_load(&mem.used);
    assert_int_equal(ps__shard_new(&b, &mem, &tb, err, sizeof err), 0);
    size_t rows = (size_t)b.shard.rows, stride = 4 * 2;
    assert_int_equal(tb->rows.count, rows);
    assert_int_equal(atomic_load(&mem.used) - before,
                     rows * stride * 4 + sizeof(float *));
    int64_t ids[6] = {b.shard.row0, b.shard.row0 + 1, b.shard.row0 + 7,
                      b.shard.row0 + 7, b.shard.row0 + (int64_t)rows - 1,
                      b.shard.row0 + 3};
    float oa[24], ob[24], g[24];
    for (int i = 0; i < 24; i++) g[i] = 0.1f * (float)(i % 5) - 0.2f;
    for (int round = 0; round < 3; round++) {
      assert_int_equal(ps__shard_gather(ta, &mem, ids, 6, oa, false, err,
                                        sizeof err), 0);
      assert_int_equal(ps__shard_gather(tb, &mem, ids, 6, ob, false, err,
                                        sizeof err), 0);
      assert_memory_equal(oa, ob, sizeof oa);
      assert_int_equal(ps__shard_apply_rows(ta, &mem, ids, 6, g, 1.0f, err,
                                            sizeof err), 0);
      assert_int_equal(ps__shard_apply_rows(tb, &mem, ids, 6, g, 1.0f, err,
                                            sizeof err), 0);
    }
    assert_int_equal(tb->rows.count, rows); /* no row is added */
    /* an id outside the shard is refused, as for any bounded table */
    int64_t out_id = b.shard.row0 + (int64_t)rows;
    assert_int_equal(ps__shard_apply_rows(tb, &mem, &out_id, 1, g, 1.0f, err,
                                          sizeof err), TSR_ERANGE);
    ps__shard_free(ta, &mem);
    ps__shard_free(tb, &mem);
  }
  assert_int_equal(atomic_load(&mem.used), 0);
}

typedef struct {
  size_t largest;
  int calls;
} count_alloc;

static void *ca_alloc(void *ctx, size_t n) {
  count_alloc *c = ctx;
  c->calls++;
  if (n > c->largest) c->largest = n;
  return malloc(n);
}
static void ca_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

/* A materialized table that does not fit the memory limit is refused at
 * its creation, with the bytes it needs and the limit, before any of it
 * is allocated. */
static void materialized_refused_before_allocating(void **state) {
  (void)state;
  count_alloc c = {0, 0};
  tsr_rpc_allocator al = {ca_alloc, ca_free, &c};
  ps_mem mem = {0, 3000000, &al, NULL};
  ps_var_spec sp = sparse_spec(true, 100000, 0, 1); /* 3.2 MB with its slot */
  sp.materialized = true;
  ps_shard *s = NULL;
  char err[512] = "";
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err),
                   TSR_EMEMLIMIT);
  assert_null(s);
  size_t need = ps__rows_direct_bytes(8, 100000);
  char want[64];
  snprintf(want, sizeof want, "takes %zu bytes", need);
  assert_non_null(strstr(err, want));
  assert_non_null(strstr(err, "memory limit of 3000000 bytes"));
  assert_non_null(strstr(err, "emb shard 0"));
  assert_true(c.largest < 4096); /* the shard's own struct, no rows */
  assert_int_equal(atomic_load(&mem.used), 0);
  /* with room it is made */
  mem.limit = need + 4096;
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  ps__shard_free(s, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
  /* only a bounded sparse table may be materialized */
  ps_var_spec d = dense_spec("d", 10, 4, 0, 1);
  d.materialized = true;
  assert_int_equal(ps__shard_new(&d, &mem, &s, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "materialized"));
}

/* Reads rows [from, to) of a snapshot into recs (and ids), indexed from
 * row 0. */
static void snap_rows(ps_snap *v, size_t from, size_t to, float *recs,
                      int64_t *ids) {
  const ps_snap_info *in = ps__snap_info(v);
  char err[256];
  /* in odd-sized blocks, as a writer might */
  for (size_t r = from; r < to; r += 7) {
    size_t n = to - r < 7 ? to - r : 7;
    size_t S = (size_t)in->width * (size_t)(1 + in->nslots);
    assert_int_equal(ps__snap_read(v, r, n, recs + r * S, ids ? ids + r : NULL,
                                   err, sizeof err), 0);
  }
}

/* Reads the whole of a snapshot: n rows of records (and ids). */
static void snap_all(ps_snap *v, float *recs, int64_t *ids) {
  snap_rows(v, 0, ps__snap_info(v)->n_rows, recs, ids);
}

/* What a snapshot of s taken now reads (nothing applies meanwhile). */
static void snap_now(ps_shard *s, ps_mem *mem, float *recs, int64_t *ids) {
  ps_snap *v;
  char err[256];
  assert_int_equal(ps__snap_take(s, mem, &v, err, sizeof err), 0);
  snap_all(v, recs, ids);
  ps__snap_free(v);
}

/* A snapshot attached to a shard reads the shard as it was when taken,
 * whatever is applied meanwhile (rows changed, rows added, a dense
 * apply), for every layout; what it keeps is charged to the budget and
 * returned when it is released and dropped. */
static void snapshot_while_applying(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL, NULL};
  char err[256];
  for (int kind = 0; kind < 3; kind++) {
    ps_var_spec sp = kind == 0 ? dense_spec("d", 40, 4, 0, 1)
                               : sparse_spec(true, 40, 0, 1);
    sp.materialized = kind == 2;
    ps_shard *s;
    assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
    float g[40 * 4];
    for (int i = 0; i < 160; i++) g[i] = 0.01f * (float)(i % 9) - 0.03f;
    int64_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = i * 2; /* rows 0, 2, ..., 38 */
    if (kind == 1) /* rows made before the snapshot */
      assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 10, g, 1.0f, err,
                                            sizeof err), 0);
    ps_snap *v;
    assert_int_equal(ps__snap_take(s, &mem, &v, err, sizeof err), 0);
    assert_int_equal(ps__snap_attach(s, v, err, sizeof err), 0);
    const ps_snap_info *in = ps__snap_info(v);
    size_t S = (size_t)in->width * (size_t)(1 + in->nslots);
    size_t n = in->n_rows;
    assert_int_equal(n, kind == 1 ? 10 : 40);
    float *before = calloc(n * S, 4), *after = calloc(n * S, 4);
    int64_t *ib = calloc(n, 8), *ia = calloc(n, 8);
    snap_now(s, &mem, before, kind ? ib : NULL);
    /* the reader is a quarter of the way when the applies come */
    snap_rows(v, 0, n / 4, after, kind ? ia : NULL);
    size_t used0 = atomic_load(&mem.used);
    for (int round = 0; round < 3; round++) {
      if (kind == 0)
        assert_int_equal(ps__shard_apply_dense(s, g, 1.0f), 0);
      else /* half the rows it holds, and (on touch) ten new ones */
        assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 20, g, 1.0f, err,
                                              sizeof err), 0);
    }
    assert_true(atomic_load(&mem.used) > used0); /* the kept rows */
    snap_rows(v, n / 4, n, after, kind ? ia : NULL);
    assert_memory_equal(before, after, n * S * 4);
    if (kind) assert_memory_equal(ib, ia, n * 8);
    if (kind == 2)
      for (size_t r = 0; r < n; r++) assert_int_equal(ib[r], (int64_t)r);
    /* the live shard did change */
    float live[4];
    if (kind)
      assert_int_equal(ps__shard_gather(s, &mem, ids, 1, live, false, err,
                                        sizeof err), 0);
    else
      memcpy(live, s->w, sizeof live);
    assert_memory_not_equal(live, before, 4 * 4);
    ps__snap_release(v);
    assert_int_equal(ps__snap_read(v, 0, 1, after, NULL, err, sizeof err),
                     TSR_ECANCELED);
    /* released: applies keep nothing more */
    size_t used1 = atomic_load(&mem.used);
    assert_int_equal(kind == 0 ? ps__shard_apply_dense(s, g, 1.0f)
                               : ps__shard_apply_rows(s, &mem, ids, 20, g,
                                                      1.0f, err, sizeof err),
                     0);
    assert_true(atomic_load(&mem.used) <= used1);
    ps__snap_drop(s);
    assert_null(s->snap);
    ps__shard_free(s, &mem);
    free(before);
    free(after);
    free(ib);
    free(ia);
  }
  assert_int_equal(atomic_load(&mem.used), 0);
}

/* The blocks a view kept rows in serve the next view: a second
 * checkpoint's snapshot allocates nothing new for its kept rows, the
 * blocks stay charged between them, and a reservation that needs their
 * room gets it. */
static void snapshot_blocks_reused(void **state) {
  (void)state;
  ps_keep k;
  assert_int_equal(ps__keep_init(&k), 0);
  ps_mem mem = {0, 0, NULL, &k};
  char err[256];
  ps_var_spec sp = sparse_spec(true, 4000, 0, 1);
  sp.materialized = true;
  ps_shard *s;
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  size_t used_table = atomic_load(&mem.used);
  static float g[3000 * 4];
  int64_t ids[3000];
  for (int i = 0; i < 3000; i++) ids[i] = i + 1000; /* ahead of the reader */
  size_t fresh[3], kept[3], used[3];
  float *recs = calloc(4000 * 8, 4);
  for (int round = 0; round < 3; round++) {
    ps_snap *v;
    assert_int_equal(ps__snap_take(s, &mem, &v, err, sizeof err), 0);
    assert_int_equal(ps__snap_attach(s, v, err, sizeof err), 0);
    snap_rows(v, 0, 1000, recs, NULL);
    assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 3000, g, 1.0f, err,
                                          sizeof err), 0);
    snap_rows(v, 1000, 4000, recs, NULL);
    ps__snap_release(v);
    ps__snap_drop(s);
    ps__keep_trim(&mem);
    ps__keep_stats(&mem, &fresh[round], &kept[round]);
    used[round] = atomic_load(&mem.used);
  }
  /* 3000 rows of 32 bytes kept: 3 blocks of 1024 and the index, grown
   * to 8192 through each size; the next views start it at 8192 */
  assert_true(fresh[0] >= 4);
  assert_true(kept[0] >= 3000 * 32);
  assert_int_equal(s->snap_hcap, 8192);
  assert_int_equal(fresh[1], fresh[0]); /* nothing new */
  assert_int_equal(fresh[2], fresh[0]);
  assert_true(kept[1] < kept[0]); /* the smaller indexes are let go */
  assert_true(kept[1] >= 3000 * 32 + 8192 * 12);
  assert_int_equal(kept[2], kept[1]);
  assert_int_equal(used[2], used[1]);
  assert_true(used[0] >= used_table + kept[0]); /* and the dirty map */
  /* a budget that needs their room: the kept blocks give way */
  mem.limit = used[2];
  size_t room = kept[2] / 2, left;
  assert_int_equal(ps__mem_reserve(&mem, room), 0);
  ps__keep_stats(&mem, &fresh[0], &left);
  assert_int_equal(left, 0);
  assert_int_equal(atomic_load(&mem.used), used[2] - kept[2] + room);
  ps__mem_release(&mem, room);
  free(recs);
  ps__shard_free(s, &mem);
  ps__keep_free(&k, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

/* A checkpoint's snapshot keeps only the rows its reader has not copied
 * out yet, and of an increment only the rows selected; a row read twice
 * is refused (it may have changed since). */
static void snapshot_keeps_rows_ahead(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL, NULL};
  char err[256];
  ps_var_spec sp = sparse_spec(true, 40, 0, 1);
  sp.materialized = true;
  for (int inc = 0; inc < 2; inc++) {
    ps_shard *s;
    assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
    float g[2 * 4];
    for (int i = 0; i < 8; i++) g[i] = 0.5f;
    int64_t first[2] = {0, 39}; /* what an apply allocates once is made */
    assert_int_equal(ps__shard_apply_rows(s, &mem, first, 2, g, 1.0f, err,
                                          sizeof err), 0);
    ps_snap *v;
    assert_int_equal(ps__snap_take(s, &mem, &v, err, sizeof err), 0);
    size_t n = 40;
    if (inc) { /* rows 5, 30 and 35 */
      uint64_t *sel = ps__calloc(&mem, 1, sizeof *sel);
      assert_int_equal(ps__mem_reserve(&mem, sizeof *sel), 0);
      sel[0] = (1ull << 5) | (1ull << 30) | (1ull << 35);
      ps__snap_select(v, sel, 1, sizeof *sel);
      n = 3;
    }
    assert_int_equal(ps__snap_attach(s, v, err, sizeof err), 0);
    size_t S = 8;
    float *want = calloc(40 * S, 4), *got = calloc(40 * S, 4);
    snap_now(s, &mem, want, NULL);
    /* the reader is past row 19 (of an increment: past row 5) */
    snap_rows(v, 0, inc ? 1 : 20, got, NULL);
    size_t used0 = atomic_load(&mem.used);
    int64_t behind[2] = {3, 19}, unsel[2] = {21, 25}, ahead[2] = {30, 35};
    assert_int_equal(ps__shard_apply_rows(s, &mem, behind, 2, g, 1.0f, err,
                                          sizeof err), 0);
    assert_int_equal(atomic_load(&mem.used), used0); /* nothing kept */
    if (inc) { /* ahead, but not in the increment */
      assert_int_equal(ps__shard_apply_rows(s, &mem, unsel, 2, g, 1.0f, err,
                                            sizeof err), 0);
      assert_int_equal(atomic_load(&mem.used), used0);
    }
    assert_int_equal(ps__shard_apply_rows(s, &mem, ahead, 2, g, 1.0f, err,
                                          sizeof err), 0);
    assert_true(atomic_load(&mem.used) > used0); /* kept */
    /* the rest reads as at the snapshot */
    snap_rows(v, inc ? 1 : 20, n, got, NULL);
    if (inc) {
      assert_memory_equal(got, want + 5 * S, S * 4);
      assert_memory_equal(got + S, want + 30 * S, S * 4);
      assert_memory_equal(got + 2 * S, want + 35 * S, S * 4);
    } else {
      assert_memory_equal(got, want, 40 * S * 4);
    }
    /* read again: refused */
    assert_int_equal(ps__snap_read(v, 0, 1, got, NULL, err, sizeof err),
                     TSR_EINVAL);
    assert_non_null(strstr(err, "read again"));
    ps__snap_release(v);
    ps__snap_drop(s);
    ps__shard_free(s, &mem);
    free(want);
    free(got);
  }
  assert_int_equal(atomic_load(&mem.used), 0);
}

/* A snapshot that cannot keep a row within the budget is lost: the apply
 * goes on (training never waits for a checkpoint), and the reader fails
 * naming the shard and the limit. */
static void snapshot_lost_without_room(void **state) {
  (void)state;
  ps_var_spec sp = sparse_spec(true, 5000, 0, 1);
  sp.materialized = true;
  size_t table = ps__rows_direct_bytes(8, 5000);
  ps_mem mem = {0, table + 5000 / 8 + 2048, NULL, NULL}; /* the map only */
  char err[512];
  ps_shard *s;
  assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
  ps_snap *v;
  assert_int_equal(ps__snap_take(s, &mem, &v, err, sizeof err), 0);
  assert_int_equal(ps__snap_attach(s, v, err, sizeof err), 0);
  int64_t ids[2] = {10, 20};
  float g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[16];
  assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 2, g, 1.0f, err,
                                        sizeof err), 0);
  assert_int_equal(ps__snap_read(v, 0, 2, out, NULL, err, sizeof err),
                   TSR_EMEMLIMIT);
  assert_non_null(strstr(err, "emb shard 0"));
  assert_non_null(strstr(err, "memory limit"));
  ps__snap_drop(s);
  ps__shard_free(s, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void sync_sum_is_mean(void **state) {
  (void)state;
  ps_mem mem = {0, 0, NULL, NULL};
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
  ps_mem mem = {0, 0, NULL, NULL};
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
      cmocka_unit_test(materialized_equals_on_touch),
      cmocka_unit_test(materialized_refused_before_allocating),
      cmocka_unit_test(snapshot_while_applying),
      cmocka_unit_test(snapshot_keeps_rows_ahead),
      cmocka_unit_test(snapshot_blocks_reused),
      cmocka_unit_test(snapshot_lost_without_room),
      cmocka_unit_test(sync_sum_is_mean),
      cmocka_unit_test(bad_specs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
