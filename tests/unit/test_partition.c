/* Partitioners: TensorFlow's own examples and a table of shapes with the
 * shard counts TF's formulas give, the "div" row layout, round-robin
 * placement across variables, and the errors for bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/partition.h"

typedef struct {
  tsr_part_kind kind;
  int64_t a, b;    /* fixed: num_shards; min: min_bytes,max_shards; max: max_bytes,max_shards */
  int rank;
  int64_t d0, d1;
  size_t elem;
  int64_t want;    /* expected shard count */
  int64_t rows[6]; /* expected row counts, 0-terminated (optional) */
} pcase;

/* A variable as the partitioner sees it: no checks, so a bad dimension
 * reaches the partitioner; elem picks the dtype of that size. */
static tsr_var mkv(const char *name, int rank, int64_t d0, int64_t d1,
                   int64_t d2, size_t elem) {
  tsr_var v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "%s", name);
  v.rank = rank;
  v.shape[0] = d0;
  v.shape[1] = d1;
  v.shape[2] = d2;
  v.dtype = elem == 1   ? TSR_DT_INT8
            : elem == 2 ? TSR_DT_BFLOAT16
            : elem == 8 ? TSR_DT_FLOAT64
                        : TSR_DT_FLOAT32;
  return v;
}

static tsr_partitioner mk(const pcase *c) {
  tsr_partitioner p;
  tsr_partitioner_default(&p);
  p.kind = c->kind;
  if (c->kind == TSR_PART_FIXED) p.num_shards = c->a;
  if (c->kind == TSR_PART_MIN_SIZE) {
    p.min_shard_bytes = c->a;
    p.max_shards = c->b;
  }
  if (c->kind == TSR_PART_MAX_SIZE) {
    p.max_shard_bytes = c->a;
    p.max_shards = c->b;
  }
  return p;
}

static const pcase table[] = {
    /* TF's docstring example: [1024,1024] float32, MinSize(256 KiB, 16) */
    {TSR_PART_MIN_SIZE, 256 << 10, 16, 2, 1024, 1024, 4, 16, {0}},
    /* MinSize's default max_shards=1 never splits */
    {TSR_PART_MIN_SIZE, 256 << 10, 1, 2, 1024, 1024, 4, 1, {0}},
    /* 13 rows over 5 shards: 3,3,3,2,2 */
    {TSR_PART_FIXED, 5, 0, 2, 13, 4, 4, 5, {3, 3, 3, 2, 2, 0}},
    /* FixedShards capped by dim0 */
    {TSR_PART_FIXED, 5, 0, 2, 3, 10, 4, 3, {1, 1, 1, 0}},
    /* small variable stays whole */
    {TSR_PART_MIN_SIZE, 256 << 10, 16, 2, 10, 10, 4, 1, {10, 0}},
    /* 4000 bytes / 1000 = 4 */
    {TSR_PART_MIN_SIZE, 1000, 100, 2, 100, 10, 4, 4, {25, 25, 25, 25, 0}},
    /* capped by dim0 */
    {TSR_PART_MIN_SIZE, 1000, 100, 2, 3, 1000, 4, 3, {0}},
    /* capped by max_shards */
    {TSR_PART_MIN_SIZE, 1000, 2, 2, 100, 10, 4, 2, {50, 50, 0}},
    /* ceil: 4001 bytes over 1000 gives 5 */
    {TSR_PART_MIN_SIZE, 1000, 100, 1, 4001, 0, 1, 5, {801, 800, 800, 800, 800, 0}},
    /* bfloat16 halves the bytes: 2 MiB / 256 KiB = 8 */
    {TSR_PART_MIN_SIZE, 256 << 10, 16, 2, 1024, 1024, 2, 8, {0}},
    /* MaxSize: rows of 40 B, 100 B per shard -> 2 rows -> 5 shards */
    {TSR_PART_MAX_SIZE, 100, 0, 2, 10, 10, 4, 5, {2, 2, 2, 2, 2, 0}},
    /* MaxSize exceeds its limit by less than a row: rows of 120 B */
    {TSR_PART_MAX_SIZE, 100, 0, 2, 10, 30, 4, 10, {0}},
    /* MaxSize capped by max_shards: 3 shards of 4,3,3 */
    {TSR_PART_MAX_SIZE, 100, 3, 2, 10, 10, 4, 3, {4, 3, 3, 0}},
    /* MaxSize 1 MiB over a 4 MiB matrix */
    {TSR_PART_MAX_SIZE, 1 << 20, 0, 2, 1024, 1024, 4, 4, {256, 256, 256, 256, 0}},
    /* MaxSize float64 vector */
    {TSR_PART_MAX_SIZE, 4096, 0, 1, 1000, 0, 8, 2, {500, 500, 0}},
    /* rank 0 is never split */
    {TSR_PART_FIXED, 4, 0, 0, 0, 0, 4, 1, {0}},
    /* rank 1, 7 over 3: 3,2,2 */
    {TSR_PART_FIXED, 3, 0, 1, 7, 0, 4, 3, {3, 2, 2, 0}},
    /* a row bigger than the limit: one row per shard */
    {TSR_PART_MAX_SIZE, 1, 0, 2, 4, 1000, 4, 4, {1, 1, 1, 1, 0}},
};

