/* Error codes: every own code has a distinct name and message, libuv's and
 * errno's codes pass through; tsr_errf formats, cuts and returns the
 * code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <uv.h>

#include "common/err.h"

static void own_codes_have_names_and_messages(void **state) {
  (void)state;
  int n = 0;
  for (int c = TSR__ERR_FIRST + 1; c < TSR__ERR_LAST; c++, n++) {
    assert_true(tsr_err_is_own(c));
    assert_non_null(strstr(tsr_err_name(c), "TSR_E"));
    assert_true(strlen(tsr_strerror(c)) > 3);
    for (int d = TSR__ERR_FIRST + 1; d < c; d++) {
      assert_string_not_equal(tsr_err_name(c), tsr_err_name(d));
      assert_string_not_equal(tsr_strerror(c), tsr_strerror(d));
    }
  }
  assert_true(n >= 20);
  assert_string_equal(tsr_err_name(TSR_ETIMEOUT), "TSR_ETIMEOUT");
  assert_string_equal(tsr_strerror(TSR_ETIMEOUT), "deadline exceeded");
}

static void libuv_codes_pass_through(void **state) {
  (void)state;
  assert_false(tsr_err_is_own(UV_ECONNREFUSED));
  assert_string_equal(tsr_err_name(UV_ECONNREFUSED), "ECONNREFUSED");
  assert_string_equal(tsr_strerror(UV_ECONNREFUSED),
                      uv_strerror(UV_ECONNREFUSED));
  assert_string_equal(tsr_strerror(0), "success");
  assert_string_equal(tsr_err_name(0), "OK");
  /* positive codes are nobody's */
  assert_string_equal(tsr_strerror(7), "unknown positive code");
  assert_string_equal(tsr_err_name(7), "UNKNOWN");
  /* An unknown negative code still yields text (and does not leak). */
  assert_non_null(tsr_strerror(-123456));
  assert_non_null(tsr_err_name(-123456));
}

static void errf_formats_and_returns_the_code(void **state) {
  (void)state;
  char buf[32];
  memset(buf, 'x', sizeof buf);
  assert_int_equal(tsr_errf(buf, sizeof buf, TSR_ECONFIG, "%s = %d", "k", 7),
                   TSR_ECONFIG);
  assert_string_equal(buf, "k = 7");
  /* cut to errlen - 1 and terminated */
  assert_int_equal(tsr_errf(buf, 6, TSR_EIO, "%s", "0123456789"), TSR_EIO);
  assert_string_equal(buf, "01234");
  /* no buffer: nothing written, the code still comes back */
  assert_int_equal(tsr_errf(NULL, 0, TSR_ENOMEM, "%s", "lost"), TSR_ENOMEM);
  memset(buf, 'x', sizeof buf);
  assert_int_equal(tsr_errf(buf, 0, -5, "%s", "lost"), -5);
  assert_int_equal(buf[0], 'x');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(own_codes_have_names_and_messages),
      cmocka_unit_test(libuv_codes_pass_through),
      cmocka_unit_test(errf_formats_and_returns_the_code),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
