/* bfloat16 on the wire: the upper half of a float32, rounded to nearest
 * even (as __float2bfloat16_rn and the CPU kernels' emulation round), so
 * a value survives float32 -> bfloat16 -> float32 with a relative error
 * of at most 2^-8 (8 significant bits). Overflow rounds to inf; a NaN stays a (quiet) NaN.
 * Written as plain loops over integer bits that the compiler vectorises.
 */
#include "ps/wire/wire.h"

#include <string.h>

#define PS__VEC __attribute__((optimize("tree-vectorize", \
                                        "vect-cost-model=dynamic")))

PS__VEC void ps_bf16_from_f32(uint16_t *dst, const float *src, size_t n) {
  /* byte copies: dst may be src itself (the bits of element i are read
   * before the two bytes at 2i are written, and 2i + 1 < 4(i + 1)) */
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, (const char *)src + 4 * i, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    uint16_t h = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
    memcpy((char *)dst + 2 * i, &h, 2);
  }
}

PS__VEC void ps_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, 4);
  }
}

void ps__bf16_expand(float *buf, size_t n) {
  /* from the end: element i's four bytes cover only bfloat16 values at
   * index >= i, already read */
  const unsigned char *b = (const unsigned char *)buf;
  for (size_t i = n; i-- > 0;) {
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    uint32_t u = (uint32_t)h << 16;
    memcpy((char *)buf + 4 * i, &u, 4);
  }
}