static void count_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const pcase *c = &table[i];
    tsr_partitioner p = mk(c);
    tsr_var v = mkv("v", c->rank, c->d0, c->d1, 0, c->elem);
    int64_t n = -1;
    char err[256] = "";
    int rc = tsr_partition_count(&p, &v, &n, err, sizeof err);
    if (rc || n != c->want) {
      print_error("case %zu: rc %d n %lld want %lld (%s)\n", i + 1, rc,
                  (long long)n, (long long)c->want, err);
      fail();
    }
    if (c->rows[0] && c->rank > 0) {
      int64_t next = 0;
      for (int64_t k = 0; k < n; k++) {
        int64_t r0, rows;
        tsr_partition_rows(c->d0, n, k, &r0, &rows);
        assert_int_equal(rows, c->rows[k]);
        assert_int_equal(r0, next);
        next += rows;
      }
      assert_int_equal(c->rows[n], 0);
      assert_int_equal(next, c->d0);
    }
  }
  assert_true(sizeof table / sizeof table[0] >= 15);
}

/* MaxSize's contract: every shard is within the limit, or over it by less
 * than one row; checked over many shapes. */
static void max_size_bound_holds(void **state) {
  (void)state;
  srand(7);
  for (int it = 0; it < 2000; it++) {
    int64_t d0 = 1 + rand() % 5000, d1 = 1 + rand() % 300;
    int64_t max_b = 1 + rand() % 100000;
    tsr_partitioner p;
    tsr_partitioner_default(&p);
    p.kind = TSR_PART_MAX_SIZE;
    p.max_shard_bytes = max_b;
    p.max_shards = 0;
    tsr_var v = mkv("v", 2, d0, d1, 0, 4);
    int64_t n;
    assert_int_equal(tsr_partition_count(&p, &v, &n, NULL, 0), 0);
    int64_t row_b = d1 * 4;
    for (int64_t k = 0; k < n; k++) {
      int64_t r0, rows;
      tsr_partition_rows(d0, n, k, &r0, &rows);
      assert_true(rows >= 1);
      assert_true(rows * row_b < max_b + row_b);
    }
  }
}

static void round_robin_across_variables(void **state) {
  (void)state;
  tsr_partitioner p;
  tsr_partitioner_default(&p);
  p.kind = TSR_PART_FIXED;
  p.num_shards = 4;
  p.placement = TSR_PLACE_ROUND_ROBIN;
  tsr_var vars[3] = {mkv("a", 2, 8, 2, 0, 4), mkv("b", 0, 0, 0, 0, 4),
                     mkv("c", 1, 3, 0, 0, 4)};
  tsr_shard *s;
  size_t n;
  assert_int_equal(tsr_partition_plan(&p, vars, NULL, 3, 2, &s, &n, NULL, 0), 0);
  assert_int_equal(n, 4 + 1 + 3);
  static const int want_ps[] = {0, 1, 0, 1, 0, 1, 0, 1};
  static const int want_var[] = {0, 0, 0, 0, 1, 2, 2, 2};
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(s[i].ps, want_ps[i]);
    assert_int_equal(s[i].var, want_var[i]);
  }
  assert_int_equal(s[4].rows, 1); /* the scalar */
  free(s);
  /* 3 PS: the counter runs on across variables */
  assert_int_equal(tsr_partition_plan(&p, vars, NULL, 3, 3, &s, &n, NULL, 0), 0);
  assert_int_equal(s[4].ps, 1);
  assert_int_equal(s[5].ps, 2);
  free(s);
}

