/* Partitioner arithmetic (see partition.h for the formulas). All in 64-bit
 * integers; the byte count of a variable is checked for overflow. */
#include "common/partition.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tsr_partitioner_default(tsr_partitioner *p) {
  p->kind = TSR_PART_MIN_SIZE;
  p->placement = TSR_PLACE_BALANCED;
  p->num_shards = 1;
  p->min_shard_bytes = 256 << 10;
  p->max_shard_bytes = 0;
  p->max_shards = 0;
}

int tsr_partitioner_check(const tsr_partitioner *p, char *err,
                          size_t errlen) {
  /* each kind's own size or count must be > 0; max_shards caps the
   * shards of the two size kinds, 0 meaning each kind's default */
  const char *key, *zero_cap = NULL;
  int64_t val;
  switch (p->kind) {
    case TSR_PART_FIXED:
      key = "num_shards";
      val = p->num_shards;
      break;
    case TSR_PART_MIN_SIZE:
      key = "min_shard_bytes";
      val = p->min_shard_bytes;
      zero_cap = "one shard per PS at most";
      break;
    case TSR_PART_MAX_SIZE:
      key = "max_shard_bytes";
      val = p->max_shard_bytes;
      zero_cap = "no cap";
      break;
    default:
      return tsr_errf(err, errlen, TSR_EINVAL, "unknown partitioner kind %d",
                      (int)p->kind);
  }
  if (val <= 0)
    return tsr_errf(err, errlen, TSR_EINVAL, "partitioner.%s %lld must be > 0",
                    key, (long long)val);
  if (zero_cap && p->max_shards < 0)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "partitioner.max_shards %lld must be > 0 (or 0 for %s)",
                    (long long)p->max_shards, zero_cap);
  return 0;
}

int tsr_partition_count(const tsr_partitioner *p, const tsr_var *v,
                        int64_t *n, char *err, size_t errlen) {
  const char *name = v->name[0] ? v->name : "variable";
  size_t elem_size = tsr_dtype_size(v->dtype);
  int rc = tsr_partitioner_check(p, err, errlen);
  if (rc) return rc;
  if (v->rank < 0 || v->rank > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: rank %d out of range 0..%d",
                    name, v->rank, TSR_MAX_RANK);
  if (elem_size == 0)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: dtype %d has no size", name,
                    (int)v->dtype);
  int64_t numel = 1;
  for (int i = 0; i < v->rank; i++) {
    if (v->shape[i] <= 0)
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: dimension %d is %lld; every "
                      "dimension must be > 0", name, i, (long long)v->shape[i]);
    if (__builtin_mul_overflow(numel, v->shape[i], &numel))
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: element count overflows",
                      name);
  }
  int64_t bytes;
  if (__builtin_mul_overflow(numel, (int64_t)elem_size, &bytes))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: byte size overflows", name);
  if (v->rank == 0) {
    *n = 1;
    return 0;
  }
  int64_t dim0 = v->shape[0];
  int64_t k;
  switch (p->kind) {
    case TSR_PART_FIXED:
      k = p->num_shards < dim0 ? p->num_shards : dim0;
      break;
    case TSR_PART_MIN_SIZE: {
      int64_t want = (bytes + p->min_shard_bytes - 1) / p->min_shard_bytes;
      k = dim0;
      int64_t cap = p->max_shards > 0 ? p->max_shards : 1;
      if (cap < k) k = cap;
      if (want < k) k = want;
      if (k < 1) k = 1;
      break;
    }
    case TSR_PART_MAX_SIZE: {
      int64_t row_bytes = bytes / dim0; /* numel/dim0*elem, exact */
      int64_t rows = p->max_shard_bytes / row_bytes;
      if (rows < 1) rows = 1;
      k = (dim0 + rows - 1) / rows;
      if (p->max_shards > 0 && p->max_shards < k) k = p->max_shards;
      break;
    }
    default:
      return tsr_errf(err, errlen, TSR_EINVAL, "unknown partitioner");
  }
  *n = k;
  return 0;
}

void tsr_partition_rows(int64_t dim0, int64_t n, int64_t i, int64_t *row0,
                        int64_t *rows) {
  int64_t base = dim0 / n, extra = dim0 % n;
  *rows = base + (i < extra ? 1 : 0);
  *row0 = i * base + (i < extra ? i : extra);
}

int64_t tsr_shard_bytes(const tsr_shard *s, const tsr_var *v, int slots) {
  int64_t row_elems = 1;
  for (int d = 1; d < v->rank; d++) row_elems *= v->shape[d];
  return s->rows * row_elems * (int64_t)tsr_dtype_size(v->dtype) *
         (1 + slots);
}

