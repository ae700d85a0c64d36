/* Checked size arithmetic (common/size.h): each operation writes the
 * result when it fits, and refuses with TSR_ERANGE, leaving the output as
 * it was, when it does not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/size.h"

static void size_t_ops(void **state) {
  (void)state;
  size_t r = 7;
  assert_int_equal(tsr_mul_size(6, 7, &r), 0);
  assert_int_equal(r, 42);
  assert_int_equal(tsr_add_size(SIZE_MAX - 1, 1, &r), 0);
  assert_true(r == SIZE_MAX);
  r = 7;
  assert_int_equal(tsr_mul_size(SIZE_MAX / 2 + 1, 2, &r), TSR_ERANGE);
  assert_int_equal(tsr_add_size(SIZE_MAX, 1, &r), TSR_ERANGE);
  assert_int_equal(tsr_mul3_size(SIZE_MAX / 4, 2, 3, &r), TSR_ERANGE);
  assert_int_equal(r, 7);
  assert_int_equal(tsr_mul3_size(2, 3, 4, &r), 0);
  assert_int_equal(r, 24);
}

static void u64_ops(void **state) {
  (void)state;
  uint64_t r = 7;
  assert_int_equal(tsr_mul_u64(UINT64_MAX / 3, 3, &r), 0);
  assert_true(r == UINT64_MAX / 3 * 3);
  r = 7;
  assert_int_equal(tsr_mul_u64(UINT64_MAX / 3 + 1, 3, &r), TSR_ERANGE);
  assert_int_equal(tsr_add_u64(UINT64_MAX, 1, &r), TSR_ERANGE);
  assert_int_equal(r, 7);
  assert_int_equal(tsr_add_u64(1, 2, &r), 0);
  assert_int_equal(r, 3);
}

static void i64_ops_and_dims(void **state) {
  (void)state;
  int64_t r = 7;
  assert_int_equal(tsr_mul_i64(-4, 5, &r), 0);
  assert_int_equal(r, -20);
  assert_int_equal(tsr_add_i64(INT64_MIN, -1, &r), TSR_ERANGE);
  assert_int_equal(tsr_mul_i64(INT64_MAX, 2, &r), TSR_ERANGE);
  assert_int_equal(r, -20);
  const int64_t dims[] = {3, 4, 5, -1, INT64_MAX};
  assert_int_equal(tsr_dims_product(dims, 0, 3, &r), 0);
  assert_int_equal(r, 60);
  assert_int_equal(tsr_dims_product(dims, 2, 2, &r), 0);
  assert_int_equal(r, 1);
  assert_int_equal(tsr_dims_product(dims, 0, 4, &r), TSR_ERANGE);
  assert_int_equal(tsr_dims_product(dims, 1, 2, &r), 0);
  assert_int_equal(tsr_dims_product(dims + 4, 0, 1, &r), 0);
  assert_int_equal(tsr_dims_product(dims, 0, 5, &r), TSR_ERANGE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(size_t_ops),
      cmocka_unit_test(u64_ops),
      cmocka_unit_test(i64_ops_and_dims),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
