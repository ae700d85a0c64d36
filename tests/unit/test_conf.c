/* Unknown keys (common/conf.h): a known key passes (from either list); an
 * unknown one is named with its path and the closest known key, or the
 * known keys when none is close, or bare when they do not fit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/conf.h"
#include "common/err.h"

static int check(const char *json, const char *where, const char *const *a,
                 const char *const *b, char *err, size_t errlen) {
  json_t *o = json_loads(json, 0, NULL);
  assert_non_null(o);
  err[0] = 0;
  int rc = tsr_conf_check_keys(o, where, a, b, err, errlen);
  json_decref(o);
  return rc;
}

static void known_keys_pass(void **state) {
  (void)state;
  static const char *const a[] = {"name", "beta_1", NULL};
  static const char *const b[] = {"clipnorm", NULL};
  char err[256];
  assert_int_equal(check("{\"name\": 1, \"clipnorm\": 2}", "optimizer", a, b,
                         err, sizeof err), 0);
  assert_int_equal(check("{}", "", a, NULL, err, sizeof err), 0);
}

static void unknown_keys_are_named(void **state) {
  (void)state;
  static const char *const a[] = {"name", "beta_1", NULL};
  static const char *const b[] = {"clipnorm", NULL};
  char err[256];
  assert_int_equal(check("{\"beta1\": 0.8}", "optimizer", a, b, err,
                         sizeof err), TSR_ECONFIG);
  assert_string_equal(err,
                      "optimizer.beta1: unknown key; did you mean \"beta_1\"?");
  /* the close match may come from the second list; the top has no dot */
  assert_int_equal(check("{\"clipnrm\": 1}", "", a, b, err, sizeof err),
                   TSR_ECONFIG);
  assert_string_equal(err, "clipnrm: unknown key; did you mean \"clipnorm\"?");
  /* nothing close: the known keys */
  assert_int_equal(check("{\"zzzzzz\": 1}", "model", a, b, err, sizeof err),
                   TSR_ECONFIG);
  assert_string_equal(err,
                      "model.zzzzzz: unknown key (known: name, beta_1, "
                      "clipnorm)");
}

static void a_long_list_is_not_spelled_out(void **state) {
  (void)state;
  static char names[40][16];
  const char *known[41];
  for (int i = 0; i < 40; i++) {
    snprintf(names[i], sizeof names[i], "option_%02d", i);
    known[i] = names[i];
  }
  known[40] = NULL;
  char err[256];
  assert_int_equal(check("{\"zzzzzzzzzz\": 1}", "x", known, NULL, err,
                         sizeof err), TSR_ECONFIG);
  assert_string_equal(err, "x.zzzzzzzzzz: unknown key");
}

static void edit_distance(void **state) {
  (void)state;
  assert_int_equal(tsr_edit_distance("steps", "stepz"), 1);
  assert_int_equal(tsr_edit_distance("", "abc"), 3);
  assert_int_equal(tsr_edit_distance("beta1", "beta_1"), 1);
  char long_key[60];
  memset(long_key, 'a', sizeof long_key - 1);
  long_key[59] = 0;
  assert_int_equal(tsr_edit_distance(long_key, "a"), 99);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(known_keys_pass),
      cmocka_unit_test(unknown_keys_are_named),
      cmocka_unit_test(a_long_list_is_not_spelled_out),
      cmocka_unit_test(edit_distance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
