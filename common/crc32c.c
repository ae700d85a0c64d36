/* CRC32C: hardware path with the SSE4.2 instruction (chosen once at first
 * use, under pthread_once), byte-table fallback. */
#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t tsr__crc_table[256];
static int tsr__crc_hw;
static pthread_once_t tsr__crc_once = PTHREAD_ONCE_INIT;

static void tsr__crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    tsr__crc_table[i] = c;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  tsr__crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
  tsr__crc_hw = 0;
#endif
}

static uint32_t tsr__crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
  while (n--) crc = tsr__crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t
tsr__crc_hw_run(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

uint32_t tsr_crc32c(uint32_t crc, const void *data, size_t len) {
  pthread_once(&tsr__crc_once, tsr__crc_init);
  crc = ~crc;
#if defined(__x86_64__)
  if (tsr__crc_hw) return ~tsr__crc_hw_run(crc, data, len);
#endif
  return ~tsr__crc_sw(crc, data, len);
}