static void bad_arguments(void **state) {
  (void)state;
  tsr_partitioner p;
  char err[256];
  int64_t n;
  tsr_var zero = mkv("emb", 2, 0, 4, 0, 4);
  tsr_partitioner_default(&p);
  assert_int_equal(tsr_partition_count(&p, &zero, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "emb: dimension 0 is 0"));
  tsr_var neg = mkv("w", 2, 4, -2, 0, 4);
  assert_int_equal(tsr_partition_count(&p, &neg, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "dimension 1 is -2"));
  tsr_var ok = mkv("w", 2, 4, 4, 0, 4);
  p.min_shard_bytes = 0;
  assert_int_equal(tsr_partition_count(&p, &ok, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "min_shard_bytes 0"));
  tsr_partitioner_default(&p);
  p.max_shards = -1;
  assert_int_equal(tsr_partition_count(&p, &ok, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "max_shards -1"));
  tsr_placement pl;
  assert_int_equal(tsr_placement_parse("greedy", &pl, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "placement \"greedy\""));
  p.kind = TSR_PART_FIXED;
  p.num_shards = -1;
  assert_int_equal(tsr_partition_count(&p, &ok, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "num_shards -1"));
  p.kind = TSR_PART_MAX_SIZE;
  p.max_shard_bytes = 0;
  assert_int_equal(tsr_partition_count(&p, &ok, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "max_shard_bytes 0"));
  /* max_shards 0 means each size kind's own default, said in the message */
  p.max_shard_bytes = 1024;
  p.max_shards = -2;
  assert_int_equal(tsr_partitioner_check(&p, err, sizeof err), TSR_EINVAL);
  assert_string_equal(err, "partitioner.max_shards -2 must be > 0 (or 0 for "
                           "no cap)");
  p.kind = TSR_PART_MIN_SIZE;
  assert_int_equal(tsr_partitioner_check(&p, err, sizeof err), TSR_EINVAL);
  assert_string_equal(err, "partitioner.max_shards -2 must be > 0 (or 0 for "
                           "one shard per PS at most)");
  p.kind = TSR_PART_FIXED; /* the size kinds' cap is not a fixed one's */
  p.num_shards = 2;
  assert_int_equal(tsr_partitioner_check(&p, err, sizeof err), 0);
  p.kind = (tsr_part_kind)7;
  assert_int_equal(tsr_partitioner_check(&p, err, sizeof err), TSR_EINVAL);
  assert_string_equal(err, "unknown partitioner kind 7");
  tsr_var huge = mkv("h", 3, INT64_MAX / 2, 4, 4, 4);
  tsr_partitioner_default(&p);
  assert_int_equal(tsr_partition_count(&p, &huge, &n, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "overflows"));
  tsr_shard *s;
  size_t ns;
  assert_int_equal(tsr_partition_plan(&p, &ok, NULL, 1, 0, &s, &ns, err, sizeof err),
                   TSR_EINVAL);
}

/* Balanced placement: largest shard first, each to the PS with the fewest
 * bytes so far (ties to the lowest index), optimizer slots counted. */
static void balanced_largest_first(void **state) {
  (void)state;
  tsr_partitioner p;
  tsr_partitioner_default(&p);
  p.kind = TSR_PART_FIXED;
  p.num_shards = 1;
  /* bytes: a 400, b 300, c 200, d 100 (c has one slot: 2 x 100 rows) */
  tsr_var vars[4] = {mkv("a", 1, 100, 0, 0, 4), mkv("b", 1, 75, 0, 0, 4),
                     mkv("c", 1, 25, 0, 0, 4), mkv("d", 1, 25, 0, 0, 4)};
  static const int slots[4] = {0, 0, 1, 0};
  tsr_shard *s;
  size_t n;
  assert_int_equal(tsr_partition_plan(&p, vars, slots, 4, 2, &s, &n, NULL, 0), 0);
  assert_int_equal(n, 4);
  /* a -> 0 (400); b -> 1 (300); c (200) -> 1 (500); d -> 0 (500) */
  assert_int_equal(s[0].ps, 0);
  assert_int_equal(s[1].ps, 1);
  assert_int_equal(s[2].ps, 1);
  assert_int_equal(s[3].ps, 0);
  int64_t per[2];
  double r = tsr_partition_balance(s, n, vars, slots, 2, per);
  assert_int_equal(per[0], 500);
  assert_int_equal(per[1], 500);
  assert_true(r == 1.0);
  free(s);
  /* equal sizes keep creation order: a tie goes to the lowest index */
  tsr_var eq[3] = {mkv("x", 1, 10, 0, 0, 4), mkv("y", 1, 10, 0, 0, 4),
                   mkv("z", 1, 10, 0, 0, 4)};
  assert_int_equal(tsr_partition_plan(&p, eq, NULL, 3, 2, &s, &n, NULL, 0), 0);
  assert_int_equal(s[0].ps, 0);
  assert_int_equal(s[1].ps, 1);
  assert_int_equal(s[2].ps, 0);
  free(s);
}

