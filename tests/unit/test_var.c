/* The one variable description (common/var.h): the checked constructor
 * and its refusals (each naming the variable and the value), Keras's fans
 * for kernels of every rank, the dtype and initializer names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/var.h"

static void set_fills_sizes(void **state) {
  (void)state;
  tsr_var v;
  static const int64_t conv[4] = {3, 3, 2, 8};
  assert_int_equal(tsr_var_set(&v, "c1/kernel", 4, conv, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, NULL, 0), 0);
  assert_string_equal(v.name, "c1/kernel");
  assert_int_equal(v.numel, 144);
  assert_int_equal(v.row_dim, 48);
  for (int i = 4; i < TSR_MAX_RANK; i++) assert_int_equal(v.shape[i], 1);
  assert_true(v.trainable);
  assert_int_equal(v.init.kind, TSR_INIT_ZEROS);
  /* a scalar */
  assert_int_equal(tsr_var_set(&v, "step", 0, NULL, TSR_DT_INT64,
                               TSR_VAR_DENSE, NULL, 0), 0);
  assert_int_equal(v.numel, 1);
  assert_int_equal(v.row_dim, 1);
}

static void set_refuses(void **state) {
  (void)state;
  tsr_var v;
  char err[256];
  static const int64_t zero[2] = {0, 4}, neg[2] = {4, -2},
                       huge[3] = {INT64_MAX / 2, 4, 4},
                       big[2] = {INT64_MAX / 8, 2};
  assert_int_equal(tsr_var_set(&v, "emb", 2, zero, TSR_DT_FLOAT32,
                               TSR_VAR_ROW_SPARSE, err, sizeof err),
                   TSR_EINVAL);
  assert_non_null(strstr(err, "emb: dimension 0 is 0"));
  assert_int_equal(tsr_var_set(&v, "w", 2, neg, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "w: dimension 1 is -2"));
  assert_int_equal(tsr_var_set(&v, "h", 3, huge, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "h: element count overflows"));
  /* elements fit, bytes do not */
  assert_int_equal(tsr_var_set(&v, "b", 2, big, TSR_DT_FLOAT64,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "b: byte size overflows"));
  assert_int_equal(tsr_var_set(&v, "r", TSR_MAX_RANK + 1, huge,
                               TSR_DT_FLOAT32, TSR_VAR_DENSE, err,
                               sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "r: rank 9 out of range 0..8"));
  assert_int_equal(tsr_var_set(&v, "r", -1, huge, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_int_equal(tsr_var_set(&v, "d", 1, zero + 1, (tsr_dtype)99,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "d: dtype 99"));
  char name[TSR_VAR_NAME_MAX + 1];
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = 0;
  assert_int_equal(tsr_var_set(&v, name, 1, zero + 1, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "longer than 127 bytes"));
  name[TSR_VAR_NAME_MAX - 1] = 0; /* 127 bytes: the longest that fits */
  assert_int_equal(tsr_var_set(&v, name, 1, zero + 1, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, err, sizeof err), 0);
}

static void keras_fans(void **state) {
  (void)state;
  tsr_var v;
  tsr_init_spec g;
  assert_int_equal(tsr_init_parse("GlorotUniform", &g), 0);
  static const int64_t dense[2] = {784, 256}, conv[4] = {3, 3, 2, 8},
                       bias[1] = {256};
  tsr_var_set(&v, "d/kernel", 2, dense, TSR_DT_FLOAT32, TSR_VAR_DENSE, NULL,
              0);
  tsr_var_set_init(&v, &g);
  assert_int_equal(v.init.fan_in, 784);
  assert_int_equal(v.init.fan_out, 256);
  /* receptive field 3x3 multiplies both */
  tsr_var_set(&v, "c/kernel", 4, conv, TSR_DT_FLOAT32, TSR_VAR_DENSE, NULL,
              0);
  tsr_var_set_init(&v, &g);
  assert_int_equal(v.init.fan_in, 18);
  assert_int_equal(v.init.fan_out, 72);
  /* rank 1 and non-scaling initializers keep zero fans */
  tsr_var_set(&v, "d/bias", 1, bias, TSR_DT_FLOAT32, TSR_VAR_DENSE, NULL, 0);
  tsr_var_set_init(&v, &g);
  assert_int_equal(v.init.fan_in, 0);
  tsr_init_spec u;
  assert_int_equal(tsr_init_parse("random_uniform", &u), 0);
  tsr_var_set(&v, "d/kernel", 2, dense, TSR_DT_FLOAT32, TSR_VAR_DENSE, NULL,
              0);
  tsr_var_set_init(&v, &u);
  assert_int_equal(v.init.fan_in, 0);
  assert_true(v.init.a == -0.05 && v.init.b == 0.05);
}

static void names(void **state) {
  (void)state;
  tsr_dtype dt;
  static const struct { const char *n; size_t sz; } t[] = {
      {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8},
      {"int64", 8},   {"int32", 4},   {"int8", 1},     {"uint8", 1},
      {"fp32", 4},    {"fp16", 2},    {"bf16", 2}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    assert_int_equal(tsr_dtype_parse(t[i].n, &dt), 0);
    assert_int_equal(tsr_dtype_size(dt), t[i].sz);
  }
  assert_int_equal(tsr_dtype_parse("complex64", &dt), TSR_EINVAL);
  assert_int_equal(tsr_dtype_parse(NULL, &dt), TSR_EINVAL);
  assert_string_equal(tsr_dtype_name(TSR_DT_BFLOAT16), "bfloat16");
  assert_string_equal(tsr_dtype_name((tsr_dtype)99), "?");
  assert_int_equal(tsr_dtype_size((tsr_dtype)99), 0);
  tsr_init_spec s;
  assert_int_equal(tsr_init_parse("he_normal", &s), 0);
  assert_int_equal(s.kind, TSR_INIT_HE_NORMAL);
  assert_string_equal(tsr_init_name(TSR_INIT_TRUNCATED_NORMAL),
                      "truncated_normal");
  assert_int_equal(tsr_init_parse("identity", &s), TSR_EINVAL);
  assert_int_equal(tsr_init_parse("Orthogonal", &s), 0);
  assert_int_equal(tsr_init_parse(NULL, &s), TSR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(set_fills_sizes),
      cmocka_unit_test(set_refuses),
      cmocka_unit_test(keras_fans),
      cmocka_unit_test(names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
