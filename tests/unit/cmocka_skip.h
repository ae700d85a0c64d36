/* Skips that meson sees. cmocka reports a test that called skip() as not
 * failed, so its process exits 0 and meson shows OK. A test file that may
 * skip calls TSR_SKIP() instead and ends main() with
 * `return tsr_cmocka_exit(cmocka_run_group_tests(...));`: a failure wins,
 * else 77 (meson's SKIP) when any test skipped. Include after <cmocka.h>. */
#ifndef TSR_TEST_CMOCKA_SKIP_H
#define TSR_TEST_CMOCKA_SKIP_H

static int tsr__test_skipped;

#define TSR_SKIP()            \
  do {                        \
    tsr__test_skipped = 1;    \
    skip();                   \
  } while (0)

static inline int tsr_cmocka_exit(int failed) {
  return failed ? failed : tsr__test_skipped ? 77 : 0;
}

#endif
