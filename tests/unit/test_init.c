/* Initializers: values depend only on (seed, variable, element index), so
 * any split of a variable gives the same values; distributions have the
 * Keras ranges and moments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/init.h"

static void same_values_whatever_the_split(void **state) {
  (void)state;
  tsr_init_spec s;
  assert_int_equal(tsr_init_parse("glorot_uniform", &s), 0);
  s.fan_in = 100;
  s.fan_out = 30;
  uint64_t key = kern_init_var_key("dense/kernel");
  enum { N = 3000 };
  float whole[N], parts[N];
  kern_init_fill(&s, 7, key, 0, whole, N);
  /* 13 uneven pieces */
  size_t at = 0;
  for (int k = 0; at < N; k++) {
    size_t len = (size_t)(1 + (k * 97) % 400);
    if (at + len > N) len = N - at;
    kern_init_fill(&s, 7, key, at, parts + at, len);
    at += len;
  }
  assert_memory_equal(whole, parts, sizeof whole);
  /* another seed or variable gives other values */
  float other[N];
  kern_init_fill(&s, 8, key, 0, other, N);
  assert_memory_not_equal(whole, other, sizeof whole);
  kern_init_fill(&s, 7, kern_init_var_key("dense_1/kernel"), 0, other, N);
  assert_memory_not_equal(whole, other, sizeof whole);
}

static void glorot_uniform_range_and_moments(void **state) {
  (void)state;
  tsr_init_spec s;
  assert_int_equal(tsr_init_parse("GlorotUniform", &s), 0);
  s.fan_in = 10;
  s.fan_out = 64;
  enum { N = 200000 };
  float *v = malloc(N * sizeof *v);
  kern_init_fill(&s, 1, 42, 0, v, N);
  double lim = sqrt(6.0 / 74.0), sum = 0, sq = 0;
  for (int i = 0; i < N; i++) {
    assert_true(v[i] >= -lim && v[i] < lim);
    sum += v[i];
    sq += (double)v[i] * v[i];
  }
  double mean = sum / N, var = sq / N - mean * mean;
  assert_true(fabs(mean) < 0.01 * lim);
  assert_true(fabs(var - lim * lim / 3.0) < 0.02 * lim * lim / 3.0);
  free(v);
}

static void normal_and_truncated(void **state) {
  (void)state;
  tsr_init_spec s;
  assert_int_equal(tsr_init_parse("random_normal", &s), 0);
  enum { N = 100000 };
  float *v = malloc(N * sizeof *v);
  kern_init_fill(&s, 3, 9, 0, v, N);
  double sum = 0, sq = 0;
  for (int i = 0; i < N; i++) {
    sum += v[i];
    sq += (double)v[i] * v[i];
  }
  double sd = sqrt(sq / N - (sum / N) * (sum / N));
  assert_true(fabs(sd - 0.05) < 0.002);
  assert_int_equal(tsr_init_parse("truncated_normal", &s), 0);
  kern_init_fill(&s, 3, 9, 0, v, N);
  for (int i = 0; i < N; i++) assert_true(fabs(v[i]) < 0.1 + 1e-6);
  free(v);
}

static void constants_and_names(void **state) {
  (void)state;
  tsr_init_spec s;
  float v[5];
  assert_int_equal(tsr_init_parse("zeros", &s), 0);
  kern_init_fill(&s, 1, 2, 0, v, 5);
  for (int i = 0; i < 5; i++) assert_true(v[i] == 0.0f);
  assert_int_equal(tsr_init_parse("ones", &s), 0);
  kern_init_fill(&s, 1, 2, 0, v, 5);
  for (int i = 0; i < 5; i++) assert_true(v[i] == 1.0f);
  assert_int_equal(tsr_init_parse("uniform", &s), 0);
  assert_true(s.a == -0.05 && s.b == 0.05);
  assert_int_equal(tsr_init_parse("identity", &s), TSR_EINVAL);
  assert_int_equal(tsr_init_parse("Orthogonal", &s), 0);
  assert_true(kern_init_var_key("a") != kern_init_var_key("b"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_values_whatever_the_split),
      cmocka_unit_test(glorot_uniform_range_and_moments),
      cmocka_unit_test(normal_and_truncated),
      cmocka_unit_test(constants_and_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
