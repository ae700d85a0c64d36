/* CRC32C (Castagnoli), as TFRecord and the checkpoint files use it.
 * Uses the SSE4.2 crc32 instruction when the CPU has it (three streams
 * interleaved on long buffers), slicing-by-8 tables otherwise; both give
 * the same result. */
#ifndef TSR_CRC32C_H
#define TSR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC: pass 0 to start. Thread-safe (tables built once). */
uint32_t tsr_crc32c(uint32_t crc, const void *data, size_t len);

/* The CRC of A followed by B from crc(A), crc(B) and B's length (zlib's
 * crc32_combine for this polynomial): a file written in parts, out of
 * order, gets its CRC without a second pass. */
uint32_t tsr_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* The table path only, whatever the CPU: for the unit test, which checks
 * both paths against each other. */
uint32_t tsr__crc32c_portable(uint32_t crc, const void *data, size_t len);

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t tsr_crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
static inline uint32_t tsr_crc32c_unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

#endif
