/* Checked size arithmetic (common/size.h): each operation writes the
 * result when it fits, and refuses with TSR_ERANGE, leaving the output as
 * it was, when it does not. Growable arrays built on it (common/grow.h):
 * room is made only when the array is full, the capacity starts at
 * `first` and doubles, the elements survive the move; a byte count past
 * PTRDIFF_MAX is refused with the array as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "common/grow.h"
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

static void grows_by_doubling(void **state) {
  (void)state;
  int64_t *a = NULL;
  size_t n = 0, cap = 0;
  for (int64_t i = 0; i < 100; i++) {
    assert_int_equal(tsr_grow(&a, &cap, n, sizeof *a, 8), 0);
    assert_true(cap > n);
    a[n++] = i * 3;
  }
  assert_int_equal(cap, 128); /* 8, 16, 32, 64, 128 */
  for (size_t i = 0; i < n; i++) assert_int_equal(a[i], (int64_t)i * 3);
  /* not full: nothing moves */
  int64_t *before = a;
  assert_int_equal(tsr_grow(&a, &cap, n, sizeof *a, 8), 0);
  assert_ptr_equal(a, before);
  assert_int_equal(cap, 128);
  free(a);
}

static void refuses_a_size_past_size_t(void **state) {
  (void)state;
  char *a = malloc(4);
  assert_non_null(a);
  size_t cap = SIZE_MAX / 2 + 1;
  /* twice the capacity does not fit */
  assert_int_equal(tsr_grow(&a, &cap, cap, 1, 8), TSR_ENOMEM);
  assert_int_equal(cap, SIZE_MAX / 2 + 1);
  /* the capacity does, its bytes do not */
  cap = 4;
  assert_int_equal(tsr_grow(&a, &cap, 4, SIZE_MAX / 4, 8), TSR_ENOMEM);
  assert_int_equal(cap, 4);
  /* the bytes fit size_t but pass the largest object there can be */
  assert_int_equal(tsr_grow(&a, &cap, 4, SIZE_MAX / 8, 8), TSR_ENOMEM);
  assert_int_equal(cap, 4);
  free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(size_t_ops),
      cmocka_unit_test(u64_ops),
      cmocka_unit_test(i64_ops_and_dims),
      cmocka_unit_test(grows_by_doubling),
      cmocka_unit_test(refuses_a_size_past_size_t),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
