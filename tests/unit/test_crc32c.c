/* CRC32C against the published vectors (RFC 3720 B.4 and the "123456789"
 * check value), continuation equal to one pass, the hardware path (three
 * interleaved streams joined by shift tables) and the slicing-by-8 table
 * path equal to a bitwise reference at every length and alignment around
 * the block sizes, and TFRecord's mask. */
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

/* One bit at a time: the definition, independent of both fast paths. */
static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return c ^ 0xffffffffu;
}

static void fast_paths_equal_bitwise(void **state) {
  (void)state;
  static unsigned char data[3 * 8192 * 2 + 64];
  uint64_t st = 88172645463325252ull;
  for (size_t i = 0; i < sizeof data; i++) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    data[i] = (unsigned char)st;
  }
  /* every length up to a few 3x64 and 3x512 blocks, then around the
   * 3x8192 block and beyond, at each alignment mod 8 */
  size_t lens[] = {3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 3 * 8192 + 777,
                   6 * 8192 + 3, 3 * 512 * 5 + 13};
  for (int a = 0; a < 8; a++) {
    for (size_t n = 0; n <= 3 * 512 + 200; n += (n < 400 ? 1 : 7)) {
      uint32_t want = crc_bitwise(data + a, n);
      if (tsr_crc32c(0, data + a, n) != want ||
          tsr__crc32c_portable(0, data + a, n) != want)
        fail_msg("length %zu at offset %d", n, a);
    }
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
      uint32_t want = crc_bitwise(data + a, lens[k]);
      assert_int_equal(tsr_crc32c(0, data + a, lens[k]), want);
      assert_int_equal(tsr__crc32c_portable(0, data + a, lens[k]), want);
      /* continued from a CRC that is not 0 */
      uint32_t c = tsr_crc32c(0, data, 5);
      assert_int_equal(tsr_crc32c(c, data + 5, lens[k]),
                       crc_bitwise(data, 5 + lens[k]));
    }
  }
}

/* crc(A|B) from crc(A), crc(B) and |B|: every split of a buffer, B empty
 * and long ones included. */
static void combine_equals_one_pass(void **state) {
  (void)state;
  static unsigned char data[20000];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 131 + 7);
  size_t cuts[] = {0, 1, 7, 64, 1000, 8191, 8192, 12345, 19999, 20000};
  uint32_t whole = tsr_crc32c(0, data, sizeof data);
  for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
    size_t a = cuts[k], b = sizeof data - a;
    uint32_t ca = tsr_crc32c(0, data, a), cb = tsr_crc32c(0, data + a, b);
    assert_int_equal(tsr_crc32c_combine(ca, cb, b), whole);
  }
  /* three parts, joined left to right */
  uint32_t c = tsr_crc32c(0, data, 100);
  c = tsr_crc32c_combine(c, tsr_crc32c(0, data + 100, 5000), 5000);
  c = tsr_crc32c_combine(c, tsr_crc32c(0, data + 5100, 14900), 14900);
  assert_int_equal(c, whole);
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
      cmocka_unit_test(fast_paths_equal_bitwise),
      cmocka_unit_test(combine_equals_one_pass),
      cmocka_unit_test(mask_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
