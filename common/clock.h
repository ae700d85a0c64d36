/* Monotonic time. Deadlines and rates are measured with CLOCK_MONOTONIC so
 * a wall-clock step (NTP, a container restore) never fires or stalls them. */
#ifndef TSR_CLOCK_H
#define TSR_CLOCK_H

#include <stdint.h>

uint64_t tsr_now_ns(void);   /* monotonic nanoseconds */
uint64_t tsr_now_ms(void);   /* monotonic milliseconds */
double tsr_now_s(void);      /* monotonic seconds */
double tsr_wall_s(void);     /* wall-clock seconds since the epoch */
/* Sleeps at least `ms` milliseconds, resuming after signals. */
void tsr_sleep_ms(uint64_t ms);

#endif
