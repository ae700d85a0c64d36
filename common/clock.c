/* Monotonic and wall clocks; see clock.h. */
#include "common/clock.h"

#include <errno.h>
#include <time.h>

uint64_t tsr_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tsr_now_ms(void) { return tsr_now_ns() / 1000000ull; }

double tsr_now_s(void) { return (double)tsr_now_ns() * 1e-9; }

double tsr_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tsr_sleep_ms(uint64_t ms) {
  struct timespec req = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  struct timespec rem;
  while (nanosleep(&req, &rem) != 0 && errno == EINTR) req = rem;
}