/* The main job's MLP (784-256-128-10 with Adam's two slots) over 2 PS: the
 * default partitioner splits the first kernel in two (max_shards follows
 * the PS count) and balanced placement keeps max/mean under 1.25, where
 * round-robin puts every kernel on ps:0. */
static void main_job_balance(void **state) {
  (void)state;
  tsr_var mlp[6] = {
      mkv("dense/kernel", 2, 784, 256, 0, 4), mkv("dense/bias", 1, 256, 0, 0, 4),
      mkv("dense_1/kernel", 2, 256, 128, 0, 4),
      mkv("dense_1/bias", 1, 128, 0, 0, 4),
      mkv("dense_2/kernel", 2, 128, 10, 0, 4),
      mkv("dense_2/bias", 1, 10, 0, 0, 4)};
  static const int slots[6] = {2, 2, 2, 2, 2, 2};
  tsr_partitioner p;
  tsr_partitioner_default(&p);
  tsr_shard *s;
  size_t n;
  int64_t per[4];
  assert_int_equal(tsr_partition_plan(&p, mlp, slots, 6, 2, &s, &n, NULL, 0), 0);
  assert_int_equal(s[0].num_shards, 2);
  double bal = tsr_partition_balance(s, n, mlp, slots, 2, per);
  assert_true(bal <= 1.25);
  free(s);
  p.placement = TSR_PLACE_ROUND_ROBIN;
  p.max_shards = 1; /* TensorFlow's defaults */
  assert_int_equal(tsr_partition_plan(&p, mlp, slots, 6, 2, &s, &n, NULL, 0), 0);
  for (size_t i = 0; i < n; i++)
    if (strstr(mlp[s[i].var].name, "kernel")) assert_int_equal(s[i].ps, 0);
  assert_true(tsr_partition_balance(s, n, mlp, slots, 2, per) > 1.9);
  free(s);
}

/* Greedy's bound over many random models: the fullest PS holds at most
 * the mean plus the largest shard, and every shard is placed. */
static void balanced_bound_holds(void **state) {
  (void)state;
  srand(11);
  for (int it = 0; it < 500; it++) {
    tsr_var v[12];
    int slots[12];
    char names[12][8];
    size_t nv = 1 + (size_t)(rand() % 12);
    for (size_t i = 0; i < nv; i++) {
      snprintf(names[i], sizeof names[i], "v%zu", i);
      int64_t d0 = 1 + rand() % 4000, d1 = 1 + rand() % 64;
      v[i] = mkv(names[i], 2, d0, d1, 0, 4);
      slots[i] = rand() % 3;
    }
    int n_ps = 1 + rand() % 5;
    tsr_partitioner p;
    tsr_partitioner_default(&p);
    p.min_shard_bytes = 1 + rand() % 100000;
    tsr_shard *s;
    size_t n;
    assert_int_equal(tsr_partition_plan(&p, v, slots, nv, n_ps, &s, &n, NULL, 0), 0);
    int64_t per[5], sum = 0, max = 0, biggest = 0;
    tsr_partition_balance(s, n, v, slots, n_ps, per);
    for (size_t k = 0; k < n; k++) {
      assert_true(s[k].ps >= 0 && s[k].ps < n_ps);
      assert_true(s[k].num_shards <= n_ps);
      int64_t b = tsr_shard_bytes(&s[k], &v[s[k].var], slots[s[k].var]);
      if (b > biggest) biggest = b;
    }
    for (int i = 0; i < n_ps; i++) {
      sum += per[i];
      if (per[i] > max) max = per[i];
    }
    assert_true(max * n_ps <= sum + (int64_t)n_ps * biggest);
    free(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(count_table),
      cmocka_unit_test(max_size_bound_holds),
      cmocka_unit_test(round_robin_across_variables),
      cmocka_unit_test(bad_arguments),
      cmocka_unit_test(balanced_largest_first),
      cmocka_unit_test(main_job_balance),
      cmocka_unit_test(balanced_bound_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
