/* Test data that is the same in every run: xorshift64 from a seed the
 * test program picks (#define TSR_TEST_SEED before including this). */
#ifndef TSR_TEST_RAND_H
#define TSR_TEST_RAND_H

#include <stdint.h>

#ifndef TSR_TEST_SEED
#error "define TSR_TEST_SEED before including test_rand.h"
#endif

static uint64_t rng = TSR_TEST_SEED;

/* Uniform in [0, 1). */
static inline double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

/* Uniform in [lo, hi), as a float. */
static inline float frand(double lo, double hi) {
  return (float)(lo + (hi - lo) * urand());
}

#endif /* TSR_TEST_RAND_H */
