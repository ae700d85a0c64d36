/* CRC32C against the published vectors (RFC 3720 B.4 and the "123456789"
 * check value), continuation equal to one pass, and TFRecord's mask. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/crc32c.h"

static void known_vectors(void **state) {
  (void)state;
  unsigned char buf[32];
  assert_int_equal(tsr_crc32c(0, "123456789", 9), 0xe3069283u);
  memset(buf, 0, sizeof buf);
  assert_int_equal(tsr_crc32c(0, buf, 32), 0x8a9136aau);
  memset(buf, 0xff, sizeof buf);
  assert_int_equal(tsr_crc32c(0, buf, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  assert_int_equal(tsr_crc32c(0, buf, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  assert_int_equal(tsr_crc32c(0, buf, 32), 0x113fdb5cu);
  assert_int_equal(tsr_crc32c(0, "", 0), 0u);
}

static void continuation_equals_one_pass(void **state) {
  (void)state;
  unsigned char data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (unsigned char)(i * 7 + 3);
  uint32_t whole = tsr_crc32c(0, data, sizeof data);
  for (size_t cut = 0; cut <= 1000; cut += 37) {
    uint32_t c = tsr_crc32c(0, data, cut);
    c = tsr_crc32c(c, data + cut, 1000 - cut);
    assert_int_equal(c, whole);
  }
  /* unaligned starts take the same path as aligned ones */
  assert_int_equal(tsr_crc32c(0, data + 1, 9), tsr_crc32c(0, data + 1, 9));
}

static void mask_round_trip(void **state) {
  (void)state;
  for (uint32_t v = 1; v < 0xfffffff0u; v += 0x01234567u)
    assert_int_equal(tsr_crc32c_unmask(tsr_crc32c_mask(v)), v);
  assert_int_equal(tsr_crc32c_mask(0), 0xa282ead8u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(known_vectors),
      cmocka_unit_test(continuation_equals_one_pass),
      cmocka_unit_test(mask_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
