/* tsr_histo_fill: one pass for the range and moments, one for the counts.
 * Equal-width buckets over [min, max]; the last bucket's edge is max, so
 * every finite value lands in one. No failure modes. */
#include "common/histo.h"

#include <math.h>
#include <string.h>

void tsr_histo_fill(const float *x, size_t n, int buckets, tsr_histo *h) {
  memset(h, 0, sizeof *h);
  if (buckets <= 0) buckets = 30;
  if (buckets > TSR_HISTO_MAX_BUCKETS) buckets = TSR_HISTO_MAX_BUCKETS;
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    if (!isfinite(v)) continue;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    h->sum += v;
    h->sum_squares += v * v;
    h->num++;
  }
  if (h->num == 0) lo = hi = 0;
  h->min = lo;
  h->max = hi;
  if (!(hi > lo)) {
    h->n_buckets = 1;
    h->limit[0] = hi;
    h->count[0] = h->num;
    return;
  }
  double width = (hi - lo) / buckets;
  h->n_buckets = buckets;
  for (int b = 0; b < buckets; b++)
    h->limit[b] = b == buckets - 1 ? hi : lo + width * (b + 1);
  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    if (!isfinite(v)) continue;
    int b = (int)((v - lo) / width);
    h->count[b >= buckets ? buckets - 1 : b < 0 ? 0 : b]++;
  }
}
