/* Growable arrays (common/grow.h): room is made only when the array is
 * full, the capacity starts at `first` and doubles, the elements survive
 * the move; a byte count past size_t is refused with the array as it
 * was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/grow.h"

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
  free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(grows_by_doubling),
      cmocka_unit_test(refuses_a_size_past_size_t),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