double tsr_partition_balance(const tsr_shard *shards, size_t n,
                             const tsr_var *vars, const int *slots,
                             int n_ps, int64_t *per_ps) {
  for (int i = 0; i < n_ps; i++) per_ps[i] = 0;
  for (size_t k = 0; k < n; k++)
    per_ps[shards[k].ps] += tsr_shard_bytes(&shards[k], &vars[shards[k].var],
                                            slots ? slots[shards[k].var] : 0);
  int64_t max = 0, sum = 0;
  for (int i = 0; i < n_ps; i++) {
    sum += per_ps[i];
    if (per_ps[i] > max) max = per_ps[i];
  }
  if (sum == 0 || n_ps <= 0) return 1.0;
  return (double)max / ((double)sum / n_ps);
}

int tsr_placement_parse(const char *s, tsr_placement *out, char *err,
                        size_t errlen) {
  if (strcmp(s, "balanced") == 0) {
    *out = TSR_PLACE_BALANCED;
    return 0;
  }
  if (strcmp(s, "round_robin") == 0) {
    *out = TSR_PLACE_ROUND_ROBIN;
    return 0;
  }
  return tsr_errf(err, errlen, TSR_EINVAL,
                  "placement \"%s\" is not \"balanced\" or " "\"round_robin\"",
                  s);
}

const char *tsr_placement_name(tsr_placement p) {
  return p == TSR_PLACE_ROUND_ROBIN ? "round_robin" : "balanced";
}

/* Sort order for balanced placement: bytes descending, then creation
 * order (qsort is not stable, so the index breaks ties). */
typedef struct {
  int64_t bytes;
  size_t k;
} tsr__by_bytes;

static int tsr__cmp_bytes(const void *a, const void *b) {
  const tsr__by_bytes *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

static int tsr__place_balanced(tsr_shard *s, size_t n,
                               const tsr_var *vars, const int *slots,
                               int n_ps) {
  tsr__by_bytes *order = malloc((n ? n : 1) * sizeof *order);
  int64_t *load = calloc((size_t)n_ps, sizeof *load);
  if (!order || !load) {
    free(order);
    free(load);
    return TSR_ENOMEM;
  }
  for (size_t k = 0; k < n; k++) {
    order[k].bytes = tsr_shard_bytes(&s[k], &vars[s[k].var],
                                     slots ? slots[s[k].var] : 0);
    order[k].k = k;
  }
  qsort(order, n, sizeof *order, tsr__cmp_bytes);
  for (size_t i = 0; i < n; i++) {
    int best = 0;
    for (int p = 1; p < n_ps; p++)
      if (load[p] < load[best]) best = p;
    s[order[i].k].ps = best;
    load[best] += order[i].bytes;
  }
  free(order);
  free(load);
  return 0;
}

int tsr_partition_plan(const tsr_partitioner *p_in, const tsr_var *vars,
                       const int *slots, size_t n_vars, int n_ps, tsr_shard **out,
                       size_t *n_out, char *err, size_t errlen) {
  *out = NULL;
  *n_out = 0;
  if (n_ps <= 0)
    return tsr_errf(err, errlen, TSR_EINVAL, "number of ps %d must be > 0", n_ps);
  tsr_partitioner pp = *p_in, *p = &pp;
  if (p->kind == TSR_PART_MIN_SIZE && p->max_shards == 0)
    p->max_shards = n_ps;
  size_t total = 0;
  int64_t *counts = calloc(n_vars ? n_vars : 1, sizeof *counts);
  if (!counts) return TSR_ENOMEM;
  for (size_t i = 0; i < n_vars; i++) {
    int rc = tsr_partition_count(p, &vars[i], &counts[i], err, errlen);
    if (rc) {
      free(counts);
      return rc;
    }
    if (slots && (slots[i] < 0 || slots[i] > 16)) {
      free(counts);
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: %d optimizer slots out of range " "0..16",
                      vars[i].name[0] ? vars[i].name : "variable", slots[i]);
    }
    total += (size_t)counts[i];
  }
  tsr_shard *s = calloc(total ? total : 1, sizeof *s);
  if (!s) {
    free(counts);
    return TSR_ENOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < n_vars; i++) {
    int64_t dim0 = vars[i].rank ? vars[i].shape[0] : 1;
    for (int64_t j = 0; j < counts[i]; j++, k++) {
      s[k].var = (int)i;
      s[k].shard = (int)j;
      s[k].num_shards = (int)counts[i];
      tsr_partition_rows(dim0, counts[i], j, &s[k].row0, &s[k].rows);
      s[k].ps = (int)(k % (size_t)n_ps);
    }
  }
  free(counts);
  if (p->placement == TSR_PLACE_BALANCED) {
    int rc = tsr__place_balanced(s, total, vars, slots, n_ps);
    if (rc) {
      free(s);
      return rc;
    }
  }
  *out = s;
  *n_out = total;
  return 0;
}
