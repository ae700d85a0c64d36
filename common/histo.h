/* Histograms of float arrays in TensorBoard's form (HistogramProto):
 * equal-width buckets between the smallest and the largest finite value,
 * each named by its right edge. Shared by the worker (weight and gradient
 * histograms it sends the chief) and the chief's event writer. Pure
 * function: no allocation; non-finite values are left out of every field.
 */
#ifndef TSR_HISTO_H
#define TSR_HISTO_H

#include <stddef.h>

#define TSR_HISTO_MAX_BUCKETS 64

typedef struct tsr_histo {
  double min, max, num, sum, sum_squares;
  int n_buckets;
  double limit[TSR_HISTO_MAX_BUCKETS];  /* right edges */
  double count[TSR_HISTO_MAX_BUCKETS];
} tsr_histo;

/* `buckets` is clamped to [1, TSR_HISTO_MAX_BUCKETS] (0: 30); an array
 * whose values are all equal, or empty, gets one bucket. */
void tsr_histo_fill(const float *x, size_t n, int buckets, tsr_histo *h);

#endif
